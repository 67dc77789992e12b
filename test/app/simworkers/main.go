// Command simworkers runs many simulated workers in one process for bench's
// scale suite: each is a real worker.Worker with one real host (namespace
// /counter by default) on its own 127.0.0.1 listener and fasthttp server, so
// it speaks the real protocol over real sockets: it registers with the
// pinboard (which fetches its challenge endpoint), heartbeats every 3 s
// (worker.DefaultHeartbeatInterval, each with a challenge the pinboard
// fetches again), and answers proxied requests like any host (GET
// /counter/{id}/ activates an instance and answers {"id": ...}). Only the
// object type is trivial, so that a thousand of them fit on a machine where
// a thousand counter processes would not.
//
// It registers the workers in batches (-register-batch at a time, each
// batch once the previous one is registered), logs "simulated workers
// registered" with their count once every one holds a lease, and runs until
// SIGTERM or SIGINT, which stops every worker (Run's context: leases
// withdrawn, no deregistration) and every server. `simworkers -h` lists
// every setting.
//
// Invariants: every worker has its own listener, advertise URL, client id,
// secret and metrics set, so the pinboard sees N distinct workers; every
// goroutine it starts (servers, worker loops) is owned by run and stopped
// before run returns; the ready line is logged only once every worker has
// registered.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/worker"
)

// about is what `simworkers -h` prints above the settings.
const about = `Simulated workers for bench's scale suite: N real workers (worker.Worker and
one host each, on N 127.0.0.1 listeners) in one process, registered with the
pinboard at PINNED_PINBOARD_URL with the deployment token PINNED_TOKEN.`

// Defaults of the settings.
const (
	defaultWorkers       = 10
	defaultNamespace     = "/counter"
	defaultMaxInstances  = host.DefaultMaxInstances
	defaultRegisterBatch = 50
	defaultReadyTimeout  = 10 * time.Minute
)

// settings are the command's flags and variables.
type settings struct {
	pinboardURL   string
	token         string
	workers       int
	namespace     string
	maxInstances  int
	registerBatch int
	readyTimeout  time.Duration
	logLevel      string
}

