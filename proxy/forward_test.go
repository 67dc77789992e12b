package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// The backend receives the target byte for byte: no normalisation, no
// re-encoding, query untouched (P1; CVE-2022-2880 re-encoded queries).
func TestTargetByteIdentical(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		for _, target := range []string{
			"/counter/alice",
			"/counter/alice/",
			"/counter/alice/a%20b//c;p=1/%41",
			"/counter/alice/x?q=%2F..%2F&r=a+b&&s=%zz&t=;u",
			"/counter/alice?",
		} {
			resp := raw(t, f.addr, "GET "+target+" HTTP/1.1\r\nHost: h\r\n\r\n")
			if !strings.HasPrefix(resp, "HTTP/1.1 200") {
				t.Errorf("GET %s: %q", target, resp)
				continue
			}
			if got := w.last().uri; got != target {
				t.Errorf("GET %s: worker saw %q", target, got)
			}
		}
	})
}

// RFC 9110 §7.6.1: hop-by-hop fields, and every field named in Connection,
// are not forwarded; client-supplied pinned and forwarding fields are
// replaced; a Connection option cannot strip the proxy's own fields
// (golang/go#50580).
func TestRequestFieldHygiene(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		resp := raw(t, f.addr, "GET /counter/alice HTTP/1.1\r\n"+
			"Host: example.test\r\n"+
			"Connection: keep-alive, X-Foo, X-Pinned-Proxy-Secret, X-Forwarded-For, X-Pinned-Session\r\n"+
			"X-Foo: listed\r\n"+
			"Keep-Alive: timeout=5\r\n"+
			"TE: trailers\r\n"+
			"Proxy-Connection: keep-alive\r\n"+
			"Proxy-Authorization: Basic Zm9vOmJhcg==\r\n"+
			"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"+
			"X-Pinned-Proxy-Secret: forged\r\n"+
			"x-pinned-session: forged\r\n"+
			"X-PINNED-Reason: forged\r\n"+
			"X-Forwarded-For: 6.6.6.6\r\n"+
			"X-Forwarded-Proto: https\r\n"+
			"X-Forwarded-Host: evil.test\r\n"+
			"Forwarded: for=6.6.6.6\r\n"+
			"X-Keep: yes\r\n"+
			"Cookie: a=1;b=2 ; c\r\n"+
			"\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Fatalf("response: %q", resp)
		}
		r := w.last()
		for _, gone := range []string{"X-Foo", "Keep-Alive", "TE", "Proxy-Connection", "Proxy-Authorization",
			"HTTP2-Settings", "X-Pinned-Reason", "Forwarded", "Connection", "Upgrade", "Expect"} {
			if v, ok := r.headers[strings.ToLower(gone)]; ok {
				t.Errorf("worker got %s: %q", gone, v)
			}
		}
		want := map[string]string{
			wire.HeaderProxySecret: "secret-1",
			wire.HeaderSession:     "sess-1",
			"X-Forwarded-For":      "127.0.0.1",
			"X-Forwarded-Proto":    "http",
			"X-Forwarded-Host":     "example.test",
			"X-Keep":               "yes",
			"Host":                 "example.test",
		}
		for k, v := range want {
			if got := r.headers[strings.ToLower(k)]; len(got) != 1 || got[0] != v {
				t.Errorf("worker got %s = %q; want exactly [%q]", k, got, v)
			}
		}
		if !strings.Contains(r.raw, "Cookie: a=1;b=2 ; c\r\n") {
			t.Errorf("Cookie not forwarded verbatim:\n%s", r.raw)
		}
		if strings.Contains(strings.ToLower(r.raw), "user-agent") || strings.Contains(strings.ToLower(r.raw), "content-type") {
			t.Errorf("proxy injected a default field:\n%s", r.raw)
		}
	})
}

