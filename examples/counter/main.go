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
// change. GET /healthz is the readiness probe (503 while shutting down).
// GET /metrics serves the host's and the worker's metrics with the go_* and
// process_* ones (metricshttp): on the main listener in local mode, on the
// loopback admin listener (with /debug/pprof/*) in fleet mode, where the
// main listener is the advertise URL the pinboard proxies to.
//
// `counter -h` lists every setting (flag and PINNED_* variable, type,
// default). PINNED_HISTORY=<file> appends a chaos history (history.go; for
// test/chaos). Unknown PINNED_* variables are reported at start, one
// warning line each.
// -persist (PINNED_PERSIST) names a Redis (redis://host:port/db) where
// every count is kept, fenced by its instance's activation epoch
// (counterapp, package fence), so a count survives its instance and no
// acknowledged increment is lost when an id moves.
// -max-body-bytes (PINNED_MAX_BODY_BYTES) is the host's request body limit:
// the server is configured to agree with it (413 with a JSON error beyond
// it, the body drained first) and the worker tells the pinboard.
//
// Fleet mode: when PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL
// are all set, the counter runs a worker that registers with that pinboard
// (advertising PINNED_ADVERTISE_URL, which must reach this process's
// listener) and serves /counter only under the worker's lease; GET /healthz
// then answers 200 only while the worker is registered (worker.Ready). On
// SIGTERM the worker winds down first (new ids 503 draining, idle instances
// closed and released), then the host and the server stop.
//
// Shutdown (SIGTERM or SIGINT) is bounded by -shutdown-timeout
// (PINNED_SHUTDOWN_TIMEOUT) as a whole, whatever the pinboard does (gone or
// frozen: the releases give up): what is left at the deadline is aborted.
// It logs what it waits for once a second and how long it took ("counter
// stopped"). A second signal exits at once with 128 + its number.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
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

// options is everything the demo reads from flags and the environment.
type options struct {
	listen          string
	idleTimeout     time.Duration
	maxInstances    int
	maxBodyBytes    int
	shutdownTimeout time.Duration
	fleet           fleetOptions
	history         string // PINNED_HISTORY (history.go)
	persist         string // -persist / PINNED_PERSIST: Redis URL of the counts; empty = memory only
	adminListen     string // loopback /metrics and /debug/pprof (admin.go); empty = none (local mode) or 127.0.0.1:0 (fleet mode)
	unknown         []cmdline.UnknownVar
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

// check says which fleet variable is missing when only some are set (a
// usage error).
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
		return cmdline.Usagef("fleet mode needs PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL; missing %v (unset all three for local mode)", missing)
	}
	return nil
}

// EnvPersist names the variable -persist defaults to.
const EnvPersist = "PINNED_PERSIST"

// defaultListen is the demo's address when neither -listen nor
// PINNED_LISTEN is set.
const defaultListen = "127.0.0.1:8080"

// fleetAdminListen is the admin listener of fleet mode when none is set: a
// free loopback port, logged ("counter admin listening").
const fleetAdminListen = "127.0.0.1:0"

// loadOptions parses args and environ (as os.Environ); a flag beats its
// variable. For -h it writes every setting to stdout and returns
// flag.ErrHelp (-version: the version, cmdline.ErrVersion). Every setting
// the demo cannot run with, alone or together (a partial fleet
// configuration), is a usage error here, before anything starts.
func loadOptions(args, environ []string, stdout io.Writer) (options, error) {
	var o options
	set := cmdline.New("counter", "PINNED_", `pinned's demo: a durable counter per id under /counter/{id}/.
Local mode by default; fleet mode (a worker registered with a pinboard) when
PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL are all set.`)
	set.ListenAddr(&o.listen, "listen", "PINNED_LISTEN", defaultListen,
		"address of the demo's server (fleet mode: the advertise URL must reach it)")
	set.Var(cmdline.Parsed[string]{P: &o.adminListen, Parse: adminAddr, Format: func(v string) string { return v }},
		"admin-listen", "PINNED_ADMIN_LISTEN", "host:port",
		"loopback admin listener: /metrics and /debug/pprof/*. Empty: none in local mode (/metrics is on -listen),\n"+
			fleetAdminListen+" (a free port, logged) in fleet mode (/metrics is never on the advertised listener)")
	set.Duration(&o.idleTimeout, "idle-timeout", "PINNED_IDLE_TIMEOUT", host.DefaultIdleTimeout,
		"close an instance after this long without activity (negative: never)")
	o.maxInstances = host.DefaultMaxInstances
	set.Var(positive(&o.maxInstances, "a positive number of instances"), "max-instances", "PINNED_MAX_INSTANCES", "int",
		"live instances at most; more answer 503 capacity")
	o.maxBodyBytes = host.DefaultMaxRequestBodySize
	set.Var(positive(&o.maxBodyBytes, "a positive number of bytes"), "max-body-bytes", "PINNED_MAX_BODY_BYTES", "bytes",
		"largest request body accepted; larger ones answer 413 (the server agrees; the worker tells the pinboard)")
	o.shutdownTimeout = 10 * time.Second
	set.Var(cmdline.Parsed[time.Duration]{P: &o.shutdownTimeout, Parse: func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, errors.New("want a positive duration such as 10s")
		}
		return d, nil
	}, Format: time.Duration.String}, "shutdown-timeout", "PINNED_SHUTDOWN_TIMEOUT", "duration",
		"bound on the whole graceful shutdown; then the remaining instances are aborted (a second signal exits at once)")
	set.String(&o.fleet.pinboardURL, "pinboard-url", "PINNED_PINBOARD_URL", "url", "",
		"fleet mode: the pinboard's base URL, e.g. http://127.0.0.1:8080")
	set.String(&o.fleet.advertiseURL, "advertise-url", "PINNED_ADVERTISE_URL", "url", "",
		"fleet mode: where the pinboard reaches this process (-listen), e.g. http://127.0.0.1:8081")
	set.String(&o.fleet.token, "", "PINNED_TOKEN", "token", "",
		"fleet mode: the pinboard's deployment token (no flag: argv is visible to every user)")
	set.Var(cmdline.Parsed[string]{P: &o.persist, Parse: redisURL, Format: func(v string) string { return v }}, "persist", EnvPersist, "url",
		"keep every count in this Redis (redis://host:port/db), fenced by its instance's activation epoch; empty: memory only")
	set.String(&o.history, "", EnvHistory, "path", "",
		"append the chaos history (instances, requests, effects, lease events) to this file; for test/chaos")
	set.Known("PINNED_FAULTS") // read by internal/base/faults in binaries built with the pinned_faults tag
	if err := set.Parse(args, environ, stdout); err != nil {
		return o, err
	}
	o.unknown = set.Unknown(environ)
	if o.fleet.enabled() {
		if err := o.fleet.check(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// positive is an int setting refusing values below 1; want says what a
// valid value is.
func positive(p *int, want string) cmdline.Parsed[int] {
	return cmdline.Parsed[int]{P: p, Parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, errors.New("want " + want)
		}
		return n, nil
	}, Format: strconv.Itoa}
}

