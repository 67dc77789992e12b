package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// dropAll loses every heartbeat.
func dropAll(int, wire.HeartbeatRequest) action { return action{drop: true} }

// expectAbortAt advances to just before t0+off and checks that the worker
// still serves and has aborted nothing, then to t0+off and checks that Admit
// refuses at once and that the instances were aborted exactly then.
func expectAbortAt(t *testing.T, h *harness, off time.Duration) {
	t.Helper()
	h.advanceTo(off - time.Nanosecond)
	if a := h.host.abortList(); len(a) != 0 {
		t.Fatalf("aborted at %v before t0+%v: %+v", a[0].at.Sub(at(0)), off, a)
	}
	if why := h.admit(""); why != "" {
		t.Fatalf("Admit at t0+%v−1ns = %q; want admitted", off, why)
	}
	h.freeze() // the check below must not depend on the loop or its watchdog
	h.clk.Advance(time.Nanosecond)
	if why := h.admit(""); why != wire.ReasonLease {
		t.Fatalf("Admit at t0+%v = %q; want %q", off, why, wire.ReasonLease)
	}
	h.thaw()
	h.until("the self-abort", func() bool { return len(h.host.abortList()) > 0 })
	a := h.host.abortList()[0]
	if got := a.at.Sub(at(0)); got != off || a.reason != wire.ReasonLease {
		t.Fatalf("AbortAll(%q) at t0+%v; want AbortAll(%q) at t0+%v", a.reason, got, wire.ReasonLease, off)
	}
	if a.admitted {
		t.Fatal("Admit still admitted requests while the instances were being aborted")
	}
}

// The lease rule (worker package doc, "The lease"): the worker stops at exactly
// sendTime + lease − buffer when no later heartbeat is acknowledged.
func TestAbortExactlyAtSendTimePlusLeaseMinusBuffer(t *testing.T) {
	f := func(name string, leaseMs int64, buffer, wantAbort time.Duration) {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.LeaseBuffer = buffer })
			h.pb.leaseMs = leaseMs
			h.pb.onHeartbeat = dropAll
			h.pb.onRegister = func(n int) action { return action{drop: n > 1} }
			h.register()
			if got, want := h.w.ExpiresAt(), t0Wall.Add(time.Duration(leaseMs)*time.Millisecond); !got.Equal(want) {
				t.Fatalf("ExpiresAt() = %v; want %v (registration send time + lease)", got, want)
			}
			expectAbortAt(t, h, wantAbort)
			if h.w.Ready() || h.metric("pinned_registered") != "0" {
				t.Fatalf("after the loss: Ready() = %v, pinned_registered %s; want false, 0", h.w.Ready(), h.metric("pinned_registered"))
			}
			if got := h.metric(`pinned_lease_lost_total{reason="expired"}`); got != "1" {
				t.Fatalf(`pinned_lease_lost_total{reason="expired"} = %s; want 1`, got)
			}
		})
	}
	f("defaults", 10_000, 0, 5*time.Second)
	f("buffer 3s", 10_000, 3*time.Second, 7*time.Second)
	f("buffer 4s", 10_000, 4*time.Second, 6*time.Second)
	f("pinboard lease 20s", 20_000, 0, 15*time.Second)
}

func TestHeartbeatsRetryQuicklyUntilTheDeadline(t *testing.T) {
	h := newHarness(t)
	h.pb.onHeartbeat = dropAll
	h.register()
	expectAbortAt(t, h, 5*time.Second)
	var got []time.Duration
	seen := map[string]bool{}
	for _, hb := range h.pb.heartbeatList() {
		got = append(got, hb.at.Sub(at(0)))
		if hb.req.Challenge == "" || seen[hb.req.Challenge] {
			t.Errorf("heartbeat at %v carries challenge %q; want a fresh one each time", hb.at.Sub(at(0)), hb.req.Challenge)
		}
		seen[hb.req.Challenge] = true
	}
	want := []time.Duration{3 * time.Second, 3500 * time.Millisecond, 4 * time.Second, 4500 * time.Millisecond}
	if len(got) != len(want) {
		t.Fatalf("heartbeats sent at %v; want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("heartbeats sent at %v; want %v", got, want)
		}
	}
}

