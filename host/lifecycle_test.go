package host

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

func TestActivationOnceUnderConcurrentFirstRequests(t *testing.T) {
	const n = 1000
	e := newEnv()
	e.setupWait = make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(e.setupWait) }) }
	t.Cleanup(open) // on failure, let the handlers blocked on setup finish
	var arrived atomic.Int64
	allArrived := make(chan struct{})
	h, err := New(Config{Namespace: "/p", Logger: quietLogger()}, e.typ())
	if err != nil {
		t.Fatal(err)
	}
	ts := serve(t, h, func(ctx *fasthttp.RequestCtx) {
		if arrived.Add(1) == n {
			close(allArrived)
		}
		h.Handler(ctx)
	})
	ts.tr.MaxIdleConnsPerHost = n
	// The first requests wait in the host until all n arrived (up to the
	// 6×testTimeout below on a loaded machine): their client must wait
	// longer than that.
	ts.client.Timeout = 7 * testTimeout

	var wg sync.WaitGroup
	nonces := make(chan any, n)
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			r, err := ts.doErr("GET", "/p/same/")
			if err != nil {
				errs <- err
				return
			}
			if r.status != 200 {
				errs <- fmt.Errorf("GET /p/same/ = %d %s", r.status, r.body)
				return
			}
			nonces <- r.json(t)["nonce"]
		})
	}
	select {
	case <-allArrived:
	case <-time.After(6 * testTimeout): // 1000 connections on a loaded 2-core machine
		t.Fatalf("only %d of %d requests arrived", arrived.Load(), n)
	}
	open() // every request is in the host before the setup ends
	wg.Wait()
	close(errs)
	close(nonces)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[any]int{}
	for v := range nonces {
		seen[v]++
	}
	if got := e.setups.Load(); got != 1 {
		t.Errorf("setups = %d; want 1", got)
	}
	if len(seen) != 1 {
		t.Errorf("distinct instances seen = %v; want 1", seen)
	}
	if h.Len() != 1 {
		t.Errorf("Len() = %d; want 1", h.Len())
	}
}

func TestSetupFailure(t *testing.T) {
	e := newEnv()
	e.setupErr = func(id string) error {
		switch id {
		case "bad":
			return errors.New("database unreachable")
		case "missing":
			return NewError(404, "no such room")
		}
		return nil
	}
	ts := newTestHost(t, Config{}, e)

	r := ts.expect(500, "GET", "/p/bad/")
	if msg := r.json(t)["error"]; msg != "instance setup failed" {
		t.Errorf("setup failure body error = %q; want %q", msg, "instance setup failed")
	}
	if strings.Contains(r.body, "database") {
		t.Errorf("setup failure leaked the error text: %s", r.body)
	}
	if ts.h.Len() != 0 || ts.h.instance("bad") != nil {
		t.Errorf("after a failed setup Len() = %d; want 0 and no instance", ts.h.Len())
	}
	r = ts.expect(404, "GET", "/p/missing/")
	if msg := r.json(t)["error"]; msg != "no such room" {
		t.Errorf("*Error from setup: body error = %q; want %q", msg, "no such room")
	}
	// A later request tries again.
	ts.expect(500, "GET", "/p/bad/")
	if got := e.setups.Load(); got != 3 {
		t.Errorf("setups = %d; want 3 (each failed activation retried)", got)
	}
	if got := e.teardowns.Load(); got != 0 {
		t.Errorf("teardowns = %d; want 0 (teardown never runs for a failed setup)", got)
	}
	ts.expect(200, "GET", "/p/good/")
}

func TestSetupFailureAnswersEveryWaiter(t *testing.T) {
	const n = 20
	e := newEnv()
	e.setupWait = make(chan struct{})
	e.setupErr = func(string) error { return errors.New("nope") }
	ts := newTestHost(t, Config{}, e)
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	for range n {
		wg.Go(func() {
			r, err := ts.doErr("GET", "/p/x/")
			if err != nil {
				statuses <- -1
				return
			}
			statuses <- r.status
		})
	}
	// Wait until every request joined the activation (the first one holds
	// one activity, each waiter one more).
	waitFor(t, "all requests joined the activation", func() bool {
		inst := ts.h.instance("x")
		if inst == nil {
			return false
		}
		sh := &ts.h.shards[inst.shard]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return inst.activity == n
	})
	close(e.setupWait)
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != 500 {
			t.Errorf("waiter status = %d; want 500", s)
		}
	}
	if got := e.setups.Load(); got != 1 {
		t.Errorf("setups = %d; want 1", got)
	}
	if ts.h.Len() != 0 {
		t.Errorf("Len() = %d; want 0", ts.h.Len())
	}
}

