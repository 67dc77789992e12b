package proxy_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// Ambiguous or malformed request framing is answered 400 and the connection
// closed; the worker sees nothing (RFC 9112 §6.1, §6.3; reliability §3).
// Some cases fasthttp refuses before the handler runs, the others the
// proxy's raw head scan catches: either way the outcome is the same.
func TestSmugglingRefused(t *testing.T) {
	w, f, _, _ := setup(t, nil)
	cases := []struct{ name, req string }{
		{"CL then TE", "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"TE then CL", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"},
		{"TE identity", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc"},
		{"TE identity alone", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n"},
		{"TE gzip, chunked", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"},
		{"TE chunked, chunked", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n"},
		{"two TE", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"TE on HTTP/1.0", "POST /counter/a HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"duplicate CL", "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"},
		{"differing CL", "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"},
		{"CL with sign", "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc"},
		{"CL hex", "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 0x3\r\n\r\nabc"},
		{"CL empty", "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n"},
		{"CL list", "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\nabc"},
		{"space before colon", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"},
		{"space in name", "GET /counter/a HTTP/1.1\r\nHost: h\r\nX Foo: 1\r\n\r\n"},
		{"empty name", "GET /counter/a HTTP/1.1\r\nHost: h\r\n: x\r\n\r\n"},
		{"no Host", "GET /counter/a HTTP/1.1\r\n\r\n"},
		{"two Host", "GET /counter/a HTTP/1.1\r\nHost: h\r\nHost: i\r\n\r\n"},
		{"bare CR in value", "GET /counter/a HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n"},
		{"NUL in value", "GET /counter/a HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n"},
		{"absolute-form host mismatch", "GET http://other/counter/a HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"bad chunk size", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"},
		{"chunk size with bare LF", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n"},
		{"chunk size 0x", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n"},
		{"chunk size underscore", "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\nabc\r\n0\r\n\r\n"},
		{"request line extra space", "GET  /counter/a HTTP/1.1\r\nHost: h\r\n\r\n"},
		{"bad version", "GET /counter/a HTTP/1.2x\r\nHost: h\r\n\r\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, _ = io.WriteString(conn, c.req)
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(conn)
			line, err := br.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "HTTP/1.1 400") {
				t.Fatalf("status line %q, %v; want 400", line, err)
			}
			// Then the connection closes: nothing pipelined behind the
			// request may be read as another request.
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			if rest, err := io.ReadAll(br); err != nil || strings.Contains(string(rest), "HTTP/1.1") {
				t.Fatalf("after the 400: %q, %v; want EOF", rest, err)
			}
		})
	}
	if n := len(w.requests()); n != 0 {
		t.Errorf("worker saw %d requests; want 0", n)
		for _, r := range w.requests() {
			t.Logf("  %s %s\n%s", r.method, r.uri, r.raw)
		}
	}
}

// obs-fold is accepted and replaced by a space before forwarding (RFC 9112
// §5.2 allows either).
func TestObsFoldReplaced(t *testing.T) {
	w, f, _, _ := setup(t, nil)
	resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nX-Long: a\r\n  b\r\n\r\n")
	if !strings.HasPrefix(resp, "HTTP/1.1 200") {
		t.Fatalf("response %q", resp)
	}
	if got := w.last().get("X-Long"); got != "a b" {
		t.Errorf("X-Long = %q; want %q", got, "a b")
	}
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

// A worker response with ambiguous framing or invalid fields becomes a 502;
// none of its bytes reach the client.
func TestResponseFramingRefused(t *testing.T) {
	cases := []struct{ name, answer string }{
		{"CL and TE", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"TE and CL", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"},
		{"TE gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc"},
		{"TE identity", "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc"},
		{"two CL", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"},
		{"CR in value", "HTTP/1.1 200 OK\r\nX-Evil: a\rSet-Cookie: x=1\r\nContent-Length: 3\r\n\r\nabc"},
		{"NUL in value", "HTTP/1.1 200 OK\r\nX-Evil: a\x00b\r\nContent-Length: 3\r\n\r\nabc"},
		{"space in name", "HTTP/1.1 200 OK\r\nX Evil: a\r\nContent-Length: 3\r\n\r\nabc"},
		{"bad status line", "HTTP/1.1 2000 OK\r\nContent-Length: 3\r\n\r\nabc"},
		{"101 to a plain request", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"},
		{"head too large", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 20<<10) + "\r\nContent-Length: 3\r\n\r\nabc"},
		{"truncated head", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addr, _ := rawWorker(t, c.answer)
			ep, err := proxy.NewEndpoint(proxy.EndpointConfig{}, "s", "k", "http://"+addr)
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			res := proxytest.NewStatic()
			res.PlaceNamespace("/counter", ep)
			f := startProxy(t, res, nil)
			resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
			if !strings.HasPrefix(resp, "HTTP/1.1 502") {
				t.Fatalf("response %q; want 502", resp)
			}
			if strings.Contains(resp, "abc") || strings.Contains(resp, "X-Evil") || strings.Contains(resp, "Set-Cookie") {
				t.Fatalf("worker bytes reached the client: %q", resp)
			}
		})
	}
}
