package logthrottle

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
	th := &Every{Interval: time.Hour}
	var passed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if th.Allow() {
					passed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := passed.Load(); n != 1 {
		t.Errorf("%d of 8000 calls in one interval passed; want 1", n)
	}
	always := &Every{}
	for i := range 100 {
		if !always.Allow() {
			t.Fatalf("call %d with a zero interval was refused", i)
		}
	}
}

// Once the interval has passed, the next call goes through again, and not
// before.
func TestEveryPassesAgainAfterTheInterval(t *testing.T) {
	const every = 50 * time.Millisecond
	th := &Every{Interval: every}
	start := time.Now()
	if !th.Allow() {
		t.Fatal("the first call was refused")
	}
	if th.Allow() {
		t.Fatal("a second call within the interval passed")
	}
	for !th.Allow() {
		if time.Since(start) > 5*time.Second {
			t.Fatal("no call passed 5 s after a 50 ms interval")
		}
		time.Sleep(time.Millisecond)
	}
	if el := time.Since(start); el < every {
		t.Errorf("a call passed %v after the first; the interval is %v", el, every)
	}
}
