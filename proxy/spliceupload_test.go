package proxy_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
)

// splicedRequest reads the request side of pinned_proxy_spliced_bytes_total.
func splicedRequest(f *front) uint64 {
	return f.p.Metrics().GetOrCreateCounter(`pinned_proxy_spliced_bytes_total{direction="request"}`).Get()
}

// randomBytes returns n random bytes (seeded: a failure repeats).
func randomBytes(n int) []byte {
	r := rand.NewChaCha8([32]byte{byte(n), byte(n >> 8), byte(n >> 16)})
	b := make([]byte, n)
	_, _ = r.Read(b)
	return b
}

// digest is what digestWorker answers for a body: its length, its SHA-256
// and the Content-Length the worker saw (0 for none).
func digest(b []byte, cl int) string {
	sum := sha256.Sum256(b)
	return strconv.Itoa(len(b)) + " " + hex.EncodeToString(sum[:]) + " " + strconv.Itoa(max(cl, 0))
}

// digestOf is digest of what r reads.
func digestOf(r io.Reader, cl int) (string, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return strconv.FormatInt(n, 10) + " " + hex.EncodeToString(h.Sum(nil)) + " " + strconv.Itoa(max(cl, 0)), err
}

// pattern reads n bytes that differ from one offset to the next.
type pattern struct{ off, n int64 }

func (p *pattern) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	for i := range b {
		o := p.off + int64(i)
		b[i] = byte(o*7 + o/251)
	}
	p.off += int64(len(b))
	return len(b), nil
}

// digestWorker reads the request body whole and answers its digest.
func digestWorker(ctx *fasthttp.RequestCtx) {
	body := ctx.Request.Body()
	if rs := ctx.RequestBodyStream(); rs != nil {
		var err error
		if body, err = io.ReadAll(rs); err != nil {
			ctx.Error(err.Error(), 400)
			return
		}
	}
	ctx.SetBodyString(digest(body, ctx.Request.Header.ContentLength()))
}

// postHead is the head of a POST of n bytes to path.
func postHead(path string, n int) string { return bodyHead("POST", path, n) }

// bodyHead is the head of a request with a body of n bytes.
func bodyHead(method, path string, n int) string {
	return method + " " + path + " HTTP/1.1\r\nHost: h\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n"
}

// send writes head and body on c and reads one response (a failure names
// the head only).
func send(t *testing.T, c net.Conn, br *bufio.Reader, head string, body []byte) *fasthttp.Response {
	t.Helper()
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(body); err != nil {
		t.Fatal(err)
	}
	resp := &fasthttp.Response{}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if err := resp.Read(br); err != nil {
		t.Fatalf("reading the response to %q and %d bytes: %v", head, len(body), err)
	}
	return resp
}

// A Content-Length request body of at least SpliceMin goes through a loop
// with splice(2) and arrives byte for byte, with its Content-Length; the
// answer comes back, and the client's connection and the worker's serve the
// next request (one worker connection for all). With SpliceMin -1 the loop
// hands such a request over to the fasthttp engine, which copies it, as it
// does a body between ReplayBodyMax and SpliceMin.
func TestSplicedUploads(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		for _, off := range []bool{false, true} {
			w := startWorker(t, digestWorker)
			f := startProxy(t, loops, newStatic(w), func(c *proxy.Config) {
				c.SplicePipeSize = 128 << 10 // several rounds through the pipe
				if off {
					c.SpliceMin = -1
				}
			})
			c := dial(t, f.addr)
			br := bufio.NewReader(c)
			for _, n := range []int{64 << 10, 1 << 20, 5<<20 + 3} {
				body := randomBytes(n)
				before := splicedRequest(f)
				resp := send(t, c, br, postHead("/counter/x/up", n), body)
				if want := digest(body, n); resp.StatusCode() != 200 || string(resp.Body()) != want {
					t.Fatalf("%d bytes (splice off %v): %d %q; want 200 %q", n, off, resp.StatusCode(), resp.Body(), want)
				}
				got := splicedRequest(f) - before
				// What came with the head is sent from the loop's buffer:
				// at most a connection buffer's worth.
				wantSome := loops > 0 && !off
				if wantSome && (got < uint64(n-(64<<10)) || got > uint64(n)) || !wantSome && got != 0 {
					t.Errorf("%d bytes (loops %d, splice off %v): %d spliced", n, loops, off, got)
				}
				resp = rawResponse(t, c, br, "GET /counter/x/after HTTP/1.1\r\nHost: h\r\n\r\n")
				if want := digest(nil, 0); string(resp.Body()) != want {
					t.Fatalf("the request after %d bytes: %q; want %q", n, resp.Body(), want)
				}
			}
			handovers := metricValue(t, f, "pinned_proxy_handovers_total")
			switch {
			case loops > 0 && !off && (handovers != 0 || w.accepted.Load() != 1):
				t.Errorf("handovers %v, worker connections %d; want 0 and 1 (every exchange ended cleanly)", handovers, w.accepted.Load())
			case loops > 0 && off && handovers != 1:
				t.Errorf("splice off: handovers %v; want 1", handovers)
			}
		}
	})
}

