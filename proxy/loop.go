package proxy

import (
	"bytes"
	"net/http"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/internal/base/netloop"
)

// This file is the loops' client side: accepting, reading requests, deciding
// whether a loop serves a request or hands its connection over, writing
// answers. loopexchange.go is the exchange with a worker, looppool.go the
// loops' worker connections, loopstream.go relayed bodies, looptunnel.go
// WebSocket tunnels.

// loop is one event loop of a Front and everything it owns. Every field is
// touched only on the loop's goroutine.
type loop struct {
	f  *Front
	p  *Proxy
	id int
	nl *netloop.Loop
	hr *headReader
	// spans: per-request spans (spans.go; empty without the build tag, and
	// not last: a zero-size last field would be padded).
	spans spanLog

	scratch  []byte   // read buffer of connections with nothing pending (bufSize of it), tunnels and lingering
	bufs     [][]byte // free connection buffers of bufSize
	bufSize  int
	rbufs    [][]byte // free worker-answer buffers of rbufSize
	rbufSize int
	outs     [][]byte        // free answer buffers
	xs       []*loopExchange // free exchanges
	pipes    []*splicePipe   // idle pipes of spliced bodies (loopsplice.go)

	conns   map[*clientConn]struct{}
	workers map[*workerConn]struct{}

	// The acceptor's state (loop 0 only).
	lfd  int
	ltok netloop.Token
	next int

	shuttingDown bool

	dateSec int64  // the second dateBuf was formatted for
	dateBuf []byte // Date of the proxy's own replies
}

func newLoop(f *Front, id int, nl *netloop.Loop) *loop {
	p := f.p
	size := p.cfg.MaxHeaderBytes + max(p.cfg.ReplayBodyMax, 0)
	return &loop{
		f:        f,
		p:        p,
		id:       id,
		nl:       nl,
		hr:       newHeadReader(max(p.cfg.MaxHeaderBytes, p.cfg.MaxResponseHeaderBytes)),
		scratch:  make([]byte, max(size, 64<<10)),
		bufSize:  size,
		rbufSize: max(p.cfg.MaxResponseHeaderBytes+max(p.cfg.BufferedResponseMax, 0), p.cfg.StreamBufferSize),
		conns:    make(map[*clientConn]struct{}),
		workers:  make(map[*workerConn]struct{}),
		lfd:      -1,
	}
}

// getBuf returns a connection buffer.
func (lp *loop) getBuf() []byte {
	if n := len(lp.bufs); n > 0 {
		b := lp.bufs[n-1]
		lp.bufs = lp.bufs[:n-1]
		return b
	}
	return make([]byte, lp.bufSize)
}

// putBuf takes a connection buffer back (a few are kept).
func (lp *loop) putBuf(b []byte) {
	if len(lp.bufs) < 64 && cap(b) == lp.bufSize {
		lp.bufs = append(lp.bufs, b[:lp.bufSize])
	}
}

// listen starts accepting on lfd (loop 0).
func (lp *loop) listen(lfd int) {
	lp.lfd = lfd
	tok, err := lp.nl.AddListener(lfd, acceptor{lp})
	if err != nil {
		lp.p.log.Error("cannot watch the listener", "err", err)
		return
	}
	lp.ltok = tok
}

// acceptor is the listener's handler on loop 0.
type acceptor struct{ lp *loop }

// OnEvent accepts every pending connection and deals them out to the loops
// in turn.
func (a acceptor) OnEvent(uint32) {
	lp := a.lp
	f := lp.f
	for range 128 { // a batch; the level-triggered listener reports the rest
		fd, peer, err := netloop.Accept(lp.lfd)
		if err != nil {
			if err != unix.EAGAIN && err != unix.ECONNABORTED && lp.p.errLog.Allow() {
				lp.p.log.Warn("accept failed", "err", err)
			}
			return
		}
		if f.closing.Load() || f.conns.Load() >= int64(lp.p.cfg.MaxConns) {
			// Beyond MaxConns (or shutting down): a best-effort answer on
			// the fresh socket, then close.
			lp.p.m.overloaded.Inc()
			lp.p.countResponse(lp.p.replies.connsFull.status)
			_, _ = netloop.Write(fd, lp.p.replies.connsFull.raw)
			_ = netloop.Close(fd)
			continue
		}
		_ = netloop.SetNoDelay(fd)
		f.conns.Add(1)
		to := f.loops[lp.next%len(f.loops)]
		lp.next++
		ad := &adoption{lp: to, fd: fd, peer: peer}
		if to == lp {
			ad.RunTask()
		} else {
			to.nl.Post(ad)
		}
	}
}

