// Package store is the pinboard's shared directory: worker sessions,
// control-message queues, placements and (Alarms, optional) durable alarms. Store is implemented twice, on Redis
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
//     winner); LookupOrClaim is a read and, when there is no placement, a
//     Claim, atomically on a single node; Replace is compare-and-set from a
//     given session; Release is compare-and-delete on a given session. A
//     placement is never written without one of these checks.
//   - Epochs: every placement carries an epoch, allocated by the Claim or
//     Replace that wrote it with wire.NextEpoch from the id's last epoch and
//     the store's clock, so it is strictly greater than the epoch of every
//     earlier placement of that (namespace, id), whoever held it and however
//     it ended (release, reap, replace). The store remembers an id's last
//     epoch for at least its epoch TTL (DefaultEpochTTL unless configured)
//     after the placement it belongs to was written or released; past that
//     (and after a Redis restart without persistence, which forgets it) the
//     time floor of wire.NextEpoch keeps epochs increasing as long as the
//     store's clock did not step back by more than the time since the last
//     allocation. A lost claim or replace allocates nothing and answers the
//     placement that won, epoch included.
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
//   - Reads of placements and sessions (Lookup, Placement, Session,
//     NamespaceSessions) may come from a client-side cache that such an
//     invalidation refreshes: right after a write, until its invalidation
//     was processed, a read may still return the value before it. Writers
//     take the outcome of their own write from its reply (Claim,
//     LookupOrClaim, Replace return the placement afterwards), never from a
//     read.
package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
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
	// yet, so callers report it quietly (IsConnecting).
	ErrConnecting = errors.New("store: connecting")
	// ErrBadCursor: a listing cursor that this store did not hand out, or
	// whose listing expired (ListingTTL after its last page). Start again.
	ErrBadCursor = errors.New("store: invalid or expired listing cursor")
)

// IsConnecting reports whether err says the store is still making its
// first attempt to reach its backend (it wraps ErrConnecting). Such a call
// failed like any other while the store is unavailable (answer 503, retry),
// but nothing has gone wrong yet: every caller logs it at DEBUG, never as a
// warning or an error, so a healthy start logs no error.
func IsConnecting(err error) bool { return errors.Is(err, ErrConnecting) }

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

// DefaultEpochTTL is how long a store keeps an id's last epoch after the
// placement it belongs to was written or released, by default: a day. Past
// it, only the time floor of wire.NextEpoch orders epochs.
const DefaultEpochTTL = 24 * time.Hour

