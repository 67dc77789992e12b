package proxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// sendWhole writes a request head announcing a body of n bytes, then the
// body, the way most clients do (everything before reading), and then
// reads one response. It returns the response, or the error that kept the
// client from reading one (a connection reset when the proxy closed with
// the body unread).
func sendWhole(t *testing.T, addr, target string, n int) (*fasthttp.Response, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	head := "POST " + target + " HTTP/1.1\r\nHost: h\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n"
	if _, err := io.WriteString(c, head); err != nil {
		return nil, err
	}
	body := make([]byte, 64<<10)
	for sent := 0; sent < n; {
		m, err := c.Write(body[:min(len(body), n-sent)])
		if err != nil {
			return nil, err
		}
		sent += m
	}
	resp := &fasthttp.Response{}
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		return nil, err
	}
	return resp, nil
}

// A client that sends its whole body before reading gets the proxy's
// refusal (413, 400), not a connection reset: the proxy lingers after a
// refusal whose body it did not read. With LingerTimeout negative it closes
// at once, and the reset is what the same client gets (the test's own
// check that it can see the difference).
func TestRefusalLingers(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		const big = 4 << 20 // past every socket buffer on the way
		run := func(t *testing.T, linger time.Duration) (refusals, resets int) {
			w := startWorker(t, nil)
			res := proxytest.NewStatic()
			s := w.session("s", "k")
			s.MaxBodyBytes = 1000
			res.PlaceNamespace("/counter", s)
			f := startProxy(t, loops, res, func(c *proxy.Config) {
				c.MaxRequestBodySize = 8 << 20
				c.LingerTimeout = linger
			})
			cases := []struct {
				target string
				n      int
				want   int
			}{
				{"/counter/a", big, 413},      // over the worker's limit
				{"/counter/a%2Fb", big, 400},  // refused on its target
				{"/counter/a", 16 << 20, 413}, // over MaxRequestBodySize: at once on the head
			}
			for _, c := range cases {
				resp, err := sendWhole(t, f.addr, c.target, c.n)
				switch {
				case err == nil && resp.StatusCode() == c.want:
					refusals++
				case err != nil && (errors.Is(err, io.EOF) || strings.Contains(err.Error(), "reset") || strings.Contains(err.Error(), "broken pipe")):
					resets++
				default:
					t.Errorf("%s with %d bytes: %v %v; want %d", c.target, c.n, resp, err, c.want)
				}
			}
			if n := len(w.requests()); n != 0 {
				t.Errorf("worker saw %d requests; want none", n)
			}
			return refusals, resets
		}
		t.Run("linger", func(t *testing.T) {
			if _, resets := run(t, 5*time.Second); resets != 0 {
				t.Errorf("%d refusals came as a reset; want every one read", resets)
			}
		})
		t.Run("at once", func(t *testing.T) {
			if _, resets := run(t, -1); resets == 0 {
				t.Errorf("no reset without lingering: the test cannot tell lingering from not")
			}
		})
	})
}

// A lingering connection closes after LingerTimeout even if the client
// keeps sending: after a refusal of the handler (the worker's limit) and
// after one a loop makes on the head (MaxRequestBodySize).
func TestLingerBounded(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		res := proxytest.NewStatic()
		s := w.session("s", "k")
		s.MaxBodyBytes = 10
		res.PlaceNamespace("/counter", s)
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.LingerTimeout = 200 * time.Millisecond
			c.MaxRequestBodySize = 1 << 20
		})
		for _, n := range []int{1 << 19, 1 << 21} {
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			resp := rawResponse(t, c, bufio.NewReader(c), "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: "+strconv.Itoa(n)+"\r\n\r\n"+strings.Repeat("x", 10<<10))
			if resp.StatusCode() != 413 {
				t.Fatalf("%d bytes: status %d; want 413", n, resp.StatusCode())
			}
			// Trickle on; the proxy must close within its LingerTimeout
			// (awaited with a generous bound).
			closed := false
			for deadline := time.Now().Add(5 * time.Second); !closed && time.Now().Before(deadline); {
				if _, err := c.Write([]byte("x")); err != nil {
					closed = true
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !closed {
				t.Errorf("%d bytes: the lingering connection still took bytes after 5s; want it closed after LingerTimeout (200ms)", n)
			}
		}
	})
}
