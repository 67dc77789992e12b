package redisstore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// placementInvalidations records the placement invalidations a store
// reports.
type placementInvalidations struct {
	mu  sync.Mutex
	got map[string]int
}

func (p *placementInvalidations) record(inv store.Invalidation) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if inv.Placement != "" {
		p.got[inv.Placement]++
	}
}

func (p *placementInvalidations) count(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[name]
}

// waitCount waits (bounded) until name was invalidated n times.
func (p *placementInvalidations) waitCount(t *testing.T, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.count(name) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s invalidated %d times within 5 s; want %d", name, p.count(name), n)
		}
		time.Sleep(5 * time.Millisecond) // the push arrives on the store's connection
	}
}

// openOneConn opens a store whose commands all share one Redis connection,
// so that a Ping returns only after every push Redis sent the store before
// answering it: a barrier after which "no invalidation arrived" is a fact.
func openOneConn(t *testing.T, cfg Config) *Store {
	t.Helper()
	s := openWith(t, cfg, func(o *rueidis.ClientOption) { o.PipelineMultiplex = -1 }) // one pipe
	t.Cleanup(s.Close)
	return s
}

// trackedKeys reads INFO stats tracking_total_keys: the keys some client
// tracks.
func trackedKeys(t *testing.T, adm rueidis.Client) int64 {
	t.Helper()
	return infoInt(t, adm, "stats", "tracking_total_keys")
}

// LookupOrClaim leaves the placement tracked for its caller, so that a
// later change by anyone reaches OnInvalidate (the resolver caches the
// answer), without telling the caller of its own claim (which would drop
// the route it just cached and cost the next request a second miss): for
// a claim and for an existing placement; still tracked when the script had
// to load itself again (NOSCRIPT: sent again by EVAL, in the same shape).
// Only the placement is tracked, not the epoch counter or the index the
// script also touches.
func TestLookupOrClaimTracksWithoutTellingItself(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	inv := &placementInvalidations{got: map[string]int{}}
	s := openOneConn(t, Config{URL: srv.URL, Options: store.Options{OnInvalidate: inv.record}})
	ctx := context.Background()
	barrier := func() {
		t.Helper()
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// later: at most told invalidations for the call itself, then one for
	// a change by another client (DEL).
	later := func(id string, told int) {
		t.Helper()
		name := wire.PlacementName("/n", id)
		barrier()
		n := inv.count(name)
		if n > told {
			t.Fatalf("%s: the caller was told %d times of its own call; want at most %d", id, n, told)
		}
		if err := adm.Do(ctx, adm.B().Del().Key(wire.KeyPlacement("/n", id)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		inv.waitCount(t, name, n+1)
	}
	if _, _, err := s.LookupOrClaim(ctx, "/n", "warm", "s1"); err != nil { // loads the script
		t.Fatal(err)
	}

	base := trackedKeys(t, adm)
	p, claimed, err := s.LookupOrClaim(ctx, "/n", "x", "s1")
	if err != nil || !claimed || p.Session != "s1" || p.Epoch == 0 {
		t.Fatalf("LookupOrClaim of a new id = %+v, %v, %v; want claimed by s1", p, claimed, err)
	}
	if n := trackedKeys(t, adm) - base; n != 1 {
		t.Errorf("a claim left %d more keys tracked; want 1 (the placement, not its epoch counter or the index)", n)
	}
	later("x", 0)

	if err := adm.Do(ctx, adm.B().Set().Key(wire.KeyPlacement("/n", "y")).Value(wire.FormatPlacement(7, 1, "s2")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	p, claimed, err = s.LookupOrClaim(ctx, "/n", "y", "s1")
	if err != nil || claimed || p.Session != "s2" || p.Epoch != 7 {
		t.Fatalf("LookupOrClaim of a placed id = %+v, %v, %v; want s2's epoch 7, not claimed", p, claimed, err)
	}
	if c, _ := s.PlacementCounts(ctx, "s1", []string{"/n"}); c["/n"] != 2 {
		t.Errorf("PlacementCounts(s1) = %v; want /n: 2 (warm and x, which the DEL left indexed; finding y indexes nothing)", c)
	}
	later("y", 0)

	if err := adm.Do(ctx, adm.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if p, claimed, err := s.LookupOrClaim(ctx, "/n", "z", "s1"); err != nil || !claimed || p.Session != "s1" {
		t.Fatalf("LookupOrClaim after SCRIPT FLUSH = %+v, %v, %v; want claimed by s1", p, claimed, err)
	}
	// The attempt that met NOSCRIPT read the key (tracked) before the
	// script ran again and wrote it: that once, the caller hears of its
	// own write.
	later("z", 1)
}

// With the restart fence up, LookupOrClaim still answers an existing
// placement (only writes wait) and refuses to claim a new one, writing
// nothing, index included.
func TestLookupOrClaimUnderTheFence(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Config{URL: srv.URL, RestartFence: time.Hour})
	defer s.Close()
	adm := admin(t, srv)
	ctx := context.Background()
	if err := adm.Do(ctx, adm.B().Set().Key(wire.KeyPlacement("/n", "b")).Value(wire.FormatPlacement(3, 1, "old")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if p, claimed, err := s.LookupOrClaim(ctx, "/n", "b", "s1"); err != nil || claimed || p.Session != "old" || p.Epoch != 3 {
		t.Fatalf("LookupOrClaim of a placed id under the fence = %+v, %v, %v; want old's, not claimed", p, claimed, err)
	}
	if _, _, err := s.LookupOrClaim(ctx, "/n", "a", "s1"); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, ErrRestartFence) {
		t.Fatalf("LookupOrClaim of a new id under the fence: err = %v; want ErrUnavailable and ErrRestartFence", err)
	}
	if n, err := adm.Do(ctx, adm.B().Exists().Key(wire.KeyPlacement("/n", "a"), wire.KeyEpoch("/n", "a"), wire.KeyOwned("s1")).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("a fenced LookupOrClaim wrote %d keys (%v); want none", n, err)
	}
}
