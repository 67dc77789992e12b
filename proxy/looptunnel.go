package proxy

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/internal/base/netloop"
)

// A loop serves WebSocket handshakes itself, as the fasthttp path does
// (upgrade.go), and then relays the two connections as a byte tunnel with
// no goroutine: the handshake goes to the worker on a connection of its own
// (never pooled), an answer other than 101 is relayed as a plain response
// (no tunnel on a refused upgrade), and a 101 turns the client connection
// and the worker connection into a tunnel the loop pumps both ways. Each
// direction reads only when what it read before has been written, so a
// tunnel holds at most one read buffer per direction, allocated only while
// a receiver lags. A half-close is passed on (shutdown(SHUT_WR)); the
// tunnel ends when both directions have ended, on an error, after
// TunnelIdleTimeout without a byte either way, or when the proxy closes it
// (CloseTunnels, Close, the Front's shutdown).

// loopTunnel is a tunnel on a loop.
type loopTunnel struct {
	lp   *loop
	c    *clientConn
	w    *workerConn
	name string
	sess *Session
	ep   *endpoint

	up, down tunnelDirection // client → worker, worker → client
	last     int64           // when a byte last moved
	timer    netloop.Timer
	ended    bool
	// closing is set by close (any goroutine) before it posts the end, so
	// that a close during Watch ends the tunnel before the 101 goes out.
	closing atomic.Bool
}

// tunnelDirection is one direction of a tunnel: bytes read and not yet written.
type tunnelDirection struct {
	pend []byte
	off  int
	eof  bool // the source ended
	shut bool // the end was passed on
}

func (t *loopTunnel) sessionID() string { return t.sess.ID }

// close implements tunnelEnd: any goroutine may ask the loop to end it.
func (t *loopTunnel) close() {
	t.closing.Store(true)
	t.lp.nl.Post(tunnelClose{t})
}

type tunnelClose struct{ t *loopTunnel }

func (tc tunnelClose) RunTask() { tc.t.end() }

// dialWS connects to the worker for a handshake on a goroutine: a fresh
// connection, never a pooled one, bounded by TunnelHandshakeTimeout.
func (x *loopExchange) dialWS() {
	x.dialWith(pendDialWS, min(x.lp.p.cfg.TunnelHandshakeTimeout, x.ep.dialTimeout))
}

// dialedWS handles the handshake connection's dial on the loop.
func (x *loopExchange) dialedWS() {
	lp, p, ep := x.lp, x.lp.p, x.ep
	fd, err := x.dfd, x.derr
	x.dfd, x.derr = -1, nil
	var w *workerConn
	if err == nil {
		_ = netloop.SetNoDelay(fd)
		w, err = lp.newWorkerConn(ep, fd)
	}
	if x.abandoned {
		if w != nil {
			w.closeFd()
		}
		lp.putExchange(x)
		return
	}
	if err != nil {
		x.fail(p.handshakeUnreachable(x.name, x.route, ep, err))
		return
	}
	w.solo = true
	x.send(w, false)
}

// openTunnel turns an exchange whose worker answered 101 into a tunnel: the
// head (and any byte the worker sent after it) goes to the client, the
// bytes the client sent after its handshake to the worker.
func (x *loopExchange) openTunnel() {
	lp, p, c, w := x.lp, x.lp.p, x.c, x.wc
	t := &loopTunnel{lp: lp, c: c, w: w, name: string(x.name), sess: x.route.Session, ep: x.ep}
	t.timer.H = t
	if !p.registerTunnel(t, t.name, t.ep) {
		p.m.tunnelsRejected.Inc()
		x.fail(&p.replies.tunnelsFull) // the proxy is closing
		return
	}
	out := x.appendHeadWS(lp.getOut())
	out = append(out, x.rbuf[x.headLen:x.rn]...)
	x.tunnelCounted = false // the tunnel holds its place in MaxTunnels now
	p.m.tunnels.Inc()
	p.countResponse(101)
	x.record(101, "", 0)
	if wt := p.watcher; wt != nil {
		wt.Watch(t.name)
	}
	lp.nl.Disarm(&x.timer)
	if t.closing.Load() {
		// Closed as soon as registered (the placement moved): the client
		// never sees the 101.
		lp.putOut(out)
		x.wc, w.x = nil, nil
		c.x = nil
		lp.putExchange(x)
		c.tun, w.tun = t, t
		t.end()
		return
	}
	x.wc, w.x = nil, nil
	c.x = nil
	lp.putExchange(x)

	c.tun, w.tun = t, t
	c.state = stTunnel
	t.down.pend, t.down.off = append(t.down.pend[:0], out...), 0
	lp.putOut(out)
	if c.n > 0 {
		t.up.pend = append(t.up.pend[:0], c.buf[:c.n]...)
		lp.putBuf(c.buf)
		c.buf, c.n = nil, 0
	}
	t.last = lp.nl.Now()
	lp.nl.ArmAfter(&t.timer, p.cfg.TunnelIdleTimeout)
	t.pump()
}

