package placecache

import "math/bits"

// table is a shard's hash table: open addressing with linear probing and
// Robin Hood displacement, keyed by a name's 64-bit hash. It exists for
// memory: a Go map of the same slots sits between 7/16 and 7/8 full (at a
// million entries over 256 shards, just past a doubling, under half), so a
// slot of 40 bytes cost about 100 bytes per entry. This table grows by a
// quarter and keeps between maxLoad/growth and maxLoad of its slots full
// (0.70 to 0.875), and Robin Hood placement keeps probes short at that load.
// Positions come from the key's high bits (multiply-shift, any table size);
// the shard was chosen by its low bits.
//
// Invariants: key 0 marks an empty slot (a hash of 0 is stored as 1: the
// key is a cache's, so two names sharing one is a collision the entry's
// check resolves); every entry lies at or after its home position, and no
// entry is further from its home than the entry before it is from its own
// plus one (the Robin Hood order), which lets a lookup stop at the first
// entry nearer its home than the probe is long. Not safe for concurrent
// use: the shard's lock guards it.
type table[E any] struct {
	slots []slot[E]
	n     int
	// offHeap: E holds no pointers, so large slot arrays may be mapped
	// outside the heap (slots.go); mapped: the current one is.
	offHeap, mapped bool
}

type slot[E any] struct {
	key uint64
	e   E
}

const (
	// A table grows when an insert would make it fuller than
	// maxLoadNum/maxLoadDen, to growthNum/growthDen of its size.
	maxLoadNum, maxLoadDen = 7, 8
	growthNum, growthDen   = 5, 4
	minSlots               = 8
)

// tableKey maps a hash to a key (0 is the empty slot).
func tableKey(h uint64) uint64 { return max(h, 1) }

func (t *table[E]) home(key uint64) int {
	hi, _ := bits.Mul64(key, uint64(len(t.slots)))
	return int(hi)
}

// dist is how far the entry at i lies from its home.
func (t *table[E]) dist(i int) int {
	d := i - t.home(t.slots[i].key)
	if d < 0 {
		d += len(t.slots)
	}
	return d
}

// find returns the index of key's slot, or -1.
func (t *table[E]) find(key uint64) int {
	size := len(t.slots)
	if size == 0 {
		return -1
	}
	i := t.home(key)
	for d := 0; ; d++ {
		k := t.slots[i].key
		if k == key {
			return i
		}
		if k == 0 || t.dist(i) < d {
			return -1
		}
		if i++; i == size {
			i = 0
		}
	}
}

// get returns key's entry.
func (t *table[E]) get(key uint64) (E, bool) {
	if i := t.find(key); i >= 0 {
		return t.slots[i].e, true
	}
	var zero E
	return zero, false
}

// has reports whether key is present.
func (t *table[E]) has(key uint64) bool { return t.find(key) >= 0 }

// put stores e under key, replacing an entry already there.
func (t *table[E]) put(key uint64, e E) {
	if i := t.find(key); i >= 0 {
		t.slots[i].e = e
		return
	}
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		t.grow()
	}
	t.insert(slot[E]{key, e})
	t.n++
}

// insert places s, known absent, displacing entries nearer their home.
func (t *table[E]) insert(s slot[E]) {
	size := len(t.slots)
	i := t.home(s.key)
	for d := 0; ; d++ {
		cur := &t.slots[i]
		if cur.key == 0 {
			*cur = s
			return
		}
		if cd := t.dist(i); cd < d {
			*cur, s = s, *cur
			d = cd
		}
		if i++; i == size {
			i = 0
		}
	}
}

func (t *table[E]) grow() {
	old, oldMapped := t.slots, t.mapped
	t.slots, t.mapped = newSlots[E](max(minSlots, len(old)*growthNum/growthDen+1), t.offHeap)
	for _, s := range old {
		if s.key != 0 {
			t.insert(s)
		}
	}
	if oldMapped {
		unmapSlots(old)
	}
}

// release gives the table's slots back (to the system when mapped) and
// leaves it empty and usable.
func (t *table[E]) release() {
	if t.mapped {
		unmapSlots(t.slots)
	}
	t.slots, t.n, t.mapped = nil, 0, false
}

// del removes key's entry, if any.
func (t *table[E]) del(key uint64) {
	if i := t.find(key); i >= 0 {
		t.removeAt(i)
	}
}

// removeAt empties slot i and shifts the run after it back by one.
func (t *table[E]) removeAt(i int) {
	size := len(t.slots)
	for {
		j := i + 1
		if j == size {
			j = 0
		}
		if t.slots[j].key == 0 || t.dist(j) == 0 {
			break
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = slot[E]{}
	t.n--
}

// evictNear removes one entry among the first probes occupied slots from
// the home of k: the first for which stale reports true, else the first of
// them. It reports whether it removed one (false only when empty).
func (t *table[E]) evictNear(k uint64, probes int, stale func(*E) bool) bool {
	victim, seen := -1, 0
	for i, left := t.home(k), len(t.slots); left > 0 && seen < probes; left-- {
		if t.slots[i].key != 0 {
			if victim < 0 {
				victim = i
			}
			if stale(&t.slots[i].e) {
				victim = i
				break
			}
			seen++
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
	if victim < 0 {
		return false
	}
	t.removeAt(victim)
	return true
}

// clear empties the table and keeps its slots.
func (t *table[E]) clear() {
	clear(t.slots)
	t.n = 0
}
