package placecache

import (
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// The table agrees with a Go map through random puts, replacements and
// deletes, with keys drawn from a small range so that runs collide, wrap
// around the end of the slots and shift back on delete; after every step
// the Robin Hood order holds and every key the model has is found.
func TestTableAgainstMap(t *testing.T) {
	for seed := range uint64(8) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var tb table[int]
		model := map[uint64]int{}
		// Keys spread over the whole 64-bit range (positions come from the
		// high bits), few enough to repeat.
		keys := make([]uint64, 300)
		for i := range keys {
			keys[i] = tableKey(rng.Uint64())
		}
		for step := range 5000 {
			k := keys[rng.IntN(len(keys))]
			switch op := rng.IntN(10); {
			case op < 6:
				tb.put(k, step)
				model[k] = step
			case op < 9:
				tb.del(k)
				delete(model, k)
			default:
				if rng.IntN(50) == 0 {
					tb.clear()
					clear(model)
				}
			}
			if tb.n != len(model) {
				t.Fatalf("seed %d step %d: n = %d; model has %d", seed, step, tb.n, len(model))
			}
			if tb.n*maxLoadDen > len(tb.slots)*maxLoadNum {
				t.Fatalf("seed %d step %d: %d entries in %d slots", seed, step, tb.n, len(tb.slots))
			}
			checkRobinHood(t, &tb)
			for _, k := range keys {
				v, ok := tb.get(k)
				if mv, mok := model[k]; ok != mok || v != mv {
					t.Fatalf("seed %d step %d: get(%x) = %d, %v; model %d, %v", seed, step, k, v, ok, mv, mok)
				}
			}
		}
	}
}

// checkRobinHood verifies the order find relies on: walking any run of
// occupied slots, an entry is at most one further from its home than the
// entry before it.
func checkRobinHood(t *testing.T, tb *table[int]) {
	t.Helper()
	size := len(tb.slots)
	occupied := 0
	for i := range size {
		if tb.slots[i].key == 0 {
			continue
		}
		occupied++
		prev := i - 1
		if prev < 0 {
			prev = size - 1
		}
		d := tb.dist(i)
		if tb.slots[prev].key == 0 {
			if d != 0 {
				t.Fatalf("slot %d: first of a run but %d from its home", i, d)
			}
		} else if pd := tb.dist(prev); d > pd+1 {
			t.Fatalf("slot %d: %d from its home after one %d from its own", i, d, pd)
		}
	}
	if occupied != tb.n {
		t.Fatalf("%d slots occupied; n = %d", occupied, tb.n)
	}
}

func TestPointerFree(t *testing.T) {
	type flat struct {
		a uint64
		b [3]int32
		c struct{ d bool }
	}
	type withPtr struct {
		a uint64
		p *int
	}
	for _, tc := range []struct {
		v    any
		want bool
	}{
		{uint64(0), true}, {flat{}, true}, {[0]*int{}, true}, {entry[flat]{}, true},
		{withPtr{}, false}, {"", false}, {[]int(nil), false}, {map[int]int(nil), false},
		{[2]*int{}, false}, {struct{ f func() }{}, false}, {entry[*int]{}, false},
	} {
		if got := pointerFree(reflect.TypeOf(tc.v)); got != tc.want {
			t.Errorf("pointerFree(%T) = %v; want %v", tc.v, got, tc.want)
		}
	}
}

// TestTablesLiveOffHeap checks that a cache of pointer-free values keeps
// its large tables outside the heap (and a cache of pointers inside), and
// that a grown table gave its old array back: the mapped bytes are the
// tables' size, not the sum of every size they had.
func TestTablesLiveOffHeap(t *testing.T) {
	const n = 1 << 17
	type handleRoute struct{ session, epoch uint64 }
	c, err := New[handleRoute](Config{Shards: 4, MaxEntries: 2 * n})
	if err != nil {
		t.Fatal(err)
	}
	before := liveHeap()
	mappedBefore := mappedBytes(t)
	buf := make([]byte, 0, 32)
	for i := range n {
		buf = fmt.Appendf(buf[:0], "/counter/id-%08d", i)
		c.Put(buf, handleRoute{1, uint64(i)}, c.Begin(buf))
	}
	st := c.Stats()
	if st.Size != n {
		t.Fatalf("Size = %d; want %d", st.Size, n)
	}
	if min := uint64(n) * uint64(unsafe.Sizeof(slot[entry[handleRoute]]{})); st.TableBytes < min {
		t.Fatalf("TableBytes = %d; want at least %d", st.TableBytes, min)
	}
	heap := int64(liveHeap()) - int64(before)
	if heap > int64(st.TableBytes)/8 {
		t.Errorf("the heap grew by %d bytes for %d bytes of tables: they are not off the heap", heap, st.TableBytes)
	}
	for i := range c.shards {
		if tb := &c.shards[i].m; !tb.offHeap || !tb.mapped {
			t.Fatalf("shard %d: offHeap %v, mapped %v; want both", i, tb.offHeap, tb.mapped)
		}
	}
	mapped := int64(mappedBytes(t)) - int64(mappedBefore)
	if raceEnabled {
		t.Logf("anonymous mappings grew by %d bytes for %d bytes of tables (not checked under the race detector)", mapped, st.TableBytes)
	} else if lo, hi := int64(st.TableBytes)/2, int64(st.TableBytes)*3/2; mapped < lo || mapped > hi {
		t.Errorf("anonymous mappings grew by %d bytes for %d bytes of tables: outgrown tables were not unmapped", mapped, st.TableBytes)
	}
	runtime.KeepAlive(c)

	p, err := New[*int](Config{Shards: 1, MaxEntries: 2 * n})
	if err != nil {
		t.Fatal(err)
	}
	x := new(int)
	for i := range 1 << 13 {
		buf = fmt.Appendf(buf[:0], "/counter/id-%08d", i)
		p.Put(buf, x, p.Begin(buf))
	}
	if tb := &p.shards[0].m; tb.offHeap || tb.mapped {
		t.Fatalf("a cache of pointers: offHeap %v, mapped %v; want neither", tb.offHeap, tb.mapped)
	}
}

// mappedBytes is the size of the process's anonymous private mappings
// (the Go heap's arenas included) as /proc/self/smaps_rollup counts
// anonymous memory in use.
func mappedBytes(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		t.Skipf("no /proc/self/smaps_rollup: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "Anonymous:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no Anonymous: line in /proc/self/smaps_rollup")
	return 0
}
