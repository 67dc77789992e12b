package proxy

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Defaults for EndpointConfig.
const (
	// DefaultDialTimeout bounds connecting to a worker.
	DefaultDialTimeout = 3 * time.Second
	// DefaultMaxConnsPerWorker caps connections to one worker session, and
	// so the requests in flight to it.
	DefaultMaxConnsPerWorker = 512
	// DefaultMaxQueuePerWorker caps requests waiting for a connection to
	// one worker once MaxConns are busy (503 overloaded beyond). Queueing,
	// as HAProxy does beyond its maxconn, keeps a crowd of clients from
	// turning into a storm of refusals that costs as much as serving: a
	// queued request costs nothing until a connection frees, and
	// QueueTimeout bounds its wait.
	DefaultMaxQueuePerWorker = 4096
	// DefaultQueueTimeout bounds that wait (503 overloaded after it).
	DefaultQueueTimeout = time.Second
	// DefaultIdleConnTimeout closes pooled worker connections idle this long.
	// It must be shorter than the worker server's own keep-alive idle
	// timeout, so that the proxy never sends on a connection the worker is
	// closing (a non-idempotent request lost that way answers 502).
	DefaultIdleConnTimeout = 10 * time.Second
	// DefaultRetryBudgetRatio: retries (re-resolves after a 503 from this
	// worker, resends after a stale connection) may add at most this
	// fraction to the requests the worker was sent.
	DefaultRetryBudgetRatio = 0.2
	// DefaultRetryBudgetBurst: retries a worker session may take beyond
	// what its requests have earned; also the most it can bank.
	DefaultRetryBudgetBurst = 10
)

// EndpointConfig configures the connection pool the proxy keeps for each
// worker session (Config.Endpoint). A zero field means its default.
type EndpointConfig struct {
	// Dial connects to a worker's host:port. Nil means a net.Dialer with
	// the given timeout (TCP, so that tunnels can splice).
	Dial func(addr string, timeout time.Duration) (net.Conn, error)
	// DialTimeout: DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxConns: DefaultMaxConnsPerWorker.
	MaxConns int
	// MaxQueue: DefaultMaxQueuePerWorker; negative means no queue.
	MaxQueue int
	// QueueTimeout: DefaultQueueTimeout.
	QueueTimeout time.Duration
	// IdleConnTimeout: DefaultIdleConnTimeout.
	IdleConnTimeout time.Duration
	// RetryBudgetRatio: DefaultRetryBudgetRatio; in (0, 1].
	RetryBudgetRatio float64
	// RetryBudgetBurst: DefaultRetryBudgetBurst; negative means none.
	RetryBudgetBurst int
}

func (c *EndpointConfig) setDefaults() error {
	defD(&c.DialTimeout, DefaultDialTimeout)
	def(&c.MaxConns, DefaultMaxConnsPerWorker)
	def(&c.MaxQueue, DefaultMaxQueuePerWorker)
	defD(&c.QueueTimeout, DefaultQueueTimeout)
	defD(&c.IdleConnTimeout, DefaultIdleConnTimeout)
	if c.RetryBudgetRatio == 0 {
		c.RetryBudgetRatio = DefaultRetryBudgetRatio
	}
	def(&c.RetryBudgetBurst, DefaultRetryBudgetBurst)
	if c.MaxQueue < 0 {
		c.MaxQueue = 0
	}
	if c.RetryBudgetBurst < 0 {
		c.RetryBudgetBurst = 0
	}
	if c.RetryBudgetRatio < 0 || c.RetryBudgetRatio > 1 {
		return fmt.Errorf("proxy: RetryBudgetRatio %v outside (0, 1]", c.RetryBudgetRatio)
	}
	if c.DialTimeout < 0 || c.MaxConns < 0 || c.QueueTimeout < 0 || c.IdleConnTimeout < 0 {
		return errors.New("proxy: EndpointConfig fields must not be negative")
	}
	if c.Dial == nil {
		c.Dial = dialTCP
	}
	return nil
}

func dialTCP(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", addr)
}

