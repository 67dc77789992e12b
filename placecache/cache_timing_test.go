package placecache

import (
	"fmt"
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
