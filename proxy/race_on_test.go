//go:build race

package proxy_test

// raceEnabled: the race detector slows every goroutine several times over;
// latency bounds are relaxed under it.
const raceEnabled = true
