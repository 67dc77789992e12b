package placecache

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
)

func BenchmarkGetHitParallel(b *testing.B) {
	c, _ := New[string](Config{})
	names := filled(c)
	var next atomic.Uint32
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1)) * 101
		now := c.Now() // the proxy passes fasthttp's per-request time
		for pb.Next() {
			if _, ok := c.Get(names[i%len(names)], now); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
}

func BenchmarkMissAndFill(b *testing.B) {
	c, _ := New[string](Config{MaxEntries: 1 << 16})
	names := make([][]byte, 1<<17)
	for i := range names {
		names[i] = []byte(fmt.Sprintf("/counter/id-%d", i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		n := names[i%len(names)]
		if _, ok := c.Get(n, c.Now()); !ok {
			c.Put(n, "session", c.Begin(n))
		}
	}
}

// filled puts 1024 names into c and returns them.
func filled(c *Cache[string]) [][]byte {
	names := make([][]byte, 1024)
	for i := range names {
		names[i] = []byte(fmt.Sprintf("/counter/id-%d", i))
		c.Put(names[i], "session", c.Begin(names[i]))
	}
	return names
}

func BenchmarkGetHit(b *testing.B) {
	c, _ := New[string](Config{})
	names := filled(c)
	now := c.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok := c.Get(names[i%len(names)], now); !ok {
			b.Fatal("miss")
		}
	}
}

// BenchmarkGetAheadHit is BenchmarkGetHit through GetAhead, refreshing on:
// (fresh) entries not due, and (due) every entry within RefreshAhead, its
// refresh handed out already (the refresh table's load and compare).
func BenchmarkGetAheadHit(b *testing.B) {
	for _, due := range []bool{false, true} {
		b.Run(fmt.Sprintf("due=%v", due), func(b *testing.B) {
			c, _ := New[string](Config{RefreshAhead: DefaultTTL / 4})
			if due {
				c, _ = New[string](Config{RefreshAhead: DefaultTTL})
			}
			names := filled(c)
			now := c.Now()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, ok, _ := c.GetAhead(names[i%len(names)], now); !ok {
					b.Fatal("miss")
				}
			}
		})
	}
}

// BenchmarkEntryMemory reports the heap a cached placement costs: the live
// heap after filling a cache of proxy-sized values (a pointer and an
// epoch, as proxy.Route) with n names, divided by n. The names are
// formatted into one reused buffer, so only the cache holds memory.
func BenchmarkEntryMemory(b *testing.B) {
	type pointerRoute struct {
		session *int
		epoch   uint64
	}
	type handleRoute struct {
		session uint64
		epoch   uint64
	}
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("values=pointers/%d", n), func(b *testing.B) {
			session := new(int)
			entryMemory(b, n, func(i int) pointerRoute { return pointerRoute{session, uint64(i)} })
		})
		b.Run(fmt.Sprintf("values=handles/%d", n), func(b *testing.B) {
			entryMemory(b, n, func(i int) handleRoute { return handleRoute{1, uint64(i)} })
		})
	}
}

// entryMemory fills a cache with n entries and reports the live heap it
// added and its tables' size (outside the heap when V holds no pointers),
// per entry.
func entryMemory[V any](b *testing.B, n int, value func(int) V) {
	b.ReportAllocs()
	var heap, table float64
	for b.Loop() {
		before := liveHeap()
		c, _ := New[V](Config{MaxEntries: 2 * n}) // room for uneven shards
		buf := make([]byte, 0, 64)
		for i := range n {
			buf = fmt.Appendf(buf[:0], "/counter/id-%08d", i)
			c.Put(buf, value(i), c.Begin(buf))
		}
		heap = float64(liveHeap()-before) / float64(n)
		st := c.Stats()
		table = float64(st.TableBytes) / float64(n)
		if st.Size != n {
			b.Fatalf("Size = %d; want %d", st.Size, n)
		}
	}
	b.ReportMetric(heap, "heap-B/entry")
	b.ReportMetric(table, "table-B/entry")
}

// liveHeap is the heap in use after a collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkGetHitLarge is BenchmarkGetHit with a million entries cached,
// looked up in a pseudo-random order over all of them: each lookup reaches
// memory the CPU cache does not hold.
func BenchmarkGetHitLarge(b *testing.B) {
	b.Run("values=pointers", func(b *testing.B) { getHitLarge(b, "session") })
	b.Run("values=handles", func(b *testing.B) { getHitLarge(b, [2]uint64{1, 2}) })
}

func getHitLarge[V any](b *testing.B, v V) {
	const n = 1 << 20
	c, _ := New[V](Config{MaxEntries: 2 * n})
	names := make([][]byte, n)
	for i := range names {
		names[i] = fmt.Appendf(nil, "/counter/id-%08d", i)
		c.Put(names[i], v, c.Begin(names[i]))
	}
	now := c.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := uint32(0); b.Loop(); i++ {
		if _, ok := c.Get(names[(i*2654435761)&(n-1)], now); !ok {
			b.Fatal("miss")
		}
	}
}
