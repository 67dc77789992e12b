package proxy

import (
	"bytes"
	"errors"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/internal/base/netloop"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// loopExchange is one request a loop serves, from its parsed head to the
// end of its answer. Exchanges are pooled per loop. Everything runs on the
// loop's goroutine, except a resolve or a dial, during which a goroutine of
// the Front owns the exchange until it posts it back (RunTask).
type loopExchange struct {
	lp *loop
	c  *clientConn

	req  fasthttp.RequestHeader
	resp fasthttp.ResponseHeader
	scan headScan // the request head as it arrived
	rsc  headScan // the worker's response head

	tgt     []byte // the target, copied: name and target point into it
	name    []byte
	target  []byte
	uri     []byte // scratch for a rewritten request URI
	body    []byte
	scratch [64]byte

	isHead      bool
	idempotent  bool
	clientClose bool
	epHeaders   bool // the endpoint's fields were added once
	resentOnce  bool // sent again after an attempt that got no answer
	// refuse: parse refused the request with this reply (it is answered
	// without reading further).
	refuse *reply
	// ws: a WebSocket handshake (looptunnel.go); tunnelCounted: it holds a
	// place in MaxTunnels, given back when x ends without a tunnel.
	ws, tunnelCounted bool

	route   Route
	ep      *endpoint
	wc      *workerConn
	attempt int
	reused  bool // wc served a request before this one
	out     []byte
	sent    int
	startNs int64 // when the current attempt took its worker connection
	recvNs  int64 // when the request was read whole
	stripe  uint8

	// The worker's answer: rbuf[:rn] read so far, headLen of it the head.
	rbuf       []byte
	rn         int
	gotBytes   bool // some byte of an answer (an interim one too) arrived
	headLen    int
	need       int // buffered body: total bytes (head + body) to have
	closeAfter bool

	// Streaming state (loopstream.go).
	st streamState
	// A request body spliced to the worker (loopsplice.go).
	up uploadState

	timer netloop.Timer
	tkind uint8 // what timer stands for

	// An asynchronous step in flight: its kind and results.
	pending uint8
	rres    Route
	rerr    error
	dfd     int
	derr    error

	// Queue links (loopPool.waiters).
	qnext, qprev *loopExchange
	queued       bool

	abandoned bool
}

// Timer kinds.
const (
	tNone uint8 = iota
	tQueue
	tResponse
	tStream
	tUpload // a spliced request body's progress (StreamIdleTimeout)
)

// Asynchronous steps.
const (
	pendNone uint8 = iota
	pendResolve
	pendRecheck // decide's recheck: x.route's worker was unreachable
	pendDial
	pendDialWS
)

func (lp *loop) getExchange() *loopExchange {
	if n := len(lp.xs); n > 0 {
		x := lp.xs[n-1]
		lp.xs = lp.xs[:n-1]
		return x
	}
	x := &loopExchange{lp: lp, stripe: uint8(lp.p.stripes.Add(1) % histStripes)}
	x.timer.H = x
	return x
}

// putExchange takes x back into the loop's free list, reset: every field
// of the request it served is cleared here, on release, but lp, stripe,
// timer.H (x's for good) and the buffers, which keep their capacity and
// lose their contents (length 0); the parsed heads and scans (req, resp,
// scan, rsc) are reset where they are filled, by parse and onHead, before
// they are read. TestPooledExchangesComeBackClean holds every field to it.
func (lp *loop) putExchange(x *loopExchange) {
	if x.tunnelCounted {
		lp.p.tunnelsOpen.Add(-1)
	}
	if x.rbuf != nil {
		lp.putRespBuf(x.rbuf)
	}
	lp.nl.Disarm(&x.timer)
	x.c, x.ep, x.wc, x.refuse = nil, nil, nil, nil
	x.route, x.rres = Route{}, Route{}
	x.name, x.target, x.rbuf = nil, nil, nil
	x.tgt, x.uri, x.body, x.out = x.tgt[:0], x.uri[:0], x.body[:0], x.out[:0]
	x.isHead, x.idempotent, x.clientClose, x.epHeaders, x.resentOnce = false, false, false, false, false
	x.ws, x.tunnelCounted, x.reused, x.gotBytes, x.closeAfter, x.abandoned = false, false, false, false, false, false
	x.attempt, x.sent, x.rn, x.headLen, x.need = 0, 0, 0, 0, 0
	x.startNs, x.recvNs, x.tkind = 0, 0, tNone
	x.pending, x.rerr, x.derr, x.dfd = pendNone, nil, nil, -1
	x.qnext, x.qprev, x.queued = nil, nil, false
	if x.st.pipe != nil {
		lp.putPipe(x.st.pipe, x.st.inPipe == 0)
	}
	x.st = streamState{line: x.st.line[:0], trail: x.st.trail[:0]}
	if x.up.pipe != nil {
		lp.putPipe(x.up.pipe, x.up.inPipe == 0)
	}
	x.up = uploadState{}
	if len(lp.xs) < 1024 {
		lp.xs = append(lp.xs, x)
	}
}

// parse reads a request head held whole in head and decides whether a loop
// serves it. It returns how many bytes of the body must have arrived with
// the head before the request starts (0; a Content-Length of at most
// ReplayBodyMax, held whole; or the start of a body to splice, x.up.length:
// upStart) and true, or false: the connection goes to the fasthttp path,
// which answers whatever it is (including every refusal) as it always did.
func (x *loopExchange) parse(head []byte) (int, bool) {
	c := x.c
	p := x.lp.p
	// The request line: "<method> <origin-form target> HTTP/1.1".
	eol := bytes.IndexByte(head, '\r')
	if eol < 0 || eol+1 >= len(head) || head[eol+1] != '\n' {
		return 0, false
	}
	line := head[:eol]
	const version = " HTTP/1.1"
	if !bytes.HasSuffix(line, []byte(version)) {
		return 0, false
	}
	sp := bytes.IndexByte(line, ' ')
	if sp <= 0 || sp+1 > len(line)-len(version) {
		return 0, false
	}
	target := line[sp+1 : len(line)-len(version)]
	if len(target) == 0 || target[0] != '/' || bytes.IndexByte(target, ' ') >= 0 || x.lp.f.cfg.Local(target) {
		return 0, false
	}
	h := &x.req
	h.Reset()
	if err := h.Read(x.lp.hr.reset(head)); err != nil {
		return 0, false
	}
	if !plainHost(h.Host()) {
		return 0, false
	}
	s := &x.scan
	s.reset()
	mode := dropPinned
	if !c.trusted {
		mode |= dropForwarded
	}
	scanFields(h.RawHeaders(), s, mode)
	if p.screenReply(s) != nil || s.transferEncodings > 0 || s.expect {
		return 0, false
	}
	cl := h.ContentLength()
	if s.upgrades > 0 {
		// Only a WebSocket handshake is served (looptunnel.go); any other
		// upgrade the fasthttp path refuses.
		if s.upgrades != 1 || !lowerEq(s.upgrade, "websocket") || !s.connUpgrade || !h.IsGet() || cl > 0 {
			return 0, false
		}
		x.ws = true
	}
	switch {
	case cl == -1:
		return 0, false // chunked
	case cl < 0:
		cl = 0
	case p.cfg.MaxRequestBodySize >= 0 && int64(cl) > p.cfg.MaxRequestBodySize:
		// Refused at once, before any byte of the body is read: the
		// fasthttp path would wait for the first 8 KiB of it.
		x.refuse = &p.replies.tooLarge
		return 0, true
	}
	rt, rerr := parseRoute(target, p.cfg.MaxIDLen)
	if rerr != routeOK {
		return 0, false
	}
	if cl > 0 {
		// Over the holder's limit, when the cache knows the holder:
		// refused at once too, whether or not the body is coming.
		if r, ok := p.cachedRoute(rt.name, netloop.Time(x.lp.nl.Now())); ok && overWorker(r.Session, int64(cl)) {
			x.refuse = p.bodyOverWorker(r.Session)
			return 0, true
		}
		if cl > p.cfg.ReplayBodyMax {
			if p.cfg.SpliceMin <= 0 || int64(cl) < p.cfg.SpliceMin {
				return 0, false // streamed by the fasthttp path
			}
			x.up.length = int64(cl)
			cl = upStart(cl, x.lp.bufSize-len(head))
		}
	}
	x.tgt = append(x.tgt[:0], target...)
	x.target = x.tgt
	x.name = x.tgt[:len(rt.name)]
	x.isHead = h.IsHead()
	x.idempotent = isIdempotent(h.Method())
	x.clientClose = h.ConnectionClose() || s.connClose
	return cl, true
}

// plainHost reports whether a Host value is a plain host[:port] (letters,
// digits, '.', '-', '_', ':' and an IPv6 literal's brackets): a loop serves
// only those, fasthttp's parser judges the rest (it refuses some, which the
// fasthttp path then answers).
func plainHost(h []byte) bool {
	if len(h) == 0 {
		return false
	}
	for _, c := range h {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']':
		default:
			return false
		}
	}
	return true
}

