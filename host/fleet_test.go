package host

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// fakeWorker is a Worker for tests: a fixed secret, a current lease that the
// test replaces, a draining flag, and Release calls it records (optionally
// blocking until the test lets them finish).
type fakeWorker struct {
	secret   string
	attached Attached
	detached chan int // receives the attached host's Len when detach is called
	draining atomic.Bool

	mu      sync.Mutex
	lease   *fakeLease
	session string

	releaseGate chan struct{} // when set, Release waits for it (or ctx)
	gated       atomic.Int64  // Release calls waiting at releaseGate
	releaseMu   sync.Mutex
	released    map[string]int
	releasedIn  map[string]string // name → session value the Release ctx carried
	releases    chan string
	releasedAt  map[string]uint64 // name → epoch the last Release named
	leaseLength atomic.Int64      // LeaseLength's answer (ns)
}

// leaseKey is the context key under which a fake lease carries its session
// (as worker.SessionOf does for real leases).
type leaseKey struct{}

// fakeLease is a lease context as Worker.Admit's contract asks: its Err is
// the inline check and ends the context itself once the deadline passed
// (here: a switch the test flips, as the clock passing the deadline would),
// whether or not the worker has cancelled it.
type fakeLease struct {
	context.Context
	cancel  context.CancelFunc
	expired atomic.Bool
}

func (l *fakeLease) Err() error {
	if l.expired.Load() {
		l.cancel()
	}
	return l.Context.Err()
}

func newFakeWorker() *fakeWorker {
	w := &fakeWorker{secret: "s3cret", detached: make(chan int, 1), released: map[string]int{}, releasedIn: map[string]string{},
		releasedAt: map[string]uint64{}, releases: make(chan string, 1024)}
	w.newLease("session-1")
	return w
}

// newLease ends the current lease (as lease loss does) and starts another.
func (w *fakeWorker) newLease(session string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lease != nil {
		w.lease.cancel()
	}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), leaseKey{}, session))
	w.lease = &fakeLease{Context: ctx, cancel: cancel}
	w.session = session
}

// loseLease ends the lease without a new one.
func (w *fakeWorker) loseLease() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lease.cancel()
	w.lease = nil
}

func (w *fakeWorker) Attach(h Attached) (func(), error) {
	if w.attached != nil {
		return nil, errors.New("attached twice")
	}
	w.attached = h
	return func() { w.detached <- h.Len() }, nil
}

func (w *fakeWorker) Admit(secret, session []byte) (context.Context, string) {
	if string(secret) != w.secret {
		return nil, wire.ReasonForbidden
	}
	w.mu.Lock()
	lease, current := w.lease, w.session
	w.mu.Unlock()
	if lease == nil || lease.Err() != nil || (session != nil && string(session) != current) {
		return nil, wire.ReasonLease
	}
	return lease, ""
}

func (w *fakeWorker) Draining() bool { return w.draining.Load() }

func (w *fakeWorker) LeaseLength() time.Duration { return time.Duration(w.leaseLength.Load()) }

