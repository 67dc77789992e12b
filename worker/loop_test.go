package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
)

func TestRegistrationBody(t *testing.T) {
	h := newHarness(t)
	h.host.set(3, 2)
	h.register()
	regs := h.pb.registerList()
	r := regs[0].req
	if r.ClientID != h.w.ClientID() || r.Secret != string(h.w.secret) || r.AdvertiseURL != h.w.AdvertiseURL() ||
		len(r.Namespaces) != 1 || r.Namespaces[0] != "/counter" || r.Headroom != 95 || r.Draining ||
		r.MaxBodyBytes != host.DefaultMaxRequestBodySize {
		t.Fatalf("registration body = %+v", r)
	}
	if len(r.Challenge) < 26 || len(r.ChallengeValue) < 26 || r.Challenge == r.ChallengeValue {
		t.Fatalf("challenge pair %q/%q: want two distinct ≥128-bit values", r.Challenge, r.ChallengeValue)
	}
	if h.pb.fetchErrors != nil {
		t.Fatalf("the pinboard's challenge fetches failed: %v", h.pb.fetchErrors)
	}
	if got := h.metric(`pinned_registrations_total{result="ok"}`); got != "1" {
		t.Errorf(`pinned_registrations_total{result="ok"} = %s; want 1`, got)
	}
	if got := h.metric("pinned_registered"); got != "1" {
		t.Errorf("pinned_registered = %s; want 1", got)
	}
	if got := h.metric("pinned_lease_remaining_seconds"); got != "5" {
		t.Errorf("pinned_lease_remaining_seconds = %s; want 5", got)
	}
	h.advanceTo(3100 * time.Millisecond)
	hb := h.pb.heartbeatList()
	if len(hb) != 1 || hb[0].req.SessionID != "s1" || hb[0].req.Headroom != 95 || hb[0].req.Challenge == "" {
		t.Fatalf("heartbeats = %+v; want one for s1 with headroom 95 and a challenge pair", hb)
	}
	h.expectLogged("INFO", "registered", "logger", "pinned.worker", "client", h.w.ClientID(), "session", "s1")
}

// The registration carries the smallest body limit of the worker's hosts:
// a body one of them refuses may reach the worker through any namespace.
func TestRegistrationBodyLimit(t *testing.T) {
	h := newHarness(t)
	if _, err := h.w.Attach(&fakeHost{ns: "/small", cap: 10, maxBody: 1000, w: h.w, clk: h.clk}); err != nil {
		t.Fatal(err)
	}
	h.register()
	if r := h.pb.registerList()[0].req; r.MaxBodyBytes != 1000 || len(r.Namespaces) != 2 {
		t.Fatalf("registration body = %+v; want maxBodyBytes 1000 (the smaller host's) for both namespaces", r)
	}
}

// reregister NACK: abort local instances, register fresh with a new session.
func TestReregisterNackAbortsAndRegistersFresh(t *testing.T) {
	f := func(name string, a action) {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			h.pb.onHeartbeat = func(n int, _ wire.HeartbeatRequest) action {
				if n == 1 {
					return a
				}
				return action{}
			}
			old := h.register()
			h.host.set(1, 1)
			oldCtx, _ := h.w.Admit(h.w.secret, nil)
			h.advanceTo(3 * time.Second)
			h.until("a new session", func() bool { return h.w.Ready() && h.w.Session() != old })
			checkFencedSwitch(t, h, old, oldCtx, ErrReregister)
			if got := h.metric(`pinned_heartbeats_total{result="reregister"}`); got != "1" {
				t.Errorf(`pinned_heartbeats_total{result="reregister"} = %s; want 1`, got)
			}
			h.expectLogged("ERROR", "lease lost; every instance aborted", "logger", "pinned.worker", "session", old, "reason", "reregister", "instances", "2")
			h.expectLogged("INFO", "lease regained", "logger", "pinned.worker", "session", h.w.Session())
		})
	}
	f("409 reregister", action{nack: wire.NackReregister})
	f("ack asking to reregister", action{reregister: true})
}

