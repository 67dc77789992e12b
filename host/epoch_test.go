package host

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// withEpoch is auth("") plus an x-pinned-epoch header.
func withEpoch(epoch string) []string { return append(auth(""), wire.HeaderEpoch, epoch) }

// epochOf reads the "epoch" and "nonce" a probe's GET / answers.
func epochOf(t *testing.T, r response) (epoch uint64, nonce float64) {
	t.Helper()
	var v struct {
		Epoch uint64
		Nonce float64
	}
	if err := json.Unmarshal([]byte(r.body), &v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	return v.Epoch, v.Nonce
}

// In local mode the host allocates epochs: increasing across ids and
// activations of one id (same instant on the clock: the counter), and
// across a restart of the process (a new host: the clock floor). The
// header is not trusted without a proxy in front: it changes nothing.
func TestEpochLocalMode(t *testing.T) {
	fc := fakeClock()
	e := newEnv()
	ts := newTestHost(t, Config{Clock: fc}, e)
	a1, nonceA := epochOf(t, ts.expect(200, "GET", "/p/a/"))
	b, _ := epochOf(t, ts.expect(200, "GET", "/p/b/"))
	if a1 == 0 || b <= a1 {
		t.Fatalf("epochs a=%d then b=%d; want increasing and non-zero", a1, b)
	}
	if a1 < uint64(fc.Now().Wall().UnixMicro()) {
		t.Errorf("first epoch %d is below the clock floor %d", a1, fc.Now().Wall().UnixMicro())
	}
	for _, hdr := range []string{"1", strconv.FormatUint(a1+100, 10), "junk"} {
		if got, nonce := epochOf(t, ts.expect(200, "GET", "/p/a/", wire.HeaderEpoch, hdr)); got != a1 || nonce != nonceA {
			t.Fatalf("local mode with %s %s: epoch %d nonce %v; want the same instance (%d, %v)", wire.HeaderEpoch, hdr, got, nonce, a1, nonceA)
		}
	}
	ts.expect(200, "GET", "/p/a/abort")
	e.waitTorn(t, "a")
	waitFor(t, "a to leave", func() bool { return ts.h.instance("a") == nil })
	a2, _ := epochOf(t, ts.expect(200, "GET", "/p/a/"))
	if a2 <= b {
		t.Fatalf("re-activation of a: epoch %d; want above every earlier one (%d)", a2, b)
	}

	fc.Advance(time.Second) // the process restarts (a new host) a second later
	restarted := newTestHost(t, Config{Clock: fc}, newEnv())
	if a3, _ := epochOf(t, restarted.expect(200, "GET", "/p/a/")); a3 <= a2 {
		t.Fatalf("after a restart: epoch %d; want above %d (the clock floor)", a3, a2)
	}
}

// In fleet mode the instance takes the epoch of the request that activated
// it. An older request is refused 503 stale and leaves the instance alone;
// an equal or absent one is served; a newer one supersedes it: aborted
// (eviction reason stale, no Release: the newer placement names this
// worker) and activated again under the new epoch.
func TestEpochFleet(t *testing.T) {
	ts, w, e := newFleetHost(t, Config{})
	got, n1 := epochOf(t, ts.expect(200, "GET", "/p/a/", withEpoch("5")...))
	inst := ts.h.instance("a")
	if got != 5 || inst.Epoch() != 5 {
		t.Fatalf("epoch = %d (Instance.Epoch %d); want 5, the request's", got, inst.Epoch())
	}
	ts.expect503(wire.ReasonStale, "GET", "/p/a/", withEpoch("3")...)
	ts.expect503(wire.ReasonStale, "POST", "/p/a/incr", withEpoch("4")...)
	if inst.Context().Err() != nil || ts.h.instance("a") != inst || e.setups.Load() != 1 {
		t.Fatal("a stale request touched the live instance")
	}
	for _, hdr := range [][]string{auth(""), withEpoch("5")} {
		if got, n := epochOf(t, ts.expect(200, "GET", "/p/a/", hdr...)); got != 5 || n != n1 {
			t.Fatalf("request %v: epoch %d nonce %v; want the live instance (5, %v)", hdr, got, n, n1)
		}
	}

	got, n2 := epochOf(t, ts.expect(200, "GET", "/p/a/", withEpoch("9")...))
	if got != 9 || n2 == n1 {
		t.Fatalf("newer epoch: served by epoch %d nonce %v; want a new instance under 9", got, n2)
	}
	if inst.Context().Err() == nil || e.tornCount("a") != 1 {
		t.Fatal("the superseded instance was not aborted and torn down")
	}
	if got := ts.h.met.evictions[evictIndex(EvictStale)].Get(); got != 1 {
		t.Errorf("pinned_evictions_total{reason=stale} = %d; want 1", got)
	}
	if got := w.releasedCount("/p/a"); got != 0 {
		t.Errorf("Release(/p/a) called %d times for a superseded instance; want 0", got)
	}
	if got, n := epochOf(t, ts.expect(200, "GET", "/p/a/", withEpoch("9")...)); got != 9 || n != n2 {
		t.Fatalf("after the supersede: epoch %d nonce %v; want (9, %v)", got, n, n2)
	}
	// No header: epoch 0, superseded by any epoch.
	if got, _ := epochOf(t, ts.expect(200, "GET", "/p/b/", auth("")...)); got != 0 {
		t.Fatalf("activation without an epoch: %d; want 0", got)
	}
	if got, _ := epochOf(t, ts.expect(200, "GET", "/p/b/", withEpoch("1")...)); got != 1 {
		t.Fatalf("epoch 1 after an unfenced instance: %d; want 1", got)
	}
}

// A malformed epoch is a 400 naming the header, counted as invalid_epoch.
func TestEpochHeaderInvalid(t *testing.T) {
	ts, _, _ := newFleetHost(t, Config{})
	for _, v := range []string{"x", "-1", "1.5", "18446744073709551616", "7a"} {
		before := ts.rejections(rejectInvalidEpoch)
		r := ts.expect(400, "GET", "/p/a/", withEpoch(v)...)
		if f := r.json(t)["field"]; f != wire.HeaderEpoch {
			t.Errorf("%q: field %v; want %s", v, f, wire.HeaderEpoch)
		}
		if after := ts.rejections(rejectInvalidEpoch); after != before+1 {
			t.Errorf("%q: pinned_rejections_total{reason=invalid_epoch} %d -> %d; want +1", v, before, after)
		}
	}
	if ts.h.Len() != 0 {
		t.Fatal("a request with an invalid epoch activated an instance")
	}
}

// A newer epoch waits for the superseded instance's in-flight handler to
// end (aborted under it: 503 aborted) and for its teardown, then activates.
func TestEpochSupersedeWaitsForInFlight(t *testing.T) {
	ts, _, e := newFleetHost(t, Config{})
	ts.expect(200, "GET", "/p/a/", withEpoch("5")...)
	blocked := make(chan response, 1)
	go func() {
		r, _ := ts.doErr("GET", "/p/a/block", withEpoch("5")...)
		blocked <- r
	}()
	e.waitEntered(t, "a")
	got, _ := epochOf(t, ts.expect(200, "GET", "/p/a/", withEpoch("6")...))
	if got != 6 {
		t.Fatalf("epoch %d; want 6", got)
	}
	if r := <-blocked; r.status != 503 || r.header.Get(wire.HeaderReason) != wire.ReasonAborted {
		t.Fatalf("the superseded instance's in-flight handler answered %d %q; want 503 aborted", r.status, r.header.Get(wire.HeaderReason))
	}
}

// Requests that join an activation in progress compare their epoch with
// it once it is set up: an older one is refused stale, a newer one
// supersedes it and is served by an instance of its own epoch.
func TestEpochJoinersOfAnActivation(t *testing.T) {
	ts, _, e := newFleetHost(t, Config{})
	e.setupWait = make(chan struct{})
	type answer struct {
		epoch string
		r     response
	}
	answers := make(chan answer, 3)
	send := func(epoch string) {
		go func() {
			r, _ := ts.doErr("GET", "/p/a/", withEpoch(epoch)...)
			answers <- answer{epoch, r}
		}()
	}
	send("5")
	waitFor(t, "the activation to start", func() bool { return e.setups.Load() == 1 })
	send("7")
	send("3")
	waitFor(t, "both to join it", func() bool {
		inst := ts.h.instance("a")
		sh := &ts.h.shards[inst.shard]
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return inst.activity == 3
	})
	close(e.setupWait)
	for range 3 {
		a := <-answers
		switch a.epoch {
		case "3":
			if a.r.status != 503 || a.r.header.Get(wire.HeaderReason) != wire.ReasonStale {
				t.Errorf("older joiner: %d %q; want 503 stale", a.r.status, a.r.header.Get(wire.HeaderReason))
			}
		case "7":
			if got, _ := epochOf(t, a.r); a.r.status != 200 || got != 7 {
				t.Errorf("newer joiner: %d epoch %d; want 200 from an instance under 7", a.r.status, got)
			}
		case "5": // activated the superseded instance: served before the supersede, or refused after it
			if a.r.status != 200 && !(a.r.status == 503 && a.r.header.Get(wire.HeaderReason) == wire.ReasonClosing) {
				t.Errorf("activator: %d %q; want 200 or 503 closing", a.r.status, a.r.header.Get(wire.HeaderReason))
			}
		}
	}
	if got := ts.h.instance("a").Epoch(); got != 7 {
		t.Fatalf("live instance epoch %d; want 7", got)
	}
}

// The application's own store refusing the activation (host.ErrStale):
// from New, 503 stale and no instance; from a handler, 503 stale and the
// instance aborted (reason stale) and released as usual.
func TestEpochApplicationStale(t *testing.T) {
	ts, w, e := newFleetHost(t, Config{})
	e.setupErr = func(id string) error {
		if id == "s" {
			return fmt.Errorf("load: %w", ErrStale)
		}
		return nil
	}
	ts.expect503(wire.ReasonStale, "GET", "/p/s/", withEpoch("2")...)
	if ts.h.instance("s") != nil {
		t.Fatal("a stale setup left an instance")
	}
	ts.expect(200, "GET", "/p/a/", withEpoch("2")...)
	ts.expect503(wire.ReasonStale, "POST", "/p/a/stale", withEpoch("2")...)
	e.waitTorn(t, "a")
	w.waitReleased(t, "/p/a")
	if got := ts.h.met.evictions[evictIndex(EvictStale)].Get(); got != 1 {
		t.Errorf("pinned_evictions_total{reason=stale} = %d; want 1", got)
	}
}

// The stale-route fence: once the instance of epoch 5 has closed here (its
// placement released), a request routed by epoch 5 or older (a pinboard
// still routing from a cached placement, its invalidation late or its Redis
// link silent) is refused 503 stale and activates nothing, for the whole
// window: the larger of Config.StaleRouteWindow and three leases. A newer
// epoch (the id placed again, here) activates; so does an unfenced request.
// The release names the closed instance's epoch.
func TestStaleRouteFenceAfterClose(t *testing.T) {
	fc := fakeClock()
	ts, w, e := newFleetHost(t, Config{Clock: fc, StaleRouteWindow: time.Second})
	w.leaseLength.Store(int64(10 * time.Second)) // window: 3 leases, 30 s

	_, n1 := epochOf(t, ts.expect(200, "GET", "/p/a/", withEpoch("5")...))
	ts.expect(200, "GET", "/p/a/abort", withEpoch("5")...)
	e.waitTorn(t, "a")
	w.waitReleased(t, "/p/a")
	waitFor(t, "a to leave", func() bool { return ts.h.instance("a") == nil })
	w.releaseMu.Lock()
	releasedAt := w.releasedAt["/p/a"]
	w.releaseMu.Unlock()
	if releasedAt != 5 {
		t.Fatalf("Release named epoch %d; want 5, the closed instance's", releasedAt)
	}

	before := ts.h.met.staleRoutes.Get()
	for _, epoch := range []string{"5", "4"} {
		ts.expect503(wire.ReasonStale, "GET", "/p/a/", withEpoch(epoch)...)
		ts.expect503(wire.ReasonStale, "POST", "/p/a/incr", withEpoch(epoch)...)
	}
	if ts.h.instance("a") != nil || e.setups.Load() != 1 {
		t.Fatal("a route to the closed placement activated an instance")
	}
	if got := ts.h.met.staleRoutes.Get() - before; got != 4 {
		t.Errorf("pinned_stale_routes_total rose by %d; want 4", got)
	}
	fc.Advance(29 * time.Second) // Config.StaleRouteWindow is 1 s, but three leases are 30 s
	ts.expect503(wire.ReasonStale, "GET", "/p/a/", withEpoch("5")...)

	// The id placed again on this worker: a newer epoch activates.
	if got, n := epochOf(t, ts.expect(200, "GET", "/p/a/", withEpoch("8")...)); got != 8 || n == n1 {
		t.Fatalf("epoch 8 after the close: served by epoch %d; want a new instance under 8", got)
	}
	ts.expect(200, "GET", "/p/a/abort", withEpoch("8")...)
	waitFor(t, "a to leave again", func() bool { return ts.h.instance("a") == nil })
	ts.expect503(wire.ReasonStale, "GET", "/p/a/", withEpoch("5")...) // below the new floor too

	// Past the window the epoch is forgotten (memory is bounded).
	fc.Advance(30 * time.Second)
	if got, _ := epochOf(t, ts.expect(200, "GET", "/p/a/", withEpoch("8")...)); got != 8 {
		t.Fatalf("after the window: epoch %d; want an instance under 8", got)
	}

	// A request without an epoch is unfenced: it activates.
	ts.expect(200, "GET", "/p/b/", withEpoch("3")...)
	ts.expect(200, "GET", "/p/b/abort", withEpoch("3")...)
	waitFor(t, "b to leave", func() bool { return ts.h.instance("b") == nil })
	ts.expect503(wire.ReasonStale, "GET", "/p/b/", withEpoch("3")...)
	if got, _ := epochOf(t, ts.expect(200, "GET", "/p/b/", auth("")...)); got != 0 {
		t.Fatalf("unfenced request: epoch %d; want 0", got)
	}
}

// A superseded instance's epoch is fenced too: it closes without a
// release (the newer placement is this worker's), and once the newer one
// also closed, neither epoch activates.
func TestStaleRouteFenceAfterSupersede(t *testing.T) {
	ts, w, _ := newFleetHost(t, Config{})
	ts.expect(200, "GET", "/p/a/", withEpoch("5")...)
	ts.expect(200, "GET", "/p/a/", withEpoch("7")...) // supersedes 5
	ts.expect(200, "GET", "/p/a/abort", withEpoch("7")...)
	w.waitReleased(t, "/p/a")
	waitFor(t, "a to leave", func() bool { return ts.h.instance("a") == nil })
	for _, epoch := range []string{"5", "7"} {
		ts.expect503(wire.ReasonStale, "GET", "/p/a/", withEpoch(epoch)...)
	}
	if got := w.releasedCount("/p/a"); got != 1 {
		t.Fatalf("Release(/p/a) called %d times; want 1 (the superseded instance releases nothing)", got)
	}
}
