//go:build !race

package host

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// TestDispatchDoesNotAllocate enforces the hot-path promise: a request to
// an active instance allocates nothing in the host (in local and fleet
// mode, with and without path parameters, through Handler and Wrap).
func TestDispatchDoesNotAllocate(t *testing.T) {
	lease, cancel := context.WithCancel(context.Background())
	defer cancel()
	local := newBenchHost(t, Config{}, nil)
	fleet := newBenchHost(t, Config{Worker: &allocWorker{lease: lease}}, nil)
	wrapped := local.Wrap(func(ctx *fasthttp.RequestCtx) { t.Fatal("Wrap passed a host request on") })
	f := func(name string, handler func(*fasthttp.RequestCtx), method, uri string, hdr ...string) {
		t.Helper()
		rc := requestCtx(method, uri, hdr...)
		serveOnce(t, handler, rc, 200) // activates
		allocs := testing.AllocsPerRun(1000, func() {
			rc.Response.Reset()
			handler(rc)
		})
		if allocs != 0 {
			t.Errorf("%s: %s %s allocates %.1f times per request; want 0", name, method, uri, allocs)
		}
	}
	f("local", local.Handler, "GET", "/b/alice/")
	f("local param", local.Handler, "GET", "/b/alice/items/42")
	f("local concurrent route", local.Handler, "GET", "/b/alice/c")
	f("local HEAD", local.Handler, "HEAD", "/b/alice/")
	f("wrap", wrapped, "GET", "/b/bob/")
	f("fleet", fleet.Handler, "GET", "/b/alice/", wire.HeaderProxySecret, "s")
	f("fleet with session", fleet.Handler, "GET", "/b/carol/", wire.HeaderProxySecret, "s", wire.HeaderSession, "sess")
	f("fleet with session and epoch", fleet.Handler, "GET", "/b/dave/", wire.HeaderProxySecret, "s", wire.HeaderSession, "sess", wire.HeaderEpoch, "1733212345678901")
}
