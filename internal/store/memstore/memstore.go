package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// Defaults for Config fields left zero.
const (
	// DefaultMaxQueuedMessages is the default Config.MaxQueuedMessages.
	DefaultMaxQueuedMessages = 16
	// DefaultQueueTTL is the default Config.QueueTTL.
	DefaultQueueTTL = 10 * time.Minute
)

// Config configures a Store.
type Config struct {
	// Options carries OnInvalidate.
	store.Options
	// Clock is the store's clock; nil means clock.Real.
	Clock clock.Clock
	// MaxQueuedMessages bounds a client's message queue; a push beyond it
	// drops the oldest message. Zero means DefaultMaxQueuedMessages.
	MaxQueuedMessages int
	// QueueTTL is how long a queue survives its last push when no
	// heartbeat takes it. Zero means DefaultQueueTTL.
	QueueTTL time.Duration
	// EpochTTL is how long an id's last epoch is kept after the placement
	// it belongs to was written or released (Reap drops older ones); past
	// it, epochs rest on the clock only (wire.NextEpoch). Zero means
	// store.DefaultEpochTTL.
	EpochTTL time.Duration
}

// Store is an in-memory store.Store and store.Reaper.
type Store struct {
	clock    clock.Clock
	onInv    func(store.Invalidation)
	maxQueue int
	queueTTL time.Duration
	epochTTL time.Duration

	mu         sync.Mutex
	closed     bool
	sessions   map[string]*session            // live and expired-but-not-reaped
	clients    map[string]string              // clientId -> current session id
	urls       map[string]string              // advertise URL -> current session id
	queues     map[string]*queue              // clientId -> queue
	placements map[string]store.Placement     // placement name -> placement
	epochs     map[string]lastEpoch           // placement name -> its last epoch
	owned      map[string]*index              // session id -> placement index
	nonces     map[string]expiring            // nonce id -> when it was used
	noncePrune int                            // prune nonces when the map reaches this size
	slots      map[string]map[string]expiring // token id -> session id -> slot
	alarms     [wire.AlarmShards]alarmShard   // alarms.go

	started bool
	kick    chan struct{} // wakes the reaper to recompute its deadline
	stop    chan struct{}
	done    chan struct{}
}

type session struct {
	s        store.Session
	anchor   clock.Instant // instant of Register or the last Heartbeat
	lease    time.Duration
	notified bool // expiry invalidation sent
}

// expiring is a record that lives ttl from at (a used nonce, a session
// slot under a token).
type expiring struct {
	at  clock.Instant
	ttl time.Duration
}

func (e expiring) gone(now clock.Instant) bool { return now.Elapsed(e.at, e.ttl) }

// lastEpoch is the last epoch allocated to a placement name, kept for the
// epoch TTL from at (the epoch's allocation or its placement's release).
type lastEpoch struct {
	epoch uint64
	at    clock.Instant
}

// minNoncePrune is the nonce map size below which UseNonce does not sweep.
const minNoncePrune = 1024

type queue struct {
	msgs   []wire.Message
	pushed clock.Instant
}

// index mirrors redisstore's pinned:o:<sid> hash: placement names and
// per-namespace counts that are created on first use and never removed.
type index struct {
	names  map[string]struct{}
	counts map[string]int
}

var _ interface {
	store.Store
	store.Reaper
	store.PlacementLister
	store.Alarms
} = (*Store)(nil)

// New returns a Store. It starts nothing; call Start for expiry
// announcements and Close when done.
func New(cfg Config) (*Store, error) {
	if cfg.MaxQueuedMessages < 0 {
		return nil, fmt.Errorf("memstore: MaxQueuedMessages %d is negative; use 0 for the default (%d)", cfg.MaxQueuedMessages, DefaultMaxQueuedMessages)
	}
	if cfg.QueueTTL < 0 {
		return nil, fmt.Errorf("memstore: QueueTTL %v is negative; use 0 for the default (%v)", cfg.QueueTTL, DefaultQueueTTL)
	}
	if cfg.EpochTTL < 0 {
		return nil, fmt.Errorf("memstore: EpochTTL %v is negative; use 0 for the default (%v)", cfg.EpochTTL, store.DefaultEpochTTL)
	}
	s := &Store{
		clock:      clock.Or(cfg.Clock),
		onInv:      cfg.OnInvalidate,
		maxQueue:   cmp.Or(cfg.MaxQueuedMessages, DefaultMaxQueuedMessages),
		queueTTL:   cmp.Or(cfg.QueueTTL, DefaultQueueTTL),
		epochTTL:   cmp.Or(cfg.EpochTTL, store.DefaultEpochTTL),
		sessions:   map[string]*session{},
		clients:    map[string]string{},
		urls:       map[string]string{},
		queues:     map[string]*queue{},
		placements: map[string]store.Placement{},
		epochs:     map[string]lastEpoch{},
		owned:      map[string]*index{},
		nonces:     map[string]expiring{},
		noncePrune: minNoncePrune,
		slots:      map[string]map[string]expiring{},
		kick:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	return s, nil
}

// Start starts the reaper goroutine that announces expiries (Expire) when the
// earliest lease runs out. It is idempotent; Close stops it.
func (s *Store) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return
	}
	s.started = true
	go s.reaper()
}

