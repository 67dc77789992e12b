package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// releaseAtClose makes the fake host release n ids (epoch 7) at its first
// CloseIdle, as the real host does when it closes idle instances, and
// returns the errors of those Release calls once they have run, and a
// channel closed when they have.
func releaseAtClose(h *harness, n int) (errs func() []error, released <-chan struct{}) {
	var once sync.Once
	var mu sync.Mutex
	var out []error
	done := make(chan struct{})
	h.host.onCloseIdle = func() {
		once.Do(func() {
			for i := range n {
				if err := h.w.Release(context.Background(), "/counter", fmt.Sprintf("id-%d", i), 7); err != nil {
					mu.Lock()
					out = append(out, err)
					mu.Unlock()
				}
			}
			close(done)
		})
	}
	return func() []error {
		mu.Lock()
		defer mu.Unlock()
		return out
	}, done
}

// A Shutdown does not wait for the releases of the instances it closes:
// with every release call held by the pinboard, it still closes them all,
// deregisters (which frees every placement of the session at once), and
// returns well before its deadline; at most the batches in flight were
// sent, the rest were dropped.
func TestShutdownDoesNotWaitForReleases(t *testing.T) {
	const n, batch = 3000, 10
	h := newHarness(t, func(c *Config) { c.ReleaseBatch = batch })
	sid := h.register()
	h.host.set(0, n)
	gate := make(chan struct{}) // never closed: the fake answers held calls when it stops
	h.pb.onRelease = func(int) action { return action{hold: gate} }
	errs, _ := releaseAtClose(h, n)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := h.w.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown() = %v; want nil (the releases are held: a Shutdown that waits for them runs into its deadline)", err)
	}
	if e := errs(); len(e) != 0 {
		t.Fatalf("%d of %d Release calls failed (first: %v); want none: they queue", len(e), n, e[0])
	}
	if got := h.pb.deregisterList(); len(got) != 1 || got[0].SessionID != sid {
		t.Fatalf("deregister calls = %+v; want one for %s", got, sid)
	}
	if got := h.metric(`pinned_releases_total{result="deferred"}`); got != strconv.Itoa(n) {
		t.Errorf(`pinned_releases_total{result="deferred"} = %s; want %d`, got, n)
	}
	if got := len(h.pb.releaseList()); got > releaseSenders*batch {
		t.Errorf("%d releases reached the pinboard; want at most the %d of the batches in flight (the deregistration frees the rest)", got, releaseSenders*batch)
	}
	if got := h.metric(`pinned_releases_total{result="ok"}`); got != "0" {
		t.Errorf(`pinned_releases_total{result="ok"} = %s; want 0 (no held call was answered)`, got)
	}
}

// When the deregistration fails, Shutdown sends every queued release before
// it returns, each naming its session and epoch, in batches.
func TestShutdownSendsQueuedReleasesWhenItCannotDeregister(t *testing.T) {
	const n, batch = 100, 10
	h := newHarness(t, func(c *Config) { c.ReleaseBatch = batch })
	sid := h.register()
	h.host.set(0, n)
	gate := make(chan struct{})
	h.pb.onRelease = func(int) action { return action{hold: gate} }
	h.pb.onDeregister = func(int) action { close(gate); return action{status: 503} }
	errs, _ := releaseAtClose(h, n)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := h.w.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown() = %v; want nil", err)
	}
	if e := errs(); len(e) != 0 {
		t.Fatalf("%d Release calls failed (first: %v); want none", len(e), e[0])
	}
	got := h.pb.releaseList()
	seen := map[string]bool{}
	for _, r := range got {
		if r.SessionID != sid || r.Epoch != 7 || r.Namespace != "/counter" {
			t.Fatalf("release %+v; want session %s, epoch 7, namespace /counter", r, sid)
		}
		seen[r.ID] = true
	}
	if len(seen) != n || len(got) != n {
		t.Fatalf("%d releases (%d ids) reached the pinboard; want each of the %d once", len(got), len(seen), n)
	}
	for _, b := range h.pb.batchList() {
		if b > batch {
			t.Fatalf("batch sizes %v; want at most %d", h.pb.batchList(), batch)
		}
	}
	if got := h.metric(`pinned_releases_total{result="ok"}`); got != strconv.Itoa(n) {
		t.Errorf(`pinned_releases_total{result="ok"} = %s; want %d`, got, n)
	}
}

