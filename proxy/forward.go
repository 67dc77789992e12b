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
	// resentOnce: sent again after an attempt that got no answer (decide).
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

// trip is how roundTrip ended: an answer or a failure that decide settles
// (tripAnswered, tripNotSent, tripNoAnswer), or a failure with an answer of
// its own.
type trip uint8

const (
	tripAnswered    trip = iota // a final response head is in ctx.Response; the connection is held
	tripNotSent                 // nothing of the request left the proxy
	tripNoAnswer                // the request left; not a byte of an answer came back
	tripOverloaded              // not sent: no connection to the worker in time
	tripBadGateway              // may have been sent; no usable response
	tripTimeout                 // sent; no response head in time
	tripClientBody              // the client's body failed (truncated, bad chunk)
	tripBodyTimeout             // the client's body stopped coming (StreamIdleTimeout)
	tripTooLarge                // the client's chunked body passed MaxRequestBodySize
	tripOverWorker              // the client's chunked body passed the worker's limit
)

// Errors of the request body copy, told apart from worker write errors.
var (
	errClientBody   = errors.New("client request body")
	errBodyTimeout  = errors.New("client request body not received in time")
	errBodyTooLarge = errors.New("request body too large")
	errOverWorker   = errors.New("request body larger than the worker accepts")
)

// forward sends the prepared request to the worker holding x.name, doing
// what decide says after each attempt, and leaves the response in
// ctx.Response. It reports whether the exchange was handed to the server (a
// streamed body).
func (x *exchange) forward() bool {
	p := x.p
	ctx := x.ctx
	var next Route // the next attempt's route when decided already (resend, recheck)
	for attempt := 1; ; attempt++ {
		rt, err := next, error(nil)
		next = Route{}
		if rt.Session == nil {
			rt, err = p.route(ctx, x.name)
		}
		if err != nil {
			p.reply(ctx, p.resolveReply(x.name, err))
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
			p.reply(ctx, p.unusable(x.name, rt, err))
			return false
		}
		if !ok {
			p.countFailure(&p.replies.overloaded)
			p.reply(ctx, &p.replies.overloaded)
			return false
		}
		if attempt == 1 {
			ep.earn() // retries do not earn more retries
		}
		x.ep = ep
		tr, reused, err := x.roundTrip(attempt)
		var a action
		switch tr {
		case tripAnswered:
			a = p.decide(x.outcome(endAnswered, attempt, reused), ep)
			switch a.verdict {
			case relay:
			case reresolve:
				x.discardAnswer()
			default:
				x.drop()
			}
		case tripNotSent:
			a = p.decide(x.outcome(endNotSent, attempt, reused), ep)
		case tripNoAnswer:
			a = p.decide(x.outcome(endNoAnswer, attempt, reused), ep)
			if err != nil && (!reused || a.verdict != resend) && p.errLog.Allow() {
				// Not a pooled connection the worker had closed, sent again.
				p.log.Warn("no response from worker", "session", ep.id, "addr", ep.addr, "err", err)
			}
		default:
			p.reply(ctx, x.tripReply(tr))
			return false
		}
		p.enact(a, x.name, rt)
		x.resentOnce = x.resentOnce || a.resent
		switch a.verdict {
		case relay:
			return x.respond()
		case resend:
			next = rt
			if a.free {
				attempt-- // the loop's attempt++ gives the same number again
			}
		case reresolve:
		case recheck:
			r, err := p.resolver.Resolve(ctx, x.name)
			var rp *reply
			if next, rp = p.afterRecheck(rt, r, err); rp != nil {
				p.reply(ctx, rp)
				return false
			}
		case answer:
			p.reply(ctx, a.reply)
			return false
		}
	}
}