func TestSupersededStopsForGood(t *testing.T) {
	h := newHarness(t)
	h.pb.onHeartbeat = func(int, wire.HeartbeatRequest) action { return action{nack: wire.NackSuperseded} }
	old := h.register()
	h.host.set(1, 0)
	oldCtx, _ := h.w.Admit(h.w.secret, nil)
	h.clk.Advance(3 * time.Second)
	select {
	case <-h.runDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after a superseded NACK")
	}
	if !errors.Is(h.runErr, ErrSuperseded) {
		t.Fatalf("Run() = %v; want ErrSuperseded", h.runErr)
	}
	if h.w.Ready() || h.w.Session() != "" || h.metric("pinned_registered") != "0" {
		t.Fatalf("after superseded: Ready() = %v, Session() = %q; want false, \"\"", h.w.Ready(), h.w.Session())
	}
	if why := h.admit(old); why != wire.ReasonLease {
		t.Fatalf("Admit(%q) after superseded = %q; want %q", old, why, wire.ReasonLease)
	}
	if a := h.host.abortList(); len(a) != 1 || a[0].reason != wire.ReasonLease {
		t.Fatalf("aborts = %+v; want one AbortAll(lease)", a)
	}
	if !errors.Is(context.Cause(oldCtx), ErrSuperseded) {
		t.Fatalf("context.Cause(old lease) = %v; want ErrSuperseded", context.Cause(oldCtx))
	}
	h.clk.Advance(time.Minute)
	if n := len(h.pb.registerList()); n != 1 {
		t.Fatalf("%d registrations after superseded; want 1 (no retry)", n)
	}
	if !strings.Contains(h.logs.String(), "level=ERROR msg=\"superseded") {
		t.Errorf("no error log for superseded:\n%s", h.logs.String())
	}
	if !h.logged("ERROR", "lease lost; every instance aborted", "session", old, "reason", "superseded") {
		t.Errorf("no lease-lost record with reason superseded and the session")
	}
}

// With the jitter at its maximum the delays are the ceilings: 0.5 s, 1 s,
// ..., 16 s, then 30 s for good.
func TestRegistrationBackoffIsCappedAt30s(t *testing.T) {
	h := newHarness(t)
	h.pb.onRegister = func(int) action { return action{status: 503} }
	h.start()
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second,
		8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	for i, d := range want {
		n := i + 1
		h.until("a failed registration", func() bool { return len(h.pb.registerList()) == n && h.inflight == 0 })
		h.clk.Advance(d - time.Nanosecond)
		h.settle()
		if got := len(h.pb.registerList()); got != n {
			t.Fatalf("registration %d came before its backoff %v", got, d)
		}
		h.clk.Advance(time.Nanosecond)
		h.until("the retry", func() bool { return len(h.pb.registerList()) == n+1 })
	}
	h.until("the last failure", func() bool { return h.inflight == 0 })
	h.expectLogged("WARN", "registration failed", "logger", "pinned.worker", "reason", "HTTP 503: scripted failure", "attempt", "10", "retryIn", "30s")
	if got := h.metric(`pinned_registrations_total{result="failed"}`); got != "10" {
		t.Errorf(`pinned_registrations_total{result="failed"} = %s; want 10`, got)
	}
	if h.w.Ready() {
		t.Fatal("Ready() = true without a registration")
	}
}

func TestBackoffDelay(t *testing.T) {
	base, capd := 500*time.Millisecond, 30*time.Second
	f := func(n int, want time.Duration) {
		t.Helper()
		if got := backoffCeiling(n, base, capd); got != want {
			t.Errorf("backoffCeiling(%d) = %v; want %v", n, got, want)
		}
	}
	f(1, 500*time.Millisecond)
	f(2, time.Second)
	f(6, 16*time.Second)
	f(7, 30*time.Second)
	f(1000, 30*time.Second) // no overflow

	if got := backoffDelay(5, base, capd, func(int64) int64 { return 0 }); got != 0 {
		t.Errorf("backoffDelay with jitter 0 = %v; want 0", got)
	}
	// Full jitter: spread over [0, ceiling], never above it.
	r := rand.New(rand.NewPCG(1, 2))
	var lo, hi int
	for range 1000 {
		d := backoffDelay(40, base, capd, r.Int64N)
		if d < 0 || d > capd {
			t.Fatalf("backoffDelay(40) = %v; want within [0, %v]", d, capd)
		}
		if d < capd/4 {
			lo++
		}
		if d > capd*3/4 {
			hi++
		}
	}
	if lo < 100 || hi < 100 {
		t.Errorf("backoff delays not spread: %d below 7.5 s, %d above 22.5 s of 1000", lo, hi)
	}
}

