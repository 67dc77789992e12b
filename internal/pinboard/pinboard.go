package pinboard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/alarm"
	"github.com/pinned-go/pinned/internal/pinboard/hotids"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
	"github.com/pinned-go/pinned/internal/store/redisstore"
	"github.com/pinned-go/pinned/metricshttp"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/registry"
)

// Config configures a Pinboard.
type Config struct {
	Settings
	// Logger is the root logger; nil means slog.Default().
	Logger *slog.Logger
	// NoProxy makes a registry-only pinboard: no data plane (proxy and
	// placement resolver) is built, and every request that is not a
	// registry route or /healthz gets 404.
	NoProxy bool
	// PublicListener and AdminListener, when set, are used instead of
	// binding Listen and AdminListen (tests, socket activation). Run closes
	// them.
	PublicListener, AdminListener net.Listener
	// Clock is the pinboard's clock; nil means clock.Real.
	Clock clock.Clock
	// HotIDs sizes the hot-id sketch (zero fields: hotids' defaults).
	HotIDs hotids.Config
	// ProgressEvery is how often a shutdown in progress logs what it
	// waits for; zero means cmdline.DefaultProgressEvery.
	ProgressEvery time.Duration

	// wrapDialControl, when set (tests), wraps the registry's address
	// policy before the proxy dials through it.
	wrapDialControl func(dialControl) dialControl
}

// Pinboard is the wired pinboard: store, registry, data plane, public and
// admin servers.
type Pinboard struct {
	cfg   Config
	log   *slog.Logger
	clock clock.Clock

	st    store.Store
	redis *redisstore.Store // nil with -dev
	mem   *memstore.Store   // nil without -dev
	reg   *registry.Registry
	hot   *hotids.Sketch
	// dp is nil for a registry-only pinboard. New sets it before anything
	// can call onInvalidate (the store reports invalidations only once Run
	// connects it or writes to it) and never changes it: a plain field is
	// race-free.
	dp    *dataPlane
	dpSet *metrics.Set
	own   *metrics.Set
	// storeSet holds redisstore's metrics (the circuit's); empty with -dev.
	storeSet *metrics.Set

	public, admin *fasthttp.Server
	// front serves the public port with event loops (Settings.Loops > 0),
	// handing the connections they do not serve to public; nil: public
	// serves the port itself.
	front *proxy.Front

	sched *alarm.Scheduler // nil without a data plane (and a store that keeps alarms)

	mu         sync.Mutex
	publicAddr string
	adminAddr  string
	ran        bool
}

