package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// These tests are about the event loops (proxy.Front): those that name
// loopEngine are about the loops' own mechanics (hand-over, streaming,
// tunnels, shutdown); the others hold for both engines.

// A client's Connection: close holds for the proxy's own replies too: the
// reply says so and the connection closes after it.
func TestCloseAfterOwnReply(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		f := startProxy(t, loops, proxytest.NewStatic(), nil) // nothing placed: 503 no_worker
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		resp := rawResponse(t, c, bufio.NewReader(c), "GET /counter/a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		if resp.StatusCode() != 503 || !resp.ConnectionClose() || len(resp.Header.Peek("Date")) == 0 {
			t.Errorf("reply %d, Connection: close %v, Date %q; want 503, close and a Date", resp.StatusCode(), resp.ConnectionClose(), resp.Header.Peek("Date"))
		}
		if !closedAfter(c, 2*time.Second) {
			t.Error("the connection stayed open after a reply to Connection: close")
		}
	})
}

// Requests pipelined in one write are answered in order, each by the worker.
func TestPipelinedRequests(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, func(ctx *fasthttp.RequestCtx) { ctx.SetBody(ctx.Path()) })
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var b strings.Builder
		for i := range 5 {
			b.WriteString("GET /counter/a/" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: h\r\n\r\n")
		}
		if _, err := io.WriteString(c, b.String()); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for i := range 5 {
			var resp fasthttp.Response
			if err := resp.Read(br); err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			if want := "/counter/a/" + strconv.Itoa(i); string(resp.Body()) != want {
				t.Errorf("response %d: %q; want %q (in order)", i, resp.Body(), want)
			}
		}
		if n := len(w.requests()); n != 5 {
			t.Errorf("worker saw %d requests; want 5", n)
		}
	})
}

// A connection a loop served goes on, after a request the loops leave to the
// fasthttp path (a chunked upload), on that path with nothing lost: the
// bytes already read included.
func TestHandoverKeepsBytes(t *testing.T) {
	w, f, _, _ := setup(t, loopEngine, func(ctx *fasthttp.RequestCtx) {
		body := ctx.Request.Body()
		if s := ctx.RequestBodyStream(); s != nil {
			body, _ = io.ReadAll(s)
		}
		ctx.SetBody(append([]byte(ctx.Path()), body...))
	})
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if r := rawResponse(t, c, br, "GET /counter/a/first HTTP/1.1\r\nHost: h\r\n\r\n"); string(r.Body()) != "/counter/a/first" {
		t.Fatalf("first: %q", r.Body())
	}
	// A chunked upload and a GET behind it, in one write.
	two := "POST /counter/a/up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" +
		"GET /counter/a/after HTTP/1.1\r\nHost: h\r\n\r\n"
	r := rawResponse(t, c, br, two)
	if string(r.Body()) != "/counter/a/upabc" {
		t.Errorf("chunked upload: %q", r.Body())
	}
	// A chunked request closes its connection (the smuggling policy):
	// the GET behind it is never read.
	if !r.ConnectionClose() || !closedAfter(c, 2*time.Second) {
		t.Errorf("connection after a chunked request: close %v", r.ConnectionClose())
	}
	if n := len(w.requests()); n != 2 {
		t.Errorf("worker saw %d requests; want 2", n)
	}
	if got := metricValue(t, f, "pinned_proxy_handovers_total"); got != 1 {
		t.Errorf("handovers = %v; want 1", got)
	}
}

// Bodies a loop does not buffer stream through it: a long one with its
// Content-Length, a chunked one re-chunked with its trailers, and one the
// worker ends by closing, sent chunked.
func TestLoopStreams(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	for _, tc := range []struct {
		name, answer, body string
		chunked            bool
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n" + big, big, false},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 1\r\n\r\n", "hello world", true},
		{"close-delimited", "HTTP/1.1 200 OK\r\n\r\n" + big, big, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := rawWorker(t, tc.answer)
			f := proxyTo(t, loopEngine, addr, nil)
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			resp := rawResponse(t, c, bufio.NewReader(c), "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
			if string(resp.Body()) != tc.body {
				t.Errorf("body of %d bytes; want %d", len(resp.Body()), len(tc.body))
			}
			if got := resp.Header.ContentLength() == -1; got != tc.chunked {
				t.Errorf("chunked to the client: %v; want %v", got, tc.chunked)
			}
			if tc.name == "chunked" && string(resp.Header.Peek("X-Sum")) != "1" {
				t.Errorf("trailer lost: %q", resp.Header.String())
			}
		})
	}
}

