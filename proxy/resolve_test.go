package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// hostUnavailable answers like a host whose instance is closing (or
// draining, or out of lease).
func hostUnavailable(reason string) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.Set(wire.HeaderReason, reason)
		ctx.Response.Header.Set(wire.HeaderRetryAfter, "2")
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("busy")
	}
}

// echoBody answers with the request body.
func echoBody(ctx *fasthttp.RequestCtx) {
	b, _ := io.ReadAll(ctx.RequestBodyStream())
	ctx.SetBody(append([]byte("B:"), b...))
}

// twoWorkers places "/counter/a" on a worker answering with old, and moves
// the placement to a worker answering with new when the proxy reports a
// refusal.
func twoWorkers(t *testing.T, loops int, old, new fasthttp.RequestHandler, mutate func(*proxy.Config)) (a, b *worker, f *front, res *proxytest.Static) {
	t.Helper()
	a, b = startWorker(t, old), startWorker(t, new)
	sa, sb := a.session("sess-a", "secret-a"), b.session("sess-b", "secret-b")
	res = proxytest.NewStatic()
	res.Place("/counter/a", sa)
	res.OnRefused = func(name string, r proxy.Route) {
		if r.Session == sa {
			res.Place(name, sb)
		}
	}
	return a, b, startProxy(t, loops, res, mutate), res
}

// A host 503 marked closing, draining or lease drops the placement, and the
// request goes to the re-resolved worker when nothing of it was consumed.
func TestReresolveOnHost503(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		for _, reason := range []string{wire.ReasonClosing, wire.ReasonDraining, wire.ReasonLease} {
			t.Run(reason, func(t *testing.T) {
				a, b, f, res := twoWorkers(t, loops, hostUnavailable(reason), echoBody, nil)
				resp := raw(t, f.addr, "POST /counter/a/incr HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nbody")
				if !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.HasSuffix(resp, "B:body") {
					t.Fatalf("response %q; want the new worker's 200", resp)
				}
				if n := res.Refusals(); n != 1 {
					t.Errorf("refusals = %d; want 1", n)
				}
				ra, rb := a.requests(), b.requests()
				if len(ra) != 1 || len(rb) != 1 {
					t.Fatalf("workers saw %d and %d requests; want 1 and 1", len(ra), len(rb))
				}
				if got := rb[0].get(wire.HeaderProxySecret); got != "secret-b" {
					t.Errorf("retry carried secret %q; want the new worker's", got)
				}
				if got := rb[0].get(wire.HeaderSession); got != "sess-b" {
					t.Errorf("retry carried session %q; want the new worker's", got)
				}
				if got := rb[0].headers[strings.ToLower(wire.HeaderProxySecret)]; len(got) != 1 {
					t.Errorf("retry carried %d secrets", len(got))
				}
				expectMetric(t, f, "pinned_proxy_reresolves_total", 1)
				expectMetric(t, f, `pinned_proxy_responses_total{class="2xx"}`, 1)
				expectMetric(t, f, `pinned_proxy_responses_total{class="5xx"}`, 0)
			})
		}
	})
}

// When the body was streamed (not held), the 503 and its Retry-After reach
// the client; the placement is still dropped.
func TestNoReresolveAfterBodyConsumed(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		a, b, f, res := twoWorkers(t, loops, func(ctx *fasthttp.RequestCtx) {
			_, _ = io.Copy(io.Discard, ctx.RequestBodyStream())
			hostUnavailable(wire.ReasonClosing)(ctx)
		}, echoBody, func(c *proxy.Config) { c.ReplayBodyMax = 8 })
		resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 20\r\n\r\n01234567890123456789")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "Retry-After: 2") ||
			!strings.Contains(resp, "X-Pinned-Reason: closing") {
			t.Fatalf("response %q; want the worker's 503", resp)
		}
		if n := res.Refusals(); n != 1 {
			t.Errorf("refusals = %d; want 1", n)
		}
		if len(a.requests()) != 1 || len(b.requests()) != 0 {
			t.Errorf("workers saw %d and %d; want 1 and 0", len(a.requests()), len(b.requests()))
		}
		// Chunked bodies are never held either.
		resp = raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") { // the placement moved to b
			t.Fatalf("after the move: %q", resp)
		}
	})
}