// New wires a pinboard from cfg. It does no I/O: Run binds, connects and
// serves. An error in the configuration is a cmdline.UsageError (the
// command exits 2); failing to set up the event loops is not.
func New(cfg Config) (*Pinboard, error) {
	p := &Pinboard{
		cfg:      cfg,
		log:      cmp.Or(cfg.Logger, slog.Default()).With("logger", "pinned.pinboard"),
		clock:    clock.Or(cfg.Clock),
		own:      metrics.NewSet(),
		dpSet:    metrics.NewSet(),
		storeSet: metrics.NewSet(),
	}
	root := cmp.Or(cfg.Logger, slog.Default())
	opts := store.Options{OnInvalidate: p.onInvalidate}
	if cfg.Dev {
		m, err := memstore.New(memstore.Config{Options: opts, Clock: p.clock, EpochTTL: cfg.EpochTTL})
		if err != nil {
			return nil, cmdline.Usage(err)
		}
		p.st, p.mem = m, m
	} else {
		r, err := redisstore.New(redisstore.Config{Options: opts, URL: cfg.RedisURL, Clock: p.clock, Logger: root, CacheTTL: cfg.Lease,
			RestartFence: cfg.RestartFence, EpochTTL: cfg.EpochTTL,
			CircuitProbeInterval: cfg.StoreProbe, CircuitProbeTimeout: cfg.StoreProbeTimeout, Metrics: p.storeSet})
		if err != nil {
			return nil, cmdline.Usagef("%s: %w", EnvRedisURL, err)
		}
		p.st, p.redis = r, r
	}
	hot, err := hotids.New(cfg.HotIDs)
	if err != nil {
		p.st.Close()
		return nil, cmdline.Usage(err)
	}
	p.hot = hot
	hot.RegisterMetrics(p.own)
	reg, err := registry.New(registry.Config{
		Store:               p.st,
		Tokens:              cfg.Tokens,
		Lease:               cfg.Lease,
		AdvertiseNetworks:   cfg.AdvertiseNetworks,
		AdvertisePorts:      cfg.AdvertisePorts,
		NonceTTL:            cfg.NonceTTL,
		RegisterIPLimit:     cfg.RegisterIPLimit,
		RegisterTokenLimit:  cfg.RegisterTokenLimit,
		AuthFailureLimit:    cfg.AuthFailureLimit,
		MaxSessionsPerToken: cfg.MaxSessionsPerToken,
		MaxTrackedClients:   cfg.MaxTrackedClients,
		Hot:                 hot,
		Clock:               p.clock,
		Logger:              root,
		// alarms.go
		MaxAlarmsPerInstance: cfg.Alarms.MaxAlarmsPerInstance,
		OnAlarmSet:           p.nudgeAlarms,
	})
	if err != nil {
		p.st.Close()
		return nil, cmdline.Usage(err)
	}
	p.reg = reg
	handler := reg.NewRouter(nil).Handler
	if !cfg.NoProxy {
		control := dialControl(reg.DialControl)
		if cfg.wrapDialControl != nil {
			control = cfg.wrapDialControl(control)
		}
		pc := cfg.Settings.Proxy
		if !cfg.NoHotIDs {
			pc.Recorder = p.hot // every routed request feeds the console's hot ids
		}
		rc := placement.Config{Lease: reg.Lease(), RefreshAhead: cfg.RefreshAhead, NamespaceMemory: cfg.NamespaceMemory, SessionsReuse: cfg.SessionsReuse}
		dp, err := newDataPlane(p.st, rc, !cfg.NoFastFailover, root, p.dpSet, p.clock, control, pc)
		if err != nil {
			p.st.Close()
			return nil, cmdline.Usagef("cannot build the data plane: %w", err)
		}
		p.dp = dp
		// The registry and /healthz share the public port with the proxy:
		// the same framing rules must hold there, or a request a front
		// end frames differently hides another behind it.
		handler = dispatch(dp.px.Guard(handler), dp.px.Handler)
		// The proxy's server: streamed request bodies, its limits and
		// timeouts. The registry reads its bodies through a limited reader
		// of the body stream, so its 64 KiB bound holds there too.
		p.public = dp.px.NewServer()
		if err := p.newAlarmScheduler(root); err != nil {
			p.st.Close()
			return nil, cmdline.Usage(err)
		}
	} else {
		p.public = &fasthttp.Server{
			Name:                         "pinboard",
			NoDefaultServerHeader:        true,
			ReadTimeout:                  30 * time.Second,
			IdleTimeout:                  90 * time.Second,
			DisablePreParseMultipartForm: true,
			Logger:                       fasthttpLogger{p.log},
		}
	}
	p.public.Handler = handler
	if p.dp != nil && cfg.Loops > 0 {
		f, err := p.dp.px.NewFront(proxy.FrontConfig{Loops: cfg.Loops, Fallback: p.public, Local: registryTarget})
		if err != nil {
			p.st.Close()
			return nil, fmt.Errorf("cannot build the event loops: %w", err)
		}
		p.front = f
	}
	refuseOversizeRegistryHeads(p.public, reg)
	p.admin = &fasthttp.Server{
		Handler:               p.adminRouter(reg.NewRouter(nil).Handler).Handler,
		Name:                  "pinboard-admin",
		NoDefaultServerHeader: true,
		IdleTimeout:           90 * time.Second,
		Logger:                fasthttpLogger{p.log},
	}
	storeKind := "redis"
	if cfg.Dev {
		storeKind = "memory"
	}
	p.own.NewGauge(`pinned_pinboard_info{protocol="`+fmt.Sprint(wire.Version)+`",store="`+storeKind+`"}`, func() float64 { return 1 })
	p.own.NewGauge(`pinned_pinboard_lease_seconds`, func() float64 { return reg.Lease().Seconds() })
	return p, nil
}

