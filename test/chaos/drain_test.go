package chaos

import (
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/history"
)

// recordTB records the errors a harness reports instead of failing.
type recordTB struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recordTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordTB) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	r.TB.FailNow()
}

// fakePush is a registry that answers /registry/push 404 "no live session"
// the first refusals times (all: forever), then 202.
func fakePush(t *testing.T, refusals int) (addr string, calls *atomic.Int64) {
	t.Helper()
	calls = &atomic.Int64{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		n := calls.Add(1)
		if string(ctx.Path()) != wire.PathPush {
			ctx.SetStatusCode(400)
			return
		}
		if refusals < 0 || n <= int64(refusals) {
			ctx.SetStatusCode(404)
			ctx.SetBodyString(`{"error":"no live session for this clientId","field":"clientId"}`)
			return
		}
		ctx.SetStatusCode(202)
		ctx.SetBodyString(`{"queued":true}`)
	}}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { ln.Close(); _ = srv.Shutdown(); <-done })
	return ln.Addr().String(), calls
}

// The drain nemesis retries a push the registry refuses (no live session,
// right after a Redis restart), and when the worker still has none it
// skips the fault and records it; it never fails the run.
func TestDrainNemesisSkipsWithoutSession(t *testing.T) {
	rec := &recordTB{TB: t}
	addr, calls := fakePush(t, -1)
	file := filepath.Join(t.TempDir(), "harness.jsonl")
	h, err := history.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c := &cluster{t: rec, hist: h, drainRetry: 1200 * time.Millisecond,
		pbs: []*pinboardProc{{n: 1, addr: addr}, {n: 2, addr: addr}}}
	for n := 1; n <= 3; n++ {
		c.ws = append(c.ws, &workerProc{n: n, inc: 1, clientID: fmt.Sprintf("client%d", n), proc: fmt.Sprintf("w%d.1", n)})
	}
	start := time.Now()
	r := c.nemesis(nemDrain, rand.New(rand.NewPCG(1, 2)), shortPause)
	if len(rec.errs) > 0 {
		t.Fatalf("the drain nemesis failed the run: %v", rec.errs)
	}
	if !strings.Contains(r.label, "skipped") || !strings.Contains(r.skipped, "no live session") || !maySkip[r.kind] {
		t.Fatalf("round %+v; want the skip and its reason, of a nemesis that may be skipped", r)
	}
	if n := calls.Load(); n < 2 || time.Since(start) < c.drainRetry {
		t.Fatalf("%d pushes in %v; want retries for %v", n, time.Since(start), c.drainRetry)
	}
	ev, err := history.Read(file)
	if err != nil || len(ev) != 1 || ev[0].Nemesis != nemDrain || !strings.HasPrefix(ev[0].Cause, "skipped: ") {
		t.Fatalf("history = %+v, %v; want the drain recorded as skipped", ev, err)
	}

	// A refusal that clears up within the retry window is retried through.
	addr2, calls2 := fakePush(t, 2)
	c.pbs = []*pinboardProc{{n: 1, addr: addr2}, {n: 2, addr: addr2}}
	if why := c.pushDrain(c.ws[0], 1); why != "" || calls2.Load() != 3 {
		t.Fatalf("pushDrain after two refusals = %q with %d calls; want queued on the third", why, calls2.Load())
	}
}

// A skipped round fails the run unless its nemesis may be skipped, and
// then only up to maxSkipped rounds.
func TestSkippedRoundsFailTheRun(t *testing.T) {
	ran := func(kind string) round { return round{kind: kind, label: kind} }
	skip := func(kind string) round { return round{kind: kind, label: kind + " skipped: x", skipped: "x"} }
	twelve := func(extra ...round) []round {
		rs := []round{}
		for len(rs)+len(extra) < 12 {
			rs = append(rs, ran(nemKillWorker))
		}
		return append(rs, extra...)
	}
	for _, tc := range []struct {
		name   string
		rounds []round
		fail   bool
	}{
		{"none skipped", twelve(), false},
		{"one drain skipped", twelve(skip(nemDrain)), false},
		{"a freeze in which nothing moved", twelve(skip(nemFreeze)), true},
		{"a kill skipped", twelve(skip(nemKillWorker)), true},
		{"two drains of twelve rounds", twelve(skip(nemDrain), skip(nemLatencyDrain)), true},
	} {
		if err := skipVerdict(tc.rounds); (err != nil) != tc.fail {
			t.Errorf("%s: skipVerdict = %v; want a failure: %v", tc.name, err, tc.fail)
		}
	}
	if _, err := parseNemeses("pause, no-such-nemesis"); err == nil {
		t.Error("an unknown -chaos-nemeses name was accepted")
	}
	if k, err := parseNemeses(nemFreeze + "," + nemSlowInval); err != nil || len(k) != 2 {
		t.Errorf("parseNemeses = %v, %v", k, err)
	}
}