// Close stops the reaper and waits for it. Every later call fails with
// store.ErrClosed. Close is idempotent.
func (s *Store) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	started := s.started
	close(s.stop)
	s.mu.Unlock()
	if started {
		<-s.done
	}
}

// reaper sleeps until the earliest lease runs out, then calls Expire. It is
// owned by the Store: Close stops it and waits.
func (s *Store) reaper() {
	defer close(s.done)
	for {
		s.Expire()
		d, ok := s.nextExpiry()
		if clock.Sleep(s.clock, d, ok, s.kick, s.stop) {
			return
		}
	}
}

// nextExpiry returns how long until the earliest live session expires.
func (s *Store) nextExpiry() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	var min time.Duration
	found := false
	for _, r := range s.sessions {
		if r.notified {
			continue
		}
		left := r.lease - now.Sub(r.anchor)
		if !found || left < min {
			min, found = left, true
		}
	}
	return max(min, 0), found
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Expire announces every session whose lease has run out and that was not
// announced yet: OnInvalidate(Session) once per session. The reaper calls it;
// tests that drive a fake clock may call it directly after advancing. Reads
// never depend on it.
func (s *Store) Expire() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	now := s.clock.Now()
	var gone []string
	for id, r := range s.sessions {
		if !r.notified && !s.live(r, now) {
			r.notified = true
			gone = append(gone, id)
		}
	}
	s.mu.Unlock()
	for _, id := range gone {
		s.invalidate(store.Invalidation{Session: id})
	}
}

// Flush drops everything, like FLUSHALL on Redis (epoch counters included:
// later epochs rest on the clock's floor), and calls OnInvalidate(All).
func (s *Store) Flush() {
	s.mu.Lock()
	clear(s.sessions)
	clear(s.clients)
	clear(s.urls)
	clear(s.queues)
	clear(s.placements)
	clear(s.epochs)
	clear(s.owned)
	clear(s.nonces)
	clear(s.slots)
	s.alarms = [wire.AlarmShards]alarmShard{}
	s.mu.Unlock()
	s.invalidate(store.Invalidation{All: true})
}

func (s *Store) invalidate(inv store.Invalidation) {
	if s.onInv != nil {
		s.onInv(inv)
	}
}

func (s *Store) live(r *session, now clock.Instant) bool {
	return !now.Elapsed(r.anchor, r.lease)
}

// lookup returns the live session id, or nil.
func (s *Store) lookup(id string, now clock.Instant) *session {
	r := s.sessions[id]
	if r == nil || !s.live(r, now) {
		return nil
	}
	return r
}

// begin locks the store and checks ctx and Close.
func (s *Store) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.ErrClosed
	}
	return nil
}

func copySession(r *session) store.Session {
	c := r.s
	c.Namespaces = slices.Clone(r.s.Namespaces)
	return c
}

func (s *Store) stamp(r *session, now clock.Instant, lease time.Duration) {
	r.anchor, r.lease, r.notified = now, lease, false
	r.s.LastHeartbeat = now.UnixMilli()
	r.s.ExpiresAt = now.UnixMilli() + lease.Milliseconds()
}

