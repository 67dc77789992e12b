package loadgen

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestSeriesPerSecond: the series has one point per second of the measured
// phase with that second's requests, errors and percentiles: a target slow
// in the second second and failing 1 request in 10 in the third shows
// exactly there; the warmup is not in it.
func TestSeriesPerSecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := mustNew(t, Config{URL: "http://127.0.0.1:1", Rate: 100, Warmup: 500 * time.Millisecond, Duration: 3 * time.Second,
			Requests: Unbounded, Connections: 16})
		t0 := time.Now()
		var n atomic.Int64
		withExec(r, func(_ []byte, o *outcome) {
			el := time.Since(t0) - 500*time.Millisecond // into the measured phase
			d := time.Millisecond
			if el >= time.Second && el < 2*time.Second {
				d = 50 * time.Millisecond
			}
			time.Sleep(d)
			o.status = 200
			if el >= 2*time.Second && n.Add(1)%10 == 0 {
				o.status = 503
			}
		})
		rep, err := r.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Series) != 3 {
			t.Fatalf("series %+v; want 3 seconds", rep.Series)
		}
		var total int64
		for i, p := range rep.Series {
			total += p.Requests
			if p.Second != int64(i) || p.Requests < 95 || p.Requests > 105 || p.Rate != float64(p.Requests) {
				t.Errorf("second %d: %+v; want ≈ 100 requests at ≈ 100/s", i, p)
			}
		}
		if total != 300 {
			t.Errorf("%d requests in the series; want the 300 measured", total)
		}
		slow, failing := rep.Series[1], rep.Series[2]
		if rep.Series[0].P99 > 1100 || slow.P50 < 50_000 || slow.P50 > 51_000 || failing.P50 > 1100 {
			t.Errorf("p99 of second 0 %dµs, p50 of second 1 %dµs, of second 2 %dµs; want 1ms, 50ms, 1ms", rep.Series[0].P99, slow.P50, failing.P50)
		}
		if rep.Series[0].Errors != 0 || rep.Series[1].Errors != 0 || failing.Errors < 9 || failing.Errors > 11 {
			t.Errorf("errors per second %d %d %d; want 0, 0, 10", rep.Series[0].Errors, rep.Series[1].Errors, failing.Errors)
		}
	})
}

// TestSeriesSettlesAndCountsStragglers: seconds settle once a flush for a
// later second arrives (their histograms recycled), and a straggler for a
// settled second still counts.
func TestSeriesSettlesAndCountsStragglers(t *testing.T) {
	s := newSeries(1_000_000, time.Second, 0) // settles 4 seconds behind
	h := newDetailHist(1_000_000)
	_ = h.RecordValue(100)
	s.add(0, h, 1, 0)
	s.add(3, h, 1, 0)
	if len(s.open) != 2 || len(s.points) != 0 {
		t.Fatalf("open %d settled %d; want 2 open", len(s.open), len(s.points))
	}
	s.add(4, h, 1, 0)
	if len(s.open) != 2 || s.points[0] == nil || len(s.recycle) != 1 {
		t.Fatalf("open %d, second 0 settled %v, %d recycled; want second 0 settled and recycled", len(s.open), s.points[0] != nil, len(s.recycle))
	}
	s.add(0, h, 2, 1) // a straggler
	pts := s.finish(5 * time.Second)
	if len(pts) != 5 || pts[0].Requests != 3 || pts[0].Errors != 1 || pts[0].P50 != 100 || pts[1].Requests != 0 || pts[4].Requests != 1 {
		t.Errorf("points %+v; want 5 seconds, second 0 with 3 requests (1 error, p50 100µs), 1 and 2 empty", pts)
	}
}
