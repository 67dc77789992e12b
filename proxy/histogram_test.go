package proxy

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// The lock-free upstream histogram writes exactly what VictoriaMetrics'
// PrometheusHistogram writes for the same observations, whatever stripes
// they went to, and may be written while it is being updated.
func TestHistogramMatchesPrometheusHistogram(t *testing.T) {
	vals := []time.Duration{0, 50 * time.Microsecond, 100 * time.Microsecond, 101 * time.Microsecond, 3 * time.Millisecond,
		250 * time.Millisecond, time.Second, 59 * time.Second, 61 * time.Second, 2 * time.Minute}
	set := metrics.NewSet()
	ref := set.NewPrometheusHistogramExt("pinned_proxy_upstream_duration_seconds", upstreamBuckets[:])
	h := &histogram{name: "pinned_proxy_upstream_duration_seconds"}
	for i, v := range vals {
		ref.Update(v.Seconds())
		h.observe(uint8(i*3), v)
	}
	var want, got bytes.Buffer
	set.WritePrometheus(&want)
	h.write(&got)
	if got.String() != want.String() {
		t.Fatalf("histogram writes\n%s\nPrometheusHistogram writes\n%s", got.String(), want.String())
	}

	// Concurrent updates and writes (the race detector checks this).
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for range 1000 {
				h.observe(uint8(g), time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			var b bytes.Buffer
			h.write(&b)
		}
	})
	wg.Wait()
	var b bytes.Buffer
	h.write(&b)
	if !bytes.Contains(b.Bytes(), []byte("pinned_proxy_upstream_duration_seconds_count 4010\n")) {
		t.Fatalf("after 4000 more observations:\n%s", b.String())
	}
}
