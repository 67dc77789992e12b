// Package memstore is the in-memory implementation of store.Store, used by
// `pinboard -dev` and by unit tests. It has the same observable semantics as
// redisstore (one conformance suite, storetest, runs against both): leases on
// an injected clock, owner-checked heartbeats that never re-create a session,
// supersede-by-clientId-or-URL, exactly-once take-all message queues,
// SET NX / compare-and-set / compare-and-delete placements under epochs
// allocated as redisstore does (wire.NextEpoch of the id's last epoch and
// the store's clock), a placement index per session that Reap uses to
// collect dead sessions' placements, and alarms in per-shard maps
// (alarms.go; claims scan a shard, which suits `pinboard -dev`, not large
// alarm sets).
//
// # Invariants
//
//   - All state lives behind one mutex; every method is atomic with respect
//     to every other. OnInvalidate is called after the mutex is released, so
//     the change it reports is already visible to any reader, and the
//     callback may read the store (the store.Options rule "must not call back
//     into the store" exists for Redis and is harmless here). It runs
//     synchronously on the caller's goroutine, inside the mutating call
//     (Claim calls OnInvalidate before it returns): a caller must not hold a
//     lock that its OnInvalidate takes while it calls the store. (Redis
//     calls it later, from a reader goroutine.)
//   - A session is live while clock.Now().Elapsed(anchor, lease) is false,
//     where anchor is the instant of its Register or last Heartbeat (so a
//     machine suspend counts, as everywhere in pinned). Reads check this
//     inline: correctness never depends on the background reaper.
//   - Used nonces (UseNonce) and session slots per token (ReserveSlot)
//     live in maps behind the same mutex, each entry with its own expiry;
//     expired entries are dropped by Reap and, for nonces, whenever the map
//     has doubled since the last sweep, so memory stays bounded by the
//     rate of use times the TTL.
//   - Each placement name's last epoch lives in a map behind the same
//     mutex, stamped when it was allocated or its placement released;
//     Reap drops those older than the epoch TTL, so memory stays bounded by
//     the ids placed within one TTL.
//   - Deregister makes a session dead at once (a zero lease from now), so
//     every read treats it as expired and Reap collects it after its grace.
//   - Expired sessions stay in memory, invisible to every read, until Reap
//     collects them (after its grace), exactly like their Redis index entries.
//   - Invalidations: every change calls OnInvalidate directly (claim,
//     LookupOrClaim that claims, replace, release, reap → Placement, the
//     caller included: unlike Redis, memstore does not know who read what;
//     register, heartbeat, supersede, expiry → Session; Flush → All). Expiry is reported by [Store.Expire],
//     which the reaper goroutine started by [Store.Start] calls when the
//     earliest lease runs out; without Start, expiry is still enforced on
//     every read but not announced.
//
// Lifecycle: New does nothing but allocate; Start starts the one reaper
// goroutine; Close stops it, waits for it, and makes every later call fail
// with store.ErrClosed. Close is idempotent.
package memstore
