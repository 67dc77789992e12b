package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/logthrottle"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/wire"
	"github.com/pinned-go/pinned/placecache"
	"github.com/pinned-go/pinned/proxy"
)

// Resolver is the pinboard's proxy.Resolver: placement names "/<ns>/<id>"
// to the worker sessions holding them (proxy.Route), cached in process,
// placed on a miss. Make it with New, wire the store's invalidations to
// OnInvalidate, run Run for its background work, and Close it after the
// proxy's server has stopped.
type Resolver struct {
	cfg      Config
	st       store.Store
	cache    *placecache.Cache[proxy.Route]
	clock    clock.Clock
	fastTime bool // no Clock configured: lookups use fasthttp's request time
	log      *slog.Logger
	errLog   logthrottle.Every
	m        resolverMetrics

	// ctx is the parent of every store call; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	ran    atomic.Bool

	mu       sync.Mutex
	closed   bool
	flights  map[string]*flight  // misses in progress, by placement name
	sessions map[string]*session // worker sessions handed to the proxy, by id
	unusable map[string]struct{} // sessions whose advertise URL the proxy cannot use

	checksMu sync.Mutex
	checks   map[string]struct{} // placement names whose tunnels Run must check
	watched  map[string]int      // open tunnels by placement name (Watch/Unwatch)
	wake     chan struct{}
}

// session is what the resolver keeps per worker session.
type session struct {
	s *proxy.Session // the one value every route to the session carries
	// placed counts the placements this resolver made on the session since
	// the heartbeat whose headroom it last read (hb): the headroom it sees
	// is that much too high until the next heartbeat reports it.
	placed int
	hb     int64
	// refused is when a request to the session was last refused or failed
	// (Refused); zero for never.
	refused clock.Instant
}

// flight is one miss in progress; concurrent misses of a name share it.
type flight struct {
	done chan struct{}
	rt   proxy.Route
	err  error
}

var _ interface {
	proxy.Resolver
	proxy.TunnelWatcher
} = (*Resolver)(nil)

