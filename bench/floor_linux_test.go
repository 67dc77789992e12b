package bench

import (
	"testing"
	"time"
)

// measureSleepFloor sleeps until each slot (never returns early), counts
// every wake-up, charges it CPU, and orders its lateness figures.
func TestMeasureSleepFloor(t *testing.T) {
	const n, gap = 500, 200 * time.Microsecond
	start := time.Now()
	f, err := measureSleepFloor(n, gap)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < n*gap {
		t.Errorf("%d sleeps %v apart took %v: it did not wait for its slots", n, gap, el)
	}
	if f.wakes != n || f.gap != gap {
		t.Errorf("wakes %d gap %v, want %d and %v", f.wakes, f.gap, n, gap)
	}
	if !(f.cpuUs > 0) {
		t.Errorf("CPU per wake-up %v µs, want > 0", f.cpuUs)
	}
	if !(0 <= f.p99 && f.p99 <= f.p999 && f.p999 <= f.max) {
		t.Errorf("lateness p99 %v p99.9 %v max %v: not ordered", f.p99, f.p999, f.max)
	}
	if _, err := measureSleepFloor(0, gap); err == nil {
		t.Error("no sleeps: want an error")
	}
}
