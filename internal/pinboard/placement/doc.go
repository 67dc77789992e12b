// Package placement is the pinboard's proxy.Resolver: it maps a placement
// name "/<namespace>/<id>" to a proxy.Route, the worker session that holds
// the instance, placing the instance on a worker when nobody holds it. It
// sits between the proxy and the store: a placecache of routes in front (so
// that a proxied request in steady state costs no store round trip), the
// store behind (sessions and placements; Redis or memory). Per worker
// session it keeps one *proxy.Session (id, secret, advertise URL), made on
// first use and carried by every route to the session, and its own
// bookkeeping (placements made since the last heartbeat, last refusal).
//
// Dependencies point one way: this package uses package proxy's types
// (Session, Route, ErrNoWorker) and never calls the proxy. The proxy owns
// the connection pools (it attaches one to each Session); what Run learns
// about watched placements that moved goes out through Config.OnMoved
// (internal/pinboard wires it to proxy.Proxy.CloseTunnels). It lives beside
// the proxy rather than inside it so that package proxy stays a forwarding
// core with no dependency on the store (proxytest.Static resolves its
// tests), and this package holds every placement decision.
//
// # Using it
//
//	var px *proxy.Proxy
//	r, err := placement.New(placement.Config{Store: st, Lease: lease,
//		OnMoved: func(name, holder string) { px.CloseTunnels(name, holder) }})
//	// st's OnInvalidate → r.OnInvalidate (internal/pinboard wires it)
//	px, err = proxy.New(proxy.Config{Resolver: r})
//	go r.Run(ctx)   // tunnel checks, sweep of dead sessions
//	...             // serve px (and run px.Run); on shutdown: server, px.Close(), then r.Close()
//
// # A request
//
// Lookup finds the name in the placecache at the request's own time
// (fasthttp's RequestCtx.Time, which the proxy passes, converted by
// clock.FromTime, so no second clock read; an injected Config.Clock replaces
// it in tests). A hit returns the route: no allocation, no lock shared by
// all requests, no store call, no goroutine. On a miss the proxy calls
// Resolve, which looks once more (uncounted: another request may have
// filled it) and otherwise goes to the store; concurrent misses of one name
// share one store read (single-flight), and each miss is bounded by
// ResolveTimeout (the request's context only ends at server shutdown).
//
// # A miss
//
//  1. placecache.Begin(name): the shard's invalidation sequence is captured
//     before any store read.
//  2. NamespaceSessions(ns): the live sessions serving the namespace (on
//     Redis, read through the client-side cache). None: ErrNoWorker (503
//     no_worker), without reading the placement, so requests for
//     namespaces nobody serves cost Redis nothing.
//  3. The session a new placement would go to is chosen first (below),
//     then LookupOrClaim(ns, id, that session) reads the placement and,
//     when nobody holds the id, claims it for that session (SET NX under a
//     new epoch) in the same store call: on Redis one round trip, which
//     leaves the placement tracked for this pinboard (a later change reaches
//     OnInvalidate) without telling it of its own claim, so a cold
//     activation costs one round trip and its route stays cached
//     (cost_test.go pins both). The result is taken from the reply and
//     never re-read, because a cached read right after one's own write can
//     be stale (rueidis#534). The placement is only read instead (Lookup,
//     through the store's client-side cache) when the proxy refused the
//     name's route since its last miss (Refused: a dead or fenced holder's
//     ids are asked for again and again until its session expires, and
//     each such re-read then costs no round trip; at most MaxRefusedNames
//     such names wait), or when no session may take a new id (all
//     draining, say) but a holder may still serve it.
//  4. Claimed: the chosen session's route. Another holder (placed
//     already, or just now by a concurrent claim from any pinboard) among
//     the live sessions: its route.
//  5. A holder not among them: Session(holder) decides. Still there (the
//     namespace list lagged): its route. Gone (store.ErrUnknownSession: its
//     lease ran out in the store): the session is forgotten and the
//     placement is taken over with Replace (compare-and-set from the dead
//     session), again taking the holder from the reply; a placement gone by
//     then is claimed with LookupOrClaim. Lost races loop, at most four
//     rounds.
//  6. After a stale refusal (the holder answered 503 stale to a route of
//     exactly the placement the store still names: its instance closed
//     there and the release did not take effect, so it will not activate
//     one under that epoch), RenewPlacement gives the placement a new
//     epoch on the same session (compare-and-set on session and epoch; a
//     lost race answers the placement that holds). The holder stays the
//     same, so no other worker can come to hold the id meanwhile.
//  7. placecache.Put with the token of step 1: refused if any invalidation
//     touched the name's shard since (the second-level-cache race: a value
//     read before an invalidation is never cached after it; Lettuce #3481).
//     A refused Put only costs the next request another miss.
//
// Store errors and a miss that runs out of time answer 503 store (with
// Retry-After); no eligible worker answers 503 no_worker.
//
// # Choosing a worker
//
// Eligible sessions are live, verified, not superseded, not draining, and
// have an advertise URL the proxy can use (wire.ParseAdvertiseURL). They
// fall into tiers, best first: room and not recently refused; room but
// refused within AvoidFor (the proxy reported a refusal or an unreachable
// worker through Refused);
// no room; no room and refused. Within the best non-empty tier, power of two
// choices: two at random, the one with more headroom wins. The headroom is
// the last heartbeat's minus the placements this resolver made on the
// session since that heartbeat, so a burst of new ids spreads instead of
// herding onto the worker that looked roomiest. A worker that reports
// headroom 0 thus gets no new placement while another eligible worker has
// room. A claim does not check that the chosen session is still
// live: a session that expires between NamespaceSessions and the claim ends up
// holding the placement; its host (gone, or fenced) fails the requests, the
// proxy calls Refused, and the next miss finds the session gone and
// replaces the placement.
//
// # Invalidations
//
// The store reports changes through OnInvalidate (on Redis: rueidis
// client-side caching in OPTIN mode, on a connection's reader goroutine, so
// the callback is fast and never calls the store; with the memory store:
// synchronously from the writer):
//
//   - {Placement: name}: placecache.Invalidate(name). When the name is
//     watched (proxy.TunnelWatcher: WebSocket tunnels of it are open), Run
//     re-reads the placement and calls Config.OnMoved(name, holder), which
//     closes the name's tunnels on every other session. A newly watched
//     name is checked the same way at once; the check's read makes Redis
//     track the key again.
//   - {All: true} (connection loss, FLUSHALL): placecache.InvalidateAll, and
//     every watched name is checked again (a lost connection ends tracking;
//     the re-read restores it).
//   - {Session: id}: ignored. It arrives on every heartbeat (the session
//     hash is rewritten every few seconds per worker); dropping the worker's
//     placements on it would cost store reads for every one of its ids at
//     every heartbeat.
//
// # Dead workers, learnt lazily
//
// The proxy does not need to learn of a session's death eagerly for safety:
// a host checks the session header and its lease on every request and
// fences itself (503 lease), and a dead process cannot answer at all. For
// liveness (moving a dead worker's ids elsewhere) the resolver learns on
// demand: the proxy calls Refused when a worker is unreachable, answers 403
// forbidden, or refuses with closing, draining or lease; the next Resolve
// re-reads the placement and the holder's session. While the session is
// live in the store the holder is confirmed and the client gets 503 with
// Retry-After (a worker's ids are re-placed only after its lease expired in
// the store: it may still be serving them). Once the session is gone, the
// placement is replaced and the session forgotten; every other cached route
// to it fails the same way on its next request (a dead process cannot be
// reached, a fenced one answers 503 lease) and is moved in turn, or expires
// with CacheTTL. Run's sweep (SweepInterval) forgets dead sessions that no
// request touches; the proxy's janitor closes their connection pools.
//
// The cache TTL (CacheTTL, at most the lease) is the safety net for a lost
// invalidation; each hot placement is therefore re-read once per TTL (on
// Redis usually a client-side cache hit for the sessions, one round trip of
// LookupOrClaim for the placement). The TTL counts from the server's
// answer, not from the last read of a cache: LookupOrClaim always asks the
// server, and a placement the store served from its own client-side cache
// (the read-only path: store.CachedLookups) is kept only until that cache
// would ask the server again, so the two caches together never serve a
// value longer than one TTL after Redis last confirmed it.
//
// A hot placement does not wait for that re-read: a Lookup that finds its
// entry within RefreshAhead (a quarter of CacheTTL by default) of its
// expiry queues the name, and Run's refreshers re-read it from the server
// while the entry is still served (refresh.go). The entry is extended only
// when the server names the same live session and epoch, from a read that
// began after the shard's last invalidation; otherwise it is dropped and
// the next request takes the ordinary miss path. A refresh never places an
// instance.
//
// # Invariants
//
//   - Lookup (and Resolve on a hit) allocates nothing, except the name's
//     copy for a due refresh (once per entry), and takes only its cache
//     shard's read lock. r.mu (misses in flight, sessions) is never
//     taken on a hit, and never held across a store call or a network call
//     (memstore calls OnInvalidate from the writer's goroutine).
//   - Every route to a session carries the same *proxy.Session until the
//     session is forgotten; the resolver never calls into package proxy.
//   - A value is cached only from a store read that began after the last
//     invalidation of its cache shard; no entry is served past CacheTTL
//     after Redis (or memstore) last answered for it.
//   - A placement is written only by LookupOrClaim (SET NX), Replace
//     (compare-and-set from a session the store reported gone) and
//     RenewPlacement (same session, new epoch, after that session refused
//     exactly that placement as stale); the resolver never deletes a live
//     session's placement or moves it to another session.
//   - A session found gone is forgotten (its record, not the routes cached
//     with it). Run and its refreshers (which Run waits for) are the only
//     goroutines the package starts; they end when Run's ctx ends or Close
//     is called; OnMoved runs on Run's.
//
// # Callers must not assume
//
//   - that the session of a returned route is live: it may have died since
//     (the proxy reports the failure with Refused and re-resolves);
//   - that OnMoved means the holder changed: it reports the holder after
//     every check of a watched name, spurious invalidations included;
//   - that pinned_placement_claims_total{result="lost"} counts every race
//     for a new id this pinboard lost: a miss's first LookupOrClaim that
//     finds the id placed (by another pinboard a moment before, or long
//     ago) is a read, counted nowhere; "won" counts exactly the placements
//     this pinboard wrote;
//   - that ids placed on a worker between the start of its drain and the
//     heartbeat reporting it move away before the worker's session ends:
//     the host answers 503 draining for them, and only the holder's release
//     or expiry frees the placement.
//
// # Observability
//
// Logger tag logger=pinned.placement; store errors are logged at most once a
// second. Metrics (Config.Metrics, or Resolver.Metrics):
// pinned_placecache_{hits,misses,invalidations,evictions,refused_puts}_total
// and pinned_placecache_entries with cache="placements";
// pinned_placement_miss_duration_seconds (classic buckets),
// pinned_placement_shared_misses_total, pinned_placement_claims_total{result},
// pinned_placement_replaces_total{result}, pinned_placement_renewals_total,
// pinned_placement_no_worker_total,
// pinned_placement_store_errors_total, pinned_placement_invalidates_total
// (Refused calls), pinned_placement_sessions_dropped_total,
// pinned_placement_tunnel_checks_total,
// pinned_placement_tunnel_checks_dropped_total and the gauge
// pinned_placement_sessions.
package placement
