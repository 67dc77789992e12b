package pinboard

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/proxy"
)

// The death probe decides on what the kernel and the process at the
// address say: three refusals in a row, or a process that does not know
// the secret, prove the session's process gone; an answer of the process
// itself, or a timeout, keeps the lease; a connection dropped without an
// answer (a process still exiting) proves nothing and the probe goes on.
func TestDeathProbe(t *testing.T) {
	answer := func(status int, reason string) func(net.Conn) {
		return func(c net.Conn) {
			defer c.Close()
			var req fasthttp.Request
			_ = c.SetDeadline(time.Now().Add(time.Second))
			buf := make([]byte, 4096)
			n, _ := c.Read(buf)
			_ = req.Read(bufioReader(buf[:n]))
			var resp fasthttp.Response
			resp.SetStatusCode(status)
			if reason != "" {
				resp.Header.Set(wire.HeaderReason, reason)
			}
			w := bufio.NewWriter(c)
			_ = resp.Write(w)
			_ = w.Flush()
		}
	}
	for _, c := range []struct {
		name  string
		steps []func(net.Conn) // per attempt: nil is a refused dial
		hang  bool             // a connection that never answers
		dead  bool
		dials int
	}{
		{name: "refused three times", steps: []func(net.Conn){nil, nil, nil}, dead: true, dials: 3},
		{name: "another process (403 forbidden)", steps: []func(net.Conn){answer(403, wire.ReasonForbidden), answer(403, wire.ReasonForbidden), nil}, dead: true, dials: 3},
		{name: "the session's process answers", steps: []func(net.Conn){nil, answer(404, "")}, dead: false, dials: 2},
		{name: "a 403 without the reason is not another pinned process", steps: []func(net.Conn){answer(403, "")}, dead: false, dials: 1},
		{name: "dropped while exiting, then refused", steps: []func(net.Conn){nil, func(c net.Conn) { c.Close() }, nil, nil, nil}, dead: true, dials: 5},
		{name: "dropped every time", steps: []func(net.Conn){func(c net.Conn) { c.Close() }, func(c net.Conn) { c.Close() }, func(c net.Conn) { c.Close() },
			func(c net.Conn) { c.Close() }, func(c net.Conn) { c.Close() }, func(c net.Conn) { c.Close() }, func(c net.Conn) { c.Close() }, func(c net.Conn) { c.Close() }}, dead: false, dials: 8},
		{name: "accepted, no answer (frozen)", hang: true, dead: false, dials: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dials atomic.Int32
			d := deathProbe{dial: func(addr string, timeout time.Duration) (net.Conn, error) {
				i := int(dials.Add(1)) - 1
				if c.hang {
					a, b := net.Pipe()
					t.Cleanup(func() { a.Close(); b.Close() })
					return a, nil
				}
				if i >= len(c.steps) || c.steps[i] == nil {
					return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
				}
				a, b := net.Pipe()
				go c.steps[i](b)
				return a, nil
			}}
			dead, err := d.confirm(context.Background(), &proxy.Session{ID: "s", Secret: "x", AdvertiseURL: "http://127.0.0.1:9"})
			if err != nil || dead != c.dead || int(dials.Load()) != c.dials {
				t.Fatalf("confirm = %v, %v after %d dials; want %v after %d", dead, err, dials.Load(), c.dead, c.dials)
			}
		})
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