// Register implements store.Store.
func (s *Store) Register(ctx context.Context, in store.Session, lease time.Duration) ([]string, error) {
	if lease <= 0 {
		return nil, fmt.Errorf("cannot register: lease %v must be positive", lease)
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	now := s.clock.Now()
	if _, dup := s.sessions[in.ID]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("cannot register: session id %q already exists", in.ID)
	}
	r := &session{s: in}
	r.s.Namespaces = slices.Clone(in.Namespaces)
	r.s.Superseded = false
	r.s.RegisteredAt = now.UnixMilli()
	s.stamp(r, now, lease)
	s.sessions[in.ID] = r
	ix := s.indexOf(in.ID)
	for _, ns := range in.Namespaces {
		if _, ok := ix.counts[ns]; !ok {
			ix.counts[ns] = 0
		}
	}
	var superseded []string
	for _, old := range []string{s.clients[in.ClientID], s.urls[in.AdvertiseURL]} {
		if old == "" || old == in.ID || slices.Contains(superseded, old) {
			continue
		}
		if o := s.lookup(old, now); o != nil && !o.s.Superseded {
			o.s.Superseded = true
			superseded = append(superseded, old)
		}
	}
	s.clients[in.ClientID] = in.ID
	s.urls[in.AdvertiseURL] = in.ID
	s.mu.Unlock()
	s.wake()
	s.invalidate(store.Invalidation{Session: in.ID})
	for _, id := range superseded {
		s.invalidate(store.Invalidation{Session: id})
	}
	return superseded, nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, id string, u store.Update, lease time.Duration) (store.Session, []wire.Message, error) {
	if lease <= 0 {
		return store.Session{}, nil, fmt.Errorf("cannot heartbeat: lease %v must be positive", lease)
	}
	if err := s.begin(ctx); err != nil {
		return store.Session{}, nil, err
	}
	now := s.clock.Now()
	r := s.lookup(id, now)
	switch {
	case r == nil:
		s.mu.Unlock()
		return store.Session{}, nil, store.ErrUnknownSession
	case r.s.Superseded:
		s.mu.Unlock()
		return store.Session{}, nil, store.ErrSuperseded
	}
	r.s.Headroom = u.Headroom
	r.s.Draining = u.Draining
	r.s.DrainDeadline = u.DrainDeadline
	if u.Verified {
		r.s.Verified = true
	}
	s.stamp(r, now, lease)
	if slot, ok := s.slots[r.s.TokenID][id]; ok {
		slot.at, slot.ttl = now, lease
		s.slots[r.s.TokenID][id] = slot
	}
	var msgs []wire.Message
	if q := s.queues[r.s.ClientID]; q != nil {
		if !now.Elapsed(q.pushed, s.queueTTL) {
			msgs = q.msgs
		}
		delete(s.queues, r.s.ClientID)
	}
	out := copySession(r)
	s.mu.Unlock()
	s.wake()
	s.invalidate(store.Invalidation{Session: id})
	return out, msgs, nil
}

// Session implements store.Store.
func (s *Store) Session(ctx context.Context, id string) (store.Session, error) {
	if err := s.begin(ctx); err != nil {
		return store.Session{}, err
	}
	defer s.mu.Unlock()
	r := s.lookup(id, s.clock.Now())
	if r == nil {
		return store.Session{}, store.ErrUnknownSession
	}
	return copySession(r), nil
}

// Sessions implements store.Store. The result is sorted by session id.
func (s *Store) Sessions(ctx context.Context) ([]store.Session, error) {
	return s.filter(ctx, func(*session) bool { return true })
}

// NamespaceSessions implements store.Store. The result is sorted by session id.
func (s *Store) NamespaceSessions(ctx context.Context, ns string) ([]store.Session, error) {
	return s.filter(ctx, func(r *session) bool { return r.s.Serves(ns) })
}

