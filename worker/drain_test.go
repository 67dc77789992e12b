package worker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// drain: new activations refused (Draining), existing instances keep
// serving, heartbeats report draining, the deadline and headroom 0; nothing
// is closed or aborted, not even at the deadline.
func TestDrainMessage(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.host.set(1, 1)
	deadline := t0Wall.Add(60 * time.Second).UnixMilli()
	h.pb.push(wire.Message{Type: wire.MessageDrain, DeadlineMs: deadline})
	if h.w.Draining() {
		t.Fatal("Draining() = true before the message arrived")
	}
	h.advanceTo(3 * time.Second)
	h.until("the draining heartbeat", func() bool { return len(h.pb.heartbeatList()) >= 2 })
	if !h.w.Draining() || h.metric("pinned_draining") != "1" {
		t.Fatal("Draining() = false after a drain message")
	}
	h.expectLogged("INFO", "drain started", "logger", "pinned.worker", "mode", "drain")
	hb := h.pb.heartbeatList()[1]
	if got := hb.at.Sub(at(0)); got != 3*time.Second {
		t.Errorf("draining heartbeat sent at t0+%v; want at once (t0+3s)", got)
	}
	if !hb.req.Draining || hb.req.DrainDeadline != deadline || hb.req.Headroom != 0 {
		t.Fatalf("heartbeat after drain = %+v; want draining, deadline %d, headroom 0", hb.req, deadline)
	}
	if why := h.admit(""); why != "" {
		t.Fatalf("Admit while draining = %q; want existing instances served", why)
	}
	h.advanceTo(70 * time.Second)
	if a, c := h.host.abortList(), h.host.closeIdleList(); len(a) != 0 || len(c) != 0 || h.host.Len() != 2 {
		t.Fatalf("drain closed or aborted instances: aborts %+v, CloseIdle %v, %d left", a, c, h.host.Len())
	}
	last := h.pb.heartbeatList()
	if r := last[len(last)-1].req; !r.Draining || r.DrainDeadline != deadline {
		t.Fatalf("late heartbeat = %+v; want still draining with the deadline", r)
	}
	if strings.Contains(h.logs.String(), "drain complete") {
		t.Fatal("drain complete logged while instances remain")
	}
	h.host.set(0, 0)
	h.advance(3 * time.Second)
	if !strings.Contains(h.logs.String(), "msg=\"drain complete") {
		t.Fatalf("no drain complete log once the host emptied:\n%s", h.logs.String())
	}
	h.expectLogged("INFO", "drain complete: no instance left", "logger", "pinned.worker", "mode", "drain")
}

// wind_down: drain, plus idle instances closed at once and on every tick,
// plus the rest aborted exactly at the deadline.
func TestWindDownMessage(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.host.set(1, 2)
	deadline := t0Wall.Add(8 * time.Second)
	h.pb.push(wire.Message{Type: wire.MessageWindDown, DeadlineMs: deadline.UnixMilli()})
	h.advanceTo(3 * time.Second)
	h.until("the draining heartbeat and the close of the idle instance", func() bool {
		return len(h.pb.heartbeatList()) >= 2 && len(h.host.closeIdleList()) > 0
	})
	if !h.w.Draining() {
		t.Fatal("Draining() = false after wind_down")
	}
	if c := h.host.closeIdleList(); len(c) == 0 || c[0] != reasonWindDown || h.host.Len() != 1 {
		t.Fatalf("CloseIdle calls %v, %d instances left; want CloseIdle(%q) at once, the busy one left", c, h.host.Len(), reasonWindDown)
	}
	n := len(h.host.closeIdleList())
	h.host.set(1, 1) // another instance went idle
	h.advanceTo(6 * time.Second)
	h.until("another CloseIdle on the next tick", func() bool { return len(h.host.closeIdleList()) > n && h.host.Len() == 1 })
	expectWindDownAbortAt(t, h, 8*time.Second)
}

