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
	"github.com/pinned-go/pinned/internal/base/logthrottle"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
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
	cache    routeCache
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
	// refused holds the placement names whose route the proxy refused
	// (Refused), with when and how, until their next miss takes them
	// (recheck).
	refused map[string]refusal
	// served holds when each namespace was last seen with a live session
	// (misses only), for NamespaceMemory, at most maxNamespaces of them.
	served map[string]clock.Instant

	checksMu sync.Mutex
	checks   map[string]struct{} // placement names whose tunnels Run must check
	watched  map[string]int      // open tunnels by placement name (Watch/Unwatch)
	wake     chan struct{}

	// Refreshes (refresh.go): names due, gathering for a batch (guarded by
	// refreshMu), the kick that starts a batch, and the batch's names on
	// their way to the refreshers.
	refreshMu      sync.Mutex
	refreshPending []string
	refreshKick    chan struct{}
	refreshQ       chan string

	// Fast failover (failover.go): the sessions waiting for a death probe,
	// and each session's last probe (guarded by mu).
	probeQ chan *proxy.Session
	probes map[string]*probeState
	dead   map[string]clock.Instant // sessions whose death a probe confirmed, for a lease (guarded by mu)

	// The namespaces' live sessions as last decoded (SessionsReuse).
	liveMu sync.Mutex
	live   map[string]liveList
}

// liveList is a namespace's live sessions as the store listed them at.
// The slice is shared by every miss that reuses it: read only.
type liveList struct {
	at       clock.Instant
	sessions []store.Session
	// listing: a miss is listing the sessions again; the others reuse
	// this list meanwhile, however old, instead of all listing at once.
	listing bool
}

// maxLiveLists bounds the namespaces whose session lists are kept.
const maxLiveLists = 1024

