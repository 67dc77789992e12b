package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// The proxy's steady-state reads: a tracked placement or session served
// from the client-side cache, without a Redis round trip.
func BenchmarkCachedReads(b *testing.B) {
	s := benchStore(b, redistest.Start(b).URL, time.Minute)
	ctx := context.Background()
	s.Claim(ctx, "/n", "x", "s1")
	b.Run("Placement", func(b *testing.B) {
		s.Placement(ctx, "/n", "x")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if p, err := s.Placement(ctx, "/n", "x"); p != "s1" || err != nil {
					b.Fatal(p, err)
				}
			}
		})
	})
	b.Run("Session", func(b *testing.B) {
		s.Session(ctx, "s1")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Session(ctx, "s1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("Claim", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := s.Claim(ctx, "/n", "claim"+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676%26)), "s1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Heartbeat", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := s.Heartbeat(ctx, "s1", store.Update{Headroom: 1}, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkColdPlacement is a pinboard's cache miss on an id nobody holds
// (LookupOrClaim of a new id), on one redis-server and on a local
// three-master cluster: one script in one round trip on a node; on a
// cluster the claim with its tracked read, then the index add (two round
// trips; see the package doc). The ratio
// of the two is what a cold placement pays for a cluster on an idle
// machine, where a round trip costs a loopback hop and two wake-ups.
func BenchmarkColdPlacement(b *testing.B) {
	for _, kind := range []string{"node", "cluster"} {
		b.Run(kind, func(b *testing.B) {
			var url string
			if kind == "node" {
				url = redistest.Start(b).URL
			} else {
				url = redistest.StartCluster(b).URL
			}
			s := benchStore(b, url, time.Hour)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p, claimed, err := s.LookupOrClaim(ctx, "/n", "cold-"+strconv.Itoa(i), "s1")
				if err != nil || !claimed || p.Session != "s1" {
					b.Fatal(p, claimed, err)
				}
			}
		})
	}
}

// benchStore connects a store to the Redis at url, closed when b ends, with
// session s1 registered for lease in namespace /n.
func benchStore(b *testing.B, url string, lease time.Duration) *Store {
	s, err := New(Config{URL: url})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	ctx := context.Background()
	if err := s.Connect(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h", Namespaces: []string{"/n"}}, lease); err != nil {
		b.Fatal(err)
	}
	return s
}
