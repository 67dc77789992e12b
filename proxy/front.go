package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/netloop"
)

// DefaultLoops is the number of event loops a Front runs when
// FrontConfig.Loops is zero: one per CPU.
func DefaultLoops() int { return runtime.NumCPU() }

// FrontConfig configures a Front.
type FrontConfig struct {
	// Loops is the number of event loops: DefaultLoops() when zero.
	Loops int
	// Fallback serves every connection the loops hand over (see Front). Its
	// Handler must serve the proxy (Proxy.Handler) for object paths, and
	// whatever Local names; NewServer's settings are what it needs.
	// Required.
	Fallback *fasthttp.Server
	// Local reports whether a request target (raw, as on the wire) is
	// served by Fallback's own handlers rather than proxied (the
	// pinboard's /registry and /healthz). Nil means none.
	Local func(target []byte) bool
}

// Front serves a Proxy's listener with event loops (package
// internal/base/netloop): each client connection belongs to one loop, which reads
// its requests, forwards them on worker connections the same loop owns and
// writes the answers, with no goroutine or lock per request and no read that
// finds nothing (a short read means drained until the next edge).
//
// The loops take the common case: HTTP/1.1, origin-form targets, no body or
// a body with a Content-Length of at most ReplayBodyMax (held) or at least
// SpliceMin (spliced), no upgrade but WebSocket handshakes, no Expect, a
// head that fasthttp parses and the proxy's rules accept. Any other
// request (and a head the proxy refuses: the answer then comes from the
// same code as always) makes its loop hand the connection over to
// Fallback, with the bytes already read, for the rest of its life: the
// fasthttp path (Proxy.Handler) serves it as if it had accepted it. Both
// paths apply the same rules, so a client cannot tell them apart except by
// speed.
type Front struct {
	p     *Proxy
	cfg   FrontConfig
	loops []*loop

	lfd    int // the listener's descriptor, owned by loops[0]
	ln     net.Listener
	conns  atomic.Int64 // client connections open on the loops or handed over
	served chan struct{}

	// closing is set by Shutdown: loops close connections as they fall idle.
	closing atomic.Bool
	// ctx is cancelled when the Front stops: resolves and dials posted by
	// the loops end with it.
	ctx    context.Context
	cancel context.CancelFunc

	wg      sync.WaitGroup // loops, resolves, dials, Fallback's Serve on anchor
	mu      sync.Mutex
	started bool
	stopped bool
	drained chan struct{} // closed when conns reaches zero after Shutdown began
	drainMu sync.Mutex

	// anchor is the listener Fallback serves (it never accepts anything:
	// handed-over connections go to ServeConn), so that Fallback's
	// ShutdownWithContext, which does nothing on a server without a
	// listener, closes them as they fall idle.
	anchor *anchorListener
	// handed holds the handed-over connections still open, closed by
	// Shutdown when its context ends first. Each is served by a goroutine
	// of the Front (ServeConn), counted in conns until it returns.
	handedMu sync.Mutex
	handed   map[*handedConn]struct{}
}

// NewFront prepares a Front for p. It makes the loops' epoll instances but
// starts nothing; Serve does.
func (p *Proxy) NewFront(cfg FrontConfig) (*Front, error) {
	if cfg.Fallback == nil {
		return nil, errors.New("proxy: FrontConfig.Fallback is required")
	}
	if cfg.Loops <= 0 {
		cfg.Loops = DefaultLoops()
	}
	if cfg.Local == nil {
		cfg.Local = func([]byte) bool { return false }
	}
	f := &Front{p: p, cfg: cfg, lfd: -1, served: make(chan struct{}), drained: make(chan struct{}),
		anchor: newAnchorListener(), handed: make(map[*handedConn]struct{})}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	for i := range cfg.Loops {
		nl, err := netloop.New(netloop.Config{})
		if err != nil {
			for _, lp := range f.loops {
				lp.nl.Close()
			}
			return nil, fmt.Errorf("proxy: %w", err)
		}
		f.loops = append(f.loops, newLoop(f, i, nl))
	}
	p.front, p.loops = f, len(f.loops)
	return f, nil
}

// Loops returns the number of event loops.
func (f *Front) Loops() int { return len(f.loops) }