func expectWindDownAbortAt(t *testing.T, h *harness, off time.Duration) {
	t.Helper()
	h.advanceTo(off - time.Nanosecond)
	if a := h.host.abortList(); len(a) != 0 {
		t.Fatalf("aborted before the wind_down deadline: %+v", a)
	}
	h.clk.Advance(time.Nanosecond)
	h.until("the deadline abort", func() bool { return len(h.host.abortList()) > 0 })
	a := h.host.abortList()[0]
	if a.reason != reasonWindDown || a.at.Sub(at(0)) != off || a.live != 1 {
		t.Fatalf("abort = %+v at t0+%v; want AbortAll(%q) of 1 instance at t0+%v", a, a.at.Sub(at(0)), reasonWindDown, off)
	}
}

func TestShutdownDrainsThenStops(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.host.set(1, 1)
	done := make(chan error, 1)
	go func() { done <- h.w.Shutdown(context.Background()) }()
	h.until("the draining heartbeat", func() bool {
		hb := h.pb.heartbeatList()
		return len(hb) == 1 && hb[0].req.Draining && hb[0].req.Headroom == 0 && h.host.Len() == 1
	})
	if !h.w.Draining() {
		t.Fatal("Draining() = false during Shutdown")
	}
	h.settle()
	h.clk.BlockUntil(2, nil) // the loop's timer and Shutdown's poll
	h.host.set(0, 1)         // the busy instance finished
	h.clk.Advance(DefaultShutdownPollInterval)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown() = %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	select {
	case <-h.w.runDone:
	default:
		t.Fatal("Shutdown returned before Run")
	}
	<-h.runDone
	if h.runErr != nil {
		t.Fatalf("Run() after Shutdown = %v; want nil", h.runErr)
	}
	hb := h.pb.heartbeatList()
	if last := hb[len(hb)-1].req; len(hb) < 2 || !last.Draining || last.Headroom != 0 {
		t.Fatalf("heartbeats %+v; want a final one reporting draining and headroom 0", hb)
	}
	for _, a := range h.host.abortList() {
		if a.live != 0 {
			t.Fatalf("Shutdown aborted live instances: %+v", a)
		}
	}
	if h.w.Ready() {
		t.Fatal("Ready() = true after Shutdown")
	}
}

func TestShutdownDeadlineAbortsTheRest(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.host.set(2, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.w.Shutdown(ctx) }()
	h.until("the draining heartbeat", func() bool { return len(h.pb.heartbeatList()) == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Shutdown() = %v; want an error wrapping context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if a := h.host.abortList(); len(a) == 0 || a[0].reason != reasonShutdown || a[0].live != 2 {
		t.Fatalf("aborts = %+v; want AbortAll(%q) of the 2 busy instances", a, reasonShutdown)
	}
}

func TestShutdownWithoutRun(t *testing.T) {
	h := newHarness(t)
	h.host.set(0, 3)
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown() = %v; want nil", err)
	}
	if h.host.Len() != 0 || !h.w.Draining() {
		t.Fatalf("after Shutdown: %d instances, Draining() = %v; want 0, true", h.host.Len(), h.w.Draining())
	}
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatalf("second Shutdown() = %v; want nil", err)
	}
	if n := len(h.pb.deregisterList()); n != 0 {
		t.Fatalf("Shutdown without a session made %d deregister calls; want 0", n)
	}
}

func TestDrainOnlyEscalates(t *testing.T) {
	h := newHarness(t)
	h.w.enterDrain(modeWindDown, 2000, "test")
	h.w.enterDrain(modeDrain, 1000, "test")
	h.w.enterDrain(modeDrain, 3000, "test")
	if mode, dl := h.w.drainSnapshot(); mode != modeWindDown || dl != 1000 {
		t.Fatalf("drain state = %v, %d; want wind_down, 1000 (highest mode, earliest deadline)", mode, dl)
	}
}

