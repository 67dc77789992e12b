//go:build linux && !race

package loadgen

import (
	"testing"
	"time"
)

// TestLoopDoesNotAllocate: once a loop is warm, a whole open-loop request
// (release, dispatch, render, write, wait, read, parse, record) allocates
// nothing, for a GET and for a templated POST.
func TestLoopDoesNotAllocate(t *testing.T) {
	// The target runs in its own process: AllocsPerRun runs with
	// GOMAXPROCS=1, and an in-process target would wait for the loop's P.
	url := startProcessTarget(t)
	for _, sc := range []Scenario{{Name: "get"}, {Name: "post", Kind: KindPost, Body: `{"id":"{id}"}`}} {
		r := mustNew(t, Config{URL: url, Rate: MaxRate, Requests: 1 << 40, Duration: Unbounded, Connections: 1,
			IDs: IDConfig{Dist: DistZipf}, Scenarios: []Scenario{sc}})
		base := time.Now()
		sch, _ := newSchedule(r.cfg.Clock.Now(), &r.cfg)
		ser := newSeries(r.maxUs, r.cfg.Timeout, 0)
		lr, err := r.newLoopRun(t.Context(), base, &sch, ser, sch.intended(0))
		if err != nil {
			t.Fatal(err)
		}
		l, err := newEvLoop(lr, 0, 1, 1)
		if err != nil {
			t.Fatal(err)
		}
		sent := int64(0)
		step := func() {
			sent++
			for l.st.sc[0].sent < sent {
				l.tick()
				l.release()
				l.dispatch()
				l.wait(l.wakeAt())
			}
		}
		for range 10 {
			step()
		}
		if n := testing.AllocsPerRun(500, step); n != 0 {
			t.Errorf("%s: %v allocations per request; want 0", sc.Name, n)
		}
		l.shutdown()
		if l.st.classes != [numClasses]int64{} || l.st.statuses[200] != sent {
			t.Errorf("%s: classes %v statuses %v; want %d successes", sc.Name, l.st.classes, l.st.statuses, sent)
		}
	}
}
