// Package registry serves the pinboard's registry protocol on fasthttp and
// fasthttp/router: workers register, heartbeat and release placements;
// operators push control messages and introspect. State lives in a
// store.Store (Redis via redisstore, or memstore for `pinboard -dev`).
//
// The calls, their bodies, fields and answers, and the Redis keys are
// docs/protocol.md (defined in internal/base/wire); what the registry does
// with them (the lease, the challenge fetch, superseding, release,
// deregister, push, the janitor) and its hardening (single-use challenges,
// the advertise-URL policy, rate limits, the session cap per token) are
// docs/registry.md; its log lines docs/operations.md, its metrics
// docs/metrics.md. This doc states what the package guarantees.
//
// # Invariants
//
//   - Every /registry/* call carries the deployment token (else 401);
//     bodies are JSON of at most 64 KiB (413 beyond, before the body is
//     read when Content-Length says more); a malformed body or field is a
//     400 with a JSON error naming the field; every limit answers 429 +
//     Retry-After, every 503 carries Retry-After.
//   - A session lives exactly Config.Lease after its registration or last
//     accepted heartbeat; what a worker asks for is ignored. No write
//     re-creates an expired session: heartbeats, supersede marks and pointer
//     refreshes are owner-checked scripts.
//   - A challenge is used at most once per NonceTTL (SET NX PX, recorded
//     before anyone is dialled). The registry dials a worker only to fetch
//     its challenge during a registration or heartbeat, with a fresh
//     connection closed afterwards, only to addresses its policy accepts
//     (checked by net.Dialer.Control on the exact address connected, after
//     its own DNS lookup); what the worker answers never reaches a response
//     or a log.
//   - A superseded session keeps its record and placements until its lease
//     runs out.
//   - Release and deregister never touch another session: both compare
//     against the session they name (release: one that belongs to the
//     caller's clientId, and the epoch when given), and the client and URL
//     pointers are deleted only while they name the deregistered session.
//     The janitor deletes placements only by compare-and-delete.
//   - A pushed message is handed to exactly one heartbeat ack.
//   - Alarm calls are accepted only from the live session holding the id's
//     placement.
//   - Per-client state (rate limits) lives in bounded LRUs; tokens and
//     worker secrets are never logged (a token appears as its tokenId).
//
// # Concurrency and lifecycle
//
// New does no I/O and starts nothing. Handlers are safe for concurrent use;
// the token set is swapped atomically by SetTokens. Run is the only
// goroutine the package starts (the caller owns it; it returns when ctx
// ends). Challenge fetches are bounded by MaxConcurrentChallenges and leave
// no goroutine or connection behind. Logs go to Config.Logger tagged
// logger=pinned.registry (store and auth failures throttled to one line per
// 10 s); metrics to Registry.Metrics.
package registry
