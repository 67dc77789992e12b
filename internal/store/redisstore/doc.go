// Package redisstore is the Redis implementation of store.Store (and
// store.Reaper), on rueidis. It works on a single Redis node and on Redis
// Cluster unchanged (the conformance suite runs on both): every command and
// every Lua script touches exactly one key, except the placement scripts,
// whose two keys (the placement and its epoch counter) share a hash tag and
// so a slot, and the alarm scripts (alarms.go), whose keys all belong to one
// alarm shard and share its hash tag {<shard>} (the layout is documented in
// internal/base/wire/keys.go and docs/protocol.md). On a single node
// (a standalone Redis, or the primary Sentinel names; not a cluster:
// rueidis's ClientMode) the claim script also indexes the
// placement in the claiming session's index, a key of another slot; on a
// cluster that index is written by its own script around the claim. It
// needs Redis ≥ 6.2 (RESP3 client tracking, ZADD GT, SET GET, TIME in
// scripts).
//
// # Operations
//
//   - Register: a script creates pinned:s:<sid> (refusing an existing one) with
//     PEXPIRE = lease; then pinned:w, pinned:o:<sid> (the "#<ns>" count fields,
//     so the janitor later knows the namespaces) and pinned:n:<ns>; then
//     SET pinned:c:<cid> / pinned:a:<url> PX lease GET, and a supersede script
//     on each previous holder's session hash (sets "sup" only if the hash
//     still exists: it never re-creates a record).
//   - Heartbeat: one owner-checked script on pinned:s:<sid> (unknown → no
//     write; superseded → no write; else update fields and PEXPIRE), then
//     one pipeline: owner-checked PEXPIRE of the client and URL pointers,
//     ZADD XX GT on pinned:w, and the take-all script on pinned:q:<cid>
//     (LRANGE + DEL in one script: each message is handed out exactly once).
//     Two round trips.
//   - LookupOrClaim and Claim, on a single node: one round trip of three
//     commands, EVALSHA of the place script, CLIENT CACHING YES, GET of the
//     placement. The script reads the placement and, when there is none
//     (and the restart fence allows), writes it under a new epoch (SET NX
//     semantics: first claim wins) and adds it to the session's index
//     (HSETNX + HINCRBY on pinned:o:<sid>), atomically: an unindexed
//     placement cannot exist. It returns {claimed, placement}. The GET
//     after it is the read Redis tracks for this connection (OPTIN:
//     CLIENT CACHING YES applies to the next command only), so the caller
//     hears of every later change of the placement but not of the script's
//     own write, and no other key the script touched (epoch counter,
//     index) is tracked (a script run right after CLIENT CACHING YES would
//     track all its keys, on Redis 7.0, and its own SET would invalidate
//     them for the caller). The answer is the GET's value, the one tracking
//     starts from; claimed only if it is what the script wrote. After
//     NOSCRIPT the three are sent again with EVAL; that once, the first
//     attempt's GET tracked the key before the script wrote it, and the
//     caller hears of its own write.
//   - LookupOrClaim and Claim, on a cluster: the place script without the
//     index on pinned:p:{<ns>/<id>}, CLIENT CACHING YES and GET, in one
//     round trip on the placement's node (as on a single node; the three
//     share its slot); then, only when the script wrote the placement, the
//     index add (HSETNX on pinned:o:<sid>, another slot). Two round trips
//     for a new id, one for a placed one; a lost claim writes nothing and
//     has nothing to remove. Claim first, index second keeps the index
//     race-free without a second add (see the race below); the price is
//     that a pinboard dying between the two (or losing the index's node
//     for that moment) leaves a placement its session's index lacks: it
//     routes as any placement, a reader finds its session gone once the
//     session ends and takes it over, but the janitor does not reap it and
//     the session's count is one short until it is released. (The planted
//     bug claim_no_nx, pinned_faults builds only, keeps the older order:
//     a tracked read, then index add and a blind claim pipelined, an index
//     add again after winning, removal after losing.)
//   - Epochs: the claim and replace scripts allocate the new placement's
//     epoch in the same script, from its counter pinned:e:{<ns>/<id>}:
//     max(counter + 1, replaced epoch + 1, TIME in µs) (wire.NextEpoch on
//     Redis's clock), stored back with PX Config.EpochTTL; the placement
//     value is "<epoch> <since ms> <session>", since on Config.Clock. Release
//     (and Reap) raises the counter to the released epoch and restarts its
//     TTL. A lost claim or replace writes neither key. A Redis that lost its
//     data (restart without persistence) also lost the counters: the time
//     floor, taken at least RestartFence after the restart, is above every
//     epoch allocated before it.
//   - Restart fence (Config.RestartFence > 0): the claim and replace scripts
//     read the server's uptime (INFO server, inside the script, on the node
//     that holds the placement, only when about to write) and refuse to
//     write while it is below the fence: a Redis restarted without
//     persistence has lost sessions whose workers may still serve under
//     their leases. The refusal is store.ErrUnavailable wrapping
//     ErrRestartFence (503 store + Retry-After at the proxy); an existing
//     placement is still answered; nothing is indexed (a pipelined index
//     entry is removed again). The INFO costs Redis about 5 µs per claim; it
//     stays, because nothing cheaper tells a restart apart (a marker key
//     comes back with a stale RDB snapshot, LASTSAVE moves with every save).
//   - Replace: index add and compare-and-set (one round trip), index add
//     again, then the loser side (old session, or this one when the swap
//     lost) is unindexed.
//   - Deregister: a script deletes pinned:s:<sid> and returns its client, URL
//     and token; then the client and URL pointers are compare-and-deleted
//     (only while they name this session), the session leaves
//     pinned:t:<tokenId>, and its pinned:w score is set to now, so the
//     janitor collects its placements after its grace. Once the hash is
//     gone every read treats the session as expired.
//   - UseNonce: SET pinned:x:<nonceId> <binding> NX PX ttl, one command: the
//     first of any number of concurrent callers gets OK, every other nil.
//   - ReserveSlot: one script on pinned:t:<tokenId> (ZSET session -> expiry):
//     ZREMRANGEBYSCORE of the expired, ZCARD, and ZADD when below the cap,
//     so concurrent reservations never exceed it. Heartbeat keeps the
//     slot with ZADD XX GT (never re-adding a removed one) and PEXPIRE.
//   - Pipelined scripts run by EVALSHA; one that finds its script missing
//     (NOSCRIPT after a restart or SCRIPT FLUSH) is re-run alone, which
//     loads it.
//   - Release and Reap: compare-and-delete script, then unindex.
//   - ListPlacements (store.PlacementLister, listing.go): SCAN of every node
//     with MATCH pinned:p:<ns>/* (or, for a worker's sessions, HSCAN of
//     their pinned:o:<sid> with MATCH <ns>/*), a pipelined GET of each
//     candidate's placement, and a script on pinned:i:<listing> that keeps
//     only the names the listing has not returned (SCAN may repeat keys)
//     and records them. Never KEYS; a page is a few SCAN calls.
//   - Alarms (store.Alarms): one script per call on the instance's shard:
//     set (cap check, HSET record, ZADD due, SADD index), delete, list (the
//     index, then each record and score), claim (ZRANGEBYSCORE due ≤ now,
//     HMGET the records, one ZADD moving them all to the claim's end, the
//     earliest score left), finish (compare the record, then remove or
//     rewrite and reschedule, and add a dead letter, dropping the oldest
//     beyond the cap); dead letters: one script per shard, pipelined.
//   - Unindex is always "HDEL, then GET the placement, and index again if it
//     names this session". Together with "index after every winning write"
//     (in the writing script itself for a claim on a single node; after the
//     claim's reply on a cluster; before and again after it for a replace)
//     this keeps the invariant "a placement naming session S is in
//     S's index" under any interleaving of a release and a re-claim of the
//     same id by the same session (each pinboard's operations on one key are
//     linearised by Redis; the last operation on the index field is always an
//     add when the placement names S).
//
// # Client-side caching: OPTIN, not BCAST
//
// Placement and Session (and the namespace membership behind
// NamespaceSessions) read through rueidis DoCache in the default OPTIN
// tracking mode: Redis tracks exactly the keys this client read, on the
// connection that read them, and pushes an invalidation when one changes or
// expires. LookupOrClaim does not fill rueidis's cache (its caller caches
// the answer) but leaves the placement tracked the same way (above). BCAST was rejected because it sends every write of every matching
// key to every connection of every pinboard, whether or not that pinboard
// ever looked at the key: with the heartbeat rewriting every session hash
// every few seconds and placements written at every activation, that is
// O(writes × pinboards × connections) pushes for mostly-unread keys. OPTIN's
// cost is one CLIENT CACHING YES per cache miss, and its push goes only to
// the readers.
//
// Cache entries live at most Config.CacheTTL and never past the key's own
// PTTL (rueidis reads PTTL with the value), so a cached session never outlives
// its lease. Placements have no TTL; their entries are bounded by CacheTTL
// (default: the lease) less a random fifth at most, so that placements first
// read together are not all re-read together at every later TTL.
// PlacementUntil (store.CachedPlacements) tells the layer above when the
// entry behind an answer expires, so that it does not keep the value longer.
// LookupFresh (store.FreshLookups) is a plain GET outside rueidis's cache:
// the server's answer now, for a layer above that refreshes a value before
// the cache entry behind it expires (the key stays tracked as long as that
// entry lives, and after it until the key changes).
//
// OnInvalidate receives: Invalidation{Placement: "/ns/id"} for a tracked
// pinned:p: key, Invalidation{Session: sid} for a tracked pinned:s: key, and
// Invalidation{All: true} when rueidis reports a nil invalidation (FLUSHALL,
// FLUSHDB, or a closed connection, whose cache rueidis has already dropped).
// Other tracked keys (pinned:n:, pinned:w) are only rueidis's own business.
// The callback runs on a rueidis connection's reader goroutine, concurrently
// across connections.
//
// Read-your-own-write (rueidis #534, redis/redis#9422): the invalidation of a
// key written through this client arrives after the write's reply, so a
// DoCache read issued right after a write may return the old value.
// LookupOrClaim, Claim and Replace therefore return the resulting holder;
// callers never re-read a placement to learn the outcome of their own
// write. A write also invalidates the key for the writer's own connections
// that tracked it (rueidis drops its entry): a placement read through
// DoCache and then claimed is re-read by the next DoCache.
//
// # Connecting
//
// New does no I/O. Connect dials (rueidis.NewClient dials eagerly) and keeps
// retrying with capped exponential backoff with jitter until it succeeds,
// ctx ends, or Close is called; until then every method returns an error
// wrapping store.ErrUnavailable and the last dial error, which Ping reports
// (the pinboard's /healthz shows it); until the first attempt has
// completed the error also wraps store.ErrConnecting (not a failure yet).
// Once connected, rueidis reconnects by itself; commands fail with
// store.ErrUnavailable while Redis is away.
//
// # The circuit: failing fast while Redis is down
//
// rueidis retries a read-only command on a connection error until the
// caller's deadline, so without more every read would wait that long (about
// 1.7 s of a 2 s deadline) while Redis is down. So a call that fails for a
// reason Redis may cause (an I/O error or refused connection, the caller's
// deadline passing while it waited, a reply that says the node cannot serve
// now: READONLY, LOADING, MASTERDOWN, TRYAGAIN, CLUSTERDOWN, NOREPLICAS,
// all mapped to store.ErrUnavailable) kicks a prober. The prober (one
// goroutine, started by Connect, stopped and waited for by Close) sends a
// PING bounded by Config.CircuitProbeTimeout (1 s): when it fails, the
// circuit opens, and every call from then on returns store.ErrUnavailable
// at once, naming the probe's error, without sending a command; the prober
// pings again every Config.CircuitProbeInterval (250 ms) and closes the
// circuit on the first PING that succeeds. A Redis that is slow but
// answers a PING within the timeout stays in use. Metrics (Config.Metrics):
// pinned_store_circuit_open, pinned_store_circuit_trips_total,
// pinned_store_fast_failures_total. A negative CircuitProbeInterval turns
// the circuit off.
//
// # What callers must not assume
//
//   - Claim does not check that the claiming session is live (that would
//     need the session's key in the same script, which a cluster cannot
//     have); the proxy checks before it claims, and Reap or a later Replace
//     cleans up after a late claim.
//   - PlacementCounts come from the index and may over-count after a crash
//     between a claim's two steps.
//   - Times are the pinboard's clock (Config.Clock); Redis expires keys by its
//     own clock, so ExpiresAt is advisory and a wall-clock step on the Redis
//     host moves real expiry.
package redisstore
