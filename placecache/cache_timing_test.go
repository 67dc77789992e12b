package placecache

import (
	"fmt"
	"sync/atomic"
	"testing"
)

func BenchmarkGetHitParallel(b *testing.B) {
	c, _ := New[string](Config{})
	names := make([][]byte, 1024)
	for i := range names {
		names[i] = []byte(fmt.Sprintf("/counter/id-%d", i))
		c.Put(names[i], "session", c.Begin(names[i]))
	}
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

func BenchmarkGetHit(b *testing.B) {
	c, _ := New[string](Config{})
	names := make([][]byte, 1024)
	for i := range names {
		names[i] = []byte(fmt.Sprintf("/counter/id-%d", i))
		c.Put(names[i], "session", c.Begin(names[i]))
	}
	now := c.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok := c.Get(names[i%len(names)], now); !ok {
			b.Fatal("miss")
		}
	}
}
