package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestListenerSavesARead: served on p.Listener, a client connection costs
// one read syscall per request (the response's write waits for the next
// read's RawConn wait), not the two of a read right after the write; and
// what the client gets is unchanged, whatever the response: small, larger
// than what is held back, streamed, with Connection: close, pipelined.
func TestListenerSavesARead(t *testing.T) {
	big := bytes.Repeat([]byte("b"), 100<<10) // buffered by the proxy, written in more than one piece
	r := newTCPRigWith(t, func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/counter/big/":
			ctx.SetBody(big)
		case "/counter/stream/":
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for i := range 50 {
					fmt.Fprintf(w, "line %d\n", i)
					_ = w.Flush()
				}
			})
		default:
			ctx.SetBodyString(`{"count":1}`)
		}
	}, false, countedListener)
	defer r.close()

	c, err := net.Dial("tcp", r.client.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	var resp fasthttp.Response
	do := func(path string) []byte {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: h\r\n\r\n", path); err != nil {
			t.Fatal(err)
		}
		resp.Reset()
		if err := resp.Read(br); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		if resp.StatusCode() != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode(), resp.Body())
		}
		return append([]byte(nil), resp.Body()...)
	}
	do("/counter/a/") // warm up
	const n = 300
	r.creads.Store(0)
	for range n {
		if b := do("/counter/a/"); string(b) != `{"count":1}` {
			t.Fatalf("body %q", b)
		}
	}
	// One read per request, a few spurious wake-ups tolerated; reading
	// right after the response costs about 2n.
	if got := r.creads.Load(); got > n+n/5 {
		t.Errorf("%d read syscalls on the client connection for %d requests; want about %d", got, n, n)
	}
	if b := do("/counter/big/"); !bytes.Equal(b, big) {
		t.Fatalf("big body: %d bytes", len(b))
	}
	if b := do("/counter/stream/"); !strings.HasPrefix(string(b), "line 0\n") || !strings.HasSuffix(string(b), "line 49\n") {
		t.Fatalf("streamed body %q", b)
	}
	// Two pipelined requests: both answers arrive.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /counter/a/ HTTP/1.1\r\nHost: h\r\n\r\nGET /counter/a/ HTTP/1.1\r\nHost: h\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		resp.Reset()
		if err := resp.Read(br); err != nil || string(resp.Body()) != `{"count":1}` {
			t.Fatalf("pipelined %d: %v %q", i, err, resp.Body())
		}
	}
	// A response after which the server closes the connection (the
	// client asked for it) is written before the close.
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /counter/a/ HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp.Reset()
	if err := resp.Read(br); err != nil || string(resp.Body()) != `{"count":1}` {
		t.Fatalf("Connection: close: %v %q", err, resp.Body())
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("after Connection: close: %v; want EOF", err)
	}
}