// One lost heartbeat (or one failed one) never costs the lease.
func TestOneLostHeartbeatDoesNotAbort(t *testing.T) {
	f := func(name string, first action) {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.pb.onHeartbeat = func(n int, _ wire.HeartbeatRequest) action {
				if n == 1 {
					return first
				}
				return action{}
			}
			h.register()
			h.advanceTo(20 * time.Second)
			if a := h.host.abortList(); len(a) != 0 {
				t.Fatalf("aborted after one lost heartbeat: %+v", a)
			}
			if !h.w.Ready() {
				t.Fatal("Ready() = false after one lost heartbeat")
			}
			hbs := h.pb.heartbeatList()
			if got := hbs[1].at.Sub(at(0)); got != 3500*time.Millisecond {
				t.Fatalf("retry sent at t0+%v; want t0+3.5s", got)
			}
			last := hbs[len(hbs)-1].at
			if got, want := h.w.ExpiresAt(), last.Wall().Add(10*time.Second); !got.Equal(want) {
				t.Fatalf("ExpiresAt() = %v; want %v (last send + lease)", got, want)
			}
		})
	}
	f("lost", action{drop: true})
	f("503", action{status: 503})
}

// A renew answer that arrives 1.9 s late counts from its send time: the
// abort comes at 3 s + 5 s, not at 4.9 s + 5 s.
func TestLateAckCountsFromItsSendTime(t *testing.T) {
	h := newHarness(t)
	hold := make(chan struct{})
	h.pb.onHeartbeat = func(n int, _ wire.HeartbeatRequest) action {
		if n == 1 {
			return action{hold: hold}
		}
		return action{drop: true}
	}
	h.register()
	h.advanceTo(4900 * time.Millisecond)
	close(hold)
	h.until("the late ack", func() bool { return h.w.ExpiresAt().Equal(t0Wall.Add(13 * time.Second)) })
	if got := h.metric(`pinned_heartbeats_total{result="late"}`); got != "1" {
		t.Errorf(`pinned_heartbeats_total{result="late"} = %s; want 1`, got)
	}
	h.expectLogged("WARN", "lease renewed late", "logger", "pinned.worker", "session", "s1", "ackDelay", "1.9s")
	expectAbortAt(t, h, 8*time.Second)
	h.expectLogged("ERROR", "lease lost; every instance aborted", "session", "s1", "reason", "expired")
}

// Acks that arrive out of order never move the anchor back.
func TestOlderAckDoesNotMoveTheAnchorBack(t *testing.T) {
	h := newHarness(t)
	hold := make(chan struct{})
	h.pb.onHeartbeat = func(n int, _ wire.HeartbeatRequest) action {
		if n == 1 {
			return action{hold: hold}
		}
		return action{}
	}
	h.register()
	h.advanceTo(3600 * time.Millisecond)
	want := t0Wall.Add(13500 * time.Millisecond)
	if got := h.w.ExpiresAt(); !got.Equal(want) {
		t.Fatalf("ExpiresAt() = %v; want %v (the retry at 3.5 s)", got, want)
	}
	close(hold)
	h.until("the old ack", func() bool { return h.pb.heldCount() == 0 && h.inflight == 0 })
	if got := h.w.ExpiresAt(); !got.Equal(want) {
		t.Fatalf("ExpiresAt() after the older ack = %v; want %v", got, want)
	}
}