// The bytes behind a spliced body are the next request, whether they came
// in the read that ended the body or stayed in the socket; a body that
// came whole with its head (within a connection buffer) is sent from it.
func TestSplicedUploadPipelined(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, digestWorker)
		f := startProxy(t, loops, newStatic(w), func(c *proxy.Config) { c.SpliceMin = 20 << 10 })
		c := dial(t, f.addr)
		br := bufio.NewReader(c)
		for _, n := range []int{20 << 10, 40<<10 + 1, 1 << 20} {
			body := randomBytes(n)
			get := "GET /counter/x/next" + strconv.Itoa(n) + " HTTP/1.1\r\nHost: h\r\n\r\n"
			if _, err := io.WriteString(c, postHead("/counter/x/up", n)+string(body)+get+get); err != nil {
				t.Fatal(err)
			}
			for i, want := range []string{digest(body, n), digest(nil, 0), digest(nil, 0)} {
				var resp fasthttp.Response
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if err := resp.Read(br); err != nil || string(resp.Body()) != want {
					t.Fatalf("%d bytes, answer %d: %q, %v; want %q", n, i, resp.Body(), err, want)
				}
			}
		}
		if loops > 0 {
			if got := metricValue(t, f, "pinned_proxy_handovers_total"); got != 0 {
				t.Errorf("handovers = %v; want 0", got)
			}
		}
	})
}

