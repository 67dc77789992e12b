// Package placement is the pinboard's proxy.Resolver: it maps a placement
// name "/<namespace>/<id>" to a proxy.Route, the worker session that holds
// the instance, placing the instance on a worker when nobody holds it. It
// sits between the proxy and the store: a placecache of routes in front (so
// that a proxied request in steady state costs no store round trip), the
// store behind (sessions and placements; Redis or memory).
//
// docs/placement.md is the mechanism step by step: wiring, a request, the
// steps of a miss, choosing a worker (power of two choices by headroom),
// invalidations, dead workers learnt lazily, the cache's lifetime and
// refresh-ahead. This doc states the ownership rules and the invariants.
//
// # Ownership
//
// Dependencies point one way: this package uses package proxy's types
// (Session, Route, ErrNoWorker) and never calls the proxy. The proxy owns
// the connection pools (it attaches one to each Session); what Run learns
// about watched placements that moved goes out through Config.OnMoved
// (internal/pinboard wires it to proxy.Proxy.CloseTunnels). Per worker
// session the resolver keeps one *proxy.Session, made on first use, and a
// handle for it (routecache.go): the placecache holds routes as a handle
// and an epoch, no pointer, so its tables live outside the Go heap; a
// handle dies with its session's drop and is never reused, so a route
// cached for a dropped session reads as a miss. The
// store calls OnInvalidate (on Redis from a connection's reader goroutine):
// it is fast and never calls the store.
//
// # Invariants
//
//   - Lookup (and Resolve on a hit) allocates nothing, except the name's
//     copy for a due refresh (once per entry), and takes only its cache
//     shard's read lock (and, for a due refresh, the refresh list's mutex
//     for an append; it wakes a goroutine only for the first name of a
//     batch, RefreshBatch). r.mu (misses in flight, sessions) is never
//     taken on a hit, and never held across a store call or a network call
//     (memstore calls OnInvalidate from the writer's goroutine).
//   - Concurrent misses of one name share one store read; each is bounded
//     by ResolveTimeout.
//   - Every route to a session carries the same *proxy.Session until the
//     session is forgotten; the resolver never calls into package proxy.
//   - A value is cached only from a store read that began after the last
//     invalidation of its cache shard; no entry is served past CacheTTL
//     after Redis (or memstore) last answered for it. A refresh extends an
//     entry only when the server names the same live session and epoch,
//     and never places an instance.
//   - A placement is written only by LookupOrClaim (SET NX), Replace
//     (compare-and-set from a session the store reported gone) and
//     RenewPlacement (same session, new epoch, after that session refused
//     exactly that placement as stale); the resolver never deletes a live
//     session's placement or moves it to another session. A claim's result
//     is taken from the store's reply, never from a re-read.
//   - A session found gone is forgotten (its record, not the routes cached
//     with it). Run, its refresh batcher, its refreshers and its death
//     probers (which Run waits for) are the only goroutines the package
//     starts; they end when Run's
//     ctx ends or Close is called; OnMoved runs on Run's.
//   - A session is ended before its lease only after Config.ConfirmDeath
//     proved its process gone (never on a timeout); a cached route is not
//     served past its session's lease end as the store last said.
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
// Logs: logger=pinned.placement, store errors at most once a second.
// Metrics (Config.Metrics, or Resolver.Metrics): docs/metrics.md.
package placement
