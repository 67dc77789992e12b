package proxy

import (
	"net"
	"sync"
	"syscall"
)

// deferMax bounds the bytes a client connection holds back (one buffered
// response, or the last write of one); larger writes go out at once.
const deferMax = 16 << 10

// Listener wraps ln so that the proxy's server answers a buffered response
// and waits for the client's next request with one syscall less: the last
// write of the response is held back and made inside the next read's
// RawConn wait (clientConn), the same write-then-await the exchange does
// with worker connections. Serve the proxy's server (NewServer) on it;
// connections that are not TCP pass through unchanged. Only responses the
// proxy answers whole are held back (never a stream, never a hijacked
// connection), and a held write is made before the connection reads, writes
// anything else, or closes.
func (p *Proxy) Listener(ln net.Listener) net.Listener { return &clientListener{Listener: ln} }

type clientListener struct{ net.Listener }

func (l *clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c, nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c, nil
	}
	cc := &clientConn{Conn: c, raw: raw}
	cc.awaitFn = cc.await
	return cc, nil
}

// clientConn is a client connection of the proxy's server. Reads and writes
// run on the connection's server goroutine (fasthttp serves a connection on
// one goroutine; a hijack handler takes over only once that goroutine is
// done with it); only Close may come from another one (the server closing
// idle connections at shutdown), so pending has a lock of its own, taken
// by this connection only.
//
// When the handler answered a request whole, it arms the connection
// (holdNext). fasthttp then writes the response and reads the next request:
// a read that almost always finds nothing yet (EAGAIN), after which Go's
// netpoller waits and reads again. Instead, the armed connection keeps the
// response's last write in pending, and the next Read makes it inside
// RawConn.Read, which clears the descriptor's readiness before the callback
// runs: the next request cannot arrive before the response has left, so its
// readiness edge is never lost, and the read that follows finds it at the
// first syscall.
type clientConn struct {
	net.Conn
	raw syscall.RawConn

	holdNext bool // armed by the handler for the response being written (server goroutine only)

	mu      sync.Mutex
	pending []byte // a held-back write (aliases buf)
	buf     []byte // made on the first held write, kept for the connection

	awaitFn    func(uintptr) bool // cc.await, made once
	awaitWrote bool
	awaitErr   error
}

// holdResponse arms c for the response the server is about to write.
func holdResponse(c net.Conn) {
	if cc, ok := c.(*clientConn); ok {
		cc.holdNext = true
	}
}

func (c *clientConn) Write(b []byte) (int, error) {
	if err := c.flush(); err != nil {
		return 0, err
	}
	if c.holdNext && len(b) <= deferMax {
		c.mu.Lock()
		if c.buf == nil {
			c.buf = make([]byte, 0, deferMax)
		}
		c.pending = append(c.buf[:0], b...)
		c.mu.Unlock()
		return len(b), nil
	}
	return c.Conn.Write(b)
}

// flush writes the held-back bytes, if any.
func (c *clientConn) flush() error {
	c.mu.Lock()
	b := c.pending
	c.pending = nil
	c.mu.Unlock()
	for len(b) > 0 {
		n, err := c.Conn.Write(b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func (c *clientConn) holding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) > 0
}

func (c *clientConn) Read(b []byte) (int, error) {
	c.holdNext = false
	if !c.holding() {
		return c.Conn.Read(b)
	}
	c.awaitWrote, c.awaitErr = false, nil
	_ = c.raw.Read(c.awaitFn) // a wait error (deadline, closed) is the read's below
	if !c.awaitWrote {
		if err := c.flush(); err != nil {
			return 0, err
		}
	} else if c.awaitErr != nil {
		return 0, c.awaitErr
	}
	return c.Conn.Read(b)
}

// await is Read's RawConn.Read callback: write what is held, then wait for
// the next request.
func (c *clientConn) await(uintptr) bool {
	if c.awaitWrote {
		return true
	}
	c.awaitWrote = true
	c.awaitErr = c.flush()
	return c.awaitErr != nil
}

func (c *clientConn) Close() error {
	_ = c.flush() // best effort: the response before a close
	return c.Conn.Close()
}

// NetConn returns the wrapped connection, after writing anything held back
// (a tunnel takes the raw connection over for splice and CloseWrite).
func (c *clientConn) NetConn() net.Conn {
	c.holdNext = false
	_ = c.flush()
	return c.Conn
}
