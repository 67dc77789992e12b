package alarm

import "github.com/VictoriaMetrics/metrics"

// latenessBuckets are the upper bounds of pinned_alarm_lateness_seconds:
// from 10 ms to 10 min.
var latenessBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600}

type schedMetrics struct {
	claimed     *metrics.Counter
	deliveries  map[string]*metrics.Counter // result
	dead        *metrics.Counter
	stale       *metrics.Counter
	storeErrors *metrics.Counter
	lateness    *metrics.PrometheusHistogram
	inFlight    *metrics.Gauge
}

func newSchedMetrics(set *metrics.Set) *schedMetrics {
	m := &schedMetrics{
		claimed:     set.NewCounter("pinned_alarms_claimed_total"),
		deliveries:  map[string]*metrics.Counter{},
		dead:        set.NewCounter("pinned_alarms_dead_lettered_total"),
		stale:       set.NewCounter("pinned_alarms_stale_total"),
		storeErrors: set.NewCounter("pinned_alarm_store_errors_total"),
		lateness:    set.NewPrometheusHistogramExt("pinned_alarm_lateness_seconds", latenessBuckets),
	}
	for _, r := range []string{resultOK, resultFailed, resultUnavailable} {
		m.deliveries[r] = set.NewCounter(`pinned_alarm_deliveries_total{result="` + r + `"}`)
	}
	return m
}
