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
// GET /metrics serves the host's and the worker's metrics with the go_* and
// process_* ones (metricshttp).
//
// Flags (and environment): -listen (PINNED_LISTEN), -idle-timeout,
// -max-instances, -max-body-bytes (PINNED_MAX_BODY_BYTES: the host's request body limit, which the
// server is configured to agree with: 413 with a JSON error beyond it, and
// what the worker tells the pinboard), -shutdown-timeout. PINNED_HISTORY=<file> appends a chaos
// history (history.go; for test/chaos). PINNED_ADMIN_LISTEN (a loopback
// host:port) adds an admin listener with /metrics and /debug/pprof/*.
//
// Fleet mode: when PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL
// are all set, the counter runs a worker that registers with that pinboard
// (advertising PINNED_ADVERTISE_URL, which must reach this process's
// listener) and serves /counter only under the worker's lease; GET /healthz
// then answers 200 only while the worker is registered (worker.Ready). On
// SIGTERM the worker winds down first (new ids 503 draining, idle instances
// closed and released), then the host and the server stop.
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
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/metricshttp"
	"github.com/pinned-go/pinned/worker"
)

// options is everything the demo reads from flags and the environment.
type options struct {
	listen          string
	idleTimeout     time.Duration
	maxInstances    int
	maxBodyBytes    int
	shutdownTimeout time.Duration
	fleet           fleetOptions
	history         string // PINNED_HISTORY (history.go)
	adminListen     string // PINNED_ADMIN_LISTEN: loopback /metrics and /debug/pprof (admin.go); empty = none
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

// check says which fleet variable is missing when only some are set.
func (f fleetOptions) check() error {
	var missing []string
	for _, v := range []struct{ name, val string }{
		{"PINNED_PINBOARD_URL", f.pinboardURL}, {"PINNED_TOKEN", f.token}, {"PINNED_ADVERTISE_URL", f.advertiseURL},
	} {
		if v.val == "" {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("counter: fleet mode needs PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL; missing %v (unset all three for local mode)", missing)
	}
	return nil
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
	maxBody := host.DefaultMaxRequestBodySize
	if v := getenv("PINNED_MAX_BODY_BYTES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return o, fmt.Errorf("counter: PINNED_MAX_BODY_BYTES=%q: want a positive number of bytes", v)
		}
		maxBody = n
	}
	fs.IntVar(&o.maxBodyBytes, "max-body-bytes", maxBody, "largest request body accepted; larger ones answer 413 (env PINNED_MAX_BODY_BYTES)")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "graceful shutdown bound; then remaining instances are aborted")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("counter: %w (flags: -listen, -idle-timeout, -max-instances, -max-body-bytes, -shutdown-timeout)", err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("counter: unexpected arguments %q", fs.Args())
	}
	o.adminListen = getenv("PINNED_ADMIN_LISTEN")
	o.fleet = fleetOptions{
		pinboardURL:  getenv("PINNED_PINBOARD_URL"),
		token:        getenv("PINNED_TOKEN"),
		advertiseURL: getenv("PINNED_ADVERTISE_URL"),
	}
	o.history = getenv(EnvHistory)
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

// fleet is the worker side of fleet mode; its zero value is local mode.
type fleet struct {
	w    *worker.Worker
	done chan error // Run's result
}

// newWorker returns the fleet registration for opts (nil in local mode). It
// does no I/O: the worker starts registering in start, once the listener
// that serves its challenge endpoint is up.
func newWorker(opts options, logger *slog.Logger, set *metrics.Set, onLease func(worker.LeaseEvent)) (*fleet, error) {
	if !opts.fleet.enabled() {
		return &fleet{}, nil
	}
	if err := opts.fleet.check(); err != nil {
		return nil, err
	}
	w, err := worker.New(worker.Config{
		PinboardURL:  opts.fleet.pinboardURL,
		AdvertiseURL: opts.fleet.advertiseURL,
		Token:        opts.fleet.token,
		Logger:       logger,
		Metrics:      set,
		OnLease:      onLease,
	})
	if err != nil {
		return nil, fmt.Errorf("counter: %w", err)
	}
	return &fleet{w: w}, nil
}

// hostWorker is the host.Worker for host.Config (nil in local mode: a nil
// *worker.Worker inside the interface would not be nil).
func (f *fleet) hostWorker() host.Worker {
	if f.w == nil {
		return nil
	}
	return f.w
}

// ready reports whether requests can be served: always in local mode,
// while registered in fleet mode.
func (f *fleet) ready() bool { return f.w == nil || f.w.Ready() }

// start begins registering and heartbeating; Run's context is the hard
// stop, cancelled only after shutdown.
func (f *fleet) start(ctx context.Context, logger *slog.Logger) {
	if f.w == nil {
		return
	}
	f.done = make(chan error, 1)
	go func() { f.done <- f.w.Run(ctx) }()
	logger.Info("fleet mode: registering with the pinboard", "advertise", f.w.AdvertiseURL(), "client", f.w.ClientID())
}

// shutdown winds the worker down (instances closed and released, the rest
// aborted when ctx ends) and waits for Run to return.
func (f *fleet) shutdown(ctx context.Context) error {
	if f.w == nil {
		return nil
	}
	err := f.w.Shutdown(ctx)
	if f.done != nil {
		if runErr := <-f.done; runErr != nil && !errors.Is(runErr, context.Canceled) {
			err = errors.Join(err, runErr)
		}
	}
	return err
}

// run serves the demo until ctx ends, then shuts down gracefully. ready,
// if not nil, is called with the listening address.
func run(ctx context.Context, opts options, logger *slog.Logger, ready func(net.Addr)) error {
	set := metrics.NewSet()
	rec, err := openRecorder(opts.history)
	if err != nil {
		return err
	}
	defer rec.close()
	fl, err := newWorker(opts, logger, set, rec.onLease())
	if err != nil {
		return err
	}
	h, err := host.New(host.Config{
		Namespace:          "/counter",
		Worker:             fl.hostWorker(),
		IdleTimeout:        opts.idleTimeout,
		MaxInstances:       opts.maxInstances,
		MaxRequestBodySize: opts.maxBodyBytes,
		Logger:             logger,
		Metrics:            set,
	}, counterapp.TypeWithHooks(rec.hooks()))
	if err != nil {
		return err
	}

	var serving atomic.Bool
	r := router.New()
	r.GET("/healthz", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		if !serving.Load() || !fl.ready() {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"ok":false}`)
			return
		}
		ctx.SetBodyString(`{"ok":true}`)
	})
	if fl.w != nil {
		fl.w.Mount(r) // GET /_pinned/challenge: the pinboard proves our advertise URL
	}
	r.GET("/metrics", metricshttp.Handler(metricshttp.Config{Sets: []*metrics.Set{set}, Process: true, Metadata: true}))
	srv := &fasthttp.Server{
		Handler:         h.Wrap(r.Handler), // the host's paths skip the router: no allocation
		Name:            "pinned-counter",
		ReadTimeout:     30 * time.Second,
		IdleTimeout:     2 * time.Minute,
		Logger:          slogPrintf{logger},
		CloseOnShutdown: true,
	}
	// The server's body limit is the host's: a larger body gets 413 with a
	// JSON error (drained first, so its client reads the answer), never a
	// bare 400 or a reset; the worker tells the pinboard the same limit.
	if err := h.ConfigureServer(srv); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", opts.listen)
	if err != nil {
		return fmt.Errorf("counter: cannot listen on %s: %w", opts.listen, err)
	}
	if err := h.Start(); err != nil {
		ln.Close()
		return err
	}
	var admin *adminServer
	if opts.adminListen != "" {
		if admin, err = startAdmin(opts.adminListen, set, logger); err != nil {
			ln.Close()
			_ = h.Close(context.Background())
			return err
		}
		defer admin.stop()
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	serving.Store(true)
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	fl.start(runCtx, logger)
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	// Shutdown: unready first (load balancers stop sending); in fleet mode
	// the worker winds down (new ids 503 draining, instances closed and
	// released so the pinboard re-places them elsewhere); then close the
	// host (in-flight work finishes, the rest is aborted at the deadline,
	// every teardown runs), then the server.
	serving.Store(false)
	var errs []error
	hctx, cancel := context.WithTimeout(context.Background(), opts.shutdownTimeout)
	defer cancel()
	if err := fl.shutdown(hctx); err != nil {
		errs = append(errs, fmt.Errorf("counter: stopping the worker: %w", err))
	}
	stopRun()
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
	return errors.Join(errs...)
}

// slogPrintf adapts fasthttp's Printf logger to slog.
type slogPrintf struct{ l *slog.Logger }

func (s slogPrintf) Printf(format string, args ...any) {
	s.l.Warn(fmt.Sprintf(format, args...), "logger", "fasthttp")
}
