//go:build !race

package placement_test

import (
	"context"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
)

// A cached placement costs no allocation, whichever clock the lookup uses:
// the request's time (the default), or an injected clock; nor does a
// Resolve that finds it cached, for a fasthttp request or another context.
func TestLookupHitDoesNotAllocate(t *testing.T) {
	e := newEnv(t, "memory")
	e.register(startHost(t, "a", e.fl), 100)
	var rc fasthttp.RequestCtx
	rc.Init(&fasthttp.Request{}, nil, nil)
	for _, c := range []struct {
		name  string
		clock clock.Clock
	}{
		{"request time", nil},
		{"injected clock", e.fake},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := placement.New(placement.Config{Store: e.st, Clock: c.clock, Logger: discard()})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			name := []byte("/counter/alloc")
			for range 3 { // place, then fill the cache
				if _, err := r.Resolve(context.Background(), name); err != nil {
					t.Fatal(err)
				}
			}
			hits := r.CacheStats().Hits
			now := time.Now()
			if n := testing.AllocsPerRun(1000, func() {
				if rt, ok := r.Lookup(name, now); !ok || rt.Session == nil {
					t.Fatal("Lookup missed", rt)
				}
			}); n != 0 {
				t.Errorf("Lookup on a hit allocates %v times; want 0", n)
			}
			if r.CacheStats().Hits-hits < 1000 {
				t.Errorf("the lookups were not cache hits")
			}
			for _, ctx := range []context.Context{&rc, context.Background()} {
				if n := testing.AllocsPerRun(1000, func() {
					if rt, err := r.Resolve(ctx, name); rt.Session == nil || err != nil {
						t.Fatal(rt, err)
					}
				}); n != 0 {
					t.Errorf("Resolve of a cached name allocates %v times; want 0", n)
				}
			}
		})
	}
}

// The whole proxied request, through the real resolver, allocates nothing
// once warm (client, proxy and worker are all in this process).
func TestProxyThroughResolverDoesNotAllocate(t *testing.T) {
	m := newInmem(t, false)
	defer m.close()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://front/counter/alice/incr?x=1")
	for range 100 {
		get(t, m.via, req, resp)
	}
	if n := testing.AllocsPerRun(500, func() { get(t, m.via, req, resp) }); n != 0 {
		t.Errorf("%v allocations per proxied request; want 0", n)
	}
}