// dispatch sends requests whose raw target's first segment is /registry or
// /healthz to the registry's router, and every other request to the data
// plane. The decision is made on the raw request target, as the proxy makes
// its own, so that no encoded or dot-segment path reaches one handler
// while looking like the other's (the router matches a normalised path:
// "/registry/../counter/x" is the registry's, and a 404 there).
func dispatch(registry, dataPlane fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if registryTarget(ctx.Request.Header.RequestURI()) {
			registry(ctx)
			return
		}
		dataPlane(ctx)
	}
}

// refuseOversizeRegistryHeads makes s answer a registry call whose head
// announces a body over the registry's limit (registry.OversizeHead) with
// 413 at once, before any byte of the body is read. fasthttp reads a body
// (with StreamRequestBody: its first 8 KiB) before it runs a handler, so a
// handler's own Content-Length check would wait for bytes a client may
// never send; only an "Expect: 100-continue" head is decided before that,
// by the server's ExpectHandler. So the head hook marks an HTTP/1.1
// registry call over the limit as expecting 100-continue, and the
// ExpectHandler refuses it (fasthttp then closes the connection without
// reading the body or running the handler); any other registry call with
// Expect is invited to send its body. An HTTP/1.0 head cannot be marked:
// its oversize body is refused by the registry's own check after the
// prefetch. The hooks s already had (the proxy's, which route object
// paths: ExpectHandler resolves the name to learn its holder's body limit)
// see only the other requests, never a registry call.
func refuseOversizeRegistryHeads(s *fasthttp.Server, reg *registry.Registry) {
	prevHead, prevExpect := s.HeaderReceived, s.ExpectHandler
	s.HeaderReceived = func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
		if registryTarget(h.RequestURI()) {
			if h.IsHTTP11() && registry.OversizeHead(h) {
				h.Set(fasthttp.HeaderExpect, "100-continue")
			}
			return fasthttp.RequestConfig{}
		}
		if prevHead != nil {
			return prevHead(h)
		}
		return fasthttp.RequestConfig{}
	}
	s.ExpectHandler = func(ctx *fasthttp.RequestCtx) int {
		if registryTarget(ctx.Request.Header.RequestURI()) {
			if registry.OversizeHead(&ctx.Request.Header) {
				return reg.RefuseOversize(ctx)
			}
			return fasthttp.StatusContinue
		}
		if prevExpect != nil {
			return prevExpect(ctx)
		}
		return fasthttp.StatusContinue
	}
}

// registryTarget reports whether the raw request target's first path
// segment is /registry or /healthz.
func registryTarget(uri []byte) bool {
	for _, prefix := range [...]string{wire.PathHealthz, "/registry"} {
		if len(uri) >= len(prefix) && string(uri[:len(prefix)]) == prefix {
			if len(uri) == len(prefix) {
				return true
			}
			switch uri[len(prefix)] {
			case '/', '?':
				return true
			}
		}
	}
	return false
}

// onInvalidate is the store's OnInvalidate: it hands the invalidation to
// the data plane's resolver, if there is a data plane. It is fast and does
// no I/O (on Redis it runs on a connection's reader goroutine).
func (p *Pinboard) onInvalidate(inv store.Invalidation) {
	if p.dp != nil {
		p.dp.res.OnInvalidate(inv)
	}
}

// Registry returns the registry (tests and tools).
func (p *Pinboard) Registry() *registry.Registry { return p.reg }

// Store returns the store (tests and tools).
func (p *Pinboard) Store() store.Store { return p.st }

// Addrs returns the bound public and admin addresses once Run has bound
// them ("" before).
func (p *Pinboard) Addrs() (public, admin string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.publicAddr, p.adminAddr
}

// ReloadTokens re-reads the token file (SIGHUP). Without a token file it
// does nothing. On an error the current tokens stay.
func (p *Pinboard) ReloadTokens() error {
	if p.cfg.TokenFile == "" {
		return nil
	}
	toks, err := ReadTokenFile(p.cfg.TokenFile)
	if err == nil {
		err = p.reg.SetTokens(toks)
	}
	if err != nil {
		p.log.Error("token reload failed; keeping the current tokens", "err", err)
		return err
	}
	p.log.Info("deployment tokens reloaded", "tokens", len(toks))
	return nil
}

