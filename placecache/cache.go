package placecache

import (
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math/bits"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/clock"
)

// Defaults for Config's zero values.
const (
	DefaultShards     = 256
	DefaultMaxEntries = 1 << 20
	DefaultTTL        = 10 * time.Second
)

// Config configures a Cache. The zero value is valid.
type Config struct {
	// Name labels this cache's metrics: pinned_placecache_*{cache="<Name>"}.
	// It must be a plain identifier. Default "placements".
	Name string
	// Shards is the number of independently locked shards, rounded up to a
	// power of two. Default DefaultShards.
	Shards int
	// MaxEntries bounds the number of entries. Default DefaultMaxEntries.
	MaxEntries int
	// TTL is how long an entry may be served without being re-read, the
	// safety net against a lost invalidation. Keep it ≤ the lease. Default
	// DefaultTTL.
	TTL time.Duration
	// Clock defaults to clock.Real.
	Clock clock.Clock
	// RefreshAhead, when positive, is how long before its expiry an entry
	// counts as due for a refresh: GetAhead then tells one caller per entry
	// to re-read it (see GetAhead). Zero: never (GetAhead is Get).
	RefreshAhead time.Duration
	// Metrics, when set, receives hits, misses, invalidations, evictions,
	// refused puts, refreshes and size.
	Metrics *metrics.Set
}

// Cache maps names to values of type V. It is safe for concurrent use.
type Cache[V any] struct {
	name string
	// seed hashes a name into its key (and its shard: the key's low
	// bits); check hashes it into entry.check. See "Keys" in the package
	// documentation.
	seed, check maphash.Seed
	// base is the Instant entries' times are stored relative to.
	base     clock.Instant
	shards   []shard[V]
	mask     uint64
	perShard int
	ttl      time.Duration
	clock    clock.Clock
	// ahead is Config.RefreshAhead. due holds, per slot (names hashed
	// into it), the stamp of the entry whose refresh GetAhead last handed
	// out: one refresh per entry, lock-free; a collision of two names only
	// costs one of them its refresh (its entry then expires as without).
	ahead time.Duration
	due   []atomic.Uint64
}

// entry is one cached value: 24 bytes besides V (16 for the proxy's route).
type entry[V any] struct {
	v V
	// mono and wall are the entry's time (its Put, or earlier for
	// PutUntil), nanoseconds after the cache's base on either scale.
	mono, wall int64
	check      uint64 // the name's second hash: another name's entry under the same key is a miss
}

// shard is padded so that two shards' hot fields never share a cache line.
type shard[V any] struct {
	mu  sync.RWMutex
	m   table[entry[V]] // keyed by the name's hash (Cache.seed)
	seq uint64          // guarded by mu; bumped by every invalidation of the shard

	hits, misses, invalidations, evictions, refused, refreshes atomic.Uint64
	_                                                          [64]byte
}

// Token is captured by Begin before a store read and handed to Put.
type Token struct {
	shard uint32
	seq   uint64
}

// New returns an empty cache.
func New[V any](cfg Config) (*Cache[V], error) {
	if cfg.Name == "" {
		cfg.Name = "placements"
	}
	for _, r := range cfg.Name {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return nil, fmt.Errorf("placecache: Config.Name %q must be letters, digits and '_'", cfg.Name)
		}
	}
	if cfg.Shards < 0 || cfg.MaxEntries < 0 || cfg.TTL < 0 || cfg.RefreshAhead < 0 {
		return nil, errors.New("placecache: Config.Shards, MaxEntries, TTL and RefreshAhead must not be negative")
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultShards
	}
	n := 1 << bits.Len(uint(cfg.Shards-1))
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	c := &Cache[V]{
		name:     cfg.Name,
		seed:     maphash.MakeSeed(),
		check:    maphash.MakeSeed(),
		shards:   make([]shard[V], n),
		mask:     uint64(n - 1),
		perShard: max(1, (cfg.MaxEntries+n-1)/n),
		ttl:      cfg.TTL,
		clock:    clock.Or(cfg.Clock),
		ahead:    cfg.RefreshAhead,
	}
	c.base = c.clock.Now()
	if pointerFree(reflect.TypeFor[entry[V]]()) {
		for i := range c.shards {
			c.shards[i].m.offHeap = true
		}
		// The shards (not c: a cleanup must not keep its object alive)
		// unmap their slots once the cache is unreachable.
		runtime.AddCleanup(c, releaseShards[V], c.shards)
	}
	if c.ahead > 0 {
		c.due = make([]atomic.Uint64, dueSlots)
	}
	if cfg.Metrics != nil {
		cfg.Metrics.RegisterMetricsWriter(c.writeMetrics)
	}
	return c, nil
}

// releaseShards gives back every shard's slots; the cleanup of a cache
// nothing can reach any more.
func releaseShards[V any](shards []shard[V]) {
	for i := range shards {
		s := &shards[i]
		s.mu.Lock()
		s.m.release()
		s.mu.Unlock()
	}
}