// adoption moves an accepted connection to its loop.
type adoption struct {
	lp   *loop
	fd   int
	peer netip.AddrPort
}

func (ad *adoption) RunTask() { ad.lp.adopt(ad.fd, ad.peer) }

// adopt starts serving an accepted connection on lp.
func (lp *loop) adopt(fd int, peer netip.AddrPort) {
	if lp.shuttingDown {
		_ = netloop.Close(fd)
		lp.f.connDone()
		return
	}
	c := &clientConn{lp: lp, fd: fd, peer: peer, trusted: lp.p.trustedAddr(peer.Addr()), rready: true}
	c.timer.H = c
	tok, err := lp.nl.Add(fd, c)
	if err != nil {
		_ = netloop.Close(fd)
		lp.f.connDone()
		return
	}
	c.tok = tok
	lp.conns[c] = struct{}{}
	c.state = stIdle
	lp.nl.ArmAfter(&c.timer, lp.p.cfg.HeaderTimeout)
	c.readRequests()
}

// forget drops c from the loop's books (it is being closed or handed over).
func (lp *loop) forget(c *clientConn) {
	delete(lp.conns, c)
	lp.nl.Disarm(&c.timer)
	if c.buf != nil {
		lp.putBuf(c.buf)
		c.buf, c.n = nil, 0
	}
}

// beginShutdown stops accepting (loop 0) and closes every idle connection;
// busy ones close after their current answer.
func (lp *loop) beginShutdown() {
	lp.shuttingDown = true
	if lp.ltok != 0 {
		lp.nl.Del(lp.ltok)
		lp.ltok = 0
		_ = netloop.Close(lp.lfd)
		lp.lfd = -1
	}
	for c := range lp.conns {
		switch {
		case c.tun != nil:
			c.tun.end() // tunnels end with the proxy's listener, as Proxy.Close ends the fasthttp path's
		case c.state == stIdle && c.n == 0, c.state == stLinger:
			c.close()
		default:
			c.closeAfter = true
		}
	}
}

// closeAll closes everything the loop still has (after Run returned).
func (lp *loop) closeAll() {
	for c := range lp.conns {
		c.close()
	}
	for w := range lp.workers {
		w.closeFd()
	}
	if lp.lfd >= 0 {
		_ = netloop.Close(lp.lfd)
		lp.lfd = -1
	}
	for _, pp := range lp.pipes {
		pp.close()
	}
	lp.pipes = nil
	lp.spans.flush(lp.id)
}

// Client connection states.
const (
	stIdle   uint8 = iota // waiting for a request's first byte
	stHead                // part of a request received
	stBusy                // an exchange is in progress
	stWrite               // the answer is being written
	stTunnel              // a WebSocket tunnel (looptunnel.go)
	stLinger              // refused and shut down for writing: discarding input until the client closes
	stDone                // closed or handed over
)

// clientConn is a client connection on a loop.
type clientConn struct {
	lp      *loop
	sp      spanStamps // the current request's spans (spans.go; empty without the build tag)
	fd      int
	tok     netloop.Token
	peer    netip.AddrPort
	trusted bool

	// buf holds bytes read and not consumed (buf[:n]); nil when none.
	buf []byte
	n   int

	rready bool // readable since the last short read
	hup    bool // the client shut its side down: read on to the end
	state  uint8
	timer  netloop.Timer // head, idle or write timeout

	// pend is the answer being written, from pend[wpos:]; owned says it is
	// a buffer of the loop's, returned once written.
	pend  []byte
	wpos  int
	owned bool

	x          *loopExchange // the exchange in progress
	tun        *loopTunnel   // the tunnel the connection became
	closeAfter bool          // close once the current answer is written
	linger     bool          // the answer is a refusal: linger after it (startLinger)
	streaming  bool          // x is relaying a body: writes continue it
	reading    bool          // readRequests is running (a nested call returns at once)
}

