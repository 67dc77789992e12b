package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// exchange is the proxy's state for one request on its way to a worker and
// back. Exchanges are pooled by the Proxy. The handler takes one per request
// and gives it back before returning, unless the response body streams: then
// the server owns it (it is the response's body stream) until it calls
// CloseWithError after writing the response, which releases the worker
// connection and returns the exchange to the pool.
//
// Everything here runs on the goroutine of the client connection: no
// goroutine, channel or lock is added per request.
type exchange struct {
	p   *Proxy
	ctx *fasthttp.RequestCtx

	// Request state.
	reqScan headScan
	name    []byte // the placement name: a sub-slice of the request URI or tgt
	target  []byte // the origin-form target: the request URI or tgt
	tgt     []byte // a copy of target when it must outlive a URI rewrite
	uri     []byte // scratch for a rewritten request URI
	stable  bool   // name and target point into tgt
	http10  bool   // the client spoke HTTP/1.0
	// resentOnce: sent again after an attempt that got no answer (noAnswer).
	resentOnce bool
	// internal: a request of the pinboard's own (Deliver), which may be
	// sent again like an idempotent one.
	internal bool
	// bodyRead: the request body was read to its end (bodyUnread).
	bodyRead bool
	bodyKind bodyKind
	body     []byte // a replayable request body
	scratch  [64]byte

	// Worker connection state, valid between acquire and release.
	route    Route // where the current attempt was routed
	ep       *endpoint
	cc       pooledConn
	conn     net.Conn
	cw       countingConn
	bw       *bufio.Writer
	br       *bufio.Reader
	respScan headScan
	// closeAfter: the worker's response ends the connection.
	closeAfter bool
	// writeThenAwait's state: awaitFn is x.await (made once), awaitWrote
	// says the request went out inside the wait, awaitErr is its error.
	awaitFn    func(uintptr) bool
	awaitWrote bool
	awaitErr   error
	// stripe is the upstream histogram stripe this exchange records into.
	stripe uint8

	// Streamed response state.
	aux       fasthttp.Response // holds the worker body stream and trailers
	rs        io.Reader         // aux.BodyStream()
	eof       bool
	hijacked  net.Conn // the client connection once hijacked (HTTP/1.0 path)
	armed     time.Time
	streamBuf []byte
}

// bodyKind says how a request body is sent.
type bodyKind uint8

const (
	bodyNone    bodyKind = iota // no body, or Content-Length: 0
	bodyReplay                  // read whole into exchange.body; can be sent again
	bodyLength                  // streamed, Content-Length framing
	bodyChunked                 // streamed, chunked framing
)

// countingConn counts the bytes the kernel accepted on the worker
// connection, which tells a request that provably never left the proxy (zero)
// from one that may have.
type countingConn struct {
	net.Conn
	n int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.n += int64(n)
	return n, err
}

// outcome is how one attempt to send a request to a worker ended.
type outcome uint8

const (
	outOK          outcome = iota // a final response head is in ctx.Response
	outReresolve                  // the worker answered 503 closing/draining/lease; re-resolve
	outResend                     // a stale pooled connection; send again
	outUnreachable                // not sent: the worker could not be reached
	outOverloaded                 // not sent: no connection to the worker in time
	outBadGateway                 // may have been sent; no usable response
	outTimeout                    // sent; no response head in time
	outClientBody                 // the client's body failed (truncated, bad chunk)
	outBodyTimeout                // the client's body stopped coming (StreamIdleTimeout)
	outTooLarge                   // the client's chunked body passed MaxRequestBodySize
	outOverWorker                 // the client's chunked body passed the worker's limit
)

// Errors of the request body copy, told apart from worker write errors.
var (
	errClientBody   = errors.New("client request body")
	errBodyTimeout  = errors.New("client request body not received in time")
	errBodyTooLarge = errors.New("request body too large")
	errOverWorker   = errors.New("request body larger than the worker accepts")
)

