// Package tcpfwd is the tests' TCP forwarder on 127.0.0.1: it sits between
// a client and a server (a worker and its pinboard's registry, a pinboard
// and redis-server) and breaks the path on demand, the way networks break:
//
//   - Delay: every chunk read is written Delay later, separately toward the
//     target (up) and back (down); order is kept.
//   - Cut: every open connection is closed (the peers see FIN or RST) and
//     new ones are closed on accept, until the cut heals.
//   - Stall: the path goes silent without telling anyone: connections stay
//     open, new ones are accepted and dialled through, but no byte moves in
//     a stalled direction (Held counts the bytes waiting) and no close
//     passes either (a peer's FIN waits behind its bytes), until the stall
//     heals and everything held is delivered in order, as TCP would after a
//     partition that dropped every segment without resetting anything.
//   - Retarget: new connections go to another target (existing ones keep
//     theirs unless dropped), as a load balancer turning away from a sick
//     backend.
//   - HoldRequests: a connection whose bytes toward the target carry a
//     marker (a request line, say "POST /registry/release") goes silent
//     toward the target from that chunk on, until Deliver: the request is
//     delivered late, after its sender gave up on it; other connections
//     pass. The marker is matched within one chunk read (a request line
//     arrives whole in practice).
//
// Test chaos (the store-path and control-path nemeses) and test/e2e (a
// pinboard whose Redis link goes silent) share it.
//
// Invariants: bytes of one connection and direction are written in the
// order read, each exactly once, unless the connection is cut or the
// forwarder closed; a stall never closes or resets a connection; every
// goroutine the forwarder starts ends by Close, which waits for them.
package tcpfwd

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Direction is a side of the path.
type Direction int

// The two directions.
const (
	Up   Direction = iota // client → target
	Down                  // target → client
)

// DialTimeout bounds the dial of the target for each accepted connection.
const DialTimeout = 2 * time.Second

// queueChunks bounds the chunks read but not yet written per connection and
// direction; a full queue stops reading (back pressure, as TCP's window).
const queueChunks = 256

// Forwarder is one listening forwarder. Its methods are safe for
// concurrent use.
type Forwarder struct {
	ln     net.Listener
	target atomic.Pointer[string]
	delay  [2]atomic.Int64 // ns, per Direction
	held   [2]atomic.Int64 // bytes read and not yet written, per Direction
	cut    atomic.Bool
	marker atomic.Pointer[[]byte] // HoldRequests; nil: none

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // nil once closed
	gates  [2]chan struct{}      // per Direction: closed = pass, open = stalled
	holds  []chan struct{}       // connections held by HoldRequests, open until Deliver
	killed chan struct{}         // closed (and replaced) by every cut
	done   chan struct{}         // closed by Close
	wg     sync.WaitGroup
}

// New listens on a free 127.0.0.1 port and forwards to target.
func New(target string) (*Forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &Forwarder{ln: ln, conns: map[net.Conn]struct{}{}, killed: make(chan struct{}), done: make(chan struct{})}
	f.target.Store(&target)
	for d := range f.gates {
		f.gates[d] = make(chan struct{})
		close(f.gates[d])
	}
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Start is New for a test: it fails tb on error and closes the forwarder
// when the test ends.
func Start(tb testing.TB, target string) *Forwarder {
	tb.Helper()
	f, err := New(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(f.Close)
	return f
}

// Addr is the forwarder's host:port.
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// SetDelay sets the one-way delay of both directions.
func (f *Forwarder) SetDelay(d time.Duration) { f.SetDelays(d, d) }

// SetDelays sets the delay toward the target (up) and of its replies (down).
// It applies to chunks read from then on.
func (f *Forwarder) SetDelays(up, down time.Duration) {
	f.delay[Up].Store(int64(up))
	f.delay[Down].Store(int64(down))
}

// SetCut cuts (true: every connection closed, new ones refused) or heals
// (false) the path.
func (f *Forwarder) SetCut(cut bool) {
	f.cut.Store(cut)
	if cut {
		f.dropAll()
	}
}

// Stall silences (true) or resumes (false) each direction; see the package
// doc. Resuming delivers what was held.
func (f *Forwarder) Stall(up, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for d, on := range [2]bool{up, down} {
		g := f.gates[d]
		select {
		case <-g: // passing
			if on {
				f.gates[d] = make(chan struct{})
			}
		default: // stalled
			if !on {
				close(g)
			}
		}
	}
}

// Held returns the bytes read and not yet delivered (held by a stall, or
// by a delay), in each direction.
func (f *Forwarder) Held() (up, down int64) { return f.held[Up].Load(), f.held[Down].Load() }

// HoldRequests holds, from now on, every connection whose bytes toward the
// target carry marker (see the package doc) until Deliver.
func (f *Forwarder) HoldRequests(marker string) {
	m := []byte(marker)
	f.marker.Store(&m)
}

// Deliver ends HoldRequests: the held connections pass what they held, in
// order.
func (f *Forwarder) Deliver() {
	f.marker.Store(nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.holds {
		close(g)
	}
	f.holds = nil
}

// hold returns a new gate for a connection HoldRequests caught.
func (f *Forwarder) hold() chan struct{} {
	g := make(chan struct{})
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds = append(f.holds, g)
	return g
}

// Retarget sends the connections accepted from now on to target; with drop,
// the open ones are closed as by a cut (their clients reconnect, to the new
// target).
func (f *Forwarder) Retarget(target string, drop bool) {
	f.target.Store(&target)
	if drop {
		f.dropAll()
	}
}

// Target is where new connections go.
func (f *Forwarder) Target() string { return *f.target.Load() }

// dropAll closes every open connection and releases the writers a stall
// holds for them.
func (f *Forwarder) dropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
	close(f.killed)
	f.killed = make(chan struct{})
}

// track registers c; it refuses (false) when the path is cut or the
// forwarder closed. It returns the cut signal c belongs to.
func (f *Forwarder) track(c net.Conn) (<-chan struct{}, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil || f.cut.Load() {
		return nil, false
	}
	f.conns[c] = struct{}{}
	return f.killed, true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	if f.conns != nil {
		delete(f.conns, c)
	}
	f.mu.Unlock()
	c.Close()
}

func (f *Forwarder) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		killed, ok := f.track(c)
		if !ok {
			c.Close()
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer f.untrack(c)
			up, err := net.DialTimeout("tcp", f.Target(), DialTimeout)
			if err != nil {
				return
			}
			if _, ok := f.track(up); !ok {
				up.Close()
				return
			}
			defer f.untrack(up)
			var wg sync.WaitGroup
			wg.Go(func() { f.pump(up, c, Up, killed) })
			wg.Go(func() { f.pump(c, up, Down, killed) })
			wg.Wait()
		}()
	}
}