// Shutdown's last step is the deregistration of the session, after the
// final heartbeat, once every host is empty; it happens once.
func TestShutdownDeregisters(t *testing.T) {
	h := newHarness(t)
	sid := h.register()
	h.host.set(0, 2)
	if err := h.w.Release(context.Background(), "/counter", "abc", 0); err != nil {
		t.Fatal(err)
	}
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown() = %v; want nil", err)
	}
	if got := h.pb.deregisterList(); len(got) != 1 || got[0].SessionID != sid {
		t.Fatalf("deregister calls = %+v; want one for %s", got, sid)
	}
	order := h.pb.callOrder()
	if n := len(order); n < 3 || order[n-1] != wire.PathDeregister || order[n-2] != wire.PathHeartbeat {
		t.Fatalf("call order %v; want the final heartbeat, then the deregistration last", order)
	}
	if got := h.metric(`pinned_deregistrations_total{result="ok"}`); got != "1" {
		t.Errorf(`pinned_deregistrations_total{result="ok"} = %s; want 1`, got)
	}
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(h.pb.deregisterList()); n != 1 {
		t.Fatalf("%d deregister calls after a second Shutdown; want 1", n)
	}
	if !strings.Contains(h.logs.String(), "deregistered") {
		t.Errorf("no log line for the deregistration")
	}
}

// A session that a new registration replaced (the worker lost its lease,
// aborted its instances and registered again) may still hold placements at
// the pinboard until its lease runs out there. Shutdown, once every host
// is empty, deregisters it too, after the last session.
func TestShutdownDeregistersTheSessionsItReplaced(t *testing.T) {
	h := newHarness(t)
	old := h.register()
	h.host.set(0, 3)
	h.pb.onHeartbeat = func(int, wire.HeartbeatRequest) action { return action{nack: wire.NackReregister} }
	h.advanceTo(3 * time.Second)
	h.until("the lease loss", func() bool { return len(h.host.abortList()) == 1 })
	h.pb.onHeartbeat = nil
	h.until("the new session", func() bool { return len(h.pb.registerList()) == 2 && h.w.Session() != "" })
	cur := h.w.Session()
	if cur == old {
		t.Fatalf("session %s after the loss; want a new one", cur)
	}
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown() = %v; want nil", err)
	}
	got := h.pb.deregisterList()
	if len(got) != 2 || got[0].SessionID != cur || got[1].SessionID != old {
		t.Fatalf("deregister calls = %+v; want %s (the last session), then %s (the one it replaced)", got, cur, old)
	}
	if got := h.metric(`pinned_deregistrations_total{result="ok"}`); got != "2" {
		t.Errorf(`pinned_deregistrations_total{result="ok"} = %s; want 2`, got)
	}
	if !strings.Contains(h.logs.String(), "deregistered a session this worker held before") {
		t.Errorf("no log line for the replaced session's deregistration")
	}
}

// While aborted instances are still tearing down, Shutdown does not
// deregister (their ids stay placed until the lease ends); a later
// Shutdown, once they are gone, does.
func TestShutdownSkipsDeregisterWhileTearingDown(t *testing.T) {
	h := newHarness(t)
	sid := h.register()
	h.host.slowAbort = true
	h.host.set(2, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.w.Shutdown(ctx) }()
	h.until("the draining heartbeat", func() bool { return len(h.pb.heartbeatList()) == 1 })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Shutdown() = %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if n := len(h.pb.deregisterList()); n != 0 {
		t.Fatalf("%d deregister calls while teardowns run; want 0", n)
	}
	if got := h.metric(`pinned_deregistrations_total{result="skipped"}`); got != "1" {
		t.Errorf(`pinned_deregistrations_total{result="skipped"} = %s; want 1`, got)
	}
	h.host.teardownsDone()
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := h.pb.deregisterList(); len(got) != 1 || got[0].SessionID != sid {
		t.Fatalf("deregister calls after the teardowns finished = %+v; want one for %s", got, sid)
	}
}