// A machine suspend moves the wall clock only. Admit refuses at once; the
// loop aborts everything before it registers again.
func TestSuspendMakesAdmitRefuseImmediately(t *testing.T) {
	h := newHarness(t)
	old := h.register()
	leaseCtx, _ := h.w.Admit(h.w.secret, nil)
	h.advanceTo(time.Second)
	h.clk.Suspend(20 * time.Second)
	if why := h.admit(""); why != wire.ReasonLease {
		t.Fatalf("Admit after a 20 s suspend = %q; want %q", why, wire.ReasonLease)
	}
	if h.w.Ready() || h.w.Remaining() != 0 {
		t.Fatalf("after a 20 s suspend: Ready() = %v, Remaining() = %v; want false, 0", h.w.Ready(), h.w.Remaining())
	}
	h.until("a new session", func() bool { return h.w.Ready() && h.w.Session() != old })
	checkFencedSwitch(t, h, old, leaseCtx, ErrLeaseExpired)
}

// A backward wall step must not expire the lease early.
func TestBackwardWallStepDoesNotExpireEarly(t *testing.T) {
	h := newHarness(t)
	h.pb.onHeartbeat = dropAll
	h.register()
	h.advanceTo(time.Second)
	h.clk.StepWall(-20 * time.Second)
	if why := h.admit(""); why != "" {
		t.Fatalf("Admit after a backward wall step = %q; want admitted", why)
	}
	expectAbortAt(t, h, 5*time.Second)
}

// A frozen worker (its loop stalled while the clock runs past the lease)
// serves nothing on wake and aborts every instance before it serves again.
func TestFrozenWorkerServesNothingOnWake(t *testing.T) {
	h := newHarness(t)
	old := h.register()
	h.host.set(2, 1)
	leaseCtx, _ := h.w.Admit(h.w.secret, nil)
	h.freeze()
	h.clk.Advance(20 * time.Second) // the watchdog timer fires, but nobody is running
	if why := h.admit(""); why != wire.ReasonLease {
		t.Fatalf("Admit on a frozen worker past its lease = %q; want %q", why, wire.ReasonLease)
	}
	if why := h.admit(old); why != wire.ReasonLease {
		t.Fatalf("Admit(session %q) on a frozen worker past its lease = %q; want %q", old, why, wire.ReasonLease)
	}
	if a := h.host.abortList(); len(a) != 0 {
		t.Fatalf("aborted while frozen: %+v", a)
	}
	h.thaw()
	h.until("a new session", func() bool { return h.w.Ready() && h.w.Session() != old })
	checkFencedSwitch(t, h, old, leaseCtx, ErrLeaseExpired)
	if got := h.host.Len(); got != 0 {
		t.Fatalf("host still holds %d instances of the old session", got)
	}
}

// checkFencedSwitch checks a switch from session old to a new one: the
// instances were aborted once, while Admit refused, before the new
// registration was sent; the old lease context is cancelled with cause; the
// old session is refused and the new one admitted.
func checkFencedSwitch(t *testing.T, h *harness, old string, oldCtx context.Context, cause error) {
	t.Helper()
	aborts := h.host.abortList()
	if len(aborts) != 1 || aborts[0].reason != wire.ReasonLease || aborts[0].admitted {
		t.Fatalf("aborts = %+v; want one AbortAll(%q) while Admit refused", aborts, wire.ReasonLease)
	}
	regs := h.pb.registerList()
	if len(regs) != 2 {
		t.Fatalf("%d registrations; want 2", len(regs))
	}
	if regs[1].abortsBefore != 1 || regs[1].admitted {
		t.Fatalf("second registration arrived with %d aborts done and admitted=%v; want 1 and false", regs[1].abortsBefore, regs[1].admitted)
	}
	if oldCtx == nil || oldCtx.Err() == nil {
		t.Fatal("the old lease context is not cancelled")
	}
	if got := context.Cause(oldCtx); !errors.Is(got, cause) {
		t.Fatalf("context.Cause(old lease) = %v; want %v", got, cause)
	}
	if why := h.admit(old); why != wire.ReasonLease {
		t.Fatalf("Admit(old session %q) = %q; want %q", old, why, wire.ReasonLease)
	}
	if why := h.admit(h.w.Session()); why != "" {
		t.Fatalf("Admit(new session %q) = %q; want admitted", h.w.Session(), why)
	}
	newCtx, _ := h.w.Admit(h.w.secret, nil)
	if newCtx == oldCtx || newCtx.Err() != nil {
		t.Fatal("the new session must have a fresh, live lease context")
	}
}