type chunk struct {
	at   time.Time
	data []byte
	end  error         // set on the last chunk: the source ended (io.EOF: a FIN)
	hold chan struct{} // HoldRequests caught this chunk: wait for it to close
}

// pump copies src to dst in direction d: each chunk waits for its delay and
// for the direction's gate. A source that ends passes its end on after the
// bytes read before it, through the same gate (a stalled path passes no
// FIN): a FIN half-closes dst, an error closes both.
func (f *Forwarder) pump(dst, src net.Conn, d Direction, killed <-chan struct{}) {
	q := make(chan chunk, queueChunks)
	done := make(chan struct{})
	go func() { // the writer, owned by pump
		defer close(done)
		ok := true
		for ch := range q {
			if wait := time.Until(ch.at); wait > 0 && ok {
				time.Sleep(wait) // the injected latency itself
			}
			ok = ok && f.pass(d, killed) && f.wait(ch.hold, killed)
			f.held[d].Add(-int64(len(ch.data)))
			switch {
			case !ok: // dropped: discard the rest
			case ch.end == io.EOF:
				if tc, isTCP := dst.(*net.TCPConn); isTCP {
					tc.CloseWrite()
				} else {
					dst.Close()
				}
			case ch.end != nil:
				ok = false
			default:
				_, err := dst.Write(ch.data)
				ok = err == nil
			}
			if !ok { // abort both ends; the reader then ends too
				dst.Close()
				src.Close()
			}
		}
	}()
	buf := make([]byte, 32<<10)
	var caught chan struct{} // the HoldRequests gate of this connection; the chunks after the first wait behind it
	for {
		n, err := src.Read(buf)
		at := time.Now().Add(time.Duration(f.delay[d].Load()))
		if n > 0 {
			f.held[d].Add(int64(n))
			ch := chunk{at: at, data: append([]byte(nil), buf[:n]...)}
			if m := f.marker.Load(); d == Up && m != nil && !waiting(caught) && bytes.Contains(ch.data, *m) {
				caught = f.hold()
				ch.hold = caught
			}
			q <- ch
		}
		if err != nil {
			q <- chunk{at: at, end: err}
			close(q)
			<-done
			return
		}
	}
}

// pass waits until direction d is not stalled; false when the connection
// was cut or the forwarder closed meanwhile.
func (f *Forwarder) pass(d Direction, killed <-chan struct{}) bool {
	f.mu.Lock()
	g := f.gates[d]
	f.mu.Unlock()
	select {
	case <-g:
		return true
	case <-killed:
		return false
	case <-f.done:
		return false
	}
}

// waiting reports whether a HoldRequests gate (nil: none) is still shut.
func waiting(hold chan struct{}) bool {
	if hold == nil {
		return false
	}
	select {
	case <-hold:
		return false
	default:
		return true
	}
}

// wait waits for a HoldRequests gate (nil: none); false when the
// connection was cut or the forwarder closed meanwhile.
func (f *Forwarder) wait(hold chan struct{}, killed <-chan struct{}) bool {
	if hold == nil {
		return true
	}
	select {
	case <-hold:
		return true
	case <-killed:
		return false
	case <-f.done:
		return false
	}
}

// Close stops the forwarder: the listener and every connection are closed,
// and it waits for its goroutines.
func (f *Forwarder) Close() {
	f.mu.Lock()
	if f.conns == nil {
		f.mu.Unlock()
		return
	}
	f.ln.Close()
	close(f.done)
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}
