package proxy

import (
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// upstreamBuckets are the bounds of pinned_proxy_upstream_duration_seconds:
// a worker on the same machine answers in tens of microseconds.
var upstreamBuckets = []float64{
	.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60,
}

// proxyMetrics are the proxy's metrics, resolved once.
type proxyMetrics struct {
	// responses counts what clients got, by status class: [1] is 1xx ...
	// [5] is 5xx, [0] anything else.
	responses [6]*metrics.Counter
	// upstream: from taking a worker connection to the worker's response
	// head.
	upstream        *metrics.PrometheusHistogram
	reresolves      *metrics.Counter // re-resolved after a closing/draining/lease 503 or a closed endpoint
	retries         *metrics.Counter // sent again after a stale pooled connection
	unreachable     *metrics.Counter // 503 unreachable
	overloaded      *metrics.Counter // 503 overloaded
	badGateway      *metrics.Counter // 502
	timeouts        *metrics.Counter // 504
	rejected        *metrics.Counter // refused before forwarding (4xx)
	budgetExhausted *metrics.Counter // a retry refused by the retry budget
	tunnels         *metrics.Counter // tunnels opened
	tunnelsRejected *metrics.Counter // tunnels refused at the cap
}

func (m *proxyMetrics) register(p *Proxy) {
	s := p.cfg.Metrics
	for i, class := range [...]string{"other", "1xx", "2xx", "3xx", "4xx", "5xx"} {
		m.responses[i] = s.GetOrCreateCounter(`pinned_proxy_responses_total{class="` + class + `"}`)
	}
	m.upstream = s.GetOrCreatePrometheusHistogramExt("pinned_proxy_upstream_duration_seconds", upstreamBuckets)
	m.reresolves = s.GetOrCreateCounter("pinned_proxy_reresolves_total")
	m.retries = s.GetOrCreateCounter("pinned_proxy_retries_total")
	m.unreachable = s.GetOrCreateCounter("pinned_proxy_unreachable_total")
	m.overloaded = s.GetOrCreateCounter("pinned_proxy_overloaded_total")
	m.badGateway = s.GetOrCreateCounter("pinned_proxy_bad_gateway_total")
	m.timeouts = s.GetOrCreateCounter("pinned_proxy_upstream_timeouts_total")
	m.rejected = s.GetOrCreateCounter("pinned_proxy_rejected_total")
	m.budgetExhausted = s.GetOrCreateCounter("pinned_proxy_retry_budget_exhausted_total")
	m.tunnels = s.GetOrCreateCounter("pinned_proxy_tunnels_total")
	m.tunnelsRejected = s.GetOrCreateCounter("pinned_proxy_tunnels_rejected_total")
	s.GetOrCreateGauge("pinned_proxy_tunnels_open", func() float64 {
		return float64(p.tunnelsOpen.Load())
	})
}

// throttle lets one event through per interval; hot-path errors are logged
// through it so that a failing worker cannot flood the log.
type throttle struct {
	every time.Duration
	next  atomic.Int64 // unix nanoseconds before which nothing passes
}

func (t *throttle) allow() bool {
	now := time.Now().UnixNano()
	n := t.next.Load()
	return now >= n && t.next.CompareAndSwap(n, now+int64(t.every))
}
