package placecache

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/testkit/promcheck"
)

func newCache(t *testing.T, cfg Config) *Cache[string] {
	t.Helper()
	c, err := New[string](cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGetPut(t *testing.T) {
	c := newCache(t, Config{})
	name := []byte("/counter/a")
	if _, ok := c.Get(name, c.Now()); ok {
		t.Fatal("Get on an empty cache = ok")
	}
	if !c.Put(name, "s1", c.Begin(name)) {
		t.Fatal("Put refused without an invalidation")
	}
	if v, ok := c.Get(name, c.Now()); !ok || v != "s1" {
		t.Fatalf("Get = %q, %v; want s1, true", v, ok)
	}
	st := c.Stats()
	if st.Hits != 1 || st.Misses != 1 || st.Size != 1 {
		t.Fatalf("Stats = %+v; want 1 hit, 1 miss, size 1", st)
	}
}

// Peek sees what Get sees (including expiry) and counts nothing.
func TestPeek(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	c := newCache(t, Config{TTL: 10 * time.Second, Clock: fc})
	name := []byte("/counter/a")
	if _, ok := c.Peek(name, c.Now()); ok {
		t.Fatal("Peek on an empty cache = ok")
	}
	c.Put(name, "s1", c.Begin(name))
	if v, ok := c.Peek(name, c.Now()); !ok || v != "s1" {
		t.Fatalf("Peek = %q, %v; want s1, true", v, ok)
	}
	fc.Advance(10 * time.Second)
	if _, ok := c.Peek(name, c.Now()); ok {
		t.Fatal("Peek served an entry at its TTL")
	}
	if st := c.Stats(); st.Hits != 0 || st.Misses != 0 {
		t.Fatalf("Stats after Peeks = %+v; want no hit and no miss counted", st)
	}
}

// The second-level-cache race: a value read from the store before an
// invalidation must not be inserted after it.
func TestPutAfterInvalidationIsRefused(t *testing.T) {
	c := newCache(t, Config{})
	name := []byte("/counter/a")
	tok := c.Begin(name)
	// ... the store read happens here; meanwhile the value changes and the
	// invalidation is processed:
	c.Invalidate("/counter/a")
	if c.Put(name, "stale", tok) {
		t.Fatal("Put after an invalidation of its shard was accepted")
	}
	if _, ok := c.Get(name, c.Now()); ok {
		t.Fatal("stale value is cached")
	}
	if c.Stats().RefusedPuts != 1 {
		t.Fatalf("RefusedPuts = %d; want 1", c.Stats().RefusedPuts)
	}

	tok = c.Begin(name)
	c.InvalidateAll()
	if c.Put(name, "stale", tok) {
		t.Fatal("Put after InvalidateAll was accepted")
	}
	if !c.Put(name, "fresh", c.Begin(name)) {
		t.Fatal("Put with a fresh token was refused")
	}
}

func TestInvalidate(t *testing.T) {
	c := newCache(t, Config{})
	for i := 0; i < 100; i++ {
		n := []byte(fmt.Sprintf("/ns/%d", i))
		c.Put(n, "s", c.Begin(n))
	}
	c.Invalidate("/ns/7")
	if _, ok := c.Get([]byte("/ns/7"), c.Now()); ok {
		t.Fatal("invalidated entry still served")
	}
	if _, ok := c.Get([]byte("/ns/8"), c.Now()); !ok {
		t.Fatal("Invalidate dropped another entry")
	}
	c.InvalidateIf([]byte("/ns/8"), func(v string) bool { return v == "other" })
	if _, ok := c.Get([]byte("/ns/8"), c.Now()); !ok {
		t.Fatal("InvalidateIf dropped a non-matching entry")
	}
	c.InvalidateIf([]byte("/ns/8"), func(v string) bool { return v == "s" })
	if _, ok := c.Get([]byte("/ns/8"), c.Now()); ok {
		t.Fatal("InvalidateIf kept a matching entry")
	}
	c.InvalidateAll()
	if n := c.Len(); n != 0 {
		t.Fatalf("Len after InvalidateAll = %d", n)
	}
}

func TestTTL(t *testing.T) {
	fc := clock.NewFake(time.Unix(0, 0))
	c := newCache(t, Config{TTL: 10 * time.Second, Clock: fc})
	name := []byte("/ns/a")
	c.Put(name, "s", c.Begin(name))
	fc.Advance(9 * time.Second)
	if _, ok := c.Get(name, c.Now()); !ok {
		t.Fatal("entry expired before its TTL")
	}
	fc.Advance(time.Second)
	if _, ok := c.Get(name, c.Now()); ok {
		t.Fatal("entry served at its TTL")
	}
	// A suspend counts: the entry must not survive a wall-clock jump past
	// the lease either.
	c.Put(name, "s", c.Begin(name))
	fc.Suspend(time.Minute)
	if _, ok := c.Get(name, c.Now()); ok {
		t.Fatal("entry served after a suspend longer than its TTL")
	}
}

// GetAhead hands out one refresh per entry once the entry is within
// RefreshAhead of its expiry, keeps serving it until then, never serves it
// past its expiry, and hands out the next refresh only for the entry the
// refresh put; an invalidation in flight refuses the refresh's Put.
func TestGetAhead(t *testing.T) {
	fc := clock.NewFake(time.Unix(1000, 0))
	set := metrics.NewSet()
	c := newCache(t, Config{TTL: 10 * time.Second, RefreshAhead: 2 * time.Second, Clock: fc, Metrics: set})
	name := []byte("/ns/a")
	c.Put(name, "s1", c.Begin(name))
	fc.Advance(7999 * time.Millisecond)
	if v, ok, refresh := c.GetAhead(name, c.Now()); !ok || v != "s1" || refresh {
		t.Fatalf("GetAhead before the refresh window = %q, %v, %v; want s1, true, false", v, ok, refresh)
	}
	fc.Advance(time.Millisecond)
	if v, ok, refresh := c.GetAhead(name, c.Now()); !ok || v != "s1" || !refresh {
		t.Fatalf("GetAhead in the refresh window = %q, %v, %v; want s1, true, true", v, ok, refresh)
	}
	for range 3 {
		if _, ok, refresh := c.GetAhead(name, c.Now()); !ok || refresh {
			t.Fatalf("GetAhead after the refresh was handed out = %v, %v; want true, false", ok, refresh)
		}
	}
	// The refresh never happened: the entry expires as usual.
	fc.Advance(2 * time.Second)
	if _, ok, refresh := c.GetAhead(name, c.Now()); ok || refresh {
		t.Fatalf("GetAhead at the TTL = %v, %v; want a miss", ok, refresh)
	}
	// A refresh that completes extends the entry, whose own refresh comes
	// a TTL later.
	c.Put(name, "s1", c.Begin(name))
	fc.Advance(8 * time.Second)
	_, _, refresh := c.GetAhead(name, c.Now())
	if !refresh {
		t.Fatal("no refresh handed out in the window")
	}
	tok := c.Begin(name)
	c.Put(name, "s2", tok)
	fc.Advance(9 * time.Second)
	if v, ok, refresh := c.GetAhead(name, c.Now()); !ok || v != "s2" || !refresh {
		t.Fatalf("GetAhead of the refreshed entry = %q, %v, %v; want s2, true, true", v, ok, refresh)
	}
	// An invalidation between the refresh's Begin and its Put wins.
	tok = c.Begin(name)
	c.Invalidate(string(name))
	if c.Put(name, "stale", tok) {
		t.Fatal("a refresh's Put was accepted after an invalidation")
	}
	if _, ok, _ := c.GetAhead(name, c.Now()); ok {
		t.Fatal("entry served after an invalidation")
	}
	if st := c.Stats(); st.Refreshes != 3 {
		t.Fatalf("Stats.Refreshes = %d; want 3", st.Refreshes)
	}
	var b bytes.Buffer
	set.WritePrometheus(&b)
	if !strings.Contains(b.String(), `pinned_placecache_refreshes_total{cache="placements"} 3`) {
		t.Fatalf("metrics lack the refresh count:\n%s", b.String())
	}
	// Without RefreshAhead, GetAhead never asks for a refresh.
	c0 := newCache(t, Config{TTL: 10 * time.Second, Clock: fc})
	c0.Put(name, "s", c0.Begin(name))
	fc.Advance(9999 * time.Millisecond)
	if _, ok, refresh := c0.GetAhead(name, c0.Now()); !ok || refresh {
		t.Fatalf("GetAhead without RefreshAhead = %v, %v; want true, false", ok, refresh)
	}
}

// PutUntil serves an entry until the lower cache's until or the TTL,
// whichever ends first; a zero until is the TTL.
func TestPutUntil(t *testing.T) {
	fc := clock.NewFake(time.Unix(1000, 0))
	c := newCache(t, Config{TTL: 10 * time.Second, Clock: fc})
	put := func(name string, until time.Time) []byte {
		n := []byte(name)
		if !c.PutUntil(n, "s", c.Begin(n), until) {
			t.Fatalf("PutUntil(%s) refused", name)
		}
		return n
	}
	served := func(n []byte) bool { _, ok := c.Get(n, c.Now()); return ok }
	early := put("/ns/early", fc.Now().Wall().Add(3*time.Second))
	late := put("/ns/late", fc.Now().Wall().Add(time.Minute))
	zero := put("/ns/zero", time.Time{})
	past := put("/ns/past", fc.Now().Wall().Add(-time.Second))
	if served(past) {
		t.Error("an entry whose until had passed was served")
	}
	fc.Advance(2999 * time.Millisecond)
	if !served(early) || !served(late) || !served(zero) {
		t.Fatal("entries expired before their until and TTL")
	}
	fc.Advance(time.Millisecond)
	if served(early) {
		t.Error("entry served at its until, before its TTL")
	}
	fc.Advance(7 * time.Second)
	if served(late) || served(zero) {
		t.Error("entries served at their TTL")
	}
}

func TestBoundedSize(t *testing.T) {
	c := newCache(t, Config{Shards: 4, MaxEntries: 40})
	for i := 0; i < 1000; i++ {
		n := []byte(fmt.Sprintf("/ns/%d", i))
		c.Put(n, "s", c.Begin(n))
	}
	if n := c.Len(); n > 40 {
		t.Fatalf("Len = %d; want ≤ 40", n)
	}
	if c.Stats().Evictions < 960 {
		t.Fatalf("Evictions = %d; want ≥ 960", c.Stats().Evictions)
	}
}

func TestConfig(t *testing.T) {
	if _, err := New[string](Config{Name: "bad name"}); err == nil {
		t.Error("New accepted a metric-breaking name")
	}
	if _, err := New[string](Config{TTL: -1}); err == nil {
		t.Error("New accepted a negative TTL")
	}
	c := newCache(t, Config{Shards: 100})
	if len(c.shards) != 128 {
		t.Errorf("shards = %d; want 128 (next power of two)", len(c.shards))
	}
}

// Concurrent readers, writers and invalidators; the race detector checks the
// locking, and the final check proves an invalidation is never undone by a
// Put whose read began before it.
func TestConcurrent(t *testing.T) {
	c := newCache(t, Config{Shards: 8})
	names := make([][]byte, 64)
	for i := range names {
		names[i] = []byte(fmt.Sprintf("/ns/%d", i))
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				n := names[(i*7+g)%len(names)]
				if _, ok := c.Get(n, c.Now()); !ok {
					c.Put(n, "v", c.Begin(n))
				}
				if i%50 == 0 {
					c.Invalidate(string(n))
				}
			}
		}()
	}
	wg.Wait()
	n := names[0]
	tok := c.Begin(n)
	c.Invalidate(string(n))
	if c.Put(n, "late", tok) {
		t.Fatal("late Put accepted")
	}
}

