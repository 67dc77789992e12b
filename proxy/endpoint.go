package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Resolver maps a placement name to the worker endpoint that holds it. The
// placement cache implements it; tests use a static map (package proxytest).
type Resolver interface {
	// Resolve returns the endpoint holding the placement name "/<ns>/<id>",
	// placing the instance if needed. name is a sub-slice of the raw request
	// path: valid only during the call, never to be retained or modified.
	// On a cache hit Resolve must not allocate and must not block. Errors
	// wrapping ErrNoWorker become 503 no_worker, every other error 503 store;
	// both carry Retry-After.
	Resolve(ctx context.Context, name []byte) (*Endpoint, error)
	// Invalidate drops the cached placement of name if it still points at
	// ep: the worker answered 503 closing, draining or lease for it, could
	// not be reached, or ep was closed. The next Resolve must consult the
	// store. Invalidate is called on the request's goroutine: no I/O.
	Invalidate(name []byte, ep *Endpoint)
}

// TunnelObserver may be implemented by a Resolver that closes tunnels when
// their placement moves (Endpoint.CloseTunnelsFor). Both calls run on the
// tunnel's goroutine and must not block; each tunnel gets exactly one of
// each, Opened first.
type TunnelObserver interface {
	// TunnelOpened is called once a tunnel for the placement name to ep is
	// open and registered on ep (CloseTunnelsFor reaches it), before any
	// byte is relayed. A placement that moved between its resolve and this
	// call is caught only if the observer checks it now.
	TunnelOpened(name string, ep *Endpoint)
	// TunnelClosed is called when the tunnel has ended.
	TunnelClosed(name string, ep *Endpoint)
}

// ErrNoWorker is what a Resolver wraps when no live, undrained worker serves
// the namespace; the proxy answers 503 no_worker with Retry-After. Start a
// worker for the namespace, or wait for one to register.
var ErrNoWorker = errors.New("proxy: no worker serves the namespace")

// Defaults for EndpointConfig.
const (
	// DefaultDialTimeout bounds connecting to a worker.
	DefaultDialTimeout = 3 * time.Second
	// DefaultMaxConnsPerWorker caps connections to one worker session, and
	// so the requests in flight to it.
	DefaultMaxConnsPerWorker = 512
	// DefaultMaxQueuePerWorker caps requests waiting for a connection to
	// one worker once MaxConns are busy (503 overloaded beyond).
	DefaultMaxQueuePerWorker = 512
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
	// DefaultRetryBudgetBurst: retries a worker endpoint may take beyond
	// what its requests have earned; also the most it can bank.
	DefaultRetryBudgetBurst = 10
)

// EndpointConfig configures the connection pool of each worker endpoint. A
// zero field means its default.
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

// Endpoint is one worker session as the proxy sends to it: the session id
// and secret it presents, the worker's address, and a connection pool of its
// own (a fasthttp.HostClient, used for its pool only: the proxy writes and
// reads the messages itself). Endpoints are made by NewEndpoint, shared by
// every placement on the session, and closed by whoever made them once the
// session is gone.
//
// An Endpoint is safe for concurrent use.
type Endpoint struct {
	// Session is the worker session id, sent as X-Pinned-Session.
	Session string
	// Addr is the worker's host:port.
	Addr string

	secret  []byte // sent as X-Pinned-Proxy-Secret
	session []byte
	// prefix is the path of the advertise URL without its trailing slash,
	// prepended to every request path ("" when the URL has none).
	prefix []byte

	client       *fasthttp.HostClient
	dial         func(addr string, timeout time.Duration) (net.Conn, error)
	dialTimeout  time.Duration
	queueTimeout time.Duration
	maxInflight  int64 // MaxConns + MaxQueue
	retryUnit    int64 // tokens per retry: 1/RetryBudgetRatio requests
	retryCap     int64 // RetryBudgetBurst retries' worth of tokens

	// The counters every request to this worker touches share one cache
	// line, away from the read-mostly fields above.
	_        [64]byte
	inflight atomic.Int64 // requests holding or waiting for a connection
	tokens   atomic.Int64 // retry budget, in units of 1/ratio requests
	_        [48]byte

	// closed is set by Close; requests resolved to a closed endpoint are
	// re-resolved.
	closed atomic.Bool

	tunnelsMu sync.Mutex
	tunnels   map[*tunnel]struct{}
}

