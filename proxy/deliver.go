package proxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// DefaultMaxDeliverBody bounds the body of an answer Deliver reads.
const DefaultMaxDeliverBody = 64 << 10

// Deliver sends a request the pinboard makes itself (an alarm delivery)
// through the proxy's own path: its target "/<ns>/<id><rest>" is routed,
// placed and activated like a client's, on the proxy's connection pools,
// with its retries and re-resolves and the route's fields (the session's
// secret and id, the placement's epoch). Unlike a client's, req keeps its
// own X-Pinned-* fields: the proxy removes them from every client request,
// so no client can send what Deliver sends. Whatever its method, it is sent
// again when a worker took it and gave no answer, like an idempotent
// request: Deliver's callers accept repeats (alarms run at least once).
//
// req's body, at most ReplayBodyMax, is held so the request can be sent
// again. The answer is copied to resp as a client would get it: the
// worker's, or the proxy's own (503 no_worker, store, unreachable or
// overloaded: nothing ran; 502 or 504: it may have run); a body longer than
// DefaultMaxDeliverBody is cut there. The error is for a request Deliver
// cannot send (a target that names no object, a body too long). Deliver is
// safe for concurrent use and blocks until the answer is in.
func (p *Proxy) Deliver(req *fasthttp.Request, resp *fasthttp.Response) error {
	if n := len(req.Body()); n > max(p.cfg.ReplayBodyMax, 0) {
		return fmt.Errorf("proxy: Deliver: a body of %d bytes exceeds ReplayBodyMax (%d)", n, p.cfg.ReplayBodyMax)
	}
	var ctx fasthttp.RequestCtx
	ctx.Init2(internalConn{}, slogLogger{p.log}, true)
	req.CopyTo(&ctx.Request)
	x := p.exchanges.Get().(*exchange)
	x.ctx = &ctx
	x.internal = true
	handed, err := p.serveInternal(x)
	if err != nil {
		p.putExchange(x)
		return err
	}
	resp.Reset()
	ctx.Response.Header.CopyTo(&resp.Header)
	if !handed {
		resp.SetBody(ctx.Response.Body())
		p.putExchange(x)
		return nil
	}
	// The answer streams: the exchange is its body stream, read here as
	// the server would, then closed (which releases the worker connection
	// when the body was read to its end).
	body, rerr := io.ReadAll(io.LimitReader(x, DefaultMaxDeliverBody))
	if rerr == nil && !x.eof {
		rerr = errors.New("answer longer than DefaultMaxDeliverBody")
	}
	_ = x.CloseWithError(rerr)
	resp.SetBody(body)
	resp.Header.SetContentLength(len(body))
	return nil
}

// serveInternal forwards a request the pinboard made (Deliver): no client
// rules to apply, no fields to remove, no forwarding fields to add. It
// reports whether x was handed over as the answer's body stream.
func (p *Proxy) serveInternal(x *exchange) (bool, error) {
	h := &x.ctx.Request.Header
	target := h.RequestURI()
	rt, rerr := parseRoute(target, p.cfg.MaxIDLen)
	if rerr != routeOK {
		return false, fmt.Errorf("proxy: Deliver: %q names no object (want /<namespace>/<id>...)", target)
	}
	x.name, x.target = rt.name, target
	x.body = append(x.body[:0], x.ctx.Request.Body()...)
	x.bodyKind = bodyNone
	if len(x.body) > 0 {
		x.bodyKind = bodyReplay
	}
	h.SetNoDefaultContentType(true)
	return x.forward(), nil
}

// internalConn is the connection of a Deliver request's RequestCtx: there is
// no client, so deadlines are no-ops and nothing is read or written.
type internalConn struct{}

var internalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}

func (internalConn) Read([]byte) (int, error)         { return 0, io.EOF }
func (internalConn) Write(b []byte) (int, error)      { return len(b), nil }
func (internalConn) Close() error                     { return nil }
func (internalConn) LocalAddr() net.Addr              { return internalAddr }
func (internalConn) RemoteAddr() net.Addr             { return internalAddr }
func (internalConn) SetDeadline(time.Time) error      { return nil }
func (internalConn) SetReadDeadline(time.Time) error  { return nil }
func (internalConn) SetWriteDeadline(time.Time) error { return nil }
