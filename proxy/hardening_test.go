package proxy_test

import (
	"bytes"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/testkit/smuggle"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// refused sends raw and checks for exactly one response with status code,
// a closed connection and nothing at the worker.
func refused(t *testing.T, w *worker, addr, raw string, code int) smuggle.Result {
	t.Helper()
	before := len(w.requests())
	r, err := smuggle.Send(addr, raw, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := smuggle.Request{Name: "", Raw: raw, Status: code}
	if err := c.Check(r); err != nil {
		t.Errorf("%q: %v", raw, err)
	}
	if n := len(w.requests()) - before; n != 0 {
		t.Errorf("%q: worker saw %d requests; want 0", raw, n)
	}
	return r
}

// obs-fold was folded into one value and forwarded; a front end before the
// pinboard may read the continuation as a field of its own (a hidden
// Transfer-Encoding). It is refused now, on requests (400) and on worker
// responses (502).
func TestObsFoldRefused(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		refused(t, w, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nX-Long: a\r\n  b\r\n\r\n", 400)
		refused(t, w, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nX: y\r\n Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", 400)
		refused(t, w, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nConnection: a,\r\n\tb\r\n\r\n", 400)
	})
}

// A bare LF ending a field line was taken as a line end and forwarded;
// refused now, like every other field syntax fasthttp tolerates.
func TestBareLFRefused(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		refused(t, w, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\nX: 1\r\n\r\n", 400)
		refused(t, w, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nX: a\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400)
	})
}

// Content-Length "003" was read as 3 and forwarded; refused now (a parser
// elsewhere need not read it as decimal). "0" stays valid.
func TestContentLengthLeadingZeroRefused(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		refused(t, w, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 003\r\n\r\nabc", 400)
		refused(t, w, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 00\r\n\r\n", 400)
		if resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"); !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Errorf("Content-Length: 0: %q", resp)
		}
	})
}

// A head of a thousand small fields fit MaxHeaderBytes and went to the
// worker whole; MaxHeaderFields now bounds the count (431).
func TestTooManyHeaderFields(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setupWith(t, loops, nil, func(c *proxy.Config) { c.MaxHeaderFields = 10 })
		head := func(n int) string {
			var b strings.Builder
			b.WriteString("GET /counter/a HTTP/1.1\r\nHost: h\r\n")
			for i := 1; i < n; i++ { // Host is one
				b.WriteString("X: v\r\n")
			}
			return b.String() + "\r\n"
		}
		if resp := raw(t, f.addr, head(10)); !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Errorf("10 fields: %q; want 200", resp)
		}
		refused(t, w, f.addr, head(11), 431)
		if _, err := proxy.New(proxy.Config{Resolver: proxytest.NewStatic(), MaxHeaderFields: -1}); err == nil {
			t.Error("New accepted MaxHeaderFields -1")
		}
	})
}

// Route and upgrade refusals (400) kept the connection open; every 400
// closes it now, like the framing refusals always did. A 404 for a path
// that names no object keeps it.
func TestBadRequestCloses(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		for _, req := range []string{
			"GET /counter/a%2Fb HTTP/1.1\r\nHost: h\r\n\r\n",
			"GET /counter/a/../b HTTP/1.1\r\nHost: h\r\n\r\n",
			"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
			"GET /counter/a HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
			"GET /counter/a HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n",
		} {
			refused(t, w, f.addr, req+"GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n", 400)
		}
		r, err := smuggle.Send(f.addr, "GET /counter HTTP/1.1\r\nHost: h\r\n\r\n", 300*time.Millisecond)
		if err != nil || r.Status() != 404 || r.Closed {
			t.Errorf("GET /counter: %v closed=%v %v; want 404 and the connection kept", r.Statuses, r.Closed, err)
		}
	})
}

// What fasthttp's parser refused before the handler came as text/plain;
// the proxy's ServerError makes it the JSON wire.Error every other refusal
// is, with the precise status, and counts it.
func TestParserErrorsAreJSON(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		for _, c := range []struct {
			req  string
			code int
		}{
			{"GET /counter/a HTTP/1.1\r\n\r\n", 400},                                                        // no Host
			{"POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na", 400}, // duplicate CL
			{"GET /counter/a HTTP/1.1\r\nHost: h\r\nX: " + strings.Repeat("a", 20<<10) + "\r\n\r\n", 431},
			{"POST /counter/a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 999999999999\r\n\r\n", 413},
		} {
			r := refused(t, w, f.addr, c.req, c.code)
			if _, err := r.JSONError(); err != nil {
				t.Errorf("%.40q: %v", c.req, err)
			}
		}
		var b bytes.Buffer
		f.p.Metrics().WritePrometheus(&b)
		if !strings.Contains(b.String(), "pinned_proxy_rejected_total 4\n") {
			t.Errorf("metrics: want pinned_proxy_rejected_total 4:\n%s", b.String())
		}
	})
}

