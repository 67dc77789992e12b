package host

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
)

// expectLog fails unless rec holds a record msg at level with every
// attribute of want.
func expectLog(t *testing.T, rec *logtest.Recorder, level slog.Level, msg string, want map[string]string) {
	t.Helper()
	for _, r := range rec.Find(msg, want) {
		if r.Level == level {
			return
		}
	}
	t.Errorf("no %s record %q with %v; got:\n%s", level, msg, want, rec.Dump())
}

// The lifecycle records carry logger=pinned.host, the namespace, the
// instance, its epoch and (for activations through the proxy) the session,
// and the eviction reason, one per way an instance ends: idle, abort,
// drain, wind_down, lease, stale, close. Per-instance records are DEBUG; the
// host-wide ones (AbortAll, CloseIdle, Close) are INFO.
func TestLifecycleLogAttributes(t *testing.T) {
	rec := &logtest.Recorder{}
	fc := fakeClock()
	ts, w, e := newFleetHost(t, Config{Logger: rec.Logger(slog.LevelDebug), Clock: fc, IdleTimeout: time.Minute, SweepInterval: time.Hour})
	h := ts.h
	base := map[string]string{"logger": "pinned.host", "namespace": "/p"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	closed := func(id, reason string) {
		t.Helper()
		e.waitTorn(t, id)
		w.waitReleased(t, "/p/"+id)
		// The record follows the instance's removal from the directory.
		waitFor(t, id+" to leave and be logged", func() bool {
			return h.instance(id) == nil && len(rec.Find("instance closed", with("instance", id, "reason", reason))) == 1
		})
	}

	ts.expect(200, "GET", "/p/idle/", append(auth("session-1"), wire.HeaderEpoch, "7")...)
	expectLog(t, rec, slog.LevelDebug, "instance activated", with("instance", "idle", "session", "session-1", "epoch", "7"))
	fc.Advance(time.Minute)
	h.sweep()
	closed("idle", EvictIdle)
	expectLog(t, rec, slog.LevelDebug, "instance closed", with("instance", "idle", "reason", EvictIdle, "epoch", "7"))

	// A newer epoch supersedes the instance: aborted as stale, closed
	// without a release, and the id activated again under the new epoch.
	ts.expect(200, "GET", "/p/st/", append(auth(""), wire.HeaderEpoch, "3")...)
	ts.expect(200, "GET", "/p/st/", append(auth(""), wire.HeaderEpoch, "4")...)
	expectLog(t, rec, slog.LevelDebug, "instance aborted", with("instance", "st", "reason", EvictStale, "epoch", "3"))
	expectLog(t, rec, slog.LevelDebug, "instance closed", with("instance", "st", "reason", EvictStale, "epoch", "3"))
	expectLog(t, rec, slog.LevelDebug, "instance activated", with("instance", "st", "epoch", "4"))
	ts.expect(200, "GET", "/p/st/abort", append(auth(""), wire.HeaderEpoch, "4")...)
	closed("st", EvictAbort)

	ts.expect(200, "GET", "/p/ab/abort", auth("")...)
	expectLog(t, rec, slog.LevelDebug, "instance aborted", with("instance", "ab", "reason", EvictAbort))
	closed("ab", EvictAbort)

	for _, reason := range []string{EvictDrain, EvictWindDown} {
		id := "c-" + reason
		ts.expect(200, "GET", "/p/"+id+"/", auth("")...)
		h.CloseIdle(reason)
		closed(id, reason)
		expectLog(t, rec, slog.LevelInfo, "closed idle instances", with("reason", reason, "instances", "1"))
	}

	ts.expect(200, "GET", "/p/lease/", auth("")...)
	h.AbortAll(EvictLease)
	expectLog(t, rec, slog.LevelInfo, "aborted all instances", with("reason", EvictLease, "instances", "1"))
	expectLog(t, rec, slog.LevelDebug, "instance aborted", with("instance", "lease", "reason", EvictLease))
	closed("lease", EvictLease)

	ts.expect(200, "GET", "/p/last/", auth("")...)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed("last", EvictClose)
	expectLog(t, rec, slog.LevelInfo, "host closing", with("instances", "1"))
	expectLog(t, rec, slog.LevelInfo, "host closed", base)

	// Every record of the host carries its logger and namespace.
	for _, r := range rec.Records() {
		if r.Attrs["logger"] != "pinned.host" || r.Attrs["namespace"] != "/p" {
			t.Errorf("record without logger/namespace: %s", r)
		}
	}
}

// INFO stays quiet under load: a thousand requests over a hundred ids,
// their activations and their idle evictions write no record at INFO, all
// of it at DEBUG.
func TestInfoQuietUnderLoad(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		t.Run(level.String(), func(t *testing.T) { quietUnderLoad(t, level) })
	}
}

