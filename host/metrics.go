package host

import (
	"strings"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Eviction reasons: why an instance ended. They label
// pinned_evictions_total and the "reason" attribute of eviction logs, and
// are the reasons a Worker passes to AbortAll and CloseIdle.
const (
	EvictIdle     = "idle"      // idle longer than Config.IdleTimeout
	EvictAbort    = "abort"     // Instance.Abort, or a handler panic
	EvictDrain    = "drain"     // the worker is draining
	EvictWindDown = "wind_down" // the worker is winding down
	EvictLease    = "lease"     // the worker's lease was lost or superseded
	EvictClose    = "close"     // Host.Close
	EvictEvict    = "evict"     // an operator evicted it (wire.MessageEvict, Host.Evict)
	EvictStale    = "stale"     // a request with a newer epoch arrived, or the application found itself stale (ErrStale)
)

var evictReasons = [...]string{EvictIdle, EvictAbort, EvictDrain, EvictWindDown, EvictLease, EvictClose, EvictEvict, EvictStale, "other"}

func evictIndex(reason string) int {
	for i, r := range evictReasons[:len(evictReasons)-1] {
		if r == reason {
			return i
		}
	}
	return len(evictReasons) - 1
}

// rejection reasons label pinned_rejections_total: the wire reasons of the
// 503/403 answers the host makes, plus invalid_id and invalid_epoch for
// 400s and body_too_large for 413s.
const (
	rejectInvalidID    = "invalid_id"
	rejectInvalidEpoch = "invalid_epoch"
	rejectBodyTooLarge = "body_too_large"
)

var rejectReasons = [...]string{
	wire.ReasonCapacity, wire.ReasonDraining, wire.ReasonClosing, wire.ReasonLease,
	wire.ReasonForbidden, wire.ReasonAborted, wire.ReasonStale, rejectInvalidID, rejectInvalidEpoch, wire.ReasonStore, rejectBodyTooLarge,
}

func rejectIndex(reason string) int {
	for i, r := range rejectReasons {
		if r == reason {
			return i
		}
	}
	return -1
}

// durationBuckets are the upper bounds of pinned_request_duration_seconds:
// from 100µs (a handler that touches memory) to 10s.
var durationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// hostMetrics holds the host's metric pointers, resolved once in New.
type hostMetrics struct {
	set         *metrics.Set
	instances   *metrics.Gauge
	activations *metrics.Counter
	evictions   [len(evictReasons)]*metrics.Counter
	aborts      *metrics.Counter
	rejections  [len(rejectReasons)]*metrics.Counter
	duration    *metrics.PrometheusHistogram
	streams     *metrics.Gauge
	websockets  *metrics.Gauge
	tasks       *metrics.Gauge
	// staleRoutes counts the requests refused because the placement they
	// were routed by closed here (the stale-route fence).
	staleRoutes *metrics.Counter
}

// newHostMetrics registers the host's metrics on set. GetOrCreate is used
// so that two hosts sharing a set and a namespace add up instead of
// panicking.
func newHostMetrics(set *metrics.Set, namespace string) *hostMetrics {
	ns := `namespace="` + escapeLabelValue(namespace) + `"`
	m := &hostMetrics{
		set:         set,
		instances:   set.GetOrCreateGauge("pinned_instances{"+ns+"}", nil),
		activations: set.GetOrCreateCounter("pinned_activations_total{" + ns + "}"),
		aborts:      set.GetOrCreateCounter("pinned_aborts_total{" + ns + "}"),
		duration:    set.GetOrCreatePrometheusHistogramExt("pinned_request_duration_seconds{"+ns+"}", durationBuckets),
		streams:     set.GetOrCreateGauge("pinned_open_streams{"+ns+"}", nil),
		websockets:  set.GetOrCreateGauge("pinned_open_websockets{"+ns+"}", nil),
		tasks:       set.GetOrCreateGauge("pinned_tasks{"+ns+"}", nil),
		staleRoutes: set.GetOrCreateCounter("pinned_stale_routes_total{" + ns + "}"),
	}
	for i, r := range evictReasons {
		m.evictions[i] = set.GetOrCreateCounter("pinned_evictions_total{" + ns + `,reason="` + r + `"}`)
	}
	for i, r := range rejectReasons {
		m.rejections[i] = set.GetOrCreateCounter("pinned_rejections_total{" + ns + `,reason="` + r + `"}`)
	}
	return m
}

func (m *hostMetrics) reject(reason string) {
	if i := rejectIndex(reason); i >= 0 {
		m.rejections[i].Inc()
	}
}

// escapeLabelValue escapes a Prometheus label value (text format: \, " and
// newline) and replaces invalid UTF-8, which the Prometheus parsers refuse,
// with U+FFFD. Namespaces pass wire.CheckNamespace and never contain these,
// but a label built from user input is escaped regardless.
func escapeLabelValue(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return r.Replace(s)
}
