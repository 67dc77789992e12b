//go:build !race

package placement_test

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/placement"
)

// A cached placement costs no allocation, whichever clock the lookup uses:
// fasthttp's request time (the default), an injected clock, or the real
// clock for a context that is not a fasthttp request.
func TestResolveHitDoesNotAllocate(t *testing.T) {
	e := newEnv(t, "memory")
	e.register(startHost(t, "a", e.fl), 100)
	for _, c := range []struct {
		name  string
		clock clock.Clock
		ctx   func() context.Context
	}{
		{"request time", nil, func() context.Context {
			var rc fasthttp.RequestCtx
			rc.Init(&fasthttp.Request{}, nil, nil)
			return &rc
		}},
		{"injected clock", e.fake, func() context.Context { return context.Background() }},
		{"real clock", nil, func() context.Context { return context.Background() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := placement.New(placement.Config{Store: e.st, Clock: c.clock, Logger: discard()})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ctx := c.ctx()
			name := []byte("/counter/alloc")
			for range 3 { // place, then fill the cache
				if _, err := r.Resolve(ctx, name); err != nil {
					t.Fatal(err)
				}
			}
			hits := r.CacheStats().Hits
			if n := testing.AllocsPerRun(1000, func() {
				if ep, err := r.Resolve(ctx, name); ep == nil || err != nil {
					t.Fatal(ep, err)
				}
			}); n != 0 {
				t.Errorf("Resolve on a hit allocates %v times; want 0", n)
			}
			if r.CacheStats().Hits-hits < 1000 {
				t.Errorf("the lookups were not cache hits")
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
