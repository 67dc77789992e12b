package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// release runs Release on a goroutine and advances the fake clock through
// its backoff waits until it returns.
func release(t *testing.T, h *harness, ctx context.Context, waits ...time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() { done <- h.w.Release(ctx, "/counter", "abc", 0); close(stop) }()
	for _, d := range waits {
		if !h.clk.BlockUntil(1, stop) {
			t.Fatalf("Release returned before its wait of %v", d)
		}
		h.clk.Advance(d)
	}
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Release did not return")
		return nil
	}
}

func TestRelease(t *testing.T) {
	h := newHarness(t)
	if err := release(t, h, context.Background()); err != nil {
		t.Fatalf("Release() = %v; want nil", err)
	}
	want := wire.ReleaseRequest{ClientID: h.w.ClientID(), Namespace: "/counter", ID: "abc"}
	if got := h.pb.releaseList(); len(got) != 1 || got[0] != want {
		t.Fatalf("release calls = %+v; want [%+v]", got, want)
	}
	if got := h.metric(`pinned_releases_total{result="ok"}`); got != "1" {
		t.Errorf(`pinned_releases_total{result="ok"} = %s; want 1`, got)
	}
}

func TestReleaseRetries(t *testing.T) {
	h := newHarness(t)
	h.pb.onRelease = func(n int) action {
		if n < 3 {
			return action{status: 503}
		}
		return action{}
	}
	if err := release(t, h, context.Background(), 200*time.Millisecond, 400*time.Millisecond); err != nil {
		t.Fatalf("Release() = %v; want nil after two 503s", err)
	}
	if n := len(h.pb.releaseList()); n != 3 {
		t.Fatalf("%d release calls; want 3", n)
	}
}

func TestReleaseGivesUp(t *testing.T) {
	h := newHarness(t)
	h.pb.onRelease = func(int) action { return action{status: 503} }
	err := release(t, h, context.Background(), 200*time.Millisecond, 400*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "after 3 attempts") {
		t.Fatalf("Release() = %v; want an error after 3 attempts", err)
	}
	if n := len(h.pb.releaseList()); n != 3 {
		t.Fatalf("%d release calls; want 3", n)
	}
	if got := h.metric(`pinned_releases_total{result="gave_up"}`); got != "1" {
		t.Errorf(`pinned_releases_total{result="gave_up"} = %s; want 1`, got)
	}
}

func TestReleaseDoesNotRetryRefusals(t *testing.T) {
	f := func(status int) {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			h := newHarness(t)
			h.pb.onRelease = func(int) action { return action{status: status} }
			if err := release(t, h, context.Background()); !errors.Is(err, ErrReleaseRefused) {
				t.Fatalf("Release() after %d = %v; want ErrReleaseRefused", status, err)
			}
			if n := len(h.pb.releaseList()); n != 1 {
				t.Fatalf("%d release calls after %d; want 1", n, status)
			}
		})
	}
	f(400)
	f(401)
}

func TestReleaseStopsWhenCtxEnds(t *testing.T) {
	h := newHarness(t)
	h.pb.onRelease = func(int) action { return action{status: 503} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	stop := make(chan struct{})
	go func() { done <- h.w.Release(ctx, "/counter", "abc", 0); close(stop) }()
	h.clk.BlockUntil(1, stop) // waiting after the first failure
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Release() = %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release did not return when ctx ended")
	}
	if n := len(h.pb.releaseList()); n != 1 {
		t.Fatalf("%d release calls; want 1", n)
	}
}

