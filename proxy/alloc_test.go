//go:build !race

package proxy

import "testing"

// Parsing the target and scanning the head, the per-request work of the
// proxy's own code before the worker is reached, allocate nothing.
func TestParseAllocs(t *testing.T) {
	var s headScan
	if n := testing.AllocsPerRun(1000, func() {
		for _, tg := range benchTargets {
			if _, e := parseRoute(tg, 0); e != routeOK {
				t.Fatal(e)
			}
		}
		s.reset()
		scanFields(benchHead, &s, dropPinned|dropForwarded)
	}); n != 0 {
		t.Errorf("parseRoute + scanFields: %v allocations per run; want 0", n)
	}
}