// waitFor polls an in-process condition. It is used only where the event
// has no channel to wait on (for example "n goroutines are now blocked").
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIdleEviction(t *testing.T) {
	fc := fakeClock()
	e := newEnv()
	ts := newTestHost(t, Config{Clock: fc, IdleTimeout: time.Minute, SweepInterval: time.Second}, e)
	h := ts.h
	first := ts.expect(200, "GET", "/p/a/").json(t)["nonce"]

	fc.Advance(59 * time.Second)
	h.sweep()
	if h.instance("a") == nil {
		t.Fatal("instance evicted before IdleTimeout")
	}
	// A request resets the idle time.
	ts.expect(200, "GET", "/p/a/")
	fc.Advance(59 * time.Second)
	h.sweep()
	if h.instance("a") == nil {
		t.Fatal("instance evicted less than IdleTimeout after its last request")
	}
	fc.Advance(time.Second)
	h.sweep()
	e.waitTorn(t, "a")
	if got := e.tornCount("a"); got != 1 {
		t.Errorf("teardowns of a = %d; want 1", got)
	}
	// A later request activates a fresh instance.
	if again := ts.expect(200, "GET", "/p/a/").json(t)["nonce"]; again == first {
		t.Errorf("nonce after eviction = %v; want a new activation", again)
	}
	if got := h.met.evictions[evictIndex(EvictIdle)].Get(); got != 1 {
		t.Errorf("pinned_evictions_total{reason=idle} = %d; want 1", got)
	}
}

func TestSweeperRunsOnTheClock(t *testing.T) {
	fc := fakeClock()
	e := newEnv()
	ts := newTestHost(t, Config{Clock: fc, IdleTimeout: time.Minute, SweepInterval: 10 * time.Second}, e)
	ts.expect(200, "GET", "/p/a/")
	fc.BlockUntil(1, nil) // the sweeper's timer
	for range 7 {
		fc.Advance(10 * time.Second)
		fc.BlockUntil(1, nil) // re-armed: the sweep ran
	}
	e.waitTorn(t, "a")
}

// TestIdleEvictionBlockedByActivity: a request, a stream, a websocket and a
// task each keep an instance from being evicted; once they end it goes.
func TestIdleEvictionBlockedByActivity(t *testing.T) {
	fc := fakeClock()
	e := newEnv()
	ts := newTestHost(t, Config{Clock: fc, IdleTimeout: time.Minute, SweepInterval: time.Second}, e)
	h := ts.h
	expire := func() {
		fc.Advance(time.Hour)
		h.sweep()
	}
	mustLive := func(id, why string) {
		t.Helper()
		if inst := h.instance(id); inst == nil || inst.state != stateActive {
			t.Fatalf("instance %s evicted while %s", id, why)
		}
	}

	t.Run("request", func(t *testing.T) {
		done := make(chan response, 1)
		go func() { r, _ := ts.doErr("GET", "/p/req/block"); done <- r }()
		e.waitEntered(t, "req")
		expire()
		mustLive("req", "a request was in flight")
		e.block <- struct{}{} // let the handler finish
		if r := <-done; r.status != 200 {
			t.Fatalf("blocked request = %d %s", r.status, r.body)
		}
		expire()
		e.waitTorn(t, "req")
	})

	t.Run("stream", func(t *testing.T) {
		resp := ts.openStream("/p/str/stream?n=0&size=1000")
		expire()
		mustLive("str", "a stream was open")
		resp.Body.Close()
		waitFor(t, "the stream to close", func() bool { return h.met.streams.Get() == 0 })
		expire()
		e.waitTorn(t, "str")
	})

	t.Run("websocket", func(t *testing.T) {
		conn := ts.dialWS("/p/sock/ws")
		if got := wsEcho(t, conn, "hi"); got != "hi" { // the handler runs
			t.Fatalf("echo = %q", got)
		}
		expire()
		mustLive("sock", "a websocket was open")
		conn.Close()
		waitFor(t, "the websocket to close", func() bool { return h.met.websockets.Get() == 0 })
		expire()
		e.waitTorn(t, "sock")
	})

	t.Run("task", func(t *testing.T) {
		ts.expect(202, "POST", "/p/task/task")
		e.waitEntered(t, "task")
		expire()
		mustLive("task", "a task was running")
		e.taskBlock <- struct{}{}
		waitFor(t, "the task to end", func() bool { return h.met.tasks.Get() == 0 })
		expire()
		e.waitTorn(t, "task")
	})
}