// Serve serves ln until Shutdown. ln must be a TCP listener (one with a file
// descriptor); it stays the caller's to close after Shutdown.
func (f *Front) Serve(ln net.Listener) error {
	f.mu.Lock()
	if f.started || f.stopped {
		f.mu.Unlock()
		return errors.New("proxy: Front.Serve called twice or after Shutdown")
	}
	f.started = true
	lfd, err := netloop.DupListener(ln)
	if err != nil {
		f.mu.Unlock()
		return fmt.Errorf("proxy: cannot serve %s: %w", ln.Addr(), err)
	}
	f.lfd, f.ln = lfd, ln
	for _, lp := range f.loops {
		lp := lp
		f.wg.Go(func() {
			if err := lp.nl.Run(); err != nil {
				f.p.log.Error("event loop failed", "loop", lp.id, "err", err)
			}
			lp.closeAll()
		})
	}
	f.loops[0].nl.Post(taskFunc(func() { f.loops[0].listen(lfd) }))
	f.wg.Go(func() { _ = f.cfg.Fallback.Serve(f.anchor) })
	f.mu.Unlock()
	<-f.served
	return nil
}

// Conns returns the number of client connections open: those on the loops
// and those handed over to Fallback (WebSocket tunnels of the fasthttp path
// excepted: Proxy.Close ends them). Shutdown waits for it to reach zero.
func (f *Front) Conns() int { return int(f.conns.Load()) }

