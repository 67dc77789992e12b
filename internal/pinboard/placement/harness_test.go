package placement_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/redis/rueidis"
	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
	"github.com/pinned-go/pinned/internal/store/redisstore"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/proxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Options()...) }

const ns = "/counter"

// fleet watches activations across fake hosts: a second live instance of an
// id anywhere is recorded as a duplicate.
type fleet struct {
	mu     sync.Mutex
	active map[string]string // id -> host holding its instance
	dups   []string
}

func newFleet() *fleet { return &fleet{active: map[string]string{}} }

func (f *fleet) activate(id, host string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if other, ok := f.active[id]; ok && other != host {
		f.dups = append(f.dups, fmt.Sprintf("%s on %s and %s", id, other, host))
	}
	f.active[id] = host
}

func (f *fleet) deactivate(id, host string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.active[id] == host {
		delete(f.active, id)
	}
}

func (f *fleet) duplicates() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.dups...)
}

// host modes.
const (
	modeServe    = iota
	modeDraining // no new activations (503 draining); instances keep serving
	modeLease    // every request: 503 lease (the host fenced itself)
)

// fakeHost emulates a host in fleet mode on 127.0.0.1: it checks the proxy
// secret (403) and the session header (503 lease), activates an instance on
// the first request for an id (503 draining when draining) and answers
// "<host> <id> <n>" with the instance's request count.
type fakeHost struct {
	name, secret, url string
	session           atomic.Pointer[string]
	mode              atomic.Int64
	fleet             *fleet
	served            atomic.Int64
	upgrader          websocket.FastHTTPUpgrader
	wsWG              sync.WaitGroup // websocket handlers (hijacked: Shutdown does not wait)

	mu        sync.Mutex
	instances map[string]int
	conns     map[*websocket.Conn]struct{} // open websockets; nil once killed

	ln   net.Listener
	srv  *fasthttp.Server
	done chan struct{}
	once sync.Once
}

func startHost(t *testing.T, name string, fl *fleet) *fakeHost {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{
		name: name, secret: "secret-" + name, url: "http://" + ln.Addr().String(),
		fleet: fl, instances: map[string]int{}, conns: map[*websocket.Conn]struct{}{}, ln: ln, done: make(chan struct{}),
	}
	h.srv = &fasthttp.Server{Handler: h.handle, MaxIdleWorkerDuration: 100 * time.Millisecond, IdleTimeout: 30 * time.Second}
	go func() { defer close(h.done); _ = h.srv.Serve(ln) }()
	t.Cleanup(h.kill)
	return h
}

// kill stops the host like a crashed process: listener and connections
// closed, instances gone (from the fleet's view too).
func (h *fakeHost) kill() {
	h.once.Do(func() {
		_ = h.ln.Close()
		_ = h.srv.Shutdown()
		<-h.done
		h.mu.Lock()
		for id := range h.instances {
			h.fleet.deactivate(id, h.name)
		}
		clear(h.instances)
		for c := range h.conns {
			c.Close()
		}
		h.conns = nil
		h.mu.Unlock()
		h.wsWG.Wait()
	})
}

func (h *fakeHost) handle(ctx *fasthttp.RequestCtx) {
	if string(ctx.Request.Header.Peek(wire.HeaderProxySecret)) != h.secret {
		ctx.SetStatusCode(fasthttp.StatusForbidden)
		return
	}
	unavailable := func(reason string) {
		ctx.Response.Header.Set(wire.HeaderReason, reason)
		ctx.Response.Header.Set(wire.HeaderRetryAfter, "1")
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
	}
	sess := h.session.Load()
	if sess == nil || string(ctx.Request.Header.Peek(wire.HeaderSession)) != *sess || h.mode.Load() == modeLease {
		unavailable(wire.ReasonLease)
		return
	}
	path := string(ctx.Request.URI().PathOriginal())
	id, _, _ := strings.Cut(strings.TrimPrefix(path, ns+"/"), "/")
	if websocket.FastHTTPIsWebSocketUpgrade(ctx) {
		// An echo socket; it ends when either side closes.
		_ = h.upgrader.Upgrade(ctx, func(c *websocket.Conn) {
			h.mu.Lock()
			if h.conns == nil { // killed
				h.mu.Unlock()
				c.Close()
				return
			}
			h.conns[c] = struct{}{}
			h.wsWG.Add(1)
			h.mu.Unlock()
			defer func() {
				h.mu.Lock()
				delete(h.conns, c)
				h.mu.Unlock()
				c.Close()
				h.wsWG.Done()
			}()
			for {
				mt, b, err := c.ReadMessage()
				if err != nil || c.WriteMessage(mt, b) != nil {
					return
				}
			}
		})
		return
	}
	h.mu.Lock()
	n, ok := h.instances[id]
	if !ok && h.mode.Load() == modeDraining {
		h.mu.Unlock()
		unavailable(wire.ReasonDraining)
		return
	}
	if !ok {
		h.fleet.activate(id, h.name)
	}
	n++
	h.instances[id] = n
	h.mu.Unlock()
	h.served.Add(1)
	fmt.Fprintf(ctx, "%s %s %d", h.name, id, n)
}