func TestCapacity(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{MaxInstances: 2, RetryAfter: 3 * time.Second}, e)
	ts.expect(200, "GET", "/p/a/")
	ts.expect(200, "GET", "/p/b/")
	r := ts.expect(503, "GET", "/p/c/")
	if got, want := r.header.Get("X-Pinned-Reason"), "capacity"; got != want {
		t.Errorf("X-Pinned-Reason = %q; want %q", got, want)
	}
	if got, want := r.header.Get("Retry-After"), "3"; got != want {
		t.Errorf("Retry-After = %q; want %q", got, want)
	}
	if ts.h.Headroom() != 0 || ts.h.Len() != 2 {
		t.Errorf("Headroom, Len = %d, %d; want 0, 2", ts.h.Headroom(), ts.h.Len())
	}
	// Existing instances keep serving.
	ts.expect(200, "POST", "/p/a/incr")
	ts.expect(200, "GET", "/p/b/")
	// A freed slot activates the refused id.
	ts.expect(200, "GET", "/p/a/abort")
	e.waitTorn(t, "a")
	waitFor(t, "a to leave the directory", func() bool { return ts.h.Len() == 1 })
	ts.expect(200, "GET", "/p/c/")
	if got := ts.h.met.rejections[rejectIndex("capacity")].Get(); got != 1 {
		t.Errorf("pinned_rejections_total{reason=capacity} = %d; want 1", got)
	}
}

func TestAbortCancelsHandlersTasksAndStreams(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	h := ts.h

	// A blocked handler, a running task, an open stream whose client stopped
	// reading, and a websocket, all on one instance.
	// (The blocked handler holds the turn, so it comes last.)
	ts.expect(202, "POST", "/p/x/task")
	e.waitEntered(t, "x")
	stream := ts.openStream("/p/x/stream?n=0&size=4096")
	defer stream.Body.Close()
	conn := ts.dialWS("/p/x/ws")
	defer conn.Close()
	wsEcho(t, conn, "hello")
	blocked := make(chan response, 1)
	go func() { r, _ := ts.doErr("GET", "/p/x/block"); blocked <- r }()
	e.waitEntered(t, "x")
	inst := h.instance("x")
	// The gauges count what is running.
	for name, g := range map[string]interface{ Get() float64 }{
		"pinned_tasks": h.met.tasks, "pinned_open_streams": h.met.streams,
		"pinned_open_websockets": h.met.websockets, "pinned_instances": h.met.instances,
	} {
		if got := g.Get(); got != 1 {
			t.Errorf("%s = %v while one runs; want 1", name, got)
		}
	}

	// Abort from outside (as AbortAll would).
	h.abort(inst, EvictAbort)

	if r := <-blocked; r.status != 503 || r.header.Get("X-Pinned-Reason") != "aborted" {
		t.Errorf("aborted handler answered %d (reason %q); want 503 aborted", r.status, r.header.Get("X-Pinned-Reason"))
	}
	_ = conn.SetReadDeadline(time.Now().Add(testTimeout))
	if _, _, err := conn.ReadMessage(); err == nil {
		t.Error("websocket still open after abort")
	}
	e.waitTorn(t, "x")
	if err := inst.Context().Err(); err == nil {
		t.Error("instance context not cancelled by abort")
	}
	// The stream ended (the client sees the end of the body or an error,
	// never a hang).
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := stream.Body.Read(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("stream still open after abort")
	}
	if got := e.tornCount("x"); got != 1 {
		t.Errorf("teardowns = %d; want 1", got)
	}
	if got := h.met.aborts.Get(); got != 1 {
		t.Errorf("pinned_aborts_total = %d; want 1", got)
	}
	waitFor(t, "the gauges to return to 0", func() bool {
		return h.met.tasks.Get() == 0 && h.met.streams.Get() == 0 && h.met.websockets.Get() == 0 && h.met.instances.Get() == 0
	})
	if got := h.met.evictions[evictIndex(EvictAbort)].Get(); got != 1 {
		t.Errorf("pinned_evictions_total{reason=abort} = %d; want 1", got)
	}
	if got := h.met.rejections[rejectIndex(wire.ReasonAborted)].Get(); got != 1 {
		t.Errorf("pinned_rejections_total{reason=aborted} = %d; want 1 (the blocked handler)", got)
	}
	if inst.Go(func(context.Context) error { return nil }) != ErrInstanceClosed {
		t.Error("Go on an aborted instance did not return ErrInstanceClosed")
	}
	if inst.Do(func() {}) != ErrInstanceClosed {
		t.Error("Do on an aborted instance did not return ErrInstanceClosed")
	}
}

