package placement_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
	"github.com/pinned-go/pinned/proxy"
)

// A placement, once made, sticks: every request for the id reaches the same
// host (its instance counts up), the store names that host's session, and
// new ids spread over the hosts.
func TestPlacementSticks(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		hosts := []*fakeHost{startHost(t, "a", e.fl), startHost(t, "b", e.fl), startHost(t, "c", e.fl)}
		sids := map[string]string{}
		for _, h := range hosts {
			sids[h.name] = e.register(h, 100)
		}
		pb := e.pinboard(nil, nil)
		used := map[string]int{}
		for i := range 30 {
			id := fmt.Sprintf("id%d", i)
			first := pb.get(t, id)
			if first.status != 200 {
				t.Fatalf("GET %s = %d %q; want 200", id, first.status, first.body)
			}
			used[first.host()]++
			for n := 2; n <= 4; n++ {
				a := pb.get(t, id)
				if want := fmt.Sprintf("%s %s %d", first.host(), id, n); a.body != want {
					t.Fatalf("GET %s #%d = %q; want %q (the same instance)", id, n, a.body, want)
				}
			}
			if got, want := e.holder(id), sids[first.host()]; got != want {
				t.Errorf("store placement of %s = %q; want %q", id, got, want)
			}
		}
		if len(used) != 3 {
			t.Errorf("30 new ids went to %v; want all three hosts used", used)
		}
		if d := e.fl.duplicates(); len(d) > 0 {
			t.Errorf("duplicate instances: %v", d)
		}
		st := pb.res.CacheStats()
		if st.Hits < 60 {
			t.Errorf("cache hits = %d after 90 repeat requests; want ≥ 60", st.Hits)
		}
	})
}

// No live worker serves the namespace: 503 no_worker with Retry-After when
// one served it recently (the resolver's error wraps proxy.ErrNoWorker),
// 404 unknown_namespace without Retry-After when none ever did.
func TestNoWorker(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		pb := e.pinboard(nil, nil)
		a := pb.get(t, "x")
		if a.status != 404 || a.reason != wire.ReasonUnknownNamespace || a.retryAfter != "" {
			t.Errorf("GET of a namespace never served = %d reason %q Retry-After %q; want 404 unknown_namespace without Retry-After",
				a.status, a.reason, a.retryAfter)
		}
		if _, err := pb.res.Resolve(context.Background(), []byte("/other/x")); !errors.Is(err, proxy.ErrUnknownNamespace) {
			t.Errorf("Resolve(/other/x) = %v; want ErrUnknownNamespace", err)
		}
		// A worker of the namespace came and went: 503 no_worker.
		gone := e.register(startHost(t, "gone", e.fl), 10)
		if _, err := e.st.Deregister(ctxT(t), gone); err != nil {
			t.Fatal(err)
		}
		pb.res.OnInvalidate(store.Invalidation{All: true})
		if a := pb.get(t, "x"); a.status != 503 || a.reason != wire.ReasonNoWorker || a.retryAfter == "" {
			t.Errorf("GET after its worker left = %d reason %q Retry-After %q; want 503 no_worker with Retry-After", a.status, a.reason, a.retryAfter)
		}
		// Only draining (or unverified, or superseded) workers: still none.
		h := startHost(t, "a", e.fl)
		sid := e.register(h, 10)
		e.heartbeat(sid, 10, true)
		pb.res.OnInvalidate(store.Invalidation{All: true})
		if a := pb.get(t, "y"); a.status != 503 || a.reason != wire.ReasonNoWorker {
			t.Errorf("GET with only a draining worker = %d %q; want 503 no_worker", a.status, a.reason)
		}
		if h := e.holder("y"); h != "" {
			t.Errorf("placement of y = %q; want none", h)
		}
	})
}

