package countercmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"
	"github.com/redis/rueidis"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/metricshttp"
	"github.com/pinned-go/pinned/worker"
)

// Extras are what a command adds to the counter process; the zero value
// (the demo's) adds nothing.
type Extras struct {
	// Hooks observe the counters (counterapp.Hooks).
	Hooks counterapp.Hooks
	// OnLease, if set, observes the worker's lease events in fleet mode
	// (worker.Worker.OnLease), the first registration included.
	OnLease func(worker.LeaseEvent)
	// Routes, if set, adds routes to the counter's route table before the
	// host is made.
	Routes func(r *host.Routes[*counterapp.Counter])
}

// Listening is where the process serves: its main listener and the admin
// listener (nil when there is none).
type Listening struct{ Addr, Admin net.Addr }

// Main runs the counter with s and x until the first SIGTERM or SIGINT,
// then shuts down gracefully; a second signal exits at once with 128 + its
// number. It logs on stderr (the unknown PINNED_* variables first, one
// warning each; then "counter demo listening" with the addresses and a
// request to try) and returns the exit status (cmdline.Status: 2 for a
// setting the host or the worker refuses, 1 for a failure while running).
func Main(s Settings, unknown []cmdline.UnknownVar, x Extras, stderr io.Writer) int {
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	cmdline.Warn(logger, unknown)
	sigs := cmdline.NotifySignals(logger)
	defer sigs.Stop()
	return sigs.Run(logger, func(ctx context.Context) int {
		err := Run(ctx, s, x, logger, func(l Listening) {
			attrs := []any{"addr", l.Addr.String()}
			if l.Admin != nil {
				attrs = append(attrs, "admin", l.Admin.String())
			}
			logger.Info("counter demo listening", append(attrs, "try", tryHint(s, l))...)
		})
		if cmdline.Status(err) == cmdline.ExitUsage {
			return cmdline.Exit(stderr, "counter", err)
		}
		if err != nil {
			logger.Error("counter demo failed", "error", err)
		}
		return cmdline.Status(err)
	})
}

// tryHint is the command the "listening" line suggests: a request through
// the pinboard in fleet mode (the counter's own listener answers only the
// pinboard: 403 forbidden), else to the counter itself.
func tryHint(s Settings, l Listening) string {
	base := "http://" + l.Addr.String()
	if s.Fleet.enabled() {
		base = strings.TrimSuffix(s.Fleet.PinboardURL, "/")
	}
	return "curl -X POST " + base + "/counter/alice/incr"
}

// fleet is the worker side of fleet mode; its zero value is local mode.
type fleet struct {
	w    *worker.Worker
	done chan error // Run's result
}

