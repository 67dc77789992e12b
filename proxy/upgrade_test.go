package proxy_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// wsWorker is a worker whose /counter/<id>/ws upgrades to a WebSocket that
// pushes "hello" and then echoes; anything else answers 426.
func wsWorker(t *testing.T) (*worker, *sync.WaitGroup) {
	t.Helper()
	var conns sync.WaitGroup
	up := websocket.FastHTTPUpgrader{CheckOrigin: func(*fasthttp.RequestCtx) bool { return true }}
	w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
		if !strings.HasSuffix(string(ctx.Path()), "/ws") {
			ctx.SetStatusCode(fasthttp.StatusUpgradeRequired)
			ctx.Response.Header.Set("Upgrade", "websocket")
			ctx.SetBodyString("upgrade elsewhere")
			return
		}
		conns.Add(1)
		err := up.Upgrade(ctx, func(c *websocket.Conn) {
			defer conns.Done()
			defer c.Close()
			if err := c.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
				return
			}
			for {
				mt, msg, err := c.ReadMessage()
				if err != nil {
					return
				}
				if err := c.WriteMessage(mt, msg); err != nil {
					return
				}
			}
		})
		if err != nil {
			conns.Done()
		}
	})
	// Hijacked connections outlive Shutdown: wait for their handlers.
	t.Cleanup(conns.Wait)
	return w, &conns
}

func dialWS(t *testing.T, addr, path string) (*websocket.Conn, error) {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 5 * time.Second}
	c, resp, err := d.Dial("ws://"+addr+path, nil)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	return c, err
}

// Echo and server push through the proxy, including a 4 MiB message, over
// the raw byte tunnel; the handshake carries the proxy's fields.
func TestWebSocketEcho(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, _ := wsWorker(t)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("sess-1", "secret-1"))
		f := startProxy(t, loops, res, nil)

		c, err := dialWS(t, f.addr, "/counter/a/ws")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, msg, err := c.ReadMessage(); err != nil || string(msg) != "hello" {
			t.Fatalf("push: %q, %v", msg, err)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 256<<10)
		for _, m := range [][]byte{[]byte("one"), big, []byte("three")} {
			if err := c.WriteMessage(websocket.BinaryMessage, m); err != nil {
				t.Fatal(err)
			}
			_, got, err := c.ReadMessage()
			if err != nil || !bytes.Equal(got, m) {
				t.Fatalf("echo of %d bytes: got %d bytes, %v", len(m), len(got), err)
			}
		}
		if n := f.p.OpenTunnels(); n != 1 {
			t.Errorf("open tunnels = %d; want 1", n)
		}
		expectMetric(t, f, "pinned_proxy_tunnels_open", 1)
		expectMetric(t, f, "pinned_proxy_tunnels_total", 1)
		expectMetric(t, f, `pinned_proxy_responses_total{class="1xx"}`, 1)
		r := w.last()
		if r.get(wire.HeaderProxySecret) != "secret-1" || !strings.EqualFold(r.get("Upgrade"), "websocket") ||
			!strings.EqualFold(r.get("Connection"), "upgrade") {
			t.Errorf("handshake fields: %v", r.headers)
		}
		_ = c.Close()
		waitFor(t, func() bool { return f.p.OpenTunnels() == 0 })
		expectMetric(t, f, "pinned_proxy_tunnels_open", 0)
	})
}

// A handshake the worker does not accept is relayed as a plain response,
// and no tunnel opens (0ang3el/websocket-smuggle scenario 1).
func TestWebSocketRefusalRelayed(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, _ := wsWorker(t)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, nil)

		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		hs := "GET /counter/a/nows HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
		resp := rawResponse(t, c, br, hs)
		if resp.StatusCode() != 426 || string(resp.Body()) != "upgrade elsewhere" {
			t.Fatalf("refusal: %d %q", resp.StatusCode(), resp.Body())
		}
		if f.p.OpenTunnels() != 0 {
			t.Errorf("a tunnel opened")
		}
		// The connection is still an HTTP connection: a smuggled request behind
		// the refused handshake is parsed as a request, not tunneled.
		if r := rawResponse(t, c, br, "GET /counter/a/x HTTP/1.1\r\nHost: h\r\n\r\n"); r.StatusCode() != 426 {
			t.Errorf("next request: %d", r.StatusCode())
		}
		if n := len(w.requests()); n != 2 {
			t.Errorf("worker saw %d requests; want 2", n)
		}
	})
}