// forward sends the prepared request to the worker holding x.name, retrying
// within the budget, and leaves the response in ctx.Response. It reports
// whether the exchange was handed to the server (a streamed body).
func (x *exchange) forward() bool {
	p := x.p
	ctx := x.ctx
	var next Route // resolved after an unreachable worker, for the next attempt
	for attempt := 1; ; attempt++ {
		rt, err := next, error(nil)
		next = Route{}
		if rt.Session == nil {
			rt, err = p.route(ctx, x.name)
		}
		if err != nil {
			p.resolveFailed(ctx, x.name, err)
			return false
		}
		x.route = rt
		if overWorker(rt.Session, x.announcedBody()) {
			// Refused before a byte goes out: the worker's server would.
			p.reject(ctx, p.bodyOverWorker(rt.Session))
			return false
		}
		ep, ok, err := p.admit(rt.Session)
		if err != nil {
			p.unusable(x, err)
			return false
		}
		if !ok {
			p.m.overloaded.Inc()
			p.reply(ctx, &p.replies.overloaded)
			return false
		}
		if attempt == 1 {
			ep.earn() // retries do not earn more retries
		}
		x.ep = ep
		out := x.roundTrip(attempt)
		switch out {
		case outOK:
			return x.respond()
		case outReresolve:
			p.m.reresolves.Inc()
			continue
		case outResend:
			p.m.retries.Inc()
			continue
		case outUnreachable:
			if next = x.moved(attempt); next.Session != nil {
				p.m.reresolves.Inc()
				continue
			}
			p.m.unreachable.Inc()
			p.reply(ctx, p.unreachableReply(x.route.Session))
		case outOverloaded:
			p.m.overloaded.Inc()
			p.reply(ctx, &p.replies.overloaded)
		case outBadGateway:
			p.m.badGateway.Inc()
			p.reply(ctx, &p.replies.badGateway)
		case outTimeout:
			p.m.timeouts.Inc()
			p.reply(ctx, &p.replies.timeout)
		case outClientBody:
			p.reply(ctx, &p.replies.badBody)
		case outBodyTimeout:
			p.reply(ctx, &p.replies.bodyTimeout)
		case outTooLarge:
			p.m.rejected.Inc()
			p.reply(ctx, &p.replies.tooLarge)
		case outOverWorker:
			p.m.rejected.Inc()
			p.reply(ctx, p.bodyOverWorker(rt.Session))
		}
		return false
	}
}

// route returns the route of name: the resolver's cached one (Lookup, at
// the request's time), else Resolve's. A route without a session is
// ErrNoWorker.
func (p *Proxy) route(ctx *fasthttp.RequestCtx, name []byte) (Route, error) {
	if rt, ok := p.resolver.Lookup(name, ctx.Time()); ok && rt.Session != nil {
		return rt, nil
	}
	rt, err := p.resolver.Resolve(ctx, name)
	if err == nil && rt.Session == nil {
		err = ErrNoWorker
	}
	return rt, err
}

// resolveFailed answers a request whose route could not be resolved: 404
// unknown_namespace for ErrUnknownNamespace, 503 no_worker for
// ErrNoWorker, 503 store for anything else.
func (p *Proxy) resolveFailed(ctx *fasthttp.RequestCtx, name []byte, err error) {
	p.reply(ctx, p.resolveReply(name, err))
}

// unusable answers a request routed to a session whose advertise URL the
// proxy cannot use (err): the resolver hears of it like of an unreachable
// worker, and the client gets 503 unreachable.
func (p *Proxy) unusable(x *exchange, err error) {
	p.resolver.Refused(x.name, x.route, wire.ReasonUnreachable)
	p.m.unreachable.Inc()
	if p.errLog.Allow() {
		p.log.Warn("cannot reach worker", "session", x.route.Session.ID, "err", err)
	}
	p.reply(x.ctx, &p.replies.unreachable)
}

