package proxy

import (
	"github.com/pinned-go/pinned/internal/base/netloop"
)

// loopPool is one loop's connections to one worker endpoint: an idle list
// (most recently used first), the number open (idle, busy or being dialled),
// and the exchanges waiting for one. Only its loop touches it.
type loopPool struct {
	idle       *workerConn // head of the idle list
	open       int
	whead, wtl *loopExchange // waiting exchanges, oldest first
}

// popIdle takes the most recently used idle connection, if any.
func (pl *loopPool) popIdle(lp *loop) *workerConn {
	w := pl.idle
	if w == nil {
		return nil
	}
	pl.unlinkIdle(w)
	lp.nl.Disarm(&w.timer)
	return w
}

// putIdle gives w to the oldest waiting exchange, or keeps it idle until the
// endpoint's IdleConnTimeout.
func (pl *loopPool) putIdle(lp *loop, w *workerConn) {
	if x := pl.whead; x != nil {
		pl.dequeue(x)
		lp.nl.Disarm(&x.timer)
		x.send(w, true)
		return
	}
	w.idle = true
	w.prev, w.next = nil, pl.idle
	if pl.idle != nil {
		pl.idle.prev = w
	}
	pl.idle = w
	lp.nl.ArmAfter(&w.timer, w.ep.idleConnTimeout)
}

func (pl *loopPool) unlinkIdle(w *workerConn) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		pl.idle = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	}
	w.prev, w.next, w.idle = nil, nil, false
}

// enqueue makes x wait for a connection.
func (pl *loopPool) enqueue(x *loopExchange) {
	x.queued = true
	x.qnext, x.qprev = nil, pl.wtl
	if pl.wtl != nil {
		pl.wtl.qnext = x
	} else {
		pl.whead = x
	}
	pl.wtl = x
}

// dequeue removes a waiting exchange.
func (pl *loopPool) dequeue(x *loopExchange) {
	if !x.queued {
		return
	}
	if x.qprev != nil {
		x.qprev.qnext = x.qnext
	} else {
		pl.whead = x.qnext
	}
	if x.qnext != nil {
		x.qnext.qprev = x.qprev
	} else {
		pl.wtl = x.qprev
	}
	x.qnext, x.qprev, x.queued = nil, nil, false
}

// dialFor opens a connection for the oldest waiting exchange when a slot is
// free (a connection closed, or a dial failed).
func (pl *loopPool) dialFor(lp *loop) {
	x := pl.whead
	if x == nil || pl.open >= x.ep.loopMax {
		return
	}
	pl.dequeue(x)
	lp.nl.Disarm(&x.timer)
	pl.open++
	x.dial()
}

// workerConn is a loop's connection to a worker.
type workerConn struct {
	lp  *loop
	ep  *endpoint
	fd  int
	tok netloop.Token

	x      *loopExchange // the exchange using it; nil while idle
	rready bool          // readable since the last short read
	// hup: the worker shut its side down (or the connection failed); a
	// short read then does not mean drained, the end is still to be read.
	hup bool

	timer      netloop.Timer // idle timeout while pooled
	idle       bool
	prev, next *workerConn

	// solo: a WebSocket handshake's connection, never pooled; tun its
	// tunnel once upgraded.
	solo bool
	tun  *loopTunnel
}

// newWorkerConn registers a connected worker socket on lp.
func (lp *loop) newWorkerConn(ep *endpoint, fd int) (*workerConn, error) {
	w := &workerConn{lp: lp, ep: ep, fd: fd}
	w.timer.H = w
	tok, err := lp.nl.Add(fd, w)
	if err != nil {
		_ = netloop.Close(fd)
		return nil, err
	}
	w.tok = tok
	lp.workers[w] = struct{}{}
	return w, nil
}

// OnEvent implements netloop.Handler.
func (w *workerConn) OnEvent(ev uint32) {
	if ev&(netloop.EventRead|netloop.EventHangup|netloop.EventError) != 0 {
		w.rready = true
	}
	if ev&(netloop.EventHangup|netloop.EventError) != 0 {
		w.hup = true
	}
	if w.tun != nil {
		w.tun.pump()
		return
	}
	x := w.x
	if x == nil {
		if w.rready {
			// An idle connection the worker closed (or wrote to unasked):
			// it cannot carry a request any more.
			w.close()
		}
		return
	}
	if ev&(netloop.EventWrite|netloop.EventError|netloop.EventHangup) != 0 && x.sent < len(x.out) {
		x.write()
		return
	}
	if x.up.on {
		// A spliced request body is being sent: an answer (an early one
		// too) is read once all of it has gone, as on the fasthttp path.
		if ev&(netloop.EventWrite|netloop.EventError|netloop.EventHangup) != 0 {
			x.pumpUpload()
		}
		return
	}
	if w.rready && x.sent >= len(x.out) {
		if x.st.on {
			x.workerReadable()
		} else {
			x.readResponse()
		}
	}
}

// OnTimer implements netloop.TimerHandler: an idle connection's timeout.
func (w *workerConn) OnTimer() {
	if w.idle {
		w.close()
	}
}

// close closes the connection and frees its slot in the pool, which may let
// a waiting exchange dial.
func (w *workerConn) close() {
	if w.fd < 0 {
		return
	}
	if w.solo {
		w.closeFd()
		return
	}
	lp := w.lp
	pl := w.ep.loopPool(lp.id)
	if w.idle {
		pl.unlinkIdle(w)
	}
	w.closeFd()
	pl.open--
	pl.dialFor(lp)
}

// closeFd closes the descriptor and forgets the connection.
func (w *workerConn) closeFd() {
	if w.fd < 0 {
		return
	}
	lp := w.lp
	lp.nl.Disarm(&w.timer)
	lp.nl.Del(w.tok)
	_ = netloop.Close(w.fd)
	w.fd = -1
	delete(lp.workers, w)
}

// getRespBuf returns a buffer for a worker's answer.
func (lp *loop) getRespBuf() []byte {
	if n := len(lp.rbufs); n > 0 {
		b := lp.rbufs[n-1]
		lp.rbufs = lp.rbufs[:n-1]
		return b
	}
	return make([]byte, lp.rbufSize)
}

func (lp *loop) putRespBuf(b []byte) {
	if len(lp.rbufs) < 256 && cap(b) == lp.rbufSize {
		lp.rbufs = append(lp.rbufs, b[:lp.rbufSize])
	}
}

// getOut returns a buffer to build an answer in.
func (lp *loop) getOut() []byte {
	if n := len(lp.outs); n > 0 {
		b := lp.outs[n-1]
		lp.outs = lp.outs[:n-1]
		return b[:0]
	}
	return make([]byte, 0, 4096)
}

// putOut takes an answer buffer back once written.
func (lp *loop) putOut(b []byte) {
	if len(lp.outs) < 256 && cap(b) <= 256<<10 {
		lp.outs = append(lp.outs, b[:0])
	}
}
