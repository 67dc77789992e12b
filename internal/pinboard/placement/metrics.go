package placement

import "github.com/VictoriaMetrics/metrics"

// missBuckets are the bounds of pinned_placement_miss_duration_seconds: a
// miss is a few store round trips (memory: microseconds; Redis on the LAN:
// a millisecond or so).
var missBuckets = []float64{
	.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5,
}

// resolverMetrics are the resolver's metrics, resolved once. The cache's own
// (pinned_placecache_*{cache="placements"}) are on the same set.
type resolverMetrics struct {
	missDuration        *metrics.PrometheusHistogram // one miss, single-flight leader
	sharedMisses        *metrics.Counter             // misses that waited for another's store read
	claimsWon           *metrics.Counter
	claimsLost          *metrics.Counter
	replacesWon         *metrics.Counter
	replacesLost        *metrics.Counter
	renewals            *metrics.Counter // RenewPlacement calls after a stale refusal
	deaths              *metrics.Counter // sessions ended because their process is gone (fast failover)
	probesAlive         *metrics.Counter // death probes that did not prove the process gone
	probesFailed        *metrics.Counter // death probes that could not decide or end the session
	probesDropped       *metrics.Counter // death probes dropped on a full queue
	fastFailovers       *metrics.Counter // misses that took a placement over from a session a probe proved dead
	noWorker            *metrics.Counter
	unknownNamespace    *metrics.Counter
	storeErrors         *metrics.Counter
	invalidates         *metrics.Counter // Refused calls from the proxy
	sessionsDropped     *metrics.Counter // sessions forgotten because they were gone
	tunnelChecks        *metrics.Counter
	tunnelChecksDropped *metrics.Counter
	refreshExtended     *metrics.Counter // refreshes that extended the entry
	refreshChanged      *metrics.Counter // refreshes that found another holder or epoch, or a dead holder
	refreshRefused      *metrics.Counter // refreshes whose Put an invalidation refused
	refreshFailed       *metrics.Counter // refreshes whose store read failed
	refreshDropped      *metrics.Counter // refreshes dropped on a full queue
	refreshBatches      *metrics.Counter // batches of due names handed to the refreshers
}

func (m *resolverMetrics) register(s *metrics.Set, r *Resolver) {
	m.missDuration = s.GetOrCreatePrometheusHistogramExt("pinned_placement_miss_duration_seconds", missBuckets)
	m.sharedMisses = s.GetOrCreateCounter("pinned_placement_shared_misses_total")
	m.claimsWon = s.GetOrCreateCounter(`pinned_placement_claims_total{result="won"}`)
	m.claimsLost = s.GetOrCreateCounter(`pinned_placement_claims_total{result="lost"}`)
	m.replacesWon = s.GetOrCreateCounter(`pinned_placement_replaces_total{result="won"}`)
	m.replacesLost = s.GetOrCreateCounter(`pinned_placement_replaces_total{result="lost"}`)
	m.renewals = s.GetOrCreateCounter("pinned_placement_renewals_total")
	m.deaths = s.GetOrCreateCounter(`pinned_placement_death_probes_total{result="dead"}`)
	m.probesAlive = s.GetOrCreateCounter(`pinned_placement_death_probes_total{result="not_proven"}`)
	m.probesFailed = s.GetOrCreateCounter(`pinned_placement_death_probes_total{result="failed"}`)
	m.probesDropped = s.GetOrCreateCounter(`pinned_placement_death_probes_total{result="dropped"}`)
	m.fastFailovers = s.GetOrCreateCounter("pinned_placement_fast_failovers_total")
	m.noWorker = s.GetOrCreateCounter("pinned_placement_no_worker_total")
	m.unknownNamespace = s.GetOrCreateCounter("pinned_placement_unknown_namespace_total")
	m.storeErrors = s.GetOrCreateCounter("pinned_placement_store_errors_total")
	m.invalidates = s.GetOrCreateCounter("pinned_placement_invalidates_total")
	m.sessionsDropped = s.GetOrCreateCounter("pinned_placement_sessions_dropped_total")
	m.tunnelChecks = s.GetOrCreateCounter("pinned_placement_tunnel_checks_total")
	m.tunnelChecksDropped = s.GetOrCreateCounter("pinned_placement_tunnel_checks_dropped_total")
	m.refreshExtended = s.GetOrCreateCounter(`pinned_placement_refreshes_total{result="extended"}`)
	m.refreshChanged = s.GetOrCreateCounter(`pinned_placement_refreshes_total{result="changed"}`)
	m.refreshRefused = s.GetOrCreateCounter(`pinned_placement_refreshes_total{result="refused"}`)
	m.refreshFailed = s.GetOrCreateCounter(`pinned_placement_refreshes_total{result="failed"}`)
	m.refreshDropped = s.GetOrCreateCounter(`pinned_placement_refreshes_total{result="dropped"}`)
	m.refreshBatches = s.GetOrCreateCounter("pinned_placement_refresh_batches_total")
	s.GetOrCreateGauge("pinned_placement_sessions", func() float64 { return float64(r.Sessions()) })
}