// dueSlots is the size of the refresh table (Config.RefreshAhead): 64 KiB.
const dueSlots = 1 << 13

// key returns name's key, the index of its shard, and the shard.
func (c *Cache[V]) key(name []byte) (uint64, uint32, *shard[V]) {
	h := maphash.Bytes(c.seed, name)
	i := uint32(h & c.mask)
	return h, i, &c.shards[i]
}

// checkOf is name's second hash, kept in its entry.
func (c *Cache[V]) checkOf(name []byte) uint64 {
	return maphash.Bytes(c.check, name)
}

// at is the time e was stored at (see entry).
func (c *Cache[V]) at(e *entry[V]) clock.Instant {
	return c.base.Join(time.Duration(e.mono), time.Duration(e.wall))
}

// stamped returns an entry of v stored at at.
func (c *Cache[V]) stamped(v V, check uint64, at clock.Instant) entry[V] {
	mono, wall := at.Split(c.base)
	return entry[V]{v: v, mono: int64(mono), wall: int64(wall), check: check}
}

// Now reads the cache's clock. Callers that already hold a fresh reading
// (the proxy has fasthttp's per-request time) pass theirs to Get instead:
// on some virtual machines a clock read costs more than the whole lookup.
func (c *Cache[V]) Now() clock.Instant { return c.clock.Now() }

// Get returns the value cached for name, if it is present and younger than
// the TTL at now. It does not allocate.
func (c *Cache[V]) Get(name []byte, now clock.Instant) (V, bool) {
	v, ok, s := c.lookup(name, now)
	if ok {
		s.hits.Add(1)
	} else {
		s.misses.Add(1)
	}
	return v, ok
}

// GetAhead is Get that also reports, for a live entry within
// Config.RefreshAhead of its expiry, whether this caller should refresh it:
// re-read the store in the background (never on the request's path) and
// Put what it read, with a token from Begin taken before that read, as for
// a miss. The entry keeps being served meanwhile, until its expiry at the
// latest, so names asked for at least once per RefreshAhead never miss.
// Of the callers that see an entry due, one is told to refresh it (rarely
// none, when two names share a slot of the refresh table). It does not
// allocate.
func (c *Cache[V]) GetAhead(name []byte, now clock.Instant) (v V, ok, refresh bool) {
	// lookup's read, inlined here: this is the proxy's per-request call,
	// and sharing one helper that returns the hash as well cost it ~10 ns
	// (BenchmarkGetAheadHit).
	h := maphash.Bytes(c.seed, name)
	s := &c.shards[h&c.mask]
	s.mu.RLock()
	e, found := s.m.get(tableKey(h))
	s.mu.RUnlock()
	if !found || e.check != c.checkOf(name) {
		s.misses.Add(1)
		return v, false, false
	}
	age := now.Sub(c.at(&e))
	if age >= c.ttl {
		s.misses.Add(1)
		return v, false, false
	}
	s.hits.Add(1)
	if c.ahead <= 0 || age < c.ttl-c.ahead {
		return e.v, true, false
	}
	// The stamp names this entry: a refreshed entry has another at.
	stamp := (h ^ uint64(e.mono)) | 1
	slot := &c.due[(h>>32)&(dueSlots-1)]
	if old := slot.Load(); old == stamp || !slot.CompareAndSwap(old, stamp) {
		return e.v, true, false
	}
	s.refreshes.Add(1)
	return e.v, true, true
}

// Peek is Get without counting a hit or a miss: a second look at a name
// whose Get just missed (another caller may have filled it since) must not
// count that request twice. It does not allocate.
func (c *Cache[V]) Peek(name []byte, now clock.Instant) (V, bool) {
	v, ok, _ := c.lookup(name, now)
	return v, ok
}

// lookup is Get's and Peek's read: the live value of name, and its shard.
func (c *Cache[V]) lookup(name []byte, now clock.Instant) (V, bool, *shard[V]) {
	h, _, s := c.key(name)
	s.mu.RLock()
	e, ok := s.m.get(tableKey(h))
	s.mu.RUnlock()
	if ok && e.check == c.checkOf(name) && now.Sub(c.at(&e)) < c.ttl {
		return e.v, true, s
	}
	var zero V
	return zero, false, s
}

// Begin captures the shard's invalidation sequence for name. Call it before
// reading the store, and pass the token to Put.
func (c *Cache[V]) Begin(name []byte) Token {
	_, i, s := c.key(name)
	s.mu.RLock()
	seq := s.seq
	s.mu.RUnlock()
	return Token{shard: i, seq: seq}
}

// Put caches v for name unless the shard was invalidated since t was taken
// by Begin; it reports whether v was stored.
func (c *Cache[V]) Put(name []byte, v V, t Token) bool {
	return c.PutUntil(name, v, t, time.Time{})
}