// A worker reporting headroom 0 gets no new placement while another has
// room; when none has room, placements still happen (the hosts decide).
func TestHeadroomZeroGetsNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		full, roomy := startHost(t, "full", e.fl), startHost(t, "roomy", e.fl)
		sFull := e.register(full, 0)
		sRoomy := e.register(roomy, 1000)
		pb := e.pinboard(nil, nil)
		for i := range 40 {
			id := fmt.Sprintf("n%d", i)
			if a := pb.get(t, id); a.host() != "roomy" {
				t.Fatalf("GET %s served by %q (%d); want roomy", id, a.host(), a.status)
			}
		}
		if full.served.Load() != 0 {
			t.Errorf("the full worker served %d requests; want 0", full.served.Load())
		}
		// Nobody has room: both are eligible again.
		e.heartbeat(sFull, 0, false)
		e.heartbeat(sRoomy, 0, false)
		pb.res.OnInvalidate(store.Invalidation{All: true}) // fresh session reads
		got := map[string]int{}
		for i := range 40 {
			a := pb.get(t, fmt.Sprintf("z%d", i))
			got[a.host()]++
		}
		if got["full"] == 0 || got["roomy"] == 0 {
			t.Errorf("with no room anywhere, 40 new ids went to %v; want both used", got)
		}
	})
}

// Drain: new ids go elsewhere at once; ids already on the draining worker
// keep being served there, even after the cache forgot them.
func TestDrainMovesNewIDsAway(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		a, b := startHost(t, "a", e.fl), startHost(t, "b", e.fl)
		sa := e.register(a, 100)
		pb := e.pinboard(nil, nil)
		var old []string
		for i := range 5 {
			id := fmt.Sprintf("old%d", i)
			if ans := pb.get(t, id); ans.host() != "a" {
				t.Fatalf("GET %s = %d %q; want a (the only worker)", id, ans.status, ans.body)
			}
			old = append(old, id)
		}
		e.register(b, 100)
		e.heartbeat(sa, 100, true)
		a.mode.Store(modeDraining)
		for i := range 20 {
			id := fmt.Sprintf("new%d", i)
			if ans := pb.get(t, id); ans.host() != "b" {
				t.Fatalf("GET %s after the drain = %d %q; want b", id, ans.status, ans.body)
			}
		}
		pb.res.OnInvalidate(store.Invalidation{All: true})
		for _, id := range old {
			if ans := pb.get(t, id); ans.host() != "a" {
				t.Errorf("GET %s (placed before the drain) = %d %q; want a", id, ans.status, ans.body)
			}
		}
		if d := e.fl.duplicates(); len(d) > 0 {
			t.Errorf("duplicate instances: %v", d)
		}
	})
}

// A host that fenced itself (503 lease) while its session is live in the
// store: the proxy re-resolves, the store confirms the holder, and the
// client gets 503 lease with Retry-After; the placement does not move.
func TestLiveHolderRefusingKeepsPlacement(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		a, b := startHost(t, "a", e.fl), startHost(t, "b", e.fl)
		sa := e.register(a, 100)
		pb := e.pinboard(nil, nil)
		if ans := pb.get(t, "x"); ans.host() != "a" {
			t.Fatalf("GET x = %q", ans.body)
		}
		e.register(b, 100)
		a.mode.Store(modeLease)
		ans := pb.get(t, "x")
		if ans.status != 503 || ans.reason != wire.ReasonLease || ans.retryAfter == "" {
			t.Errorf("GET x = %d %q Retry-After %q; want 503 lease with Retry-After", ans.status, ans.reason, ans.retryAfter)
		}
		if h := e.holder("x"); h != sa {
			t.Errorf("placement of x = %q; want %q (a's lease has not run out)", h, sa)
		}
		if b.served.Load() != 0 {
			t.Errorf("b served %d requests; want 0", b.served.Load())
		}
		// New ids avoid the refusing worker for a while.
		if ans := pb.get(t, "fresh"); ans.host() != "b" {
			t.Errorf("GET fresh = %d %q; want b (a just refused)", ans.status, ans.body)
		}
		if n := pb.counter("pinned_placement_invalidates_total"); n < 1 {
			t.Errorf("pinned_placement_invalidates_total = %d; want ≥ 1 (the lease 503)", n)
		}
		if n := pb.counter(`pinned_placement_replaces_total{result="won"}`); n != 0 {
			t.Errorf("replaces = %d; want 0 (a live holder keeps its ids)", n)
		}
	})
}

