package metricshttp

// catalogue is pinned's metric families, row for row as docs/metrics.md
// lists them (meanings without the Markdown backticks):
// TestCatalogueMatchesDocs fails when the two differ, and test/e2e fails
// when docs/metrics.md and /metrics differ. Change all three together.
var catalogue = []Family{
	{"pinned_instances", "gauge", "namespace", "host", "live instances (activating, active or closing)"},
	{"pinned_activations_total", "counter", "namespace", "host", "instances whose setup succeeded"},
	{"pinned_evictions_total", "counter", "namespace, reason", "host", "instances that ended, by why: idle, abort, drain, wind_down, lease, stale (a newer epoch arrived, or the application returned host.ErrStale), close (Host.Close), evict (an operator's evict, Host.Evict), other"},
	{"pinned_aborts_total", "counter", "namespace", "host", "instances aborted (Instance.Abort, a handler panic, lease loss, a close deadline)"},
	{"pinned_rejections_total", "counter", "namespace, reason", "host", "requests the host refused: capacity (503, MaxInstances), draining (503, new id on a draining worker), closing (503), lease (503, no valid lease), forbidden (403, missing or wrong proxy secret), aborted (503), stale (503: an epoch older than the live instance's, or host.ErrStale), invalid_id (400), invalid_epoch (400: a malformed x-pinned-epoch), store (503, a handler's alarm call found the pinboard's store unavailable), body_too_large (413, a body over MaxRequestBodySize the server let through)"},
	{"pinned_request_duration_seconds", "histogram", "namespace", "host", "from fasthttp's request time to the handler's end (a stream's first step)"},
	{"pinned_open_streams", "gauge", "namespace", "host", "response streams in progress"},
	{"pinned_open_websockets", "gauge", "namespace", "host", "websockets in progress"},
	{"pinned_tasks", "gauge", "namespace", "host", "background tasks (Instance.Go) running"},
	{"pinned_stale_routes_total", "counter", "namespace", "host", "requests refused stale because an instance of the id closed here under their epoch or a newer one (a pinboard's stale cached placement)"},
	{"pinned_alarm_runs_total", "counter", "namespace, result", "host", "Alarm handler runs: ok, failed (an error, a panic or an abort under it: a failed attempt)"},
	{"pinned_local_alarms", "gauge", "namespace", "host", "alarms a local-mode host holds (0 in fleet mode: the pinboard holds them)"},
	{"pinned_local_alarms_dead_lettered_total", "counter", "namespace", "host", "local-mode alarm occurrences dead-lettered after their last attempt (Host.DeadAlarms)"},
	{"pinned_registered", "gauge", "", "worker", "1 while the worker holds a valid lease (Worker.Ready)"},
	{"pinned_lease_remaining_seconds", "gauge", "", "worker", "time left before the lease's local deadline (0 without a lease)"},
	{"pinned_draining", "gauge", "", "worker", "1 while draining or winding down"},
	{"pinned_heartbeats_total", "counter", "result", "worker", "heartbeats by outcome: ok, late (acked after the retry interval), failed, unauthorized, reregister, superseded"},
	{"pinned_registrations_total", "counter", "result", "worker", "registrations by outcome: ok, failed, unauthorized"},
	{"pinned_releases_total", "counter", "result", "worker", "placement releases: ok, failed, unauthorized, gave_up; deferred counts the releases of instances closed during a Shutdown, queued and sent in the background (their outcome is counted again when sent; the rest were freed by the deregistration, or given up)"},
	{"pinned_release_pauses_total", "counter", "", "worker", "pauses of a Shutdown's release senders while a heartbeat was late: the lease comes before the queued releases"},
	{"pinned_deregistrations_total", "counter", "result", "worker", "deregistrations on shutdown: ok, failed, unauthorized, skipped (instances still tearing down)"},
	{"pinned_lease_lost_total", "counter", "reason", "worker", "leases lost: expired, reregister, superseded, stopped, bad_timing"},
	{"pinned_alarm_calls_total", "counter", "result", "worker", "alarm set/delete/list calls to the pinboard: ok, refused (not the holder, invalid, at the cap), failed (retried), unauthorized"},
	{"pinned_pinboard_info", "gauge", "protocol, store", "pinboard", "always 1; the registry protocol version and the store (redis, memory)"},
	{"pinned_pinboard_lease_seconds", "gauge", "", "pinboard", "the lease every worker gets"},
	{"pinned_registry_requests_total", "counter", "endpoint, code", "registry", "registry calls by endpoint (register, heartbeat, release, releases (a batch), deregister, push, workers, overview, healthz, placement, evict, instances, hot, traffic, alarm_set, alarm_delete, alarm_list, alarms_dead) and status code (other for codes outside the known set)"},
	{"pinned_registry_request_duration_seconds", "histogram", "endpoint", "registry", "time to answer a registry call (a registration includes the challenge)"},
	{"pinned_registry_registrations_total", "counter", "", "registry", "sessions created"},
	{"pinned_registry_registration_failures_total", "counter", "reason", "registry", "registrations refused: invalid, store, busy, rate_limited, session_cap, or a challenge reason"},
	{"pinned_registry_challenge_failures_total", "counter", "reason", "registry", "challenge verifications that failed: unreachable, timeout, network_not_allowed, redirect, status, malformed, mismatch, replay"},
	{"pinned_registry_superseded_total", "counter", "", "registry", "sessions superseded by a newer registration of the same client or URL"},
	{"pinned_registry_heartbeats_total", "counter", "", "registry", "heartbeats that renewed a lease"},
	{"pinned_registry_messages_pushed_total", "counter", "", "registry", "control messages queued (/registry/push)"},
	{"pinned_registry_messages_delivered_total", "counter", "", "registry", "control messages delivered in heartbeat acks"},
	{"pinned_registry_releases_total", "counter", "result", "registry", "releases, one per instance whether alone or in a batch: released, not_owner (nothing changed); refused counts calls naming another client's session"},
	{"pinned_registry_deregistrations_total", "counter", "result", "registry", "deregister calls: deregistered, unknown"},
	{"pinned_registry_evictions_total", "counter", "result", "registry", "DELETE /registry/placements/… calls that did something: queued (an evict message for the holder), released (the holder had ended; placement deleted)"},
	{"pinned_registry_rate_limited_total", "counter", "limit", "registry", "calls refused with 429: auth_ip, register_ip, register_token, session_cap"},
	{"pinned_registry_auth_failures_total", "counter", "", "registry", "calls with a missing or wrong bearer token"},
	{"pinned_registry_store_errors_total", "counter", "", "registry", "store calls that failed while answering"},
	{"pinned_registry_reaped_sessions_total", "counter", "", "registry", "expired sessions collected by the janitor"},
	{"pinned_registry_reaped_placements_total", "counter", "", "registry", "placements of expired sessions deleted by the janitor"},
	{"pinned_registry_sweep_errors_total", "counter", "", "registry", "janitor passes that failed (store down, reap or listing error)"},
	{"pinned_registry_live_workers", "gauge", "", "registry", "sessions not superseded (janitor pass)"},
	{"pinned_registry_sessions", "gauge", "", "registry", "sessions in the store, superseded included (janitor pass)"},
	{"pinned_registry_placements", "gauge", "namespace", "registry", "placements per namespace (janitor pass)"},
	{"pinned_registry_namespace_workers", "gauge", "namespace", "registry", "live (not superseded) sessions serving each namespace (janitor pass)"},
	{"pinned_registry_store_up", "gauge", "", "registry", "1 when the last janitor ping reached the store"},
	{"pinned_store_circuit_open", "gauge", "", "store", "1 while Redis is known to be down: store calls fail at once (503 store) until a probe succeeds"},
	{"pinned_store_circuit_trips_total", "counter", "", "store", "times the circuit opened (a failed call, then a failed probe)"},
	{"pinned_store_fast_failures_total", "counter", "", "store", "store calls refused at once while the circuit was open"},
	{"pinned_hotids_error_bound", "gauge", "", "pinboard", "the most by which a request count of GET /registry/hot may exceed the truth (and the most requests an id missing from it may have had) over the last minute, largest over namespaces (internal/pinboard/hotids)"},
	{"pinned_registry_alarms_set_total", "counter", "", "registry", "alarms stored by /registry/alarms/set"},
	{"pinned_registry_alarm_calls_refused_total", "counter", "", "registry", "alarm calls refused with 409: the session does not hold the instance, or the instance's alarm cap"},
	{"pinned_proxy_responses_total", "counter", "class", "proxy", "answers to clients by status class: 1xx … 5xx, other"},
	{"pinned_proxy_upstream_duration_seconds", "histogram", "", "proxy", "from taking a worker connection to the worker's response head"},
	{"pinned_proxy_reresolves_total", "counter", "", "proxy", "requests resolved again after a closing/draining/lease/stale 503, or after an unreachable worker whose placement had moved"},
	{"pinned_proxy_retries_total", "counter", "", "proxy", "sends repeated to the same worker: after a stale pooled connection, or once after no answer"},
	{"pinned_proxy_retry_budget_exhausted_total", "counter", "", "proxy", "retries refused by a worker's retry budget"},
	{"pinned_proxy_unreachable_total", "counter", "", "proxy", "503 unreachable: the worker could not be reached"},
	{"pinned_proxy_overloaded_total", "counter", "", "proxy", "503 overloaded: the worker's connection pool and queue were full"},
	{"pinned_proxy_bad_gateway_total", "counter", "", "proxy", "502: a worker's answer was malformed or ambiguous"},
	{"pinned_proxy_spliced_bytes_total", "counter", "direction", "proxy", "body bytes an event loop moved with splice(2) (SpliceMin), by direction: response (a worker's body, to the client), request (a client's body, to the worker)"},
	{"pinned_proxy_splice_fallbacks_total", "counter", "", "proxy", "bodies that would have been spliced but got no pipe (descriptors or the user's pipe pages ran out): copied instead"},
	{"pinned_proxy_upstream_timeouts_total", "counter", "", "proxy", "504: no response head in time"},
	{"pinned_proxy_rejected_total", "counter", "", "proxy", "requests refused before forwarding (4xx: framing, limits, ids)"},
	{"pinned_proxy_tunnels_total", "counter", "", "proxy", "WebSocket tunnels opened"},
	{"pinned_proxy_tunnels_rejected_total", "counter", "", "proxy", "WebSocket tunnels refused at the cap"},
	{"pinned_proxy_tunnels_open", "gauge", "", "proxy", "WebSocket tunnels open now"},
	{"pinned_proxy_endpoints", "gauge", "", "proxy", "worker connection pools (one per worker session in use)"},
	{"pinned_proxy_endpoints_closed_total", "counter", "", "proxy", "worker connection pools the janitor closed after a sweep interval unused"},
	{"pinned_proxy_handovers_total", "counter", "", "proxy", "client connections the event loops handed to the fasthttp path (a request they do not serve: HTTP/1.0, a chunked or large body, Expect, absolute-form, /registry, a head they leave to fasthttp's parser)"},
	{"pinned_placement_miss_duration_seconds", "histogram", "", "placement", "one cache miss resolved from the store (single-flight leader)"},
	{"pinned_placement_shared_misses_total", "counter", "", "placement", "misses that waited for another request's store read"},
	{"pinned_placement_claims_total", "counter", "result", "placement", "new placements by SET NX: won (written by this pinboard), lost (a claim after a read that found none, beaten by another pinboard; a miss's first read-or-claim that finds the id placed counts as neither)"},
	{"pinned_placement_replaces_total", "counter", "result", "placement", "placements moved off a dead session: won, lost"},
	{"pinned_placement_renewals_total", "counter", "", "placement", "placement epochs renewed on the same session after their holder refused them as stale"},
	{"pinned_placement_death_probes_total", "counter", "result", "placement", "fast failover's probes of a session the proxy found unreachable: dead (every attempt refused, or answered by another process: the session was ended), not_proven (its lease stands), failed, dropped (queue full)"},
	{"pinned_placement_fast_failovers_total", "counter", "", "placement", "misses that took a placement over from a session a probe proved dead"},
	{"pinned_placement_no_worker_total", "counter", "", "placement", "misses with no live worker for the namespace (503)"},
	{"pinned_placement_unknown_namespace_total", "counter", "", "placement", "misses for a namespace no worker served recently (404)"},
	{"pinned_placement_store_errors_total", "counter", "", "placement", "store (Redis) errors while resolving"},
	{"pinned_placement_invalidates_total", "counter", "", "placement", "refusals the proxy reported (a worker's 503 closing/draining/lease, 403 forbidden, or unreachable)"},
	{"pinned_placement_sessions_dropped_total", "counter", "", "placement", "worker sessions forgotten because they were gone from the store"},
	{"pinned_placement_tunnel_checks_total", "counter", "", "placement", "tunnel placement checks after an invalidation"},
	{"pinned_placement_tunnel_checks_dropped_total", "counter", "", "placement", "tunnel checks dropped because the queue was full"},
	{"pinned_placement_refreshes_total", "counter", "result", "placement", "cached placements re-read ahead of their expiry (RefreshAhead): extended (the store confirmed the route), changed (another holder or epoch, or a dead holder: the route was dropped), refused (an invalidation raced the re-read), failed (the store read failed), dropped (the refresh queue was full)"},
	{"pinned_placement_refresh_batches_total", "counter", "", "placement", "batches of due names handed to the refreshers: a request that finds its entry due wakes a goroutine only when it starts a batch (RefreshBatch, 100 ms by default), so this, not the refreshes, counts those wake-ups"},
	{"pinned_placement_sessions", "gauge", "", "placement", "worker sessions the resolver knows (handed to the proxy)"},
	{"pinned_placecache_hits_total", "counter", "cache", "placecache", "lookups served from the cache"},
	{"pinned_placecache_misses_total", "counter", "cache", "placecache", "lookups that went to the store"},
	{"pinned_placecache_invalidations_total", "counter", "cache", "placecache", "invalidations applied (one per name; InvalidateAll counts one per shard); each also refuses in-flight puts into its shard"},
	{"pinned_placecache_evictions_total", "counter", "cache", "placecache", "entries dropped to stay within MaxEntries"},
	{"pinned_placecache_refused_puts_total", "counter", "cache", "placecache", "store reads not cached because an invalidation raced them"},
	{"pinned_placecache_refreshes_total", "counter", "cache", "placecache", "refreshes handed out by GetAhead (one per entry within RefreshAhead of its expiry)"},
	{"pinned_placecache_entries", "gauge", "cache", "placecache", "entries cached now (its size)"},
	{"pinned_placecache_table_bytes", "gauge", "cache", "placecache", "bytes of the cache's hash tables (mapped outside the Go heap for the pinboard's placements, so not in go_memstats_*)"},
	{"pinned_alarms_claimed_total", "counter", "", "alarm", "due alarms this pinboard claimed for delivery"},
	{"pinned_alarm_deliveries_total", "counter", "result", "alarm", "alarm deliveries: ok (2xx), failed (an attempt failed), unavailable (no worker took it: not an attempt)"},
	{"pinned_alarms_dead_lettered_total", "counter", "", "alarm", "alarm occurrences dead-lettered after their last attempt (GET /registry/alarms/dead)"},
	{"pinned_alarms_stale_total", "counter", "", "alarm", "delivered alarms set again or deleted meanwhile (their outcome was dropped)"},
	{"pinned_alarm_store_errors_total", "counter", "", "alarm", "alarm store calls that failed (a claim, or an outcome: the alarm comes back when its claim ends)"},
	{"pinned_alarm_lateness_seconds", "histogram", "", "alarm", "from an alarm's scheduled time to the start of its successful delivery"},
	{"pinned_alarm_deliveries_in_flight", "gauge", "", "alarm", "alarm deliveries in progress"},
}

// Family describes one metric family of pinned.
type Family struct {
	Name      string // e.g. "pinned_evictions_total"
	Type      string // counter, gauge or histogram
	Labels    string // comma-separated label names, "" for none
	Component string // host, worker, registry, proxy, placement, placecache, pinboard, alarm
	Help      string // what it counts or measures
}

// Catalogue returns every metric family pinned's components write (a copy).
func Catalogue() []Family { return append([]Family(nil), catalogue...) }

// catalogueIndex finds a family by name; built once.
var catalogueIndex = func() map[string]Family {
	m := make(map[string]Family, len(catalogue))
	for _, f := range catalogue {
		m[f.Name] = f
	}
	return m
}()
