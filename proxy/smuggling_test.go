package proxy_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/testkit/smuggle"
)

// The smuggling and framing table (internal/testkit/smuggle):
// every ambiguous or malformed request gets its status (400, or 413/431),
// exactly one response and a closed connection, and the worker receives
// not one byte. Some cases fasthttp refuses before the handler runs, the
// others the proxy's raw head scan or route check catches: either way the
// outcome is the same, and the table does not care which.
func TestSmugglingTable(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		cases := smuggle.Requests()
		t.Logf("smuggling table: %d request cases", len(cases))
		for _, c := range cases {
			t.Run(c.Name, func(t *testing.T) {
				before, bytesBefore := len(w.requests()), w.bytesIn.Load()
				r, err := smuggle.Send(f.addr, c.Raw, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if err := c.Check(r); err != nil {
					t.Errorf("%s: %v (%s)", c.Name, err, c.Why)
				} else if _, err := r.JSONError(); err != nil {
					t.Errorf("%s: %v", c.Name, err)
				}
				if n, b := len(w.requests())-before, w.bytesIn.Load()-bytesBefore; n != 0 || b != 0 {
					t.Errorf("%s: worker saw %d requests, %d bytes; want 0", c.Name, n, b)
				}
			})
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests in all; want 0", n)
			for _, r := range w.requests() {
				t.Logf("  %s %s\n%s", r.method, r.uri, r.raw)
			}
		}
	})
}

// The controls: valid requests that resemble the refused ones reach the
// worker exactly once, with their body. A front end refusing everything
// would pass the table above; not this. The tolerated cases are invalid
// bytes fasthttp consumes where the proxy cannot see them; the worker gets
// them regenerated, clean.
func TestSmugglingControls(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setupWith(t, loops, echoAny, nil)
		cases := append(smuggle.Controls(), smuggle.Tolerated()...)
		for _, c := range cases {
			t.Run(c.Name, func(t *testing.T) {
				before := len(w.requests())
				r, err := smuggle.Send(f.addr, withClose(c.Raw), 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if r.Status() != 200 || !strings.HasSuffix(string(r.Raw), "B:"+c.Body) {
					t.Fatalf("%s: %v %q; want 200 B:%s", c.Name, r.Statuses, r.Raw, c.Body)
				}
				seen := w.requests()[before:]
				if len(seen) != 1 {
					t.Fatalf("%s: worker saw %d requests; want 1", c.Name, len(seen))
				}
				if strings.ContainsAny(seen[0].raw, "\x00") || strings.Contains(seen[0].raw, "\r\n ") {
					t.Errorf("%s: worker got an unclean head %q", c.Name, seen[0].raw)
				}
			})
		}
	})
}

// echoAny answers with the request body, if any.
func echoAny(ctx *fasthttp.RequestCtx) {
	if ctx.Request.IsBodyStream() {
		echoBody(ctx)
		return
	}
	ctx.SetBody(append([]byte("B:"), ctx.Request.Body()...))
}

// withClose asks the front end to close after the response, so that
// smuggle.Send returns at once.
func withClose(raw string) string {
	return strings.Replace(raw, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1)
}

// A chunked body that breaks after its first chunk has already streamed to
// the worker (the proxy does not buffer chunked uploads, so that a streamed
// upload flows as it comes): the client gets 400 and a closed connection,
// and the worker's read of the body fails. It never sees a complete body,
// nor the request pipelined behind.
func TestLateChunkErrorTruncates(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var complete atomic.Int64
		w, f, _, _ := setupWith(t, loops, func(ctx *fasthttp.RequestCtx) {
			if _, err := io.ReadAll(ctx.RequestBodyStream()); err == nil {
				complete.Add(1)
			}
		}, nil)
		for _, c := range smuggle.LateChunkErrors() {
			t.Run(c.Name, func(t *testing.T) {
				r, err := smuggle.Send(f.addr, c.Raw, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Statuses) != 1 || r.Statuses[0] != 400 || !r.Closed {
					t.Errorf("%s: %v closed=%v %q; want one 400 and close", c.Name, r.Statuses, r.Closed, r.Raw)
				}
			})
		}
		for _, r := range w.requests() {
			if r.uri != "/counter/a" {
				t.Errorf("worker saw %s %s", r.method, r.uri)
			}
		}
		if n := complete.Load(); n != 0 {
			t.Errorf("worker read %d complete bodies; want 0", n)
		}
	})
}

// rawWorker accepts connections on 127.0.0.1, reads one request head from
// each and answers with a fixed byte string, then closes.
func rawWorker(t *testing.T, answer string) (addr string, requests func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := make(chan struct{}, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				line, err := br.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
			}
			n <- struct{}{}
			_, _ = io.WriteString(c, answer)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String(), func() int { return len(n) }
}

// The response side of the table: a worker answer with ambiguous framing or
// invalid fields becomes a 502 (the proxy's own JSON), and none of the
// worker's bytes reach the client.
func TestResponseSmugglingTable(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		cases := smuggle.Responses()
		t.Logf("smuggling table: %d response cases", len(cases))
		for _, c := range cases {
			t.Run(c.Name, func(t *testing.T) {
				addr, _ := rawWorker(t, c.Raw)
				f := proxyTo(t, loops, addr, nil)
				resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
				if !strings.HasPrefix(resp, "HTTP/1.1 502") || !strings.HasSuffix(resp, `{"error":"bad gateway"}`) {
					t.Fatalf("%s: response %q; want the proxy's 502 (%s)", c.Name, resp, c.Why)
				}
				if strings.Contains(resp, "EVIL") || strings.Contains(resp, "X-Evil") || strings.Contains(resp, "Set-Cookie") {
					t.Fatalf("%s: worker bytes reached the client: %q", c.Name, resp)
				}
				expectMetric(t, f, "pinned_proxy_bad_gateway_total", 1)
				expectMetric(t, f, `pinned_proxy_responses_total{class="5xx"}`, 1)
			})
		}
	})
}