// outcome describes the attempt that ended (end) for decide.
func (x *exchange) outcome(end attemptEnd, attempt int, reused bool) outcome {
	o := outcome{end: end, reused: reused, idempotent: x.idempotent(), replayable: x.replayable(),
		resent: x.resentOnce, attempt: attempt, holder: x.route.Session}
	if end == endAnswered {
		rh := &x.ctx.Response.Header
		o.status = rh.StatusCode()
		if o.status == fasthttp.StatusServiceUnavailable || o.status == fasthttp.StatusForbidden {
			// The only answers whose reason decide reads.
			o.reason = knownReason(rh.Peek(wire.HeaderReason))
		}
	}
	return o
}

// tripReply is the answer to a trip that ended with one of the proxy's own.
func (x *exchange) tripReply(tr trip) *reply {
	p := x.p
	var rp *reply
	switch tr {
	case tripOverloaded:
		rp = &p.replies.overloaded
	case tripBadGateway:
		rp = &p.replies.badGateway
	case tripTimeout:
		rp = &p.replies.timeout
	case tripClientBody:
		return &p.replies.badBody
	case tripBodyTimeout:
		return &p.replies.bodyTimeout
	case tripTooLarge:
		p.m.rejected.Inc()
		return &p.replies.tooLarge
	default: // tripOverWorker
		p.m.rejected.Inc()
		return p.bodyOverWorker(x.route.Session)
	}
	p.countFailure(rp)
	return rp
}

// route returns the route of name: the resolver's cached one (at the
// request's time), else Resolve's. A route without a session is
// ErrNoWorker.
func (p *Proxy) route(ctx *fasthttp.RequestCtx, name []byte) (Route, error) {
	if rt, ok := p.cachedRoute(name, ctx.Time()); ok {
		return rt, nil
	}
	rt, err := p.resolver.Resolve(ctx, name)
	if err == nil && rt.Session == nil {
		err = ErrNoWorker
	}
	return rt, err
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
	return isIdempotent(x.ctx.Request.Header.Method())
}

// roundTrip makes one attempt on x.ep: it takes a pooled connection, writes
// the request and reads the final response head into ctx.Response.Header.
// It returns how the attempt ended, whether the connection had served a
// request before, and the error of a tripNoAnswer (for the log). On
// tripAnswered the connection stays held (x.cc); on every other trip it has
// been released or closed and x.ep has left.
func (x *exchange) roundTrip(attempt int) (trip, bool, error) {
	p, ep := x.p, x.ep
	start := time.Now()
	cc, err := acquireConn(ep.client)
	if err != nil {
		ep.leave()
		if err == fasthttp.ErrNoFreeConns || err == fasthttp.ErrTimeout {
			return tripOverloaded, false, nil
		}
		if p.errLog.Allow() {
			p.log.Warn("cannot reach worker", "session", ep.id, "addr", ep.addr, "err", err)
		}
		return tripNotSent, false, nil
	}
	x.cc, x.conn = cc, cc.Conn()
	reused := cc.CreatedTime().Before(start)
	if err := x.conn.SetDeadline(start.Add(p.cfg.ResponseHeaderTimeout)); err != nil {
		x.drop()
		return tripNotSent, reused, nil
	}
	x.setEndpointHeaders(attempt)

	x.cw.Conn, x.cw.n = x.conn, 0
	x.bw.Reset(&x.cw)
	if err := x.send(); err != nil {
		sent := x.cw.n
		x.drop()
		switch {
		case errors.Is(err, errBodyTooLarge):
			return tripTooLarge, reused, nil
		case errors.Is(err, errOverWorker):
			return tripOverWorker, reused, nil
		case errors.Is(err, errClientBody):
			return tripClientBody, reused, nil
		case errors.Is(err, errBodyTimeout):
			return tripBodyTimeout, reused, nil
		case sent == 0:
			// Nothing left the proxy: whatever the method, the worker has
			// not seen it (a reused connection was stale; a fresh one
			// failing at once means the worker is going away).
			return tripNotSent, reused, nil
		}
		if p.errLog.Allow() {
			p.log.Warn("cannot send to worker", "session", ep.id, "addr", ep.addr, "err", err)
		}
		return tripNoAnswer, reused, nil // logged
	}

	x.br.Reset(x.conn)
	if tr, err := x.readHead(); tr != tripAnswered {
		return tr, reused, err
	}
	p.m.upstream.observe(x.stripe, time.Since(start))
	return tripAnswered, reused, nil
}

