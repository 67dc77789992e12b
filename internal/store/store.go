// Package store is the pinboard's shared directory: worker sessions,
// control-message queues and placements. Store is implemented twice, on Redis
// (redisstore, via rueidis) and in memory (memstore, for `pinboard -dev` and
// unit tests); one conformance suite (storetest) runs against both.
//
// # Semantics every implementation guarantees
//
//   - A session lives exactly as long as its lease: Register and a successful
//     Heartbeat set its expiry to now + lease on the store's clock; after that
//     it is gone (ErrUnknownSession) and nothing re-creates it except a new
//     Register, which mints a new session id.
//   - Heartbeat is owner-checked: it refreshes an existing, non-superseded
//     session and nothing else. It never re-creates an expired record.
//   - Register makes the new session current for its clientId and its
//     advertise URL; any other live session holding either becomes
//     superseded. A superseded session keeps its record (and its placements)
//     until its lease runs out, so its ids are not re-placed while the old
//     process may still serve them, but its heartbeats get ErrSuperseded.
//   - Messages pushed for a client are delivered exactly once, all together,
//     by the next successful Heartbeat of that client's current session.
//   - Placements: Claim is SET NX (first claim wins, the loser learns the
//     winner); Replace is compare-and-set from a given session; Release is
//     compare-and-delete on a given session. A placement is never written
//     without one of these checks.
//   - Deregister ends a session at once: afterwards it is unknown to every
//     read, exactly as if its lease had run out (so the proxy re-places its
//     ids on demand and the janitor collects its placements after its
//     grace); it deletes the client and advertise-URL pointers only while
//     they still name it, and never touches another session.
//   - UseNonce is SET NX with a TTL: of any number of concurrent calls with
//     one key, exactly one reports first use until the TTL runs out.
//   - ReserveSlot counts, per deployment token, the sessions registered
//     with it that are still live (refreshed by their heartbeats, dropped
//     by Deregister and by expiry) and admits a new one only below a cap,
//     atomically: concurrent reservations never exceed it.
//   - Invalidations: after any change to a placement or a session that a
//     reader may have cached (claim, replace, release, register, heartbeat,
//     expiry), the store calls Options.OnInvalidate, possibly after a delay
//     (Redis delivers it asynchronously) and possibly spuriously. A call with
//     Invalidation.All means "anything may have changed" (connection loss,
//     FLUSHALL). Readers must not cache past the lease without an
//     invalidation path.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/pinned-go/pinned/internal/wire"
)

// Sentinel errors.
var (
	// ErrUnknownSession: the session does not exist (never did, or its lease
	// ran out). The worker must register again.
	ErrUnknownSession = errors.New("store: unknown session")
	// ErrSuperseded: a newer registration for the same clientId or advertise
	// URL took over; the worker must stop.
	ErrSuperseded = errors.New("store: session superseded")
	// ErrClosed: the store was closed; create a new one.
	ErrClosed = errors.New("store: closed")
	// ErrUnavailable: the store cannot reach its backend (Redis down, not
	// yet connected). It is temporary: retry later, and check Ping.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrConnecting is wrapped together with ErrUnavailable while the store
	// is still making its first attempt to reach its backend: not a failure
	// yet, so callers report it quietly (the janitor logs no error for it).
	ErrConnecting = errors.New("store: connecting")
)

// Session is one worker registration. Times are unix milliseconds on the
// store's clock.
type Session struct {
	ID            string
	ClientID      string
	Secret        string
	AdvertiseURL  string
	Namespaces    []string
	Headroom      int
	Draining      bool
	DrainDeadline int64 // 0 = none
	Verified      bool
	Superseded    bool
	RegisteredAt  int64
	LastHeartbeat int64
	ExpiresAt     int64
	// TokenID identifies the deployment token the session registered with
	// (a fingerprint, never the token); "" when unknown. Heartbeats keep
	// the session's slot under this token (ReserveSlot) alive.
	TokenID string
	// MaxBodyBytes is the largest request body the worker accepts, as it
	// said when registering (wire.RegisterRequest.MaxBodyBytes); 0 when it
	// said nothing. The proxy refuses a larger body with 413 before
	// forwarding it. Fixed for the session's life.
	MaxBodyBytes int64
}

// Serves reports whether the session serves namespace ns.
func (s *Session) Serves(ns string) bool {
	for _, n := range s.Namespaces {
		if n == ns {
			return true
		}
	}
	return false
}

// Update is what a heartbeat changes on a session.
type Update struct {
	Headroom      int
	Draining      bool
	DrainDeadline int64 // unix ms, 0 = none
	// Verified is true when this heartbeat's challenge pair was verified.
	// A session once verified stays verified; a pairless heartbeat does not
	// clear it.
	Verified bool
}

// Invalidation names what may have changed. Exactly one of its fields is set.
type Invalidation struct {
	// All: anything may have changed (connection loss, FLUSHALL, restart).
	All bool
	// Placement is a placement name "<namespace>/<id>" (wire.PlacementName).
	Placement string
	// Session is a session id whose record changed or expired.
	Session string
}