// Response hop-by-hop fields and fields listed in the worker's Connection are
// not relayed; the worker's own fields pass as they are, and the proxy adds
// no Server, Date or Content-Type of its own.
func TestResponseFieldHygiene(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		_, f, _, _ := setupWorkerServer(t, loops, func(ctx *fasthttp.RequestCtx) {
			ctx.Response.Header.Set("Connection", "X-Internal")
			ctx.Response.Header.Set("X-Internal", "secret")
			ctx.Response.Header.Set("Keep-Alive", "timeout=5")
			ctx.Response.Header.Set("Proxy-Authenticate", "Basic")
			ctx.Response.Header.Set("Upgrade", "h2c")
			ctx.Response.Header.Set("X-App", "1")
			ctx.SetBodyString("body")
		}, func(s *fasthttp.Server) {
			s.NoDefaultServerHeader = true
			s.NoDefaultDate = true
			s.NoDefaultContentType = true
		})
		resp := raw(t, f.addr, "GET /counter/alice HTTP/1.1\r\nHost: h\r\n\r\n")
		head := strings.ToLower(resp[:strings.Index(resp, "\r\n\r\n")])
		for _, gone := range []string{"x-internal", "keep-alive", "proxy-authenticate", "upgrade", "connection",
			"server", "date", "content-type"} {
			if strings.Contains(head, "\n"+gone+":") {
				t.Errorf("client got %s:\n%s", gone, head)
			}
		}
		if !strings.Contains(head, "\nx-app: 1") || !strings.HasSuffix(resp, "\r\n\r\nbody") {
			t.Errorf("response lost the worker's fields or body:\n%s", resp)
		}
	})
}

// setupWorkerServer is setup with a hook on the worker's server settings.
func setupWorkerServer(t *testing.T, loops int, h fasthttp.RequestHandler, mutate func(*fasthttp.Server)) (*worker, *front, *proxytest.Static, *proxy.Session) {
	t.Helper()
	w := startWorkerWith(t, h, mutate)
	res := proxytest.NewStatic()
	ep := w.session("sess-1", "secret-1")
	res.PlaceNamespace("/counter", ep)
	return w, startProxy(t, loops, res, nil), res, ep
}

// P3: the client's Connection: close ends the client connection only, and
// the worker's ends the worker connection only.
func TestConnectionCloseStaysOnItsLeg(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var closeNext atomic.Bool
		w := startWorkerWith(t, func(ctx *fasthttp.RequestCtx) {
			if closeNext.Load() {
				ctx.SetConnectionClose()
			}
			ctx.SetBodyString("ok")
		}, nil)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, nil)

		// Client says close: it gets Connection: close, the worker connection
		// survives for the next client.
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		if !strings.Contains(resp, "Connection: close") {
			t.Errorf("client asked to close, response: %q", resp)
		}
		if got := w.last().headers["connection"]; len(got) != 0 {
			t.Errorf("worker got Connection %q", got)
		}
		_ = raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if n := w.accepted.Load(); n != 1 {
			t.Errorf("worker accepted %d connections; want 1 (reused)", n)
		}

		// Worker says close: the client connection stays usable.
		closeNext.Store(true)
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for i := 0; i < 3; i++ {
			r := rawResponse(t, c, br, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
			if r.StatusCode() != 200 || r.ConnectionClose() {
				t.Fatalf("request %d: %d, close=%v", i, r.StatusCode(), r.ConnectionClose())
			}
		}
		if n := w.accepted.Load(); n < 3 {
			t.Errorf("worker accepted %d connections; want a new one after each close", n)
		}
	})
}

// The client's own X-Forwarded-* are replaced unless the peer is trusted,
// in which case the peer is appended to X-Forwarded-For.
func TestForwardedTrust(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		})
		_ = raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 6.6.6.6\r\n"+
			"X-Forwarded-Proto: https\r\nX-Forwarded-Host: front.test\r\n\r\n")
		r := w.last()
		if got := r.get("X-Forwarded-For"); got != "6.6.6.6, 127.0.0.1" {
			t.Errorf("X-Forwarded-For = %q; want %q", got, "6.6.6.6, 127.0.0.1")
		}
		if got := r.get("X-Forwarded-Proto"); got != "https" {
			t.Errorf("X-Forwarded-Proto = %q; want https", got)
		}
		if got := r.get("X-Forwarded-Host"); got != "front.test" {
			t.Errorf("X-Forwarded-Host = %q; want front.test", got)
		}
	})
}

// Bodies of every framing arrive whole; small ones are sent with their
// Content-Length, chunked ones re-chunked with their trailers.
func TestRequestBodies(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			b, err := io.ReadAll(ctx.RequestBodyStream())
			if err != nil {
				ctx.Error(err.Error(), 500)
				return
			}
			ctx.Response.Header.Set("X-Trailer-Sum", string(ctx.Request.Header.PeekTrailer("X-Sum")))
			ctx.SetBody(b)
		})
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.ReplayBodyMax = 100 })

		small := "small body"
		resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n"+small)
		if !strings.HasSuffix(resp, "\r\n\r\n"+small) {
			t.Errorf("small body: %q", resp)
		}
		large := strings.Repeat("x", 100_000)
		resp = raw(t, f.addr, "PUT /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n"+large)
		if !strings.HasSuffix(resp, "\r\n\r\n"+large) {
			t.Errorf("large body: response of %d bytes", len(resp))
		}
		resp = raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n"+
			"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 42\r\n\r\n")
		if !strings.HasSuffix(resp, "\r\n\r\nhello world") || !strings.Contains(resp, "X-Trailer-Sum: 42") {
			t.Errorf("chunked body: %q", resp)
		}
		if got := w.last().headers["transfer-encoding"]; len(got) != 1 || got[0] != "chunked" {
			t.Errorf("worker got Transfer-Encoding %q; want chunked", got)
		}
	})
}

