package placement_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
)

func benchResolver(b *testing.B) (*placement.Resolver, [][]byte) {
	b.Helper()
	m := newInmem(b, false)
	b.Cleanup(m.close)
	names := make([][]byte, 1024)
	for i := range names {
		names[i] = []byte(fmt.Sprintf("/counter/id-%d", i))
		for range 3 {
			if _, err := m.res.Resolve(context.Background(), names[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	return m.res, names
}

// BenchmarkLookupHit is one placement lookup that hits the cache, timed
// with fasthttp's request time: what every proxied request pays.
func BenchmarkLookupHit(b *testing.B) {
	r, names := benchResolver(b)
	var rc fasthttp.RequestCtx
	rc.Init(&fasthttp.Request{}, nil, nil)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok := r.Lookup(names[i&1023], rc.Time()); !ok {
			b.Fatal("miss")
		}
		i++
	}
}

// BenchmarkLookupHitParallel is the same from every core: no lock or
// counter is shared by all lookups.
func BenchmarkLookupHitParallel(b *testing.B) {
	r, names := benchResolver(b)
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var rc fasthttp.RequestCtx
		rc.Init(&fasthttp.Request{}, nil, nil)
		i := int(next.Add(1)) * 101
		for pb.Next() {
			if _, ok := r.Lookup(names[i&1023], rc.Time()); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
}

// BenchmarkProxyHotPath is the full proxied request over in-memory
// listeners: client → proxy (head scan, route, resolve, field hygiene,
// forward) → worker → proxy → client, with the real resolver on the memory
// store, or a static map for comparison. Allocations are the whole
// process's.
func BenchmarkProxyHotPath(b *testing.B) {
	for _, static := range []bool{false, true} {
		name := "resolver=placement"
		if static {
			name = "resolver=static"
		}
		b.Run(name, func(b *testing.B) {
			m := newInmem(b, static)
			b.Cleanup(m.close) // after the timer stopped: shutting down takes ~100 ms
			var id atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				req.SetRequestURI("http://front/counter/id" + strconv.FormatInt(id.Add(1), 10) + "/incr")
				for pb.Next() {
					get(b, m.via, req, resp)
				}
			})
		})
	}
}

// BenchmarkResolveMissPlace is a miss that places a new id, on the memory
// store with three workers: the resolver's own cost of a placement
// (namespace sessions, choice, claim), without network round trips.
func BenchmarkResolveMissPlace(b *testing.B) {
	m := newInmem(b, false)
	b.Cleanup(m.close) // after the timer stopped: shutting down takes ~100 ms
	for _, sid := range []string{"s2", "s3"} {
		if _, err := m.st.Register(context.Background(), store.Session{
			ID: sid, ClientID: "c" + sid, Secret: "k", AdvertiseURL: "http://worker:1",
			Namespaces: []string{ns}, Headroom: 1 << 20, Verified: true,
		}, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	names := make([][]byte, b.N)
	for i := range names {
		names[i] = []byte("/counter/new" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := m.res.Resolve(context.Background(), names[i]); err != nil {
			b.Fatal(err)
		}
	}
}