// OnLease reports every registration, renewal and loss, in order, with the
// lease context Admit hands out; stop unregisters.
func TestOnLease(t *testing.T) {
	h := newHarness(t)
	var events []LeaseEvent
	var mu sync.Mutex
	got := func() []LeaseEvent {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
	h.w.OnLease(func(e LeaseEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e)
	})
	stopped := 0
	stop := h.w.OnLease(func(LeaseEvent) { stopped++ })
	stop()
	// Heartbeat 1 is lost and its retry acked (no loss); the first heartbeat
	// after that is refused with a reregister NACK.
	h.pb.onHeartbeat = func(n int, req wire.HeartbeatRequest) action {
		switch {
		case n == 1:
			return action{drop: true}
		case n >= 3 && req.SessionID == "s1":
			return action{nack: wire.NackReregister}
		}
		return action{}
	}
	h.register()
	first, _ := h.w.Admit(h.w.secret, nil)
	h.advanceTo(6 * time.Second)
	if n := len(got()); n != 2 {
		t.Fatalf("%d events by t0+6s; want 2 (registered, renewed)", n)
	}
	h.advanceTo(7 * time.Second)
	h.until("the new session", func() bool { return len(got()) == 4 })
	ev := got()
	kinds := []LeaseEventKind{ev[0].Kind, ev[1].Kind, ev[2].Kind, ev[3].Kind}
	if !slices.Equal(kinds, []LeaseEventKind{LeaseRegistered, LeaseRenewed, LeaseLost, LeaseRegistered}) {
		t.Fatalf("events %v; want registered, renewed, lost, registered", kinds)
	}
	if ev[0].Session != "s1" || ev[0].Lease != first || ev[0].ExpiresIn != DefaultLease || ev[0].SentAgo < ev[0].HandledAgo {
		t.Fatalf("registered event %+v; want session s1 with Admit's lease context, the default lease, sent before handled", ev[0])
	}
	if ev[1].Session != "s1" || ev[1].Lease != first || ev[1].ExpiresIn != DefaultLease || ev[1].SentAgo < ev[1].HandledAgo {
		t.Fatalf("renewed event %+v; want s1's lease context renewed by the default lease, sent before handled", ev[1])
	}
	if ev[2].Lease != first || !errors.Is(ev[2].Cause, ErrReregister) || first.Err() == nil || !errors.Is(context.Cause(first), ErrReregister) {
		t.Fatalf("lost event %+v, lease Err %v; want s1's lease ended with ErrReregister", ev[2], first.Err())
	}
	now, _ := h.w.Admit(h.w.secret, nil)
	if ev[3].Session != h.w.Session() || ev[3].Lease != now || now == first {
		t.Fatalf("second registered event %+v; want the new session %q and its own lease context", ev[3], h.w.Session())
	}
	if stopped != 0 {
		t.Fatalf("a stopped observer was called %d times", stopped)
	}
}

// Heartbeats of a lost session that hang (here: 8, the cap) must not keep
// the next session from heartbeating.
func TestHungCallsOfALostSessionDoNotBlockTheNext(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.RetryInterval = 250 * time.Millisecond })
	h.step = 50 * time.Millisecond
	h.pb.onHeartbeat = func(_ int, req wire.HeartbeatRequest) action {
		return action{drop: req.SessionID == "s1"}
	}
	h.register()
	h.advanceTo(5 * time.Second)
	h.until("session s2", func() bool { return h.w.Session() == "s2" })
	if n := len(h.pb.heartbeatList()); n != maxInflightHeartbeats {
		t.Fatalf("%d heartbeats of s1 in flight; want the cap %d", n, maxInflightHeartbeats)
	}
	h.advanceTo(20 * time.Second)
	if !h.w.Ready() || h.w.Session() != "s2" {
		t.Fatalf("Ready() = %v, Session() = %q; want s2 kept alive", h.w.Ready(), h.w.Session())
	}
}