// Placement is where (namespace, id) is placed.
type Placement struct {
	// Session is the session id holding the placement; "" for none (then
	// the other fields are zero).
	Session string
	// Epoch is the activation epoch of the placement: strictly greater than
	// that of every earlier placement of the same (namespace, id).
	Epoch uint64
	// Since is when the placement was written, on the store's clock (to the
	// millisecond).
	Since time.Time
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

// CachedLookups is CachedPlacements for the whole placement: LookupUntil is
// Lookup plus the wall-clock time at which the cache behind the answer stops
// serving it (zero: no such cache). The same rule applies: a layer caching
// the value on top must not keep it past until.
type CachedLookups interface {
	LookupUntil(ctx context.Context, ns, id string) (p Placement, until time.Time, err error)
}

// FreshLookups is implemented by a Store whose Lookup may be answered from
// a client-side cache: LookupFresh is Lookup asked of the server itself,
// past that cache and without changing it or what the server tracks for it.
// Its answer is confirmed by the server now, so a layer caching it on top
// may keep it for its whole own lifetime from now. The placement resolver
// refreshes hot placements with it before they expire (a key the
// client-side cache holds is tracked, so a change of it still reaches
// OnInvalidate).
type FreshLookups interface {
	LookupFresh(ctx context.Context, ns, id string) (Placement, error)
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
	// NamespaceKnown reports whether a session registered for ns is live,
	// or ended but not collected yet (Reap's grace): whether ns was served
	// recently. The proxy answers a namespace that no live session serves
	// 503 no_worker when it is known (its workers may come back) and 404
	// unknown_namespace otherwise.
	NamespaceKnown(ctx context.Context, ns string) (bool, error)
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

	// Lookup returns the placement of (ns, id): its holder, epoch and
	// since; the zero Placement for none.
	Lookup(ctx context.Context, ns, id string) (Placement, error)
	// ClaimPlacement places (ns, id) on sessionID under a new epoch if no
	// placement exists, and returns the placement that holds afterwards:
	// the new one when the claim won, the winner's otherwise.
	ClaimPlacement(ctx context.Context, ns, id, sessionID string) (Placement, error)
	// LookupOrClaim is Lookup and, when there is no placement,
	// ClaimPlacement for sessionID, as one step: it returns the placement
	// afterwards and whether this call wrote it (claimed: a new epoch).
	// It never writes over an existing placement. A reader that caches the
	// answer is told of later changes like after Lookup (OnInvalidate); on
	// Redis, one round trip on a single node, and the caller is not told of
	// its own claim.
	LookupOrClaim(ctx context.Context, ns, id, sessionID string) (p Placement, claimed bool, err error)
	// ReplacePlacement places (ns, id) on sessionID under a new epoch only
	// if it is currently held by old, and returns the placement afterwards
	// (the zero Placement when there is none).
	ReplacePlacement(ctx context.Context, ns, id, old, sessionID string) (Placement, error)
	// RenewPlacement gives the placement of (ns, id) a new epoch, on the same
	// session, only if it is currently held by sessionID under epoch, and
	// returns the placement afterwards (the zero Placement when there is
	// none). The placement resolver calls it when the holder refused a
	// route of that very placement as stale: the holder no longer has an
	// instance under epoch and will not bring one up (its instance closed
	// but the release did not take effect), so only a new epoch lets it
	// activate one. The session stays the same, so no other worker can come
	// to hold the id meanwhile.
	RenewPlacement(ctx context.Context, ns, id, sessionID string, epoch uint64) (Placement, error)
	// Placement is Lookup's session: the holder of (ns, id), or "".
	Placement(ctx context.Context, ns, id string) (string, error)
	// Claim is ClaimPlacement's session: the holder afterwards.
	Claim(ctx context.Context, ns, id, sessionID string) (string, error)
	// Replace is ReplacePlacement's session: the holder afterwards.
	Replace(ctx context.Context, ns, id, old, sessionID string) (string, error)
	// Release deletes (ns, id) only if it is held by sessionID and, when
	// epoch is not 0, under that epoch; it reports whether it did. A worker
	// releases with the epoch of the instance that closed, so that a release
	// arriving late never deletes a newer placement of the id on the same
	// session (RenewPlacement).
	Release(ctx context.Context, ns, id, sessionID string, epoch uint64) (bool, error)
	// PlacementCounts returns the number of placements in each of
	// namespaces that a session has claimed and not released: an entry for
	// each namespace the session's index counts (none for an unknown or
	// collected session). The counts are an approximation maintained by
	// Claim/Replace/Release; they never drive placement decisions. Its cost
	// does not grow with the session's placements: a worker holding a
	// million ids is read as cheaply as one holding none (the registry's
	// worker list reads it for every session).
	PlacementCounts(ctx context.Context, sessionID string, namespaces []string) (map[string]int, error)

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

// PlacementLister is implemented by stores that can page through the
// placements of a namespace (GET /registry/instances): memstore and
// redisstore. It is separate from Store so that fakes need not implement
// it.
//
// Across the pages of one listing (the cursors handed out from one first
// call onwards, each page within ListingTTL of the previous one), every
// placement that exists for the whole listing, and matches the query's
// filter throughout, is returned exactly once; one created, deleted or
// moved meanwhile is returned at most once. A page holds at most
// ListQuery.Limit placements and may hold fewer, none at all, before the
// last; the last page has an empty Cursor. On Redis the work of one call is
// bounded (a few SCAN calls of about Limit keys), whatever the number of
// placements; memstore walks its map in memory.
type PlacementLister interface {
	ListPlacements(ctx context.Context, q ListQuery) (ListPage, error)
}

// ListingTTL is how long a listing may wait between two pages before its
// cursor expires (ErrBadCursor).
const ListingTTL = 10 * time.Minute

// ListQuery selects one page of placements.
type ListQuery struct {
	// Namespace is "/name". Required.
	Namespace string
	// Sessions, when not nil, keeps only the placements held by one of
	// these session ids (a worker's live sessions). An empty non-nil slice
	// matches nothing.
	Sessions []string
	// Cursor is "" for the first page, then the previous page's Cursor. A
	// cursor belongs to the query it was made for: pass the same Namespace
	// (and Sessions filter, or nil for none) with it.
	Cursor string
	// Limit bounds the placements of the page (≥ 1).
	Limit int
}

// ListedPlacement is one placement of a page.
type ListedPlacement struct {
	ID        string // the id within ListQuery.Namespace
	SessionID string // its holder
}

// ListPage is one page of a listing.
type ListPage struct {
	Placements []ListedPlacement
	// Cursor continues the listing; "" when it is complete.
	Cursor string
}

// ErrTooManyAlarms: the instance already holds the most alarms allowed.
var ErrTooManyAlarms = errors.New("store: too many alarms for this instance")

// Alarms is implemented by stores that keep durable alarms (memstore and
// redisstore). Like Reaper it is separate from Store, so that fakes of Store
// need not implement it. Times are unix milliseconds, always passed in by
// the caller: a store never reads a clock for alarms.
//
// Semantics (storetest.RunAlarms checks them on both stores):
//
//   - An alarm is identified by (namespace, id, name). SetAlarm replaces
//     the alarm of that name, if any, whatever its state (due, retrying,
//     claimed); it is due at a.AtMs.
//   - ClaimAlarms takes the alarms of one shard (wire.AlarmShard of the
//     instance's placement name) whose due time is at or before nowMs, in
//     due order, at most max of them, and makes each due again only at
//     nowMs + claim: until then no other ClaimAlarms returns it, so of any
//     number of concurrent claimers exactly one gets it.
//   - FinishAlarm applies a delivery's outcome only while the alarm's
//     stored record is still the claimed one (compare-and-set on the record:
//     a SetAlarm or DeleteAlarm meanwhile wins). An alarm is removed only by
//     DeleteAlarm or a FinishAlarm with next == nil.
//   - Dead letters are kept per shard, at most maxDead of the newest.
type Alarms interface {
	// SetAlarm stores a (Gen set by the caller, DueMs ignored) as the
	// alarm a.Name of (ns, id), due at a.AtMs. It returns ErrTooManyAlarms
	// when the instance holds max alarms already and none named a.Name.
	SetAlarm(ctx context.Context, ns, id string, a wire.Alarm, max int) error
	// DeleteAlarm removes the alarm name of (ns, id) and reports whether it
	// existed.
	DeleteAlarm(ctx context.Context, ns, id, name string) (bool, error)
	// ListAlarms returns the alarms of (ns, id) sorted by name, each with
	// DueMs set (a claimed one: the end of its claim).
	ListAlarms(ctx context.Context, ns, id string) ([]wire.Alarm, error)
	// ClaimAlarms claims up to max due alarms of shard for claim (see
	// above). next is the earliest due time left in the shard afterwards
	// (claimed alarms count with the end of their claim), or -1 when the
	// shard holds no alarm.
	ClaimAlarms(ctx context.Context, shard int, nowMs int64, claim time.Duration, max int) (claimed []ClaimedAlarm, next int64, err error)
	// FinishAlarm applies the outcome of c's delivery while c's record is
	// still stored: next == nil removes the alarm, otherwise next replaces
	// it, due at nextDueMs; dead, when not nil, is added to the dead
	// letters, of which the shard keeps the newest maxDead. It reports
	// whether the record was still c's (false: nothing was written).
	FinishAlarm(ctx context.Context, c ClaimedAlarm, next *wire.Alarm, nextDueMs int64, dead *wire.DeadAlarm, maxDead int) (bool, error)
	// DeadAlarms returns up to max dead letters, the newest first.
	DeadAlarms(ctx context.Context, max int) ([]wire.DeadAlarm, error)
}

// ClaimedAlarm is an alarm returned by ClaimAlarms.
type ClaimedAlarm struct {
	Namespace, ID string
	Alarm         wire.Alarm
	// Record is the stored encoding FinishAlarm compares against.
	Record string
}

// EncodeAlarm is the stored encoding of an alarm record: its JSON without
// DueMs (the due time is the sorted-set score).
func EncodeAlarm(a wire.Alarm) string {
	a.DueMs = 0
	return encodeJSON(a)
}

// DecodeAlarm parses a stored alarm record.
func DecodeAlarm(s string) (wire.Alarm, error) { return decodeJSON[wire.Alarm](s, "alarm record") }

// EncodeDeadAlarm is the stored encoding of a dead letter (its JSON).
func EncodeDeadAlarm(d wire.DeadAlarm) string { return encodeJSON(d) }

// DecodeDeadAlarm parses a stored dead letter.
func DecodeDeadAlarm(s string) (wire.DeadAlarm, error) {
	return decodeJSON[wire.DeadAlarm](s, "dead letter")
}

// encodeJSON encodes one of the wire structs, which always encode.
func encodeJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func decodeJSON[T any](s, what string) (T, error) {
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return v, fmt.Errorf("store: malformed %s: %w", what, err)
	}
	return v, nil
}

// NewestDeadAlarms sorts dead letters newest first (ties by namespace, id,
// name and occurrence) and keeps at most max of them.
func NewestDeadAlarms(ds []wire.DeadAlarm, max int) []wire.DeadAlarm {
	slices.SortFunc(ds, func(a, b wire.DeadAlarm) int {
		return cmp.Or(cmp.Compare(b.DeadAtMs, a.DeadAtMs), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.ID, b.ID), cmp.Compare(a.Alarm.Name, b.Alarm.Name), cmp.Compare(a.Alarm.AtMs, b.Alarm.AtMs))
	})
	if len(ds) > max {
		ds = ds[:max]
	}
	if ds == nil {
		ds = []wire.DeadAlarm{}
	}
	return ds
}
