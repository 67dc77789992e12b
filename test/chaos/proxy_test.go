package chaos

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ctlProxy is the harness's own TCP proxy: it adds a delay to every chunk
// (separately toward the target and back), and can cut the path (existing
// connections closed, new ones closed on accept). It sits between a worker
// and its pinboard's registry (the control path; the data path, pinboard →
// worker, does not go through it), and between each pinboard and
// redis-server (the store path).
type ctlProxy struct {
	ln     net.Listener
	target string
	up     atomic.Int64 // delay toward the target, ns
	down   atomic.Int64 // delay of the target's replies, ns
	cut    atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newCtlProxy(t testing.TB, target string) *ctlProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &ctlProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *ctlProxy) addr() string { return p.ln.Addr().String() }

// setDelay sets the one-way delay of both directions.
func (p *ctlProxy) setDelay(d time.Duration) { p.setDelays(d, d) }

// setDelays sets the delay toward the target (up) and of its replies (down).
func (p *ctlProxy) setDelays(up, down time.Duration) {
	p.up.Store(int64(up))
	p.down.Store(int64(down))
}

// setCut cuts (true) or heals (false) the path.
func (p *ctlProxy) setCut(cut bool) {
	p.cut.Store(cut)
	if cut {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

func (p *ctlProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil || p.cut.Load() {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *ctlProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *ctlProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
			if err != nil {
				return
			}
			if !p.track(up) {
				up.Close()
				return
			}
			defer p.untrack(up)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); p.pump(up, c, &p.up) }()
			go func() { defer wg.Done(); p.pump(c, up, &p.down) }()
			wg.Wait()
		}()
	}
}

type chunk struct {
	at   time.Time
	data []byte
}

// pump copies src to dst, each chunk delayed by the delay in force when it
// was read; it closes both ends when either fails.
func (p *ctlProxy) pump(dst, src net.Conn, delay *atomic.Int64) {
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() { // the writer, owned by pump
		defer close(done)
		for ch := range q {
			if d := time.Until(ch.at); d > 0 {
				time.Sleep(d) // the injected latency itself
			}
			if _, err := dst.Write(ch.data); err != nil {
				dst.Close()
				src.Close()
				for range q {
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{at: time.Now().Add(time.Duration(delay.Load())), data: append([]byte(nil), buf[:n]...)}
		}
		if err != nil {
			close(q)
			<-done
			if err != io.EOF {
				dst.Close()
			}
			src.Close()
			dst.Close()
			return
		}
	}
}

func (p *ctlProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