// loadSettings parses args and environ (as os.Environ).
func loadSettings(args, environ []string, stdout io.Writer) (settings, []cmdline.UnknownVar, error) {
	var s settings
	set := cmdline.New("simworkers", "PINNED_", about)
	set.String(&s.pinboardURL, "pinboard-url", "PINNED_PINBOARD_URL", "url", "", "the pinboard the workers register with (required)")
	set.String(&s.token, "", "PINNED_TOKEN", "string", "", "the deployment token (required; a variable only)")
	set.Int(&s.workers, "workers", "PINNED_SIM_WORKERS", defaultWorkers, "simulated workers, each on its own listener (1 to 10000)")
	set.String(&s.namespace, "namespace", "PINNED_SIM_NAMESPACE", "namespace", defaultNamespace, "the namespace every worker serves")
	set.Int(&s.maxInstances, "max-instances", "PINNED_MAX_INSTANCES", defaultMaxInstances, "live instances per worker (host.Config.MaxInstances)")
	set.Int(&s.registerBatch, "register-batch", "PINNED_SIM_REGISTER_BATCH", defaultRegisterBatch, "workers registering at once (1 to 1000)")
	set.Duration(&s.readyTimeout, "ready-timeout", "PINNED_SIM_READY_TIMEOUT", defaultReadyTimeout, "bound on registering every worker (exit 1 beyond)")
	set.String(&s.logLevel, "log-level", "PINNED_LOG_LEVEL", "level", "warn", "level of the workers' and hosts' own logs (debug, info, warn, error)")
	if err := set.Parse(args, environ, stdout); err != nil {
		return s, nil, err
	}
	switch {
	case s.pinboardURL == "":
		return s, nil, cmdline.Usagef("-pinboard-url (PINNED_PINBOARD_URL) is required")
	case s.token == "":
		return s, nil, cmdline.Usagef("PINNED_TOKEN is required")
	case s.workers < 1 || s.workers > 10000:
		return s, nil, cmdline.Usagef("-workers (PINNED_SIM_WORKERS)=%d: want 1 to 10000", s.workers)
	case s.registerBatch < 1 || s.registerBatch > 1000:
		return s, nil, cmdline.Usagef("-register-batch (PINNED_SIM_REGISTER_BATCH)=%d: want 1 to 1000", s.registerBatch)
	case s.maxInstances < 1:
		return s, nil, cmdline.Usagef("-max-instances (PINNED_MAX_INSTANCES)=%d: want at least 1", s.maxInstances)
	case s.readyTimeout <= 0:
		return s, nil, cmdline.Usagef("-ready-timeout (PINNED_SIM_READY_TIMEOUT)=%v: want a positive duration", s.readyTimeout)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(s.logLevel)); err != nil {
		return s, nil, cmdline.Usagef("-log-level (PINNED_LOG_LEVEL)=%q: want debug, info, warn or error", s.logLevel)
	}
	return s, set.Unknown(environ), nil
}

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// mainStatus is the whole command; it returns the exit status (2 for a
// usage error, 1 when the workers could not all register or a listener
// failed).
func mainStatus(args, environ []string, stdout, stderr io.Writer) int {
	s, unknown, err := loadSettings(args, environ, stdout)
	if err != nil {
		return cmdline.Exit(stderr, "simworkers", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cmdline.Warn(log, unknown)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, s, log, stderr, nil); err != nil {
		return cmdline.Exit(stderr, "simworkers", err)
	}
	return cmdline.ExitOK
}

// sim is the trivial object type of a simulated worker.
type sim struct{ id string }

// simType returns the object type: GET / answers the id.
func simType() host.Type[*sim] {
	routes := host.NewRoutes[*sim]()
	routes.GET("/", func(o *sim, x *host.Ctx) error { return x.JSON(200, map[string]string{"id": o.id}) })
	return host.Type[*sim]{
		New:    func(inst *host.Instance) (*sim, error) { return &sim{id: inst.ID()}, nil },
		Routes: routes,
	}
}

// simWorker is one simulated worker: its listener, server, worker and host.
type simWorker struct {
	ln         net.Listener
	srv        *fasthttp.Server
	w          *worker.Worker
	h          *host.Host
	registered chan struct{} // closed at the first registration
}

// newSimWorker builds worker i on a fresh 127.0.0.1 listener; nothing runs
// yet.
func newSimWorker(s settings, logger *slog.Logger) (*simWorker, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sw := &simWorker{ln: ln, registered: make(chan struct{})}
	sw.w, err = worker.New(worker.Config{
		PinboardURL:  s.pinboardURL,
		AdvertiseURL: "http://" + ln.Addr().String(),
		Token:        s.token,
		TokenSource:  "PINNED_TOKEN",
		Logger:       logger,
	})
	if err == nil {
		sw.h, err = host.New(host.Config{Namespace: s.namespace, Worker: sw.w, MaxInstances: s.maxInstances,
			IdleTimeout: time.Hour, Logger: logger}, simType())
	}
	if err != nil {
		ln.Close()
		return nil, err
	}
	var once sync.Once
	sw.w.OnLease(func(e worker.LeaseEvent) {
		if e.Kind == worker.LeaseRegistered {
			once.Do(func() { close(sw.registered) })
		}
	})
	r := router.New()
	sw.w.Mount(r)
	sw.srv = &fasthttp.Server{Handler: sw.h.Wrap(r.Handler), NoDefaultServerHeader: true, Logger: discardLogger{}}
	if err := sw.h.ConfigureServer(sw.srv); err != nil {
		ln.Close()
		return nil, err
	}
	return sw, nil
}

// discardLogger drops fasthttp's own log lines (a connection the pinboard
// closed mid-request, at the end of a run).
type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

// run starts s.workers simulated workers, registers them in batches, logs
// the ready line (and calls ready, when not nil, with the workers'
// advertise addresses), and stops everything when ctx ends. It returns an
// error when a listener fails or the workers cannot all register within
// s.readyTimeout.
func run(ctx context.Context, s settings, log *slog.Logger, logOut io.Writer, ready func(addrs []string)) error {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(s.logLevel))
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: lvl}))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var workers []*simWorker // appended by this goroutine only
	failed := make(chan error, 1)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
		cancel()
	}
	// Stopping: every worker's Run returns (its lease withdrawn, its
	// instances aborted), then every server closes its listener and
	// connections. The hosts are not closed one by one (that would send a
	// release per instance): the process exits, and the pinboard re-places
	// the ids once the sessions expire.
	defer func() {
		cancel()
		for _, sw := range workers {
			_ = sw.srv.Shutdown()
		}
		wg.Wait()
	}()
	start := time.Now()
	deadline := time.NewTimer(s.readyTimeout)
	defer deadline.Stop()
	for first := 0; first < s.workers; first += s.registerBatch {
		var batch []*simWorker
		for range min(s.registerBatch, s.workers-first) {
			sw, err := newSimWorker(s, logger)
			if err != nil {
				return err
			}
			workers = append(workers, sw)
			batch = append(batch, sw)
			wg.Go(func() {
				if err := sw.srv.Serve(sw.ln); err != nil {
					fail(fmt.Errorf("serve %s: %w", sw.ln.Addr(), err))
				}
			})
			wg.Go(func() {
				if err := sw.w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
					fail(fmt.Errorf("worker at %s: %w", sw.ln.Addr(), err))
				}
			})
		}
		for _, sw := range batch {
			select {
			case <-sw.registered:
			case err := <-failed:
				return err
			case <-ctx.Done():
				return nil
			case <-deadline.C:
				return fmt.Errorf("%d of %d workers registered within -ready-timeout %v", registeredCount(workers), s.workers, s.readyTimeout)
			}
		}
	}
	log.Info("simulated workers registered", "workers", s.workers, "namespace", s.namespace, "took", time.Since(start).Round(time.Millisecond))
	if ready != nil {
		addrs := make([]string, len(workers))
		for i, sw := range workers {
			addrs[i] = sw.ln.Addr().String()
		}
		ready(addrs)
	}
	select {
	case err := <-failed:
		return err
	case <-ctx.Done():
		log.Info("simulated workers stopping", "workers", s.workers)
		return nil
	}
}

// registeredCount counts the workers that registered at least once.
func registeredCount(ws []*simWorker) int {
	n := 0
	for _, sw := range ws {
		select {
		case <-sw.registered:
			n++
		default:
		}
	}
	return n
}
