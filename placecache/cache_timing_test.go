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
	type route struct {
		session *int
		epoch   uint64
	}
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			var perEntry float64
			for b.Loop() {
				before := liveHeap()
				c, _ := New[route](Config{MaxEntries: 2 * n}) // room for uneven shards
				session := new(int)
				buf := make([]byte, 0, 64)
				for i := range n {
					buf = fmt.Appendf(buf[:0], "/counter/id-%08d", i)
					c.Put(buf, route{session, uint64(i)}, c.Begin(buf))
				}
				perEntry = float64(liveHeap()-before) / float64(n)
				if c.Len() != n {
					b.Fatalf("Len = %d; want %d", c.Len(), n)
				}
			}
			b.ReportMetric(perEntry, "heap-B/entry")
		})
	}
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
	const n = 1 << 20
	c, _ := New[string](Config{MaxEntries: 2 * n})
	names := make([][]byte, n)
	for i := range names {
		names[i] = fmt.Appendf(nil, "/counter/id-%08d", i)
		c.Put(names[i], "session", c.Begin(names[i]))
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