func (s *Store) filter(ctx context.Context, keep func(*session) bool) ([]store.Session, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	var out []store.Session
	for _, r := range s.sessions {
		if s.live(r, now) && keep(r) {
			out = append(out, copySession(r))
		}
	}
	slices.SortFunc(out, func(a, b store.Session) int { return cmpString(a.ID, b.ID) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// NamespaceKnown implements store.Store: a session of ns is in the map
// (live, or expired and not reaped yet).
func (s *Store) NamespaceKnown(ctx context.Context, ns string) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	for _, r := range s.sessions {
		if r.s.Serves(ns) {
			return true, nil
		}
	}
	return false, nil
}

// CurrentSession implements store.Store.
func (s *Store) CurrentSession(ctx context.Context, clientID string) (string, error) {
	if err := s.begin(ctx); err != nil {
		return "", err
	}
	defer s.mu.Unlock()
	id := s.clients[clientID]
	if id == "" || s.lookup(id, s.clock.Now()) == nil {
		return "", nil
	}
	return id, nil
}

// Push implements store.Store.
func (s *Store) Push(ctx context.Context, clientID string, m wire.Message) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	q := s.queues[clientID]
	if q == nil || now.Elapsed(q.pushed, s.queueTTL) {
		q = &queue{}
		s.queues[clientID] = q
	}
	q.msgs = append(q.msgs, m)
	if n := len(q.msgs) - s.maxQueue; n > 0 {
		q.msgs = slices.Delete(q.msgs, 0, n)
	}
	q.pushed = now
	return nil
}

// Deregister implements store.Store. The record stays in memory, dead to
// every read, until Reap collects it after its grace, like an expired one.
func (s *Store) Deregister(ctx context.Context, id string) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	now := s.clock.Now()
	r := s.lookup(id, now)
	if r == nil {
		s.mu.Unlock()
		return false, nil
	}
	// Dead from now on: live() is false for a zero lease.
	r.anchor, r.lease, r.notified = now, 0, true
	r.s.ExpiresAt = now.UnixMilli()
	if s.clients[r.s.ClientID] == id {
		delete(s.clients, r.s.ClientID)
	}
	if s.urls[r.s.AdvertiseURL] == id {
		delete(s.urls, r.s.AdvertiseURL)
	}
	if m := s.slots[r.s.TokenID]; m != nil {
		delete(m, id)
	}
	s.mu.Unlock()
	s.wake()
	s.invalidate(store.Invalidation{Session: id})
	return true, nil
}

// UseNonce implements store.Store.
func (s *Store) UseNonce(ctx context.Context, nonceID, _ string, ttl time.Duration) (bool, error) {
	if ttl <= 0 {
		return false, fmt.Errorf("cannot record a nonce: ttl %v must be positive", ttl)
	}
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	if n, ok := s.nonces[nonceID]; ok && !n.gone(now) {
		return false, nil
	}
	s.nonces[nonceID] = expiring{at: now, ttl: ttl}
	if len(s.nonces) >= s.noncePrune {
		s.pruneNonces(now)
	}
	return true, nil
}

// pruneNonces drops expired nonces; the next sweep waits until the map has
// doubled, so the cost per UseNonce stays constant. Called with mu held.
func (s *Store) pruneNonces(now clock.Instant) {
	for k, n := range s.nonces {
		if n.gone(now) {
			delete(s.nonces, k)
		}
	}
	s.noncePrune = max(2*len(s.nonces), minNoncePrune)
}

// ReserveSlot implements store.Store.
func (s *Store) ReserveSlot(ctx context.Context, tokenID, sessionID string, max int, lease time.Duration) (int, bool, error) {
	if lease <= 0 || sessionID == "" {
		return 0, false, fmt.Errorf("cannot reserve a session slot: need a session id and a positive lease")
	}
	if err := s.begin(ctx); err != nil {
		return 0, false, err
	}
	defer s.mu.Unlock()
	now := s.clock.Now()
	m := s.slots[tokenID]
	if m == nil {
		m = map[string]expiring{}
		s.slots[tokenID] = m
	}
	for id, e := range m {
		if e.gone(now) {
			delete(m, id)
		}
	}
	if _, ok := m[sessionID]; ok {
		return len(m), true, nil
	}
	if len(m) >= max {
		return len(m), false, nil
	}
	m[sessionID] = expiring{at: now, ttl: lease}
	return len(m), true, nil
}

// Lookup implements store.Store.
func (s *Store) Lookup(ctx context.Context, ns, id string) (store.Placement, error) {
	if err := s.begin(ctx); err != nil {
		return store.Placement{}, err
	}
	defer s.mu.Unlock()
	return s.placements[wire.PlacementName(ns, id)], nil
}

// Placement implements store.Store: Lookup's session.
func (s *Store) Placement(ctx context.Context, ns, id string) (string, error) {
	p, err := s.Lookup(ctx, ns, id)
	return p.Session, err
}

// place writes name -> sessionID under a new epoch (wire.NextEpoch of the
// larger of the remembered last epoch and the current placement's). Called
// with s.mu held.
func (s *Store) place(name, sessionID string) store.Placement {
	now := s.clock.Now()
	last := max(s.epochs[name].epoch, s.placements[name].Epoch)
	p := store.Placement{Session: sessionID, Epoch: wire.NextEpoch(last, now.Wall()), Since: time.UnixMilli(now.UnixMilli())}
	s.placements[name] = p
	s.epochs[name] = lastEpoch{epoch: p.Epoch, at: now}
	return p
}