// moved handles a worker that could not be reached (the request provably
// did not leave): it tells the resolver (Refused), which re-checks the
// placement, and returns the new holder's route when the placement moved
// (the worker's session was gone from the store) and the request can be
// sent again, or a zero Route: the worker is still the holder and the
// client gets 503 unreachable.
func (x *exchange) moved(attempt int) Route {
	p := x.p
	p.resolver.Refused(x.name, x.route, wire.ReasonUnreachable)
	if attempt >= p.cfg.MaxAttempts || !x.replayable() {
		return Route{}
	}
	next, err := p.resolver.Resolve(x.ctx, x.name)
	if err != nil || next.Session == nil || next.Session.ID == x.route.Session.ID {
		return Route{}
	}
	return next
}

// announcedBody is the length of the request body as known before it is
// sent: the bytes held, or Content-Length; 0 for a chunked body.
func (x *exchange) announcedBody() int64 {
	switch x.bodyKind {
	case bodyReplay:
		return int64(len(x.body))
	case bodyLength:
		return int64(x.ctx.Request.Header.ContentLength())
	}
	return 0
}

// replayable reports whether the request can be sent again: it has no body,
// or its body is held whole.
func (x *exchange) replayable() bool {
	return x.bodyKind == bodyNone || x.bodyKind == bodyReplay
}

// idempotent reports whether the method is idempotent (RFC 9110 §9.2.2), so
// that a request that may have been processed can be sent again.
func (x *exchange) idempotent() bool {
	if x.internal {
		return true // Deliver's callers accept repeats (alarms: at least once)
	}
	switch string(x.ctx.Request.Header.Method()) {
	case fasthttp.MethodGet, fasthttp.MethodHead, fasthttp.MethodOptions, fasthttp.MethodTrace,
		fasthttp.MethodPut, fasthttp.MethodDelete:
		return true
	}
	return false
}

// roundTrip makes one attempt on x.ep: it takes a pooled connection, writes
// the request and reads the final response head into ctx.Response.Header.
// On outOK the connection stays held (x.cc); on every other outcome it has
// been released or closed and x.ep has left.
func (x *exchange) roundTrip(attempt int) outcome {
	p, ep, ctx := x.p, x.ep, x.ctx
	start := time.Now()
	cc, err := acquireConn(ep.client)
	if err != nil {
		ep.leave()
		if err == fasthttp.ErrNoFreeConns || err == fasthttp.ErrTimeout {
			return outOverloaded
		}
		if p.errLog.Allow() {
			p.log.Warn("cannot reach worker", "session", ep.id, "addr", ep.addr, "err", err)
		}
		return outUnreachable
	}
	x.cc, x.conn = cc, cc.Conn()
	reused := cc.CreatedTime().Before(start)
	if err := x.conn.SetDeadline(start.Add(p.cfg.ResponseHeaderTimeout)); err != nil {
		x.drop()
		return outUnreachable
	}
	x.setEndpointHeaders(attempt)

	x.cw.Conn, x.cw.n = x.conn, 0
	x.bw.Reset(&x.cw)
	if err := x.send(); err != nil {
		sent := x.cw.n
		x.drop()
		switch {
		case errors.Is(err, errBodyTooLarge):
			return outTooLarge
		case errors.Is(err, errOverWorker):
			return outOverWorker
		case errors.Is(err, errClientBody):
			return outClientBody
		case errors.Is(err, errBodyTimeout):
			return outBodyTimeout
		case sent == 0:
			// Nothing left the proxy: whatever the method, the worker has
			// not seen it. A reused connection was stale and the request
			// may go again on another; a fresh one failing at once means
			// the worker is going away.
			if reused && x.replayable() && x.retry(attempt) {
				return outResend
			}
			return outUnreachable
		}
		if p.errLog.Allow() {
			p.log.Warn("cannot send to worker", "session", ep.id, "addr", ep.addr, "err", err)
		}
		return x.noAnswer(attempt)
	}

	x.br.Reset(x.conn)
	if out := x.readHead(reused, attempt); out != outOK {
		return out
	}
	p.m.upstream.observe(x.stripe, time.Since(start))

	rh := &ctx.Response.Header
	switch rh.StatusCode() {
	case fasthttp.StatusServiceUnavailable:
		if out := x.hostUnavailable(attempt); out != outOK {
			return out
		}
	case fasthttp.StatusForbidden:
		if string(rh.Peek(wire.HeaderReason)) == wire.ReasonForbidden {
			// The process at the session's address does not know the
			// session's secret: the worker restarted there (or another
			// process took its port). Nothing of the request ran, so it is
			// handled as an unreachable worker: re-resolve, or 503 +
			// Retry-After; the client never sees the pinboard's own 403.
			x.drop()
			return outUnreachable
		}
	}
	return outOK
}

