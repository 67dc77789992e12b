package placement_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/redisstore"
)

// refreshes reads pinned_placement_refreshes_total{result=...}.
func refreshes(r *placement.Resolver, result string) uint64 {
	return r.Metrics().GetOrCreateCounter(`pinned_placement_refreshes_total{result="` + result + `"}`).Get()
}

// runResolver runs r.Run until the test ends.
func runResolver(t *testing.T, r *placement.Resolver) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait(); r.Close() })
}

// A name asked for inside RefreshAhead of its entry's expiry is re-read in
// the background and stays cached past that expiry; a refresh that finds
// the placement moved (an invalidation was lost: this resolver hears none)
// drops the entry, and the next miss finds the new holder.
func TestRefreshAheadExtendsOrDrops(t *testing.T) {
	e := newEnv(t, "memory")
	sa := e.register(startHost(t, "a", e.fl), 100)
	sb := e.register(startHost(t, "b", e.fl), 100)
	r, err := placement.New(placement.Config{Store: e.mem, Clock: e.fake, Lease: e.lease, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	runResolver(t, r)
	ctx := ctxT(t)
	name := []byte("/counter/hot")
	rt, err := r.Resolve(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	// The entry lives 8 to 10 s (CacheTTL less up to a fifth); refreshes
	// are due from 2.5 s before its end: 7.6 s is inside the window.
	heartbeat := func() { e.heartbeat(sa, 100, false); e.heartbeat(sb, 100, false) }
	e.fake.Advance(7600 * time.Millisecond)
	heartbeat()
	if got, ok := r.Lookup(name, time.Now()); !ok || got != rt {
		t.Fatalf("Lookup in the refresh window = %v, %v; want the cached route", got, ok)
	}
	waitFor(t, "the refresh", func() bool { return refreshes(r, "extended") == 1 })
	misses := r.CacheStats().Misses
	e.fake.Advance(3 * time.Second) // past the first entry's end
	heartbeat()
	if got, ok := r.Lookup(name, time.Now()); !ok || got != rt {
		t.Fatalf("Lookup after the first entry's end = %v, %v; want the refreshed route", got, ok)
	}
	if r.CacheStats().Misses != misses {
		t.Fatal("a refreshed name missed")
	}

	// Move the placement behind the resolver's back.
	other := sb
	if rt.Session.ID == sb {
		other = sa
	}
	if _, err := e.mem.ReplacePlacement(ctx, ns, "hot", rt.Session.ID, other); err != nil {
		t.Fatal(err)
	}
	e.fake.Advance(5 * time.Second) // the refreshed entry's window
	heartbeat()
	if got, ok := r.Lookup(name, time.Now()); !ok || got != rt {
		t.Fatalf("Lookup before the refresh = %v, %v; want the old route, served until its end", got, ok)
	}
	waitFor(t, "the refresh that finds the move", func() bool { return refreshes(r, "changed") == 1 })
	if _, ok := r.Lookup(name, time.Now()); ok {
		t.Fatal("the moved placement's old route is still served after the refresh")
	}
	got, err := r.Resolve(ctx, name)
	if err != nil || got.Session.ID != other {
		t.Fatalf("Resolve after the move = %v, %v; want session %s", got, err, other)
	}
	if n := refreshes(r, "extended"); n != 1 {
		t.Errorf("refreshes extended = %d; want 1", n)
	}
}

// Names found due within one RefreshBatch are refreshed in one batch: a
// request that finds its entry due wakes the batcher only when it starts a
// batch, and every name of the batch is refreshed.
func TestRefreshesGoInBatches(t *testing.T) {
	e := newEnv(t, "memory")
	sa := e.register(startHost(t, "a", e.fl), 1000)
	r, err := placement.New(placement.Config{Store: e.mem, Clock: e.fake, Lease: e.lease, RefreshBatch: 200 * time.Millisecond, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	runResolver(t, r)
	batches := func() uint64 { return r.Metrics().GetOrCreateCounter("pinned_placement_refresh_batches_total").Get() }
	const n = 50
	names := make([][]byte, n)
	for i := range names {
		names[i] = fmt.Appendf(nil, "/counter/b%d", i)
		if _, err := r.Resolve(ctxT(t), names[i]); err != nil {
			t.Fatal(err)
		}
	}
	e.fake.Advance(7600 * time.Millisecond) // every entry is due (see TestRefreshAheadExtendsOrDrops)
	e.heartbeat(sa, 1000, false)
	start := time.Now()
	for _, name := range names {
		if _, ok := r.Lookup(name, time.Now()); !ok {
			t.Fatalf("Lookup(%s) in the refresh window missed", name)
		}
		time.Sleep(time.Millisecond) // requests spread over the batch, as traffic is: not synchronisation
	}
	if time.Since(start) > 180*time.Millisecond {
		t.Skip("the lookups took longer than most of a batch: the machine is too slow to tell batches apart")
	}
	waitFor(t, "the batch's refreshes", func() bool { return refreshes(r, "extended") == n })
	if b := batches(); b != 1 {
		t.Errorf("%d names due within one batch were handed over in %d batches; want 1", n, b)
	}
}

// With RefreshAhead off, an entry expires and its next request misses.
func TestRefreshAheadOff(t *testing.T) {
	e := newEnv(t, "memory")
	sa := e.register(startHost(t, "a", e.fl), 100)
	r, err := placement.New(placement.Config{Store: e.mem, Clock: e.fake, Lease: e.lease, RefreshAhead: -1, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	runResolver(t, r)
	name := []byte("/counter/cold")
	if _, err := r.Resolve(ctxT(t), name); err != nil {
		t.Fatal(err)
	}
	e.fake.Advance(7600 * time.Millisecond)
	e.heartbeat(sa, 100, false)
	if _, ok := r.Lookup(name, time.Now()); !ok {
		t.Fatal("Lookup within the TTL missed")
	}
	e.fake.Advance(3 * time.Second)
	if _, ok := r.Lookup(name, time.Now()); ok {
		t.Fatal("Lookup past the TTL hit with refreshing off")
	}
	if r.CacheStats().Refreshes != 0 {
		t.Fatal("a refresh was handed out with refreshing off")
	}
}

// On Redis, a name requested steadily never misses once warm, across
// several cache lifetimes: its refreshes alternate between a tracked read
// (the client-side cache's entry expired) and a GET past a live
// client-side entry (LookupFresh), and every request is answered.
func TestRefreshAheadOnRedisNeverMisses(t *testing.T) {
	e := newEnv(t, "redis")
	e.lease = 3 * time.Second // entries live 2.4 to 3 s; refreshes are due 0.75 s before
	sa := e.register(startHost(t, "a", e.fl), 100)
	var fresh *freshCounter
	pb := e.pinboard(nil, func(s store.Store) store.Store {
		fresh = &freshCounter{Store: s.(*redisstore.Store)}
		return fresh
	})
	warmAll(t, pb, "r1", "r2")
	misses := pb.res.CacheStats().Misses
	freshBefore := fresh.n.Load()
	start := time.Now()
	lastBeat := start
	for time.Since(start) < 7*time.Second { // more than two cache lifetimes
		for _, id := range []string{"r1", "r2"} {
			if ans := pb.get(t, id); ans.status != 200 {
				t.Fatalf("GET %s = %d %q", id, ans.status, ans.body)
			}
		}
		if time.Since(lastBeat) > 500*time.Millisecond {
			e.heartbeat(sa, 100, false)
			lastBeat = time.Now()
		}
		time.Sleep(20 * time.Millisecond) // the request rate, not synchronisation
	}
	if m := pb.res.CacheStats().Misses - misses; m != 0 {
		t.Errorf("%d misses over 7 s of steady requests; want 0", m)
	}
	if n := refreshes(pb.res, "extended"); n < 4 {
		t.Errorf("%d refreshes extended an entry; want at least 4 (2 names, 2 lifetimes)", n)
	}
	if n := fresh.n.Load() - freshBefore; n == 0 {
		t.Error("no GET past the client-side cache (LookupFresh)")
	}
	for _, res := range []string{"changed", "failed", "dropped"} {
		if n := refreshes(pb.res, res); n != 0 {
			t.Errorf("refreshes %s = %d; want 0", res, n)
		}
	}
}

// freshCounter counts the LookupFresh calls made to a Redis store (Redis's
// command counts cannot tell them from the GETs of tracked reads).
type freshCounter struct {
	*redisstore.Store
	n atomic.Int64
}

func (f *freshCounter) LookupFresh(ctx context.Context, ns, id string) (store.Placement, error) {
	f.n.Add(1)
	return f.Store.LookupFresh(ctx, ns, id)
}
