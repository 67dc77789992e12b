package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// serveUpgrade handles a request that asks for a protocol upgrade. Only
// WebSocket is proxied (an h2c or any other upgrade would tunnel past the
// per-object routing, BishopFox h2csmuggler): the handshake goes to the
// worker on a connection of its own; a 101 turns both connections into a
// raw byte tunnel, any other answer is relayed as a plain response.
func (p *Proxy) serveUpgrade(x *exchange) {
	ctx := x.ctx
	h := &ctx.Request.Header
	s := &x.reqScan
	if s.upgrades != 1 || !lowerEq(s.upgrade, "websocket") {
		p.reject(ctx, &p.replies.upgradeToken)
		return
	}
	if !s.connUpgrade || !h.IsGet() || !h.IsHTTP11() || h.ContentLength() != -2 && h.ContentLength() != 0 {
		p.reject(ctx, &p.replies.upgradeHandshake)
		return
	}
	if rp := p.admitTunnel(); rp != nil {
		p.reply(ctx, rp)
		return
	}
	opened := false
	defer func() {
		if !opened {
			p.tunnelsOpen.Add(-1)
		}
	}()

	rt, err := p.route(ctx, x.name)
	if err != nil {
		p.reply(ctx, p.resolveReply(x.name, err))
		return
	}
	x.route = rt
	ep, err := p.endpointOf(rt.Session)
	if err != nil {
		p.reply(ctx, p.unusable(x.name, rt, err))
		return
	}
	ep.markUsed()
	x.ep = ep

	p.sanitizeRequest(x, p.trusted(ctx))
	h.Set(fasthttp.HeaderConnection, "Upgrade")
	h.Set(fasthttp.HeaderUpgrade, "websocket")
	x.setEndpointHeaders(1)

	deadline := time.Now().Add(p.cfg.TunnelHandshakeTimeout)
	timeout := min(p.cfg.TunnelHandshakeTimeout, ep.dialTimeout)
	conn, err := ep.dial(ep.addr, timeout)
	if err != nil {
		p.reply(ctx, p.handshakeUnreachable(x.name, rt, ep, err))
		return
	}
	keep := false
	defer func() {
		if !keep {
			_ = conn.Close()
		}
	}()
	_ = conn.SetDeadline(deadline)
	x.bw.Reset(conn)
	if err := h.Write(x.bw); err != nil || x.bw.Flush() != nil {
		p.m.badGateway.Inc()
		p.reply(ctx, &p.replies.badGateway)
		return
	}
	x.br.Reset(conn)
	rh := &ctx.Response.Header
	for {
		head, err := peekHead(x.br)
		if err != nil {
			if isTimeout(err) {
				p.m.timeouts.Inc()
				p.reply(ctx, &p.replies.timeout)
			} else {
				p.m.badGateway.Inc()
				p.reply(ctx, &p.replies.badGateway)
			}
			return
		}
		rs := &x.respScan
		rs.reset()
		scanFields(skipLine(head), rs, 0)
		if err := rh.Read(x.br); err != nil || rs.responseFault() {
			p.m.badGateway.Inc()
			p.reply(ctx, &p.replies.badGateway)
			return
		}
		if code := rh.StatusCode(); code >= 200 || code < 100 || code == fasthttp.StatusSwitchingProtocols {
			break
		}
	}

	if rh.StatusCode() != fasthttp.StatusSwitchingProtocols {
		// Not upgraded (426, 400, 403, a 503 from the host...): a plain
		// response, never a tunnel (0ang3el/websocket-smuggle).
		for _, f := range x.respScan.deletes() {
			rh.DelBytes(f.name)
		}
		rh.ResetConnectionClose()
		if !noBody(rh.StatusCode()) {
			if err := ctx.Response.ReadBody(x.br, p.cfg.BufferedResponseMax); err != nil {
				p.m.badGateway.Inc()
				p.reply(ctx, &p.replies.badGateway)
				return
			}
		}
		p.countResponse(rh.StatusCode())
		return
	}
	if x.respScan.upgrades != 1 || !lowerEq(x.respScan.upgrade, "websocket") {
		p.m.badGateway.Inc()
		p.reply(ctx, &p.replies.badGateway)
		return
	}
	for _, f := range x.respScan.deletes() {
		if f.kind != hkUpgrade {
			rh.DelBytes(f.name)
		}
	}
	rh.ResetConnectionClose()
	rh.Set(fasthttp.HeaderConnection, "Upgrade")
	_ = conn.SetDeadline(time.Time{})

	t := &tunnel{p: p, ep: ep, session: rt.Session, name: string(x.name), backend: conn, done: make(chan struct{})}
	t.head = rh.AppendBytes(nil)
	if n := x.br.Buffered(); n > 0 {
		b, _ := x.br.Peek(n)
		t.head = append(t.head, b...)
	}
	p.countResponse(fasthttp.StatusSwitchingProtocols)
	p.m.tunnels.Inc()
	keep, opened = true, true
	p.tunnelWG.Add(1)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(t.run)
}