// Hot returns the hot-id sketch (tests and tools). The data plane records
// every routed request in it.
func (p *Pinboard) Hot() *hotids.Sketch { return p.hot }

func (p *Pinboard) adminRouter(registry fasthttp.RequestHandler) *router.Router {
	rt := router.New()
	rt.RedirectTrailingSlash = false
	rt.RedirectFixedPath = false
	rt.GET("/metrics", func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType(metricshttp.ContentType)
		p.WriteMetrics(ctx)
	})
	rt.GET("/debug/pprof/", pprofhandler.PprofHandler)
	rt.GET("/debug/pprof/{profile:*}", pprofhandler.PprofHandler)
	mountConsole(rt, registry)
	return rt
}

// WriteMetrics writes every metric of the pinboard in Prometheus text
// format: the pinboard's own, the registry's, the data plane's, and the
// go_* and process_* metrics.
func (p *Pinboard) WriteMetrics(w io.Writer) {
	metricshttp.Write(w, metricshttp.Config{Sets: []*metrics.Set{p.own, p.reg.Metrics(), p.storeSet, p.dpSet}, Process: true, Metadata: true})
}

// Run binds the listeners, connects the store (retrying with backoff while
// /healthz reports it), serves, and runs the janitor and the data plane
// until ctx ends; then it shuts down gracefully: /healthz turns 503, after
// ShutdownDelay the listeners close and in-flight requests finish; when
// ShutdownTimeout passes first, the connections still open are closed
// (keep-alive ones handed over to the fasthttp path included); then
// everything else stops and the store closes. Run returns within
// ShutdownDelay + ShutdownTimeout of ctx's end, whatever clients, workers
// and Redis do, logging what it waits for once a second (ProgressEvery)
// and how long it took ("pinboard stopped", took). Run may be called once.
func (p *Pinboard) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.ran {
		p.mu.Unlock()
		return errors.New("pinboard: Run called twice")
	}
	p.ran = true
	p.mu.Unlock()
	defer p.st.Close()

	publicLn, err := listen(p.cfg.PublicListener, p.cfg.Listen, EnvListen)
	if err != nil {
		return err
	}
	adminLn, err := listen(p.cfg.AdminListener, p.cfg.AdminListen, EnvAdminListen)
	if err != nil {
		publicLn.Close()
		return err
	}
	p.mu.Lock()
	p.publicAddr, p.adminAddr = publicLn.Addr().String(), adminLn.Addr().String()
	p.mu.Unlock()
	storeDesc := "memory (-dev: nothing survives a restart)"
	if p.redis != nil {
		storeDesc = redactURL(p.cfg.RedisURL)
	}
	loops := 0
	if p.front != nil {
		loops = p.front.Loops()
	}
	p.log.Info("pinboard listening", "public", p.publicAddr, "admin", p.adminAddr, "store", storeDesc,
		"lease", p.reg.Lease(), "dataPlane", p.dp != nil, "loops", loops)

	// Everything below is owned by Run and joined before it returns (or
	// told to stop and left to end on its own bound once the shutdown
	// deadline passed: see shutdown).
	bg, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	var running atomic.Int32 // of wg's goroutines
	goRun := func(f func()) {
		running.Add(1)
		wg.Go(func() {
			defer running.Add(-1)
			f()
		})
	}
	serveErr := make(chan error, 2)
	serve := func(name string, s *fasthttp.Server, ln net.Listener) {
		goRun(func() {
			if err := s.Serve(ln); err != nil {
				serveErr <- fmt.Errorf("%s listener: %w", name, err)
			}
		})
	}
	if p.front != nil {
		goRun(func() {
			if err := p.front.Serve(publicLn); err != nil {
				serveErr <- fmt.Errorf("public listener: %w", err)
			}
		})
	} else {
		serve("public", p.public, publicLn)
	}
	serve("admin", p.admin, adminLn)
	if p.redis != nil {
		goRun(func() {
			if err := p.redis.Connect(bg); err == nil {
				p.log.Info("store connected", "store", storeDesc)
			}
		})
	}
	if p.mem != nil {
		p.mem.Start()
	}
	goRun(func() { _ = p.reg.Run(bg) })
	if p.dp != nil {
		goRun(func() {
			if err := p.dp.run(bg); err != nil {
				p.log.Error("data plane stopped", "err", err)
			}
		})
	}
	if p.sched != nil {
		goRun(func() {
			_ = p.sched.Run(bg) // returns once its deliveries in flight have finished
		})
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
		p.log.Error("listener failed; shutting down", "err", runErr)
	}

	p.shutdown(publicLn, adminLn, stop, &wg, &running)
	return runErr
}