// Trailers of a streamed response reach the client after the body.
func TestResponseTrailers(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		_, f, _, _ := setup(t, loops, func(ctx *fasthttp.RequestCtx) {
			_ = ctx.Response.Header.SetTrailer("X-Sum")
			ctx.SetBodyStream(&trailing{parts: []string{"part1", "part2"}, ctx: ctx}, -1)
		})
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.Contains(resp, "Transfer-Encoding: chunked") || !strings.Contains(resp, "Trailer: X-Sum") ||
			!strings.HasSuffix(resp, "0\r\nX-Sum: 99\r\n\r\n") {
			t.Errorf("response: %q", resp)
		}
	})
}

// P9: an HTTP/1.0 client never gets chunked framing: a body of unknown
// length is delimited by closing the connection; a known length keeps
// Content-Length and keep-alive.
func TestHTTP10Client(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		_, f, _, _ := setup(t, loops, func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/counter/a/stream" {
				ctx.SetBodyStream(strings.NewReader(strings.Repeat("s", 70_000)), -1)
				return
			}
			ctx.SetBodyString("fixed")
		})
		resp := raw(t, f.addr, "GET /counter/a/stream HTTP/1.0\r\nHost: h\r\n\r\n")
		head, body, _ := strings.Cut(resp, "\r\n\r\n")
		if strings.Contains(strings.ToLower(head), "transfer-encoding") || !strings.Contains(head, "Connection: close") ||
			body != strings.Repeat("s", 70_000) {
			t.Errorf("HTTP/1.0 stream: head %q, body of %d bytes", head, len(body))
		}

		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for i := 0; i < 2; i++ {
			r := rawResponse(t, c, br, "GET /counter/a HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n")
			if string(r.Body()) != "fixed" || r.Header.ContentLength() != 5 {
				t.Fatalf("HTTP/1.0 keep-alive request %d: %q", i, r.String())
			}
		}
	})
}

// Expect: 100-continue is answered by the proxy and not forwarded; a body
// the proxy would refuse is refused before it is sent.
func TestExpectContinue(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			b, _ := io.ReadAll(ctx.RequestBodyStream())
			ctx.SetBody(b)
		})
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.MaxRequestBodySize = 1000 })

		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "POST /counter/a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
		br := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, _ := br.ReadString('\n')
		if !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("first line %q; want 100 Continue", line)
		}
		_, _ = br.ReadString('\n')
		_, _ = io.WriteString(c, "data")
		var resp fasthttp.Response
		if err := resp.Read(br); err != nil || string(resp.Body()) != "data" {
			t.Fatalf("response %q, %v", resp.Body(), err)
		}
		if _, ok := w.last().headers["expect"]; ok {
			t.Errorf("worker got Expect")
		}

		n := len(w.requests())
		out := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n")
		if !strings.HasPrefix(out, "HTTP/1.1 413") || strings.Contains(out, "100 Continue") {
			t.Errorf("oversized Expect: %q", out)
		}
		if len(w.requests()) != n {
			t.Errorf("worker saw the oversized request")
		}
	})
}

// An absolute-form target is reduced to origin-form; a Host that disagrees
// with its authority is refused.
func TestAbsoluteForm(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		resp := raw(t, f.addr, "GET http://good.test/counter/a/x?q=1 HTTP/1.1\r\nHost: good.test\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Fatalf("absolute-form: %q", resp)
		}
		if r := w.last(); r.uri != "/counter/a/x?q=1" || r.get("Host") != "good.test" {
			t.Errorf("worker saw %q Host %q", r.uri, r.get("Host"))
		}
		n := len(w.requests())
		resp = raw(t, f.addr, "GET http://evil.test/counter/a HTTP/1.1\r\nHost: good.test\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 400") {
			t.Errorf("host mismatch: %q", resp)
		}
		if len(w.requests()) != n {
			t.Errorf("worker saw the mismatched request")
		}
	})
}