func TestAbortFromHandlerAndPanic(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	ts.expect(200, "GET", "/p/a/abort")
	e.waitTorn(t, "a")

	r := ts.expect(500, "GET", "/p/b/panic")
	if strings.Contains(r.body, "boom") {
		t.Errorf("panic value leaked into the response: %s", r.body)
	}
	e.waitTorn(t, "b") // a panicking handler aborts its instance

	r = ts.expect(500, "GET", "/p/c/fail")
	if strings.Contains(r.body, "secret") {
		t.Errorf("handler error leaked into the response: %s", r.body)
	}
	if ts.h.instance("c") == nil {
		t.Error("a handler error (not a panic) ended the instance")
	}
}

func TestTeardownOnceOnClose(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	for i := range 50 {
		ts.expect(200, "GET", fmt.Sprintf("/p/i%d/", i))
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := ts.h.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := e.teardowns.Load(); got != 50 {
		t.Errorf("teardowns after Close = %d; want 50", got)
	}
	for i := range 50 {
		if got := e.tornCount(fmt.Sprintf("i%d", i)); got != 1 {
			t.Errorf("teardowns of i%d = %d; want 1", i, got)
		}
	}
	if err := ts.h.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if ts.h.Start() != ErrHostClosed {
		t.Error("Start after Close did not return ErrHostClosed")
	}
	ts.expect503("closing", "GET", "/p/new/")
	if ts.h.Len() != 0 {
		t.Errorf("Len() after Close = %d; want 0", ts.h.Len())
	}
}

func TestCloseWaitsForInFlightThenAborts(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	h := ts.h

	// Graceful: Close waits for a running handler.
	blocked := make(chan response, 1)
	go func() { r, _ := ts.doErr("GET", "/p/a/block"); blocked <- r }()
	e.waitEntered(t, "a")
	ts.expect(202, "POST", "/p/b/task")
	e.waitEntered(t, "b")
	ts.expect(200, "GET", "/p/c/")

	closed := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { closed <- h.Close(ctx) }()
	e.waitTorn(t, "c") // the idle one goes at once
	// Close marks the instances closing shard by shard: until it reaches
	// a, a GET of a is served normally (it would wait for the turn the
	// blocked handler holds).
	waitFor(t, "Close to reach a", func() bool {
		inst := h.instance("a")
		sh := &h.shards[inst.shard]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return inst.state != stateActive
	})
	ts.expect503("closing", "GET", "/p/a/")
	ts.expect503("closing", "GET", "/p/zzz/")
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v while a handler was running", err)
	default:
	}
	e.block <- struct{}{} // the handler finishes normally
	if r := <-blocked; r.status != 200 {
		t.Errorf("in-flight request during Close = %d; want 200", r.status)
	}
	e.waitTorn(t, "a")

	// Past the deadline: the task is aborted.
	cancel()
	if err := <-closed; !errors.Is(err, context.Canceled) {
		t.Errorf("Close past its deadline = %v; want context.Canceled", err)
	}
	if got := e.tornCount("b"); got != 1 {
		t.Errorf("teardowns of b = %d; want 1", got)
	}
	if got := e.teardowns.Load(); got != 3 {
		t.Errorf("teardowns = %d; want 3", got)
	}
}