// start forwards a request the loop accepted.
func (x *loopExchange) start() {
	p := x.lp.p
	p.sanitizeHeader(&x.req, &x.scan, x.c.peer.Addr(), false, x.c.trusted, x.scratch[:0])
	x.attempt = 1
	if x.ws {
		x.req.Set("Connection", "Upgrade")
		x.req.Set("Upgrade", "websocket")
		if rp := p.admitTunnel(); rp != nil {
			x.fail(rp)
			return
		}
		x.tunnelCounted = true
	}
	x.lookup()
}

// lookup routes the request: from the resolver's cache on the loop, or
// through a resolve on a goroutine.
func (x *loopExchange) lookup() {
	p := x.lp.p
	if r, ok := p.cachedRoute(x.name, netloop.Time(x.lp.nl.Now())); ok {
		x.dispatch(r)
		return
	}
	x.resolveAsync(pendResolve)
}

// resolveAsync resolves x.name on a goroutine of the Front and posts x back.
func (x *loopExchange) resolveAsync(kind uint8) {
	f := x.lp.f
	x.pending = kind
	f.wg.Go(func() {
		x.rres, x.rerr = f.p.resolver.Resolve(f.ctx, x.name)
		x.lp.nl.Post(x)
	})
}

// RunTask implements netloop.Task: an asynchronous step came back.
func (x *loopExchange) RunTask() {
	kind := x.pending
	x.pending = pendNone
	switch kind {
	case pendResolve, pendRecheck:
		r, err := x.rres, x.rerr
		x.rres, x.rerr = Route{}, nil
		if x.abandoned {
			x.lp.putExchange(x)
			return
		}
		if kind == pendRecheck {
			next, rp := x.lp.p.afterRecheck(x.route, r, err)
			if rp != nil {
				x.fail(rp)
				return
			}
			x.attempt++
			x.dispatch(next)
			return
		}
		if err != nil {
			x.fail(x.lp.p.resolveReply(x.name, err))
			return
		}
		x.dispatch(r)
	case pendDial:
		x.dialed()
	case pendDialWS:
		x.dialedWS()
	}
}