// An advertise URL with a path prefixes every forwarded path.
func TestAdvertisePathPrefix(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", &proxy.Session{ID: "s", Secret: "k", AdvertiseURL: w.url() + "/app/"})
		f := startProxy(t, loops, res, nil)
		_ = raw(t, f.addr, "GET /counter/a/b?c HTTP/1.1\r\nHost: h\r\n\r\n")
		_ = raw(t, f.addr, "GET http://h/counter/a/d HTTP/1.1\r\nHost: h\r\n\r\n")
		r := w.requests()
		if len(r) != 2 || r[0].uri != "/app/counter/a/b?c" || r[1].uri != "/app/counter/a/d" {
			t.Errorf("worker saw %v", r)
		}
	})
}

// Requests that do not name an object, or would leave it once a backend
// decodes the path, are refused with a JSON error before anything is sent.
func TestRouteRefused(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		f2 := func(target string, code int, field string) {
			t.Helper()
			resp := raw(t, f.addr, "GET "+target+" HTTP/1.1\r\nHost: h\r\n\r\n")
			var r fasthttp.Response
			if err := r.Read(bufio.NewReader(strings.NewReader(resp))); err != nil {
				t.Errorf("GET %s: unreadable response %q", target, resp)
				return
			}
			if r.StatusCode() != code || !strings.Contains(string(r.Body()), `"field":"`+field+`"`) ||
				string(r.Header.ContentType()) != "application/json" {
				t.Errorf("GET %s = %d %s; want %d field %s", target, r.StatusCode(), r.Body(), code, field)
			}
		}
		f2("/", 404, "path")
		f2("/counter", 404, "path")
		f2("/counter/", 400, "id")
		f2("//alice", 400, "namespace")
		f2("/counter/..", 400, "id")
		f2("/counter/a%2Fb", 400, "id")
		f2("/counter/alice/..%2F..%2Fother/bob", 400, "path")
		f2("/counter/alice/../../other/bob", 400, "path")
		f2("/counter/alice/%2e%2e/x", 400, "path")
		f2("/counter/alice/a%5Cb", 400, "path")
		f2("/counter/alice/a%00b", 400, "path")
		f2("/counter/alice/%252F", 400, "path")
		f2("/counter/alice/a\\b", 400, "path")
		f2("/counter/"+strings.Repeat("x", 300), 400, "id")
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests; want 0", n)
		}
	})
}

// trailing streams its parts, then sets the X-Sum trailer; it runs on the
// server goroutine that writes the response.
type trailing struct {
	parts []string
	ctx   *fasthttp.RequestCtx
}

func (r *trailing) Read(p []byte) (int, error) {
	if len(r.parts) == 0 {
		r.ctx.Response.Header.Set("X-Sum", "99")
		return 0, io.EOF
	}
	n := copy(p, r.parts[0])
	r.parts = r.parts[1:]
	return n, nil
}

// A body longer than the worker accepts (Session.MaxBodyBytes) gets 413
// naming the limit, without reaching the worker when its length is
// announced (buffered or streamed), and cut off when a chunked body passes
// it; a body within the limit is forwarded.
func TestBodyOverWorkerLimit(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			_, _ = io.Copy(io.Discard, ctx.RequestBodyStream())
		})
		res := proxytest.NewStatic()
		s := w.session("s", "k")
		s.MaxBodyBytes = 100
		res.PlaceNamespace("/counter", s)
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.ReplayBodyMax = 150 })

		if resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n"+strings.Repeat("x", 100)); !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Fatalf("100 bytes (the limit): %q; want 200", resp)
		}
		for _, n := range []int{101, 1000} { // buffered, streamed
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			resp := rawResponse(t, c, bufio.NewReader(c), "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n"+strings.Repeat("x", n))
			if resp.StatusCode() != 413 || !resp.ConnectionClose() || !strings.Contains(string(resp.Body()), "worker accepts (100 bytes)") {
				t.Errorf("%d bytes: %d close %v %s; want 413 naming 100 bytes, and close", n, resp.StatusCode(), resp.ConnectionClose(), resp.Body())
			}
			c.Close()
		}
		if n := len(w.requests()); n != 1 {
			t.Errorf("worker saw %d requests; want 1 (the refused ones never sent)", n)
		}

		// A chunked body is refused once it passes the limit (the client's last
		// chunk is not sent: the proxy closes after the 413).
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		resp := rawResponse(t, c, bufio.NewReader(c), "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"c8\r\n"+strings.Repeat("y", 200)+"\r\n")
		if resp.StatusCode() != 413 || !strings.Contains(string(resp.Body()), "worker accepts (100 bytes)") {
			t.Errorf("chunked 200 bytes: %d %s; want 413 naming 100 bytes", resp.StatusCode(), resp.Body())
		}
	})
}
