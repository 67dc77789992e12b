// Package registry serves the pinboard's registry protocol (SPEC §5) on
// fasthttp and fasthttp/router: workers register, heartbeat and release
// placements; operators push control messages and introspect. State lives
// in a store.Store (Redis via redisstore, or memstore for `pinboard -dev`).
//
// # Endpoints
//
// Every /registry/* call carries "Authorization: Bearer <deployment token>";
// otherwise 401 with "WWW-Authenticate: Bearer realm=\"pinboard\"". Bodies are
// JSON, camelCase, at most 64 KiB (413 beyond, checked against
// Content-Length before reading and while reading a streamed body); unknown
// fields are ignored; a malformed body or field is a 400 with
// {"error": "...", "field": "<json name>"} (field omitted when the body as a
// whole is at fault). Store failures are 503 + Retry-After: 1 (Redis
// unreachable or slow) or 500.
//
//	POST /registry/register
//	  {clientId, secret, namespaces, advertiseUrl, headroom, draining, challenge, challengeValue}
//	  200 {sessionId, expiresInMs}
//	  400 invalid field; 422 {"error": "challenge failed: ...", "field": "challenge"};
//	  503 + Retry-After when MaxConcurrentChallenges proofs are in flight
//	POST /registry/heartbeat
//	  {sessionId, headroom, draining, drainDeadline?, challenge?, challengeValue?}
//	  200 {expiresInMs, messages?: [{type, deadlineMs?}], reregister?: true}
//	  409 {"nack": "reregister"}  unknown or expired session, or the challenge failed
//	  409 {"nack": "superseded"}  a newer registration took over: stop for good
//	  400 when only one of challenge/challengeValue is present
//	POST /registry/release   {clientId, namespace, id}        200 {"released": bool}
//	POST /registry/push      {clientId, type, deadlineMs?}    202 {"queued": true}; 404 no live session
//	GET  /registry/workers   200 {"workers": [WorkerInfo...]}
//	GET  /registry/overview  200 {protocolVersion, leaseMs, sessions, namespaces: {ns: {...}}, workers}
//	GET  /healthz            200 {"ok": true, "store": "ok"}; 503 with the store error, or
//	                         {"shuttingDown": true} once shutdown began (unauthenticated)
//
// Field rules: clientId and ids follow wire.CheckSegment (clientId ≤ 128
// bytes); secret is 1–256 visible ASCII bytes (it travels as a header);
// namespaces are 1–64 "/name" values, never /registry, /healthz or /_pinned,
// duplicates dropped; advertiseUrl is http(s)://host[:port] with no userinfo,
// path, query or fragment, stored lower-cased without a trailing slash;
// headroom and drainDeadline are non-negative; deadlines are unix
// milliseconds; challenge ≤ 256 bytes, challengeValue ≤ 1 KiB.
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
//     cap, http/https only, and, when AdvertiseNetworks is set, a dial-time
//     check of every resolved address (so DNS rebinding cannot bypass it).
//     The fetched body never appears in a response or a log. Registration
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
//   - Release is a compare-and-delete against the client's current session:
//     a release by any other client, or a late one after a re-registration,
//     changes nothing and answers {"released": false}.
//   - Push queues a message per client (bounded, newest kept) that the next
//     accepted heartbeat of the client's current session takes, all at once,
//     atomically: each message is handed to exactly one ack. (If that ack is
//     lost in transit the message is lost with it; operators re-push.)
//   - Janitor: Run calls Sweep every ReapInterval: sessions whose lease ran
//     out at least ReapGrace ago lose their placements (compare-and-delete,
//     so a placement the proxy already replaced is left alone, and several
//     pinboards can sweep at once), and the gauges are refreshed.
//
// # Redis key layout (internal/wire/keys.go)
//
// Every key is touched only by single-key commands or single-key Lua
// scripts, so the layout works on Redis Cluster without hash tags:
//
//	pinned:s:<sessionId>      HASH   session: cid secret url ns headroom draining deadline
//	                                 verified sup reg hb exp; PEXPIRE = lease; refreshed
//	                                 only by an owner-checked script that never re-creates it
//	pinned:c:<clientId>       STRING current session of a client; PX lease, refreshed
//	                                 while it still names the heartbeating session
//	pinned:a:<advertiseUrl>   STRING current session at an advertise URL; as above
//	pinned:q:<clientId>       LIST   queued messages (JSON); take-all script; capped; TTL
//	pinned:n:<namespace>      SET    sessions registered for a namespace
//	pinned:w                  ZSET   session -> expiry (ms); the janitor's work list
//	pinned:p:<namespace>/<id> STRING session holding the placement; no TTL; SET NX /
//	                                 compare-and-set / compare-and-delete only
//	pinned:o:<sessionId>      HASH   placement index: "<ns>/<id>" -> 1, "#<ns>" -> count
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
// namespaces) and refused (reason), supersede, challenge failures,
// collections, control messages; store and auth failures throttled to one
// line per 10 s. Tokens and worker secrets are never logged. Metrics (on
// Registry.Metrics): pinned_registry_requests_total{endpoint,code},
// pinned_registry_request_duration_seconds{endpoint} (classic buckets),
// pinned_registry_registrations_total, pinned_registry_registration_failures_total{reason},
// pinned_registry_challenge_failures_total{reason}, pinned_registry_superseded_total,
// pinned_registry_heartbeats_total, pinned_registry_messages_{pushed,delivered}_total,
// pinned_registry_releases_total{result}, pinned_registry_auth_failures_total,
// pinned_registry_store_errors_total, pinned_registry_reaped_{sessions,placements}_total,
// pinned_registry_sweep_errors_total, and the gauges pinned_registry_live_workers
// (live, not superseded), pinned_registry_sessions, pinned_registry_store_up and
// pinned_registry_placements{namespace} (sanitised, at most MaxNamespaceSeries
// series, the rest under "_other").
package registry