func (w *fakeWorker) Release(ctx context.Context, ns, id string, epoch uint64) error {
	if w.releaseGate != nil {
		w.gated.Add(1)
		defer w.gated.Add(-1)
		select {
		case <-w.releaseGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.releaseMu.Lock()
	w.released[ns+"/"+id]++
	w.releasedIn[ns+"/"+id], _ = ctx.Value(leaseKey{}).(string)
	w.releasedAt[ns+"/"+id] = epoch
	w.releaseMu.Unlock()
	w.releases <- ns + "/" + id
	return nil
}

func (w *fakeWorker) releasedCount(name string) int {
	w.releaseMu.Lock()
	defer w.releaseMu.Unlock()
	return w.released[name]
}

func (w *fakeWorker) waitReleased(t *testing.T, name string) {
	t.Helper()
	timer := time.NewTimer(testTimeout)
	defer timer.Stop()
	for w.releasedCount(name) == 0 {
		select {
		case <-w.releases: // something was released: check again
		case <-timer.C:
			t.Fatalf("no Release of %s within %v", name, testTimeout)
		}
	}
}

func newFleetHost(t *testing.T, cfg Config) (*testServer, *fakeWorker, *env) {
	t.Helper()
	w := newFakeWorker()
	cfg.Worker = w
	e := newEnv()
	ts := newTestHost(t, cfg, e)
	if w.attached != ts.h {
		t.Fatalf("New did not Attach the host to its worker")
	}
	return ts, w, e
}

// auth are the headers the proxy sends.
func auth(session string) []string {
	h := []string{wire.HeaderProxySecret, "s3cret"}
	if session != "" {
		h = append(h, wire.HeaderSession, session)
	}
	return h
}

func TestFleetAdmit(t *testing.T) {
	ts, w, _ := newFleetHost(t, Config{})
	r := ts.expect(403, "GET", "/p/a/")
	if got := r.header.Get("X-Pinned-Reason"); got != "forbidden" {
		t.Errorf("missing secret: X-Pinned-Reason = %q; want forbidden", got)
	}
	ts.expect(403, "GET", "/p/a/", wire.HeaderProxySecret, "wrong")
	ts.expect503("lease", "GET", "/p/a/", auth("session-0")...) // stale session
	ts.expect(200, "GET", "/p/a/", auth("session-1")...)
	ts.expect(200, "GET", "/p/a/", auth("")...) // no session header: the current one
	// The secret is checked before anything else, even an invalid id.
	ts.expect(403, "GET", "/p/%2F/")
	w.loseLease()
	ts.expect503("lease", "GET", "/p/a/", auth("")...)
	if ts.h.Len() != 1 {
		t.Errorf("Len() = %d; want 1", ts.h.Len())
	}
}

func TestFleetDrainingRefusesOnlyNewActivations(t *testing.T) {
	ts, w, _ := newFleetHost(t, Config{})
	ts.expect(200, "POST", "/p/old/incr", auth("")...)
	w.draining.Store(true)
	ts.expect(200, "POST", "/p/old/incr", auth("")...)
	ts.expect503("draining", "GET", "/p/new/", auth("")...)
	if ts.h.instance("new") != nil {
		t.Error("a draining host activated a new instance")
	}
}

// TestFleetStaleLeaseInstanceNotServed: an instance activated under a lease
// that has since been replaced must not serve, even before the worker gets
// round to AbortAll.
func TestFleetStaleLeaseInstanceNotServed(t *testing.T) {
	ts, w, e := newFleetHost(t, Config{})
	first := ts.expect(200, "GET", "/p/a/", auth("")...).json(t)["nonce"]
	inst := ts.h.instance("a")
	w.newLease("session-2")
	if inst.Context().Err() == nil {
		t.Error("instance context not cancelled when its lease ended")
	}
	ts.expect503("closing", "GET", "/p/a/", auth("session-2")...)
	e.waitTorn(t, "a")
	w.waitReleased(t, "/p/a")
	w.releaseMu.Lock()
	in := w.releasedIn["/p/a"]
	w.releaseMu.Unlock()
	if in != "session-1" {
		t.Errorf("Release ctx carries session %q; want session-1, the lease the instance was activated under", in)
	}
	waitFor(t, "the instance to leave", func() bool { return ts.h.instance("a") == nil })
	second := ts.expect(200, "GET", "/p/a/", auth("session-2")...).json(t)["nonce"]
	if second == first {
		t.Error("the stale instance served under the new lease")
	}
	if got := ts.h.met.evictions[evictIndex(EvictLease)].Get(); got != 1 {
		t.Errorf("pinned_evictions_total{reason=lease} = %d; want 1", got)
	}
}

// TestFleetClosingWhileReleaseInFlight: between teardown and the end of
// Release, requests for the id answer 503 closing and never re-activate it
// locally; Release runs once per closed instance.
func TestFleetClosingWhileReleaseInFlight(t *testing.T) {
	w := newFakeWorker()
	w.releaseGate = make(chan struct{})
	e := newEnv()
	ts := newTestHost(t, Config{Worker: w}, e)
	ts.expect(200, "GET", "/p/a/", auth("")...)
	ts.expect(200, "GET", "/p/b/", auth("")...)
	ts.h.CloseIdle(EvictWindDown)
	e.waitTorn(t, "a")
	e.waitTorn(t, "b")
	for range 5 {
		ts.expect503("closing", "GET", "/p/a/", auth("")...)
	}
	if got := e.setups.Load(); got != 2 {
		t.Fatalf("setups = %d; want 2 (no local re-activation while releasing)", got)
	}
	if ts.h.Len() != 2 {
		t.Errorf("Len() while releasing = %d; want 2 (closing instances count)", ts.h.Len())
	}
	close(w.releaseGate)
	w.waitReleased(t, "/p/a")
	w.waitReleased(t, "/p/b")
	waitFor(t, "closed instances to leave", func() bool { return ts.h.Len() == 0 })
	ts.expect(200, "GET", "/p/a/", auth("")...)
	for _, name := range []string{"/p/a", "/p/b"} {
		if got := w.releasedCount(name); got != 1 {
			t.Errorf("Release(%s) called %d times; want 1", name, got)
		}
	}
	if got := ts.h.met.evictions[evictIndex(EvictWindDown)].Get(); got != 2 {
		t.Errorf("pinned_evictions_total{reason=wind_down} = %d; want 2", got)
	}
}

func TestFleetAbortAllCloseIdleHeadroom(t *testing.T) {
	ts, w, e := newFleetHost(t, Config{MaxInstances: 5})
	h := ts.h
	if h.Namespace() != "/p" {
		t.Errorf("Namespace() = %q; want /p", h.Namespace())
	}
	for _, id := range []string{"a", "b", "c"} {
		ts.expect(200, "GET", "/p/"+id+"/", auth("")...)
	}
	if h.Len() != 3 || h.Headroom() != 2 {
		t.Errorf("Len, Headroom = %d, %d; want 3, 2", h.Len(), h.Headroom())
	}

	// CloseIdle leaves busy instances alone.
	blocked := make(chan response, 1)
	go func() { r, _ := ts.doErr("GET", "/p/a/block", auth("")...); blocked <- r }()
	e.waitEntered(t, "a")
	h.CloseIdle(EvictDrain)
	e.waitTorn(t, "b")
	e.waitTorn(t, "c")
	if inst := h.instance("a"); inst == nil || inst.state != stateActive {
		t.Fatal("CloseIdle closed an instance with a request in flight")
	}
	waitFor(t, "b and c to be released", func() bool { return h.Len() == 1 })
	if h.Headroom() != 4 {
		t.Errorf("Headroom = %d; want 4", h.Headroom())
	}

	// AbortAll ends the busy one too, without waiting.
	ts.expect(200, "GET", "/p/d/", auth("")...)
	h.AbortAll(EvictLease)
	if r := <-blocked; r.status != 503 {
		t.Errorf("request in flight during AbortAll = %d; want 503", r.status)
	}
	e.waitTorn(t, "a")
	e.waitTorn(t, "d")
	waitFor(t, "everything to be released", func() bool { return h.Len() == 0 })
	for _, id := range []string{"a", "b", "c", "d"} {
		if got := w.releasedCount("/p/" + id); got != 1 {
			t.Errorf("Release(/p/%s) called %d times; want 1", id, got)
		}
		if got := e.tornCount(id); got != 1 {
			t.Errorf("teardowns of %s = %d; want 1", id, got)
		}
	}
	if got := h.met.aborts.Get(); got != 2 {
		t.Errorf("pinned_aborts_total = %d; want 2", got)
	}
}

func TestFleetAttachError(t *testing.T) {
	w := newFakeWorker()
	w.attached = &Host{} // a second Attach fails
	_, err := New(Config{Namespace: "/p", Worker: w}, newEnv().typ())
	if err == nil {
		t.Fatal("New succeeded although Attach failed")
	}
}

// TestFleetActivationDuringAbortAll: an instance whose setup is running
// when AbortAll comes is closed as soon as the setup returns: it never
// serves, its teardown runs once and it is released.
func TestFleetActivationDuringAbortAll(t *testing.T) {
	w := newFakeWorker()
	e := newEnv()
	e.setupWait = make(chan struct{})
	ts := newTestHost(t, Config{Worker: w}, e)
	got := make(chan response, 1)
	go func() {
		r, _ := ts.doErr("GET", "/p/x/", auth("")...)
		got <- r
	}()
	waitFor(t, "the activation to start", func() bool { return e.setups.Load() == 1 })
	ts.h.AbortAll(EvictLease)
	close(e.setupWait)
	if r := <-got; r.status != 503 || r.header.Get("X-Pinned-Reason") != "closing" {
		t.Errorf("activating request during AbortAll = %d (reason %q); want 503 closing", r.status, r.header.Get("X-Pinned-Reason"))
	}
	e.waitTorn(t, "x")
	w.waitReleased(t, "/p/x")
	if n := e.tornCount("x"); n != 1 {
		t.Errorf("teardowns = %d; want 1", n)
	}
}

// Instance.Do checks the lease inline: once the lease's deadline passed, fn
// does not run, even though the worker has not cancelled the lease (its
// watchdog is late, or the process just woke from a pause); the lease
// context's Err is what notices it.
func TestFleetDoChecksTheLeaseInline(t *testing.T) {
	ts, w, _ := newFleetHost(t, Config{})
	ts.expect(200, "GET", "/p/a/", auth("")...)
	inst := ts.h.instance("a")
	ran := false
	if err := inst.Do(func() { ran = true }); err != nil || !ran {
		t.Fatalf("Do under a valid lease = %v, ran %v", err, ran)
	}
	w.mu.Lock()
	lease := w.lease
	w.mu.Unlock()
	lease.expired.Store(true)
	if inst.Context().Err() != nil || lease.Context.Err() != nil {
		t.Fatal("the test meant a lease that is past its deadline but not yet cancelled")
	}
	ran = false
	if err := inst.Do(func() { ran = true }); !errors.Is(err, ErrInstanceClosed) || ran {
		t.Fatalf("Do under an expired lease = %v, ran %v; want ErrInstanceClosed without running", err, ran)
	}
	if inst.Context().Err() == nil {
		t.Fatal("the instance context outlived the lease's end that Do noticed")
	}
}

// Close detaches the host from its worker once every instance has closed,
// and not before.
func TestFleetCloseDetaches(t *testing.T) {
	ts, w, _ := newFleetHost(t, Config{})
	ts.expect(200, "GET", "/p/a/", auth("")...)
	select {
	case n := <-w.detached:
		t.Fatalf("detached before Close, with %d instances", n)
	default:
	}
	if err := ts.h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-w.detached:
		if n != 0 {
			t.Fatalf("detached with %d live instances; want 0", n)
		}
	default:
		t.Fatal("Close returned without detaching the host from its worker")
	}
	if err := ts.h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(w.detached) != 0 {
		t.Fatal("a second Close detached again")
	}
}

// Evict aborts one instance: its running task is cancelled, its teardown
// runs once, its placement is released, other instances are untouched, and
// the next request activates a fresh instance.
func TestFleetEvict(t *testing.T) {
	ts, w, e := newFleetHost(t, Config{})
	h := ts.h
	ts.expect(200, "GET", "/p/a/", auth("")...)
	ts.expect(200, "GET", "/p/b/", auth("")...)
	ts.expect(202, "POST", "/p/a/task", auth("")...)
	e.waitEntered(t, "a") // the task runs, and would run until taskBlock

	if h.Evict("nobody", EvictEvict) {
		t.Fatal("Evict of an id without an instance reported true")
	}
	if !h.Evict("a", EvictEvict) {
		t.Fatal("Evict(a) = false; want true")
	}
	e.waitTorn(t, "a") // the teardown waits for the task: the task was cancelled
	w.waitReleased(t, "/p/a")
	waitFor(t, "a to leave the directory", func() bool { return h.Len() == 1 })
	if h.instance("b") == nil || e.tornCount("b") != 0 || w.releasedCount("/p/b") != 0 {
		t.Fatal("Evict(a) touched b")
	}
	before := e.setups.Load()
	ts.expect(200, "GET", "/p/a/", auth("")...)
	if got := e.setups.Load(); got != before+1 {
		t.Fatalf("setups after the evicted id's next request = %d; want %d (a fresh instance)", got, before+1)
	}
	if got := e.tornCount("a"); got != 1 {
		t.Errorf("teardowns of a = %d; want 1", got)
	}
	if got := h.met.evictions[evictIndex(EvictEvict)].Get(); got != 1 {
		t.Errorf("pinned_evictions_total{reason=evict} = %d; want 1", got)
	}
}
