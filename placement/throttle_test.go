package placement

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The hot-path error log throttle lets exactly one of many concurrent
// callers through per interval, and lets the next one through once the
// interval has passed (every = 0: always).
func TestThrottle(t *testing.T) {
	th := &throttle{every: time.Hour}
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if th.allow() {
					passed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := passed.Load(); n != 1 {
		t.Errorf("%d of 8000 calls in one interval passed; want 1", n)
	}
	always := &throttle{}
	for i := range 100 {
		if !always.allow() {
			t.Fatalf("call %d with a zero interval was refused", i)
		}
	}
}