// An application's own 503 (no pinned reason) is just a response.
func TestApplication503PassesThrough(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		a, b, f, res := twoWorkers(t, loops, func(ctx *fasthttp.RequestCtx) {
			ctx.Response.Header.Set(wire.HeaderRetryAfter, "7")
			ctx.SetStatusCode(503)
		}, echoBody, nil)
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "Retry-After: 7") {
			t.Fatalf("response %q", resp)
		}
		if res.Refusals() != 0 || len(a.requests()) != 1 || len(b.requests()) != 0 {
			t.Errorf("refusals %d, workers %d/%d; want 0, 1/0", res.Refusals(), len(a.requests()), len(b.requests()))
		}
	})
}

// Re-resolving is bounded: a placement that keeps answering closing gets
// MaxAttempts sends, then its 503 reaches the client.
func TestReresolveBounded(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, hostUnavailable(wire.ReasonClosing))
		ep := w.session("s", "k")
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", ep)
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.MaxAttempts = 3 })
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "Retry-After: 2") {
			t.Fatalf("response %q", resp)
		}
		if n := len(w.requests()); n != 3 {
			t.Errorf("worker saw %d sends; want 3", n)
		}
	})
}

// The retry budget caps what retries add to a worker's load: with every
// answer a closing 503, the worker sees at most requests × (1 + ratio) plus
// the burst.
func TestRetryBudget(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, hostUnavailable(wire.ReasonClosing))
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.MaxAttempts = 3
			c.Endpoint = proxy.EndpointConfig{RetryBudgetRatio: 0.2, RetryBudgetBurst: 2}
		})
		hc := &fasthttp.HostClient{Addr: f.addr, Dial: fasthttp.Dial}
		defer hc.CloseIdleConnections()
		const n = 100
		for i := 0; i < n; i++ {
			if code, _, err := hc.GetTimeout(nil, "http://"+f.addr+"/counter/a", 5*time.Second); err != nil || code != 503 {
				t.Fatalf("request %d: %d %v", i, code, err)
			}
		}
		if got, max := len(w.requests()), n+n/5+2+1; got > max {
			t.Errorf("worker saw %d sends for %d requests; want ≤ %d", got, n, max)
		} else {
			t.Logf("worker saw %d sends for %d requests", got, n)
		}
		// Every send past the first of a request was a re-resolve; every
		// retry the budget refused was counted.
		expectMetric(t, f, "pinned_proxy_reresolves_total", float64(len(w.requests())-n))
		if got := metricValue(t, f, "pinned_proxy_retry_budget_exhausted_total"); got < n/2 {
			t.Errorf("retry_budget_exhausted = %v; want ≥ %d of %d requests refused a retry", got, n/2, n)
		}
		expectMetric(t, f, `pinned_proxy_responses_total{class="5xx"}`, n)
	})
}

// A worker that cannot be reached: 503 + Retry-After + unreachable, fast.
func TestUnreachable(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close() // nothing listens there now
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", &proxy.Session{ID: "s", Secret: "k", AdvertiseURL: "http://" + addr})
		f := startProxy(t, loops, res, nil)
		for _, req := range []string{
			"GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n",
			"POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
		} {
			start := time.Now()
			resp := raw(t, f.addr, req)
			if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "Retry-After: 1") ||
				!strings.Contains(resp, "X-Pinned-Reason: unreachable") {
				t.Errorf("response %q", resp)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("took %v", el)
			}
		}
		expectMetric(t, f, "pinned_proxy_unreachable_total", 2)
		expectMetric(t, f, `pinned_proxy_responses_total{class="5xx"}`, 2)
	})
}

