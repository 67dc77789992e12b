// Package registry serves the pinboard's registry protocol (docs/protocol.md) on
// fasthttp and fasthttp/router: workers register, heartbeat and release
// placements; operators push control messages and introspect. State lives
// in a store.Store (Redis via redisstore, or memstore for `pinboard -dev`).
//
// # Endpoints
//
// Every /registry/* call carries "Authorization: Bearer <deployment token>";
// otherwise 401 with "WWW-Authenticate: Bearer realm=\"pinboard\"". Bodies are
// JSON, camelCase, at most 64 KiB (413 beyond, checked against
// Content-Length before reading and while reading a streamed body; a server
// that prefetches bodies asks OversizeHead right after the head and answers
// RefuseOversize before reading a byte, as the pinboard does); unknown
// fields are ignored; a malformed body or field is a 400 with
// {"error": "...", "field": "<json name>"} (field omitted when the body as a
// whole is at fault). Store failures are 503 + Retry-After: 1 (Redis
// unreachable or slow) or 500. A limit (see Hardening) answers 429 +
// Retry-After (whole seconds) with a JSON error.
//
//	POST /registry/register
//	  {clientId, secret, namespaces, advertiseUrl, headroom, draining, challenge, challengeValue, maxBodyBytes?}
//	  200 {sessionId, expiresInMs}
//	  400 invalid field (also a refused advertiseUrl); 422 {"error": "challenge failed: ...",
//	  "field": "challenge"} (also a reused challenge); 429 rate limit or session cap;
//	  503 + Retry-After when MaxConcurrentChallenges proofs are in flight
//	POST /registry/heartbeat
//	  {sessionId, headroom, draining, drainDeadline?, challenge?, challengeValue?}
//	  200 {expiresInMs, messages?: [{type, deadlineMs?}], reregister?: true}
//	  409 {"nack": "reregister"}  unknown or expired session, or the challenge failed
//	  409 {"nack": "superseded"}  a newer registration took over: stop for good
//	  400 when only one of challenge/challengeValue is present; 422 reused challenge
//	POST /registry/release   {clientId, namespace, id, sessionId?}  200 {"released": bool};
//	                         403 when sessionId belongs to another clientId
//	POST /registry/deregister {sessionId}                     200 {"deregistered": bool}
//	POST /registry/push      {clientId, type, deadlineMs?}    202 {"queued": true}; 404 no live session
//	GET  /registry/workers   200 {"workers": [WorkerInfo...]}
//	GET  /registry/overview  200 {protocolVersion, leaseMs, sessions, namespaces: {ns: {...}}, workers}
//	GET  /healthz            200 {"ok": true, "store": "ok"}; 503 with the store error, or
//	                         {"shuttingDown": true} once shutdown began (unauthenticated)
//	POST /registry/alarms/set    {sessionId, namespace, id, alarm: {name, atMs, everyMs?,
//	                             skipMissed?, maxAttempts?, backoffMs?}}  200 {gen}
//	POST /registry/alarms/delete {sessionId, namespace, id, name}  200 {"deleted": bool}
//	POST /registry/alarms/list   {sessionId, namespace, id}  200 {"alarms": [Alarm...]} by name
//	  all three: 409 on sessionId unless that session is live and holds the placement of
//	  (namespace, id); set: 409 on alarm when the instance holds MaxAlarmsPerInstance (100)
//	  alarms and none of that name; 501 when the store keeps no alarms
//	GET  /registry/alarms/dead?limit=N  200 {"deadAlarms": [...]} newest first (limit 1–1000,
//	                             default 100)
//
// The operator console's calls (the pinboard's admin listener serves the
// same handler, so its dashboard can make them):
//
//	GET    /registry/placements/{namespace}/{id}   (namespace without its slash)
//	  200 {namespace, id, sessionId, clientId, advertiseUrl, live, epoch, since}
//	  404 not placed; 400 a bad segment, or a path that is not exactly that
//	  (percent-escapes are refused, not decoded). live is false (and clientId,
//	  advertiseUrl empty) when the holding session has ended. epoch and since
//	  (unix ms) come from the store when it records them (else 0).
//	DELETE /registry/placements/{namespace}/{id}
//	  202 {namespace, id, sessionId, clientId, queued, released}; 404 not placed.
//	  queued: an evict message {type: "evict", namespace, id} waits in the
//	  holder's client queue; its next heartbeat ack carries it, and the worker
//	  aborts that instance (tasks cancelled, teardown once) and releases the
//	  id, so the next request activates a fresh instance: within one
//	  heartbeat interval plus the instance's close. released: the holder's
//	  session had ended, so the placement was compare-and-deleted at once.
//	GET    /registry/instances?namespace=/ns[&worker=<clientId>][&cursor=c][&limit=n]
//	  200 {namespace, worker?, instances: [{id, sessionId, clientId}], cursor}
//	  one page (limit 1–1000, default 100); cursor "" on the last page. Across
//	  the pages of one listing every id placed for its whole duration is listed
//	  exactly once, whatever changes meanwhile (store.PlacementLister: SCAN on
//	  Redis, never KEYS, with a per-listing seen set); a page may be short or
//	  empty before the last. worker keeps the ids held by that client's live
//	  sessions. 400 for a bad or expired cursor (10 minutes between pages).
//	GET    /registry/hot?namespace=/ns[&n=20]
//	  200 {namespace, windowSeconds: 60, errorBound, ids: [{id, requests,
//	  perSecond, p99Ms, bytes, holder}]}: the ids this pinboard routed most in
//	  the last minute, hottest first (n 1–200). requests may exceed the truth
//	  by at most errorBound; p99Ms is a bucket's upper bound (≤ 25 % above).
//	  Each pinboard answers for its own traffic only (see internal/pinboard/hotids for
//	  aggregating several).
//	GET    /registry/traffic
//	  200 {windowSeconds, requests, holders: [{sessionId, requests,
//	  perSecond}], notOk: [{status, reason, count}]}: this pinboard's last
//	  minute of routed requests per worker session and its non-2xx answers by
//	  status and X-Pinned-Reason.
//
// Field rules: clientId and ids follow wire.CheckSegment (clientId ≤ 128
// bytes); secret is 1–256 visible ASCII bytes (it travels as a header);
// namespaces are 1–64 "/name" values, never /registry, /healthz or /_pinned,
// duplicates dropped; advertiseUrl is http(s)://host[:port] with no userinfo,
// path, query or fragment, stored in canonical form (lower case, IP literals
// as netip prints them, no default port, no trailing dot or slash; see
// Hardening for the hosts and addresses refused);
// headroom, drainDeadline and maxBodyBytes are non-negative (maxBodyBytes:
// the worker's request body limit in bytes, stored on the session as
// store.Session.MaxBodyBytes and shown in WorkerInfo; the proxy refuses a
// larger body with 413 before forwarding it; 0 or absent: not said);
// deadlines are unix
// milliseconds; challenge 22–256 bytes (wire.MinChallengeLen: room for 128
// random bits), challengeValue ≤ 1 KiB; sessionId (heartbeat, release,
// deregister) follows wire.CheckSessionID.
//
// Alarm fields: name follows wire.CheckSegment (≤ 64 bytes); atMs is unix
// milliseconds, everyMs 0 or at least 1000, maxAttempts 0–100 (0: 6),
// backoffMs 0 or 10 ms–1 h (0: 2 s) (wire.Alarm.Check). Each set mints a new
// gen (64 random bits) and calls Config.OnAlarmSet (the pinboard's scheduler
// claims that shard by the due time).
//
// # Semantics
//
//   - Lease: every session lives Config.Lease (default 10 s) after its
//     registration or last accepted heartbeat; expiresInMs is always that
//     value. A worker cannot ask for another one.
//   - Challenge: the registry fetches
//     GET <advertiseUrl>/_pinned/challenge?challenge=<challenge> with
//     x-pinned-proxy-secret: <secret> and requires a 200 {"value": v} with v
//     equal to challengeValue (SHA-256 digests compared with
//     crypto/subtle). The fetch uses a fresh fasthttp HostClient with
//     Connection: close (nothing pooled), a ChallengeTimeout (2 s) deadline
//     from dial to last byte, no redirects (a 3xx fails), a 4 KiB response
//     cap, http/https only, and a dial-time check of every resolved address
//     (see Hardening). The fetched body never appears in a response or a
//     log. Registration
//     requires a pair unless AllowUnverified; a heartbeat with a pair is
//     re-proved against the session's own URL and secret, and refused with
//     409 reregister if it fails (the lease is then not extended). A pairless
//     heartbeat is accepted; its ack says "reregister": true while the
//     session is unverified.
//   - Superseding: a new verified registration for a clientId or
//     advertiseUrl that another live session holds marks that session
//     superseded; its next heartbeat gets 409 superseded; its record (and its
//     placements) stay until its lease runs out, so its ids are not
//     re-placed while the old process may still serve them.
//   - Release is a compare-and-delete against the session named by
//     sessionId (which must be live and belong to clientId, else 403; an
//     ended one frees nothing) or, without sessionId, the client's current
//     session: a release by any other client, or a late one of an old
//     session, never deletes what another session holds and answers
//     {"released": false}.
//   - Deregister deletes the session record at once (a compare-by-id: only
//     that session), and the client and advertise-URL pointers only while
//     they still name it; from then on it is unknown to every read, so its
//     heartbeats get 409 reregister, its placements are re-placed by the
//     proxy on their next request, and the janitor collects them after
//     ReapGrace. Superseded sessions can be deregistered. A worker calls it
//     as the last step of its graceful shutdown.
//   - Push queues a message per client (bounded, newest kept) that the next
//     accepted heartbeat of the client's current session takes, all at once,
//     atomically: each message is handed to exactly one ack. (If that ack is
//     lost in transit the message is lost with it; operators re-push.)
//   - Janitor: Run calls Sweep every ReapInterval: sessions whose lease ran
//     out at least ReapGrace ago lose their placements (compare-and-delete,
//     so a placement the proxy already replaced is left alone, and several
//     pinboards can sweep at once), and the gauges are refreshed.
//
// # Hardening
//
//   - Challenges are single use: before anyone is dialled, the registry
//     records wire.NonceID(challenge) with SET NX PX NonceTTL (default and
//     maximum 30 s; the value binds it to "<r|h>:<tokenId>:<advertise URL
//     or session>"). A second use within NonceTTL, by any body, for any URL
//     or session, is refused with 422, so of N concurrent submits exactly one
//     proceeds. After NonceTTL the record is gone, but a worker answers a
//     challenge only while its own call is in flight (5 s by default), so
//     a replay then fails the proof. Challenges shorter than 22 bytes are a
//     400.
//   - Advertise URLs (advertise.go): http/https, no userinfo, path, query or
//     fragment; a DNS name whose last label is not numeric, or an IP literal
//     in canonical form (2130706433, 0177.0.0.1, 0x7f.1, 127.1 are refused);
//     optional port allow-list (AdvertisePorts); cloud metadata names
//     refused. Addresses: never the unspecified ones or cloud metadata
//     endpoints; by default not the IANA special-purpose ranges (169.254/16,
//     fe80::/10, 100.64/10, multicast, reserved, documentation, NAT64, 6to4,
//     ...; an AdvertiseNetworks entry inside such a range opts into it);
//     loopback, RFC 1918, fc00::/7 and public addresses are allowed, and
//     AdvertiseNetworks narrows that. IP literals are checked when parsed
//     (400); every address is checked again at dial time by the
//     net.Dialer Control hook, on the exact address connected after the
//     registry's own DNS lookup, so DNS rebinding cannot reach a refused
//     address (422 network_not_allowed for a registration, 409 reregister
//     for a heartbeat).
//   - Rate limits (token buckets, golang.org/x/time/rate, per pinboard
//     process): registrations per client IP (RegisterIPLimit, 5/s burst
//     20; IPv6 by /64) and per deployment token (RegisterTokenLimit, 20/s
//     burst 100); failed authentications per client IP (AuthFailureLimit,
//     10/min): past it every authenticated call from that IP is refused
//     before its token is checked, except a heartbeat naming a live session
//     (its token is checked as usual), so workers behind the same NAT as a
//     misconfigured client keep their leases; a guesser without a live
//     session id never gets a guess evaluated. Refusals are 429 + Retry-After; the
//     per-IP buckets live in LRUs of MaxTrackedClients entries. The client
//     IP is the TCP peer: behind a proxy that hides it, the per-IP limits
//     apply to the proxy.
//   - Live sessions per deployment token are capped (MaxSessionsPerToken,
//     default 1024): a verified registration reserves a slot atomically
//     (store.ReserveSlot) before its session is written (a store failure
//     in between leaves the slot to expire with the lease); beyond the cap
//     it gets 429 + Retry-After: <lease>. Heartbeats keep the slot; deregister
//     and expiry free it. Superseded sessions count until their lease ends.
//   - Tokens are identified by a tokenId (PBKDF2 of the token, 72 bits,
//     the same on every pinboard), stored with each session and logged;
//     tokens themselves never are.
//
// # Redis key layout (internal/base/wire/keys.go)
//
// Every key is touched only by single-key commands or single-key Lua
// scripts, except a placement and its epoch counter, which share a hash tag
// (one cluster slot) and are written together by one script, so the layout
// works on Redis Cluster:
//
//	pinned:s:<sessionId>      HASH   session: cid secret url ns headroom draining deadline
//	                                 verified sup reg hb exp tok; PEXPIRE = lease; refreshed
//	                                 only by an owner-checked script that never re-creates it
//	pinned:c:<clientId>       STRING current session of a client; PX lease, refreshed
//	                                 while it still names the heartbeating session
//	pinned:a:<advertiseUrl>   STRING current session at an advertise URL; as above
//	pinned:q:<clientId>       LIST   queued messages (JSON); take-all script; capped; TTL
//	pinned:n:<namespace>      SET    sessions registered for a namespace
//	pinned:w                  ZSET   session -> expiry (ms); the janitor's work list
//	pinned:p:{<namespace>/<id>}
//	                          STRING "<epoch> <since ms> <session>"; no TTL; SET NX /
//	                                 compare-and-set / compare-and-delete only
//	pinned:e:{<namespace>/<id>}
//	                          STRING the id's last activation epoch; PX the epoch TTL
//	pinned:o:<sessionId>      HASH   placement index: "<ns>/<id>" -> 1, "#<ns>" -> count
//	pinned:x:<nonceId>        STRING a used challenge; SET NX PX NonceTTL; value = its binding
//	pinned:t:<tokenId>        ZSET   session -> expiry (ms) of the token's live sessions (cap)
//	pinned:i:<listingId>      SET    names one instance listing returned; PEXPIRE 10 min per page
//
// # Concurrency and lifecycle
//
// New does no I/O and starts nothing. Handlers are safe for concurrent use;
// the token set is swapped atomically by SetTokens. Run is the only
// goroutine the package starts (the caller owns it; it returns when ctx
// ends). Challenge fetches are bounded by MaxConcurrentChallenges and leave
// no goroutine or connection behind.
//
// # Observability
//
// Logger "pinned.registry": registration ok (session, client, advertiseUrl,
// namespaces, token id) and refused (reason), supersede, deregistration,
// challenge failures and replays, limit refusals (throttled),
// collections, control messages; store and auth failures throttled to one
// line per 10 s. Tokens and worker secrets are never logged. Metrics (on
// Registry.Metrics): pinned_registry_requests_total{endpoint,code},
// pinned_registry_request_duration_seconds{endpoint} (classic buckets),
// pinned_registry_registrations_total, pinned_registry_registration_failures_total{reason},
// pinned_registry_challenge_failures_total{reason}, pinned_registry_superseded_total,
// pinned_registry_heartbeats_total, pinned_registry_messages_{pushed,delivered}_total,
// pinned_registry_releases_total{result} (released, not_owner, refused),
// pinned_registry_deregistrations_total{result} (deregistered, unknown),
// pinned_registry_evictions_total{result} (queued, released),
// pinned_registry_rate_limited_total{limit} (auth_ip, register_ip,
// register_token, session_cap), pinned_registry_auth_failures_total,
// pinned_registry_store_errors_total, pinned_registry_reaped_{sessions,placements}_total,
// pinned_registry_sweep_errors_total, and the gauges pinned_registry_live_workers
// (live, not superseded), pinned_registry_sessions, pinned_registry_store_up and
// pinned_registry_placements{namespace} (sanitised, at most MaxNamespaceSeries
// series, the rest under "_other").
package registry