// endpoint is one worker session as the proxy sends to it: the session id
// and secret it presents, the worker's address, a connection pool of its own
// (a fasthttp.HostClient, used for its pool only: the proxy writes and reads
// the messages itself), its in-flight cap and its retry budget. The proxy
// makes one per Session on first use (Proxy.endpointFor) and attaches it to
// the Session; the janitor (Proxy.Run) retires endpoints nobody uses.
//
// An endpoint is safe for concurrent use.
type endpoint struct {
	id   string // the session id, for logs
	addr string // the worker's host:port

	secret  []byte // sent as X-Pinned-Proxy-Secret
	session []byte // sent as X-Pinned-Session
	// prefix is the path of the advertise URL without its trailing slash,
	// prepended to every request path ("" when the URL has none).
	prefix []byte

	client          *fasthttp.HostClient
	dial            func(addr string, timeout time.Duration) (net.Conn, error)
	dialTimeout     time.Duration
	queueTimeout    time.Duration
	idleConnTimeout time.Duration
	maxInflight     int64 // MaxConns + MaxQueue

	// pools are the event loops' connections to the worker, one pool per
	// loop of the proxy's Front (none without one); loopMax caps each:
	// MaxConns shared out among the loops.
	pools     []loopPool
	loopMax   int
	retryUnit int64 // tokens per retry: 1/RetryBudgetRatio requests
	retryCap  int64 // RetryBudgetBurst retries' worth of tokens

	// The counters every request to this worker touches share one cache
	// line, away from the read-mostly fields above.
	_ [64]byte
	// inflight counts requests holding or waiting for a connection;
	// retiredInflight once the janitor retired the endpoint.
	inflight atomic.Int64
	tokens   atomic.Int64 // retry budget, in units of 1/ratio requests
	// used is set by every request and cleared by each janitor sweep: an
	// endpoint still unused at the next sweep is retired.
	used    atomic.Bool
	tunnels atomic.Int64 // open tunnels routed through the endpoint
	_       [32]byte
}

// retiredInflight is the in-flight count of a retired endpoint: far below
// zero, so that an admit on it sees a count ≤ 0 however many race.
const retiredInflight = math.MinInt64 / 2

// newEndpoint makes the endpoint of s, with a connection pool for each of
// loops event loops. cfg has its defaults set. It does no I/O.
func newEndpoint(cfg *EndpointConfig, s *Session, loops int) (*endpoint, error) {
	addr, prefix, err := wire.ParseAdvertiseURL(s.AdvertiseURL)
	if err != nil {
		return nil, fmt.Errorf("proxy: session %s: %w", s.ID, err)
	}
	e := &endpoint{
		id:              s.ID,
		addr:            addr,
		secret:          []byte(s.Secret),
		session:         []byte(s.ID),
		prefix:          []byte(prefix),
		dial:            cfg.Dial,
		dialTimeout:     cfg.DialTimeout,
		queueTimeout:    cfg.QueueTimeout,
		idleConnTimeout: cfg.IdleConnTimeout,
		maxInflight:     int64(cfg.MaxConns + cfg.MaxQueue),
		retryUnit:       int64(1/cfg.RetryBudgetRatio + 0.5),
	}
	if loops > 0 {
		e.pools = make([]loopPool, loops)
		e.loopMax = max(1, (cfg.MaxConns+loops-1)/loops)
	}
	e.retryCap = int64(cfg.RetryBudgetBurst) * e.retryUnit
	e.tokens.Store(e.retryCap)
	e.used.Store(true)
	dial, dialTimeout := cfg.Dial, cfg.DialTimeout
	e.client = &fasthttp.HostClient{
		Addr: addr,
		DialTimeout: func(addr string, timeout time.Duration) (net.Conn, error) {
			if timeout <= 0 || timeout > dialTimeout {
				timeout = dialTimeout
			}
			c, err := dial(addr, timeout)
			if err != nil {
				return nil, err
			}
			return newWaitConn(c), nil
		},
		MaxConns:            cfg.MaxConns,
		MaxConnWaitTimeout:  cfg.QueueTimeout,
		MaxIdleConnDuration: cfg.IdleConnTimeout,
		// LIFO keeps the hottest connections in use and lets a surplus age
		// out; FIFO also shifts the whole idle slice on every acquire.
		ConnPoolStrategy: fasthttp.LIFO,
		// The proxy never calls Do, but if anyone does through this client
		// it must not rewrite the message.
		DisablePathNormalizing:        true,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		StreamResponseBody:            true,
		MaxIdemponentCallAttempts:     1,
	}
	return e, nil
}