// OnEvent implements netloop.Handler.
func (c *clientConn) OnEvent(ev uint32) {
	if ev&(netloop.EventRead|netloop.EventHangup|netloop.EventError) != 0 {
		c.rready = true
	}
	if ev&(netloop.EventHangup|netloop.EventError) != 0 {
		c.hup = true
	}
	if c.tun != nil {
		c.tun.pump()
		return
	}
	if c.state == stLinger {
		c.discard()
		return
	}
	if ev&(netloop.EventWrite|netloop.EventError|netloop.EventHangup) != 0 && c.state == stWrite {
		c.flush()
	}
	if c.state == stIdle || c.state == stHead {
		c.readRequests()
	} else if c.state == stBusy && c.rready && c.x != nil && c.x.up.on {
		c.x.clientReadable() // a spliced request body (loopsplice.go)
	}
}

// OnTimer implements netloop.TimerHandler: the head, idle or write timeout.
func (c *clientConn) OnTimer() {
	switch c.state {
	case stHead:
		// A request head, or the small body a loop reads with it, did not
		// arrive in time: the answer says which.
		c.lp.p.m.rejected.Inc()
		rp := &c.lp.p.replies.headTimeout
		if n, _ := headEnd(c.buf[:c.n]); n > 0 {
			rp = &c.lp.p.replies.bodyTimeout
		}
		c.replyAndClose(rp)
	case stIdle:
		c.close() // keep-alive idle (or a new connection that never spoke)
	case stLinger:
		c.close() // LingerTimeout: the client keeps sending
	case stWrite:
		if c.x != nil && c.streaming {
			c.x.streamTimeout()
			return
		}
		c.close() // the client does not take its answer
	}
}

// readRequests reads and starts requests while the connection waits for one.
// A request it starts may be answered before start returns (a refusal the
// loop makes at once), and the answer's end calls readRequests again: that
// nested call returns at once, and this loop goes on with the bytes that
// follow, which it took off the buffer before starting the request.
func (c *clientConn) readRequests() {
	if c.reading {
		return
	}
	c.reading = true
	c.readLoop()
	c.reading = false
}

func (c *clientConn) readLoop() {
	lp := c.lp
	for (c.state == stIdle || c.state == stHead) && c.fd >= 0 {
		if c.n > 0 {
			x, used := c.takeRequest(c.buf[:c.n])
			if used < 0 {
				return // handed over or closed
			}
			if used > 0 {
				c.n = copy(c.buf, c.buf[used:c.n])
				if c.n == 0 {
					lp.putBuf(c.buf)
					c.buf = nil
				}
				x.start()
				continue
			}
			if c.n == len(c.buf) {
				// A head that does not fit (or a small body that does not
				// with it): the fasthttp path answers 431 as usual.
				lp.f.handOver(c, c.buf[:c.n])
				c.state = stDone
				return
			}
		}
		if !c.rready {
			return
		}
		var dst []byte
		if c.buf == nil {
			// No more than a connection buffer holds: what follows the
			// request this read completes must fit in one.
			dst = lp.scratch[:lp.bufSize]
		} else {
			dst = c.buf[c.n:]
		}
		m, err := netloop.Read(c.fd, dst)
		switch {
		case err == unix.EAGAIN:
			c.rready = false
			return
		case err == unix.EINTR:
			continue
		case err != nil || m == 0:
			// End of stream or reset: a keep-alive connection ends. A
			// request cut off mid-head gets no answer (nobody to read it).
			c.close()
			return
		}
		if m < len(dst) && !c.hup {
			c.rready = false // drained until the next edge
		}
		if c.state == stIdle {
			c.state = stHead
			lp.nl.ArmAfter(&c.timer, lp.p.cfg.HeaderTimeout)
		}
		if c.buf == nil {
			// The bytes are in the loop's scratch buffer, which the next
			// read of any connection overwrites: what is left over moves
			// to a buffer of the connection's before the request starts.
			x, used := c.takeRequest(lp.scratch[:m])
			if used < 0 {
				return
			}
			if rest := lp.scratch[used:m]; len(rest) > 0 {
				c.buf = lp.getBuf()
				c.n = copy(c.buf, rest)
			}
			if x != nil {
				x.start()
			}
			continue
		}
		c.n += m
	}
}