// New makes a Resolver. It validates cfg, does no I/O and starts nothing.
func New(cfg Config) (*Resolver, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	cache, err := placecache.New[proxy.Route](placecache.Config{
		Name:       "placements",
		Shards:     cfg.CacheShards,
		MaxEntries: cfg.CacheMaxEntries,
		TTL:        cfg.CacheTTL,
		Clock:      cfg.Clock,
		Metrics:    cfg.Metrics,
	})
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	r := &Resolver{
		cfg:      cfg,
		st:       cfg.Store,
		cache:    cache,
		clock:    clock.Or(cfg.Clock),
		fastTime: cfg.Clock == nil,
		log:      cfg.Logger.With("logger", "pinned.placement"),
		errLog:   logthrottle.Every{Interval: time.Second},
		flights:  make(map[string]*flight),
		sessions: make(map[string]*session),
		unusable: make(map[string]struct{}),
		checks:   make(map[string]struct{}),
		watched:  make(map[string]int),
		wake:     make(chan struct{}, 1),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.m.register(cfg.Metrics, r)
	return r, nil
}

// Metrics returns the set the resolver and its cache report on.
func (r *Resolver) Metrics() *metrics.Set { return r.cfg.Metrics }

// CacheStats returns the placement cache's counters.
func (r *Resolver) CacheStats() placecache.Stats { return r.cache.Stats() }

// Lookup implements proxy.Resolver: the cached route of name at now,
// without allocating, blocking or touching the store. now is the request's
// time (fasthttp's RequestCtx.Time), converted by clock.FromTime; with an
// injected Config.Clock, that clock is read instead.
func (r *Resolver) Lookup(name []byte, now time.Time) (proxy.Route, bool) {
	var at clock.Instant
	if r.fastTime {
		at = clock.FromTime(now)
	} else {
		at = r.clock.Now()
	}
	return r.cache.Get(name, at)
}

// Resolve implements proxy.Resolver: the route of name, read from the store
// (placing the instance if needed, see the package doc) unless it was cached
// since the caller's Lookup missed, sharing the work with concurrent misses
// of the same name. That second look at the cache is not counted as a hit
// or a miss: the Lookup was. Errors wrap proxy.ErrNoWorker (503 no_worker)
// or describe a store failure (503 store).
func (r *Resolver) Resolve(ctx context.Context, name []byte) (proxy.Route, error) {
	var now clock.Instant
	if rc, ok := ctx.(*fasthttp.RequestCtx); ok && r.fastTime {
		now = clock.FromTime(rc.Time())
	} else {
		now = r.clock.Now()
	}
	if rt, ok := r.cache.Peek(name, now); ok {
		return rt, nil
	}
	return r.miss(name)
}

// Refused implements proxy.Resolver: the session of rt refused the request
// for name (503 closing, draining or lease, 403 forbidden) or could not be
// reached. The cached route is dropped if it still names rt's session, so
// the next Resolve consults the store, which either confirms the holder (the
// 503 reaches the client) or finds its session gone and places the instance
// elsewhere. The session is also passed over for new placements for
// AvoidFor. Refused does no I/O.
func (r *Resolver) Refused(name []byte, rt proxy.Route) {
	r.m.invalidates.Inc()
	r.cache.InvalidateIf(name, func(v proxy.Route) bool { return v.Session == rt.Session })
	if rt.Session == nil {
		return
	}
	now := r.clock.Now()
	r.mu.Lock()
	if s := r.sessions[rt.Session.ID]; s != nil && s.s == rt.Session {
		s.refused = now
	}
	r.mu.Unlock()
}

// OnInvalidate receives the store's invalidations (store.Options.OnInvalidate,
// forwarded by the pinboard). It is fast and does no I/O: it runs on a Redis
// connection's reader goroutine.
//
//   - {Placement: name}: the cached placement is dropped; if the name is
//     watched (WebSocket tunnels of it are open), Run is asked to re-read the
//     placement and report its holder to Config.OnMoved.
//   - {All: true} (connection loss, FLUSHALL): every cached placement is
//     dropped, and Run re-checks every name with open tunnels (a lost
//     connection changes nothing in Redis, but ends its tracking: the
//     re-read tracks the keys again).
//   - {Session: id}: ignored. Every heartbeat rewrites the session hash, so
//     this arrives every few seconds per worker; dropping that worker's
//     placements would cost store reads for each of its ids each time. A
//     session's death is learnt lazily (see the package doc).
func (r *Resolver) OnInvalidate(inv store.Invalidation) {
	switch {
	case inv.All:
		r.cache.InvalidateAll()
		r.checksMu.Lock()
		for name := range r.watched {
			r.queueCheckLocked(name)
		}
		r.checksMu.Unlock()
		r.wakeRun()
	case inv.Placement != "":
		r.cache.Invalidate(inv.Placement)
		r.checksMu.Lock()
		if r.watched[inv.Placement] > 0 {
			r.queueCheckLocked(inv.Placement)
		}
		r.checksMu.Unlock()
		r.wakeRun()
	}
}

// Watch implements proxy.TunnelWatcher: a WebSocket tunnel of name opened.
// Run checks the placement at once; the check's read also makes Redis
// track the placement key for this pinboard again (an invalidation ends
// tracking until the next read, and the claim that placed the id was such
// an invalidation), so that a later move reaches OnInvalidate.
func (r *Resolver) Watch(name string) {
	r.checksMu.Lock()
	r.watched[name]++
	r.queueCheckLocked(name)
	r.checksMu.Unlock()
	r.wakeRun()
}

// Unwatch implements proxy.TunnelWatcher: a tunnel of name closed.
func (r *Resolver) Unwatch(name string) {
	r.checksMu.Lock()
	if r.watched[name]--; r.watched[name] <= 0 {
		delete(r.watched, name)
	}
	r.checksMu.Unlock()
}

// miss resolves name through the store, single-flighted per name.
func (r *Resolver) miss(name []byte) (proxy.Route, error) {
	key := string(name)
	r.mu.Lock()
	if f := r.flights[key]; f != nil {
		r.mu.Unlock()
		r.m.sharedMisses.Inc()
		<-f.done // bounded: the leader's load is bounded by ResolveTimeout
		return f.rt, f.err
	}
	f := &flight{done: make(chan struct{})}
	r.flights[key] = f
	r.mu.Unlock()

	start := time.Now()
	f.rt, f.err = r.load(key, name)
	r.m.missDuration.UpdateDuration(start)

	r.mu.Lock()
	delete(r.flights, key)
	r.mu.Unlock()
	close(f.done)
	return f.rt, f.err
}

// readPlacement reads the placement of (ns, id) (holder and epoch) and, when
// the store answers from a client-side cache of its own, until when that
// cache serves it: the placecache keeps the value no longer
// (store.CachedLookups).
func (r *Resolver) readPlacement(ctx context.Context, ns, id string) (store.Placement, time.Time, error) {
	if cl, ok := r.st.(store.CachedLookups); ok {
		return cl.LookupUntil(ctx, ns, id)
	}
	pl, err := r.st.Lookup(ctx, ns, id)
	return pl, time.Time{}, err
}

// load decides where name lives: the live holder of its placement, or a
// session it claims (no placement) or takes over (the holder's lease ran
// out) for it. The result is cached unless an invalidation of the name's
// cache shard happened since before the first store read.
func (r *Resolver) load(key string, name []byte) (proxy.Route, error) {
	ns, id, ok := wire.SplitPlacementName(key)
	if !ok {
		return proxy.Route{}, fmt.Errorf("placement: %q is not a placement name /<namespace>/<id>", key)
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.ResolveTimeout)
	defer cancel()

	// The token is taken before any store read: an invalidation processed
	// after it refuses the Put below (the second-level-cache race).
	tok := r.cache.Begin(name)
	live, err := r.st.NamespaceSessions(ctx, ns)
	if err != nil {
		return proxy.Route{}, r.storeErr(key, "cannot list the namespace's sessions", err)
	}
	if len(live) == 0 {
		// Any holder would be dead (a live holder serves ns): no
		// placement read, so requests for unserved namespaces cost Redis
		// nothing beyond the cached membership read.
		return proxy.Route{}, r.noWorker(ns)
	}
	pl, until, err := r.readPlacement(ctx, ns, id)
	if err != nil {
		return proxy.Route{}, r.storeErr(key, "cannot read the placement", err)
	}
	for range maxRounds {
		if pl.Session == "" {
			c, sess, err := r.pick(ns, live)
			if err != nil {
				return proxy.Route{}, err
			}
			// SET NX: the first claim wins; a loser learns the winner from
			// the reply and never re-reads (a cached read right after a
			// write can be stale: rueidis#534).
			won, err := r.st.ClaimPlacement(ctx, ns, id, c)
			if err != nil {
				return proxy.Route{}, r.storeErr(key, "cannot claim the placement", err)
			}
			if won.Session == c {
				// Won, or another pinboard claimed for the same session
				// first: either way c holds it.
				r.m.claimsWon.Inc()
				r.placed(c)
				r.log.Debug("instance placed", "namespace", ns, "instance", id, "session", c, "epoch", won.Epoch)
				rt := proxy.Route{Session: sess, Epoch: won.Epoch}
				r.cache.Put(name, rt, tok)
				return rt, nil
			}
			r.m.claimsLost.Inc()
			pl, until = won, time.Time{} // the script's reply: fresh
			continue
		}
		holder := pl.Session
		sess, gone, err := r.holderSession(ctx, key, holder, live)
		if err != nil {
			return proxy.Route{}, err
		}
		if !gone {
			rt := proxy.Route{Session: sess, Epoch: pl.Epoch}
			r.cache.PutUntil(name, rt, tok, until)
			return rt, nil
		}
		// The holder's lease ran out in the store: its process may no
		// longer serve the instance (it fenced itself before its lease
		// ended), so the placement is taken over, compare-and-set from the
		// dead session.
		r.dropSession(holder, "expired")
		c, sess, err := r.pick(ns, live)
		if err != nil {
			return proxy.Route{}, err
		}
		got, err := r.st.ReplacePlacement(ctx, ns, id, holder, c)
		if err != nil {
			return proxy.Route{}, r.storeErr(key, "cannot replace the placement", err)
		}
		if got.Session == c {
			r.m.replacesWon.Inc()
			r.placed(c)
			r.log.Debug("instance re-placed: its session expired", "namespace", ns, "instance", id,
				"session", c, "previous", holder, "epoch", got.Epoch)
			rt := proxy.Route{Session: sess, Epoch: got.Epoch}
			r.cache.Put(name, rt, tok)
			return rt, nil
		}
		r.m.replacesLost.Inc()
		pl, until = got, time.Time{}
	}
	return proxy.Route{}, r.storeErr(key, "placement kept changing", fmt.Errorf("%d rounds", maxRounds))
}

// holderSession returns the holder's session, or gone when the store no
// longer has it.
func (r *Resolver) holderSession(ctx context.Context, key, holder string, live []store.Session) (sess *proxy.Session, gone bool, err error) {
	for i := range live {
		if live[i].ID == holder {
			sess, err := r.sessionFor(&live[i])
			return sess, false, err
		}
	}
	// Not in the namespace's live list, which may lag a registration:
	// ask for the session itself.
	s, err := r.st.Session(ctx, holder)
	if errors.Is(err, store.ErrUnknownSession) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, r.storeErr(key, "cannot read the holder's session", err)
	}
	sess, err = r.sessionFor(&s)
	return sess, false, err
}

