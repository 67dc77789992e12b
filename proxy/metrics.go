package proxy

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// upstreamBuckets are the bounds of pinned_proxy_upstream_duration_seconds:
// a worker on the same machine answers in tens of microseconds.
var upstreamBuckets = [...]float64{
	.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60,
}

// histStripes is the number of stripes of a histogram; an exchange always
// records into the same one (exchange.stripe).
const histStripes = 8

// histogram is a Prometheus histogram of durations recorded with atomic adds,
// without a lock: VictoriaMetrics' PrometheusHistogram takes a mutex on every
// Update, a lock every proxied request would share. Stripes keep concurrent
// requests off each other's cache lines. It writes the text
// PrometheusHistogram writes (cumulative le buckets, +Inf, _sum in seconds,
// _count), through metrics.Set.RegisterMetricsWriter: one Proxy per Set.
type histogram struct {
	name    string
	stripes [histStripes]histStripe
}

type histStripe struct {
	counts [len(upstreamBuckets) + 1]atomic.Uint64 // the last one is +Inf
	sumNs  atomic.Uint64
	_      [64]byte
}

// observe records d in stripe i.
func (h *histogram) observe(i uint8, d time.Duration) {
	if d < 0 {
		return
	}
	v := d.Seconds()
	b := len(upstreamBuckets)
	for j, ub := range upstreamBuckets {
		if v <= ub {
			b = j
			break
		}
	}
	st := &h.stripes[i%histStripes]
	st.counts[b].Add(1)
	st.sumNs.Add(uint64(d))
}

// write renders the histogram in Prometheus text format.
func (h *histogram) write(w io.Writer) {
	var counts [len(upstreamBuckets) + 1]uint64
	var sumNs uint64
	for i := range h.stripes {
		st := &h.stripes[i]
		for j := range counts {
			counts[j] += st.counts[j].Load()
		}
		sumNs += st.sumNs.Load()
	}
	var cum uint64
	for j, ub := range upstreamBuckets {
		cum += counts[j]
		fmt.Fprintf(w, "%s_bucket{le=\"%v\"} %d\n", h.name, ub, cum)
	}
	total := cum + counts[len(upstreamBuckets)]
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n", h.name, total)
	if sum := float64(sumNs) / 1e9; float64(int64(sum)) == sum {
		fmt.Fprintf(w, "%s_sum %d\n", h.name, int64(sum))
	} else {
		fmt.Fprintf(w, "%s_sum %g\n", h.name, sum)
	}
	fmt.Fprintf(w, "%s_count %d\n", h.name, total)
}

// proxyMetrics are the proxy's metrics, resolved once.
type proxyMetrics struct {
	// responses counts what clients got, by status class: [1] is 1xx ...
	// [5] is 5xx, [0] anything else.
	responses [6]*metrics.Counter
	// upstream: from taking a worker connection to the worker's response
	// head.
	upstream     histogram
	reresolves   *metrics.Counter // re-resolved after a closing/draining/lease/stale 503 or an unreachable worker
	retries      *metrics.Counter // sent again to the same worker (decide's resend)
	unreachable  *metrics.Counter // 503 unreachable
	overloaded   *metrics.Counter // 503 overloaded
	badGateway   *metrics.Counter // 502
	splicedBytes *metrics.Counter // response body bytes moved with splice(2)
	// splicedRequestBytes: request body bytes moved with splice(2).
	splicedRequestBytes *metrics.Counter
	spliceFallbacks     *metrics.Counter // bodies that would be spliced but got no pipe
	timeouts            *metrics.Counter // 504
	rejected            *metrics.Counter // refused before forwarding (4xx)
	budgetExhausted     *metrics.Counter // a retry refused by the retry budget
	tunnels             *metrics.Counter // tunnels opened
	tunnelsRejected     *metrics.Counter // tunnels refused at the cap
	endpointsClosed     *metrics.Counter // endpoints the janitor closed
	handovers           *metrics.Counter // client connections a Front's loops handed to the fasthttp path
}

func (m *proxyMetrics) register(p *Proxy) {
	s := p.cfg.Metrics
	for i, class := range [...]string{"other", "1xx", "2xx", "3xx", "4xx", "5xx"} {
		m.responses[i] = s.GetOrCreateCounter(`pinned_proxy_responses_total{class="` + class + `"}`)
	}
	m.upstream.name = "pinned_proxy_upstream_duration_seconds"
	s.RegisterMetricsWriter(m.upstream.write)
	m.reresolves = s.GetOrCreateCounter("pinned_proxy_reresolves_total")
	m.retries = s.GetOrCreateCounter("pinned_proxy_retries_total")
	m.unreachable = s.GetOrCreateCounter("pinned_proxy_unreachable_total")
	m.overloaded = s.GetOrCreateCounter("pinned_proxy_overloaded_total")
	m.badGateway = s.GetOrCreateCounter("pinned_proxy_bad_gateway_total")
	m.splicedBytes = s.GetOrCreateCounter(`pinned_proxy_spliced_bytes_total{direction="response"}`)
	m.splicedRequestBytes = s.GetOrCreateCounter(`pinned_proxy_spliced_bytes_total{direction="request"}`)
	m.spliceFallbacks = s.GetOrCreateCounter("pinned_proxy_splice_fallbacks_total")
	m.timeouts = s.GetOrCreateCounter("pinned_proxy_upstream_timeouts_total")
	m.rejected = s.GetOrCreateCounter("pinned_proxy_rejected_total")
	m.budgetExhausted = s.GetOrCreateCounter("pinned_proxy_retry_budget_exhausted_total")
	m.tunnels = s.GetOrCreateCounter("pinned_proxy_tunnels_total")
	m.tunnelsRejected = s.GetOrCreateCounter("pinned_proxy_tunnels_rejected_total")
	s.GetOrCreateGauge("pinned_proxy_tunnels_open", func() float64 {
		return float64(p.tunnelsOpen.Load())
	})
	m.endpointsClosed = s.GetOrCreateCounter("pinned_proxy_endpoints_closed_total")
	m.handovers = s.GetOrCreateCounter("pinned_proxy_handovers_total")
	s.GetOrCreateGauge("pinned_proxy_endpoints", func() float64 { return float64(p.endpoints()) })
}