// unplace deletes name's placement; its epoch is remembered for another
// epoch TTL. Called with s.mu held.
func (s *Store) unplace(name string, now clock.Instant) {
	e := max(s.epochs[name].epoch, s.placements[name].Epoch)
	delete(s.placements, name)
	s.epochs[name] = lastEpoch{epoch: e, at: now}
}

func (s *Store) indexOf(sid string) *index {
	ix := s.owned[sid]
	if ix == nil {
		ix = &index{names: map[string]struct{}{}, counts: map[string]int{}}
		s.owned[sid] = ix
	}
	return ix
}

func (s *Store) indexAdd(sid, ns, name string) {
	ix := s.indexOf(sid)
	if _, ok := ix.names[name]; !ok {
		ix.names[name] = struct{}{}
		ix.counts[ns]++
	}
}

func (s *Store) indexDel(sid, ns, name string) {
	ix := s.owned[sid]
	if ix == nil {
		return
	}
	if _, ok := ix.names[name]; ok {
		delete(ix.names, name)
		ix.counts[ns]--
	}
}

// Claim implements store.Store: ClaimPlacement's session.
func (s *Store) Claim(ctx context.Context, ns, id, sessionID string) (string, error) {
	p, err := s.ClaimPlacement(ctx, ns, id, sessionID)
	return p.Session, err
}

// ClaimPlacement implements store.Store.
func (s *Store) ClaimPlacement(ctx context.Context, ns, id, sessionID string) (store.Placement, error) {
	p, _, err := s.LookupOrClaim(ctx, ns, id, sessionID)
	return p, err
}

// LookupOrClaim implements store.Store: one critical section. A claim
// invalidates the name for every reader, the caller included (memstore
// does not know who cached what).
func (s *Store) LookupOrClaim(ctx context.Context, ns, id, sessionID string) (store.Placement, bool, error) {
	if sessionID == "" {
		return store.Placement{}, false, errors.New("cannot claim: empty session id")
	}
	if err := s.begin(ctx); err != nil {
		return store.Placement{}, false, err
	}
	name := wire.PlacementName(ns, id)
	if p := s.placements[name]; p.Session != "" {
		s.mu.Unlock()
		return p, false, nil
	}
	p := s.place(name, sessionID)
	s.indexAdd(sessionID, ns, name)
	s.mu.Unlock()
	s.invalidate(store.Invalidation{Placement: name})
	return p, true, nil
}

// Replace implements store.Store: ReplacePlacement's session.
func (s *Store) Replace(ctx context.Context, ns, id, old, sessionID string) (string, error) {
	p, err := s.ReplacePlacement(ctx, ns, id, old, sessionID)
	return p.Session, err
}

// ReplacePlacement implements store.Store.
func (s *Store) ReplacePlacement(ctx context.Context, ns, id, old, sessionID string) (store.Placement, error) {
	if sessionID == "" || old == "" {
		return store.Placement{}, errors.New("cannot replace: empty session id")
	}
	if err := s.begin(ctx); err != nil {
		return store.Placement{}, err
	}
	name := wire.PlacementName(ns, id)
	if p := s.placements[name]; p.Session != old {
		s.mu.Unlock()
		return p, nil
	}
	p := s.place(name, sessionID)
	s.indexAdd(sessionID, ns, name)
	if old != sessionID {
		s.indexDel(old, ns, name)
	}
	s.mu.Unlock()
	s.invalidate(store.Invalidation{Placement: name})
	return p, nil
}

// RenewPlacement implements store.Store.
func (s *Store) RenewPlacement(ctx context.Context, ns, id, sessionID string, epoch uint64) (store.Placement, error) {
	if sessionID == "" {
		return store.Placement{}, errors.New("cannot renew: empty session id")
	}
	if err := s.begin(ctx); err != nil {
		return store.Placement{}, err
	}
	name := wire.PlacementName(ns, id)
	if p := s.placements[name]; p.Session != sessionID || p.Epoch != epoch {
		s.mu.Unlock()
		return p, nil
	}
	p := s.place(name, sessionID)
	s.mu.Unlock()
	s.invalidate(store.Invalidation{Placement: name})
	return p, nil
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, ns, id, sessionID string, epoch uint64) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	name := wire.PlacementName(ns, id)
	if faults.Has(faults.ReleaseAnyEpoch) {
		epoch = 0 // planted bug (pinned_faults builds only)
	}
	p := s.placements[name]
	if sessionID == "" || p.Session != sessionID || (epoch != 0 && p.Epoch != epoch) {
		s.mu.Unlock()
		return false, nil
	}
	s.unplace(name, s.clock.Now())
	s.indexDel(sessionID, ns, name)
	s.mu.Unlock()
	s.invalidate(store.Invalidation{Placement: name})
	return true, nil
}