// Release names the session: the current one, or the last one while the
// worker holds none, so the pinboard never frees a newer session's
// placement on a late release.
func TestReleaseSendsSessionID(t *testing.T) {
	h := newHarness(t)
	hold := make(chan struct{})
	h.pb.onHeartbeat = func(n int, _ wire.HeartbeatRequest) action {
		if n == 1 {
			return action{nack: wire.NackReregister}
		}
		return action{}
	}
	h.pb.onRegister = func(n int) action {
		if n == 2 {
			return action{hold: hold} // the fresh registration is slow
		}
		return action{}
	}
	first := h.register()
	if err := release(t, h, context.Background()); err != nil {
		t.Fatal(err)
	}
	h.advanceTo(3 * time.Second) // the heartbeat is NACKed: the lease is lost
	h.until("the second registration in flight", func() bool { return len(h.pb.registerList()) == 2 && !h.w.Ready() })
	if err := release(t, h, context.Background()); err != nil {
		t.Fatal(err)
	}
	close(hold)
	h.until("the new session", func() bool { return h.w.Ready() && h.w.Session() != first })
	second := h.w.Session()
	if err := release(t, h, context.Background()); err != nil {
		t.Fatal(err)
	}
	got := h.pb.releaseList()
	want := []string{first, first, second}
	if len(got) != len(want) {
		t.Fatalf("%d releases; want %d", len(got), len(want))
	}
	for i, r := range got {
		if r.SessionID != want[i] || r.ClientID != h.w.ClientID() || r.Namespace != "/counter" || r.ID != "abc" {
			t.Errorf("release %d = %+v; want sessionId %q (current, else last)", i, r, want[i])
		}
	}
}

// A release whose context carries the lease an instance was activated under
// names that session, even after the worker moved to a newer one (the host
// passes context.WithoutCancel of the instance's lease).
func TestReleaseNamesTheInstancesSession(t *testing.T) {
	h := newHarness(t)
	first := h.register()
	lease, reason := h.w.Admit(h.w.secret, nil)
	if reason != "" {
		t.Fatalf("Admit = %q", reason)
	}
	if sid, ok := SessionOf(lease); !ok || sid != first {
		t.Fatalf("SessionOf(lease) = %q, %v; want %q", sid, ok, first)
	}
	if _, ok := SessionOf(context.Background()); ok {
		t.Fatal("SessionOf(Background) reported a session")
	}
	// A stand-in for a later session: the explicit one wins over the current.
	ctx := context.WithValue(context.WithoutCancel(lease), sessionKey{}, "older-session")
	if err := release(t, h, ctx); err != nil {
		t.Fatal(err)
	}
	if err := release(t, h, context.WithoutCancel(lease)); err != nil {
		t.Fatal(err)
	}
	got := h.pb.releaseList()
	if len(got) != 2 || got[0].SessionID != "older-session" || got[1].SessionID != first {
		t.Fatalf("releases = %+v; want sessionIds older-session, %s", got, first)
	}
}

// A pinboard that stops makes every overlapping release give up together:
// one WARN with the count, not one per instance. Releases that do not
// overlap are logged one by one.
func TestReleaseGiveUpsAggregated(t *testing.T) {
	h := newHarness(t)
	h.pb.onRelease = func(int) action { return action{status: 503} }
	const n = 40
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			if err := h.w.Release(context.Background(), "/counter", fmt.Sprintf("id%d", i), 0); err == nil {
				t.Error("Release against a failing pinboard = nil")
			}
		})
	}
	go func() { wg.Wait(); close(stop) }()
	for _, d := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond} {
		if !h.clk.BlockUntil(n, stop) {
			t.Fatal("the releases returned before their backoff")
		}
		h.clk.Advance(d)
	}
	<-stop
	lines := gaveUpLines(h)
	if len(lines) != 1 || !strings.Contains(lines[0], "instances="+strconv.Itoa(n)) {
		t.Fatalf("%d overlapping give-ups logged %d lines:\n%s\nwant one with instances=%d", n, len(lines), strings.Join(lines, "\n"), n)
	}
	if got := h.metric(`pinned_releases_total{result="gave_up"}`); got != strconv.Itoa(n) {
		t.Errorf(`pinned_releases_total{result="gave_up"} = %s; want %d`, got, n)
	}
	// One more, alone: its own line.
	if err := release(t, h, context.Background(), 200*time.Millisecond, 400*time.Millisecond); err == nil {
		t.Fatal("Release = nil")
	}
	if lines := gaveUpLines(h); len(lines) != 2 || !strings.Contains(lines[1], "instances=1") {
		t.Fatalf("a lone give-up after the burst: lines\n%s\nwant a second line with instances=1", strings.Join(lines, "\n"))
	}
}

func gaveUpLines(h *harness) []string {
	var out []string
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, "release gave up") {
			out = append(out, l)
		}
	}
	return out
}