// A failed deregistration is not retried and does not fail Shutdown.
func TestShutdownDeregisterFailure(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.pb.onDeregister = func(int) action { return action{status: 503} }
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown() = %v; want nil", err)
	}
	if n := len(h.pb.deregisterList()); n != 1 {
		t.Fatalf("%d deregister calls; want 1 (no retry)", n)
	}
	if got := h.metric(`pinned_deregistrations_total{result="failed"}`); got != "1" {
		t.Errorf(`pinned_deregistrations_total{result="failed"} = %s; want 1`, got)
	}
}

// evict: the host of the message's namespace is asked to evict the id, at
// once when the ack arrives, with the evict reason; the worker does not
// drain; an evict for another namespace touches no host.
func TestEvictMessage(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.host.has = map[string]bool{"alice": true}
	h.pb.push(wire.Message{Type: wire.MessageEvict, Namespace: "/counter", ID: "alice"})
	h.pb.push(wire.Message{Type: wire.MessageEvict, Namespace: "/other", ID: "bob"})
	if e := h.host.evictions(); len(e) != 0 {
		t.Fatalf("evicted %v before the message arrived", e)
	}
	h.advanceTo(3 * time.Second)
	h.until("the eviction", func() bool { return len(h.host.evictions()) > 0 })
	if e := h.host.evictions(); len(e) != 1 || e[0] != "alice "+reasonEvict {
		t.Fatalf("Evict calls = %v; want exactly [alice %s]", e, reasonEvict)
	}
	if h.w.Draining() {
		t.Fatal("an evict message started a drain")
	}
	h.expectLogged("INFO", "instance evicted by the pinboard", "namespace", "/counter", "instance", "alice", "found", "true")
	h.expectLogged("WARN", "evict for a namespace this worker does not serve ignored", "namespace", "/other")
}

// shutdownReturns runs Shutdown with a deadline of d (real time) and
// returns its error and how long it took; it fails the test when Shutdown
// has not returned within bound, which is below the harness's
// RequestTimeout (20 s): a call waiting out that timeout would exceed it.
func shutdownReturns(t *testing.T, h *harness, d, bound time.Duration) (error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- h.w.Shutdown(ctx) }()
	select {
	case err := <-done:
		return err, time.Since(start)
	case <-time.After(bound):
		t.Fatalf("Shutdown with a %v deadline has not returned after %v", d, bound)
		return nil, 0
	}
}

// A pinboard that takes calls and never answers them (frozen) holds
// neither Shutdown nor Run past Shutdown's deadline: the heartbeat in
// flight fails when the deadline passes, the final heartbeat cannot
// outlast it, and the deregistration is skipped (the session ends with its
// lease), although the hosts emptied.
func TestShutdownDeadlineBoundsCallsToAFrozenPinboard(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.pb.mu.Lock()
	h.pb.onHeartbeat = func(int, wire.HeartbeatRequest) action { return action{drop: true} }
	h.pb.mu.Unlock()
	h.host.set(0, 0)
	err, took := shutdownReturns(t, h, time.Second, 10*time.Second)
	if err != nil {
		t.Errorf("Shutdown() = %v; want nil (the hosts emptied)", err)
	}
	select {
	case <-h.w.runDone:
	default:
		t.Fatal("Shutdown returned before Run")
	}
	if n := len(h.pb.deregisterList()); n != 0 {
		t.Errorf("%d deregister calls after the deadline; want 0", n)
	}
	if got := h.metric(`pinned_deregistrations_total{result="skipped"}`); got != "1" {
		t.Errorf(`pinned_deregistrations_total{result="skipped"} = %s; want 1`, got)
	}
	h.expectLogged("WARN", "not deregistering: the shutdown deadline passed; the session ends with its lease", "logger", "pinned.worker")
	t.Logf("Shutdown returned after %v", took)
}

