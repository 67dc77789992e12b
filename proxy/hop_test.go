package proxy_test

import (
	"io"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/wire"
)

// A client's trailer section reached the worker verbatim, and fasthttp
// merges trailers into the request header once the body is read: a forged
// X-Pinned-Proxy-Secret or X-Pinned-Session trailer sat next to the
// proxy's own (PeekAll showed both). Trailers the proxy manages in the head
// are dropped now; other trailers pass.
func TestClientTrailerCannotForgePinnedFields(t *testing.T) {
	type seen struct{ secret, session, forwarded, other []string }
	got := make(chan seen, 1)
	_, f, _, _ := setupWith(t, func(ctx *fasthttp.RequestCtx) {
		_, _ = io.ReadAll(ctx.RequestBodyStream())
		h := &ctx.Request.Header
		all := func(k string) (v []string) { // PeekAll reuses its result
			for _, b := range h.PeekAll(k) {
				v = append(v, string(b))
			}
			return v
		}
		got <- seen{all(wire.HeaderProxySecret), all(wire.HeaderSession), all("Forwarded"), all("X-Other")}
	}, nil)
	resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"+
		"X-Pinned-Proxy-Secret: forged\r\nx-pinned-session: forged\r\nForwarded: for=6.6.6.6\r\nX-Other: kept\r\n\r\n")
	if !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("response %q", resp)
	}
	s := <-got
	if len(s.secret) != 1 || s.secret[0] != "secret-1" || len(s.session) != 1 || s.session[0] != "sess-1" {
		t.Errorf("worker saw secret %q, session %q; want only the proxy's", s.secret, s.session)
	}
	if len(s.forwarded) != 0 {
		t.Errorf("worker saw Forwarded %q", s.forwarded)
	}
	if len(s.other) != 1 || s.other[0] != "kept" {
		t.Errorf("worker saw X-Other %q; want [kept]", s.other)
	}
}