// dispatch sends the request to the session of r.
func (x *loopExchange) dispatch(r Route) {
	p := x.lp.p
	x.c.sp.stamp(hopRouted)
	if r.Session == nil {
		x.fail(&p.replies.noWorker)
		return
	}
	if overWorker(r.Session, x.bodyLen()) {
		// Refused before a byte goes out: the worker's server would.
		p.m.rejected.Inc()
		x.fail(p.bodyOverWorker(r.Session))
		return
	}
	if x.ws {
		// A handshake takes no place in the in-flight cap and no pooled
		// connection: it goes on one of its own.
		ep, err := p.endpointOf(r.Session)
		if err != nil {
			x.fail(p.unusable(x.name, r, err))
			return
		}
		ep.markUsed()
		x.route, x.ep = r, ep
		x.dialWS()
		return
	}
	ep, ok, err := p.admit(r.Session)
	if err != nil {
		x.fail(p.unusable(x.name, r, err))
		return
	}
	if !ok {
		p.countFailure(&p.replies.overloaded)
		x.fail(&p.replies.overloaded)
		return
	}
	if x.attempt == 1 {
		ep.earn()
	}
	x.route, x.ep = r, ep
	x.acquire()
}

// acquire takes a worker connection of the loop's pool for x.ep: an idle
// one, a new one (dialled on a goroutine), or a place in the queue.
func (x *loopExchange) acquire() {
	lp := x.lp
	pool := x.ep.loopPool(lp.id)
	if w := pool.popIdle(lp); w != nil {
		x.send(w, true)
		return
	}
	if pool.open < x.ep.loopMax {
		pool.open++
		x.dial()
		return
	}
	pool.enqueue(x)
	x.arm(tQueue, x.ep.queueTimeout)
}

