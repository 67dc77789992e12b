package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
)

// spliced reads the response side of pinned_proxy_spliced_bytes_total.
func spliced(f *front) uint64 {
	return f.p.Metrics().GetOrCreateCounter(`pinned_proxy_spliced_bytes_total{direction="response"}`).Get()
}

// patterned returns n bytes that differ from one offset to the next (a
// moved, lost or repeated piece shows).
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// A Content-Length body of at least SpliceMin goes through a loop with
// splice(2), byte for byte, on a connection that serves the next request
// (the worker's too: it is reused); a smaller one, and any with SpliceMin
// -1, is copied; the fasthttp engine never splices.
func TestSplicedBodies(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		bodies := map[string][]byte{"big": patterned(3<<20 + 17), "edge": patterned(64 << 10), "small": patterned(64<<10 - 1)}
		for _, off := range []bool{false, true} {
			w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
				name := strings.TrimPrefix(string(ctx.Path()), "/counter/x/")
				ctx.SetBodyStream(bytes.NewReader(bodies[name]), len(bodies[name]))
			})
			f := startProxy(t, loops, newStatic(w), func(c *proxy.Config) {
				c.SplicePipeSize = 128 << 10 // several rounds through the pipe
				if off {
					c.SpliceMin = -1
				}
			})
			c := dial(t, f.addr)
			br := bufio.NewReader(c)
			for round := range 2 {
				for _, name := range []string{"big", "small", "edge"} {
					before := spliced(f)
					resp := rawResponse(t, c, br, "GET /counter/x/"+name+" HTTP/1.1\r\nHost: h\r\n\r\n")
					if resp.StatusCode() != 200 || !bytes.Equal(resp.Body(), bodies[name]) {
						t.Fatalf("round %d, %s (splice off %v): status %d, %d bytes, equal %v; want 200 and the %d bytes sent",
							round, name, off, resp.StatusCode(), len(resp.Body()), bytes.Equal(resp.Body(), bodies[name]), len(bodies[name]))
					}
					got := spliced(f) - before
					wantSome := loops > 0 && !off && name != "small"
					// What came with the head is copied: at most a read's worth.
					if wantSome && got < uint64(len(bodies[name])-(64<<10)) || !wantSome && got != 0 {
						t.Errorf("round %d, %s (loops %d, splice off %v): %d bytes spliced of %d", round, name, loops, off, got, len(bodies[name]))
					}
				}
			}
			_ = c.Close()
			if n := w.accepted.Load(); loops > 0 && n != 1 {
				t.Errorf("splice off %v: the worker saw %d connections for 6 answers in sequence; want 1 (reused after every streamed body)", off, n)
			}
		}
	})
}

// A worker that ends a spliced body early, or sends more than it
// announced, never has its connection reused: the client's connection
// closes after the bytes it got (its head is out, so nothing else can tell
// it), and the next request gets a fresh worker connection and its right
// answer.
func TestSplicedBodyFraming(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		const n = 256 << 10
		body := patterned(n)
		addr := serveRaw(t, func(c net.Conn, br *bufio.Reader) {
			for {
				var rq fasthttp.Request
				if rq.Read(br) != nil {
					return
				}
				req := string(rq.RequestURI())
				switch {
				case strings.Contains(req, "/short"):
					fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", n)
					_, _ = c.Write(body[:n/2])
					return // closes early
				case strings.Contains(req, "/long"):
					// One write: the surplus is in the proxy's socket when
					// the body's last byte is.
					msg := fmt.Appendf(nil, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", n)
					msg = append(append(msg, body...), "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nbogus"...)
					_, _ = c.Write(msg)
				default:
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			}
		})
		f := proxyTo(t, loops, addr, nil)

		c := dial(t, f.addr)
		fmt.Fprint(c, "GET /counter/x/short HTTP/1.1\r\nHost: h\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		_ = c.Close()
		// A loop relays every byte the worker sent; the fasthttp engine
		// may drop the last read of a broken stream (its body stream fails).
		whole := loops == 0 || bytes.HasSuffix(got, body[n/2-100:n/2])
		if err != nil || !bytes.HasPrefix(got, []byte("HTTP/1.1 200 OK\r\n")) || len(got) >= n || !whole {
			t.Errorf("a body cut at half: got %d bytes (%v) starting %q; want the head and the half, then the connection closed", len(got), err, got[:min(len(got), 80)])
		}

		c = dial(t, f.addr)
		br := bufio.NewReader(c)
		resp := rawResponse(t, c, br, "GET /counter/x/long HTTP/1.1\r\nHost: h\r\n\r\n")
		if !bytes.Equal(resp.Body(), body) {
			t.Fatalf("the announced body: %d bytes, equal %v", len(resp.Body()), bytes.Equal(resp.Body(), body))
		}
		for i := range 3 {
			resp = rawResponse(t, c, br, "GET /counter/x/ok"+strconv.Itoa(i)+" HTTP/1.1\r\nHost: h\r\n\r\n")
			if string(resp.Body()) != "ok" {
				t.Fatalf("after a worker sent more than it announced, request %d got %q; want ok (the surplus must never be taken for an answer)", i, resp.Body())
			}
		}
		_ = c.Close()
	})
}