// takeRequest looks at the bytes of a request that b starts with. It returns
// the exchange of a request it took and the bytes that request used (> 0),
// which the caller drops from its buffer before it starts x (x holds copies
// of all it needs); 0 when more bytes are needed; or -1 when the
// connection was handed over, or refused and answered.
func (c *clientConn) takeRequest(b []byte) (*loopExchange, int) {
	lp := c.lp
	p := lp.p
	headLen, ok := headEnd(b)
	if !ok {
		// Bytes a loop does not serve (a bare LF, an empty line before the
		// request line): the fasthttp path reads them as it always did.
		lp.f.handOver(c, b)
		c.state = stDone
		return nil, -1
	}
	if headLen == 0 {
		if len(b) >= p.cfg.MaxHeaderBytes {
			lp.f.handOver(c, b)
			c.state = stDone
			return nil, -1
		}
		return nil, 0
	}
	x := lp.getExchange()
	x.c = c
	need, fast := x.parse(b[:headLen])
	if rp := x.refuse; rp != nil {
		lp.putExchange(x)
		p.m.rejected.Inc()
		lp.nl.Disarm(&c.timer)
		c.state = stBusy
		c.replyAndClose(rp)
		return nil, -1
	}
	if !fast {
		lp.putExchange(x)
		lp.f.handOver(c, b)
		c.state = stDone
		return nil, -1
	}
	if len(b) < headLen+need {
		lp.putExchange(x) // parsed again once the body is in
		return nil, 0
	}
	if u := &x.up; u.length > 0 {
		// A body to splice: what came with the head is sent from here,
		// the rest goes from the socket through a pipe (loopsplice.go).
		need = int(min(int64(len(b)-headLen), u.length))
		u.left = u.length - int64(need)
		if u.left > 0 {
			pp, err := lp.getPipe()
			if err != nil {
				// No pipe (out of descriptors or pipe pages): the
				// fasthttp path streams it, copying.
				p.m.spliceFallbacks.Inc()
				lp.putExchange(x)
				lp.f.handOver(c, b)
				c.state = stDone
				return nil, -1
			}
			u.pipe, u.on = pp, true
		}
	}
	x.body = append(x.body[:0], b[headLen:headLen+need]...)
	x.recvNs = lp.nl.Now()
	c.sp.begin(b[:headLen], x.recvNs)
	c.x = x
	c.state = stBusy
	lp.nl.Disarm(&c.timer)
	return x, headLen + need
}

// headEnd returns the length of the request head at the start of b (through
// its blank line), 0 when the head is not complete yet. ok is false when the
// bytes use a line end other than CRLF or start with an empty line: a loop
// leaves those to the fasthttp path.
func headEnd(b []byte) (n int, ok bool) {
	if len(b) > 0 && (b[0] == '\r' || b[0] == '\n') {
		return 0, false
	}
	off := 0
	for {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			return 0, true
		}
		i += off // ≥ 1: b[0] is not '\n'
		if b[i-1] != '\r' {
			return 0, false
		}
		switch {
		case i+1 == len(b):
			return 0, true
		case b[i+1] != '\r':
			off = i + 1
			continue
		case i+2 == len(b):
			return 0, true
		case b[i+2] == '\n':
			return i + 3, true
		default:
			return 0, false // a line that starts with a bare CR
		}
	}
}

// answerOwned starts writing out, a buffer from the loop's pool that goes
// back once written, as the connection's answer (or the next piece of a
// streamed one).
func (c *clientConn) answerOwned(out []byte) {
	c.pend, c.wpos, c.owned = out, 0, true
	c.state = stWrite
	c.flush()
}

// answerBorrowed is answerOwned for bytes the connection does not own (a
// prebuilt reply, or a streamed piece in the exchange's read buffer).
func (c *clientConn) answerBorrowed(out []byte) {
	c.pend, c.wpos, c.owned = out, 0, false
	c.state = stWrite
	c.flush()
}

// flush writes what is pending; when all of it is written it ends the answer
// (or lets a streaming exchange continue).
func (c *clientConn) flush() {
	lp := c.lp
	for c.wpos < len(c.pend) {
		m, err := netloop.Write(c.fd, c.pend[c.wpos:])
		if err == unix.EAGAIN {
			if !c.timer.Armed() || c.streaming {
				lp.nl.ArmAfter(&c.timer, c.writeTimeout())
			}
			return
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			c.close()
			return
		}
		c.wpos += m
	}
	lp.nl.Disarm(&c.timer)
	if c.streaming {
		c.x.clientDrained()
		return
	}
	c.sp.stamp(hopDone)
	lp.spans.record(&c.sp)
	c.releasePend()
	c.answerDone()
}

// releasePend forgets the bytes written, returning an owned buffer.
func (c *clientConn) releasePend() {
	if c.owned {
		c.lp.putOut(c.pend)
	}
	c.pend, c.wpos, c.owned = nil, 0, false
}