// dial connects to the worker on a goroutine (the endpoint's dialer applies
// the registry's address policy) and posts x back with the descriptor.
func (x *loopExchange) dial() { x.dialWith(pendDial, x.ep.dialTimeout) }

// dialWith dials x.ep on a goroutine within timeout and posts x back with the
// result, as step kind.
func (x *loopExchange) dialWith(kind uint8, timeout time.Duration) {
	f := x.lp.f
	ep := x.ep
	x.pending = kind
	f.wg.Go(func() {
		fd, err := -1, error(nil)
		conn, err := ep.dial(ep.addr, timeout)
		if err == nil {
			if sc, ok := conn.(syscall.Conn); ok {
				fd, err = netloop.Dup(sc)
			} else {
				err = errors.New("worker connection has no file descriptor")
			}
			_ = conn.Close()
		}
		x.dfd, x.derr = fd, err
		x.lp.nl.Post(x)
	})
}

// dialed handles the dial's result on the loop.
func (x *loopExchange) dialed() {
	lp, p, ep := x.lp, x.lp.p, x.ep
	pool := ep.loopPool(lp.id)
	fd, err := x.dfd, x.derr
	x.dfd, x.derr = -1, nil
	var w *workerConn
	if err == nil {
		_ = netloop.SetNoDelay(fd)
		w, err = lp.newWorkerConn(ep, fd)
	}
	if err != nil {
		pool.open--
		pool.dialFor(lp) // the slot is free for whoever waits
		if x.abandoned {
			ep.leave()
			lp.putExchange(x)
			return
		}
		ep.leave()
		if p.errLog.Allow() {
			p.log.Warn("cannot reach worker", "session", ep.id, "addr", ep.addr, "err", err)
		}
		x.settle(p.decide(x.outcome(endNotSent, false), ep))
		return
	}
	if x.abandoned {
		ep.leave()
		pool.putIdle(lp, w)
		lp.putExchange(x)
		return
	}
	x.send(w, false)
}

// send writes the request on w.
func (x *loopExchange) send(w *workerConn, reused bool) {
	lp, p := x.lp, x.lp.p
	x.wc, w.x = w, x
	x.reused = reused
	x.startNs = lp.nl.Now()
	x.setEndpointHeaders()
	x.out = x.req.AppendBytes(x.out[:0])
	x.out = append(x.out, x.body...)
	x.sent = 0
	x.rn, x.headLen, x.need, x.gotBytes = 0, 0, 0, false
	if x.rbuf == nil {
		x.rbuf = lp.getRespBuf()
	}
	switch {
	case x.ws:
		x.arm(tResponse, p.cfg.TunnelHandshakeTimeout)
	case x.up.on:
		// Writing a long body: its progress moves the timer
		// (uploadMoved); the wait for the answer starts once it is sent.
		x.up.armed = x.startNs
		x.arm(tUpload, p.cfg.StreamIdleTimeout)
	default:
		x.arm(tResponse, p.cfg.ResponseHeaderTimeout)
	}
	x.write()
}

