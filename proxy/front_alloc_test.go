package proxy_test

import (
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// rawAnswerer is a worker that answers every request it reads with one
// fixed response, allocating nothing per request: it reads until the end of
// a head (requests carry no body here) and writes the answer.
func rawAnswerer(t *testing.T, answer string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				ans := []byte(answer)
				n := 0
				for {
					m, err := c.Read(buf[n:])
					if err != nil {
						return
					}
					n += m
					for {
						i := bytes.Index(buf[:n], []byte("\r\n\r\n"))
						if i < 0 {
							break
						}
						if _, err := c.Write(ans); err != nil {
							return
						}
						n = copy(buf, buf[i+4:n])
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// The loop path of a proxied request allocates nothing in steady state: a
// client and a worker that allocate nothing themselves, a request through
// the Front, its answer back; the allocations of the whole process over
// many requests are counted.
func TestLoopPathDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
	addr := rawAnswerer(t, answer)
	res := proxytest.NewStatic()
	res.PlaceRoute("/counter/a", proxy.Route{Session: &proxy.Session{ID: "s", Secret: "k", AdvertiseURL: "http://" + addr}, Epoch: 42})
	f := startProxy(t, loopEngine, res, nil)
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := []byte("GET /counter/a/x HTTP/1.1\r\nHost: h\r\nUser-Agent: t\r\n\r\n")
	buf := make([]byte, 4096)
	roundTrip := func() {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := c.Read(buf[n:])
			if err != nil && err != io.EOF {
				t.Fatal(err)
			}
			n += m
			if i := bytes.Index(buf[:n], []byte("\r\n\r\n")); i >= 0 && n >= i+4+2 {
				return
			}
			if m == 0 {
				t.Fatal("connection closed")
			}
		}
	}
	for range 200 { // warm the pools: exchanges, buffers, the worker connection
		roundTrip()
	}
	if !bytes.HasPrefix(buf, []byte("HTTP/1.1 200 OK")) {
		t.Fatalf("answer %q", buf[:64])
	}
	allocs := testing.AllocsPerRun(2000, roundTrip)
	// The runtime's own work (timers, the scheduler) may show as a stray
	// allocation now and then; a per-request allocation shows as ≥ 1.
	if allocs >= 0.5 {
		t.Errorf("%.2f allocations per proxied request through the loops; want 0", allocs)
	}
}