// answerDone goes on after an answer: close, or wait for the next request.
func (c *clientConn) answerDone() {
	lp := c.lp
	if c.fd < 0 {
		return
	}
	if c.closeAfter || lp.f.closing.Load() {
		if c.linger && !c.hup && !lp.shuttingDown && lp.p.cfg.LingerTimeout > 0 {
			c.startLinger()
			return
		}
		c.close()
		return
	}
	if c.n == 0 {
		c.state = stIdle
		lp.nl.ArmAfter(&c.timer, lp.p.cfg.IdleTimeout)
	} else {
		// Bytes of the next request came with this one: its head has
		// begun, and HeaderTimeout bounds the rest of it.
		c.state = stHead
		lp.nl.ArmAfter(&c.timer, lp.p.cfg.HeaderTimeout)
	}
	c.readRequests()
}

func (c *clientConn) writeTimeout() time.Duration {
	if c.streaming {
		return c.lp.p.cfg.StreamIdleTimeout
	}
	return c.lp.p.cfg.WriteTimeout
}

// replyAndClose answers with one of the proxy's replies and closes.
func (c *clientConn) replyAndClose(rp *reply) {
	c.closeAfter = true
	c.lp.p.countResponse(rp.status)
	c.answerReply(rp)
}

// answerReply answers with one of the proxy's own replies, dated (an
// origin of a response with a clock sends Date, RFC 9110 §6.6.1).
// The connection closes after it when the reply says so or closeAfter is
// set already (the client asked to close): then it says Connection: close.
func (c *clientConn) answerReply(rp *reply) {
	lp := c.lp
	if rp.close {
		c.closeAfter = true
		c.linger = true
	}
	out := lp.getOut()
	i := bytes.IndexByte(rp.raw, '\n') + 1
	out = append(out, rp.raw[:i]...)
	out = append(out, "Date: "...)
	out = append(out, lp.date()...)
	out = append(out, '\r', '\n')
	if c.closeAfter && !rp.close {
		out = append(out, "Connection: close\r\n"...)
	}
	out = append(out, rp.raw[i:]...)
	c.answerOwned(out)
}

// date returns the current time as an HTTP date, formatted once a second.
func (lp *loop) date() []byte {
	if sec := lp.nl.Now() / int64(time.Second); sec != lp.dateSec || lp.dateBuf == nil {
		lp.dateSec = sec
		lp.dateBuf = netloop.Time(lp.nl.Now()).UTC().AppendFormat(lp.dateBuf[:0], http.TimeFormat)
	}
	return lp.dateBuf
}

// startLinger closes the connection gracefully after a refusal whose
// request may still be arriving (a body nobody reads): closing at once with
// unread input makes the kernel reset the connection, and the reset makes
// the client's kernel drop the refusal before the client reads it. The
// sending side is shut down (the client reads the refusal, then end of
// stream) and input is discarded until the client closes or LingerTimeout
// passes.
func (c *clientConn) startLinger() {
	lp := c.lp
	if err := netloop.ShutdownWrite(c.fd); err != nil {
		c.close()
		return
	}
	if c.buf != nil {
		lp.putBuf(c.buf)
		c.buf, c.n = nil, 0
	}
	c.state = stLinger
	lp.nl.ArmAfter(&c.timer, lp.p.cfg.LingerTimeout)
	c.discard()
}

// discard reads and drops what a lingering connection receives; it closes
// the connection at end of stream.
func (c *clientConn) discard() {
	for c.rready && c.fd >= 0 {
		m, err := netloop.Read(c.fd, c.lp.scratch)
		switch {
		case err == unix.EAGAIN:
			c.rready = false
		case err == unix.EINTR:
		case err != nil || m == 0:
			c.close()
		case m < len(c.lp.scratch) && !c.hup:
			c.rready = false
		}
	}
}

// close closes the connection and ends its exchange, if any.
func (c *clientConn) close() {
	if c.fd < 0 {
		return
	}
	if c.tun != nil {
		c.tun.end() // closes c too
		return
	}
	lp := c.lp
	if x := c.x; x != nil {
		c.x = nil
		x.abandon()
	}
	lp.nl.Del(c.tok)
	lp.forget(c)
	c.releasePend()
	_ = netloop.Close(c.fd)
	c.fd = -1
	c.state = stDone
	lp.f.connDone()
}