// Only Upgrade: websocket in a proper handshake is accepted; h2c or any
// other protocol would tunnel past the routing (BishopFox h2csmuggler).
func TestUpgradeRefused(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, _ := wsWorker(t)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, nil)
		for _, req := range []string{
			"GET /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
			"GET /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket, h2c\r\nConnection: Upgrade\r\n\r\n",
			"GET /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
			"GET /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: TLS/1.0\r\nConnection: Upgrade\r\n\r\n",
			"GET /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n",
			"POST /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n",
			"GET /counter/a/ws HTTP/1.0\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		} {
			if resp := raw(t, f.addr, req); !strings.HasPrefix(resp, "HTTP/1.1 400") {
				t.Errorf("%q: %q; want 400", req, resp)
			}
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests; want 0", n)
		}
	})
}

// MaxTunnels caps open tunnels; past it, 503 overloaded.
func TestTunnelCap(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, _ := wsWorker(t)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.MaxTunnels = 1 })
		c, err := dialWS(t, f.addr, "/counter/a/ws")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		resp := raw(t, f.addr, "GET /counter/b/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 503") || !strings.Contains(resp, "X-Pinned-Reason: overloaded") {
			t.Errorf("second tunnel: %q", resp)
		}
		expectMetric(t, f, "pinned_proxy_tunnels_rejected_total", 1)
		expectMetric(t, f, "pinned_proxy_tunnels_total", 1)
		_ = c.Close()
		waitFor(t, func() bool { return f.p.OpenTunnels() == 0 })
		c2, err := dialWS(t, f.addr, "/counter/b/ws")
		if err != nil {
			t.Fatalf("after the first closed: %v", err)
		}
		_ = c2.Close()
	})
}

// Closing a placement's tunnels (it left the worker) ends them at once and
// leaves the worker's other tunnels alone; tunnels on the session the
// placement moved to stay.
func TestCloseTunnels(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, _ := wsWorker(t)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, nil)
		c, err := dialWS(t, f.addr, "/counter/a/ws")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		other, err := dialWS(t, f.addr, "/counter/b/ws")
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		_, _, _ = c.ReadMessage()     // hello
		_, _, _ = other.ReadMessage() // hello
		if n := f.p.OpenTunnels(); n != 2 {
			t.Fatalf("open tunnels = %d; want 2", n)
		}
		start := time.Now()
		f.p.CloseTunnels("/counter/a", "")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := c.ReadMessage(); err == nil {
			t.Fatal("read after CloseTunnels succeeded")
		}
		if el := time.Since(start); el > time.Second {
			t.Errorf("tunnel ended %v after CloseTunnels; want < 1s", el)
		}
		if err := other.WriteMessage(websocket.TextMessage, []byte("still")); err != nil {
			t.Fatalf("the other placement's tunnel: %v", err)
		}
		if _, msg, err := other.ReadMessage(); err != nil || string(msg) != "still" {
			t.Fatalf("the other placement's tunnel: %q %v", msg, err)
		}
		// Moved to the tunnel's own session: it stays.
		f.p.CloseTunnels("/counter/b", "s")
		if err := other.WriteMessage(websocket.TextMessage, []byte("kept")); err != nil {
			t.Fatalf("a tunnel on the new holder: %v", err)
		}
		if _, msg, err := other.ReadMessage(); err != nil || string(msg) != "kept" {
			t.Fatalf("a tunnel on the new holder: %q %v", msg, err)
		}
		// Moved elsewhere: it closes.
		f.p.CloseTunnels("/counter/b", "another")
		_ = other.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := other.ReadMessage(); err == nil {
			t.Fatal("read after CloseTunnels succeeded")
		}
		waitFor(t, func() bool { return f.p.OpenTunnels() == 0 })
	})
}

// A tunnel with no traffic either way for TunnelIdleTimeout closes; one with
// traffic in a single direction does not.
func TestTunnelIdle(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, _ := wsWorker(t)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.TunnelIdleTimeout = 400 * time.Millisecond })

		busy, err := dialWS(t, f.addr, "/counter/a/ws")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		_, _, _ = busy.ReadMessage()
		for i := 0; i < 20; i++ { // 20 × 50 ms, well past the idle timeout
			if err := busy.WriteMessage(websocket.TextMessage, []byte("x")); err != nil {
				t.Fatalf("busy tunnel closed after %d messages: %v", i, err)
			}
			if _, _, err := busy.ReadMessage(); err != nil {
				t.Fatalf("busy tunnel closed after %d messages: %v", i, err)
			}
			time.Sleep(50 * time.Millisecond)
		}

		idle, err := dialWS(t, f.addr, "/counter/b/ws")
		if err != nil {
			t.Fatal(err)
		}
		defer idle.Close()
		_, _, _ = idle.ReadMessage()
		start := time.Now()
		_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := idle.ReadMessage(); err == nil {
			t.Fatal("idle tunnel delivered a message")
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("idle tunnel closed after %v; want within two idle periods", el)
		}
	})
}