// Concurrent first requests for one id through two pinboards (two store
// clients; on Redis two tracking connections) activate exactly one
// instance, and both pinboards route the id to it.
func TestTwoPinboardsOneInstance(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		sids := map[string]string{}
		for _, n := range []string{"a", "b", "c"} {
			sids[n] = e.register(startHost(t, n, e.fl), 1000)
		}
		pbs := []*pinboard{e.pinboard(nil, nil), e.pinboard(nil, nil)}
		const ids, perPinboard = 40, 4
		for i := range ids {
			id := fmt.Sprintf("race%d", i)
			var wg sync.WaitGroup
			answers := make([]answer, 2*perPinboard)
			start := make(chan struct{})
			for j := range answers {
				wg.Go(func() {
					<-start
					answers[j] = pbs[j%2].get(t, id)
				})
			}
			close(start)
			wg.Wait()
			for j, a := range answers {
				if a.status != 200 || a.host() != answers[0].host() {
					t.Fatalf("%s: answer %d = %d %q; answer 0 = %q; want one host for all", id, j, a.status, a.body, answers[0].body)
				}
			}
			if h := e.holder(id); h != sids[answers[0].host()] {
				t.Fatalf("%s: store holder %q; answers came from %s (%s)", id, h, answers[0].host(), sids[answers[0].host()])
			}
		}
		if d := e.fl.duplicates(); len(d) > 0 {
			t.Fatalf("duplicate instances: %v", d)
		}
		claims := 0
		for _, pb := range pbs {
			m := pb.res.Metrics()
			claims += int(m.GetOrCreateCounter(`pinned_placement_claims_total{result="won"}`).Get() +
				m.GetOrCreateCounter(`pinned_placement_claims_total{result="lost"}`).Get())
		}
		if claims < ids {
			t.Errorf("claims over both pinboards = %d; want ≥ %d (one per id at least)", claims, ids)
		}
	})
}

// A release (the instance closed on its worker) invalidates the cached
// placement in every pinboard; the next request places the id anew.
func TestReleaseInvalidatesEveryPinboard(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		a, b := startHost(t, "a", e.fl), startHost(t, "b", e.fl)
		sa := e.register(a, 100)
		pb1, pb2 := e.pinboard(nil, nil), e.pinboard(nil, nil)
		for _, pb := range []*pinboard{pb1, pb2} {
			if ans := pb.get(t, "x"); ans.host() != "a" {
				t.Fatalf("GET x = %d %q; want a", ans.status, ans.body)
			}
		}
		// Both serve x from their caches now.
		for _, pb := range []*pinboard{pb1, pb2} {
			waitFor(t, "x cached", func() bool {
				before := pb.res.CacheStats().Hits
				pb.get(t, "x")
				return pb.res.CacheStats().Hits > before
			})
		}
		// The instance closes on a, which releases its placement; a is
		// draining, so the id must go to b next.
		e.register(b, 100)
		e.heartbeat(sa, 100, true)
		a.mode.Store(modeDraining)
		a.mu.Lock()
		delete(a.instances, "x")
		a.mu.Unlock()
		e.fl.deactivate("x", "a")
		before1, before2 := pb1.res.CacheStats().Invalidations, pb2.res.CacheStats().Invalidations
		if ok, err := e.st.Release(ctxT(t), ns, "x", sa, 0); err != nil || !ok {
			t.Fatalf("Release = %v, %v", ok, err)
		}
		waitFor(t, "both caches invalidated", func() bool {
			return pb1.res.CacheStats().Invalidations > before1 && pb2.res.CacheStats().Invalidations > before2
		})
		for i, pb := range []*pinboard{pb2, pb1} {
			if ans := pb.get(t, "x"); ans.host() != "b" {
				t.Errorf("pinboard %d: GET x after the release = %d %q; want b", 2-i, ans.status, ans.body)
			}
		}
		if d := e.fl.duplicates(); len(d) > 0 {
			t.Errorf("duplicate instances: %v", d)
		}
	})
}