func TestMetrics(t *testing.T) {
	set := metrics.NewSet()
	c := newCache(t, Config{Name: "sessions", Metrics: set, Shards: 1, MaxEntries: 2})
	n := []byte("s1")
	c.Get(n, c.Now())
	c.Put(n, "x", c.Begin(n))
	c.Get(n, c.Now())
	scrape := func() string {
		var b bytes.Buffer
		set.WritePrometheus(&b)
		promcheck.Parse(t, "placecache metrics", b.Bytes())
		return b.String()
	}
	for _, want := range []string{
		`pinned_placecache_hits_total{cache="sessions"} 1`,
		`pinned_placecache_misses_total{cache="sessions"} 1`,
		`pinned_placecache_entries{cache="sessions"} 1`,
		`pinned_placecache_evictions_total{cache="sessions"} 0`,
		`pinned_placecache_invalidations_total{cache="sessions"} 0`,
		`pinned_placecache_refused_puts_total{cache="sessions"} 0`,
	} {
		if out := scrape(); !strings.Contains(out, want+"\n") {
			t.Errorf("metrics output lacks %q:\n%s", want, out)
		}
	}
	// Beyond MaxEntries an entry is evicted; an invalidation between Begin
	// and Put refuses the Put.
	for _, name := range []string{"s2", "s3"} {
		c.Put([]byte(name), "x", c.Begin([]byte(name)))
	}
	tok := c.Begin([]byte("s4"))
	c.Invalidate("s3")
	c.Put([]byte("s4"), "x", tok)
	for _, want := range []string{
		`pinned_placecache_evictions_total{cache="sessions"} 1`,
		`pinned_placecache_invalidations_total{cache="sessions"} 1`,
		`pinned_placecache_refused_puts_total{cache="sessions"} 1`,
		`pinned_placecache_entries{cache="sessions"} 1`,
	} {
		if out := scrape(); !strings.Contains(out, want+"\n") {
			t.Errorf("metrics output lacks %q:\n%s", want, out)
		}
	}
}