// adminAddr reads -admin-listen: empty (the mode's default), or a
// host:port whose port is in range and whose host is loopback (profiles
// and metrics are not for the network).
func adminAddr(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if _, err := cmdline.HostPort(v); err != nil {
		return "", err
	}
	host, _, _ := net.SplitHostPort(v)
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", errors.New("the admin listener must be on a loopback address, such as 127.0.0.1:9091")
	}
	return v, nil
}

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// mainStatus is the whole command; it returns the exit status
// (cmdline.Status: 2 for a usage or configuration error).
func mainStatus(args, environ []string, stdout, stderr io.Writer) int {
	opts, err := loadOptions(args, environ, stdout)
	if err != nil {
		return cmdline.Exit(stderr, "counter", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	cmdline.Warn(logger, opts.unknown)
	sigs := cmdline.NotifySignals(logger)
	defer sigs.Stop()
	return sigs.Run(logger, func(ctx context.Context) int {
		err := run(ctx, opts, logger, func(l listening) {
			attrs := []any{"addr", l.addr.String()}
			if l.admin != nil {
				attrs = append(attrs, "admin", l.admin.String())
			}
			logger.Info("counter demo listening", append(attrs, "try", tryHint(opts, l))...)
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
// the pinboard in fleet mode (the demo's own listener answers only the
// pinboard: 403 forbidden), else to the demo itself.
func tryHint(opts options, l listening) string {
	base := "http://" + l.addr.String()
	if opts.fleet.enabled() {
		base = strings.TrimSuffix(opts.fleet.pinboardURL, "/")
	}
	return "curl -X POST " + base + "/counter/alice/incr"
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

// listening is where the demo serves: its main listener and the admin
// listener (nil when there is none).
type listening struct{ addr, admin net.Addr }

// run serves the demo until ctx ends, then shuts down gracefully. ready,
// if not nil, is called with the listening addresses.
func run(ctx context.Context, opts options, logger *slog.Logger, ready func(listening)) error {
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
	rdb, err := openPersist(opts.persist)
	if err != nil {
		return err
	}
	if rdb != nil {
		defer rdb.Close() // after the host: teardowns and tasks may still write
		logger.Info("counts persisted in redis, fenced by epoch", "key_prefix", counterapp.KeyPrefix)
	}
	h, err := host.New(host.Config{
		Namespace:          "/counter",
		Worker:             fl.hostWorker(),
		IdleTimeout:        opts.idleTimeout,
		MaxInstances:       opts.maxInstances,
		MaxRequestBodySize: opts.maxBodyBytes,
		Logger:             logger,
		Metrics:            set,
	}, counterapp.TypeWithOptions(counterapp.Options{Hooks: rec.hooks(), Persist: rdb}))
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
	if fl.w != nil {
		fl.w.Mount(r) // GET /_pinned/challenge: the pinboard proves our advertise URL
	}
	if fl.w == nil {
		// Local mode: /metrics next to the demo. In fleet mode the main
		// listener is the advertise URL, so /metrics is on the admin one.
		r.GET("/metrics", metricshttp.Handler(metricshttp.Config{Sets: []*metrics.Set{set}, Process: true, Metadata: true}))
	} else if opts.adminListen == "" {
		opts.adminListen = fleetAdminListen
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
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	serving.Store(true)
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	fl.start(runCtx, logger)
	if ready != nil {
		l := listening{addr: ln.Addr()}
		if admin != nil {
			l.admin = admin.ln.Addr()
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
	deadline := time.Now().Add(opts.shutdownTimeout)
	hctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	logger.Info("shutting down", "timeout", opts.shutdownTimeout, "instances", h.Len())
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

// redisURL checks a -persist value ("" is none).
func redisURL(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if _, err := rueidis.ParseURL(v); err != nil {
		return "", fmt.Errorf("%v (want redis://host:port/db)", err)
	}
	return v, nil
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

// slogPrintf adapts fasthttp's Printf logger to slog.
type slogPrintf struct{ l *slog.Logger }

func (s slogPrintf) Printf(format string, args ...any) {
	s.l.Warn(fmt.Sprintf(format, args...), "logger", "fasthttp")
}
