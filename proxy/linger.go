package proxy

import (
	"bytes"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Lingering close on the fasthttp path (the loops do the same in
// clientConn.startLinger). When the proxy closes a connection after refusing a
// request whose body it did not read, closing at once would leave unread
// bytes in the socket, the kernel would answer them with a reset, and the
// reset makes the client's kernel throw the refusal away before the client
// reads it: a client that sends its whole body before reading (most do)
// sees "connection reset" instead of 413. So the refusal is written, the
// sending side shut down, and input discarded until the client closes or
// LingerTimeout passes.
//
// The handler's refusals linger, and so do ExpectHandler's (the refusals a
// head decides: a body over a limit, announced). A refusal of fasthttp's
// own parser (ServerError) cannot linger: fasthttp writes it and closes.
// The loops see every head first and refuse most of those themselves, so
// this matters mostly for a proxy served by NewServer alone.

// bodyUnread reports whether the request announced a body that was not
// read to its end.
func (x *exchange) bodyUnread() bool {
	if x.bodyRead {
		return false
	}
	cl := x.ctx.Request.Header.ContentLength()
	return cl > 0 || cl == -1
}

// lingerClose makes the server hand the connection over (Hijack) instead
// of writing ctx.Response and closing: linger writes the response, shuts
// the sending side down and discards input.
func (p *Proxy) lingerClose(ctx *fasthttp.RequestCtx) {
	var b bytes.Buffer
	if _, err := ctx.Response.WriteTo(&b); err != nil {
		return // the server writes it and closes, as without lingering
	}
	out := b.Bytes()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { p.linger(c, out) })
}

// linger writes out on c, shuts c's sending side down and reads c to its
// end or for LingerTimeout; the server closes c after it returns. Close
// cuts it short.
func (p *Proxy) linger(c net.Conn, out []byte) {
	p.lingerMu.Lock()
	if p.closed.Load() {
		p.lingerMu.Unlock()
		return
	}
	p.lingering[c] = struct{}{}
	p.lingerMu.Unlock()
	defer func() {
		p.lingerMu.Lock()
		delete(p.lingering, c)
		p.lingerMu.Unlock()
	}()

	now := time.Now()
	if c.SetWriteDeadline(now.Add(p.cfg.WriteTimeout)) != nil {
		return
	}
	if _, err := c.Write(out); err != nil {
		return
	}
	if tc := tcpConn(c); tc != nil {
		if tc.CloseWrite() != nil {
			return
		}
	}
	if c.SetReadDeadline(time.Now().Add(p.cfg.LingerTimeout)) != nil {
		return
	}
	buf := make([]byte, 4<<10)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

// endLingering ends every connection lingering on the fasthttp path.
func (p *Proxy) endLingering() {
	p.lingerMu.Lock()
	defer p.lingerMu.Unlock()
	for c := range p.lingering {
		_ = c.SetDeadline(time.Unix(1, 0))
	}
}

// tcpConn finds the TCP connection under c: fasthttp's hijacked connection
// (UnsafeConn), a connection a loop handed over (TCPConn), or c itself.
func tcpConn(c net.Conn) *net.TCPConn {
	for range 4 {
		switch v := c.(type) {
		case *net.TCPConn:
			return v
		case interface{ UnsafeConn() net.Conn }:
			c = v.UnsafeConn()
		case interface{ TCPConn() *net.TCPConn }:
			return v.TCPConn()
		default:
			return nil
		}
	}
	return nil
}
