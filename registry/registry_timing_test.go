package registry

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
	"github.com/pinned-go/pinned/internal/wire"
)

func BenchmarkTokenCheck(b *testing.B) {
	ts, _ := newTokenSet([]string{token, oldToken})
	p := []byte(oldToken)
	b.ReportAllocs()
	for b.Loop() {
		if !ts.check(p) {
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