func TestUnauthorizedIsLoggedAndRetried(t *testing.T) {
	h := newHarness(t)
	h.pb.onRegister = func(n int) action {
		if n <= 2 {
			return action{status: 401}
		}
		return action{}
	}
	h.start()
	h.until("a refusal", func() bool { return len(h.pb.registerList()) == 1 && h.inflight == 0 })
	h.advance(2 * time.Second) // backoff 0.5 s, then 1 s
	h.until("registration", h.w.Ready)
	if got := h.metric(`pinned_registrations_total{result="unauthorized"}`); got != "2" {
		t.Errorf(`pinned_registrations_total{result="unauthorized"} = %s; want 2`, got)
	}
	h.expectLogged("INFO", "registered", "session", h.w.Session())
	if !strings.Contains(h.logs.String(), "level=ERROR msg=\"registration failed: the pinboard refused the deployment token (401)") ||
		!h.logged("ERROR", "registration failed: the pinboard refused the deployment token (401); set Config.Token to the pinboard's token", "reason", "unauthorized") {
		t.Errorf("no clear error log for 401:\n%s", h.logs.String())
	}
}

// A binary names the variable its operator sets (Config.TokenSource) where a
// library user reads the field's name.
func TestUnauthorizedNamesTheTokenSource(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.TokenSource = "PINNED_TOKEN" })
	h.pb.onRegister = func(int) action { return action{status: 401} }
	h.start()
	h.until("a refusal", func() bool { return len(h.pb.registerList()) == 1 && h.inflight == 0 })
	if !h.logged("ERROR", "registration failed: the pinboard refused the deployment token (401); set PINNED_TOKEN to the pinboard's token", "reason", "unauthorized") ||
		strings.Contains(h.logs.String(), "Config.Token") {
		t.Errorf("the 401 error does not name PINNED_TOKEN alone:\n%s", h.logs.String())
	}
}

func TestPinboardLeaseTooShortForTheBuffer(t *testing.T) {
	t.Run("at registration", func(t *testing.T) {
		h := newHarness(t)
		h.pb.leaseMs = 4000 // below the 5 s buffer
		h.start()
		<-h.runDone
		if !errors.Is(h.runErr, ErrBadTiming) || !strings.Contains(h.runErr.Error(), "lower LeaseBuffer") {
			t.Fatalf("Run() = %v; want an ErrBadTiming error saying what to change", h.runErr)
		}
		if h.w.Ready() {
			t.Fatal("Ready() = true under an unworkable lease")
		}
	})
	t.Run("changed in an ack", func(t *testing.T) {
		h := newHarness(t)
		h.pb.onHeartbeat = func(int, wire.HeartbeatRequest) action { return action{leaseMs: 6000} }
		h.register()
		h.host.set(1, 0)
		h.clk.Advance(3 * time.Second)
		<-h.runDone
		if !errors.Is(h.runErr, ErrBadTiming) {
			t.Fatalf("Run() = %v; want ErrBadTiming", h.runErr)
		}
		if a := h.host.abortList(); len(a) != 1 || h.w.Ready() {
			t.Fatalf("aborts = %+v, Ready() = %v; want one abort and not ready", a, h.w.Ready())
		}
	})
}

