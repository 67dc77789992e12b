package placecache

import (
	"math/rand/v2"
	"testing"
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
