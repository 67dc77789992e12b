package proxy

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Session is one worker session as the proxy reaches it. The resolver makes
// one per session and returns the same pointer for every placement on that
// session; the proxy attaches its connection pool (endpoint) to it on first
// use. Treat it as read-only once returned.
type Session struct {
	ID           string // sent as X-Pinned-Session
	Secret       string // sent as X-Pinned-Proxy-Secret
	AdvertiseURL string // http://host:port[/path]; its path prefixes every forwarded path
	// MaxBodyBytes is the largest request body the worker accepts (0: not
	// said). A request announcing a longer body gets 413 without being
	// sent; a chunked one is cut off with 413 when it passes the limit.
	MaxBodyBytes int64

	ep       atomic.Pointer[endpoint] // the proxy's; made on first use
	tooLarge atomic.Pointer[reply]    // the 413 naming MaxBodyBytes; made on first use
	leaseEnd atomic.Int64             // SetLeaseEnd's time, unix nanoseconds; 0: unknown
	recovery atomic.Int64             // SetRecovery's time, unix nanoseconds; 0: none
}

// SetRecovery records when the session's ids are expected to be served
// again if that is sooner than its lease end (the resolver sets it while it
// checks whether the session's process is gone, which takes a fraction of a
// second; the zero Time clears it). A client whose request could not reach
// the worker is told to retry then. Safe for concurrent use.
func (s *Session) SetRecovery(t time.Time) {
	if t.IsZero() {
		s.recovery.Store(0)
		return
	}
	s.recovery.Store(t.UnixNano())
}

// SetLeaseEnd records when the session's lease ends as the directory said
// when the resolver last read it (the last heartbeat's send time plus the
// lease): the earliest its ids can move to another worker. The proxy tells
// a client whose request could not reach the worker to retry then
// (Retry-After) rather than after a fixed second. Safe for concurrent use.
func (s *Session) SetLeaseEnd(t time.Time) { s.leaseEnd.Store(t.UnixNano()) }

// LeaseEndedBy reports whether the lease SetLeaseEnd recorded has ended by
// t (false when nothing was recorded). It does not allocate.
func (s *Session) LeaseEndedBy(t time.Time) bool {
	if s == nil {
		return false
	}
	n := s.leaseEnd.Load()
	return n != 0 && t.UnixNano() >= n
}

// LeaseEnd returns what SetLeaseEnd recorded (the zero Time: nothing).
func (s *Session) LeaseEnd() time.Time {
	if n := s.leaseEnd.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Route is where a placement lives: the session holding it and the
// placement's activation epoch (0 = unknown).
type Route struct {
	Session *Session
	Epoch   uint64
}

// Resolver maps a placement name to the session that holds it. The
// placement resolver (internal/pinboard/placement) implements it; tests use a static
// map (package proxytest).
type Resolver interface {
	// Lookup returns the cached route of name at now, if any, without
	// blocking, allocating or doing I/O (the event loop calls it); the
	// proxy takes a route without a session for a miss. name is
	// "/<ns>/<id>", only valid during the call.
	Lookup(name []byte, now time.Time) (Route, bool)
	// Resolve returns the route of name, reading the store and placing the
	// instance on a miss (may block, bounded). Errors wrapping ErrNoWorker
	// → 503 no_worker, others → 503 store. name is only valid during the
	// call.
	Resolve(ctx context.Context, name []byte) (Route, error)
	// Refused tells the resolver that the session of r refused the request
	// for name, or could not be reached: drop the cached route of name if it
	// is still r (compare Session pointers) and pass the session over for
	// new placements for a while. No I/O. reason says what happened: the
	// host's wire.ReasonClosing, ReasonDraining, ReasonLease or ReasonStale
	// (503; stale: the placement r names was replaced, or its instance
	// closed there and the holder will not activate another under it), or
	// wire.ReasonUnreachable (no connection, 403 forbidden from another
	// process at the address, an advertise URL the proxy cannot use).
	Refused(name []byte, r Route, reason string)
}

// TunnelWatcher may be implemented by a Resolver: the proxy calls Watch when
// a WebSocket tunnel for name opens and Unwatch when it closes (exactly once
// each, Watch first), so that the resolver can report placements of watched
// names that move (the pinboard then calls Proxy.CloseTunnels).
type TunnelWatcher interface {
	Watch(name string)
	Unwatch(name string)
}

// ErrNoWorker is what a Resolver wraps when no live, undrained worker serves
// the namespace; the proxy answers 503 no_worker with Retry-After. Start a
// worker for the namespace, or wait for one to register.
var ErrNoWorker = errors.New("proxy: no worker serves the namespace")

// ErrUnknownNamespace is what a Resolver wraps when no worker has served
// the namespace recently (a typo, a namespace that never existed or was
// retired): the proxy answers 404 unknown_namespace, without Retry-After,
// so that clients stop asking. A namespace whose workers went away a moment
// ago is ErrNoWorker instead.
var ErrUnknownNamespace = errors.New("proxy: no worker has served the namespace recently")

// ErrNotReady, wrapped in an error of Resolver.Resolve, says the resolver
// cannot answer yet because it is still starting (its directory's first
// connection is being made). The request gets 503 store + Retry-After like
// any other resolver failure, but nothing has failed yet: the proxy logs it
// at DEBUG, never as a warning.
var ErrNotReady = errors.New("proxy: resolver not ready yet")

// Recorder hears of every request the proxy routed, on the request's path:
// it must be fast, safe for concurrent use, and must not allocate or block.
// name is the placement name "/<ns>/<id>" (valid only during the call),
// holder the worker session it went to ("" when none was reached), status
// the client's status and reason its X-Pinned-Reason (a wire constant or
// ""), bytes the request and response bodies as far as known, latency from
// receiving the request to its answer's head, at the request's time.
type Recorder interface {
	Record(name []byte, holder string, status int, reason string, bytes int64, latency time.Duration, at time.Time)
}