// noAnswer decides about a request that may have reached the worker but got
// no byte of an answer (the connection failed after the request went out):
// an idempotent request whose body is held goes once more (outResend),
// and when it was sent again already the worker is taken as unreachable
// (503 + Retry-After: no answer twice, nothing the client can tell from a
// worker that is down); any other request may have been processed: 502.
func (x *exchange) noAnswer(attempt int) outcome {
	if !x.idempotent() || !x.replayable() {
		return outBadGateway
	}
	if !x.resentOnce && x.retry(attempt) {
		x.resentOnce = true
		return outResend
	}
	return outUnreachable
}

// retry takes one retry from the endpoint's budget if the request has
// attempts left.
func (x *exchange) retry(attempt int) bool {
	if attempt >= x.p.cfg.MaxAttempts {
		return false
	}
	if !x.ep.spend() {
		x.p.m.budgetExhausted.Inc()
		return false
	}
	return true
}

// readHead reads the worker's final response head into ctx.Response.Header,
// skipping interim 1xx responses, and checks its framing.
func (x *exchange) readHead(reused bool, attempt int) outcome {
	p, ep, ctx := x.p, x.ep, x.ctx
	rh := &ctx.Response.Header
	interim := false // an interim answer came: the worker did answer
	for {
		head, err := peekHead(x.br)
		if err != nil {
			x.drop()
			if isTimeout(err) {
				return outTimeout
			}
			if _, nothing := err.(errNothingRead); nothing && !interim {
				if reused && x.replayable() && x.idempotent() && !x.resentOnce && x.retry(attempt) {
					// The worker closed a pooled connection as we sent on
					// it; an idempotent request may go again (RFC 9110
					// §9.2.2).
					x.resentOnce = true
					return outResend
				}
				if p.errLog.Allow() {
					p.log.Warn("no response from worker", "session", ep.id, "addr", ep.addr, "err", err)
				}
				return x.noAnswer(attempt)
			}
			if p.errLog.Allow() {
				p.log.Warn("no response from worker", "session", ep.id, "addr", ep.addr, "err", err)
			}
			return outBadGateway
		}
		s := &x.respScan
		s.reset()
		scanFields(skipLine(head), s, 0)
		if err := rh.Read(x.br); err != nil {
			x.drop()
			if p.errLog.Allow() {
				p.log.Warn("bad response head from worker", "session", ep.id, "err", err)
			}
			return outBadGateway
		}
		// RFC 9112 §6.3: Content-Length with Transfer-Encoding, or a coding
		// other than chunked, is a framing fault; fasthttp would let chunked
		// win. A proxy must not relay such a message, nor one whose fields
		// fasthttp read more leniently than RFC 9112 allows (obs-fold,
		// bare LF: §5.2 lets a proxy answer 502).
		if s.responseFault() {
			x.drop()
			if p.errLog.Allow() {
				p.log.Warn("ambiguous response framing from worker", "session", ep.id)
			}
			return outBadGateway
		}
		code := rh.StatusCode()
		if code >= 200 || code < 100 {
			return outOK
		}
		if code == fasthttp.StatusSwitchingProtocols {
			// Only the upgrade path asks for a protocol switch.
			x.drop()
			return outBadGateway
		}
		// 100 Continue, 102, 103: the server already answered the client's
		// Expect itself; interim responses are not relayed.
		interim = true
	}
}