// Entries store their time compactly (see entry): whatever the wall clock
// did before a Put, the entry is served for its TTL and no longer, and a
// later suspend still ends it.
func TestTTLAfterWallSteps(t *testing.T) {
	for _, step := range []time.Duration{
		-1500 * time.Microsecond, // a fraction of a second, back and forth
		700 * time.Millisecond,
		-3 * time.Hour,
		400 * 24 * time.Hour,
		-400 * 24 * time.Hour,
	} {
		t.Run(step.String(), func(t *testing.T) {
			fc := clock.NewFake(time.Unix(1000, 0))
			c := newCache(t, Config{TTL: 10 * time.Second, Clock: fc})
			fc.StepWall(step)
			name := []byte("/ns/a")
			c.Put(name, "s", c.Begin(name))
			fc.Advance(10*time.Second - time.Nanosecond)
			if _, ok := c.Get(name, c.Now()); !ok {
				t.Fatal("entry expired before its TTL")
			}
			fc.Advance(time.Nanosecond)
			if _, ok := c.Get(name, c.Now()); ok {
				t.Fatal("entry served at its TTL")
			}
			c.Put(name, "s", c.Begin(name))
			fc.Suspend(11 * time.Second)
			if _, ok := c.Get(name, c.Now()); ok {
				t.Fatal("entry served after a suspend longer than its TTL")
			}
		})
	}
}