// When the Shutdown's context ends first (an instance that stays busy, and
// still tears down after its abort), the queued releases are given up:
// counted, not sent, and Shutdown returns with the context's error without
// deregistering.
func TestShutdownGivesUpQueuedReleasesWhenItsContextEnds(t *testing.T) {
	const n, batch = 500, 10
	h := newHarness(t, func(c *Config) { c.ReleaseBatch = batch })
	h.register()
	h.host.set(1, n) // the busy one never finishes
	h.host.slowAbort = true
	gate := make(chan struct{})
	inFlight := make(chan struct{}) // closed when the pinboard holds a call from every sender
	calls := 0                      // guarded by the fake pinboard's mutex
	h.pb.onRelease = func(int) action {
		if calls++; calls == releaseSenders {
			close(inFlight)
		}
		return action{hold: gate}
	}
	_, queued := releaseAtClose(h, n)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.w.Shutdown(ctx) }()
	for _, c := range []<-chan struct{}{queued, inFlight} {
		select {
		case <-c:
		case <-time.After(15 * time.Second):
			t.Fatalf("after 15 s: %s releases deferred, %d calls at the pinboard; want %d, and %d calls held", h.metric(`pinned_releases_total{result="deferred"}`), len(h.pb.batchList()), n, releaseSenders)
		}
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("Shutdown did not return after its context ended")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown() = %v; want context.Canceled", err)
	}
	if n := len(h.pb.deregisterList()); n != 0 {
		t.Fatalf("%d deregister calls; want none (an aborted instance may still tear down)", n)
	}
	if c := len(h.pb.batchList()); c != releaseSenders {
		t.Errorf("%d calls reached the pinboard; want only the %d held in flight", c, releaseSenders)
	}
	sent := len(h.pb.releaseList())
	gaveUp, _ := strconv.Atoi(h.metric(`pinned_releases_total{result="gave_up"}`))
	failed, _ := strconv.Atoi(h.metric(`pinned_releases_total{result="failed"}`))
	if gaveUp != n-sent || failed != sent {
		t.Errorf("gave_up %d, failed %d; want the %d unsent given up and the %d in flight failed", gaveUp, failed, n-sent, sent)
	}
}

// QueueRelease (the host's first try for a closed instance) takes a
// release only while a Shutdown runs; the release it queued is sent like
// Release's, naming the session.
func TestQueueRelease(t *testing.T) {
	h := newHarness(t)
	sid := h.register()
	if h.w.QueueRelease(nil, "/counter", "early", 1) {
		t.Fatal("QueueRelease outside a Shutdown = true; want false (the host calls Release)")
	}
	h.host.set(0, 1)
	var queued bool
	h.host.onCloseIdle = func() { queued = queued || h.w.QueueRelease(nil, "/counter", "late", 3) }
	h.pb.onDeregister = func(int) action { return action{status: 503} } // so the queue is sent
	if err := h.w.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !queued {
		t.Fatal("QueueRelease during a Shutdown = false; want true")
	}
	got := h.pb.releaseList()
	if len(got) != 1 || got[0].ID != "late" || got[0].SessionID != sid || got[0].Epoch != 3 {
		t.Fatalf("releases %+v; want one of late, epoch 3, session %s", got, sid)
	}
}

// While a heartbeat goes unanswered past its retry, a Shutdown's release
// senders pause: their batches must not hold up the pinboard (and the
// Redis behind it) the heartbeat needs. Once a heartbeat is acknowledged
// they send the queue.
func TestShutdownReleasesYieldToALateHeartbeat(t *testing.T) {
	const n, batch = 50, 10
	h := newHarness(t, func(c *Config) { c.ReleaseBatch = batch })
	h.register()
	h.host.set(0, n)
	hb := make(chan struct{})
	var mu sync.Mutex
	acked, early := false, 0
	h.pb.onHeartbeat = func(int, wire.HeartbeatRequest) action { return action{hold: hb} }
	h.pb.onRelease = func(int) action {
		mu.Lock()
		defer mu.Unlock()
		if !acked {
			early++
		}
		return action{}
	}
	h.pb.onDeregister = func(int) action { return action{status: 503} } // so the queue is sent
	// The heartbeat due after one interval, and its retries, go unanswered.
	h.advance(DefaultHeartbeatInterval + 2*DefaultRetryInterval)
	if !h.w.heartbeatLate() {
		t.Fatal("heartbeatLate() = false with every heartbeat held past its retry")
	}
	_, queued := releaseAtClose(h, n)
	done := make(chan error, 1)
	go func() { done <- h.w.Shutdown(context.Background()) }()
	select {
	case <-queued:
	case <-time.After(15 * time.Second):
		t.Fatal("the instances' releases were not queued")
	}
	// Wait for the senders to notice the queue: each pauses (and counts
	// it) instead of sending.
	deadline := time.Now().Add(15 * time.Second)
	for h.metric("pinned_release_pauses_total") == "0" {
		if time.Now().After(deadline) {
			t.Fatalf("no sender paused; %d releases sent", len(h.pb.releaseList()))
		}
		runtime.Gosched()
	}
	if got := len(h.pb.releaseList()); got != 0 {
		t.Fatalf("%d releases sent while the heartbeat was late; want 0", got)
	}
	mu.Lock()
	acked = true
	mu.Unlock()
	close(hb)                           // the held heartbeats are acknowledged
	h.clk.Advance(DefaultRetryInterval) // the paused senders look again
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown() = %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Shutdown did not return after the heartbeat was acknowledged")
	}
	mu.Lock()
	defer mu.Unlock()
	if early != 0 {
		t.Errorf("%d releases reached the pinboard before the heartbeat's ack; want 0", early)
	}
	if got := len(h.pb.releaseList()); got != n {
		t.Errorf("%d releases sent after the ack; want all %d", got, n)
	}
}
