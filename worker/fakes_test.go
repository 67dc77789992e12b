package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp's client pools and its server's worker pool clean up from
		// goroutines that sleep up to 10 s and cannot be woken when stopped.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*Client).mCleaner"),
		// Process-wide fasthttp goroutines: the default dialer's DNS cache
		// cleaner and the server's Date header clock.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}

const testToken = "test-deployment-token-7f3a"

var t0Wall = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeHost implements host.Attached with counters instead of instances:
// busy instances have work in flight, idle ones can be closed by CloseIdle.
type fakeHost struct {
	ns      string
	cap     int
	maxBody int // MaxRequestBodySize; 0: host.DefaultMaxRequestBodySize
	w       *Worker
	clk     clock.Clock

	mu        sync.Mutex
	busy      int
	idle      int
	slowAbort bool // AbortAll leaves the instances tearing down (still counted by Len)
	tearing   int
	aborts    []abortRec
	closeIdle []string
	evicted   []string // "<id> <reason>" of every Evict call
	has       map[string]bool
	// onCloseIdle, when set, runs at each CloseIdle without the lock (the
	// real host releases each closed instance's placement there).
	onCloseIdle func()
	// closedIdle, when set, runs at the end of each CloseIdle (the harness
	// wakes the loop, so that until sees what the call changed).
	closedIdle func()
}

type abortRec struct {
	reason   string
	live     int // instances the host held when the abort came
	at       clock.Instant
	admitted bool // whether Admit still said yes while the abort ran
}

var _ host.Attached = (*fakeHost)(nil)

func (h *fakeHost) Namespace() string { return h.ns }
func (h *fakeHost) MaxRequestBodySize() int {
	if h.maxBody == 0 {
		return host.DefaultMaxRequestBodySize
	}
	return h.maxBody
}
func (h *fakeHost) Headroom() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(h.cap-h.busy-h.idle, 0)
}
func (h *fakeHost) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.busy + h.idle + h.tearing
}
func (h *fakeHost) AbortAll(reason string) {
	_, why := h.w.Admit(h.w.secret, nil)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.aborts = append(h.aborts, abortRec{reason: reason, live: h.busy + h.idle, at: h.clk.Now(), admitted: why == ""})
	if h.slowAbort {
		h.tearing += h.busy + h.idle
	}
	h.busy, h.idle = 0, 0
}

// teardownsDone ends the teardowns a slow AbortAll left running.
func (h *fakeHost) teardownsDone() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.tearing = 0
}
func (h *fakeHost) CloseIdle(reason string) {
	if h.onCloseIdle != nil {
		h.onCloseIdle()
	}
	h.mu.Lock()
	h.closeIdle = append(h.closeIdle, reason)
	h.idle = 0
	h.mu.Unlock()
	if h.closedIdle != nil {
		h.closedIdle()
	}
}
func (h *fakeHost) Evict(id, reason string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.evicted = append(h.evicted, id+" "+reason)
	return h.has[id]
}
func (h *fakeHost) evictions() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.evicted)
}
func (h *fakeHost) set(busy, idle int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.busy, h.idle = busy, idle
}
func (h *fakeHost) abortList() []abortRec {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]abortRec(nil), h.aborts...)
}
func (h *fakeHost) closeIdleList() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.closeIdle...)
}

// action scripts the fake pinboard's answer to one call. The zero action is
// an immediate 200 (a registration or an ack with the default lease).
type action struct {
	drop       bool          // never answer (until the test ends); the call is "lost"
	hold       chan struct{} // answer only once this is closed (a late answer)
	status     int           // answer this status (with a wire.Error body) instead of 200
	nack       string        // answer 409 {"nack": nack}
	reregister bool          // ack with "reregister": true
	leaseMs    int64         // expiresInMs in the answer; 0 = the pinboard's lease
}

type regRec struct {
	req          wire.RegisterRequest
	at           clock.Instant
	abortsBefore int  // host aborts recorded when the registration arrived
	admitted     bool // whether the worker admitted requests when it arrived
}

type hbRec struct {
	req wire.HeartbeatRequest
	at  clock.Instant
}