// An unreachable worker is reported to the resolver (Refused), which
// re-checks the placement: when it moved, the request (provably not sent)
// goes to the new holder at once; when it did not, the answer is 503
// unreachable after one dial.
func TestUnreachableReresolved(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := ln.Addr().String()
		_ = ln.Close()
		var dials atomic.Int64
		sDead := &proxy.Session{ID: "sess-dead", Secret: "k", AdvertiseURL: "http://" + dead}
		b := startWorker(t, echoBody)
		sb := b.session("sess-b", "secret-b")
		res := proxytest.NewStatic()
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.Endpoint.Dial = func(addr string, timeout time.Duration) (net.Conn, error) {
				dials.Add(1)
				return net.DialTimeout("tcp", addr, timeout)
			}
		})

		// The placement stays: one dial, 503 unreachable, one refusal.
		res.Place("/counter/a", sDead)
		res.SetOnRefused(func(name string, r proxy.Route) { res.Place(name, r.Session) })
		resp := raw(t, f.addr, "POST /counter/a/incr HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nbody")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: unreachable") {
			t.Fatalf("response %q; want 503 unreachable", resp)
		}
		if n, d := res.Refusals(), dials.Load(); n != 1 || d != 1 {
			t.Errorf("refusals = %d, dials = %d; want 1 and 1", n, d)
		}

		// The placement moves when the resolver re-checks it: the request
		// reaches the new holder, body included.
		res.SetOnRefused(func(name string, r proxy.Route) {
			if r.Session == sDead {
				res.Place(name, sb)
			}
		})
		resp = raw(t, f.addr, "POST /counter/a/incr HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nbody")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.HasSuffix(resp, "B:body") {
			t.Fatalf("response %q; want the new holder's 200", resp)
		}
		if got := b.last().get(wire.HeaderSession); got != "sess-b" {
			t.Errorf("the new holder saw session %q; want sess-b", got)
		}
	})
}

// A request the worker may have received but did not answer is a 502,
// never sent again when it is not idempotent; an idempotent one that met a
// connection the worker had closed while it sat in the pool goes again. On
// the fasthttp path only: a loop sees a pooled connection's close before it
// reuses it, so the race arranged here does not happen there
// (TestNoAnswerNotResent and TestStaleConnectionResendIsTheOneResend cover
// the rule on both).
func TestMaybeSent(t *testing.T) {
	// The worker answers every first request on a connection and then
	// closes it without saying so.
	var requests atomic.Int64
	addr := serveRaw(t, func(c net.Conn, br *bufio.Reader) {
		var req fasthttp.Request
		if err := req.Read(br); err != nil {
			return
		}
		requests.Add(1)
		// The proxy pools the connection whether or not the close has
		// reached it.
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	f := proxyTo(t, fasthttpEngine, addr, nil)

	send := func(req string) string {
		if r := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 200") {
			t.Fatalf("priming request: %q", r)
		}
		awaitPeerClosed(t, addr) // the worker has closed the pooled connection
		return raw(t, f.addr, req)
	}
	if r := send("GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 200") {
		t.Errorf("idempotent request on a stale connection: %q; want a resend and 200", r)
	}
	before := requests.Load()
	if r := send("POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"); !strings.HasPrefix(r, "HTTP/1.1 502") {
		t.Errorf("non-idempotent request on a stale connection: %q; want 502", r)
	}
	if got := requests.Load() - before; got != 1 { // the priming GET only
		t.Errorf("worker answered %d requests during the POST; want 1 (no silent resend)", got)
	}
}

// A worker that takes the request and never answers costs
// ResponseHeaderTimeout, then 504: never a hang.
func TestNoHang(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		block := make(chan struct{})
		defer close(block)
		_, f, _, _ := setupWith(t, loops, func(ctx *fasthttp.RequestCtx) { <-block },
			func(c *proxy.Config) { c.ResponseHeaderTimeout = 200 * time.Millisecond })
		start := time.Now()
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 504") {
			t.Errorf("response %q; want 504", resp)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("took %v", el)
		}
		expectMetric(t, f, "pinned_proxy_upstream_timeouts_total", 1)
		expectMetric(t, f, `pinned_proxy_responses_total{class="5xx"}`, 1)
	})
}