// setRouteFields sets what a worker checks on every proxied request: the
// session's secret and id, and the placement's epoch (X-Pinned-Epoch; none
// when the route does not know it). first says the client's copies were
// removed and none was set yet, so adding is enough. buf is scratch for the
// epoch's digits. It does not allocate.
func setRouteFields(h *fasthttp.RequestHeader, ep *endpoint, epoch uint64, first bool, buf []byte) {
	if first {
		h.AddBytesV(wire.HeaderProxySecret, ep.secret)
		h.AddBytesV(wire.HeaderSession, ep.session)
		if epoch != 0 {
			h.AddBytesV(wire.HeaderEpoch, wire.AppendEpoch(buf[:0], epoch))
		}
		return
	}
	h.SetBytesV(wire.HeaderProxySecret, ep.secret)
	h.SetBytesV(wire.HeaderSession, ep.session)
	if epoch != 0 {
		h.SetBytesV(wire.HeaderEpoch, wire.AppendEpoch(buf[:0], epoch))
	} else {
		h.Del(wire.HeaderEpoch)
	}
}

// loopPool returns the pool of event loop i.
func (e *endpoint) loopPool(i int) *loopPool { return &e.pools[i] }

// admission is what admit decided.
type admission uint8

const (
	admitted admission = iota
	full               // over MaxConns + MaxQueue: 503 overloaded
	retired            // the janitor closed the endpoint: take a fresh one
)

// admit counts a request toward the endpoint's in-flight cap (connections
// plus queue) and says whether it may proceed. Every admitted request must
// call leave. A retired endpoint admits nothing: the janitor retires only an
// endpoint with nothing in flight, by a compare-and-swap of that count, so
// no request is ever admitted on an endpoint whose pool it closed.
func (e *endpoint) admit() admission {
	n := e.inflight.Add(1)
	if n > e.maxInflight || n <= 0 {
		e.inflight.Add(-1)
		if n <= 0 {
			return retired
		}
		return full
	}
	e.markUsed()
	return admitted
}

// markUsed tells the janitor the endpoint is in use (without writing the
// shared line when it knows already).
func (e *endpoint) markUsed() {
	if !e.used.Load() {
		e.used.Store(true)
	}
}

func (e *endpoint) leave() { e.inflight.Add(-1) }

// retire marks the endpoint retired if nothing is in flight and no tunnel
// is open, and reports whether it did.
func (e *endpoint) retire() bool {
	return e.tunnels.Load() == 0 && e.inflight.CompareAndSwap(0, retiredInflight)
}

func (e *endpoint) isRetired() bool { return e.inflight.Load() <= retiredInflight/2 }

// earn credits the retry budget with one request: a token, up to the cap.
// The check and the add race; the cap is exceeded by at most the number of
// concurrent callers.
func (e *endpoint) earn() {
	if e.tokens.Load() < e.retryCap {
		e.tokens.Add(1)
	}
}

// spend takes one retry from the budget (retryUnit tokens) and reports
// whether there was enough. A fresh endpoint starts with a full burst.
func (e *endpoint) spend() bool {
	if e.tokens.Add(-e.retryUnit) < 0 {
		e.tokens.Add(e.retryUnit)
		return false
	}
	return true
}

// waitConn is a pooled worker connection that exposes its descriptor, so
// that an exchange can write a request and wait for the response without
// the read that would find nothing yet (exchange.writeThenAwait). The
// RawConn is made once per connection: asking for it per request would
// allocate.
type waitConn struct {
	net.Conn
	raw syscall.RawConn
}

// newWaitConn wraps c when it has a descriptor (a TCP connection); other
// connections (in-memory pipes in tests) are returned as they are.
func newWaitConn(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &waitConn{Conn: c, raw: raw}
}

// pooledConn is what HostClient.AcquireConn returns: *fasthttp.clientConn, a
// type this package cannot name. It travels as this interface (a pointer in
// an interface does not allocate) and goes back to the HostClient through
// connAs, which recovers the concrete type from the method expressions'
// signatures.
type pooledConn interface {
	Conn() net.Conn
	CreatedTime() time.Time
}

func acquireConn(hc *fasthttp.HostClient) (pooledConn, error) {
	cc, err := hc.AcquireConn(0, false)
	if err != nil {
		return nil, err
	}
	return cc, nil
}

// releaseConn returns a connection whose last response was read completely.
func releaseConn(hc *fasthttp.HostClient, cc pooledConn) {
	connAs((*fasthttp.HostClient).ReleaseConn, hc, cc)
}

// closeConn closes a connection and frees its slot in the pool.
func closeConn(hc *fasthttp.HostClient, cc pooledConn) {
	connAs((*fasthttp.HostClient).CloseConn, hc, cc)
}

func connAs[C pooledConn](f func(*fasthttp.HostClient, C), hc *fasthttp.HostClient, cc pooledConn) {
	f(hc, cc.(C))
}