// A worker that breaks its chunked framing: before the head went out to the
// client, the client gets the proxy's 502; after, the client connection
// closes (nothing else can say the body is cut).
func TestLoopStreamBroken(t *testing.T) {
	addr, _ := rawWorker(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
	f := proxyTo(t, loopEngine, addr, nil)
	if r := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 502") {
		t.Errorf("broken in the first read: %q; want 502", r)
	}

	// The break comes after the head and a chunk went out: the worker
	// sends it once the client has them, and keeps its connection open
	// until the client's has closed (the break, not a close, ends it).
	relayed, ended := make(chan struct{}), make(chan struct{})
	addr = serveRaw(t, func(c net.Conn, br *bufio.Reader) {
		var req fasthttp.Request
		if req.Read(br) != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		select {
		case <-relayed:
		case <-ended: // the test failed before
			return
		}
		_, _ = io.WriteString(c, "zz\r\n")
		<-ended
	})
	defer close(ended)
	f = proxyTo(t, loopEngine, addr, nil)
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
	var got []byte
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for !bytes.Contains(got, []byte("5\r\nhello\r\n")) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("before the break: %q, %v; want the head and the first chunk", got, err)
		}
	}
	close(relayed)
	rest := readAllQuiet(c, 2*time.Second)
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 200")) || rest != "" {
		t.Errorf("client got %q then %q; want the head and the first chunk, then nothing", got, rest)
	}
	if !closedAfter(c, time.Second) {
		t.Error("connection left open after a broken stream")
	}
}