// appendHeadWS appends the worker's 101 head as the client gets it: the
// hop-by-hop fields dropped but Upgrade, and Connection: Upgrade.
func (x *loopExchange) appendHeadWS(out []byte) []byte {
	dels := x.rsc.deletes()
	keep := dels[:0:0]
	for _, d := range dels {
		if d.kind != hkUpgrade {
			keep = append(keep, d)
		}
	}
	head := x.appendHeadFields(out, keep)
	return append(append(head, "Connection: Upgrade\r\n"...), '\r', '\n')
}

// pump moves what can be moved both ways.
func (t *loopTunnel) pump() {
	if t.ended {
		return
	}
	t.move(&t.up, t.c.fd, &t.c.rready, t.c.hup, t.w.fd)
	if t.ended {
		return
	}
	t.move(&t.down, t.w.fd, &t.w.rready, t.w.hup, t.c.fd)
	if !t.ended && t.up.shut && t.down.shut {
		t.end()
	}
}

// move copies src to dst until src has nothing or dst takes nothing more.
func (t *loopTunnel) move(d *tunnelDirection, src int, rready *bool, hup bool, dst int) {
	lp := t.lp
	for {
		for d.off < len(d.pend) {
			n, err := netloop.Write(dst, d.pend[d.off:])
			if err == unix.EAGAIN {
				return // dst's next write event pumps again
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				t.end()
				return
			}
			d.off += n
			t.last = lp.nl.Now()
		}
		d.pend, d.off = d.pend[:0], 0
		if d.eof {
			if !d.shut {
				_ = unix.Shutdown(dst, unix.SHUT_WR)
				d.shut = true
			}
			return
		}
		if !*rready {
			return
		}
		n, err := netloop.Read(src, lp.scratch)
		switch {
		case err == unix.EAGAIN:
			*rready = false
			return
		case err == unix.EINTR:
			continue
		case err != nil:
			t.end()
			return
		case n == 0:
			d.eof = true
			continue
		}
		if n < len(lp.scratch) && !hup {
			*rready = false
		}
		t.last = lp.nl.Now()
		m, err := netloop.Write(dst, lp.scratch[:n])
		if err == unix.EAGAIN || err == unix.EINTR {
			m, err = 0, nil
		}
		if err != nil {
			t.end()
			return
		}
		if m < n {
			d.pend = append(d.pend[:0], lp.scratch[m:n]...)
			d.off = 0
		}
	}
}

// OnTimer implements netloop.TimerHandler: the idle timeout.
func (t *loopTunnel) OnTimer() {
	idle := t.lp.p.cfg.TunnelIdleTimeout
	if left := t.last + int64(idle) - t.lp.nl.Now(); left > 0 {
		t.lp.nl.ArmAfter(&t.timer, time.Duration(left))
		return
	}
	t.end()
}

// end closes both connections and takes the tunnel out of the books.
func (t *loopTunnel) end() {
	if t.ended {
		return
	}
	t.ended = true
	lp, p := t.lp, t.lp.p
	lp.nl.Disarm(&t.timer)
	p.unregisterTunnel(t, t.name, t.ep)
	if wt := p.watcher; wt != nil {
		wt.Unwatch(t.name)
	}
	p.tunnelsOpen.Add(-1)
	t.w.tun = nil
	t.w.closeFd()
	t.c.tun = nil
	t.c.close()
}