// admitTunnel takes a place among MaxTunnels for a WebSocket handshake, on
// either engine, and returns nil; or it returns the refusal, 503
// overloaded, when the cap is reached or the proxy is closing. The caller
// gives the place back (tunnelsOpen) unless a tunnel takes it over.
func (p *Proxy) admitTunnel() *reply {
	if !p.closed.Load() {
		if p.tunnelsOpen.Add(1) <= int64(p.cfg.MaxTunnels) {
			return nil
		}
		p.tunnelsOpen.Add(-1)
	}
	p.m.tunnelsRejected.Inc()
	return &p.replies.tunnelsFull
}

// tunnel is an open WebSocket connection between a client and a worker: two
// byte pumps, no framing. The hijack handler (run) owns it and returns only
// when both pumps have ended, because fasthttp closes and recycles the
// client connection as soon as it returns.
type tunnel struct {
	p       *Proxy
	ep      *endpoint
	session *Session // the session it was routed to (CloseTunnels' keep)
	name    string   // the placement name it was routed by
	backend net.Conn
	head    []byte // the 101 head and any bytes the worker sent after it

	client net.Conn // the hijacked connection; set before registration
	raw    net.Conn // its underlying connection, written directly

	up       atomic.Int64 // bytes client → worker
	downDone atomic.Bool
	done     chan struct{} // closed when the down pump ends
	once     sync.Once
}

// run is the hijack handler.
func (t *tunnel) run(c net.Conn) {
	p := t.p
	defer p.tunnelWG.Done()
	defer p.tunnelsOpen.Add(-1)
	defer t.backend.Close()

	t.client = c
	t.raw = c
	if u, ok := c.(interface{ UnsafeConn() net.Conn }); ok {
		// Writes may bypass fasthttp's connection wrapper: it flushed
		// everything before the hijack. Reads may not: its reader can
		// hold bytes the client sent after the handshake.
		t.raw = u.UnsafeConn()
	}
	if !t.register() {
		return
	}
	defer t.unregister()
	if w := p.watcher; w != nil {
		w.Watch(t.name)
		defer w.Unwatch(t.name)
	}

	_ = t.raw.SetWriteDeadline(time.Now().Add(p.cfg.TunnelIdleTimeout))
	if _, err := t.raw.Write(t.head); err != nil {
		t.close()
		return
	}
	t.head = nil
	go t.pumpDown()
	t.pumpUp()
	<-t.done
}

// tunnelEnd is an open tunnel as the proxy's table knows it: a goroutine
// tunnel (the fasthttp path's hijack) or a loop's (looptunnel.go).
type tunnelEnd interface {
	// close ends the tunnel; any goroutine may call it, more than once.
	close()
	// sessionID is the worker session the tunnel was routed to.
	sessionID() string
}

func (t *tunnel) sessionID() string { return t.session.ID }

// register adds the tunnel to the proxy's table (Close and CloseTunnels
// reach it from then on) and counts it on its endpoint (the janitor leaves
// an endpoint with tunnels alone). It fails once the proxy is closed.
func (t *tunnel) register() bool { return t.p.registerTunnel(t, t.name, t.ep) }

func (t *tunnel) unregister() { t.p.unregisterTunnel(t, t.name, t.ep) }

// registerTunnel adds t to the table under name and counts it on ep; it
// fails once the proxy is closed.
func (p *Proxy) registerTunnel(t tunnelEnd, name string, ep *endpoint) bool {
	p.tunnelsMu.Lock()
	defer p.tunnelsMu.Unlock()
	if p.closed.Load() {
		return false
	}
	byName := p.tunnels[name]
	if byName == nil {
		byName = make(map[tunnelEnd]struct{})
		p.tunnels[name] = byName
	}
	byName[t] = struct{}{}
	ep.tunnels.Add(1)
	return true
}