// hostUnavailable handles a 503 from the worker. A 503 the host made itself
// with reason closing, draining or lease drops the cached placement; the
// request goes to the re-resolved worker when it can be sent again and the
// budget allows. Otherwise the 503, with its Retry-After, is the answer.
func (x *exchange) hostUnavailable(attempt int) outcome {
	rh := &x.ctx.Response.Header
	reason := knownReason(rh.Peek(wire.HeaderReason))
	switch reason {
	case wire.ReasonClosing, wire.ReasonDraining, wire.ReasonLease, wire.ReasonStale:
	default:
		return outOK
	}
	x.p.resolver.Refused(x.name, x.route, reason)
	if !x.replayable() || !x.retry(attempt) {
		return outOK
	}
	// Consume the 503's body to keep the connection, when it is small.
	cl := rh.ContentLength()
	x.closeAfter = rh.ConnectionClose() || x.respScan.connClose
	if cl >= 0 && cl <= x.p.cfg.BufferedResponseMax && !x.closeAfter {
		if err := x.ctx.Response.ReadBody(x.br, 0); err == nil {
			x.ctx.Response.ResetBody()
			x.release()
			return outReresolve
		}
	}
	x.drop()
	return outReresolve
}

// setEndpointHeaders sets what depends on the endpoint: the proxy secret, the
// session, the request URI when the advertise URL has a path or the client
// used absolute-form, and Host for an HTTP/1.0 client that sent none.
func (x *exchange) setEndpointHeaders(attempt int) {
	h := &x.ctx.Request.Header
	ep := x.ep
	setRouteFields(h, ep, x.route.Epoch, attempt == 1, x.scratch[:0])
	if len(ep.prefix) > 0 || x.stable {
		x.stabilize()
		x.uri = append(append(x.uri[:0], ep.prefix...), x.target...)
		h.SetRequestURIBytes(x.uri)
	}
	if len(h.Host()) == 0 {
		h.SetHost(ep.addr)
	}
}

// stabilize moves name and target into x.tgt, so that they survive a
// rewrite of the request URI they point into.
func (x *exchange) stabilize() {
	if x.stable {
		return
	}
	n := len(x.name)
	x.tgt = append(x.tgt[:0], x.target...)
	x.target = x.tgt
	x.name = x.tgt[:n]
	x.stable = true
}

// send writes the request to the worker. A request whose whole message is
// in hand (no body, or a replayable one) on a connection that exposes its
// descriptor is written by writeThenAwait; others by writeRequest.
func (x *exchange) send() error {
	if wc, ok := x.conn.(*waitConn); ok && (x.bodyKind == bodyNone || x.bodyKind == bodyReplay) {
		return x.writeThenAwait(wc.raw)
	}
	return x.writeRequest()
}

// writeThenAwait writes the request and then waits, without reading, until
// the worker's connection is readable, so that the read of the response
// head finds bytes at its first syscall.
//
// Why: a read right after the request is written almost always returns
// EAGAIN (the worker has not been scheduled yet), and Go's netpoller then
// waits and reads again: two read syscalls per response where one would do.
// The CPU profiles of the pinboard under load (profiles/) spend most of the
// proxy's time in syscalls, so a syscall per request is worth saving.
//
// How: RawConn.Read resets the descriptor's readiness and then calls
// x.await; its first call writes the request and returns false, which makes
// RawConn.Read wait for readability; the second returns true. Because the
// reset happens before the request is written, the response cannot have
// arrived before it, so the edge-triggered readiness it raises is never
// lost. A wake-up that finds nothing (a spurious edge) only costs the
// EAGAIN the read would have cost anyway; a wait that ends in an error
// (deadline, closed connection) is reported by that same read.
func (x *exchange) writeThenAwait(raw syscall.RawConn) error {
	x.awaitWrote, x.awaitErr = false, nil
	_ = raw.Read(x.awaitFn)
	if !x.awaitWrote {
		// RawConn.Read failed before calling await (closed connection,
		// expired deadline): write the usual way, which reports it.
		return x.writeRequest()
	}
	return x.awaitErr
}