// bodyCounter is a worker that reads request heads and counts their
// bodies' bytes: a body that ends early (the connection closed) is
// reported on short and ends the connection; a whole one is answered "ok".
func bodyCounter(t *testing.T, short chan<- int64, conns *atomic.Int64) string {
	return serveRaw(t, func(c net.Conn, br *bufio.Reader) {
		conns.Add(1)
		for {
			var h fasthttp.RequestHeader
			if h.Read(br) != nil {
				return
			}
			cl := int64(max(h.ContentLength(), 0))
			n, _ := io.Copy(io.Discard, io.LimitReader(br, cl))
			if n < cl {
				short <- n
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
}

// A client that closes its connection mid-body: the worker sees the body
// cut off and its connection closed (never pooled with half a body), and
// the attempt is counted as the fasthttp engine counts it (one 4xx: the
// answer to a body cut off, which nobody reads); the next request gets a
// fresh worker connection and its answer.
func TestSplicedUploadClientCloses(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		short := make(chan int64, 4)
		var conns atomic.Int64
		f := proxyTo(t, loops, bodyCounter(t, short, &conns), nil)
		const n = 1 << 20
		c := dial(t, f.addr)
		if _, err := io.WriteString(c, postHead("/counter/x/up", n)+string(randomBytes(300<<10))); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		select {
		case got := <-short:
			if got >= n || got < 100<<10 {
				t.Errorf("the worker got %d bytes of the body; want the part sent, less than %d", got, n)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the worker's connection was not closed after the client left mid-body")
		}
		// Counted once the answer is decided, which follows the close.
		deadline := time.Now().Add(5 * time.Second)
		for metricValue(t, f, `pinned_proxy_responses_total{class="4xx"}`) != 1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := metricValue(t, f, `pinned_proxy_responses_total{class="4xx"}`); got != 1 {
			t.Errorf("4xx answers = %v; want 1 (the body cut off)", got)
		}
		if got := metricValue(t, f, "pinned_proxy_bad_gateway_total"); got != 0 {
			t.Errorf("bad gateway = %v; want 0 (the client broke the body, not the worker)", got)
		}
		resp := exchangeOnce(t, f.addr, "GET /counter/x/next HTTP/1.1\r\nHost: h\r\n\r\n")
		if string(resp.Body()) != "ok" || conns.Load() != 2 {
			t.Errorf("next request: %q on worker connection %d; want ok on a second one", resp.Body(), conns.Load())
		}
	})
}

// A worker that answers before it has read the body (and then reads the
// rest, as a fasthttp server does with what its handler left): as on the
// fasthttp engine, the body goes out whole, then the answer is read and
// relayed, and both connections serve the next request. An answer that
// came while the body was still coming, to a worker that reads nothing
// more until the client has it (the body's rest fits in the sockets'
// buffers, so nothing more happens on the worker's socket), is read once
// the body is out.
func TestSplicedUploadEarlyAnswer(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var conns atomic.Int64
		answered := make(chan struct{}, 1)
		early := make(chan struct{}, 1)
		addr := serveRaw(t, func(c net.Conn, br *bufio.Reader) {
			conns.Add(1)
			_ = c.(*net.TCPConn).SetReadBuffer(1 << 20)
			for {
				var h fasthttp.RequestHeader
				if h.Read(br) != nil {
					return
				}
				if h.ContentLength() <= 0 {
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					continue
				}
				_, _ = io.WriteString(c, "HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 5\r\n\r\nearly")
				if strings.Contains(string(h.RequestURI()), "wait") {
					early <- struct{}{}
					select {
					case <-answered:
					case <-time.After(10 * time.Second):
						return
					}
				}
				if n, _ := io.Copy(io.Discard, io.LimitReader(br, int64(h.ContentLength()))); n < int64(h.ContentLength()) {
					return
				}
			}
		})
		f := proxyTo(t, loops, addr, nil)
		c := dial(t, f.addr)
		br := bufio.NewReader(c)
		for _, tc := range []struct {
			path string
			n    int
		}{{"/counter/x/wait", 96 << 10}, {"/counter/x/drain", 3 << 20}} {
			body := randomBytes(tc.n)
			var resp *fasthttp.Response
			if strings.Contains(tc.path, "wait") {
				if _, err := io.WriteString(c, postHead(tc.path, tc.n)+string(body[:32<<10])); err != nil {
					t.Fatal(err)
				}
				select {
				case <-early:
				case <-time.After(5 * time.Second):
					t.Fatal("the worker did not answer the head")
				}
				// Nothing outside the loop can tell when it has seen the
				// answer: the pause makes it likely that it has before the
				// rest of the body comes (the test passes either way).
				time.Sleep(50 * time.Millisecond)
				resp = send(t, c, br, "", body[32<<10:])
				answered <- struct{}{}
			} else {
				resp = send(t, c, br, postHead(tc.path, tc.n), body)
			}
			if resp.StatusCode() != 413 || string(resp.Body()) != "early" {
				t.Fatalf("%s: early answer: %d %q; want 413 early", tc.path, resp.StatusCode(), resp.Body())
			}
			resp = rawResponse(t, c, br, "GET /counter/x/next HTTP/1.1\r\nHost: h\r\n\r\n")
			if string(resp.Body()) != "ok" || conns.Load() != 1 {
				t.Errorf("%s: next request: %q on worker connection %d; want ok on the same one", tc.path, resp.Body(), conns.Load())
			}
		}
	})
}

// A worker that answers before the body and closes without reading it
// fails the upload as on the fasthttp engine: the answer is never read (the
// body could not go out), the body is not held, so nothing is sent again
// (not even an idempotent PUT), and the client gets 502; the rest of its
// body is unread, so its connection closes after the answer (the loop
// lingers, so the client reads it; the fasthttp engine may reset it).
func TestSplicedUploadWorkerCloses(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var conns atomic.Int64
		addr := serveRaw(t, func(c net.Conn, br *bufio.Reader) {
			conns.Add(1)
			var h fasthttp.RequestHeader
			if h.Read(br) == nil {
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly")
			}
		})
		f := proxyTo(t, loops, addr, func(c *proxy.Config) { c.MaxRequestBodySize = -1 })
		c := dial(t, f.addr)
		const n = 32 << 20
		go func() {
			if _, err := io.WriteString(c, bodyHead("PUT", "/counter/x/up", n)); err == nil {
				_, _ = io.Copy(c, &zeros{n})
			}
		}()
		var resp fasthttp.Response
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		err := resp.Read(bufio.NewReader(c))
		switch {
		case err == nil && (resp.StatusCode() != 502 || !resp.ConnectionClose()):
			t.Errorf("worker closed mid-body: %d %q, close %v; want 502 and close", resp.StatusCode(), resp.Body(), resp.ConnectionClose())
		case err != nil && loops > 0:
			t.Errorf("worker closed mid-body: %v; want a 502", err)
		}
		if loops > 0 && !closedAfter(c, 5*time.Second) {
			t.Error("the client connection stayed open with its body unread")
		}
		if got := conns.Load(); got != 1 {
			t.Errorf("worker connections = %d; want 1 (a body not held is never sent again)", got)
		}
	})
}