// countingStore counts and can hold the reads a resolver makes.
type countingStore struct {
	store.Store
	mu sync.Mutex
	// placements counts placement reads (Lookup and LookupOrClaim), claims
	// the placements written by ClaimPlacement or LookupOrClaim, lookups
	// the Lookups alone.
	placements int
	claims     int
	lookups    int
	// hold, when set, runs inside Lookup and LookupOrClaim after the real
	// call, before its result is returned.
	hold func()
}

func (c *countingStore) read(claimed bool) {
	c.mu.Lock()
	c.placements++
	if claimed {
		c.claims++
	}
	hold := c.hold
	c.mu.Unlock()
	if hold != nil {
		hold()
	}
}

func (c *countingStore) Lookup(ctx context.Context, ns, id string) (store.Placement, error) {
	pl, err := c.Store.Lookup(ctx, ns, id)
	c.mu.Lock()
	c.lookups++
	c.mu.Unlock()
	c.read(false)
	return pl, err
}

// lookupsAndReads returns the Lookups and all placement reads so far.
func (c *countingStore) lookupsAndReads() (lookups, reads int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookups, c.placements
}

func (c *countingStore) LookupOrClaim(ctx context.Context, ns, id, sid string) (store.Placement, bool, error) {
	pl, claimed, err := c.Store.LookupOrClaim(ctx, ns, id, sid)
	c.read(claimed)
	return pl, claimed, err
}

func (c *countingStore) ClaimPlacement(ctx context.Context, ns, id, sid string) (store.Placement, error) {
	c.mu.Lock()
	c.claims++
	c.mu.Unlock()
	return c.Store.ClaimPlacement(ctx, ns, id, sid)
}

func (c *countingStore) counts() (placements, claims int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.placements, c.claims
}

// untilStore answers placement reads as a store with a client-side cache
// would: with the time that cache serves them until.
type untilStore struct {
	store.Store
	until func() time.Time
	mu    sync.Mutex
	reads int
}

func (u *untilStore) LookupUntil(ctx context.Context, ns, id string) (store.Placement, time.Time, error) {
	u.mu.Lock()
	u.reads++
	u.mu.Unlock()
	pl, err := u.Store.Lookup(ctx, ns, id)
	return pl, u.until(), err
}

func (u *untilStore) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.reads
}