// unregisterTunnel takes t out of the table.
func (p *Proxy) unregisterTunnel(t tunnelEnd, name string, ep *endpoint) {
	p.tunnelsMu.Lock()
	if byName := p.tunnels[name]; byName != nil {
		delete(byName, t)
		if len(byName) == 0 {
			delete(p.tunnels, name)
		}
	}
	p.tunnelsMu.Unlock()
	ep.tunnels.Add(-1)
}

// close ends both directions at once.
func (t *tunnel) close() {
	t.once.Do(func() {
		_ = t.backend.Close()
		_ = t.raw.Close()
	})
}

// pumpDown copies worker → client, with splice(2) when both ends are TCP
// connections. It alone watches for idleness while it runs: its read deadline
// ends a window every TunnelIdleTimeout, and a window in which neither
// direction moved a byte closes the tunnel. The write deadline, re-armed each
// window, sits writeSlack beyond the read deadline, so it catches a client
// that stopped reading, and a timeout seen after it cannot be a read
// timeout observed late (splice reports both the same way, and drops what
// it read but could not write).
func (t *tunnel) pumpDown() {
	defer close(t.done)
	idle := t.p.cfg.TunnelIdleTimeout
	writeSlack := max(idle, 10*time.Second)
	dst, dstTCP := t.raw.(*net.TCPConn)
	src, srcTCP := t.backend.(*net.TCPConn)
	var buf []byte
	for {
		upBefore := t.up.Load()
		now := time.Now()
		_ = t.backend.SetReadDeadline(now.Add(idle))
		writeDeadline := now.Add(idle + writeSlack)
		_ = t.raw.SetWriteDeadline(writeDeadline)
		var n int64
		var err error
		var writeFailed bool
		if dstTCP && srcTCP {
			n, err = dst.ReadFrom(src) // splice; nil error at EOF
			writeFailed = err != nil && !time.Now().Before(writeDeadline)
		} else {
			if buf == nil {
				buf = make([]byte, t.p.cfg.StreamBufferSize)
			}
			n, writeFailed, err = copyUntilError(t.raw, t.backend, buf)
		}
		switch {
		case err == nil:
			// The worker finished sending: pass the half-close on and let
			// the other direction run out, now under its own deadline.
			t.downDone.Store(true)
			if !closeWrite(t.raw) {
				t.close()
				return
			}
			_ = t.client.SetReadDeadline(time.Now().Add(idle))
			return
		case !writeFailed && isTimeout(err) && (n > 0 || t.up.Load() != upBefore):
			continue // traffic in this window
		default:
			t.close() // idle, or a connection failed
			return
		}
	}
}

// pumpUp copies client → worker through fasthttp's reader (it may hold bytes
// the client sent right after the handshake). It has no read deadline while
// the other direction runs; once that ended, a window without a byte closes
// the tunnel.
func (t *tunnel) pumpUp() {
	idle := t.p.cfg.TunnelIdleTimeout
	buf := make([]byte, t.p.cfg.StreamBufferSize)
	var armedAt time.Time
	var armedUp int64
	for {
		n, err := t.client.Read(buf)
		if n > 0 {
			if now := time.Now(); now.Sub(armedAt) > idle/4 {
				armedAt = now
				_ = t.backend.SetWriteDeadline(now.Add(2 * idle))
			}
			if _, werr := t.backend.Write(buf[:n]); werr != nil {
				t.close()
				return
			}
			t.up.Add(int64(n))
		}
		switch {
		case err == nil:
		case err == io.EOF:
			if !closeWrite(t.backend) {
				t.close()
			}
			return
		case isTimeout(err) && t.downDone.Load():
			if up := t.up.Load(); up != armedUp {
				armedUp = up
				_ = t.client.SetReadDeadline(time.Now().Add(idle))
				continue
			}
			t.close()
			return
		default:
			t.close()
			return
		}
	}
}

// copyUntilError copies src to dst until EOF (nil error) or an error, and
// says whether the error was the write's.
func copyUntilError(dst io.Writer, src io.Reader, buf []byte) (int64, bool, error) {
	var total int64
	for {
		n, err := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				return total, true, werr
			}
		}
		if err == io.EOF {
			return total, false, nil
		}
		if err != nil {
			return total, false, err
		}
	}
}

// closeWrite half-closes c when it can.
func closeWrite(c net.Conn) bool {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite() == nil
	}
	return false
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
