package host

import (
	"fmt"
	"testing"
	"time"
)

// Closing more idle instances than maxClosers at once runs at most
// maxClosers closes (and so releases) at a time, queues the rest, and
// closes every one of them once the releases go through: a worker shutting
// down with a million idle instances does not start a million goroutines.
func TestCloseIdleBoundsClosers(t *testing.T) {
	ts, w, e := newFleetHost(t, Config{})
	gate := make(chan struct{})
	w.releaseGate = gate
	n := maxClosers + 300
	for i := range n {
		ts.expect(200, "GET", fmt.Sprintf("/p/i%d/", i), auth("")...)
	}
	// Teardowns and releases are reported on channels of 1024: read them.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-e.torn:
			case <-stop:
				return
			}
		}
	}()
	drained := make(chan struct{})
	go func() {
		for range n {
			<-w.releases
		}
		close(drained)
	}()
	ts.h.CloseIdle(EvictIdle)
	deadline := time.Now().Add(testTimeout)
	for w.gated.Load() < maxClosers {
		if time.Now().After(deadline) {
			t.Fatalf("%d releases waiting after %v; want %d", w.gated.Load(), testTimeout, maxClosers)
		}
		time.Sleep(time.Millisecond) // polling goroutines of the host's
	}
	ts.h.closers.mu.Lock()
	running, queued := ts.h.closers.running, len(ts.h.closers.q)
	ts.h.closers.mu.Unlock()
	if g := w.gated.Load(); g != maxClosers || running != maxClosers || queued != n-maxClosers {
		t.Fatalf("closing %d idle instances: %d releases at once, %d closers, %d queued; want %d, %d, %d",
			n, g, running, queued, maxClosers, maxClosers, n-maxClosers)
	}
	close(gate)
	select {
	case <-drained:
	case <-time.After(testTimeout):
		t.Fatalf("not every instance released within %v", testTimeout)
	}
	for ts.h.Len() > 0 {
		if time.Now().After(deadline.Add(testTimeout)) {
			t.Fatalf("%d instances left", ts.h.Len())
		}
		time.Sleep(time.Millisecond) // the last closes finish after their release
	}
}