// Options configure a store.
type Options struct {
	// OnInvalidate is called when cached placements or sessions may be stale.
	// It must be fast and must not call back into the store: on Redis it runs
	// on a connection's read goroutine. Nil means nobody caches.
	OnInvalidate func(Invalidation)
}

// CachedPlacements is implemented by a Store whose Placement may be answered
// from a client-side cache (redisstore: rueidis DoCache). PlacementUntil is
// Placement plus the wall-clock time at which that cache stops serving the
// value without asking the server again (zero: it came from no such cache).
// A layer that caches the value on top must not keep it past until: else a
// value the server last confirmed almost a cache lifetime ago would be kept
// for a whole lifetime more, and a lost invalidation would outlive the
// bound both caches promise.
type CachedPlacements interface {
	PlacementUntil(ctx context.Context, ns, id string) (holder string, until time.Time, err error)
}

// Store is the directory. All methods are safe for concurrent use and honour
// ctx cancellation.
type Store interface {
	// Register stores s (ID, ClientID, Secret, AdvertiseURL, Namespaces,
	// Headroom, Draining, Verified, TokenID, MaxBodyBytes) as a new live session with the given
	// lease, makes it current for its client and advertise URL, and marks
	// any other live session holding either as superseded. It returns the
	// ids of the sessions it superseded.
	Register(ctx context.Context, s Session, lease time.Duration) (superseded []string, err error)
	// Heartbeat applies u to the live session id, extends its lease, and
	// takes every message queued for its client. It returns the updated
	// session. ErrUnknownSession or ErrSuperseded when it may not.
	Heartbeat(ctx context.Context, id string, u Update, lease time.Duration) (Session, []wire.Message, error)
	// Session returns a live session (superseded ones included, flagged).
	Session(ctx context.Context, id string) (Session, error)
	// Sessions returns every live session.
	Sessions(ctx context.Context) ([]Session, error)
	// NamespaceSessions returns the live sessions serving ns.
	NamespaceSessions(ctx context.Context, ns string) ([]Session, error)
	// CurrentSession returns the current session id of a client, or "".
	CurrentSession(ctx context.Context, clientID string) (string, error)
	// Push queues m for the client's next heartbeat ack.
	Push(ctx context.Context, clientID string, m wire.Message) error
	// Deregister ends the live session id at once (see the package doc)
	// and reports whether it was live. Superseded sessions can be
	// deregistered too.
	Deregister(ctx context.Context, id string) (bool, error)

	// UseNonce records nonceID (wire.NonceID) as used for ttl, with binding
	// ("<kind>:<tokenId>:<url or session>", kept for operators), and reports
	// whether this was its first use. A second use within ttl reports false.
	UseNonce(ctx context.Context, nonceID, binding string, ttl time.Duration) (bool, error)
	// ReserveSlot admits sessionID among the live sessions of tokenID when
	// fewer than max hold a slot (or when it already holds one), for lease;
	// Heartbeat of a session whose TokenID is tokenID keeps the slot, and
	// Deregister or expiry frees it. It returns how many slots are held
	// afterwards (before, when refused) and whether sessionID holds one.
	ReserveSlot(ctx context.Context, tokenID, sessionID string, max int, lease time.Duration) (held int, ok bool, err error)

	// Placement returns the session id holding (ns, id), or "" for none.
	Placement(ctx context.Context, ns, id string) (string, error)
	// Claim sets (ns, id) -> sessionID if no placement exists, and returns
	// the session id that holds it afterwards (sessionID when the claim won).
	Claim(ctx context.Context, ns, id, sessionID string) (string, error)
	// Replace sets (ns, id) -> sessionID only if it is currently held by
	// old, and returns the holder afterwards.
	Replace(ctx context.Context, ns, id, old, sessionID string) (string, error)
	// Release deletes (ns, id) only if it is held by sessionID, and reports
	// whether it did.
	Release(ctx context.Context, ns, id, sessionID string) (bool, error)
	// PlacementCounts returns the number of placements per namespace that a
	// session has claimed and not released (an approximation maintained by
	// Claim/Replace/Release; it never drives placement decisions).
	PlacementCounts(ctx context.Context, sessionID string) (map[string]int, error)

	// Ping reports whether the store is reachable.
	Ping(ctx context.Context) error
	// Close releases the store's resources; it is idempotent.
	Close()
}

// Reaper is implemented by stores whose expired sessions leave state behind
// (their placements and placement index): both memstore and redisstore. It is
// separate from Store so that fakes of Store need not implement it. The
// registry's janitor calls Reap periodically.
type Reaper interface {
	// Reap collects every session whose lease ran out at least grace ago:
	// it compare-and-deletes each placement the session still holds (a
	// placement replaced meanwhile is left alone), drops the session's index
	// and its namespace memberships. Reap is idempotent and safe to run
	// concurrently from several pinboards. Placements of a dead session are
	// also replaced on demand by the proxy (Replace); Reap only keeps the
	// directory from growing.
	Reap(ctx context.Context, grace time.Duration) (ReapStats, error)
}

// ReapStats says what one Reap call removed.
type ReapStats struct {
	Sessions   int // sessions collected
	Placements int // placements deleted
}
