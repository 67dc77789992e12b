package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pinned-go/pinned/fence"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/redisstore"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/internal/testkit/tcpfwd"
)

// TestPausedWorkerFencedWrite: a worker paused in the middle of a write
// wakes inside its lease window after its id has moved, and its write
// reaches the application's store late. The epoch refuses it: the newer
// activation's value stays, and the late request answers 503 stale.
//
// Real processes throughout: the directory Redis, the pinboard, two counter
// workers persisting to a second Redis (the application's store) with
// -persist; worker A reaches that store through a forwarder
// (internal/testkit/tcpfwd) whose direction toward the store the test can
// stall, which is how its write is caught in flight. The test plays the proxy
// (the secret and session of each worker's registration, read from the
// directory, and the epoch of the placement it routes by), and moves the id
// through the store itself, while A's lease is still valid: the case
// leases alone cannot close.
func TestPausedWorkerFencedWrite(t *testing.T) {
	dir := redistest.Start(t)
	app := redistest.Start(t)
	pb := startPinboard(t, dir.URL)
	hold := tcpfwd.Start(t, app.Addr) // its client-to-server direction is stalled to hold a write
	a := startCounter(t, pb, "PINNED_PERSIST=redis://"+hold.Addr()+"/0")
	b := startCounter(t, pb, "PINNED_PERSIST="+app.URL)
	var wa, wb wire.WorkerInfo
	eventually(t, 15*time.Second, "both counters register", func() bool {
		var okA, okB bool
		wa, okA = workerAt(t, pb, a.addr)
		wb, okB = workerAt(t, pb, b.addr)
		return okA && okB && healthy(t, a) && healthy(t, b)
	})

	ctx := context.Background()
	st, err := redisstore.New(redisstore.Config{URL: dir.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// proxy sends what the pinboard's proxy would: the worker's secret
	// (from its session record), its session and the placement's epoch.
	proxy := func(w wire.WorkerInfo, addr string, p store.Placement, path string) (int, string, counterState) {
		t.Helper()
		sess, err := st.Session(ctx, w.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		code, h, body := do(t, "POST", "http://"+addr+path, map[string]string{
			wire.HeaderProxySecret: sess.Secret, wire.HeaderSession: w.SessionID,
			wire.HeaderEpoch: strconv.FormatUint(p.Epoch, 10),
		})
		var s counterState
		_ = json.Unmarshal(body, &s)
		return code, string(h.Peek(wire.HeaderReason)), s
	}

	// 1. x is placed on A, which counts to 1 (stored under A's epoch).
	pa, err := st.ClaimPlacement(ctx, "/counter", "x", wa.SessionID)
	if err != nil || pa.Session != wa.SessionID {
		t.Fatalf("claim = %+v, %v", pa, err)
	}
	if code, _, s := proxy(wa, a.addr, pa, "/counter/x/incr"); code != 200 || s.Count != 1 || s.Epoch != pa.Epoch {
		t.Fatalf("A's first incr = %d %+v; want 200, count 1 under epoch %d", code, s, pa.Epoch)
	}

	// 2. A's next increment is caught in flight: its write to the store is
	// held, then the process is paused.
	hold.Stall(true, false)
	late := make(chan [2]any, 1)
	go func() {
		code, reason, _ := proxy(wa, a.addr, pa, "/counter/x/incr")
		late <- [2]any{code, reason}
	}()
	eventually(t, 10*time.Second, "A's write reaches the held relay", func() bool { up, _ := hold.Held(); return up > 0 })
	if err := a.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	// 3. Meanwhile the id moves to B (driven through the directory), which
	// loads the stored count under its newer epoch and counts to 2.
	pbp, err := st.ReplacePlacement(ctx, "/counter", "x", wa.SessionID, wb.SessionID)
	if err != nil || pbp.Session != wb.SessionID || pbp.Epoch <= pa.Epoch {
		t.Fatalf("replace = %+v, %v; want B under an epoch above %d", pbp, err, pa.Epoch)
	}
	if code, _, s := proxy(wb, b.addr, pbp, "/counter/x/incr"); code != 200 || s.Count != 2 || s.Epoch != pbp.Epoch {
		t.Fatalf("B's incr = %d %+v; want 200, count 2 under epoch %d", code, s, pbp.Epoch)
	}

	// 4. A wakes, still inside its lease window, and its held write goes out.
	if err := a.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !healthy(t, a) {
		t.Fatal("A lost its lease during the pause; the test needs a pause inside the lease window")
	}
	hold.Stall(false, false)
	select {
	case r := <-late:
		if r[0] != 503 || r[1] != wire.ReasonStale {
			t.Fatalf("A's late increment answered %v %q; want 503 stale", r[0], r[1])
		}
	case <-time.After(15 * time.Second):
		t.Fatal("A's late increment did not answer")
	}

	// The newer value stays; B goes on from it; A's epoch stays fenced out.
	rdb := redistest.Client(t, app.URL)
	if v, e, err := fence.Get(ctx, rdb, "counter:x"); err != nil || v != "2" || e != pbp.Epoch {
		t.Fatalf("stored count = %q under epoch %d (%v); want B's 2 under %d", v, e, err, pbp.Epoch)
	}
	if code, _, s := proxy(wb, b.addr, pbp, "/counter/x/incr"); code != 200 || s.Count != 3 {
		t.Fatalf("B's next incr = %d %+v; want count 3", code, s)
	}
	if code, reason, _ := proxy(wa, a.addr, pa, "/counter/x/incr"); code != 503 || reason != wire.ReasonStale {
		t.Fatalf("A activated again under its old epoch: %d %q; want 503 stale (its load is fenced out)", code, reason)
	}
	if err := fence.Set(ctx, rdb, "counter:x", pa.Epoch, "0"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a write under A's epoch: %v; want stale", err)
	}
}

// counterState is the counter's JSON answer (GET /, POST /incr).
type counterState struct {
	Count    int64
	Instance string // random per activation
	Epoch    uint64
}