func quietUnderLoad(t *testing.T, level slog.Level) {
	{
		rec := &logtest.Recorder{}
		fc := fakeClock()
		e := newEnv()
		ts := newTestHost(t, Config{Logger: rec.Logger(level), Clock: fc, IdleTimeout: time.Minute, SweepInterval: time.Hour}, e)
		for i := range 1000 {
			ts.expect(200, "GET", "/p/id"+strconv.Itoa(i%100)+"/")
		}
		fc.Advance(time.Minute)
		ts.h.sweep()
		waitFor(t, "every instance to be evicted", func() bool { return ts.h.Len() == 0 })
		if level == slog.LevelDebug {
			waitFor(t, "every eviction to be logged", func() bool {
				return len(rec.Find("instance closed", map[string]string{"reason": EvictIdle})) == 100
			})
		}
		n := len(rec.Records())
		switch level {
		case slog.LevelInfo:
			if n != 0 {
				t.Errorf("%d INFO+ records under load; want 0:\n%s", n, rec.Dump())
			}
		case slog.LevelDebug:
			if a, c := len(rec.Find("instance activated", nil)), len(rec.Find("instance closed", map[string]string{"reason": EvictIdle})); a != 100 || c != 100 {
				t.Errorf("DEBUG: %d activations, %d idle evictions logged; want 100 each", a, c)
			}
		}
	}
}

// A failing handler is logged at most throttleBurst times per
// throttleWindow; the next record after the window says how many were
// suppressed.
func TestHotPathErrorsThrottled(t *testing.T) {
	rec := &logtest.Recorder{}
	fc := fakeClock()
	e := newEnv()
	ts := newTestHost(t, Config{Logger: rec.Logger(slog.LevelInfo), Clock: fc}, e)
	const n = 3 * throttleBurst
	for range n {
		ts.expect(500, "GET", "/p/a/fail")
	}
	if got := len(rec.Find("handler failed", map[string]string{"instance": "a", "route": "/fail"})); got != throttleBurst {
		t.Fatalf("%d handler-failed records for %d failures in one window; want %d", got, n, throttleBurst)
	}
	fc.Advance(throttleWindow)
	ts.expect(500, "GET", "/p/a/fail")
	want := map[string]string{"suppressed": fmt.Sprint(n - throttleBurst)}
	if got := rec.Find("handler failed", want); len(got) != 1 || got[0].Level != slog.LevelError {
		t.Errorf("after the window: %v; want one ERROR record with suppressed=%d:\n%s", got, n-throttleBurst, rec.Dump())
	}
}

// The throttle itself: a burst per window, counted suppressions, a fresh
// burst once the window has passed.
func TestThrottle(t *testing.T) {
	fc := fakeClock()
	th := &throttle{clock: fc}
	for i := range throttleBurst {
		if ok, s := th.allow(); !ok || s != 0 {
			t.Fatalf("allow #%d = %v, %d; want true, 0", i, ok, s)
		}
	}
	for range 5 {
		if ok, _ := th.allow(); ok {
			t.Fatal("allowed beyond the burst")
		}
	}
	fc.Advance(throttleWindow - time.Nanosecond)
	if ok, _ := th.allow(); ok {
		t.Fatal("allowed before the window passed")
	}
	fc.Advance(time.Nanosecond)
	if ok, s := th.allow(); !ok || s != 6 {
		t.Errorf("first after the window = %v, %d; want true, 6 suppressed", ok, s)
	}
	if ok, s := th.allow(); !ok || s != 0 {
		t.Errorf("second after the window = %v, %d; want true, 0", ok, s)
	}
}