// Raw tunnel semantics with a plain TCP worker: bytes the worker sends with
// its 101 and bytes the client sends right behind its handshake both arrive,
// and a half-close travels each way (CloseWrite).
func TestTunnelBytesAndHalfClose(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		workerGot := make(chan string, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			var req fasthttp.Request
			if err := req.Read(br); err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nwelcome;")
			got, _ := io.ReadAll(br) // until the client's half-close
			workerGot <- string(got)
			_, _ = io.WriteString(c, "bye")
		}()
		defer func() { _ = ln.Close(); <-done }()
		f := proxyTo(t, loops, ln.Addr().String(), nil)

		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "GET /counter/a/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nearly;")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		var resp fasthttp.Response
		resp.SkipBody = true
		if err := resp.Read(br); err != nil || resp.StatusCode() != 101 {
			t.Fatalf("handshake: %d %v", resp.StatusCode(), err)
		}
		buf := make([]byte, len("welcome;"))
		if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "welcome;" {
			t.Fatalf("bytes after the 101: %q %v", buf, err)
		}
		_, _ = io.WriteString(c, "late")
		_ = c.(*net.TCPConn).CloseWrite()
		select {
		case got := <-workerGot:
			if got != "early;late" {
				t.Errorf("worker got %q; want %q", got, "early;late")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the client's half-close did not reach the worker")
		}
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "bye" {
			t.Errorf("after half-close the client read %q, %v; want %q then EOF", rest, err, "bye")
		}
		waitFor(t, func() bool { return f.p.OpenTunnels() == 0 })
	})
}

// watchingResolver is a Static resolver that records Watch and Unwatch
// calls. On Watch of "/counter/kill" it closes that name's tunnels, which
// reaches the tunnel only if it was registered before Watch.
type watchingResolver struct {
	*proxytest.Static
	p                *atomic.Pointer[proxy.Proxy]
	watched, unwatch chan string
}

func (o watchingResolver) Watch(name string) {
	if name == "/counter/kill" {
		o.p.Load().CloseTunnels(name, "")
	}
	o.watched <- name
}

func (o watchingResolver) Unwatch(name string) { o.unwatch <- name }

// A Resolver that implements TunnelWatcher hears of every tunnel once it is
// registered (so that a CloseTunnels for its name reaches it), exactly once
// each way, and of nothing for a refused handshake.
func TestTunnelWatcher(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, _ := wsWorker(t)
		res := watchingResolver{proxytest.NewStatic(), &atomic.Pointer[proxy.Proxy]{}, make(chan string, 4), make(chan string, 4)}
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, nil)
		res.p.Store(f.p)
		expect := func(ch chan string, call, want string) {
			t.Helper()
			select {
			case name := <-ch:
				if name != want {
					t.Errorf("%s(%q); want %s", call, name, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s(%s) was not called", call, want)
			}
		}
		c, err := dialWS(t, f.addr, "/counter/a/ws")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		expect(res.watched, "Watch", "/counter/a")
		if _, err := dialWS(t, f.addr, "/counter/b/other"); err == nil { // answered 426: no tunnel
			t.Fatal("a refused handshake opened a tunnel")
		}
		// Watch runs before the 101 is relayed: a tunnel its CloseTunnels
		// reaches ends before the client sees the handshake's answer.
		if k, err := dialWS(t, f.addr, "/counter/kill/ws"); err == nil {
			k.Close()
			t.Fatal("CloseTunnels from Watch did not reach the tunnel: it was not registered yet")
		}
		expect(res.watched, "Watch", "/counter/kill")
		expect(res.unwatch, "Unwatch", "/counter/kill")
		_ = c.Close()
		expect(res.unwatch, "Unwatch", "/counter/a")
		waitFor(t, func() bool { return f.p.OpenTunnels() == 0 })
		if n, m := len(res.watched), len(res.unwatch); n != 0 || m != 0 {
			t.Errorf("%d more Watch and %d more Unwatch calls; want none", n, m)
		}
	})
}