// A placement the store served from its own cache, due to expire there in
// one second, is cached for that second only, not for a whole TTL more.
// (The read-only path: no session may take a new id, so the resolver reads
// instead of LookupOrClaim, whose answer always comes from the server.)
func TestCachedOnlyUntilTheStoreCacheExpires(t *testing.T) {
	e := newEnv(t, "memory")
	sa := e.register(startHost(t, "a", e.fl), 100)
	us := &untilStore{until: func() time.Time { return e.fake.Now().Wall().Add(time.Second) }}
	pb := e.pinboard(nil, func(s store.Store) store.Store { us.Store = s; return us })
	ctx := context.Background()
	name := []byte("/counter/u")
	resolve := func() {
		t.Helper()
		if _, err := pb.res.Resolve(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	resolve() // placed by a claim
	if n := us.count(); n != 0 {
		t.Fatalf("the claim read the placement through the store cache %d times; want 0 (its answer is the server's)", n)
	}
	e.heartbeat(sa, 100, true) // a drains: nobody may take a new id
	pb.res.OnInvalidate(store.Invalidation{Placement: "/counter/u"})
	resolve() // re-read: held by a, store cache until now + 1 s
	if n := us.count(); n != 1 {
		t.Fatalf("re-read with no session to claim for: %d reads through the store cache; want 1", n)
	}
	n := us.count()
	e.fake.Advance(999 * time.Millisecond)
	resolve()
	if got := us.count(); got != n {
		t.Fatalf("resolve within the store cache's second read the store (%d reads, had %d)", got, n)
	}
	e.fake.Advance(time.Millisecond)
	resolve()
	if got := us.count(); got != n+1 {
		t.Fatalf("resolve once the store cache expired: %d reads, want %d (still served from the placecache)", got, n+1)
	}
}

// Concurrent misses of one name share one store read.
func TestConcurrentMissesShareOneRead(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		e.register(startHost(t, "a", e.fl), 100)
		cs := &countingStore{}
		release := make(chan struct{})
		cs.hold = func() { <-release }
		pb := e.pinboard(nil, func(s store.Store) store.Store { cs.Store = s; return cs })
		const n = 8
		rts := make([]proxy.Route, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { rts[i], errs[i] = pb.res.Resolve(context.Background(), []byte("/counter/shared")) })
		}
		shared := pb.res.Metrics().GetOrCreateCounter("pinned_placement_shared_misses_total")
		waitFor(t, "the other misses to join the first", func() bool { return shared.Get() == n-1 })
		close(release)
		wg.Wait()
		for i := range n {
			if errs[i] != nil || rts[i].Session == nil || rts[i] != rts[0] {
				t.Fatalf("Resolve %d = %v, %v; want route %v", i, rts[i], errs[i], rts[0])
			}
		}
		if p, c := cs.counts(); p != 1 || c != 1 {
			t.Errorf("store calls: %d placement reads, %d claims; want one read that claimed", p, c)
		}
	})
}

// Config validation names what to change.
func TestConfig(t *testing.T) {
	if _, err := placement.New(placement.Config{}); !errors.Is(err, placement.ErrNoStore) {
		t.Errorf("New without a store = %v; want ErrNoStore", err)
	}
	e := newEnv(t, "memory")
	for _, cfg := range []placement.Config{
		{Store: e.st, Lease: time.Second, CacheTTL: 2 * time.Second},
		{Store: e.st, ResolveTimeout: -1},
		{Store: e.st, CacheTTL: time.Second, RefreshAhead: 2 * time.Second},
		{Store: e.st, MaxRefreshes: -1},
	} {
		if _, err := placement.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted a bad config", cfg)
		}
	}
}

