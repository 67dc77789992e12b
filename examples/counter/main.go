// Command counter is pinned's demo application: a durable counter object per
// id under /counter, in local mode (one process, in-memory directory).
//
//	go run ./examples/counter                 # listens on 127.0.0.1:8080
//	curl -X POST localhost:8080/counter/alice/incr
//	curl localhost:8080/counter/alice/
//	curl 'localhost:8080/counter/alice/stream?n=5'
//	curl -X POST 'localhost:8080/counter/alice/incr-later?delay=2s'
//
// WebSocket /counter/{id}/ws echoes messages and pushes {"count":N} on every
// change. GET /healthz is the readiness probe (503 while shutting down) and
// GET /metrics serves the host's metrics.
//
// Flags (and environment): -listen (PINNED_LISTEN), -idle-timeout,
// -max-instances, -shutdown-timeout. PINNED_PINBOARD_URL, PINNED_TOKEN and
// PINNED_ADVERTISE_URL are reserved for fleet mode (a worker registered with
// a pinboard), which this build does not provide yet.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/host"
)

// options is everything the demo reads from flags and the environment.
type options struct {
	listen          string
	idleTimeout     time.Duration
	maxInstances    int
	shutdownTimeout time.Duration
	fleet           fleetOptions
}

// fleetOptions configure fleet mode; all empty means local mode.
type fleetOptions struct {
	pinboardURL  string // PINNED_PINBOARD_URL
	token        string // PINNED_TOKEN (never logged)
	advertiseURL string // PINNED_ADVERTISE_URL
}

func (f fleetOptions) enabled() bool {
	return f.pinboardURL != "" || f.token != "" || f.advertiseURL != ""
}

// defaultListen is the demo's address when neither -listen nor
// PINNED_LISTEN is set.
const defaultListen = "127.0.0.1:8080"

// loadOptions parses args and the environment; a flag beats its variable.
func loadOptions(args []string, getenv func(string) string) (options, error) {
	var o options
	fs := flag.NewFlagSet("counter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := defaultListen
	if v := getenv("PINNED_LISTEN"); v != "" {
		listen = v
	}
	fs.StringVar(&o.listen, "listen", listen, "address to listen on (env PINNED_LISTEN)")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", host.DefaultIdleTimeout, "close an instance after this long without activity")
	fs.IntVar(&o.maxInstances, "max-instances", host.DefaultMaxInstances, "live instances at most; more answer 503")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "graceful shutdown bound; then remaining instances are aborted")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("counter: %w (flags: -listen, -idle-timeout, -max-instances, -shutdown-timeout)", err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("counter: unexpected arguments %q", fs.Args())
	}
	o.fleet = fleetOptions{
		pinboardURL:  getenv("PINNED_PINBOARD_URL"),
		token:        getenv("PINNED_TOKEN"),
		advertiseURL: getenv("PINNED_ADVERTISE_URL"),
	}
	return o, nil
}

func main() {
	opts, err := loadOptions(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, logger, func(addr net.Addr) {
		logger.Info("counter demo listening", "addr", addr.String(), "try", "curl -X POST "+addr.String()+"/counter/alice/incr")
	}); err != nil {
		logger.Error("counter demo failed", "error", err)
		os.Exit(1)
	}
}

// newWorker returns the fleet registration for opts, or nil in local mode.
// Fleet mode plugs in here: build a worker from opts.fleet, start it, and
// return it (with its stop function) so every host serves under it.
func newWorker(opts options, _ *slog.Logger) (host.Worker, func(context.Context) error, error) {
	if !opts.fleet.enabled() {
		return nil, func(context.Context) error { return nil }, nil
	}
	return nil, nil, errors.New("counter: fleet mode (PINNED_PINBOARD_URL, PINNED_TOKEN, PINNED_ADVERTISE_URL) is not available in this build; unset them to run in local mode")
}

// run serves the demo until ctx ends, then shuts down gracefully. ready,
// if not nil, is called with the listening address.
func run(ctx context.Context, opts options, logger *slog.Logger, ready func(net.Addr)) error {
	worker, stopWorker, err := newWorker(opts, logger)
	if err != nil {
		return err
	}
	set := metrics.NewSet()
	h, err := host.New(host.Config{
		Namespace:    "/counter",
		Worker:       worker,
		IdleTimeout:  opts.idleTimeout,
		MaxInstances: opts.maxInstances,
		Logger:       logger,
		Metrics:      set,
	}, counterapp.Type())
	if err != nil {
		return err
	}

	var serving atomic.Bool
	r := router.New()
	r.GET("/healthz", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if !serving.Load() {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"ok":false}`)
			return
		}
		ctx.SetBodyString(`{"ok":true}`)
	})
	r.GET("/metrics", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/plain; version=0.0.4")
		set.WritePrometheus(ctx)
	})
	srv := &fasthttp.Server{
		Handler:         h.Wrap(r.Handler), // the host's paths skip the router: no allocation
		Name:            "pinned-counter",
		ReadTimeout:     30 * time.Second,
		IdleTimeout:     2 * time.Minute,
		Logger:          slogPrintf{logger},
		CloseOnShutdown: true,
	}

	ln, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return fmt.Errorf("counter: cannot listen on %s: %w", opts.listen, err)
	}
	if err := h.Start(); err != nil {
		ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	serving.Store(true)
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	// Shutdown: unready first (load balancers stop sending), then close the
	// host (in-flight work finishes, the rest is aborted at the deadline,
	// every teardown runs), then the server, then the worker.
	serving.Store(false)
	var errs []error
	hctx, cancel := context.WithTimeout(context.Background(), opts.shutdownTimeout)
	defer cancel()
	if err := h.Close(hctx); err != nil {
		errs = append(errs, fmt.Errorf("counter: closing the host: %w", err))
	}
	// The host has ended every stream and websocket; what is left are
	// plain requests answered 503 closing.
	sctx, cancel := context.WithTimeout(context.Background(), opts.shutdownTimeout)
	defer cancel()
	if err := srv.ShutdownWithContext(sctx); err != nil {
		errs = append(errs, fmt.Errorf("counter: stopping the server: %w", err))
	}
	if err := <-served; err != nil {
		errs = append(errs, fmt.Errorf("counter: serving: %w", err))
	}
	if err := stopWorker(sctx); err != nil {
		errs = append(errs, fmt.Errorf("counter: stopping the worker: %w", err))
	}
	return errors.Join(errs...)
}

// slogPrintf adapts fasthttp's Printf logger to slog.
type slogPrintf struct{ l *slog.Logger }

func (s slogPrintf) Printf(format string, args ...any) {
	s.l.Warn(fmt.Sprintf(format, args...), "logger", "fasthttp")
}