// Shutdown lets an exchange in progress finish (its answer says
// Connection: close), closes idle connections at once, and returns.
func TestFrontShutdownDrains(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
		entered <- struct{}{}
		<-release
		ctx.SetBodyString("done")
	})
	res := proxytest.NewStatic()
	res.PlaceNamespace("/counter", w.session("s", "k"))
	f := startProxy(t, loopEngine, res, nil)

	idle, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	busy := sendRaw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
	<-entered

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- f.fr.Shutdown(ctx)
	}()
	if !closedAfter(idle, 2*time.Second) {
		t.Error("an idle connection stayed open during Shutdown")
	}
	close(release)
	var resp fasthttp.Response
	_ = busy.SetReadDeadline(time.Now().Add(5 * time.Second))
	if err := resp.Read(bufio.NewReader(busy)); err != nil || string(resp.Body()) != "done" || !resp.ConnectionClose() {
		t.Errorf("busy connection: %q close %v, %v; want its answer with Connection: close", resp.Body(), resp.ConnectionClose(), err)
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// sendRaw opens a connection to addr and writes req on it, leaving the
// answer unread; the connection closes when the test ends.
func sendRaw(t *testing.T, addr, req string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c
}

// handOverKeepAlive opens a connection to f and sends it a request the loops
// hand over to the fasthttp path (an absolute-form target) whose answer
// keeps the connection open; it checks that the request was handed over.
func handOverKeepAlive(t *testing.T, f *front) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := rawResponse(t, c, bufio.NewReader(c), "GET http://h/counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
	if r.StatusCode() != 200 || r.ConnectionClose() {
		t.Fatalf("handed-over request: %d, close %v; want 200 on a kept-alive connection", r.StatusCode(), r.ConnectionClose())
	}
	if got := metricValue(t, f, "pinned_proxy_handovers_total"); got != 1 {
		t.Fatalf("handovers = %v; want 1", got)
	}
	return c
}

// shutdownWithin runs f's Shutdown with a context of timeout and returns its
// error, failing the test when it has not returned within bound (the test's
// own deadline, above timeout).
func shutdownWithin(t *testing.T, f *front, timeout, bound time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		done <- f.fr.Shutdown(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(bound):
		t.Fatalf("Shutdown(%v) has not returned after %v", timeout, bound)
		return nil
	}
}

// An idle keep-alive connection handed over to the fasthttp path (a
// worker's heartbeat connection to the pinboard is one) is closed by
// Shutdown like an idle one on a loop: Shutdown returns at once, without
// waiting for its deadline.
func TestFrontShutdownClosesIdleHandedOverConnection(t *testing.T) {
	_, f, _, _ := setup(t, loopEngine, nil)
	c := handOverKeepAlive(t, f)
	start := time.Now()
	if err := shutdownWithin(t, f, time.Minute, 20*time.Second); err != nil {
		t.Errorf("Shutdown = %v; want nil (nothing was busy)", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Shutdown took %v with one idle connection", d)
	}
	if !closedAfter(c, 5*time.Second) {
		t.Error("the handed-over connection stayed open after Shutdown")
	}
}

// A handed-over connection whose request the worker never answers is
// closed when Shutdown's context ends, and Shutdown returns then with the
// context's error, not when the request ends.
func TestFrontShutdownDeadlineClosesBusyHandedOverConnection(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	_, f, _, _ := setup(t, loopEngine, func(ctx *fasthttp.RequestCtx) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		ctx.SetBodyString("late")
	})
	defer close(release) // the worker's handler ends with the test
	c := sendRaw(t, f.addr, "GET http://h/counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
	<-entered
	if err := shutdownWithin(t, f, time.Second, 20*time.Second); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v; want context.DeadlineExceeded (a request was still waiting)", err)
	}
	if !closedAfter(c, 5*time.Second) {
		t.Error("the busy handed-over connection stayed open after Shutdown's deadline")
	}
}

// Connections are dealt out to every loop, and each loop's requests reach
// the worker.
func TestSeveralLoops(t *testing.T) {
	w := startWorker(t, nil)
	res := proxytest.NewStatic()
	res.PlaceNamespace("/counter", w.session("s", "k"))
	p, err := proxy.New(proxy.Config{Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	fr, err := p.NewFront(proxy.FrontConfig{Loops: 3, Fallback: p.NewServer()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = fr.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = fr.Shutdown(ctx)
		<-served
		_ = ln.Close()
		_ = p.Close()
	}()
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			for range 20 {
				if r := raw(t, ln.Addr().String(), "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 200") {
					t.Errorf("response %q", r)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := len(w.requests()); n != 240 {
		t.Errorf("worker saw %d requests; want 240", n)
	}
	// Three loops, each with its own pool: the worker sees a connection
	// from each (at least two, should the dealing be uneven).
	if n := w.accepted.Load(); n < 2 {
		t.Errorf("worker accepted %d connections; want one per loop", n)
	}
}

// A loop serves a WebSocket handshake and its tunnel itself: no hand-over,
// the tunnel counted while open, echo through it, and gone once closed.
func TestLoopTunnel(t *testing.T) {
	w, _ := wsWorker(t)
	res := proxytest.NewStatic()
	res.PlaceNamespace("/counter", w.session("s", "k"))
	f := startProxy(t, loopEngine, res, nil)
	c, err := dialWS(t, f.addr, "/counter/a/ws")
	if err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.ReadMessage(); err != nil || string(msg) != "hello" {
		t.Fatalf("push: %q, %v", msg, err)
	}
	for i := range 50 {
		want := strings.Repeat(strconv.Itoa(i), 1+i*997)
		if err := c.WriteMessage(websocket.BinaryMessage, []byte(want)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := c.ReadMessage(); err != nil || string(got) != want {
			t.Fatalf("echo %d: %d bytes, %v", i, len(got), err)
		}
	}
	if n := f.p.OpenTunnels(); n != 1 {
		t.Errorf("open tunnels = %d; want 1", n)
	}
	if got := metricValue(t, f, "pinned_proxy_handovers_total"); got != 0 {
		t.Errorf("handovers = %v; want 0 (the loop serves WebSockets)", got)
	}
	_ = c.Close()
	waitFor(t, func() bool { return f.p.OpenTunnels() == 0 })
	f.p.CloseTunnels("/counter/a", "") // nothing left to close: no effect
}

// RFC 9112 §2.3: a major version other than 1 gets 505 and a closed
// connection, the worker sees nothing; a 1.x minor version is served.
func TestVersionNotSupported(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		resp := rawResponse(t, c, bufio.NewReader(c), "GET /counter/a HTTP/3.1\r\nHost: h\r\n\r\n")
		if resp.StatusCode() != 505 || !resp.ConnectionClose() {
			t.Errorf("HTTP/3.1: %d close %v; want 505 and close", resp.StatusCode(), resp.ConnectionClose())
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests", n)
		}
		if r := raw(t, f.addr, "GET /counter/a HTTP/1.2\r\nHost: h\r\n\r\n"); !strings.HasPrefix(r, "HTTP/1.1 200") {
			t.Errorf("HTTP/1.2: %q; want it served as 1.1", r)
		}
	})
}

// A head announcing a body over MaxRequestBodySize gets 413 at once, before
// any byte of the body is sent.
func TestAnnouncedTooLargeAtOnce(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setupWith(t, loops, nil, func(c *proxy.Config) { c.MaxRequestBodySize = 1 << 20 })
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		resp := rawResponse(t, c, bufio.NewReader(c), "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 2097152\r\n\r\n")
		if resp.StatusCode() != 413 || !resp.ConnectionClose() {
			t.Errorf("announced 2 MiB: %d close %v; want 413 and close", resp.StatusCode(), resp.ConnectionClose())
		}
		if el := time.Since(start); el > time.Second {
			t.Errorf("413 after %v; want at once", el)
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests", n)
		}
	})
}
