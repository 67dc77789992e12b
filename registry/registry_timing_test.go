package registry

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
)

func BenchmarkTokenCheck(b *testing.B) {
	ts, _ := newTokenSet([]string{token, oldToken})
	p := []byte(oldToken)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := ts.check(p); !ok {
			b.Fatal("rejected")
		}
	}
}

// A pairless heartbeat through the handler on memstore: the registry's own
// cost per heartbeat (auth, decode, store, encode).
func BenchmarkHeartbeatHandler(b *testing.B) {
	st, _ := memstore.New(memstore.Config{})
	defer st.Close()
	reg, err := New(Config{Store: st, Tokens: []string{token}})
	if err != nil {
		b.Fatal(err)
	}
	st.Register(b.Context(), store.Session{ID: "sid", ClientID: "c", AdvertiseURL: "http://h", Verified: true}, reg.lease)
	h := reg.NewRouter(nil).Handler
	body := []byte(`{"sessionId":"sid","headroom":3,"draining":false}`)
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI(wire.PathHeartbeat)
		ctx.Request.Header.Set("Authorization", "Bearer "+token)
		ctx.Request.SetBody(body)
		h(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

// The failed-authentication check every authenticated call makes.
func BenchmarkAuthLimitCheck(b *testing.B) {
	tab := newLimiterTable[netip.Addr](DefaultAuthFailureLimit, DefaultMaxTrackedClients, clock.Real{})
	ip := net.ParseIP("10.1.2.3")
	tab.spend(clientKey(ip))
	b.ReportAllocs()
	for b.Loop() {
		if blocked, _ := tab.blocked(clientKey(ip)); blocked {
			b.Fatal("blocked")
		}
	}
}

// A registration's two bucket takes (per IP, per token).
func BenchmarkRegisterLimitTake(b *testing.B) {
	ips := newLimiterTable[netip.Addr](Limit{Events: 1 << 30, Per: time.Second, Burst: 1 << 30}, DefaultMaxTrackedClients, clock.Real{})
	toks := newLimiterTable[string](Limit{Events: 1 << 30, Per: time.Second, Burst: 1 << 30}, DefaultMaxTrackedClients, clock.Real{})
	ip := net.ParseIP("2001:db8::7")
	b.ReportAllocs()
	for b.Loop() {
		ips.take(clientKey(ip))
		toks.take("tokenid12345")
	}
}