// pick chooses a session for a new placement among live and returns its id
// and proxy session.
func (r *Resolver) pick(ns string, live []store.Session) (string, *proxy.Session, error) {
	for range len(live) {
		i := r.choose(live)
		if i < 0 {
			break
		}
		sess, err := r.sessionFor(&live[i])
		if err == nil {
			return live[i].ID, sess, nil
		}
	}
	return "", nil, r.noWorker(ns)
}

// sessionFor returns the proxy's view of the session, made on first use and
// the same pointer for every placement on it. A session whose advertise URL
// the proxy cannot use (wire.ParseAdvertiseURL) is refused, logged once and
// passed over by choose.
func (r *Resolver) sessionFor(s *store.Session) (*proxy.Session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("placement: %w", store.ErrClosed)
	}
	if e := r.sessions[s.ID]; e != nil {
		return e.s, nil
	}
	if _, _, err := wire.ParseAdvertiseURL(s.AdvertiseURL); err != nil {
		if _, seen := r.unusable[s.ID]; !seen {
			r.unusable[s.ID] = struct{}{}
			r.log.Warn("worker session cannot be proxied to", "session", s.ID, "err", err)
		}
		return nil, fmt.Errorf("worker session %s: %w (%w)", s.ID, proxy.ErrNoWorker, err)
	}
	ps := &proxy.Session{ID: s.ID, Secret: s.Secret, AdvertiseURL: s.AdvertiseURL, MaxBodyBytes: s.MaxBodyBytes}
	r.sessions[s.ID] = &session{s: ps, hb: s.LastHeartbeat}
	return ps, nil
}

