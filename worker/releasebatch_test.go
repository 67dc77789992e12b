package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// queued counts the releases waiting in the batcher's queues.
func (b *releaseBatcher) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, q := range b.queues {
		for _, it := range q {
			if !it.gone {
				n++
			}
		}
	}
	return n
}

// releaseAll runs Release for every id at once and returns each error.
func releaseAll(h *harness, ids []string) map[string]error {
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			err := h.w.Release(context.Background(), "/counter", id, 7)
			mu.Lock()
			errs[id] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return errs
}

// Releases that wait at the same time share calls: while the first calls
// are held at the pinboard, the rest queue up and go in few calls, each
// release exactly once, each caller told its own outcome.
func TestReleasesShareCalls(t *testing.T) {
	h := newHarness(t)
	hold := make(chan struct{})
	h.pb.onRelease = func(int) action {
		if len(h.pb.batches) <= releaseSenders { // called with the fake's lock held
			return action{hold: hold}
		}
		return action{}
	}
	const n = 600
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("id%03d", i)
	}
	done := make(chan map[string]error, 1)
	go func() { done <- releaseAll(h, ids) }()
	// The senders' calls are held; every other release queues.
	deadline := time.Now().Add(20 * time.Second)
	for {
		h.pb.mu.Lock()
		sent := len(h.pb.releases)
		calls := h.pb.held
		h.pb.mu.Unlock()
		if calls == releaseSenders && sent+h.w.releases.queued() == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: %d calls held, %d releases sent, %d queued; want %d held and all %d accounted for", calls, sent, h.w.releases.queued(), releaseSenders, n)
		}
		time.Sleep(5 * time.Millisecond) // polling another goroutine's progress
	}
	close(hold)
	errs := <-done
	for id, err := range errs {
		if err != nil {
			t.Errorf("Release(%s) = %v", id, err)
		}
	}
	got := h.pb.releaseList()
	seen := map[string]int{}
	for _, r := range got {
		seen[r.ID]++
		if r.Epoch != 7 || r.Namespace != "/counter" || r.ClientID != h.w.ClientID() {
			t.Errorf("release sent as %+v; want epoch 7 in /counter for this client", r)
		}
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("%s released %d times; want once", id, seen[id])
		}
	}
	batches := h.pb.batchList()
	if len(batches) > releaseSenders+2 {
		t.Errorf("%d releases took %d calls %v; want at most %d (the held senders', then the queue in one or two)", n, len(batches), batches, releaseSenders+2)
	}
	if slices.Contains(h.pb.order, wire.PathRelease) {
		t.Errorf("a release went alone (%s) though the pinboard batches", wire.PathRelease)
	}
}

// One release is not delayed to wait for company: it goes at once, alone.
func TestReleaseAloneGoesAtOnce(t *testing.T) {
	h := newHarness(t)
	if err := release(t, h, context.Background()); err != nil {
		t.Fatal(err)
	}
	if b := h.pb.batchList(); !slices.Equal(b, []int{1}) {
		t.Fatalf("batches = %v; want one of 1", b)
	}
}

// Each release of a batch gets its own outcome: a refused one fails alone,
// a 503 one is retried alone, the others succeed.
func TestReleaseBatchResultsPerRelease(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	flaky := 0
	h.pb.itemStatus = func(id string) int {
		switch id {
		case "bad":
			return 400
		case "flaky":
			mu.Lock()
			defer mu.Unlock()
			if flaky++; flaky == 1 {
				return 503
			}
		}
		return 0
	}
	done := make(chan map[string]error, 1)
	go func() { done <- releaseAll(h, []string{"ok1", "bad", "flaky", "ok2"}) }()
	stop := make(chan struct{})
	go func() { <-done; close(stop) }()
	// flaky waits its backoff on the fake clock before its second attempt.
	if !h.clk.BlockUntil(1, stop) {
		t.Fatal("every release returned; want flaky waiting to retry")
	}
	h.clk.Advance(DefaultReleaseBackoff)
	<-stop
	h.pb.mu.Lock()
	defer h.pb.mu.Unlock()
	n := map[string]int{}
	for _, r := range h.pb.releases {
		n[r.ID]++
	}
	if n["flaky"] != 2 || n["bad"] != 1 || n["ok1"] != 1 || n["ok2"] != 1 {
		t.Fatalf("releases sent per id = %v; want flaky twice (a 503 of its own is retried), the others once", n)
	}
}