// Beyond MaxConns in flight plus MaxQueue waiting, requests get 503
// overloaded at once; a queued request that waits past QueueTimeout too.
func TestOverload(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		block := make(chan struct{})
		entered := make(chan struct{}, 10)
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			entered <- struct{}{}
			<-block
		})
		defer close(block)
		s := w.session("s", "k")
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", s)
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.Endpoint = proxy.EndpointConfig{MaxConns: 1, MaxQueue: 1, QueueTimeout: 200 * time.Millisecond}
		})

		first, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer first.Close()
		_, _ = io.WriteString(first, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		<-entered // holds the only connection

		queued := make(chan string)
		go func() { queued <- raw(t, f.addr, "GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n") }()
		waitFor(t, func() bool { return proxy.Inflight(s) == 2 })

		start := time.Now()
		resp := raw(t, f.addr, "GET /counter/c HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: overloaded") ||
			!strings.Contains(resp, "Retry-After:") {
			t.Errorf("beyond the queue: %q", resp)
		}
		if el := time.Since(start); el > 150*time.Millisecond {
			t.Errorf("refusal beyond the queue took %v; want immediate", el)
		}
		resp = <-queued
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: overloaded") {
			t.Errorf("queued past QueueTimeout: %q", resp)
		}
		expectMetric(t, f, "pinned_proxy_overloaded_total", 2)
	})
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

// awaitPeerClosed waits until no TCP connection to addr (a listener on
// 127.0.0.1) is established on this host any more: the FIN or the reset its
// server sent has reached the proxy's socket (/proc/net/tcp), an event a
// test cannot otherwise see.
func awaitPeerClosed(t *testing.T, addr string) {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	remote := fmt.Sprintf("0100007F:%04X", n) // 127.0.0.1, as the kernel prints it
	waitFor(t, func() bool {
		b, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			// sl local_address rem_address st ...; st 01 is ESTABLISHED.
			if f := strings.Fields(line); len(f) > 3 && f[2] == remote && f[3] == "01" {
				return false
			}
		}
		return true
	})
}

// Resolver failures become 503 + Retry-After with their reason.
func TestResolveErrors(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		res := proxytest.NewStatic()
		f := startProxy(t, loops, res, nil)
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: no_worker") ||
			!strings.Contains(resp, "Retry-After: 1") {
			t.Errorf("no worker: %q", resp)
		}
		res.SetError(errors.New("redis down"))
		resp = raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: store") {
			t.Errorf("store error: %q", resp)
		}
	})
}

// The janitor (Run) closes an endpoint that saw no request for a whole
// sweep interval and had nothing in flight, and the next request to its
// session simply gets a fresh one; an endpoint with a request in flight
// stays however long it takes.
func TestJanitorClosesIdleEndpoints(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		release := make(chan struct{})
		var hold atomic.Bool
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			if hold.Load() {
				<-release
			}
			ctx.SetBodyString("ok")
		})
		s := w.session("s", "k")
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", s)
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.EndpointSweepInterval = 100 * time.Millisecond })
		runProxy(t, f.p)
		get := func() {
			t.Helper()
			if resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(resp, "HTTP/1.1 200") {
				t.Fatalf("response %q", resp)
			}
		}
		get()
		expectMetric(t, f, "pinned_proxy_endpoints", 1)
		waitFor(t, func() bool { return metricValue(t, f, "pinned_proxy_endpoints") == 0 })
		expectMetric(t, f, "pinned_proxy_endpoints_closed_total", 1)
		get() // a fresh endpoint
		expectMetric(t, f, "pinned_proxy_endpoints", 1)

		// A request in flight keeps its endpoint through many sweeps.
		hold.Store(true)
		answered := make(chan string)
		go func() { answered <- raw(t, f.addr, "GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n") }()
		waitFor(t, func() bool { return proxy.Inflight(s) == 1 })
		closed := metricValue(t, f, "pinned_proxy_endpoints_closed_total")
		time.Sleep(time.Second) // ten sweep intervals: the endpoint must survive them all
		if metricValue(t, f, "pinned_proxy_endpoints") != 1 || metricValue(t, f, "pinned_proxy_endpoints_closed_total") != closed {
			t.Error("the janitor closed an endpoint with a request in flight")
		}
		close(release)
		if resp := <-answered; !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Errorf("the held request: %q", resp)
		}
	})
}

