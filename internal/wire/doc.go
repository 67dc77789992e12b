// Package wire holds everything that crosses a process boundary in pinned:
// the registry's JSON bodies, the data-plane header names and reasons, the
// URL paths, the Redis key schema and the grammar of namespaces and ids.
// Registry, worker, proxy and host all import it; nothing here does I/O.
//
// # Protocol version
//
// [Version] names the registry protocol spoken by this module. It changes
// only when a body shape, a header or a key changes meaning; additions that
// old peers ignore (unknown JSON fields are ignored on both sides) do not
// bump it. History:
//
//   - 1 (2026-12-02): first version. Bodies as in SPEC §5 of the design
//     (camelCase JSON), x-pinned-proxy-secret / x-pinned-session /
//     x-pinned-reason headers, keys under "pinned:".
//     Revised the same day, before any release (so no bump): pinned:n:<ns>
//     is a SET of session ids (was a ZSET of expiries), pinned:o:<sid> is the
//     session's placement index with "#<ns>" count fields (was counts only),
//     the namespaces in [ReservedNamespaces] are refused at registration,
//     and the session id grammar is [CheckSessionID].
//     Second revision the same day, additive (old peers keep working, so no
//     bump): POST /registry/deregister {sessionId} -> 200 {deregistered}
//     ([PathDeregister]; an old pinboard does not route it, and a new
//     worker only logs that); optional sessionId in [ReleaseRequest] (an old
//     pinboard ignores it and releases against the client's current
//     session, as before); challenges are single use and at least
//     [MinChallengeLen] bytes (a reused one is refused with 422); 429 +
//     Retry-After with a JSON error for the registry's rate limits and its
//     cap on live sessions per deployment token; keys pinned:x:<nonceId>
//     and pinned:t:<tokenId> and the session hash field "tok"; advertise
//     URLs are stored (and keyed, pinned:a:) in a stricter canonical form:
//     no default port, IP literals as netip prints them, no trailing dot,
//     numeric-obfuscated hosts refused (the pinboard normalises; a worker
//     sends what it likes).
//   - 2 (2026-05-19): the worker tells the pinboard its request body limit:
//     maxBodyBytes in [RegisterRequest] (the smallest
//     host.Config.MaxRequestBodySize of its hosts; absent from an older
//     worker), kept in the session hash field "mb" ([FieldMaxBodyBytes])
//     and shown as maxBodyBytes in [WorkerInfo], so the proxy answers 413
//     before forwarding a body the worker's server would refuse.
//
// # Invariants
//
//   - Every JSON name is camelCase and matches SPEC §5 exactly; unknown fields
//     are ignored when decoding.
//   - Namespaces are written "/name" (one path segment with a leading slash).
//   - [CheckSegment] accepts exactly the id grammar documented on it, never
//     allocates, and every accepted segment is safe to splice into a URL path
//     and a Redis key unescaped: it contains no '/', '%', '{', '}', space,
//     control byte or non-ASCII byte, and is never "." or "..".
//   - Every Redis key built here is touched only by single-key atomic
//     operations, so the schema works unchanged on Redis Cluster.
package wire