// setEndpointHeaders sets what depends on the route: the proxy secret, the
// session, the placement's epoch, and the path prefix of the advertise URL.
func (x *loopExchange) setEndpointHeaders() {
	h := &x.req
	ep := x.ep
	setRouteFields(h, ep, x.route.Epoch, !x.epHeaders, x.scratch[:0])
	x.epHeaders = true
	if len(ep.prefix) > 0 {
		x.uri = append(append(x.uri[:0], ep.prefix...), x.target...)
		h.SetRequestURIBytes(x.uri)
	} else if x.attempt > 1 {
		h.SetRequestURIBytes(x.target)
	}
}

// write writes the rest of the request; it continues on w's write events.
func (x *loopExchange) write() {
	w := x.wc
	for x.sent < len(x.out) {
		n, err := netloop.Write(w.fd, x.out[x.sent:])
		if err == unix.EAGAIN {
			return // w's next write event continues
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			x.sendFailed(err)
			return
		}
		x.sent += n
	}
	if x.up.on {
		x.pumpUpload() // the rest of the body, from the client's socket
		return
	}
	x.c.sp.stamp(hopSent)
	if w.rready {
		x.readResponse()
	}
}

// sendFailed handles a write error on the worker connection.
func (x *loopExchange) sendFailed(err error) {
	p := x.lp.p
	sent, reused := x.sent, x.reused
	x.dropConn()
	if x.ws {
		x.badGateway("cannot send a handshake to the worker", err)
		return
	}
	end := endNotSent // nothing left the proxy: the worker has not seen it
	if sent > 0 {
		end = endNoAnswer
		if p.errLog.Allow() {
			p.log.Warn("cannot send to worker", "session", x.ep.id, "addr", x.ep.addr, "err", err)
		}
	}
	x.settle(p.decide(x.outcome(end, reused), x.ep))
}

// outcome describes the attempt that ended (end) for decide. A request
// whose body is held whole can be sent again; one whose body is spliced
// cannot, as on the fasthttp path (bodyLength): its body is not held.
func (x *loopExchange) outcome(end attemptEnd, reused bool) outcome {
	o := outcome{end: end, reused: reused, idempotent: x.idempotent, replayable: x.up.length == 0,
		resent: x.resentOnce, attempt: x.attempt, holder: x.route.Session}
	if end == endAnswered {
		o.status = x.resp.StatusCode()
		if o.status == fasthttp.StatusServiceUnavailable || o.status == fasthttp.StatusForbidden {
			// The only answers whose reason decide reads.
			o.reason = knownReason(x.resp.Peek(wire.HeaderReason))
		}
	}
	return o
}

// settle does what decide said (a) once the attempt's worker connection is
// released or closed: it tells the resolver and counts (enact), then sends
// again, routes again, rechecks the placement or answers. (A relay is
// onFinalHead's.)
func (x *loopExchange) settle(a action) {
	p := x.lp.p
	p.enact(a, x.name, x.route)
	x.resentOnce = x.resentOnce || a.resent
	switch a.verdict {
	case resend:
		if !a.free {
			x.attempt++
		}
		x.dispatch(x.route)
	case reresolve:
		x.attempt++
		x.lookup()
	case recheck:
		x.resolveAsync(pendRecheck)
	case answer:
		x.fail(a.reply)
	}
}

// readResponse reads the worker's answer as far as it has come.
func (x *loopExchange) readResponse() {
	w := x.wc
	for w != nil && x.wc == w && !x.st.on {
		if x.rn == len(x.rbuf) {
			if x.headLen == 0 {
				x.badGateway("response head larger than the read buffer", nil)
			}
			return
		}
		avail := len(x.rbuf) - x.rn
		n, err := netloop.Read(w.fd, x.rbuf[x.rn:])
		if err == unix.EAGAIN {
			w.rready = false
			return
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			x.readFailed(err)
			return
		}
		if n < avail && !w.hup {
			w.rready = false
		}
		x.rn += n
		if !x.gotBytes {
			x.c.sp.stampAt(hopAnsWake, x.lp.nl.Now())
			x.c.sp.stamp(hopFirst)
		}
		x.gotBytes = true
		if !x.progress() {
			return
		}
		if !w.rready {
			return
		}
	}
}