// A release in flight to a frozen pinboard gives up at Shutdown's deadline,
// so a host closing its instances returns by then too; so does a busy
// instance's abort.
func TestShutdownDeadlineBoundsReleases(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.pb.mu.Lock()
	h.pb.onRelease = func(int) action { return action{drop: true} }
	h.pb.mu.Unlock()
	h.host.set(1, 0)
	released := make(chan error, 1)
	go func() { released <- h.w.Release(context.Background(), "/counter", "a", 0) }()
	h.until("the release in flight", func() bool {
		h.pb.mu.Lock()
		defer h.pb.mu.Unlock()
		return h.pb.held > 0
	})
	err, _ := shutdownReturns(t, h, time.Second, 10*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown() = %v; want an error wrapping context.DeadlineExceeded (a busy instance was aborted)", err)
	}
	select {
	case err := <-released:
		if err == nil {
			t.Error("Release() = nil; want it given up")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Release did not give up at Shutdown's deadline")
	}
}

// A host's CloseIdle can take seconds: with a million idle instances it
// walks them all under its shard locks while thousands of closers compete
// for the same locks (the scale suite's S8 measured 4.8 s). The lease must
// not wait for it. With every CloseIdle stuck, a wind_down (from Shutdown,
// or from the pinboard) still reports draining at once, and the heartbeats
// go on being sent on time and acknowledged, well past the deadline of the
// lease held when the wind_down started: one session, no lease lost.
func TestWindDownDoesNotHoldUpHeartbeats(t *testing.T) {
	for _, c := range []struct {
		name  string
		start func(h *harness, ctx context.Context, done chan<- error)
	}{
		{"shutdown", func(h *harness, ctx context.Context, done chan<- error) {
			go func() { done <- h.w.Shutdown(ctx) }()
		}},
		{"pinboard", func(h *harness, _ context.Context, done chan<- error) {
			h.pb.push(wire.Message{Type: wire.MessageWindDown, DeadlineMs: t0Wall.Add(time.Minute).UnixMilli()})
			h.advanceTo(DefaultHeartbeatInterval) // the ack carrying it
			done <- nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			sid := h.register()
			h.host.set(0, 3)
			entered, stuck := make(chan struct{}, 1), make(chan struct{})
			h.host.onCloseIdle = func() {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-stuck
			}
			// Registered after the harness's own cleanup, so it runs first:
			// the stuck calls return before Run is stopped.
			var once sync.Once
			unstick := func() { once.Do(func() { close(stuck) }) }
			t.Cleanup(unstick)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			c.start(h, ctx, done)
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("no CloseIdle started")
			}
			h.until("a heartbeat reporting draining", func() bool {
				hb := h.pb.heartbeatList()
				return len(hb) > 0 && hb[len(hb)-1].req.Draining
			})
			// The lease of the registration ends at t0+5s (lease 10 s,
			// buffer 5 s); four heartbeat intervals later it must still be
			// renewed by heartbeats sent on time.
			end := 4 * DefaultHeartbeatInterval
			h.advanceTo(end)
			if !h.w.Ready() || h.w.Session() != sid {
				t.Fatalf("Ready() = %v, session %q at t0+%v; want the lease of %q kept", h.w.Ready(), h.w.Session(), end, sid)
			}
			for k, v := range map[string]string{
				`pinned_lease_lost_total{reason="expired"}`:    "0",
				`pinned_lease_lost_total{reason="reregister"}`: "0",
			} {
				if got := h.metric(k); got != v {
					t.Errorf("%s = %s; want %s", k, got, v)
				}
			}
			if n := len(h.pb.registerList()); n != 1 {
				t.Errorf("%d registrations; want 1", n)
			}
			var sent []time.Duration
			for _, hb := range h.pb.heartbeatList() {
				sent = append(sent, hb.at.Sub(at(0)))
			}
			for off := DefaultHeartbeatInterval; off <= end; off += DefaultHeartbeatInterval {
				if !slices.Contains(sent, off) {
					t.Errorf("heartbeats sent at %v; want one at t0+%v", sent, off)
				}
			}
			unstick()
			cancel()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the wind_down's start did not return")
			}
		})
	}
}