// await is writeThenAwait's RawConn.Read callback (x.awaitFn).
func (x *exchange) await(uintptr) bool {
	if x.awaitWrote {
		return true // readable: the response head's read follows
	}
	x.awaitWrote = true
	x.awaitErr = x.writeRequest()
	return x.awaitErr != nil
}

// writeRequest writes the request head and body to the worker and flushes.
func (x *exchange) writeRequest() error {
	h := &x.ctx.Request.Header
	if err := h.Write(x.bw); err != nil {
		return err
	}
	switch x.bodyKind {
	case bodyReplay:
		if _, err := x.bw.Write(x.body); err != nil {
			return err
		}
	case bodyLength, bodyChunked:
		if err := x.copyRequestBody(); err != nil {
			return err
		}
		// The head timeout starts once the body is sent.
		if err := x.conn.SetReadDeadline(time.Now().Add(x.p.cfg.ResponseHeaderTimeout)); err != nil {
			return err
		}
	}
	return x.bw.Flush()
}

// copyRequestBody streams the client's body to the worker: exactly
// Content-Length bytes, or re-chunked with its trailers. Both deadlines move
// with progress, so a long upload is cut only when it stalls.
func (x *exchange) copyRequestBody() error {
	p := x.p
	rs := x.ctx.Request.BodyStream()
	if rs == nil {
		return errClientBody
	}
	buf := x.copyBuffer()
	chunked := x.bodyKind == bodyChunked
	remaining := int64(x.ctx.Request.Header.ContentLength())
	var total int64
	var armed time.Time
	for {
		if now := time.Now(); now.Sub(armed) > p.cfg.StreamIdleTimeout/4 {
			armed = now
			_ = x.ctx.SetReadDeadline(now.Add(p.cfg.StreamIdleTimeout))
			if err := x.conn.SetWriteDeadline(now.Add(p.cfg.StreamIdleTimeout)); err != nil {
				return err
			}
		}
		b := buf
		if !chunked && int64(len(b)) > remaining {
			b = b[:remaining]
		}
		n, err := rs.Read(b)
		if n > 0 {
			total += int64(n)
			if p.cfg.MaxRequestBodySize >= 0 && total > p.cfg.MaxRequestBodySize {
				return errBodyTooLarge
			}
			if overWorker(x.route.Session, total) {
				return errOverWorker
			}
			if chunked {
				hex := strconv.AppendInt(x.scratch[:0], int64(n), 16)
				hex = append(hex, '\r', '\n')
				if _, werr := x.bw.Write(hex); werr != nil {
					return werr
				}
			}
			if _, werr := x.bw.Write(b[:n]); werr != nil {
				return werr
			}
			if chunked {
				if _, werr := x.bw.WriteString("\r\n"); werr != nil {
					return werr
				}
			}
			remaining -= int64(n)
			// Deliver what the client sent so far: an upload may be a stream
			// the worker answers as it goes.
			if werr := x.bw.Flush(); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			x.bodyRead = true
			if !chunked {
				if remaining != 0 {
					return errClientBody
				}
				return nil
			}
			if _, werr := x.bw.WriteString("0\r\n"); werr != nil {
				return werr
			}
			return x.writeTrailers()
		}
		if err != nil {
			if isTimeout(err) {
				return errBodyTimeout
			}
			return errClientBody
		}
		if !chunked && remaining == 0 {
			return nil
		}
	}
}