// NewEndpoint makes the endpoint of a worker session. advertiseURL is the
// worker's advertise URL (http only); its path, if any, prefixes every
// forwarded path. NewEndpoint does no I/O.
func NewEndpoint(cfg EndpointConfig, session, secret, advertiseURL string) (*Endpoint, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	u, err := url.Parse(advertiseURL)
	if err != nil {
		return nil, fmt.Errorf("proxy: bad advertise URL %q: %w", advertiseURL, err)
	}
	if u.Scheme != "http" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("proxy: advertise URL %q must be http://host:port[/path]", advertiseURL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	prefix := u.EscapedPath()
	for len(prefix) > 0 && prefix[len(prefix)-1] == '/' {
		prefix = prefix[:len(prefix)-1]
	}
	e := &Endpoint{
		Session:      session,
		Addr:         addr,
		secret:       []byte(secret),
		session:      []byte(session),
		prefix:       []byte(prefix),
		dial:         cfg.Dial,
		dialTimeout:  cfg.DialTimeout,
		queueTimeout: cfg.QueueTimeout,
		maxInflight:  int64(cfg.MaxConns + cfg.MaxQueue),
		retryUnit:    int64(1/cfg.RetryBudgetRatio + 0.5),
	}
	e.retryCap = int64(cfg.RetryBudgetBurst) * e.retryUnit
	e.tokens.Store(e.retryCap)
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

// Close closes the endpoint's WebSocket tunnels and idle connections, and
// refuses new tunnels; requests in flight finish. Call it when the session's
// placements are lost. Close is idempotent.
func (e *Endpoint) Close() {
	e.tunnelsMu.Lock()
	e.closed.Store(true)
	ts := make([]*tunnel, 0, len(e.tunnels))
	for t := range e.tunnels {
		ts = append(ts, t)
	}
	e.tunnelsMu.Unlock()
	for _, t := range ts {
		t.close()
	}
	e.client.CloseIdleConnections()
}

// CloseTunnels closes every open WebSocket tunnel to the endpoint; new
// tunnels are still accepted.
func (e *Endpoint) CloseTunnels() { e.closeTunnels(nil) }

// CloseTunnelsFor closes the endpoint's open WebSocket tunnels of one
// placement name ("/<ns>/<id>"): call it when that placement leaves the
// endpoint's session, so that no client keeps talking to an instance that
// is no longer the placed one.
func (e *Endpoint) CloseTunnelsFor(name []byte) { e.closeTunnels(name) }

func (e *Endpoint) closeTunnels(name []byte) {
	e.tunnelsMu.Lock()
	ts := make([]*tunnel, 0, len(e.tunnels))
	for t := range e.tunnels {
		if name == nil || t.name == string(name) {
			ts = append(ts, t)
		}
	}
	e.tunnelsMu.Unlock()
	for _, t := range ts {
		t.close()
	}
}

// Tunnels returns the number of open tunnels to the endpoint.
func (e *Endpoint) Tunnels() int {
	e.tunnelsMu.Lock()
	defer e.tunnelsMu.Unlock()
	return len(e.tunnels)
}

func (e *Endpoint) addTunnel(t *tunnel) bool {
	e.tunnelsMu.Lock()
	defer e.tunnelsMu.Unlock()
	if e.closed.Load() {
		return false
	}
	if e.tunnels == nil {
		e.tunnels = make(map[*tunnel]struct{})
	}
	e.tunnels[t] = struct{}{}
	return true
}

func (e *Endpoint) removeTunnel(t *tunnel) {
	e.tunnelsMu.Lock()
	delete(e.tunnels, t)
	e.tunnelsMu.Unlock()
}

// admit counts a request toward the endpoint's in-flight cap (connections
// plus queue) and reports whether it may proceed. Every admitted request
// must call leave.
func (e *Endpoint) admit() bool {
	if e.inflight.Add(1) > e.maxInflight {
		e.inflight.Add(-1)
		return false
	}
	return true
}

func (e *Endpoint) leave() { e.inflight.Add(-1) }

// Inflight returns the requests holding or waiting for a connection to the
// endpoint.
func (e *Endpoint) Inflight() int { return int(e.inflight.Load()) }

// earn credits the retry budget with one request: a token, up to the cap.
// The check and the add race; the cap is exceeded by at most the number of
// concurrent callers.
func (e *Endpoint) earn() {
	if e.tokens.Load() < e.retryCap {
		e.tokens.Add(1)
	}
}

// spend takes one retry from the budget (retryUnit tokens) and reports
// whether there was enough. A fresh endpoint starts with a full burst.
func (e *Endpoint) spend() bool {
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