// PutUntil is Put for a value that a cache below this one (the store's
// client-side cache) serves only until the wall-clock time until: the entry
// is then served until that time or for the TTL, whichever ends first. A
// zero until is Put.
func (c *Cache[V]) PutUntil(name []byte, v V, t Token, until time.Time) bool {
	h, i, s := c.key(name)
	if i != t.shard {
		panic("placecache: Put with a token from another name")
	}
	now := c.clock.Now()
	at := now
	if !until.IsZero() {
		// Age the entry so that it expires at until: Get serves an entry
		// while now - at < ttl.
		if left := until.Sub(now.Wall()); left < c.ttl {
			at = now.Add(max(left, 0) - c.ttl)
		}
	}
	e, k := c.stamped(v, c.checkOf(name), at), tableKey(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seq != t.seq {
		s.refused.Add(1)
		return false
	}
	if s.m.n >= c.perShard && !s.m.has(k) {
		c.evictLocked(s, k, now)
	}
	s.m.put(k, e)
	return true
}

// evictLocked removes one entry: an expired one among the first few near
// the home of k (the key being inserted, so a position as random as the
// hash), else the first of them.
func (c *Cache[V]) evictLocked(s *shard[V], k uint64, now clock.Instant) {
	const probes = 8
	if s.m.evictNear(k, probes, func(e *entry[V]) bool { return now.Sub(c.at(e)) >= c.ttl }) {
		s.evictions.Add(1)
	}
}

// Invalidate drops name and refuses every in-flight Put into its shard.
func (c *Cache[V]) Invalidate(name string) {
	h := maphash.String(c.seed, name)
	s := &c.shards[h&c.mask]
	s.mu.Lock()
	s.seq++
	// An entry of another name under the same key goes too: a cache may
	// always forget.
	s.m.del(tableKey(h))
	s.mu.Unlock()
	s.invalidations.Add(1)
}

// InvalidateIf drops name only while its cached value satisfies match (for
// example: still points at the endpoint that just refused the request), and
// refuses in-flight Puts into its shard either way.
func (c *Cache[V]) InvalidateIf(name []byte, match func(V) bool) {
	h, _, s := c.key(name)
	check := c.checkOf(name)
	s.mu.Lock()
	s.seq++
	if e, ok := s.m.get(tableKey(h)); ok && e.check == check && match(e.v) {
		s.m.del(tableKey(h))
	}
	s.mu.Unlock()
	s.invalidations.Add(1)
}

// InvalidateAll drops everything and refuses every in-flight Put.
func (c *Cache[V]) InvalidateAll() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.seq++
		s.m.clear()
		s.mu.Unlock()
		s.invalidations.Add(1)
	}
}

// Len returns the number of cached entries (expired ones not yet replaced
// included).
func (c *Cache[V]) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += s.m.n
		s.mu.RUnlock()
	}
	return n
}

// Stats is a snapshot of the cache's counters.
type Stats struct {
	Hits, Misses, Invalidations, Evictions, RefusedPuts uint64
	// Refreshes counts the refreshes GetAhead handed out.
	Refreshes uint64
	Size      int
	// TableBytes is the size of the shards' slot arrays (outside the Go
	// heap when the values hold no pointers: see "Memory" in the package
	// documentation), what the entries cost besides their values'
	// pointees.
	TableBytes uint64
}

// Stats sums the per-shard counters.
func (c *Cache[V]) Stats() Stats {
	var st Stats
	for i := range c.shards {
		s := &c.shards[i]
		st.Hits += s.hits.Load()
		st.Misses += s.misses.Load()
		st.Invalidations += s.invalidations.Load()
		st.Evictions += s.evictions.Load()
		st.RefusedPuts += s.refused.Load()
		st.Refreshes += s.refreshes.Load()
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		st.Size += s.m.n
		st.TableBytes += slotsBytes[entry[V]](len(s.m.slots))
		s.mu.RUnlock()
	}
	return st
}

func (c *Cache[V]) writeMetrics(w io.Writer) {
	st := c.Stats()
	l := `{cache="` + c.name + `"}`
	metrics.WriteCounterUint64(w, "pinned_placecache_hits_total"+l, st.Hits)
	metrics.WriteCounterUint64(w, "pinned_placecache_misses_total"+l, st.Misses)
	metrics.WriteCounterUint64(w, "pinned_placecache_invalidations_total"+l, st.Invalidations)
	metrics.WriteCounterUint64(w, "pinned_placecache_evictions_total"+l, st.Evictions)
	metrics.WriteCounterUint64(w, "pinned_placecache_refused_puts_total"+l, st.RefusedPuts)
	metrics.WriteCounterUint64(w, "pinned_placecache_refreshes_total"+l, st.Refreshes)
	metrics.WriteGaugeUint64(w, "pinned_placecache_entries"+l, uint64(st.Size))
	metrics.WriteGaugeUint64(w, "pinned_placecache_table_bytes"+l, st.TableBytes)
}