// has reports whether the host has an instance of id.
func (h *fakeHost) has(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.instances[id]
	return ok
}

// fanout delivers a store's invalidations to every resolver attached to it
// (with the memory store, several "pinboards" share one store).
type fanout struct {
	mu  sync.Mutex
	fns []func(store.Invalidation)
}

func (f *fanout) add(fn func(store.Invalidation)) {
	f.mu.Lock()
	f.fns = append(f.fns, fn)
	f.mu.Unlock()
}

func (f *fanout) deliver(inv store.Invalidation) {
	f.mu.Lock()
	fns := slices.Clone(f.fns)
	f.mu.Unlock()
	for _, fn := range fns {
		fn(inv)
	}
}

// env is a directory (memory with a fake clock, or a real redis-server) and
// the fake hosts registered in it.
type env struct {
	t     *testing.T
	kind  string
	lease time.Duration
	fl    *fleet

	fake *clock.Fake       // memory only
	mem  *memstore.Store   // memory only
	inv  *fanout           // memory only
	srv  *redistest.Server // redis only
	adm  rueidis.Client    // redis only: an untracked client for poking Redis
	st   store.Store       // the registry's view: registrations, heartbeats
	// pinboardURL, when set, is the Redis URL pinboards connect to (a
	// redistest.Tap in front of srv); the registry's view uses srv.
	pinboardURL string
	// fence is the pinboards' redisstore.Config.RestartFence (0: none).
	fence time.Duration

	seq atomic.Int64
}

var kinds = []string{"memory", "redis"}

func forEachStore(t *testing.T, f func(t *testing.T, e *env)) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) { f(t, newEnv(t, kind)) })
	}
}

func newEnv(t *testing.T, kind string) *env {
	t.Helper()
	e := &env{t: t, kind: kind, fl: newFleet(), lease: 10 * time.Second}
	switch kind {
	case "memory":
		e.fake = clock.NewFake(time.Unix(1_700_000_000, 0))
		e.inv = &fanout{}
		m, err := memstore.New(memstore.Config{Options: store.Options{OnInvalidate: e.inv.deliver}, Clock: e.fake})
		if err != nil {
			t.Fatal(err)
		}
		e.mem, e.st = m, m
		t.Cleanup(m.Close)
	case "redis":
		e.srv = redistest.Start(t)
		e.st = e.redisStore(t, e.srv.URL, 0, store.Options{})
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{e.srv.Addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			t.Fatal(err)
		}
		e.adm = c
		t.Cleanup(c.Close)
	}
	return e
}