// Requests racing a janitor that sweeps all the time never fail because of
// it: an endpoint retired under a request is replaced by a fresh one.
func TestJanitorNeverFailsARequest(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") })
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.EndpointSweepInterval = time.Millisecond })
		runProxy(t, f.p)
		hc := &fasthttp.HostClient{Addr: f.addr, MaxConns: 8}
		defer hc.CloseIdleConnections()
		// Until the janitor has retired the endpoint ten times (bounded by 3 s):
		// the clients pause at random, so that the endpoint is sometimes idle
		// for a sweep or two and requests arrive as it is retired.
		var stop atomic.Bool
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					if code, _, err := hc.GetTimeout(nil, "http://"+f.addr+"/counter/a", 5*time.Second); err != nil || code != 200 {
						t.Errorf("request %d: %d %v", i, code, err)
						return
					}
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				}
			})
		}
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) &&
			metricValue(t, f, "pinned_proxy_endpoints_closed_total") < 10; {
			time.Sleep(10 * time.Millisecond) // polling a counter the janitor moves
		}
		stop.Store(true)
		wg.Wait()
		if n := metricValue(t, f, "pinned_proxy_endpoints_closed_total"); n == 0 {
			t.Error("the janitor never closed the endpoint: the race was not exercised")
		} else {
			t.Logf("the janitor closed the endpoint %v times under load", n)
		}
	})
}

// runProxy runs the proxy's janitor for the rest of the test.
func runProxy(t testing.TB, p *proxy.Proxy) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A pooled connection the worker reset while it sat idle fails the write
// before the kernel takes a byte: provably not sent, so even a POST goes
// again on a fresh connection, and the worker sees it once.
func TestResetPooledConnectionResent(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var posts atomic.Int64
		pooled, reset := make(chan struct{}), make(chan struct{})
		addr := serveRaw(t, func(c net.Conn, br *bufio.Reader) {
			var req fasthttp.Request
			if err := req.Read(br); err != nil {
				return
			}
			if req.Header.IsPost() {
				posts.Add(1)
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			if req.Header.IsGet() {
				// Reset the connection once the proxy has pooled it.
				<-pooled
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
				close(reset)
			}
		})
		f := proxyTo(t, loops, addr, nil)

		if r := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 200") {
			close(pooled)
			t.Fatalf("priming request: %q", r)
		}
		// Both engines give the worker connection back to their pool
		// before the client has the answer.
		close(pooled)
		<-reset
		awaitPeerClosed(t, addr) // the RST has arrived
		r := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
		if !strings.HasPrefix(r, "HTTP/1.1 200") {
			t.Errorf("POST after a reset: %q; want a resend and 200", r)
		}
		if n := posts.Load(); n != 1 {
			t.Errorf("worker saw the POST %d times; want 1", n)
		}
		var b strings.Builder
		f.p.Metrics().WritePrometheus(&b)
		// The fasthttp path meets the reset connection and resends (a retry);
		// a loop sees the reset on the idle connection and drops it first.
		want := "pinned_proxy_retries_total 1\n"
		if f.fr != nil {
			want = "pinned_proxy_retries_total 0\n"
		}
		if !strings.Contains(b.String(), want) {
			t.Errorf("retries metric, want %q:\n%s", want, b.String())
		}
	})
}