// shutdown is Run's graceful stop, bounded by ShutdownTimeout (counted
// after ShutdownDelay): /healthz turns 503; the public listener closes and
// its connections finish their exchange in progress and close (idle ones
// at once), those still open at the deadline are closed; the admin
// listener likewise. Then stop tells Run's goroutines (wg; running counts
// them) to end, and they are joined until the deadline: one still running
// then (an alarm delivery waiting for a worker) ends on its own bound while
// the process exits. What it waits for is logged at most once per
// ProgressEvery.
func (p *Pinboard) shutdown(publicLn, adminLn net.Listener, stop context.CancelFunc, wg *sync.WaitGroup, running *atomic.Int32) {
	timeout := cmp.Or(p.cfg.ShutdownTimeout, DefaultShutdownTimeout)
	p.log.Info("shutting down", "timeout", timeout, "delay", p.cfg.ShutdownDelay)
	p.reg.MarkShuttingDown()
	if d := p.cfg.ShutdownDelay; d > 0 {
		t := p.clock.NewTimer(d)
		<-t.C()
	}
	deadline := time.Now().Add(timeout)
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var stopped atomic.Bool // the background work was told to stop: count it
	progress := cmdline.StartShutdownLog(p.log, deadline, p.cfg.ProgressEvery, func() []cmdline.Waiting {
		conns := int(p.admin.GetOpenConnectionsCount())
		if p.front != nil {
			conns += p.front.Conns()
		} else {
			conns += int(p.public.GetOpenConnectionsCount())
		}
		w := []cmdline.Waiting{{What: "connections", N: conns}}
		if stopped.Load() {
			w = append(w, cmdline.Waiting{What: "tasks", N: int(running.Load())})
		}
		return w
	})
	// Close the listeners ourselves too: a Shutdown that ran before Serve
	// registered its listener would not. fasthttp's Shutdown then still
	// waits for in-flight requests, and reports its own second close of
	// the listener (net.ErrClosed), which is not a failure.
	publicLn.Close()
	if p.front != nil {
		// The loops stop accepting and close connections as they fall
		// idle, the fasthttp server those handed over; at the deadline
		// the Front closes every one still open.
		if err := p.front.Shutdown(sctx); err != nil {
			p.log.Warn("in-flight requests did not finish within the shutdown timeout; their connections were closed", "err", err)
		}
	} else if err := p.public.ShutdownWithContext(sctx); err != nil && !errors.Is(err, net.ErrClosed) {
		p.log.Warn("in-flight requests did not finish within the shutdown timeout", "err", err)
	}
	adminLn.Close()
	if err := p.admin.ShutdownWithContext(sctx); err != nil && !errors.Is(err, net.ErrClosed) {
		p.log.Warn("admin requests did not finish within the shutdown timeout", "err", err)
	}
	stopped.Store(true)
	stop()
	joined := make(chan struct{})
	go func() { wg.Wait(); close(joined) }() // ends with the last of Run's goroutines
	select {
	case <-joined:
	case <-sctx.Done():
		p.log.Warn("shutdown deadline passed; not waiting for the background work still stopping", "tasks", running.Load())
	}
	progress.Done("pinboard stopped")
}

func listen(given net.Listener, addr, env string) (net.Listener, error) {
	if given != nil {
		return given, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", env, addr, err)
	}
	return ln, nil
}

// redactURL hides a password in a Redis URL.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparseable URL)"
	}
	return u.Redacted()
}

// fasthttpLogger routes fasthttp's own error lines to slog.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Warn(fmt.Sprintf(format, args...), "source", "fasthttp")
}