// readFailed: the worker connection ended or failed while x waited for (or
// read) its answer.
func (x *loopExchange) readFailed(err error) {
	p := x.lp.p
	if !x.gotBytes && !x.ws {
		// Nothing of an answer arrived.
		reused := x.reused
		x.dropConn()
		a := p.decide(x.outcome(endNoAnswer, reused), x.ep)
		if (!reused || a.verdict != resend) && p.errLog.Allow() {
			// Not a pooled connection the worker had closed, sent again.
			p.log.Warn("no response from worker", "session", x.ep.id, "addr", x.ep.addr, "err", errString(err))
		}
		x.settle(a)
		return
	}
	if x.need == 0 && x.headLen == 0 {
		x.badGateway("response cut off", err)
		return
	}
	x.badGateway("response body cut off", err)
}

func errString(err error) string {
	if err == nil {
		return "connection closed"
	}
	return err.Error()
}

// progress acts on what has been read. It reports whether reading should go
// on.
func (x *loopExchange) progress() bool {
	if x.headLen == 0 {
		return x.onHead()
	}
	if x.rn >= x.need {
		x.finishBuffered()
		return false
	}
	return true
}

// onHead parses the response head once it is complete.
func (x *loopExchange) onHead() bool {
	p := x.lp.p
	for {
		b := x.rbuf[:x.rn]
		i := bytes.Index(b, crlfcrlf)
		if i < 0 {
			if x.rn >= p.cfg.MaxResponseHeaderBytes {
				x.badGateway("response head larger than the limit", nil)
				return false
			}
			return true
		}
		head := b[:i+len(crlfcrlf)]
		s := &x.rsc
		s.reset()
		scanFields(skipLine(head), s, 0)
		rh := &x.resp
		rh.Reset()
		if err := rh.Read(x.lp.hr.reset(head)); err != nil {
			x.badGateway("bad response head from worker", err)
			return false
		}
		if s.responseFault() {
			x.badGateway("ambiguous response framing from worker", nil)
			return false
		}
		code := rh.StatusCode()
		if code >= 200 || code < 100 || code == fasthttp.StatusSwitchingProtocols && x.ws {
			x.headLen = len(head)
			return x.onFinalHead()
		}
		if code == fasthttp.StatusSwitchingProtocols {
			x.badGateway("101 to a plain request", nil)
			return false
		}
		// An interim answer: dropped (the client's Expect never reaches a
		// loop). The next head follows.
		x.rn = copy(x.rbuf, b[len(head):])
	}
}

// onFinalHead acts on the final response head.
func (x *loopExchange) onFinalHead() bool {
	p := x.lp.p
	rh := &x.resp
	p.m.upstream.observe(x.stripe, time.Duration(x.lp.nl.Now()-x.startNs))
	x.c.sp.worker(rh)
	x.closeAfter = rh.ConnectionClose() || x.rsc.connClose
	if x.ws {
		if rh.StatusCode() != 101 {
			// Not upgraded (426, 400, 403, a host's 503...): a plain
			// answer, never a tunnel, and the connection is not kept.
			x.closeAfter = true
			return x.respond()
		}
		if x.rsc.upgrades != 1 || !lowerEq(x.rsc.upgrade, "websocket") {
			x.badGateway("101 without Upgrade: websocket", nil)
			return false
		}
		x.openTunnel()
		return false
	}
	a := p.decide(x.outcome(endAnswered, x.reused), x.ep)
	switch a.verdict {
	case relay:
		p.enact(a, x.name, x.route)
		return x.respond()
	case reresolve:
		// The host's refusal is dropped; its connection is kept when the
		// refusal's body is small and complete.
		if cl := rh.ContentLength(); !x.closeAfter && cl >= 0 && x.rn == x.headLen+cl {
			x.releaseConn()
		} else {
			x.dropConn()
		}
	default:
		x.dropConn()
	}
	x.settle(a)
	return false
}