// A worker process restarted at a session's address answers the old
// session's requests 403 forbidden (it does not know that secret). The
// proxy treats it as an unreachable worker: the placement is re-checked and
// the request goes to the new holder, or the client gets 503 + Retry-After;
// the client never sees the 403.
func TestForbiddenFromRestartedWorkerIsNotPassedThrough(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		forbidden := func(ctx *fasthttp.RequestCtx) {
			ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonForbidden)
			ctx.SetStatusCode(fasthttp.StatusForbidden)
			ctx.SetBodyString(`{"error":"wrong or missing x-pinned-proxy-secret"}`)
		}
		// The placement moves: the request reaches the new holder.
		a, b, f, res := twoWorkers(t, loops, forbidden, echoBody, nil)
		resp := raw(t, f.addr, "POST /counter/a/incr HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nbody")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.HasSuffix(resp, "B:body") {
			t.Fatalf("response %q; want the new holder's 200", resp)
		}
		if n := res.Refusals(); n != 1 || len(a.requests()) != 1 || len(b.requests()) != 1 {
			t.Errorf("refusals %d, workers %d/%d; want 1, 1/1", n, len(a.requests()), len(b.requests()))
		}

		// The placement stays: 503 unreachable with Retry-After.
		w := startWorker(t, forbidden)
		ep := w.session("s", "k")
		res2 := proxytest.NewStatic()
		res2.PlaceNamespace("/counter", ep)
		f2 := startProxy(t, loops, res2, nil)
		resp = raw(t, f2.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "Retry-After: ") ||
			!strings.Contains(resp, "X-Pinned-Reason: unreachable") {
			t.Fatalf("response %q; want 503 unreachable", resp)
		}
		if res2.Refusals() == 0 {
			t.Error("the refusal was not reported to the resolver")
		}

		// An application's own 403 (no pinned reason) is just a response.
		w3 := startWorker(t, func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(fasthttp.StatusForbidden) })
		ep3 := w3.session("s3", "k3")
		res3 := proxytest.NewStatic()
		res3.PlaceNamespace("/counter", ep3)
		f3 := startProxy(t, loops, res3, nil)
		if resp = raw(t, f3.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(resp, "HTTP/1.1 403") {
			t.Fatalf("application 403: %q", resp)
		}
		if res3.Refusals() != 0 {
			t.Error("an application 403 was reported as a refusal")
		}
	})
}

// A request that reached a worker which closed without answering: an
// idempotent one is sent once more and, still unanswered, gets 503 +
// Retry-After (nothing can have gone wrong twice by processing it); any
// other gets 502 + Retry-After, never sent again (it may have been
// processed).
func TestNoAnswerNotResent(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		for _, tc := range []struct {
			req      string
			status   string
			requests int
		}{
			{"POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc", "HTTP/1.1 502", 1},
			{"PATCH /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 502", 1},
			{"GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 503", 2},
			{"HEAD /counter/a HTTP/1.1\r\nHost: h\r\n\r\n", "HTTP/1.1 503", 2},
		} {
			addr, requests := rawWorker(t, "") // reads the head, closes
			f := proxyTo(t, loops, addr, nil)
			resp := raw(t, f.addr, tc.req)
			method, _, _ := strings.Cut(tc.req, " ")
			if !strings.HasPrefix(resp, tc.status) || !strings.Contains(resp, "Retry-After: 1") {
				t.Errorf("%s to a worker that never answers: %q; want %s with Retry-After", method, resp, tc.status)
			}
			if got := requests(); got != tc.requests {
				t.Errorf("%s: the worker got it %d times; want %d", method, got, tc.requests)
			}
		}
	})
}

// Every proxied request carries its route's epoch (X-Pinned-Epoch); a host
// that answers 503 stale (an older epoch than its live instance) makes the
// proxy re-resolve like closing, and the request goes again with the new
// route's epoch.
func TestEpochSentAndStaleReresolved(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var stale atomic.Bool
		stale.Store(true)
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Request.Header.Peek(wire.HeaderEpoch)) == "7" && stale.Load() {
				hostUnavailable(wire.ReasonStale)(ctx)
				return
			}
			ctx.SetBody(ctx.Request.Header.Peek(wire.HeaderEpoch))
		})
		s := w.session("s", "k")
		res := proxytest.NewStatic()
		res.PlaceRoute("/counter/a", proxy.Route{Session: s, Epoch: 7})
		res.SetOnRefused(func(name string, r proxy.Route) {
			if r.Epoch == 7 {
				res.PlaceRoute(name, proxy.Route{Session: s, Epoch: 9})
			}
		})
		f := startProxy(t, loops, res, nil)
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nX-Pinned-Epoch: 1\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") || !strings.HasSuffix(resp, "\r\n\r\n9") {
			t.Fatalf("response %q; want 200 from the request sent again with epoch 9", resp)
		}
		reqs := w.requests()
		if len(reqs) != 2 || reqs[0].get(wire.HeaderEpoch) != "7" || len(reqs[1].headers[strings.ToLower(wire.HeaderEpoch)]) != 1 {
			t.Errorf("worker saw %d requests, epochs %v; want 7 then 9, the client's own dropped", len(reqs), reqs)
		}
	})
}