// fakePinboard is the registry side of the protocol on a real fasthttp
// listener. Like the real pinboard it fetches the worker's challenge
// endpoint (with the worker's secret) before it accepts a registration or a
// heartbeat carrying a challenge pair.
type fakePinboard struct {
	t      *testing.T
	clk    *clock.Fake
	url    string
	ln     net.Listener
	srv    *fasthttp.Server
	client *fasthttp.Client
	closed chan struct{}
	notify func()
	host   *fakeHost // for abort bookkeeping at registration time
	w      *Worker

	mu          sync.Mutex
	leaseMs     int64
	sessions    map[string]wire.RegisterRequest
	nextSession int
	registers   []regRec
	heartbeats  []hbRec
	releases    []wire.ReleaseRequest
	deregisters []wire.DeregisterRequest
	order       []string // paths of the calls, in arrival order
	queue       []wire.Message
	held        int
	fetchErrors []string
	onRegister  func(n int) action
	onHeartbeat func(n int, req wire.HeartbeatRequest) action
	onRelease   func(n int) action
	// The batch call: noBatch answers it 404 (a pinboard that predates
	// it); itemStatus scripts one release's own result (0: released);
	// batches are the sizes of the batch calls received.
	noBatch      bool
	itemStatus   func(id string) int
	batches      []int
	bodySizes    []int
	onDeregister func(n int) action
}

func newFakePinboard(t *testing.T, clk *clock.Fake) *fakePinboard {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fakePinboard{
		t:        t,
		clk:      clk,
		url:      "http://" + ln.Addr().String(),
		ln:       ln,
		client:   &fasthttp.Client{},
		closed:   make(chan struct{}),
		notify:   func() {},
		leaseMs:  wire.DefaultLeaseMs,
		sessions: map[string]wire.RegisterRequest{},
	}
	p.srv = &fasthttp.Server{Handler: p.handle, Name: "fake-pinboard"}
	go p.srv.Serve(ln) //nolint:errcheck // ends with Shutdown
	return p
}

// stop answers every held call, then shuts the server down.
func (p *fakePinboard) stop() {
	select {
	case <-p.closed:
	default:
		close(p.closed)
	}
	_ = p.srv.Shutdown()
	_ = p.ln.Close() // in case Serve had not started yet: Shutdown does not stop it then
	p.client.CloseIdleConnections()
}