// A name whose key (its first hash) holds another name's entry misses:
// the second hash tells them apart, so a collision can never route one id
// by another's placement. Two names with one 64-bit key cannot be found
// by search, so the test plants the other name's entry under the key.
func TestKeyCollisionIsAMiss(t *testing.T) {
	c := newCache(t, Config{RefreshAhead: time.Second})
	a, b := []byte("/ns/a"), []byte("/ns/b")
	c.Put(a, "route of a", c.Begin(a))
	ha, _, sa := c.key(a)
	hb, _, sb := c.key(b)
	sa.mu.Lock()
	ea, _ := sa.m.get(tableKey(ha))
	sa.mu.Unlock()
	sb.mu.Lock()
	sb.m.put(tableKey(hb), ea) // b's key now holds a's entry
	sb.mu.Unlock()
	now := c.Now()
	if v, ok := c.Get(b, now); ok {
		t.Fatalf("Get(b) = %q from a's entry", v)
	}
	if v, ok := c.Peek(b, now); ok {
		t.Fatalf("Peek(b) = %q from a's entry", v)
	}
	if v, ok, _ := c.GetAhead(b, now); ok {
		t.Fatalf("GetAhead(b) = %q from a's entry", v)
	}
	c.InvalidateIf(b, func(string) bool { return true })
	sb.mu.Lock()
	kept := sb.m.has(tableKey(hb))
	sb.mu.Unlock()
	if !kept {
		t.Error("InvalidateIf(b) dropped a's entry")
	}
	if v, ok := c.Get(a, now); !ok || v != "route of a" {
		t.Fatalf("Get(a) = %q, %v", v, ok)
	}
}
