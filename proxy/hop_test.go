package proxy_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Reliability §3 goal 3, the cases TestRequestFieldHygiene leaves out: a
// Connection option naming the proxy's own fields (in any case, listed
// twice, in a second Connection field) strips only the client's copies; the
// proxy's secret, session and X-Forwarded-For arrive exactly once, with the
// proxy's values. TE, Keep-Alive, Proxy-Connection and Upgrade do not reach
// the worker on a plain request. Trailer is not hop-by-hop in RFC 9110
// (§6.6.2): fasthttp regenerates it from the trailer fields the proxy
// actually sends after the last chunk.
func TestConnectionCannotStripProxyFields(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setupWith(t, loops, echoAny, nil)
		resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\n"+
			"Connection: X-Pinned-Proxy-Secret, x-forwarded-for\r\n"+
			"Connection: X-PINNED-SESSION, X-Forwarded-Proto, X-Forwarded-Host, X-Pinned-Proxy-Secret\r\n"+
			"X-Pinned-Proxy-Secret: forged\r\nX-Forwarded-For: 6.6.6.6\r\n"+
			"Trailer: X-Sum\r\nTE: trailers, deflate\r\nKeep-Alive: timeout=99\r\nProxy-Connection: keep-alive\r\n"+
			"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Sum: 3\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.HasSuffix(resp, "B:abc") {
			t.Fatalf("response %q", resp)
		}
		r := w.last()
		want := map[string]string{
			wire.HeaderProxySecret: "secret-1",
			wire.HeaderSession:     "sess-1",
			"X-Forwarded-For":      "127.0.0.1",
			"X-Forwarded-Proto":    "http",
			"X-Forwarded-Host":     "h",
		}
		for k, v := range want {
			if got := r.headers[strings.ToLower(k)]; len(got) != 1 || got[0] != v {
				t.Errorf("worker got %s = %q; want exactly [%q]", k, got, v)
			}
		}
		for _, gone := range []string{"Connection", "TE", "Keep-Alive", "Proxy-Connection", "Upgrade"} {
			if v, ok := r.headers[strings.ToLower(gone)]; ok {
				t.Errorf("worker got %s: %q", gone, v)
			}
		}
		if got := r.headers["trailer"]; len(got) != 1 || got[0] != "X-Sum" {
			t.Errorf("worker got Trailer %q; want [X-Sum], announcing the trailer sent", got)
		}
	})
}

// Reliability §3 goal 4: a worker that answers a WebSocket handshake with
// anything but 101 (a 200 here, the 426 case is TestWebSocketRefusalRelayed)
// gets no tunnel: its answer is relayed as a plain response, and bytes the
// client sends after the handshake are parsed as the next HTTP request, not
// piped to the worker.
func TestUpgradeAnswered200IsNoTunnel(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, func(ctx *fasthttp.RequestCtx) {
			ctx.SetBodyString("plain " + string(ctx.Path()))
		})
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		hs := "GET /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
		resp := rawResponse(t, c, br, hs)
		if resp.StatusCode() != 200 || string(resp.Body()) != "plain /counter/a/ws" {
			t.Fatalf("handshake answered %d %q", resp.StatusCode(), resp.Body())
		}
		if f.p.OpenTunnels() != 0 {
			t.Errorf("a tunnel opened")
		}
		// Smuggling attempt: a request for another id behind the refused
		// handshake must be routed on its own, not tunneled to a's worker.
		if r := rawResponse(t, c, br, "GET /counter/b/x HTTP/1.1\r\nHost: h\r\n\r\n"); string(r.Body()) != "plain /counter/b/x" {
			t.Errorf("next request: %d %q", r.StatusCode(), r.Body())
		}
		seen := w.requests()
		if len(seen) != 2 || seen[1].uri != "/counter/b/x" {
			t.Fatalf("worker saw %d requests", len(seen))
		}
		if seen[1].get(wire.HeaderProxySecret) != "secret-1" {
			t.Errorf("the second request did not go through the proxy's hygiene: %q", seen[1].raw)
		}
		_ = c.Close()
		_, _ = io.Copy(io.Discard, br)
	})
}

// A client's trailer section reached the worker verbatim, and fasthttp
// merges trailers into the request header once the body is read: a forged
// X-Pinned-Proxy-Secret or X-Pinned-Session trailer sat next to the
// proxy's own (PeekAll showed both). Trailers the proxy manages in the head
// are dropped now; other trailers pass.
func TestClientTrailerCannotForgePinnedFields(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		type seen struct{ secret, session, forwarded, other []string }
		got := make(chan seen, 1)
		_, f, _, _ := setupWith(t, loops, func(ctx *fasthttp.RequestCtx) {
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
	})
}