func (p *fakePinboard) handle(ctx *fasthttp.RequestCtx) {
	defer p.notify()
	if string(ctx.Request.Header.Peek("Authorization")) != "Bearer "+testToken {
		p.reply(ctx, fasthttp.StatusUnauthorized, wire.Error{Error: "bad token"})
		return
	}
	now := p.clk.Now()
	p.mu.Lock()
	p.order = append(p.order, string(ctx.Path()))
	p.mu.Unlock()
	switch string(ctx.Path()) {
	case wire.PathRegister:
		var req wire.RegisterRequest
		if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
			p.reply(ctx, 400, wire.Error{Error: err.Error()})
			return
		}
		rec := regRec{req: req, at: now, abortsBefore: len(p.host.abortList())}
		_, why := p.w.Admit(p.w.secret, nil)
		rec.admitted = why == ""
		p.mu.Lock()
		p.registers = append(p.registers, rec)
		n := len(p.registers)
		a := action{}
		if p.onRegister != nil {
			a = p.onRegister(n)
		}
		p.mu.Unlock()
		p.notify()
		if !p.await(a) {
			p.reply(ctx, fasthttp.StatusServiceUnavailable, wire.Error{Error: "pinboard stopping"})
			return
		}
		if err := p.fetchChallenge(req.AdvertiseURL, req.Secret, req.Challenge, req.ChallengeValue); err != nil {
			p.reply(ctx, 422, wire.Error{Error: "challenge failed: " + err.Error()})
			return
		}
		if a.status != 0 {
			p.reply(ctx, a.status, wire.Error{Error: "scripted failure"})
			return
		}
		p.mu.Lock()
		p.nextSession++
		id := fmt.Sprintf("s%d", p.nextSession)
		p.sessions[id] = req
		lease := p.leaseMs
		p.mu.Unlock()
		if a.leaseMs != 0 {
			lease = a.leaseMs
		}
		p.reply(ctx, 200, wire.RegisterResponse{SessionID: id, ExpiresInMs: lease})
	case wire.PathHeartbeat:
		var req wire.HeartbeatRequest
		if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
			p.reply(ctx, 400, wire.Error{Error: err.Error()})
			return
		}
		p.mu.Lock()
		p.heartbeats = append(p.heartbeats, hbRec{req: req, at: now})
		n := len(p.heartbeats)
		a := action{}
		if p.onHeartbeat != nil {
			a = p.onHeartbeat(n, req)
		}
		reg, known := p.sessions[req.SessionID]
		p.mu.Unlock()
		p.notify()
		if !p.await(a) {
			p.reply(ctx, fasthttp.StatusServiceUnavailable, wire.Error{Error: "pinboard stopping"})
			return
		}
		if (req.Challenge == "") != (req.ChallengeValue == "") {
			p.reply(ctx, 400, wire.Error{Error: "challenge pair is both-or-neither"})
			return
		}
		if known && req.Challenge != "" {
			if err := p.fetchChallenge(reg.AdvertiseURL, reg.Secret, req.Challenge, req.ChallengeValue); err != nil {
				p.reply(ctx, 422, wire.Error{Error: "challenge failed: " + err.Error()})
				return
			}
		}
		switch {
		case a.nack != "":
			p.reply(ctx, fasthttp.StatusConflict, wire.Nack{Nack: a.nack})
			return
		case a.status != 0:
			p.reply(ctx, a.status, wire.Error{Error: "scripted failure"})
			return
		case !known:
			p.reply(ctx, fasthttp.StatusConflict, wire.Nack{Nack: wire.NackReregister})
			return
		}
		p.mu.Lock()
		lease := p.leaseMs
		msgs := p.queue
		p.queue = nil
		p.mu.Unlock()
		if a.leaseMs != 0 {
			lease = a.leaseMs
		}
		p.reply(ctx, 200, wire.HeartbeatResponse{ExpiresInMs: lease, Messages: msgs, Reregister: a.reregister})
	case wire.PathRelease:
		var req wire.ReleaseRequest
		if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
			p.reply(ctx, 400, wire.Error{Error: err.Error()})
			return
		}
		p.mu.Lock()
		p.releases = append(p.releases, req)
		n := len(p.releases)
		a := action{}
		if p.onRelease != nil {
			a = p.onRelease(n)
		}
		p.mu.Unlock()
		if !p.await(a) {
			p.reply(ctx, fasthttp.StatusServiceUnavailable, wire.Error{Error: "pinboard stopping"})
			return
		}
		if a.status != 0 {
			p.reply(ctx, a.status, wire.Error{Error: "scripted failure"})
			return
		}
		p.reply(ctx, 200, wire.ReleaseResponse{Released: true})
	case wire.PathReleases:
		var req wire.ReleasesRequest
		if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
			p.reply(ctx, 400, wire.Error{Error: err.Error()})
			return
		}
		p.mu.Lock()
		if p.noBatch {
			p.mu.Unlock()
			p.reply(ctx, 404, wire.Error{Error: "not found"})
			return
		}
		for _, it := range req.Releases {
			p.releases = append(p.releases, wire.ReleaseRequest{ClientID: req.ClientID, Namespace: req.Namespace, ID: it.ID, SessionID: req.SessionID, Epoch: it.Epoch})
		}
		p.batches = append(p.batches, len(req.Releases))
		p.bodySizes = append(p.bodySizes, len(ctx.PostBody()))
		n := len(p.releases)
		a := action{}
		if p.onRelease != nil {
			a = p.onRelease(n)
		}
		itemStatus := p.itemStatus
		p.mu.Unlock()
		if !p.await(a) {
			p.reply(ctx, fasthttp.StatusServiceUnavailable, wire.Error{Error: "pinboard stopping"})
			return
		}
		if a.status != 0 {
			p.reply(ctx, a.status, wire.Error{Error: "scripted failure"})
			return
		}
		out := wire.ReleasesResponse{Results: make([]wire.ReleaseResult, len(req.Releases))}
		for i, it := range req.Releases {
			out.Results[i].Released = true
			if itemStatus != nil {
				if st := itemStatus(it.ID); st != 0 {
					out.Results[i] = wire.ReleaseResult{Status: st, Error: "scripted item failure", Field: "id"}
				}
			}
		}
		p.reply(ctx, 200, out)
	case wire.PathDeregister:
		var req wire.DeregisterRequest
		if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
			p.reply(ctx, 400, wire.Error{Error: err.Error()})
			return
		}
		p.mu.Lock()
		p.deregisters = append(p.deregisters, req)
		n := len(p.deregisters)
		a := action{}
		if p.onDeregister != nil {
			a = p.onDeregister(n)
		}
		_, known := p.sessions[req.SessionID]
		delete(p.sessions, req.SessionID)
		p.mu.Unlock()
		if a.status != 0 {
			p.reply(ctx, a.status, wire.Error{Error: "scripted failure"})
			return
		}
		p.reply(ctx, 200, wire.DeregisterResponse{Deregistered: known})
	default:
		p.reply(ctx, 404, wire.Error{Error: "not found"})
	}
}

