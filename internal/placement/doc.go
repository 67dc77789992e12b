// Package placement is the pinboard's proxy.Resolver: it maps a placement
// name "/<namespace>/<id>" to the endpoint of the worker session that holds
// the instance, placing the instance on a worker when nobody holds it. It
// sits between the proxy and the store: a placecache in front (so that a
// proxied request in steady state costs no store round trip), the store
// behind (sessions and placements; Redis or memory), and one proxy.Endpoint
// per worker session (its secret, address and connection pool), made on
// first use and reused by every request until the session is known dead.
//
// It lives beside the proxy rather than inside it so that package proxy
// stays a forwarding core with no dependency on the store (proxytest.Static
// resolves its tests), and this package holds every placement decision.
//
// # Using it
//
//	r, err := placement.New(placement.Config{Store: st, Lease: lease})
//	// st's OnInvalidate → r.OnInvalidate (internal/pinboard wires it)
//	px, err := proxy.New(proxy.Config{Resolver: r})
//	go r.Run(ctx)   // tunnel checks, sweep of dead sessions' endpoints
//	...             // serve px; on shutdown: server, px.Close(), then r.Close()
//
// # A request
//
// Resolve looks the name up in the placecache with the request's own time
// (fasthttp's RequestCtx.Time, converted by clock.FromTime, so no second
// clock read; an injected Config.Clock replaces it in tests). A hit returns
// the endpoint: no allocation, no lock shared by all requests, no store
// call, no goroutine. A miss goes to the store; concurrent misses of one
// name share one store read (single-flight), and each miss is bounded by
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
//  3. Placement(ns, id): the holder, or "".
//  4. No holder: choose a session (below) and Claim (SET NX). The reply
//     names the holder afterwards, ours or the winner's of a concurrent
//     claim from any pinboard: the result is taken from the reply and never
//     re-read, because a cached read right after one's own write can be
//     stale (rueidis#534: the invalidation trails the reply).
//  5. A holder among the live sessions: its endpoint. A holder not among
//     them: Session(holder) decides. Still there (the namespace list
//     lagged): its endpoint. Gone (store.ErrUnknownSession: its lease ran
//     out in the store): its endpoint is closed and the placement is taken
//     over with Replace (compare-and-set from the dead session), again
//     taking the holder from the reply. Lost races loop, at most four
//     rounds.
//  6. placecache.Put with the token of step 1: refused if any invalidation
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
// have an advertise URL the proxy can use (http). They fall into tiers, best
// first: room and not recently refused; room but refused within AvoidFor
// (the proxy reported a refusal or an unreachable worker through Invalidate);
// no room; no room and refused. Within the best non-empty tier, power of two
// choices: two at random, the one with more headroom wins. The headroom is
// the last heartbeat's minus the placements this resolver made on the
// session since that heartbeat, so a burst of new ids spreads instead of
// herding onto the worker that looked roomiest. A worker that reports
// headroom 0 thus gets no new placement while another eligible worker has
// room (SPEC §6). Claim does not check that the chosen session is still
// live: a session that expires between NamespaceSessions and Claim ends up
// holding the placement; its host (gone, or fenced) fails the requests, the
// proxy calls Invalidate, and the next miss finds the session gone and
// replaces the placement.
//
// # Invalidations
//
// The store reports changes through OnInvalidate (on Redis: rueidis
// client-side caching in OPTIN mode, on a connection's reader goroutine, so
// the callback is fast and never calls the store; with the memory store:
// synchronously from the writer):
//
//   - {Placement: name}: placecache.Invalidate(name). When WebSocket tunnels
//     of the name are open, Run re-reads the placement and closes them on
//     every session that no longer holds it (Endpoint.CloseTunnelsFor). A
//     new tunnel is checked the same way as soon as it opens
//     (proxy.TunnelObserver, which also tells the resolver which names have
//     tunnels); the check's read makes Redis track the key again.
//   - {All: true} (connection loss, FLUSHALL): placecache.InvalidateAll, and
//     every name with open tunnels is checked again (a lost connection ends
//     tracking; the re-read restores it).
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
// demand: the proxy calls Invalidate when a worker is unreachable or refuses
// with closing, draining or lease; the next Resolve re-reads the placement
// and the holder's session. While the session is live in the store the
// holder is confirmed and the client gets 503 with Retry-After (a worker's
// ids are re-placed only after its lease expired in the store: it may still
// be serving them). Once the session is gone, the placement is replaced and
// the old endpoint closed; every other cached placement on it then meets a
// closed endpoint, which makes the proxy re-resolve too. Run's sweep
// (SweepInterval) closes endpoints of dead sessions that no request touches.
//
// The cache TTL (CacheTTL, at most the lease) is the safety net for a lost
// invalidation; each hot placement is therefore re-read once per TTL (on
// Redis usually a client-side cache hit for the sessions, one GET for the
// placement). The TTL counts from the server's answer, not from the last
// read of a cache: a placement the store served from its own client-side
// cache (store.CachedPlacements) is kept only until that cache would ask the
// server again, so the two caches together never serve a value longer than
// one TTL after Redis last confirmed it.
//
// # Invariants
//
//   - Resolve on a hit allocates nothing and takes only its cache shard's
//     read lock. r.mu (misses in flight, session endpoints) is never taken on
//     a hit, and never held across a store call, a network call or a call
//     into the proxy that takes a lock (memstore calls OnInvalidate from the
//     writer's goroutine).
//   - A value is cached only from a store read that began after the last
//     invalidation of its cache shard; no entry is served past CacheTTL
//     after Redis (or memstore) last answered for it.
//   - A placement is written only by Claim (SET NX) and Replace
//     (compare-and-set from a session the store reported gone); the resolver
//     never deletes or overwrites a live session's placement.
//   - Every endpoint the resolver made is closed when its session is found
//     gone, or by Close. Run is the only goroutine the package starts; it
//     ends when its ctx ends or Close is called.
//
// # Callers must not assume
//
//   - that an endpoint returned by Resolve is open: it may have been closed
//     since (the proxy checks and re-resolves);
//   - that pinned_placement_claims_total{result="won"} counts claims this
//     pinboard won: it counts claims after which the chosen session holds the
//     placement, which another pinboard may have claimed for the same
//     session first;
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
// pinned_placement_replaces_total{result}, pinned_placement_no_worker_total,
// pinned_placement_store_errors_total, pinned_placement_invalidates_total,
// pinned_placement_sessions_closed_total, pinned_placement_tunnel_checks_total,
// pinned_placement_tunnel_checks_dropped_total and the gauge
// pinned_placement_endpoints.
package placement