// newWorker returns the fleet registration for s (nil in local mode). It
// does no I/O: the worker starts registering in start, once the listener
// that serves its challenge endpoint is up.
func newWorker(s Settings, logger *slog.Logger, set *metrics.Set, onLease func(worker.LeaseEvent)) (*fleet, error) {
	if !s.Fleet.enabled() {
		return &fleet{}, nil
	}
	if err := s.Fleet.check(); err != nil {
		return nil, err
	}
	w, err := worker.New(worker.Config{
		PinboardURL:  s.Fleet.PinboardURL,
		AdvertiseURL: s.Fleet.AdvertiseURL,
		Token:        s.Fleet.Token,
		TokenSource:  "PINNED_TOKEN",
		Logger:       logger,
		Metrics:      set,
	})
	if err != nil { // a URL or the token the worker cannot use
		return nil, cmdline.Usage(err)
	}
	if onLease != nil {
		w.OnLease(onLease) // before Run: the first registration is reported too
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

// Run serves the counter until ctx ends, then shuts down gracefully within
// s.ShutdownTimeout. ready, if not nil, is called with the listening
// addresses once the process serves.
func Run(ctx context.Context, s Settings, x Extras, logger *slog.Logger, ready func(Listening)) error {
	set := metrics.NewSet()
	fl, err := newWorker(s, logger, set, x.OnLease)
	if err != nil {
		return err
	}
	rdb, err := openPersist(s.Persist)
	if err != nil {
		return err
	}
	if rdb != nil {
		defer rdb.Close() // after the host: teardowns and tasks may still write
		logger.Info("counts persisted in redis, fenced by epoch", "key_prefix", counterapp.KeyPrefix)
	}
	typ := counterapp.TypeWithOptions(counterapp.Options{Hooks: x.Hooks, Persist: rdb})
	if x.Routes != nil {
		x.Routes(typ.Routes)
	}
	h, err := host.New(host.Config{
		Namespace:          "/counter",
		Worker:             fl.hostWorker(),
		IdleTimeout:        s.IdleTimeout,
		MaxInstances:       s.MaxInstances,
		MaxRequestBodySize: s.MaxBodyBytes,
		Logger:             logger,
		Metrics:            set,
	}, typ)
	if err != nil { // a setting the host refuses
		return cmdline.Usage(err)
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
	adminListen := s.AdminListen
	if fl.w != nil {
		fl.w.Mount(r) // GET /_pinned/challenge: the pinboard proves our advertise URL
		if adminListen == "" {
			adminListen = FleetAdminListen
		}
	} else {
		// Local mode: /metrics next to the demo. In fleet mode the main
		// listener is the advertise URL, so /metrics is on the admin one.
		r.GET("/metrics", metricshttp.Handler(metricshttp.Config{Sets: []*metrics.Set{set}, Process: true, Metadata: true}))
	}
	srv := &fasthttp.Server{
		Handler:         h.Wrap(r.Handler), // the host's paths skip the router: no allocation
		Name:            "pinned-counter",
		ReadTimeout:     30 * time.Second,
		IdleTimeout:     2 * time.Minute,
		Logger:          counterapp.ServerLogger(logger),
		CloseOnShutdown: true,
	}
	// The server's body limit is the host's: a larger body gets 413 with a
	// JSON error (drained first, so its client reads the answer), never a
	// bare 400 or a reset; the worker tells the pinboard the same limit.
	if err := h.ConfigureServer(srv); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", s.Listen)
	if err != nil {
		return fmt.Errorf("counter: cannot listen on %s: %w", s.Listen, err)
	}
	if err := h.Start(); err != nil {
		ln.Close()
		return err
	}
	var admin *adminServer
	if adminListen != "" {
		if admin, err = startAdmin(adminListen, set, logger); err != nil {
			ln.Close()
			_ = h.Close(context.Background())
			return err
		}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	serving.Store(true)
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	fl.start(runCtx, logger)
	if ready != nil {
		l := Listening{Addr: ln.Addr()}
		if admin != nil {
			l.Admin = admin.ln.Addr()
		}
		ready(l)
	}

	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	// Shutdown, all within one deadline: unready first (load balancers
	// stop sending); in fleet mode the worker winds down (new ids 503
	// draining, instances closed and released so the pinboard re-places
	// them elsewhere; at the deadline the rest are aborted and the calls
	// to the pinboard given up); then close the host (in-flight work
	// finishes, the rest is aborted at the deadline, every teardown runs),
	// then the servers (connections still open at the deadline are left
	// to the process's exit).
	serving.Store(false)
	deadline := time.Now().Add(s.ShutdownTimeout)
	hctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	logger.Info("shutting down", "timeout", s.ShutdownTimeout, "instances", h.Len())
	progress := cmdline.StartShutdownLog(logger, deadline, 0, func() []cmdline.Waiting {
		return []cmdline.Waiting{{What: "instances", N: h.Len()}, {What: "connections", N: int(srv.GetOpenConnectionsCount())}}
	})
	var errs []error
	if err := fl.shutdown(hctx); err != nil {
		errs = append(errs, fmt.Errorf("counter: stopping the worker: %w", err))
	}
	stopRun()
	if err := h.Close(hctx); err != nil {
		errs = append(errs, fmt.Errorf("counter: closing the host: %w", err))
	}
	// The host has ended every stream and websocket; what is left are
	// plain requests answered 503 closing.
	if err := srv.ShutdownWithContext(hctx); err != nil {
		errs = append(errs, fmt.Errorf("counter: stopping the server: %w", err))
	}
	if err := <-served; err != nil {
		errs = append(errs, fmt.Errorf("counter: serving: %w", err))
	}
	if err := admin.stop(hctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		errs = append(errs, fmt.Errorf("counter: stopping the admin listener: %w", err))
	}
	progress.Done("counter stopped")
	return errors.Join(errs...)
}

// openPersist connects to the Redis of -persist (nil when empty). The
// client caches nothing: every read is a fenced script.
func openPersist(url string) (rueidis.Client, error) {
	if url == "" {
		return nil, nil
	}
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("counter: -persist %q: %w", url, err)
	}
	opt.DisableCache = true
	opt.ClientName = "pinned-counter"
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("counter: -persist: cannot reach redis: %w", err)
	}
	return c, nil
}