// Ids handed out stay in the namespace's grammar: names that are not
// "/<ns>/<id>" never reach the store.
func TestBadName(t *testing.T) {
	e := newEnv(t, "memory")
	cs := &countingStore{Store: e.st}
	r, err := placement.New(placement.Config{Store: cs, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, name := range []string{"", "/", "/counter", "/counter/", "counter/x"} {
		if _, err := r.Resolve(context.Background(), []byte(name)); err == nil || errors.Is(err, proxy.ErrNoWorker) {
			t.Errorf("Resolve(%q) = %v; want a plain error", name, err)
		}
	}
	if p, c := cs.counts(); p+c != 0 {
		t.Errorf("bad names reached the store: %d reads, %d claims", p, c)
	}
}

// The metric set carries the cache's and the resolver's series.
func TestMetricsNames(t *testing.T) {
	e := newEnv(t, "memory")
	pb := e.pinboard(nil, nil)
	pb.get(t, "x") // a namespace never served
	gone := e.register(startHost(t, "gone", e.fl), 1)
	if _, err := e.st.Deregister(ctxT(t), gone); err != nil {
		t.Fatal(err)
	}
	pb.get(t, "y") // its worker went away a moment ago
	var b bytes.Buffer
	pb.res.Metrics().WritePrometheus(&b)
	lines := strings.Split(b.String(), "\n")
	for _, want := range []string{
		`pinned_placecache_misses_total{cache="placements"}`,
		`pinned_placement_unknown_namespace_total 1`,
		`pinned_placement_no_worker_total 1`,
		`pinned_placement_miss_duration_seconds_bucket`,
		`pinned_placement_sessions 0`,
	} {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
}

// Tunnel checks beyond MaxTunnelChecks waiting for Run are dropped and
// counted; a name already queued is not counted again.
func TestTunnelChecksDroppedCounted(t *testing.T) {
	st, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r, err := placement.New(placement.Config{Store: st, MaxTunnelChecks: 1, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	dropped := r.Metrics().GetOrCreateCounter("pinned_placement_tunnel_checks_dropped_total")
	r.Watch(ns + "/a") // queued: Run is not running
	r.Watch(ns + "/a") // already queued
	if n := dropped.Get(); n != 0 {
		t.Fatalf("dropped = %d after one name; want 0", n)
	}
	r.Watch(ns + "/b")
	r.OnInvalidate(store.Invalidation{Placement: ns + "/b"})
	if n := dropped.Get(); n != 2 {
		t.Errorf("dropped = %d; want 2 (b watched and invalidated beyond the bound)", n)
	}
}

// Routes resolved together do not all expire together: each is cached for
// CacheTTL less a random fifth at most, so their re-reads spread over the
// last fifth of the TTL instead of landing in one instant (refresh-ahead
// off: the lookups below would otherwise extend them).
func TestFreshRoutesExpireSpread(t *testing.T) {
	e := newEnv(t, "memory")
	e.register(startHost(t, "a", e.fl), 1000)
	pb := e.pinboard(func(c *placement.Config) { c.RefreshAhead = -1 }, nil)
	ctx := context.Background()
	names := make([][]byte, 40)
	for i := range names {
		names[i] = []byte(fmt.Sprintf("%s/spread%d", ns, i))
		for range 2 { // memstore tells the claimer of its own claim: the second resolve caches
			if _, err := pb.res.Resolve(ctx, names[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	cached := func() int {
		n := 0
		for _, name := range names {
			if _, ok := pb.res.Lookup(name, time.Time{}); ok {
				n++
			}
		}
		return n
	}
	if n := cached(); n != len(names) {
		t.Fatalf("%d of %d routes cached after resolving", n, len(names))
	}
	e.fake.Advance(e.lease - e.lease/5 - time.Millisecond)
	if n := cached(); n != len(names) {
		t.Fatalf("%d of %d routes cached just before the last fifth of the TTL; want all", n, len(names))
	}
	e.fake.Advance(e.lease / 10)
	if n := cached(); n == 0 || n == len(names) {
		t.Fatalf("%d of %d routes cached in the middle of the last fifth of the TTL; want some, not all", n, len(names))
	}
	// Past the whole TTL (the clock stood 1 ms short of it): a route whose
	// random fifth came out under 1 ms is due only now.
	e.fake.Advance(e.lease/10 + 2*time.Millisecond)
	if n := cached(); n != 0 {
		t.Fatalf("%d routes cached a TTL after resolving; want none", n)
	}
}

// The miss after the proxy refused a name's route reads the placement
// (through the store's client-side cache on Redis: the requests for a dead
// worker's ids come again and again until its session expires) instead of
// LookupOrClaim; the miss after that is an ordinary one again. Beyond
// MaxRefusedNames names waiting, a refused name's miss is an ordinary one.
func TestRefusedNameIsRereadNotClaimed(t *testing.T) {
	e := newEnv(t, "memory")
	e.register(startHost(t, "a", e.fl), 100)
	cs := &countingStore{}
	pb := e.pinboard(func(c *placement.Config) { c.MaxRefusedNames = 1 }, func(s store.Store) store.Store { cs.Store = s; return cs })
	ctx := context.Background()
	resolve := func(id string) proxy.Route {
		t.Helper()
		rt, err := pb.res.Resolve(ctx, []byte(ns+"/"+id))
		if err != nil || rt.Session == nil {
			t.Fatalf("Resolve %s = %v, %v", id, rt, err)
		}
		return rt
	}
	step := func(what, id string, wantLookups int) {
		t.Helper()
		l0, r0 := cs.lookupsAndReads()
		resolve(id)
		l, r := cs.lookupsAndReads()
		if l-l0 != wantLookups || r-r0 != 1 {
			t.Fatalf("%s: %d Lookups among %d placement reads; want %d of 1", what, l-l0, r-r0, wantLookups)
		}
	}
	x, y := resolve("x"), resolve("y")
	pb.res.Refused([]byte(ns+"/x"), x, wire.ReasonUnreachable)
	step("the miss after a refusal", "x", 1)
	pb.res.OnInvalidate(store.Invalidation{Placement: ns + "/x"})
	step("the next miss", "x", 0)
	pb.res.Refused([]byte(ns+"/x"), x, wire.ReasonUnreachable)
	pb.res.Refused([]byte(ns+"/y"), y, wire.ReasonUnreachable) // beyond MaxRefusedNames: not remembered
	step("a refused name beyond the bound", "y", 0)
	step("the remembered one", "x", 1)
}

// After the holder refused a route as stale, the miss renews the
// placement's epoch on the same session when the store still names exactly
// the refused placement (its instance closed there and its release did not
// take effect: without a new epoch the holder would refuse it for its whole
// window). Any other refusal, or a placement that moved meanwhile, renews
// nothing.
func TestStaleRefusalRenewsTheSamePlacement(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		sa := e.register(startHost(t, "a", e.fl), 100)
		pb := e.pinboard(nil, nil)
		ctx := context.Background()
		name := []byte(ns + "/x")
		resolve := func() proxy.Route {
			t.Helper()
			rt, err := pb.res.Resolve(ctx, name)
			if err != nil || rt.Session == nil {
				t.Fatalf("Resolve = %v, %v", rt, err)
			}
			return rt
		}
		renewals := func() uint64 { return pb.counter("pinned_placement_renewals_total") }

		r1 := resolve()
		pb.res.Refused(name, r1, wire.ReasonClosing) // not stale: nothing to renew
		if r := resolve(); r.Session.ID != sa || r.Epoch != r1.Epoch || renewals() != 0 {
			t.Fatalf("after a closing refusal: %s@%d, %d renewals; want %s@%d, none", r.Session.ID, r.Epoch, renewals(), sa, r1.Epoch)
		}
		pb.res.Refused(name, r1, wire.ReasonStale)
		r2 := resolve()
		if r2.Session.ID != sa || r2.Epoch <= r1.Epoch || renewals() != 1 {
			t.Fatalf("after a stale refusal of the placement the store holds: %s@%d, %d renewals; want %s above %d, 1",
				r2.Session.ID, r2.Epoch, renewals(), sa, r1.Epoch)
		}
		if p, err := e.st.Lookup(ctxT(t), ns, "x"); err != nil || p.Session != sa || p.Epoch != r2.Epoch {
			t.Fatalf("store holds %+v, %v; want %s@%d", p, err, sa, r2.Epoch)
		}
		// A stale refusal of the old route again: the store names a newer
		// epoch now, so the miss routes to it and renews nothing.
		pb.res.Refused(name, r1, wire.ReasonStale)
		if r := resolve(); r.Epoch != r2.Epoch || renewals() != 1 {
			t.Fatalf("stale refusal of an older epoch: routed to @%d, %d renewals; want @%d, 1", r.Epoch, renewals(), r2.Epoch)
		}
	})
}

// A namespace that no session serves: ErrUnknownNamespace when nobody
// served it recently, ErrNoWorker (503, worth retrying) while the resolver
// saw a live session of it within NamespaceMemory or the store still holds
// one of its ended sessions.
func TestUnservedNamespaces(t *testing.T) {
	e := newEnv(t, "memory")
	sid := e.register(startHost(t, "a", e.fl), 100)
	resolveErr := func(pb *pinboard, name string) error {
		t.Helper()
		_, err := pb.res.Resolve(context.Background(), []byte(name))
		return err
	}
	withMemory := e.pinboard(func(c *placement.Config) { c.NamespaceMemory = time.Minute }, nil)
	storeOnly := e.pinboard(func(c *placement.Config) { c.NamespaceMemory = -1 }, nil)
	for _, pb := range []*pinboard{withMemory, storeOnly} {
		if err := resolveErr(pb, "/nosuch/x"); !errors.Is(err, proxy.ErrUnknownNamespace) {
			t.Fatalf("Resolve(/nosuch/x) = %v; want ErrUnknownNamespace", err)
		}
		if err := resolveErr(pb, ns+"/x"); err != nil {
			t.Fatalf("Resolve(%s/x) = %v", ns, err)
		}
	}
	if ok, err := e.st.Deregister(ctxT(t), sid); !ok || err != nil {
		t.Fatalf("Deregister = %v, %v", ok, err)
	}
	for _, pb := range []*pinboard{withMemory, storeOnly} {
		if err := resolveErr(pb, ns+"/y"); !errors.Is(err, proxy.ErrNoWorker) || errors.Is(err, proxy.ErrUnknownNamespace) {
			t.Fatalf("Resolve(%s/y) right after its only session ended = %v; want ErrNoWorker", ns, err)
		}
	}
	// The janitor collects the session: only the resolver's own memory
	// still knows the namespace, for NamespaceMemory.
	if _, err := e.mem.Reap(ctxT(t), 0); err != nil {
		t.Fatal(err)
	}
	if err := resolveErr(withMemory, ns+"/y"); !errors.Is(err, proxy.ErrNoWorker) {
		t.Fatalf("Resolve with memory after the reap = %v; want ErrNoWorker", err)
	}
	if err := resolveErr(storeOnly, ns+"/y"); !errors.Is(err, proxy.ErrUnknownNamespace) {
		t.Fatalf("Resolve without memory after the reap = %v; want ErrUnknownNamespace", err)
	}
	e.fake.Advance(time.Minute)
	if err := resolveErr(withMemory, ns+"/y"); !errors.Is(err, proxy.ErrUnknownNamespace) {
		t.Fatalf("Resolve a NamespaceMemory after the last live session = %v; want ErrUnknownNamespace", err)
	}
}

// skewedStore reports every session's expiry a minute earlier: what a
// pinboard whose clock runs a minute ahead of the one that took the
// heartbeats sees.
type skewedStore struct{ store.Store }

func (s skewedStore) NamespaceSessions(ctx context.Context, ns string) ([]store.Session, error) {
	ss, err := s.Store.NamespaceSessions(ctx, ns)
	for i := range ss {
		ss[i].ExpiresAt -= time.Minute.Milliseconds()
	}
	return ss, err
}

// A cached route is not served past its session's lease end as the store
// said (the store is asked again), but a session the store has just called
// live is taken to have at least half a second left whatever its expiry
// says: a pinboard whose clock runs ahead asks the store at most twice a
// second per session, not on every request.
func TestLeaseEndOfASkewedClock(t *testing.T) {
	e := newEnv(t, "memory")
	e.register(startHost(t, "a", e.fl), 100)
	cs := &countingStore{}
	pb := e.pinboard(nil, func(s store.Store) store.Store { cs.Store = skewedStore{s}; return cs })
	name := []byte(ns + "/x")
	for range 2 { // the claim's own invalidation refuses the first Put (memstore)
		if _, err := pb.res.Resolve(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	lookups := func(n int) (hits int) {
		for range n {
			if _, ok := pb.res.Lookup(name, time.Time{}); ok {
				hits++
			}
		}
		return hits
	}
	if hits := lookups(100); hits != 100 {
		t.Fatalf("%d of 100 lookups right after the resolve hit; want all (the session was just called live)", hits)
	}
	e.fake.Advance(600 * time.Millisecond)
	if hits := lookups(1); hits != 0 {
		t.Fatal("a lookup past the floor hit; want a miss: the store is asked again")
	}
}