// countingWriter counts what was written through it.
type countingWriter struct {
	w io.Writer
	n atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// A worker that does not read holds the client back: the loop splices from
// the client only when the worker has taken what it spliced before, so the
// client's sends stall after the sockets' buffers and one pipe, and the
// proxy's heap does not grow; other clients are served meanwhile. Once the
// worker reads, the body arrives whole.
func TestSplicedUploadBackpressure(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		release := make(chan struct{})
		releaseOnce := sync.OnceFunc(func() { close(release) })
		t.Cleanup(releaseOnce) // before serveRaw's, which waits for the worker
		got := make(chan string, 1)
		addr := serveRaw(t, func(c net.Conn, br *bufio.Reader) {
			for {
				var h fasthttp.RequestHeader
				if h.Read(br) != nil {
					return
				}
				if h.ContentLength() <= 0 {
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					continue
				}
				<-release
				d, err := digestOf(io.LimitReader(br, int64(h.ContentLength())), h.ContentLength())
				if err != nil {
					return
				}
				got <- d
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(d), d)
			}
		})
		f := proxyTo(t, loops, addr, func(c *proxy.Config) {
			c.MaxRequestBodySize = -1
			c.SplicePipeSize = 64 << 10
		})
		const n = 96 << 20
		stop := heapPeak()
		c := dial(t, f.addr)
		cw := &countingWriter{w: c}
		wrote := make(chan error, 1)
		go func() {
			_, err := io.WriteString(c, postHead("/counter/x/up", n))
			if err == nil {
				_, err = io.CopyBuffer(cw, &pattern{n: n}, make([]byte, 64<<10))
			}
			wrote <- err
		}()

		// Wait until the client's sends stall: nothing more for 200 ms.
		last, still := int64(-1), time.Now()
		for time.Since(still) < 200*time.Millisecond {
			if m := cw.n.Load(); m != last {
				last, still = m, time.Now()
			}
			select {
			case err := <-wrote:
				t.Fatalf("the client sent all %d bytes (%v) to a worker that reads nothing", n, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		if last > n/2 {
			t.Errorf("the client sent %d MiB to a worker that reads nothing; want it held back long before %d MiB", last>>20, n>>21)
		}
		t.Logf("stalled after %.1f MiB", float64(last)/(1<<20))
		// Others are served meanwhile.
		if resp := exchangeOnce(t, f.addr, "GET /counter/x/other HTTP/1.1\r\nHost: h\r\n\r\n"); string(resp.Body()) != "ok" {
			t.Errorf("another client, while one upload stalls: %q", resp.Body())
		}
		releaseOnce()
		select {
		case err := <-wrote:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the upload did not go on once the worker read")
		}
		want, _ := digestOf(&pattern{n: n}, n)
		select {
		case d := <-got:
			if d != want {
				t.Fatalf("the worker got %q; want %q", d, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the worker did not get the whole body")
		}
		var resp fasthttp.Response
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if err := resp.Read(bufio.NewReader(c)); err != nil || string(resp.Body()) != want {
			t.Fatalf("answer: %q, %v", resp.Body(), err)
		}
		if peak := stop(); peak > 24<<20 {
			t.Errorf("heap grew by %d MiB while a body of %d MiB waited for its worker", peak>>20, n>>20)
		}
	})
}

// A client that stops sending mid-body gets 408 naming the body after
// StreamIdleTimeout (and one that sends a head and no body, after
// HeaderTimeout), as on the fasthttp engine; the worker's connection, with
// part of a body, closes.
func TestSplicedUploadStalls(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		short := make(chan int64, 4)
		var conns atomic.Int64
		f := proxyTo(t, loops, bodyCounter(t, short, &conns), func(c *proxy.Config) {
			c.HeaderTimeout = 200 * time.Millisecond
			c.StreamIdleTimeout = 300 * time.Millisecond
		})
		const n = 1 << 20
		for _, sent := range []int{200 << 10, 0} {
			c := dial(t, f.addr)
			start := time.Now()
			if _, err := io.WriteString(c, postHead("/counter/x/up", n)+string(randomBytes(sent))); err != nil {
				t.Fatal(err)
			}
			var resp fasthttp.Response
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if err := resp.Read(bufio.NewReader(c)); err != nil {
				t.Fatalf("%d bytes sent, then nothing: %v", sent, err)
			}
			el := time.Since(start)
			if resp.StatusCode() != 408 || !strings.Contains(string(resp.Body()), "body") || !resp.ConnectionClose() || el > 3*time.Second {
				t.Errorf("%d bytes sent, then nothing: %d %q close %v after %v; want 408 naming the body, and close", sent, resp.StatusCode(), resp.Body(), resp.ConnectionClose(), el)
			}
			if sent > 0 {
				select {
				case got := <-short:
					if got > int64(sent) {
						t.Errorf("the worker got %d bytes; %d were sent", got, sent)
					}
				case <-time.After(5 * time.Second):
					t.Error("the worker's connection was not closed after the client stalled")
				}
			}
		}
	})
}