func TestRunLifecycle(t *testing.T) {
	h := newHarness(t)
	h.register()
	h.host.set(1, 0)
	if _, err := h.w.Attach(&fakeHost{ns: "/late", w: h.w, clk: h.clk}); !errors.Is(err, ErrStarted) {
		t.Errorf("Attach after Run = %v; want ErrStarted", err)
	}
	if err := h.w.Run(context.Background()); !errors.Is(err, ErrStarted) {
		t.Errorf("second Run = %v; want ErrStarted", err)
	}
	h.cancel()
	<-h.runDone
	if h.runErr != nil {
		t.Fatalf("Run() after cancel = %v; want nil", h.runErr)
	}
	if a := h.host.abortList(); len(a) != 1 || a[0].reason != reasonShutdown {
		t.Fatalf("aborts = %+v; want AbortAll(%q) when Run stops", a, reasonShutdown)
	}
	if h.w.Ready() {
		t.Fatal("Ready() = true after Run returned")
	}
}

func TestRunWithoutHosts(t *testing.T) {
	w, err := New(Config{PinboardURL: "http://127.0.0.1:1", AdvertiseURL: "http://127.0.0.1:2", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); !errors.Is(err, ErrNoHosts) {
		t.Fatalf("Run() without hosts = %v; want ErrNoHosts", err)
	}
}

func TestAttachValidates(t *testing.T) {
	w, err := New(Config{PinboardURL: "http://127.0.0.1:1", AdvertiseURL: "http://127.0.0.1:2", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	detach, err := w.Attach(&fakeHost{ns: "/a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Attach(&fakeHost{ns: "/a"}); err == nil {
		t.Error("Attach of a second host for /a succeeded; want an error")
	}
	if _, err := w.Attach(&fakeHost{ns: "no-slash"}); err == nil {
		t.Error("Attach of namespace \"no-slash\" succeeded; want an error")
	}
	detach()
	detach() // idempotent
	if _, err := w.Attach(&fakeHost{ns: "/a"}); err != nil {
		t.Errorf("Attach of /a after its host detached = %v; want nil", err)
	}
}

// A detached host is let go: the worker no longer offers its headroom,
// aborts it on lease loss, or waits for it in Shutdown.
func TestDetachedHostIsLetGo(t *testing.T) {
	h := newHarness(t)
	other := &fakeHost{ns: "/other", cap: 7, w: h.w, clk: h.clk}
	detach, err := h.w.Attach(other)
	if err != nil {
		t.Fatal(err)
	}
	h.register()
	if got := h.pb.registerList()[0].req.Headroom; got != 107 {
		t.Fatalf("registered headroom %d; want 107 (both hosts)", got)
	}
	other.set(1, 0)
	detach()
	h.pb.onHeartbeat = func(int, wire.HeartbeatRequest) action { return action{nack: wire.NackReregister} }
	h.advanceTo(3 * time.Second)
	h.until("the lease loss", func() bool { return len(h.host.abortList()) == 1 })
	if a := other.abortList(); len(a) != 0 {
		t.Fatalf("the detached host was aborted: %+v", a)
	}
	h.pb.onHeartbeat = nil
	h.until("the new session", func() bool { return len(h.pb.registerList()) == 2 })
	reg := h.pb.registerList()[1].req
	if reg.Headroom != 100 || len(reg.Namespaces) != 2 {
		t.Fatalf("re-registration offers headroom %d for %v; want 100 (the attached host only) for the namespaces Run started with", reg.Headroom, reg.Namespaces)
	}
}

// The loop on the real clock: registration and a few heartbeats, fast.
func TestRealClockSmoke(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.Clock = clock.Real{}
		c.HeartbeatInterval = 20 * time.Millisecond
		c.RetryInterval = 10 * time.Millisecond
	})
	h.register()
	h.until("three acked heartbeats", func() bool {
		return len(h.pb.heartbeatList()) >= 3 && h.inflight == 0
	})
	if !h.w.Ready() || h.w.Remaining() <= 0 || h.w.Remaining() > DefaultLease-DefaultLeaseBuffer {
		t.Fatalf("Ready() = %v, Remaining() = %v; want a live lease of at most 5s", h.w.Ready(), h.w.Remaining())
	}
	if got := h.metric(`pinned_heartbeats_total{result="failed"}`); got != "0" {
		t.Fatalf(`pinned_heartbeats_total{result="failed"} = %s; want 0`, got)
	}
}