// placed counts a placement this resolver made on sid.
func (r *Resolver) placed(sid string) {
	r.mu.Lock()
	if s := r.sessions[sid]; s != nil {
		s.placed++
	}
	r.mu.Unlock()
}

// dropSession forgets a session that is gone from the store (its record:
// headroom bookkeeping, refusals; the proxy's janitor closes its connection
// pool once nothing uses it). Routes cached with it stay until a request
// fails on them (Refused) or they expire.
func (r *Resolver) dropSession(sid, reason string) {
	r.mu.Lock()
	_, known := r.sessions[sid]
	delete(r.sessions, sid)
	delete(r.unusable, sid)
	r.mu.Unlock()
	if known {
		r.m.sessionsDropped.Inc()
		r.log.Info("worker session gone; forgotten", "session", sid, "reason", reason)
	}
}

// Sessions returns the number of worker sessions the resolver knows.
func (r *Resolver) Sessions() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sessions)
}

func (r *Resolver) noWorker(ns string) error {
	r.m.noWorker.Inc()
	return fmt.Errorf("no eligible worker for %s: %w", ns, proxy.ErrNoWorker)
}

func (r *Resolver) storeErr(key, what string, err error) error {
	r.m.storeErrors.Inc()
	if r.errLog.Allow() {
		r.log.Warn("cannot resolve placement", "name", key, "err", fmt.Sprintf("%s: %v", what, err))
	}
	return fmt.Errorf("placement %s: %s: %w", key, what, err)
}

// Close cancels store calls in progress and forgets every cached route and
// session. Call it after the proxy's server has stopped; a Resolve after
// Close fails. Close is idempotent.
func (r *Resolver) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	clear(r.sessions)
	r.mu.Unlock()
	r.cancel()
	r.cache.InvalidateAll()
}