// recorded is a proxy.Recorder that keeps what it hears.
type recorded struct {
	mu   sync.Mutex
	recs []string
}

func (r *recorded) Record(name []byte, holder string, status int, reason string, bytes int64, latency time.Duration, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, fmt.Sprintf("%s %s %d %s %d", name, holder, status, reason, bytes))
	if latency < 0 || at.IsZero() {
		r.recs = append(r.recs, "bad latency or time")
	}
}

// The Recorder hears of every routed request: name, holder, status,
// reason, body bytes; refused requests (no route) are not recorded.
func TestRecorder(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		rec := &recorded{}
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("12345") })
		res := proxytest.NewStatic()
		res.Place("/counter/a", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.Recorder = rec })
		raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
		raw(t, f.addr, "GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n")      // not placed: 503 no_worker
		raw(t, f.addr, "GET /counter/%2e%2e HTTP/1.1\r\nHost: h\r\n\r\n") // refused: never routed
		rec.mu.Lock()
		defer rec.mu.Unlock()
		want := []string{"/counter/a s 200  8", "/counter/b  503 no_worker 0"}
		if fmt.Sprint(rec.recs) != fmt.Sprint(want) {
			t.Errorf("recorded %q; want %q", rec.recs, want)
		}
	})
}

// Deliver sends the pinboard's own requests on the proxy's path: routed,
// with the route's fields, keeping the caller's X-Pinned-* fields (a
// client's are stripped), re-resolved on a host's 503 closing; answers of
// any length come back (long ones cut), and the proxy's own replies too.
func TestDeliver(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/counter/big/_pinned/alarm" {
				ctx.SetBodyStream(strings.NewReader(strings.Repeat("y", proxy.DefaultMaxDeliverBody*2)), -1)
				return
			}
			ctx.SetBody(ctx.Request.Header.Peek(wire.HeaderAlarm))
		})
		s := w.session("s", "k")
		res := proxytest.NewStatic()
		res.PlaceRoute("/counter/a", proxy.Route{Session: s, Epoch: 5})
		res.Place("/counter/big", s)
		f := startProxy(t, loops, res, nil)

		do := func(path string) *fasthttp.Response {
			t.Helper()
			req, resp := &fasthttp.Request{}, &fasthttp.Response{}
			req.Header.SetMethod("POST")
			req.SetRequestURI(path)
			req.Header.Set(wire.HeaderAlarm, "1 1700000000000 tick")
			if err := f.p.Deliver(req, resp); err != nil {
				t.Fatalf("Deliver %s: %v", path, err)
			}
			return resp
		}
		if r := do("/counter/a/_pinned/alarm"); r.StatusCode() != 200 || string(r.Body()) != "1 1700000000000 tick" {
			t.Errorf("delivery: %d %q; want 200 and the alarm field seen by the worker", r.StatusCode(), r.Body())
		}
		got := w.last()
		if got.get(wire.HeaderSession) != "s" || got.get(wire.HeaderProxySecret) != "k" || got.get(wire.HeaderEpoch) != "5" {
			t.Errorf("worker saw session %q secret %q epoch %q", got.get(wire.HeaderSession), got.get(wire.HeaderProxySecret), got.get(wire.HeaderEpoch))
		}
		if r := do("/counter/big/_pinned/alarm"); r.StatusCode() != 200 || len(r.Body()) != proxy.DefaultMaxDeliverBody {
			t.Errorf("long answer: %d, %d bytes; want 200 cut at %d", r.StatusCode(), len(r.Body()), proxy.DefaultMaxDeliverBody)
		}
		if r := do("/counter/nowhere/_pinned/alarm"); r.StatusCode() != 503 || string(r.Header.Peek(wire.HeaderReason)) != wire.ReasonNoWorker {
			t.Errorf("unplaced id: %d %q; want 503 no_worker", r.StatusCode(), r.Header.Peek(wire.HeaderReason))
		}
		req, resp := &fasthttp.Request{}, &fasthttp.Response{}
		req.SetRequestURI("/counter")
		if err := f.p.Deliver(req, resp); err == nil {
			t.Error("Deliver to a path that names no object: no error")
		}
		// What the client sees of the same header: never forwarded.
		raw(t, f.addr, "POST /counter/a/_pinned/alarm HTTP/1.1\r\nHost: h\r\nX-Pinned-Alarm: 1 1 forged\r\nContent-Length: 0\r\n\r\n")
		if v := w.last().get(wire.HeaderAlarm); v != "" {
			t.Errorf("a client's X-Pinned-Alarm reached the worker: %q", v)
		}
	})
}