// namespaceSessions is the store's NamespaceSessions, reused for up to
// SessionsReuse, or while another miss lists them again (reused reports
// that it was); fresh reads it from the store in any case.
func (r *Resolver) namespaceSessions(ctx context.Context, ns string, fresh bool) (live []store.Session, reused bool, err error) {
	reuse := r.cfg.SessionsReuse
	if reuse <= 0 {
		live, err = r.st.NamespaceSessions(ctx, ns)
		return live, false, err
	}
	now := r.clock.Now()
	r.liveMu.Lock()
	l, ok := r.live[ns]
	if !fresh && ok && (now.Sub(l.at) < reuse || l.listing) {
		r.liveMu.Unlock()
		return l.sessions, true, nil
	}
	if ok {
		l.listing = true
		r.live[ns] = l
	}
	r.liveMu.Unlock()
	live, err = r.st.NamespaceSessions(ctx, ns)
	r.liveMu.Lock()
	defer r.liveMu.Unlock()
	if err != nil {
		if l, ok := r.live[ns]; ok {
			l.listing = false
			r.live[ns] = l
		}
		return nil, false, err
	}
	if r.live == nil || len(r.live) >= maxLiveLists {
		r.live = make(map[string]liveList)
	}
	r.live[ns] = liveList{at: now, sessions: live}
	return live, false, nil
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

// refusal is a refused route of a name, kept for its next miss.
type refusal struct {
	at clock.Instant
	// stale: the holder answered 503 stale to a route of this session and
	// epoch. When the store still names exactly that placement, the holder
	// has no instance under it and will not activate one (its instance
	// closed and the release did not take effect): the miss renews the
	// placement's epoch on the same session (store.RenewPlacement).
	stale   bool
	session string
	epoch   uint64
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
	cache, err := placecache.New[cachedRoute](placecache.Config{
		Name:       "placements",
		Shards:     cfg.CacheShards,
		MaxEntries: cfg.CacheMaxEntries,
		TTL:        cfg.CacheTTL,
		Clock:      cfg.Clock,
		Metrics:    cfg.Metrics,
		// Negative (off) becomes zero: GetAhead never asks.
		RefreshAhead: max(cfg.RefreshAhead, 0),
	})
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	r := &Resolver{
		cfg:         cfg,
		st:          cfg.Store,
		cache:       routeCache{c: cache, h: newHandles()},
		clock:       clock.Or(cfg.Clock),
		fastTime:    cfg.Clock == nil,
		log:         cfg.Logger.With("logger", "pinned.placement"),
		errLog:      logthrottle.Every{Interval: time.Second},
		flights:     make(map[string]*flight),
		sessions:    make(map[string]*session),
		unusable:    make(map[string]struct{}),
		refused:     make(map[string]refusal),
		served:      make(map[string]clock.Instant),
		checks:      make(map[string]struct{}),
		watched:     make(map[string]int),
		wake:        make(chan struct{}, 1),
		refreshKick: make(chan struct{}, 1),
		refreshQ:    make(chan string, cfg.Refreshers),
		probeQ:      make(chan *proxy.Session, maxProbesQueued),
		probes:      make(map[string]*probeState),
		dead:        make(map[string]clock.Instant),
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
// without blocking or touching the store, and without allocating except
// when the route is due for a refresh (at most once per cache lifetime per
// name: the name is copied into Run's queue, see refresh.go). now is the
// request's time (fasthttp's RequestCtx.Time), converted by
// clock.FromTime; with an injected Config.Clock, that clock is read
// instead.
func (r *Resolver) Lookup(name []byte, now time.Time) (proxy.Route, bool) {
	var at clock.Instant
	if r.fastTime {
		at = clock.FromTime(now)
	} else {
		at = r.clock.Now()
	}
	rt, ok, refresh := r.cache.GetAhead(name, at)
	if ok && rt.Session.LeaseEndedBy(at.Wall()) {
		// The holder's lease has ended as far as the store last said: ask
		// the store again rather than route to a session that may be gone.
		return proxy.Route{}, false
	}
	if refresh {
		r.queueRefresh(name)
	}
	return rt, ok
}

// Resolve implements proxy.Resolver: the route of name, read from the store
// (placing the instance if needed, see docs/placement.md) unless it was cached
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
	if rt, ok := r.cache.Peek(name, now); ok && !rt.Session.LeaseEndedBy(now.Wall()) {
		return rt, nil
	}
	return r.miss(name)
}

// Refused implements proxy.Resolver: the session of rt refused the request
// for name (503 closing, draining, lease or stale, 403 forbidden) or could
// not be reached. The cached route is dropped if it still names rt's
// session, so the next Resolve consults the store, which either confirms the
// holder (the 503 reaches the client) or finds its session gone and places
// the instance elsewhere. That next miss reads the placement through the
// store's client-side cache (see recheck); after a stale refusal it renews
// the placement's epoch when the store still names the refused one (see
// refusal). The session is also passed over for new placements for
// AvoidFor. Refused does no I/O.
func (r *Resolver) Refused(name []byte, rt proxy.Route, reason string) {
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
	r.noteRefusedLocked(string(name), refusal{at: now, stale: reason == wire.ReasonStale, session: rt.Session.ID, epoch: rt.Epoch})
	if reason == wire.ReasonUnreachable && r.cfg.ConfirmDeath != nil {
		r.requestProbeLocked(rt.Session, now)
	}
	r.mu.Unlock()
}

// noteRefusedLocked remembers that name's route was refused at now, for
// its next miss (recheck); r.mu is held. When MaxRefusedNames are
// remembered already, a few of them are probed and one older than CacheTTL
// (refused, then never asked for again) makes room; else name is not
// remembered and its next miss is an ordinary one.
func (r *Resolver) noteRefusedLocked(name string, rf refusal) {
	now := rf.at
	if _, ok := r.refused[name]; !ok && len(r.refused) >= r.cfg.MaxRefusedNames {
		const probes = 8
		n := 0
		for k, old := range r.refused {
			if now.Sub(old.at) >= r.cfg.CacheTTL {
				delete(r.refused, k)
				break
			}
			if n++; n == probes {
				return
			}
		}
		if len(r.refused) >= r.cfg.MaxRefusedNames {
			return
		}
	}
	r.refused[name] = rf
}

// recheck reports whether the proxy refused key's route within CacheTTL
// (and how) and forgets it: that miss reads the placement through the store's
// client-side cache rather than LookupOrClaim. The requests for a dead or
// fenced worker's ids are refused again and again until its session
// expires in the store; each such re-read then costs no Redis round trip
// (the first fills the client-side cache, which Redis keeps current), and
// the claim that LookupOrClaim saves a round trip for is not expected: the
// name was placed a moment ago.
func (r *Resolver) recheck(key string) (refusal, bool) {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	rf, ok := r.refused[key]
	if ok {
		delete(r.refused, key)
	}
	return rf, ok && now.Sub(rf.at) < r.cfg.CacheTTL
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
//     session's death is learnt lazily (docs/placement.md).
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
// (store.CachedLookups). A recheck (fresh) asks the server itself
// (store.FreshLookups): the route it re-resolves was just refused, and a
// client-side copy may not yet have seen the write that a refusal
// follows (this pinboard's own renewal among them), so deciding on it
// would renew or take over a placement already superseded.
func (r *Resolver) readPlacement(ctx context.Context, ns, id string, fresh bool) (store.Placement, time.Time, error) {
	if fl, ok := r.st.(store.FreshLookups); ok && fresh {
		pl, err := fl.LookupFresh(ctx, ns, id)
		return pl, r.freshUntil(), err
	}
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
	// A recheck (the proxy could not reach the holder, or it refused the
	// route) reads the holder's session itself rather than trust a reused
	// list, which may still hold a session that deregistered a moment ago
	// and would send the request back to it (holderSession).
	rf, rechecking := r.recheck(key)
	live, reused, err := r.namespaceSessions(ctx, ns, false)
	if err == nil && reused && len(live) == 0 {
		live, reused, err = r.namespaceSessions(ctx, ns, true) // a worker may have registered since
	}
	if err != nil {
		return proxy.Route{}, r.storeErr(key, "cannot list the namespace's sessions", err)
	}
	if len(live) == 0 {
		// Any holder would be dead (a live holder serves ns): no
		// placement read, so requests for unserved namespaces cost Redis
		// nothing beyond the cached membership reads.
		return proxy.Route{}, r.unserved(ctx, key, ns)
	}
	r.sawServed(ns)
	var (
		pl    store.Placement
		until time.Time
		c     string
		sess  *proxy.Session
		claim bool // c may take the id: read or claim in one step
	)
	if !rechecking {
		c, sess, claim = r.candidate(live, "")
		if !claim && reused {
			// No session of the reused list may take a new id: a worker
			// may have registered, or come back from full, since.
			if live, _, err = r.namespaceSessions(ctx, ns, true); err != nil {
				return proxy.Route{}, r.storeErr(key, "cannot list the namespace's sessions", err)
			}
			if len(live) == 0 {
				return proxy.Route{}, r.unserved(ctx, key, ns)
			}
			c, sess, claim = r.candidate(live, "")
		}
	}
	if claim {
		// The session a new placement would go to is chosen before the
		// read, so that the read claims the id for it when nobody holds
		// it: a cold activation is one store call (one round trip on
		// Redis), and the claim's reply is the result, never re-read (a
		// cached read right after a write can be stale: rueidis#534).
		p, claimed, err := r.st.LookupOrClaim(ctx, ns, id, c)
		if err != nil {
			return proxy.Route{}, r.storeErr(key, "cannot claim the placement", err)
		}
		if claimed {
			return r.claimed(name, tok, ns, id, c, sess, p), nil
		}
		pl, until = p, r.freshUntil()
	} else if pl, until, err = r.readPlacement(ctx, ns, id, rechecking); err != nil {
		// The proxy refused the name's route (recheck), or no session may
		// take a new id (all draining, say) but a holder may still serve
		// this one: a read only, through the store's client-side cache.
		return proxy.Route{}, r.storeErr(key, "cannot read the placement", err)
	}
	// pick chooses the session for a new placement; when a reused list has
	// none, the sessions are read again first (a worker may have
	// registered since: the list can be older than SessionsReuse while a
	// listing is in flight). exclude is a holder found gone, which a reused
	// list may still offer.
	pick := func(exclude string) (string, *proxy.Session, error) {
		if reused {
			if c, sess, ok := r.candidate(live, exclude); ok {
				return c, sess, nil
			}
			var err error
			if live, reused, err = r.namespaceSessions(ctx, ns, true); err != nil {
				return "", nil, r.storeErr(key, "cannot list the namespace's sessions", err)
			}
		}
		return r.pick(ns, live, exclude)
	}
	for range maxRounds {
		if pl.Session == "" {
			// A placement read before is gone (a lost replace, or the
			// read-only path above): claim it. The first claim wins; a
			// loser learns the winner from the reply.
			c, sess, err := pick("")
			if err != nil {
				return proxy.Route{}, err
			}
			p, claimed, err := r.st.LookupOrClaim(ctx, ns, id, c)
			if err != nil {
				return proxy.Route{}, r.storeErr(key, "cannot claim the placement", err)
			}
			if claimed {
				return r.claimed(name, tok, ns, id, c, sess, p), nil
			}
			r.m.claimsLost.Inc()
			pl, until = p, r.freshUntil()
			continue
		}
		holder := pl.Session
		sess, gone, err := r.holderSession(ctx, key, holder, live, rechecking)
		if err != nil {
			return proxy.Route{}, err
		}
		if !gone && r.awaitDeath(ctx, holder) {
			// The proxy could not reach the holder (this request, or
			// another one a moment before), and its death probe proved the
			// process gone and ended its session: take over.
			gone = true
			r.m.fastFailovers.Inc()
		}
		if !gone && rf.stale && rf.session == holder && rf.epoch == pl.Epoch {
			// The holder refused this very placement as stale: it has no
			// instance under the epoch and will not activate one. A new
			// epoch on the same session lets it (the compare-and-set
			// fails, answering the placement that holds, when the read
			// above was stale itself).
			rf.stale = false
			got, err := r.st.RenewPlacement(ctx, ns, id, holder, pl.Epoch)
			if err != nil {
				return proxy.Route{}, r.storeErr(key, "cannot renew the placement", err)
			}
			r.m.renewals.Inc()
			r.log.Debug("placement renewed: its holder refused the epoch as stale", "namespace", ns, "instance", id,
				"session", holder, "epoch", pl.Epoch, "now", got.Epoch)
			pl, until = got, r.freshUntil()
			continue
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
		c, sess, err := pick(holder)
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
			r.cache.PutUntil(name, rt, tok, r.freshUntil())
			return rt, nil
		}
		r.m.replacesLost.Inc()
		pl, until = got, r.freshUntil()
	}
	return proxy.Route{}, r.storeErr(key, "placement kept changing", fmt.Errorf("%d rounds", maxRounds))
}

// claimed records a placement this resolver wrote for session c and caches
// its route (unless an invalidation of the name's shard came after tok).
func (r *Resolver) claimed(name []byte, tok placecache.Token, ns, id, c string, sess *proxy.Session, p store.Placement) proxy.Route {
	r.m.claimsWon.Inc()
	r.placed(c)
	r.log.Debug("instance placed", "namespace", ns, "instance", id, "session", c, "epoch", p.Epoch)
	rt := proxy.Route{Session: sess, Epoch: p.Epoch}
	r.cache.PutUntil(name, rt, tok, r.freshUntil())
	return rt
}

// freshUntil is until when a placement the store just had from its server
// (not from a cache of its own) is cached: CacheTTL less a random fifth at
// most, so that names first resolved together (a pinboard's first second
// of traffic, a burst of new ids) are not all re-read together at every
// later TTL.
func (r *Resolver) freshUntil() time.Time {
	ttl := r.cfg.CacheTTL
	return r.clock.Now().Wall().Add(ttl - time.Duration(r.cfg.Rand(int64(ttl/5+1))))
}

// holderSession returns the holder's session, or gone when the store no
// longer has it. verify reads the session from the store even when live
// lists it (a recheck: live may be a reused list, older than the holder's
// deregistration).
func (r *Resolver) holderSession(ctx context.Context, key, holder string, live []store.Session, verify bool) (sess *proxy.Session, gone bool, err error) {
	r.mu.Lock()
	_, dead := r.dead[holder]
	r.mu.Unlock()
	if dead {
		// A death probe ended it; a read that began before may still list it.
		return nil, true, nil
	}
	for i := range live {
		if !verify && live[i].ID == holder {
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

// pick chooses a session for a new placement among live, other than
// exclude, and returns its id and proxy session, or the no-worker error.
func (r *Resolver) pick(ns string, live []store.Session, exclude string) (string, *proxy.Session, error) {
	if c, sess, ok := r.candidate(live, exclude); ok {
		return c, sess, nil
	}
	return "", nil, r.noWorker(ns)
}

// candidate is pick without the error: false when no session in live may
// take a new placement.
func (r *Resolver) candidate(live []store.Session, exclude string) (string, *proxy.Session, bool) {
	for range len(live) {
		i := r.choose(live, exclude)
		if i < 0 {
			break
		}
		sess, err := r.sessionFor(&live[i])
		if err == nil {
			return live[i].ID, sess, true
		}
	}
	return "", nil, false
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
	if _, dead := r.dead[s.ID]; dead {
		// Ended by a death probe; a read that began before may still list it.
		return nil, fmt.Errorf("worker session %s: %w (its process is gone)", s.ID, proxy.ErrNoWorker)
	}
	if e := r.sessions[s.ID]; e != nil {
		r.noteLeaseEnd(e.s, s)
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
	r.noteLeaseEnd(ps, s)
	r.sessions[s.ID] = &session{s: ps, hb: s.LastHeartbeat}
	r.cache.h.add(ps)
	return ps, nil
}

// minLeaseAhead is the least a live session's lease is taken to have left
// when the store has just called it live (noteLeaseEnd).
const minLeaseAhead = 500 * time.Millisecond

// noteLeaseEnd records on ps when the lease of s, which the store has just
// reported live, ends: its expiry as the store says, but no sooner than
// minLeaseAhead from now. The expiry was computed on the clock of the
// pinboard that took its last heartbeat; on a pinboard whose clock runs
// ahead it may look past while the store still holds the session, and the
// floor keeps such a pinboard from asking the store again on every request
// (at most twice a second per session). A lease that did end is noticed at
// most that much later: the request then asks the store, which no longer
// holds the session.
func (r *Resolver) noteLeaseEnd(ps *proxy.Session, s *store.Session) {
	if s.ExpiresAt <= 0 {
		return
	}
	end := time.UnixMilli(s.ExpiresAt)
	if floor := r.clock.Now().Wall().Add(minLeaseAhead); end.Before(floor) {
		end = floor
	}
	ps.SetLeaseEnd(end)
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
// pool once nothing uses it). Routes cached with it read as misses from
// now on (routeCache): the next request for one of its ids asks the store.
func (r *Resolver) dropSession(sid, reason string) {
	r.mu.Lock()
	e, known := r.sessions[sid]
	delete(r.sessions, sid)
	delete(r.unusable, sid)
	r.mu.Unlock()
	if known {
		r.cache.h.drop(e.s)
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

// sawServed records that ns has a live session now.
func (r *Resolver) sawServed(ns string) {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.served[ns]; !ok && len(r.served) >= maxNamespaces {
		for k, at := range r.served {
			if now.Elapsed(at, r.cfg.NamespaceMemory) {
				delete(r.served, k)
			}
		}
		if len(r.served) >= maxNamespaces {
			return // full of recent ones: the store still remembers ns
		}
	}
	r.served[ns] = now
}

// unserved is the error for a namespace no live session serves: no_worker
// when it was served recently (this resolver saw a live session within
// NamespaceMemory, or the store still has one of its sessions), else
// unknown_namespace.
func (r *Resolver) unserved(ctx context.Context, key, ns string) error {
	r.mu.Lock()
	at, seen := r.served[ns]
	r.mu.Unlock()
	if seen && !r.clock.Now().Elapsed(at, r.cfg.NamespaceMemory) {
		return r.noWorker(ns)
	}
	known, err := r.st.NamespaceKnown(ctx, ns)
	if err != nil {
		return r.storeErr(key, "cannot read the namespace", err)
	}
	if known {
		return r.noWorker(ns)
	}
	r.m.unknownNamespace.Inc()
	return fmt.Errorf("namespace %s: %w", ns, proxy.ErrUnknownNamespace)
}

func (r *Resolver) noWorker(ns string) error {
	r.m.noWorker.Inc()
	return fmt.Errorf("no eligible worker for %s: %w", ns, proxy.ErrNoWorker)
}

func (r *Resolver) storeErr(key, what string, err error) error {
	r.m.storeErrors.Inc()
	r.warnStore(err, "cannot resolve placement", "name", key, "err", fmt.Sprintf("%s: %v", what, err))
	if store.IsConnecting(err) { // the proxy logs the failure quietly too
		return fmt.Errorf("placement %s: %s: %w (%w)", key, what, err, proxy.ErrNotReady)
	}
	return fmt.Errorf("placement %s: %s: %w", key, what, err)
}

// warnStore logs a failed store call: a warning at most once a second, or
// DEBUG while the store is still making its first connection
// (store.IsConnecting: nothing has failed yet). args follow slog's rules.
func (r *Resolver) warnStore(err error, msg string, args ...any) {
	switch {
	case store.IsConnecting(err):
		r.log.Debug(msg+" (store not connected yet)", args...)
	case r.errLog.Allow():
		r.log.Warn(msg, args...)
	}
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
	clear(r.refused)
	r.mu.Unlock()
	r.cancel()
	r.cache.InvalidateAll()
}