// The outcomes themselves, checked in a second run with the errors kept.
func TestReleaseBatchOutcomes(t *testing.T) {
	h := newHarness(t)
	h.pb.itemStatus = func(id string) int {
		if id == "bad" {
			return 400
		}
		return 0
	}
	errs := releaseAll(h, []string{"ok1", "bad", "ok2"})
	if !errors.Is(errs["bad"], ErrReleaseRefused) {
		t.Errorf("Release(bad) = %v; want ErrReleaseRefused (its own 400)", errs["bad"])
	}
	if errs["ok1"] != nil || errs["ok2"] != nil {
		t.Errorf("Release(ok1), Release(ok2) = %v, %v; want nil beside a refused one", errs["ok1"], errs["ok2"])
	}
}

// A pinboard without the batch call (404) gets one call per release, from
// the first release on, and is never asked for a batch again.
func TestReleaseBatchFallsBackToSingleCalls(t *testing.T) {
	h := newHarness(t)
	h.pb.noBatch = true
	for range 3 {
		if err := release(t, h, context.Background()); err != nil {
			t.Fatalf("Release against a pinboard without batches = %v", err)
		}
	}
	h.pb.mu.Lock()
	defer h.pb.mu.Unlock()
	var calls []string
	for _, p := range h.pb.order {
		if strings.HasPrefix(p, wire.PathRelease) {
			calls = append(calls, p)
		}
	}
	want := []string{wire.PathReleases, wire.PathRelease, wire.PathRelease, wire.PathRelease}
	if !slices.Equal(calls, want) {
		t.Fatalf("calls = %v; want %v", calls, want)
	}
	if len(h.pb.releases) != 3 {
		t.Fatalf("%d releases recorded; want 3", len(h.pb.releases))
	}
}

// ReleaseBatch 1 sends every release alone.
func TestReleaseBatchOne(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ReleaseBatch = 1 })
	errs := releaseAll(h, []string{"a", "b", "c"})
	for id, err := range errs {
		if err != nil {
			t.Fatalf("Release(%s) = %v", id, err)
		}
	}
	if b := h.pb.batchList(); len(b) != 0 {
		t.Fatalf("batch calls %v with ReleaseBatch 1; want none", b)
	}
}

// A batch of long ids stays within the registry's body limit: it is split.
func TestReleaseBatchWithinBodyLimit(t *testing.T) {
	h := newHarness(t)
	hold := make(chan struct{})
	h.pb.onRelease = func(int) action {
		if len(h.pb.batches) <= releaseSenders {
			return action{hold: hold}
		}
		return action{}
	}
	const n = 400
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%03d", i) + strings.Repeat("x", wire.MaxIDLen-3)
	}
	done := make(chan map[string]error, 1)
	go func() { done <- releaseAll(h, ids) }()
	deadline := time.Now().Add(20 * time.Second)
	for h.w.releases.queued() < n-releaseSenders*10 { // most of them queue behind the held calls
		if time.Now().After(deadline) {
			t.Fatalf("only %d releases queued", h.w.releases.queued())
		}
		time.Sleep(5 * time.Millisecond) // polling another goroutine's progress
	}
	close(hold)
	for id, err := range <-done {
		if err != nil {
			t.Fatalf("Release(%s…) = %v", id[:3], err)
		}
	}
	h.pb.mu.Lock()
	defer h.pb.mu.Unlock()
	if len(h.pb.releases) != n {
		t.Fatalf("%d releases arrived; want %d", len(h.pb.releases), n)
	}
	for _, size := range h.pb.bodySizes {
		if size > wire.MaxBodyBytes {
			t.Fatalf("a batch body of %d bytes; the registry takes at most %d", size, wire.MaxBodyBytes)
		}
	}
	if len(h.pb.batches) < releaseSenders+2 {
		t.Fatalf("batches %v: %d ids of %d bytes fit no single call; want the queue split", h.pb.batches, n, wire.MaxIDLen)
	}
}

// A release whose deadline passed while it waited for a batch fails alone;
// the others of the batch are sent with their own deadlines.
func TestReleaseBatchExpiredWaiterFailsAlone(t *testing.T) {
	h := newHarness(t)
	b := h.w.releases
	mk := func(id string, deadline time.Time) *pendingRelease {
		return &pendingRelease{req: wire.ReleaseRequest{ClientID: h.w.ClientID(), Namespace: "/counter", ID: id},
			deadline: deadline, done: make(chan reply, 1), lead: make(chan struct{}, 1)}
	}
	expired := mk("late", time.Now().Add(-time.Second))
	live := mk("ok", time.Time{})
	b.post(releaseKey{ns: "/counter"}, []*pendingRelease{expired, live})
	if r := <-expired.done; !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("the expired release's reply = %+v; want a deadline error", r)
	}
	if r := <-live.done; r.err != nil || r.status != 200 {
		t.Errorf("the live release's reply = %+v; want 200", r)
	}
	if got := h.pb.releaseList(); len(got) != 1 || got[0].ID != "ok" {
		t.Errorf("releases sent = %+v; want only ok", got)
	}
}
