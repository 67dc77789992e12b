// Package wire holds everything that crosses a process boundary in pinned:
// the registry's JSON bodies, the data-plane header names and reasons, the
// URL paths, the Redis key schema and the grammar of namespaces and ids,
// and the one HTTP/1.1 framing helper two parsers share ([Unhex]).
// Registry, worker, proxy, host and loadgen import it; nothing here does
// I/O.
// docs/protocol.md describes all of it for readers of the protocol; a test
// fails when a string constant here is missing from it.
//
// # Protocol version
//
// [Version] names the registry protocol spoken by this module. It changes
// only when a body shape, a header or a key changes meaning; additions that
// old peers ignore (unknown JSON fields are ignored on both sides) do not
// bump it. History (copied to docs/protocol.md in the same commit):
//
//   - 1 (2026-12-02): first version. Bodies as in docs/protocol.md
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
//   - 2 (2026-12-03): the operator console. A new control message kind,
//     [MessageEvict], carrying the instance's namespace and id in new
//     [Message] fields (a worker of version 1 logs it as unknown and
//     ignores it, so an eviction does not take effect on it);
//     GET and DELETE /registry/placements/{namespace}/{id} ([PlacementInfo],
//     [EvictResponse]), GET /registry/instances ([InstancesResponse]),
//     GET /registry/hot ([HotResponse]) and GET /registry/traffic
//     ([TrafficResponse]); key pinned:i:<iterationId>, the ids an
//     instance listing has already returned.
//   - 3 (2026-12-03): activation epochs. Every placement carries an epoch,
//     strictly greater than that of any earlier activation of its
//     (namespace, id) ([NextEpoch]): the placement key is hash-tagged and
//     holds "<epoch> <since> <session>" ([KeyPlacement], [FormatPlacement];
//     was pinned:p:<ns>/<id> holding the session id), next to the new epoch
//     counter pinned:e:{<ns>/<id>} ([KeyEpoch]) in the same cluster slot.
//     Proxied requests carry the epoch in [HeaderEpoch] (x-pinned-epoch,
//     decimal); a host answers a request older than its live instance 503
//     [ReasonStale] (new reason), and aborts an instance older than the
//     request before activating anew. Pinboards of version 3 and earlier ones must not
//     share a Redis: each would see the other's placements as absent.
//   - 4 (2026-12-03): durable alarms. New registry calls
//     [PathAlarmSet], [PathAlarmDelete], [PathAlarmList] (the worker's,
//     for an id its session holds) and [PathAlarmsDead] (dead letters),
//     with the bodies in alarms.go; the delivery POST
//     /<ns>/<id>[PathAlarm] with the [HeaderAlarm] field
//     ("<attempt> <scheduled ms> <name>"), sent by a pinboard to the worker
//     holding the id with its secret and session; the keys pinned:al:{<s>}:*
//     (see keys.go), the first ones that share a hash tag and are written by
//     multi-key scripts (all keys of one script in one slot). An old worker
//     never calls the new paths; an old pinboard answers them 404 and
//     delivers no alarm, so the version changes.
//   - 5 (2026-12-03): the worker tells the pinboard its request body limit:
//     maxBodyBytes in [RegisterRequest] (the smallest
//     host.Config.MaxRequestBodySize of its hosts; absent from an older
//     worker), kept in the session hash field "mb" ([FieldMaxBodyBytes])
//     and shown as maxBodyBytes in [WorkerInfo], so the proxy answers 413
//     before forwarding a body the worker's server would refuse.
//   - 6 (2026-12-05): the stale-route fence. A host answers 503
//     [ReasonStale] to a route at or below the epoch of an instance of the
//     id that closed there within its stale-route window, instead of
//     activating; [ReleaseRequest] carries the closed instance's Epoch and
//     deletes only that placement; a pinboard renews the epoch of a
//     placement its holder refused as stale (compare-and-set on session
//     and epoch, same session). A version-5 worker activates such routes,
//     so the guarantee under stale routes needs version 6 on every worker.
//     Revised the same day, additive (no bump): POST /registry/releases
//     ([PathReleases], [ReleasesRequest] -> [ReleasesResponse]) frees up to
//     [MaxReleaseBatch] placements of one session in one call, each exactly
//     as a release of its own would; an old pinboard answers it 404 and a
//     new worker then releases one call per instance, as before.
//
// # Alarms
//
// An alarm is set, replaced, deleted and listed by the worker holding its
// instance: the registry checks that the calling session is live and holds
// the placement of (namespace, id), so a worker that lost its lease cannot
// touch the alarms of an id placed elsewhere since. Every pinboard runs a
// scheduler that claims due alarms from the shards (a script moves each
// claimed alarm's score to the end of a claim, so no other pinboard takes
// it before the claim ends), delivers each one as POST
// /<ns>/<id>/_pinned/alarm to the worker holding the id (placing and
// activating it like any request), and then applies the outcome with a
// compare-and-set on the record it claimed ([Alarm.AfterSuccess],
// [Alarm.AfterFailure], [Alarm.AfterUnavailable]): a record set again
// meanwhile (a new Gen) is left alone. Delivery is at least once: an alarm
// is deleted only after a 2xx, and a pinboard that dies with a claim leaves
// the alarm to be claimed again when the claim ends. The handler receives
// the name, the scheduled time (AtMs) and the attempt number; (name,
// scheduled time) names an occurrence, so a handler can be idempotent.
//
// # Invariants
//
//   - Every JSON name is camelCase and matches docs/protocol.md exactly;
//     unknown fields are ignored when decoding.
//   - Namespaces are written "/name" (one path segment with a leading slash).
//   - [CheckSegment] accepts exactly the id grammar documented on it, never
//     allocates, and every accepted segment is safe to splice into a URL path
//     and a Redis key unescaped: it contains no '/', '%', '{', '}', space,
//     control byte or non-ASCII byte, and is never "." or "..".
//   - Every Redis key built here is touched only by single-key atomic
//     operations, or by scripts whose keys are hash-tagged into one slot (a
//     placement and its epoch counter; the keys of one alarm shard, tag
//     {<shard>}), so the schema works unchanged on Redis Cluster.
//   - An epoch is a uint64 sent in decimal; 0 means "none" (a request or an
//     instance without one).
package wire