// respond turns the worker's final head into the client's answer: a small
// body is read whole first, anything else streams.
func (x *loopExchange) respond() bool {
	p := x.lp.p
	c := x.c
	rh := &x.resp
	if x.clientClose || x.lp.f.closing.Load() {
		c.closeAfter = true
	}
	code := rh.StatusCode()
	if x.isHead || noBody(code) {
		if x.rn > x.headLen {
			x.closeAfter = true // bytes after a bodiless answer
		}
		out := x.appendHead(x.lp.getOut(), false)
		x.releaseConn()
		p.countResponse(code)
		x.record(code, knownReason(rh.Peek(wire.HeaderReason)), 0)
		x.finish(out)
		return false
	}
	cl := rh.ContentLength()
	if cl >= 0 && cl <= p.cfg.BufferedResponseMax {
		x.need = x.headLen + cl
		if x.rn >= x.need {
			x.finishBuffered()
			return false
		}
		return true
	}
	x.startStream(cl)
	return false
}

// appendHead appends the worker's response head (x.rbuf[:x.headLen]) as the
// client gets it: its status line as HTTP/1.1 and its fields as they came,
// less the hop-by-hop ones the scan found (RFC 9110 §7.6.1: Connection and
// the fields it names, Keep-Alive, Upgrade, ...); Connection: close when the
// client connection closes after it (the client asked, or the Front is
// shutting down), and chunked framing when rechunk (a body the worker
// delimits by closing). Nothing is added that the worker did not send: no
// Server, Date or Content-Type of the proxy's.
func (x *loopExchange) appendHead(out []byte, rechunk bool) []byte {
	out = x.appendHeadFields(out, x.rsc.deletes())
	if rechunk {
		out = append(out, "Transfer-Encoding: chunked\r\n"...)
	}
	if x.c.closeAfter {
		out = append(out, "Connection: close\r\n"...)
	}
	return append(out, '\r', '\n')
}

// appendHeadFields appends the status line and the fields of the worker's
// head but dels, without the blank line that ends the head.
func (x *loopExchange) appendHeadFields(out []byte, dels []fieldRef) []byte {
	head := x.rbuf[:x.headLen]
	i := bytes.IndexByte(head, '\n')
	line := head[:i-1] // CR checked by the scan and the parse
	out = append(out, "HTTP/1.1"...)
	if sp := bytes.IndexByte(line, ' '); sp >= 0 {
		out = append(out, line[sp:]...)
	}
	out = append(out, '\r', '\n')
	for rest := head[i+1:]; ; {
		j := bytes.IndexByte(rest, '\n')
		if j <= 1 {
			break // the empty line
		}
		line, rest = rest[:j+1], rest[j+1:]
		colon := bytes.IndexByte(line, ':')
		if colon > 0 && dropped(line[:colon], dels) {
			continue
		}
		out = append(out, line...)
	}
	return out
}

// dropped reports whether the field named name (a slice of the scanned head)
// is one of dels: the same field line, or a name a Connection field listed.
func dropped(name []byte, dels []fieldRef) bool {
	for _, d := range dels {
		if len(d.name) == 0 {
			continue
		}
		if d.kind == hkListed {
			if len(d.name) == len(name) && bytes.EqualFold(d.name, name) {
				return true
			}
			continue
		}
		if &d.name[0] == &name[0] {
			return true
		}
	}
	return false
}

// finishBuffered answers with a body read whole.
func (x *loopExchange) finishBuffered() {
	p := x.lp.p
	if x.rn > x.need {
		x.closeAfter = true // the worker sent more than it announced
	}
	out := x.appendHead(x.lp.getOut(), false)
	out = append(out, x.rbuf[x.headLen:x.need]...)
	x.releaseConn()
	code := x.resp.StatusCode()
	p.countResponse(code)
	x.record(code, knownReason(x.resp.Peek(wire.HeaderReason)), int64(x.need-x.headLen))
	x.finish(out)
}