// readHead reads the worker's final response head into ctx.Response.Header,
// skipping interim 1xx responses, and checks its framing. It returns
// tripAnswered, or how it failed (with the error of a tripNoAnswer, for the
// log) once the connection is closed.
func (x *exchange) readHead() (trip, error) {
	p, ep, ctx := x.p, x.ep, x.ctx
	rh := &ctx.Response.Header
	interim := false // an interim answer came: the worker did answer
	for {
		head, err := peekHead(x.br)
		if err != nil {
			x.drop()
			if isTimeout(err) {
				return tripTimeout, nil
			}
			if _, nothing := err.(errNothingRead); nothing && !interim {
				return tripNoAnswer, err
			}
			if p.errLog.Allow() {
				p.log.Warn("no response from worker", "session", ep.id, "addr", ep.addr, "err", err)
			}
			return tripBadGateway, nil
		}
		s := &x.respScan
		s.reset()
		scanFields(skipLine(head), s, 0)
		if err := rh.Read(x.br); err != nil {
			x.drop()
			if p.errLog.Allow() {
				p.log.Warn("bad response head from worker", "session", ep.id, "err", err)
			}
			return tripBadGateway, nil
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
			return tripBadGateway, nil
		}
		code := rh.StatusCode()
		if code >= 200 || code < 100 {
			return tripAnswered, nil
		}
		if code == fasthttp.StatusSwitchingProtocols {
			// Only the upgrade path asks for a protocol switch.
			x.drop()
			return tripBadGateway, nil
		}
		// 100 Continue, 102, 103: the server already answered the client's
		// Expect itself; interim responses are not relayed.
		interim = true
	}
}

// discardAnswer drops a host's refusal that is not relayed (decide's
// reresolve): its body is read when it is small, so that the connection
// goes back to the pool; otherwise the connection is closed.
func (x *exchange) discardAnswer() {
	rh := &x.ctx.Response.Header
	cl := rh.ContentLength()
	x.closeAfter = rh.ConnectionClose() || x.respScan.connClose
	if cl >= 0 && cl <= x.p.cfg.BufferedResponseMax && !x.closeAfter {
		if err := x.ctx.Response.ReadBody(x.br, 0); err == nil {
			x.ctx.Response.ResetBody()
			x.release()
			return
		}
	}
	x.drop()
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
//
// A streamed body's last read can end exactly at its end, with bytes the
// worker sent past it (more than it announced, in the same write) still
// in the socket, not in the reader's buffer: pooled, the connection would
// hand them to the next request as its answer. So the end of a stream
// peeks at the socket (sentMore) and drops the connection if anything is
// there (a byte, the worker's close, an error). Buffered answers are read
// through the reader, which holds whatever came with their last bytes.
func (x *exchange) CloseWithError(err error) error {
	if err != nil || !x.eof {
		x.drop()
		if err != nil && !x.eof && x.p.errLog.Allow() {
			x.p.log.Debug("stream ended early", "session", x.ep.id, "err", err)
		}
	} else if sentMore(x.conn) {
		x.drop()
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

// sentMore reports whether the peer of c has sent a byte not yet read (or
// closed its side, or the socket failed): a non-blocking peek, one system
// call. A connection that cannot be peeked at reports false.
func sentMore(c net.Conn) bool {
	var rc syscall.RawConn
	switch c := c.(type) {
	case *waitConn:
		rc = c.raw
	case syscall.Conn:
		var err error
		if rc, err = c.SyscallConn(); err != nil {
			return true
		}
	default:
		return false
	}
	quiet := false
	if err := rc.Read(func(fd uintptr) bool {
		quiet = socketQuiet(int(fd))
		return true // never wait
	}); err != nil {
		return true
	}
	return !quiet
}