// Shutdown stops accepting and drains: every exchange in progress
// finishes (each connection closes after its current answer, which says
// Connection: close; idle ones close at once), on the loops and on the
// connections handed over to Fallback alike (Fallback's
// ShutdownWithContext does it for those: Serve runs Fallback on a
// listener of the Front's own for that). When ctx ends first, every
// connection still open is closed, handed-over keep-alive ones included,
// and Shutdown returns ctx's error. Then the loops stop. Serve returns
// once Shutdown is done.
//
// Shutdown returns by ctx's deadline, whatever the clients and the workers
// do, give or take a dial in flight (EndpointConfig.DialTimeout): a
// request of the fasthttp path still waiting for a worker when its
// connection is closed ends on its own, by the proxy's timeouts, without
// holding Shutdown.
func (f *Front) Shutdown(ctx context.Context) error {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return nil
	}
	f.stopped = true
	started := f.started
	f.mu.Unlock()
	if !started {
		for _, lp := range f.loops {
			lp.nl.Close()
		}
		f.cancel()
		close(f.served)
		return nil
	}
	f.closing.Store(true)
	for _, lp := range f.loops {
		lp.nl.Post(taskFunc(lp.beginShutdown))
	}
	// Fallback's Serve registers the anchor before its first Accept:
	// until then its Shutdown would find no listener and do nothing.
	var err error
	select {
	case <-f.anchor.accepting:
		if ferr := f.cfg.Fallback.ShutdownWithContext(ctx); ferr != nil && !errors.Is(ferr, net.ErrClosed) {
			err = ferr
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = f.anchor.Close() // in case Fallback's Shutdown did not
	if err == nil && f.conns.Load() > 0 {
		select {
		case <-f.drainedChan():
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil {
		f.closeHanded() // the loops close theirs when they stop
	}
	f.cancel()
	for _, lp := range f.loops {
		lp.nl.Stop()
	}
	f.wg.Wait()
	if err != nil {
		f.closeHanded() // any a loop handed over meanwhile
	}
	close(f.served)
	return err
}

// closeHanded closes every handed-over connection still open: its
// goroutine's next read or write fails, and it ends.
func (f *Front) closeHanded() {
	f.handedMu.Lock()
	defer f.handedMu.Unlock()
	for hc := range f.handed {
		_ = hc.Conn.Close()
	}
}

// drainedChan returns the channel closed when the last connection ends.
func (f *Front) drainedChan() <-chan struct{} {
	f.drainMu.Lock()
	defer f.drainMu.Unlock()
	if f.conns.Load() == 0 {
		select {
		case <-f.drained:
		default:
			close(f.drained)
		}
	}
	return f.drained
}

// connDone counts a client connection out.
func (f *Front) connDone() {
	if f.conns.Add(-1) == 0 && f.closing.Load() {
		f.drainMu.Lock()
		select {
		case <-f.drained:
		default:
			close(f.drained)
		}
		f.drainMu.Unlock()
	}
}

// taskFunc adapts a function to netloop.Task for the rare posts (start,
// shutdown) where a closure's allocation does not matter.
type taskFunc func()

func (t taskFunc) RunTask() { t() }

// handOver gives the connection of c, with the bytes read but not consumed,
// to Fallback for the rest of its life. The loop forgets c.
func (f *Front) handOver(c *clientConn, pending []byte) {
	lp := c.lp
	lp.nl.Del(c.tok)
	lp.forget(c)
	file := os.NewFile(uintptr(c.fd), "")
	nc, err := net.FileConn(file) // a duplicate in the net package's poller
	_ = file.Close()
	c.fd = -1
	if err != nil {
		f.p.log.Warn("cannot hand a connection over to the fasthttp path", "err", err)
		f.connDone()
		return
	}
	hc := &handedConn{Conn: nc, pre: append([]byte(nil), pending...)}
	f.p.m.handovers.Inc()
	f.handedMu.Lock()
	f.handed[hc] = struct{}{}
	f.handedMu.Unlock()
	// Owned by the Front: it ends when ServeConn returns (the connection
	// closed, by either side or by Shutdown, or hijacked for a tunnel).
	go func() {
		defer f.connDone()
		_ = f.cfg.Fallback.ServeConn(hc)
		f.handedMu.Lock()
		delete(f.handed, hc)
		f.handedMu.Unlock()
	}()
}

// anchorListener is a listener that accepts nothing until it is closed
// (see Front.anchor).
type anchorListener struct {
	accepting chan struct{} // closed at the first Accept
	first     sync.Once
	closed    chan struct{}
	close     sync.Once
}

func newAnchorListener() *anchorListener {
	return &anchorListener{accepting: make(chan struct{}), closed: make(chan struct{})}
}

// Accept waits for Close and returns net.ErrClosed, which ends
// fasthttp's Serve cleanly.
func (a *anchorListener) Accept() (net.Conn, error) {
	a.first.Do(func() { close(a.accepting) })
	<-a.closed
	return nil, net.ErrClosed
}

// Close ends Accept; it is idempotent.
func (a *anchorListener) Close() error {
	a.close.Do(func() { close(a.closed) })
	return nil
}

// Addr returns a placeholder address: nothing can dial the anchor.
func (a *anchorListener) Addr() net.Addr { return anchorAddr{} }

// anchorAddr is the anchor's address, which names no network.
type anchorAddr struct{}

// Network implements net.Addr.
func (anchorAddr) Network() string { return "pinned-handover" }

// String implements net.Addr.
func (anchorAddr) String() string { return "handed-over connections" }

// handedConn is a connection handed over by a loop: the bytes the loop had
// read come first.
type handedConn struct {
	net.Conn
	pre []byte
}

func (h *handedConn) Read(b []byte) (int, error) {
	if len(h.pre) > 0 {
		n := copy(b, h.pre)
		h.pre = h.pre[n:]
		return n, nil
	}
	return h.Conn.Read(b)
}

// TCPConn returns the underlying TCP connection for writes (tunnels splice
// into it); reads must go through Read while bytes are pending.
func (h *handedConn) TCPConn() *net.TCPConn {
	tc, _ := h.Conn.(*net.TCPConn)
	return tc
}

// headReader parses request and response heads held in memory with
// fasthttp's parsers.
type headReader struct {
	rd bytes.Reader
	br *bufio.Reader
}

func newHeadReader(size int) *headReader {
	h := &headReader{}
	h.br = bufio.NewReaderSize(&h.rd, size)
	return h
}

func (h *headReader) reset(b []byte) *bufio.Reader {
	h.rd.Reset(b)
	h.br.Reset(&h.rd)
	return h.br
}

var _ io.Reader = (*handedConn)(nil)

// closePools closes the loops' idle connections to an endpoint the janitor
// retired (it had nothing in flight).
func (f *Front) closePools(e *endpoint) {
	for _, lp := range f.loops {
		lp.nl.Post(taskFunc(func() {
			pl := e.loopPool(lp.id)
			for pl.idle != nil {
				pl.idle.close()
			}
		}))
	}
}