// record tells the Recorder about x, once its answer's head is decided:
// status and reason of the answer, bytes of the bodies as far as known.
func (x *loopExchange) record(status int, reason string, bytes int64) {
	rec := x.lp.p.cfg.Recorder
	if rec == nil {
		return
	}
	holder := ""
	if x.ep != nil {
		holder = x.ep.id
	}
	rec.Record(x.name, holder, status, reason, x.bodyLen()+max(bytes, 0),
		time.Duration(x.lp.nl.Now()-x.recvNs), netloop.Time(x.recvNs))
}

// finish hands the answer to the client connection and retires x.
func (x *loopExchange) finish(out []byte) {
	c := x.c
	x.lp.nl.Disarm(&x.timer)
	c.x = nil
	x.lp.putExchange(x)
	c.answerOwned(out)
}

// fail answers with one of the proxy's own replies.
func (x *loopExchange) fail(rp *reply) {
	c := x.c
	if x.wc != nil {
		x.dropConn()
	}
	if x.up.on {
		// The rest of a spliced body is still in the client's socket:
		// nothing after it can be read as a request. The connection closes
		// after the answer, lingering so that the client reads it.
		c.closeAfter = true
		c.linger = true
	}
	x.lp.p.countResponse(rp.status)
	x.record(rp.status, rp.reason, 0)
	if x.clientClose || x.lp.f.closing.Load() {
		c.closeAfter = true
	}
	x.lp.nl.Disarm(&x.timer)
	c.x = nil
	x.lp.putExchange(x)
	c.answerReply(rp)
}

// badGateway answers 502: the worker's answer cannot be relayed.
func (x *loopExchange) badGateway(what string, err error) {
	p := x.lp.p
	if p.errLog.Allow() {
		if err != nil {
			p.log.Warn(what, "session", x.ep.id, "err", err)
		} else {
			p.log.Warn(what, "session", x.ep.id)
		}
	}
	p.m.badGateway.Inc()
	x.fail(&p.replies.badGateway)
}

// releaseConn returns the worker connection to the pool, or closes it when
// the worker asked for that or left bytes after its answer.
func (x *loopExchange) releaseConn() {
	w := x.wc
	if w == nil {
		return
	}
	if x.closeAfter {
		x.dropConn()
		return
	}
	x.wc, w.x = nil, nil
	x.ep.leave()
	x.ep.loopPool(x.lp.id).putIdle(x.lp, w)
}

// dropConn closes the worker connection.
func (x *loopExchange) dropConn() {
	w := x.wc
	if w == nil {
		return
	}
	x.wc, w.x = nil, nil
	if !x.ws {
		x.ep.leave() // a handshake took no place in the in-flight cap
	}
	w.close()
}

// arm sets x's timer.
func (x *loopExchange) arm(kind uint8, d time.Duration) {
	x.tkind = kind
	x.lp.nl.ArmAfter(&x.timer, d)
}

// OnTimer implements netloop.TimerHandler.
func (x *loopExchange) OnTimer() {
	p := x.lp.p
	switch x.tkind {
	case tQueue:
		x.ep.loopPool(x.lp.id).dequeue(x)
		x.ep.leave()
		p.m.overloaded.Inc()
		x.fail(&p.replies.overloaded)
	case tResponse:
		if x.headLen > 0 {
			// A buffered body that stopped arriving.
			x.badGateway("response body timed out", nil)
			return
		}
		p.m.timeouts.Inc()
		x.fail(&p.replies.timeout)
	case tStream:
		x.streamTimeout()
	case tUpload:
		x.uploadTimeout()
	}
}

// abandon ends x because its client connection closed.
func (x *loopExchange) abandon() {
	lp := x.lp
	x.abandoned = true
	lp.nl.Disarm(&x.timer)
	if x.queued {
		x.ep.loopPool(lp.id).dequeue(x)
		x.ep.leave()
	}
	if x.wc != nil {
		x.dropConn()
	}
	if x.pending == pendNone {
		lp.putExchange(x)
	}
	// Otherwise RunTask sees abandoned and retires x.
}

// strconvAppendHex appends n in hex.
func strconvAppendHex(b []byte, n int) []byte { return strconv.AppendInt(b, int64(n), 16) }