// await applies drop and hold; it reports whether to go on answering.
func (p *fakePinboard) await(a action) bool {
	if !a.drop && a.hold == nil {
		return true
	}
	p.mu.Lock()
	p.held++
	p.mu.Unlock()
	p.notify()
	defer func() {
		p.mu.Lock()
		p.held--
		p.mu.Unlock()
	}()
	if a.drop {
		<-p.closed
		return false
	}
	select {
	case <-a.hold:
		return true
	case <-p.closed:
		return false
	}
}

// fetchChallenge does what the real pinboard does before accepting a call.
func (p *fakePinboard) fetchChallenge(advertise, secret, challenge, value string) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(advertise + wire.PathChallenge + "?" + wire.QueryChallenge + "=" + url.QueryEscape(challenge))
	req.Header.Set(wire.HeaderProxySecret, secret)
	err := p.client.DoTimeout(req, resp, 5*time.Second)
	if err == nil && resp.StatusCode() != 200 {
		err = fmt.Errorf("status %d", resp.StatusCode())
	}
	if err == nil {
		var cr wire.ChallengeResponse
		if e := json.Unmarshal(resp.Body(), &cr); e != nil || cr.Value != value {
			err = errors.New("wrong value")
		}
	}
	if err != nil {
		p.mu.Lock()
		p.fetchErrors = append(p.fetchErrors, err.Error())
		p.mu.Unlock()
	}
	return err
}

func (p *fakePinboard) reply(ctx *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.Marshal(v)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func (p *fakePinboard) push(m wire.Message) {
	p.mu.Lock()
	p.queue = append(p.queue, m)
	p.mu.Unlock()
}

func (p *fakePinboard) registerList() []regRec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]regRec(nil), p.registers...)
}
func (p *fakePinboard) heartbeatList() []hbRec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]hbRec(nil), p.heartbeats...)
}
func (p *fakePinboard) releaseList() []wire.ReleaseRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]wire.ReleaseRequest(nil), p.releases...)
}
func (p *fakePinboard) batchList() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.batches...)
}
func (p *fakePinboard) deregisterList() []wire.DeregisterRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]wire.DeregisterRequest(nil), p.deregisters...)
}
func (p *fakePinboard) callOrder() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.order...)
}
func (p *fakePinboard) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// harness runs one Worker against a fakePinboard on a fake clock, with its
// challenge endpoint served on a real listener.
type harness struct {
	t    *testing.T
	clk  *clock.Fake
	pb   *fakePinboard
	w    *Worker
	host *fakeHost
	logs *logtest.Buffer
	adv  *fasthttp.Server
	ln   net.Listener

	mu       sync.Mutex
	waiters  []*waiter
	inflight int           // the loop's calls in flight at its last idle pass
	frozen   chan struct{} // non-nil: the loop blocks at its next idle pass
	isFrozen chan struct{}

	step    time.Duration // advance's step: every timer of the test must fall on a multiple
	poke    chan struct{}
	cancel  context.CancelFunc
	runErr  error
	runDone chan struct{}
}

type waiter struct {
	pred func() bool
	done chan struct{}
}

// newHarness builds the pieces; start runs the worker.
func newHarness(t *testing.T, tweak ...func(*Config)) *harness {
	t.Helper()
	clk := clock.NewFake(t0Wall)
	h := &harness{
		t:        t,
		clk:      clk,
		logs:     &logtest.Buffer{},
		poke:     make(chan struct{}, 1),
		isFrozen: make(chan struct{}, 1),
		runDone:  make(chan struct{}),
		step:     100 * time.Millisecond,
	}
	h.pb = newFakePinboard(t, clk)
	h.pb.notify = h.pokeLoop

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		PinboardURL:    h.pb.url,
		AdvertiseURL:   "http://" + ln.Addr().String(),
		Token:          testToken,
		Logger:         slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Clock:          clk,
		RequestTimeout: 20 * time.Second, // real time; held calls are answered at cleanup
	}
	for _, f := range tweak {
		f(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.jitter = func(n int64) int64 { return n - 1 } // the ceiling: deterministic backoff
	w.hooks = &testHooks{idle: h.idle, poke: h.poke}
	h.w = w
	h.host = &fakeHost{ns: "/counter", cap: 100, w: w, clk: clk, closedIdle: h.pokeLoop}
	if _, err := w.Attach(h.host); err != nil {
		t.Fatal(err)
	}
	h.pb.host, h.pb.w = h.host, w

	r := router.New()
	w.Mount(r)
	h.adv = &fasthttp.Server{Handler: r.Handler}
	h.ln = ln
	go h.adv.Serve(ln) //nolint:errcheck // ends with Shutdown

	t.Cleanup(h.close)
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.runDone)
		h.runErr = h.w.Run(ctx)
	}()
}