// PlacementCounts implements store.Store.
func (s *Store) PlacementCounts(ctx context.Context, sessionID string, namespaces []string) (map[string]int, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := map[string]int{}
	if ix := s.owned[sessionID]; ix != nil {
		for _, ns := range namespaces {
			if n, ok := ix.counts[ns]; ok {
				out[ns] = n
			}
		}
	}
	return out, nil
}

// Reap implements store.Reaper.
func (s *Store) Reap(ctx context.Context, grace time.Duration) (store.ReapStats, error) {
	var st store.ReapStats
	if err := s.begin(ctx); err != nil {
		return st, err
	}
	now := s.clock.Now()
	var freed, expired []string
	for sid, r := range s.sessions {
		if !now.Elapsed(r.anchor, r.lease+grace) {
			continue
		}
		st.Sessions++
		if !r.notified {
			expired = append(expired, sid)
		}
		if ix := s.owned[sid]; ix != nil {
			for name := range ix.names {
				if s.placements[name].Session == sid {
					s.unplace(name, now)
					freed = append(freed, name)
				}
			}
		}
		delete(s.owned, sid)
		delete(s.sessions, sid)
		if s.clients[r.s.ClientID] == sid {
			delete(s.clients, r.s.ClientID)
		}
		if s.urls[r.s.AdvertiseURL] == sid {
			delete(s.urls, r.s.AdvertiseURL)
		}
	}
	for cid, q := range s.queues {
		if now.Elapsed(q.pushed, s.queueTTL) {
			delete(s.queues, cid)
		}
	}
	s.pruneNonces(now)
	for name, e := range s.epochs {
		if now.Elapsed(e.at, s.epochTTL) {
			delete(s.epochs, name)
		}
	}
	for tok, m := range s.slots {
		for id, e := range m {
			if e.gone(now) {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(s.slots, tok)
		}
	}
	s.mu.Unlock()
	st.Placements = len(freed)
	for _, id := range expired {
		s.invalidate(store.Invalidation{Session: id})
	}
	for _, name := range freed {
		s.invalidate(store.Invalidation{Placement: name})
	}
	return st, nil
}

// Ping implements store.Store: nil unless the store is closed.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// memCursorPrefix starts every cursor memstore hands out: the rest is the
// last id returned.
const memCursorPrefix = "m:"

// ListPlacements implements store.PlacementLister. Pages are in id order and
// the cursor is the last id returned, so every placement present for the
// whole listing is returned exactly once, whatever changes meanwhile.
func (s *Store) ListPlacements(ctx context.Context, q store.ListQuery) (store.ListPage, error) {
	var after string
	if q.Cursor != "" {
		var ok bool
		after, ok = strings.CutPrefix(q.Cursor, memCursorPrefix)
		if !ok || wire.CheckSegment([]byte(after), 0) != wire.SegmentOK {
			return store.ListPage{}, store.ErrBadCursor
		}
	}
	if q.Limit < 1 {
		return store.ListPage{}, errors.New("memstore: ListQuery.Limit must be at least 1")
	}
	if err := s.begin(ctx); err != nil {
		return store.ListPage{}, err
	}
	prefix := q.Namespace + "/"
	var found []store.ListedPlacement
	keep := func(name, sid string) {
		if id, ok := strings.CutPrefix(name, prefix); ok && id > after {
			found = append(found, store.ListedPlacement{ID: id, SessionID: sid})
		}
	}
	if q.Sessions == nil {
		for name, pl := range s.placements {
			keep(name, pl.Session)
		}
	} else {
		for _, sid := range q.Sessions {
			if ix := s.owned[sid]; ix != nil {
				for name := range ix.names {
					if s.placements[name].Session == sid {
						keep(name, sid)
					}
				}
			}
		}
	}
	s.mu.Unlock()
	slices.SortFunc(found, func(a, b store.ListedPlacement) int { return strings.Compare(a.ID, b.ID) })
	page := store.ListPage{Placements: found}
	if len(found) > q.Limit {
		page.Placements = found[:q.Limit:q.Limit]
		page.Cursor = memCursorPrefix + found[q.Limit-1].ID
	}
	return page, nil
}