// fasthttp's chunked decoder takes a bare LF as the end of the trailer
// section ("0\r\n\n"); a front end that reads the trailers on to CRLFCRLF
// sees one request where fasthttp saw two, and the second reached the
// worker (found by FuzzProxyDifferential, also behind a 404 that left the
// body for fasthttp to skip). The connection now closes after every request
// with a chunked body, whatever its answer: nothing pipelined behind one is
// read.
func TestBareLFTrailerCannotSmuggle(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setupWith(t, loops, echoAny, nil)
		for _, c := range []struct {
			path string
			code int
		}{{"/counter/a", 200}, {"/counter", 404}} {
			for _, body := range []string{"0\r\n\n", "0\r\nX: 1\n\r\n", "0\r\nX: 1\n\n", "0\r\n\r\n"} {
				before := len(w.requests())
				r, err := smuggle.Send(f.addr, "POST "+c.path+" HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"+body+
					"GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n", 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Statuses) != 1 || r.Statuses[0] != c.code || !r.Closed {
					t.Errorf("POST %s body %q: statuses %v closed=%v; want one %d and close", c.path, body, r.Statuses, r.Closed, c.code)
				}
				for _, s := range w.requests()[before:] {
					if s.uri != "/counter/a" {
						t.Errorf("POST %s body %q: the pipelined %s %s reached the worker", c.path, body, s.method, s.uri)
					}
				}
			}
		}
	})
}

// Guard applies the target-independent rules to a handler that is not the
// proxy's (the pinboard's registry): a CL.TE request to it let a front end
// that framed it differently pass a request behind it, which the proxy then
// served; and a chunked one kept its connection.
func TestGuard(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		var ran atomic.Int64
		guarded := f.p.Guard(func(ctx *fasthttp.RequestCtx) {
			if s := ctx.RequestBodyStream(); s != nil {
				if _, err := io.Copy(io.Discard, s); err != nil {
					// A chunk error surfaces here, as in the registry.
					ctx.Error("bad body", fasthttp.StatusBadRequest)
					return
				}
			}
			ran.Add(1)
			ctx.SetBodyString("registry")
		})
		// The proxy's server, dispatching /registry/ as the pinboard does.
		srv := f.p.NewServer()
		srv.Handler = func(ctx *fasthttp.RequestCtx) {
			if strings.HasPrefix(string(ctx.RequestURI()), "/registry/") {
				guarded(ctx)
				return
			}
			f.p.Handler(ctx)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Shutdown(); <-done })
		f = &front{p: f.p, addr: ln.Addr().String(), srv: srv}
		for _, c := range smuggle.Requests() {
			if !c.AnyPath() {
				continue
			}
			before := ran.Load()
			refused(t, w, f.addr, c.WithTarget("/registry/x").Raw, c.Status)
			if ran.Load() != before {
				t.Errorf("%s: the guarded handler served it", c.Name)
			}
		}
		// A chunked request to the guarded handler is served, then its
		// connection closes: the request behind it is not read.
		r, err := smuggle.Send(f.addr, "POST /registry/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n"+
			"GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n", 5*time.Second)
		if err != nil || len(r.Statuses) != 1 || r.Statuses[0] != 200 || !r.Closed || string(r.Body) != "registry" {
			t.Errorf("chunked request to the guarded handler: %v closed=%v %q %v; want one 200 and close", r.Statuses, r.Closed, r.Body, err)
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests; want 0", n)
		}
		// A clean request keeps its connection.
		r, err = smuggle.Send(f.addr, "GET /registry/x HTTP/1.1\r\nHost: h\r\n\r\n", 300*time.Millisecond)
		if err != nil || r.Status() != 200 || r.Closed {
			t.Errorf("clean request to the guarded handler: %v closed=%v %v", r.Statuses, r.Closed, err)
		}
	})
}