func (e *env) redisStore(t *testing.T, url string, fence time.Duration, opts store.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(redisstore.Config{Options: opts, URL: url, CacheTTL: e.lease, RestartFence: fence, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// redis runs one command on the admin client.
func (e *env) redis(args ...string) rueidis.RedisResult {
	e.t.Helper()
	return e.adm.Do(context.Background(), e.adm.B().Arbitrary(args...).Build())
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// register registers h as a new verified session serving ns.
func (e *env) register(h *fakeHost, headroom int) string {
	e.t.Helper()
	sid := fmt.Sprintf("s%d-%s", e.seq.Add(1), h.name)
	_, err := e.st.Register(ctxT(e.t), store.Session{
		ID: sid, ClientID: "client-" + h.name, Secret: h.secret, AdvertiseURL: h.url,
		Namespaces: []string{ns}, Headroom: headroom, Verified: true,
	}, e.lease)
	if err != nil {
		e.t.Fatal(err)
	}
	h.session.Store(&sid)
	return sid
}

// heartbeat renews sid with the given headroom and drain flag.
func (e *env) heartbeat(sid string, headroom int, draining bool) {
	e.t.Helper()
	if _, _, err := e.st.Heartbeat(ctxT(e.t), sid, store.Update{Headroom: headroom, Draining: draining}, e.lease); err != nil {
		e.t.Fatalf("heartbeat %s: %v", sid, err)
	}
}

// holder reads the placement of id from the store.
func (e *env) holder(id string) string {
	e.t.Helper()
	h, err := e.st.Placement(ctxT(e.t), ns, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

// pinboard is one resolver, with a proxy on a 127.0.0.1 listener in front
// and its own store client (on Redis: its own connections and tracking, as
// a separate pinboard process would have).
type pinboard struct {
	res    *placement.Resolver
	px     *proxy.Proxy
	addr   string
	client *fasthttp.HostClient
	st     store.Store
	logs   *logtest.Buffer
}

// pinboard starts a resolver and proxy on e. mutate adjusts the resolver's
// config; wrap, when set, wraps the store the resolver reads.
func (e *env) pinboard(mutate func(*placement.Config), wrap func(store.Store) store.Store) *pinboard {
	t := e.t
	t.Helper()
	pb := &pinboard{logs: &logtest.Buffer{}}
	var res atomic.Pointer[placement.Resolver]
	onInv := func(inv store.Invalidation) {
		if r := res.Load(); r != nil {
			r.OnInvalidate(inv)
		}
	}
	cfg := placement.Config{
		Lease:  e.lease,
		Logger: slog.New(slog.NewTextHandler(pb.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	switch e.kind {
	case "memory":
		pb.st = e.mem
		e.inv.add(onInv)
		cfg.Clock = e.fake
	case "redis":
		url := e.srv.URL
		if e.pinboardURL != "" {
			url = e.pinboardURL
		}
		pb.st = e.redisStore(t, url, e.fence, store.Options{OnInvalidate: onInv})
	}
	cfg.Store = pb.st
	if wrap != nil {
		cfg.Store = wrap(pb.st)
	}
	if mutate != nil {
		mutate(&cfg)
	}
	// Tunnels of a placement that moved close, as the pinboard wires it
	// (pb.px is set before Run starts).
	cfg.OnMoved = func(name, holder string) { pb.px.CloseTunnels(name, holder) }
	r, err := placement.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	res.Store(r)
	pb.res = r
	px, err := proxy.New(proxy.Config{Resolver: r, Logger: cfg.Logger, MaxAttempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	pb.px = px
	srv := px.NewServer()
	srv.MaxIdleWorkerDuration = 100 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pb.addr = ln.Addr().String()
	pb.client = &fasthttp.HostClient{Addr: pb.addr, MaxConns: 256, MaxIdleConnDuration: time.Second}
	runCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	wg.Go(func() { _ = r.Run(runCtx) })
	wg.Go(func() { _ = px.Run(runCtx) })
	t.Cleanup(func() {
		pb.client.CloseIdleConnections()
		_ = srv.Shutdown()
		// Shutdown closes only the listeners Serve has taken up: a test
		// that ends before the Serve goroutine started would wait forever.
		_ = ln.Close()
		stop()
		wg.Wait()
		_ = px.Close()
		r.Close()
		if t.Failed() {
			t.Logf("pinboard %s logs:\n%s", pb.addr, pb.logs.String())
		}
	})
	return pb
}

// answer is one response through a pinboard.
type answer struct {
	status     int
	body       string
	reason     string
	retryAfter string
}

// host returns the name of the host that served the answer ("" if none).
func (a answer) host() string {
	if a.status != 200 {
		return ""
	}
	h, _, _ := strings.Cut(a.body, " ")
	return h
}

// counter reads a counter of the resolver's set by its full series name.
func (pb *pinboard) counter(series string) uint64 {
	return pb.res.Metrics().GetOrCreateCounter(series).Get()
}

func (pb *pinboard) get(t testing.TB, id string) answer {
	t.Helper()
	return pb.do(t, "GET", ns+"/"+id+"/")
}

func (pb *pinboard) do(t testing.TB, method, path string) answer {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + pb.addr + path)
	if err := pb.client.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return answer{
		status:     resp.StatusCode(),
		body:       string(resp.Body()),
		reason:     string(resp.Header.Peek(wire.HeaderReason)),
		retryAfter: string(resp.Header.Peek(wire.HeaderRetryAfter)),
	}
}

// waitFor polls cond until it holds (for effects that cross a Redis
// connection: invalidations arrive asynchronously) or fails after 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling an external process (Redis)
	}
}
