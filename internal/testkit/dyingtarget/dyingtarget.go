// Package dyingtarget is an HTTP/1.1 target for load generator tests that
// dies mid-run like a killed server: on a real 127.0.0.1 port it answers a
// fixed number of requests (200, a two-byte body, keep-alive), then, at the
// next request, closes its listener and every connection, so that requests
// in flight fail and later connections are refused.
//
// Invariants: at most the given number of requests get an answer; the
// accept loop and every connection's goroutine are owned by the target and
// joined when the test ends.
package dyingtarget

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// Start serves answers requests, then dies; it returns the target's base
// URL, http://127.0.0.1:port.
func Start(tb testing.TB, answers int64) string {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	t := &target{ln: ln, conns: map[net.Conn]struct{}{}}
	t.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil || !t.track(c) {
				return
			}
			t.wg.Go(func() { t.serve(c, answers) })
		}
	})
	tb.Cleanup(func() {
		t.die()
		t.wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

type target struct {
	ln    net.Listener
	n     atomic.Int64 // requests read
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	dead  bool
}

// track records c, or closes it and reports false once the target died.
func (t *target) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead {
		c.Close()
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

// die closes the listener and every connection, once.
func (t *target) die() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead {
		return
	}
	t.dead = true
	t.ln.Close()
	for c := range t.conns {
		c.Close()
	}
}

// serve answers c's requests (without bodies) while the target has
// answers left.
func (t *target) serve(c net.Conn, answers int64) {
	r := bufio.NewReader(c)
	for {
		if _, err := http.ReadRequest(r); err != nil { // the requests have no body
			return
		}
		if t.n.Add(1) > answers {
			t.die()
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}