func TestLocalModeClosingIDWaitsThenReactivates(t *testing.T) {
	e := newEnv()
	release := make(chan struct{})
	typ := e.typ()
	td := typ.Teardown
	typ.Teardown = func(p *probe) {
		if p.inst.ID() == "slow" {
			<-release
		}
		td(p)
	}
	h, err := New(Config{Namespace: "/p", Logger: quietLogger()}, typ)
	if err != nil {
		t.Fatal(err)
	}
	ts := serve(t, h, h.Handler)
	first := ts.expect(200, "GET", "/p/slow/").json(t)["nonce"]
	h.CloseIdle(EvictIdle) // teardown now blocks on release
	waitFor(t, "the instance to be closing", func() bool {
		inst := h.instance("slow")
		return inst != nil && inst.state == stateClosing
	})
	got := make(chan response, 1)
	go func() { r, _ := ts.doErr("GET", "/p/slow/"); got <- r }()
	select {
	case r := <-got:
		t.Fatalf("request for a closing id answered %d before the close finished", r.status)
	case <-time.After(20 * time.Millisecond): // a short grace to show it waits, not a synchronisation
	}
	close(release)
	r := <-got
	if r.status != 200 {
		t.Fatalf("request after the close = %d %s; want 200", r.status, r.body)
	}
	if r.json(t)["nonce"] == first {
		t.Error("request for a closing id was served by the closing instance")
	}
}

func TestLocalModeCloseWaitBounded(t *testing.T) {
	fc := fakeClock()
	e := newEnv()
	release := make(chan struct{})
	typ := e.typ()
	typ.Teardown = func(p *probe) { <-release }
	h, err := New(Config{Namespace: "/p", Clock: fc, CloseWait: 5 * time.Second, Logger: quietLogger()}, typ)
	if err != nil {
		t.Fatal(err)
	}
	ts := serve(t, h, h.Handler)
	defer close(release)
	ts.expect(200, "GET", "/p/slow/")
	h.CloseIdle(EvictIdle)
	waitFor(t, "the instance to be closing", func() bool {
		inst := h.instance("slow")
		return inst != nil && inst.state == stateClosing
	})
	got := make(chan response, 1)
	go func() { r, _ := ts.doErr("GET", "/p/slow/"); got <- r }()
	fc.BlockUntil(1, nil) // the request waits on its CloseWait timer
	fc.Advance(5 * time.Second)
	r := <-got
	if r.status != 503 || r.header.Get("X-Pinned-Reason") != "closing" || r.header.Get("Retry-After") == "" {
		t.Fatalf("request after CloseWait = %d %v; want 503 closing with Retry-After", r.status, r.header)
	}
}

func TestStatusesCarryRetryAfter(t *testing.T) {
	// Every 503 of these tests goes through reject; check the header set
	// once more on a raw response.
	e := newEnv()
	ts := newTestHost(t, Config{MaxInstances: 1}, e)
	ts.expect(200, "GET", "/p/a/")
	req, _ := http.NewRequest("GET", "http://pinned.test/p/b/", nil)
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("capacity answer = %d %v; want 503, Retry-After 1, JSON", resp.StatusCode, resp.Header)
	}
	// The application's own 503 (an *Error, here from New) carries it too.
	e.setupErr = func(id string) error { return NewError(503, "my store is down") }
	ts.h.instance("a").Abort()
	e.waitTorn(t, "a")
	waitFor(t, "a to leave", func() bool { return ts.h.instance("a") == nil })
	for _, path := range []string{"/p/a/", "/p/b/"} {
		r := ts.expect(503, "GET", path)
		if r.header.Get("Retry-After") != "1" || r.json(t)["error"] != "my store is down" {
			t.Errorf("application 503 from New = %v %s; want Retry-After 1 and its message", r.header, r.body)
		}
	}
}

// TestCloseSendsGoingAwayToWebSockets: a graceful Close does not wait for
// websockets (they have no natural end): their handlers are asked to return
// and the client gets a 1001 close frame, well before Close's deadline.
func TestCloseSendsGoingAwayToWebSockets(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	conn := ts.dialWS("/p/w/ws")
	defer conn.Close()
	wsEcho(t, conn, "hi")
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- ts.h.Close(ctx) }()
	_ = conn.SetReadDeadline(time.Now().Add(testTimeout))
	_, _, err := conn.ReadMessage()
	if !websocket.IsCloseError(err, websocket.CloseGoingAway) {
		t.Errorf("websocket during Close: read error %v; want a 1001 close frame", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close = %v; want nil (graceful)", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close waited for an open websocket")
	}
	if got := e.tornCount("w"); got != 1 {
		t.Errorf("teardowns = %d; want 1", got)
	}
}