func (h *harness) close() {
	if h.cancel != nil {
		h.cancel()
	}
	h.thaw()
	h.pb.stop()
	if h.cancel != nil {
		select {
		case <-h.runDone:
		case <-time.After(30 * time.Second):
			h.t.Error("Run did not return after cancel")
		}
	}
	_ = h.adv.Shutdown()
	_ = h.ln.Close()
	logs := h.logs.String()
	if strings.Contains(logs, testToken) {
		h.t.Errorf("the logs contain the deployment token:\n%s", logs)
	}
	if strings.Contains(logs, string(h.w.secret)) {
		h.t.Errorf("the logs contain the worker's secret:\n%s", logs)
	}
	if h.t.Failed() {
		h.t.Logf("worker logs:\n%s", logs)
	}
}

// idle runs on the loop goroutine each time it is about to block.
func (h *harness) idle(inflight int) {
	h.mu.Lock()
	h.inflight = inflight
	f := h.frozen
	h.mu.Unlock()
	if f != nil {
		h.isFrozen <- struct{}{}
		<-f
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	keep := h.waiters[:0]
	for _, w := range h.waiters {
		if w.pred() {
			close(w.done)
		} else {
			keep = append(keep, w)
		}
	}
	h.waiters = keep
}

func (h *harness) pokeLoop() {
	select {
	case h.poke <- struct{}{}:
	default:
	}
}

// until waits until pred holds at one of the loop's idle passes (so the
// loop has armed its timer for the state pred describes).
func (h *harness) until(what string, pred func() bool) {
	h.t.Helper()
	w := &waiter{pred: pred, done: make(chan struct{})}
	h.mu.Lock()
	h.waiters = append(h.waiters, w)
	h.mu.Unlock()
	h.pokeLoop()
	select {
	case <-w.done:
	case <-h.runDone:
		if !pred() {
			h.t.Fatalf("Run returned (%v) while waiting for %s", h.runErr, what)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatalf("timed out waiting for %s", what)
	}
}

// settle waits until every call the loop has in flight is either answered
// and processed or held by the pinboard, and the loop is asleep.
func (h *harness) settle() {
	h.t.Helper()
	h.until("the loop to settle", func() bool { return h.inflight == h.pb.heldCount() })
}

// advance moves the clock by d in steps of at most h.step, settling after
// each, so that every call happens at the instant its timer fired (when the
// timers fall on multiples of h.step).
func (h *harness) advance(d time.Duration) {
	h.t.Helper()
	for d > 0 {
		s := min(d, h.step)
		h.clk.Advance(s)
		d -= s
		h.settle()
	}
}

// advanceTo advances until the clock reads t0 + off (monotonic).
func (h *harness) advanceTo(off time.Duration) {
	h.t.Helper()
	h.advance(off - h.elapsed())
}

// elapsed is the monotonic time since the fake clock's start.
func (h *harness) elapsed() time.Duration {
	return h.clk.Now().Sub(clock.NewFake(t0Wall).Now())
}

// freeze stops the loop at its next idle pass (a stalled process).
func (h *harness) freeze() {
	h.t.Helper()
	h.mu.Lock()
	h.frozen = make(chan struct{})
	h.mu.Unlock()
	h.pokeLoop()
	select {
	case <-h.isFrozen:
	case <-time.After(10 * time.Second):
		h.t.Fatal("the loop did not freeze")
	}
}

func (h *harness) thaw() {
	h.mu.Lock()
	f := h.frozen
	h.frozen = nil
	h.mu.Unlock()
	if f != nil {
		close(f)
	}
}

// register starts the worker and waits for its first lease.
func (h *harness) register() string {
	h.t.Helper()
	h.start()
	h.until("registration", h.w.Ready)
	return h.w.Session()
}

// admit is Admit with the right secret.
func (h *harness) admit(session string) string {
	var s []byte
	if session != "" {
		s = []byte(session)
	}
	_, why := h.w.Admit(h.w.secret, s)
	return why
}

// at is the fake instant t0 + off.
func at(off time.Duration) clock.Instant { return clock.NewFake(t0Wall).Now().Add(off) }

// metric returns the value of one series in the worker's set.
func (h *harness) metric(series string) string {
	var b bytes.Buffer
	h.w.Metrics().WritePrometheus(&b)
	for line := range strings.SplitSeq(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return "<missing>"
}