// A request that got no answer twice is taken for an unreachable worker, on
// both engines: the resolver hears of it (Refused) and re-checks the
// placement; when it moved, the idempotent request goes to the new holder,
// otherwise the client gets 503 unreachable. The worker saw it twice.
func TestNoAnswerTwiceIsUnreachable(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		silent, sent := rawWorker(t, "") // reads the head, closes
		b := startWorker(t, nil)
		sa := &proxy.Session{ID: "sess-a", Secret: "k", AdvertiseURL: "http://" + silent}
		sb := b.session("sess-b", "secret-b")
		res := proxytest.NewStatic()
		res.Place("/counter/a", sa)
		f := startProxy(t, loops, res, nil)

		// The placement stays.
		res.SetOnRefused(func(name string, r proxy.Route) { res.Place(name, r.Session) })
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: unreachable") {
			t.Errorf("response %q; want 503 unreachable", resp)
		}
		if n, r := sent(), res.Refusals(); n != 2 || r != 1 {
			t.Errorf("worker got the request %d times, refusals %d; want 2 and 1", n, r)
		}

		// The placement moves when the resolver re-checks it.
		res.SetOnRefused(func(name string, r proxy.Route) {
			if r.Session == sa {
				res.Place(name, sb)
			}
		})
		resp = raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") || len(b.requests()) != 1 {
			t.Errorf("response %q, new holder saw %d; want its 200", resp, len(b.requests()))
		}
		if n, r := sent(), res.Refusals(); n != 4 || r != 2 {
			t.Errorf("old worker got %d requests in all, refusals %d; want 4 and 2", n, r)
		}
	})
}

// An idempotent request met a pooled connection that the worker closed
// after reading it, without an answer: it is sent once more, and that was
// its one resend; no answer again and the client gets 503 unreachable. The
// worker saw it twice, on both engines.
func TestStaleConnectionResendIsTheOneResend(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var heads atomic.Int64
		addr := serveRaw(t, func(c net.Conn, br *bufio.Reader) {
			var req fasthttp.Request
			// The first request of all is answered; every later one is
			// read and left unanswered.
			for req.Read(br) == nil && heads.Add(1) == 1 {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", &proxy.Session{ID: "s", Secret: "k", AdvertiseURL: "http://" + addr})
		f := startProxy(t, loops, res, nil)

		// The answer is in the client's hands once the proxy has pooled
		// the connection.
		if r := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 200") {
			t.Fatalf("priming request: %q", r)
		}
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: unreachable") {
			t.Errorf("response %q; want 503 unreachable", resp)
		}
		if n := heads.Load() - 1; n != 2 {
			t.Errorf("the worker got the request %d times; want 2 (one resend)", n)
		}
	})
}

// sessionless is a resolver whose cache answers with a route that names no
// session: a miss, which Resolve settles.
type sessionless struct{ *proxytest.Static }

func (sessionless) Lookup([]byte, time.Time) (proxy.Route, bool) { return proxy.Route{}, true }

// A cached route without a session is a miss on both engines: the name is
// resolved, and the request reaches the holder Resolve names.
func TestCachedRouteWithoutSessionIsAMiss(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, sessionless{res}, nil)
		if resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Errorf("response %q; want the worker's 200", resp)
		}
		if n := res.Resolves(); n != 1 {
			t.Errorf("resolves = %d; want 1", n)
		}
	})
}