// writeTrailers writes the client's trailer section and the CRLF that ends
// the body. Only fields the proxy does not manage pass: fasthttp merges
// trailers into the worker's request header once the body is read, so a
// client's X-Pinned-*, forwarding or hop-by-hop field in a trailer would
// reach the worker as if the proxy had sent it.
func (x *exchange) writeTrailers() error {
	block := x.ctx.Request.Header.TrailerHeader()
	for len(block) > 0 {
		i := bytes.IndexByte(block, '\n')
		if i < 0 {
			break
		}
		line := block[:i+1]
		block = block[i+1:]
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || classify(line[:colon]) != hkOther {
			continue
		}
		if _, err := x.bw.Write(line); err != nil {
			return err
		}
	}
	_, err := x.bw.WriteString("\r\n")
	return err
}

// respond finishes a request whose final response head is in ctx.Response:
// it removes hop-by-hop fields and either reads a small body now or hands
// the exchange to the server to stream it. It reports whether it handed the
// exchange over.
func (x *exchange) respond() bool {
	p, ctx := x.p, x.ctx
	rh := &ctx.Response.Header
	s := &x.respScan
	x.closeAfter = rh.ConnectionClose() || s.connClose
	for _, f := range s.deletes() {
		rh.DelBytes(f.name)
	}
	// RFC 9112 §9.6: the worker's close is about the worker's connection.
	rh.ResetConnectionClose()

	if ctx.IsHead() || noBody(rh.StatusCode()) {
		x.release()
		p.countResponse(rh.StatusCode())
		return false
	}
	cl := rh.ContentLength()
	if cl >= 0 && cl <= p.cfg.BufferedResponseMax {
		if err := ctx.Response.ReadBody(x.br, 0); err != nil {
			x.drop()
			p.m.badGateway.Inc()
			if p.errLog.Allow() {
				p.log.Warn("cannot read response body from worker", "session", x.ep.id, "err", err)
			}
			p.reply(ctx, &p.replies.badGateway)
			return false
		}
		x.release()
		p.countResponse(rh.StatusCode())
		return false
	}

	// Stream the body. fasthttp's network-backed body reader (chunked
	// decoding, trailers, length checks) lives in aux, which owns it.
	if cl == -2 {
		x.closeAfter = true // read until the worker closes
	}
	x.aux.Header.Reset()
	x.aux.Header.SetContentLength(cl)
	x.aux.StreamBody = true
	if err := x.aux.ReadBody(x.br, 0); err != nil {
		x.drop()
		p.reply(ctx, &p.replies.badGateway)
		return false
	}
	x.rs = x.aux.BodyStream()
	x.eof = false
	p.countResponse(rh.StatusCode())
	now := time.Now()
	x.armed = now
	_ = x.conn.SetReadDeadline(now.Add(p.cfg.StreamIdleTimeout))
	if x.http10 && cl < 0 {
		return x.respondHTTP10()
	}
	// Setting the write deadline here keeps the server's whole-response
	// WriteTimeout off a stream; the stream moves it as it goes.
	_ = ctx.SetWriteDeadline(now.Add(p.cfg.StreamIdleTimeout))
	size := cl
	if size < 0 {
		size = -1
	}
	ctx.Response.SetBodyStream(x, size)
	return true
}

// noBody reports whether a status forbids a body (RFC 9110 §6.4.1).
func noBody(code int) bool {
	return code < 200 || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified
}

// respondHTTP10 answers an HTTP/1.0 client whose response has no known
// length. fasthttp would send it chunked, which HTTP/1.0 cannot read (RFC 9112 §7.1),
// so the proxy takes the connection over and frames the body by closing it.
func (x *exchange) respondHTTP10() bool {
	rh := &x.ctx.Response.Header
	rh.Del(fasthttp.HeaderTransferEncoding)
	rh.SetContentLength(-2) // no framing field; sets Connection: close
	rh.SetConnectionClose()
	x.uri = rh.AppendBytes(x.uri[:0])
	x.ctx.HijackSetNoResponse(true)
	x.ctx.Hijack(x.serveHTTP10)
	return true
}

func (x *exchange) serveHTTP10(c net.Conn) {
	x.hijacked = c
	_ = c.SetWriteDeadline(time.Now().Add(x.p.cfg.StreamIdleTimeout))
	_, err := c.Write(x.uri)
	if err == nil {
		_, err = x.WriteTo(c)
	}
	_ = x.CloseWithError(err)
}

// Read implements the response body stream for the server.
func (x *exchange) Read(b []byte) (int, error) {
	x.touch()
	n, err := x.rs.Read(b)
	if err == io.EOF {
		x.atEOF()
	}
	return n, err
}

// WriteTo copies the rest of the worker's body to w with the exchange's
// buffer: larger writes than fasthttp's 4 KiB copy buffer, so fewer
// syscalls on long bodies.
func (x *exchange) WriteTo(w io.Writer) (int64, error) {
	buf := x.copyBuffer()
	var total int64
	for {
		x.touch()
		n, err := x.rs.Read(buf)
		// Coalesce what the worker already sent (small chunks above all)
		// into one write toward the client; never wait for more.
		for err == nil && n < len(buf) && x.br.Buffered() > 0 {
			var m int
			m, err = x.rs.Read(buf[n:])
			n += m
		}
		if n > 0 {
			nw, werr := w.Write(buf[:n])
			total += int64(nw)
			if werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			x.atEOF()
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// SupportsBodyWriteTo tells fasthttp that WriteTo may replace Read.
func (x *exchange) SupportsBodyWriteTo() bool { return true }

// touch moves the stream's deadlines, the worker read and the client write,
// when a quarter of the idle timeout has passed since they were last set.
func (x *exchange) touch() {
	idle := x.p.cfg.StreamIdleTimeout
	now := time.Now()
	if now.Sub(x.armed) < idle/4 {
		return
	}
	x.armed = now
	_ = x.conn.SetReadDeadline(now.Add(idle))
	if x.hijacked != nil {
		_ = x.hijacked.SetWriteDeadline(now.Add(idle))
	} else {
		_ = x.ctx.SetWriteDeadline(now.Add(idle))
	}
}

// atEOF runs when the worker's body ended: its trailers join the client
// response's trailer section, which the server writes after the last chunk.
func (x *exchange) atEOF() {
	x.eof = true
	keys := x.aux.Header.PeekTrailerKeys()
	if len(keys) == 0 {
		return
	}
	rh := &x.ctx.Response.Header
	for _, k := range keys {
		key := string(k)
		for _, v := range x.aux.Header.PeekAllTrailer(key) {
			_ = rh.AddTrailer(key)
			rh.AddBytesV(key, v)
		}
	}
}

// CloseWithError ends the streamed body: the server calls it once it has
// written the response (err is its write error). The worker connection goes
// back to the pool only when the body was read to its end cleanly.
func (x *exchange) CloseWithError(err error) error {
	if err != nil || !x.eof {
		x.drop()
		if err != nil && !x.eof && x.p.errLog.Allow() {
			x.p.log.Debug("stream ended early", "session", x.ep.id, "err", err)
		}
	} else {
		x.release()
	}
	x.p.putExchange(x)
	return nil
}

// release returns the worker connection to the pool, or closes it when the
// worker asked for that or left bytes after the response.
func (x *exchange) release() {
	if x.closeAfter || x.br.Buffered() > 0 {
		x.drop()
		return
	}
	x.endStream()
	releaseConn(x.ep.client, x.cc)
	x.ep.leave()
	x.cc, x.conn = nil, nil
}

// drop closes the worker connection.
func (x *exchange) drop() {
	x.endStream()
	closeConn(x.ep.client, x.cc)
	x.ep.leave()
	x.cc, x.conn = nil, nil
}

// endStream gives fasthttp back the body reader aux holds, if any.
func (x *exchange) endStream() {
	if x.rs != nil {
		_ = x.aux.CloseBodyStream()
		x.rs = nil
	}
}

func (x *exchange) copyBuffer() []byte {
	if x.streamBuf == nil {
		x.streamBuf = make([]byte, x.p.cfg.StreamBufferSize)
	}
	return x.streamBuf
}
