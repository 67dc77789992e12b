package chaoscheck

import (
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

const s = int64(time.Second)

// cfg is the checker's configuration in these tests; the abort check has
// its own test (TestNotAborted), the others keep instances of ended leases.
var cfg = Config{LeaseBuffer: 5 * time.Second, AbortGrace: time.Hour}

// lease is a registration or renewal ack of session sid on proc, sent at
// sent and handled at handled (seconds), granting 10 s.
func lease(proc, sid string, sent, handled float64) history.Event {
	return history.Event{Kind: history.KindLease, Proc: proc, Session: sid, T: sec(handled), Sent: sec(sent), ExpiresMs: 10000}
}

func sec(f float64) int64 { return int64(f * float64(s)) }

func act(proc, sid, id, inst string, t float64) history.Event {
	return history.Event{Kind: history.KindActivate, Proc: proc, Session: sid, ID: id, Inst: inst, T: sec(t)}
}

func down(proc, sid, id, inst string, t float64) history.Event {
	return history.Event{Kind: history.KindTeardown, Proc: proc, Session: sid, ID: id, Inst: inst, T: sec(t)}
}

func serve(proc, sid, id, inst string, recv, t float64) history.Event {
	return history.Event{Kind: history.KindServe, Proc: proc, Session: sid, ID: id, Inst: inst, Recv: sec(recv), T: sec(t)}
}

// base: w1 holds session A from 1 s, renewing every 3 s until 10 s (its
// lease ends at 9+10-5 = 14 s); w2 holds session B from 1 s to the end.
func base() []history.Event {
	ev := []history.Event{{Kind: history.KindStart, Proc: "w1", T: 1}, {Kind: history.KindStart, Proc: "w2", T: 1}}
	for _, t := range []float64{1, 3, 6, 9} {
		ev = append(ev, lease("w1", "A", t, t+0.01))
	}
	for t := 1.0; t < 60; t += 3 {
		ev = append(ev, lease("w2", "B", t, t+0.01))
	}
	return append(ev, act("w1", "A", "x", "i1", 2), serve("w1", "A", "x", "i1", 2, 2), serve("w1", "A", "x", "i1", 13.9, 13.9))
}

func check(t *testing.T, ev []history.Event) *Report {
	t.Helper()
	r := Check(cfg, ev)
	t.Log(r)
	return r
}

func TestCleanMove(t *testing.T) {
	// A's lease ends at 14 s without a teardown (a frozen process); B
	// activates x at 20 s: no overlap.
	ev := append(base(), act("w2", "B", "x", "i2", 20), serve("w2", "B", "x", "i2", 20, 20))
	r := check(t, ev)
	if !r.OK() || r.MaxOverlap != 0 || r.Served != 3 || r.Sessions != 2 {
		t.Fatalf("want a pass without overlap:\n%s", r)
	}
}

func TestOverlapBeyondLease(t *testing.T) {
	// B activates x at 12 s while A's instance is live until 14 s.
	ev := append(base(), act("w2", "B", "x", "i2", 12))
	r := check(t, ev)
	if r.OK() || r.Violations[VOverlap] != 1 || r.MaxOverlap != 2*time.Second || r.OverlapID != "x" {
		t.Fatalf("want one 2 s overlap:\n%s", r)
	}
	// The documented window allows it.
	c := cfg
	c.AllowedOverlap = 3 * time.Second
	if r := Check(c, ev); !r.OK() || r.MaxOverlap != 2*time.Second {
		t.Fatalf("an overlap inside the allowed window failed:\n%s", r)
	}
}

func TestTeardownAndDeathEndInstances(t *testing.T) {
	ev := append(base(), down("w1", "A", "x", "i1", 14), act("w2", "B", "x", "i2", 14.5))
	if r := check(t, ev); !r.OK() {
		t.Fatal("teardown before the next activation failed")
	}
	// Killed at 11 s: its instance and session end there.
	ev = append(base()[:len(base())-1], history.Event{Kind: history.KindExit, Proc: "w1", T: sec(11)}, act("w2", "B", "x", "i2", 11.5))
	if r := check(t, ev); !r.OK() {
		t.Fatal("an activation after the holder's death failed")
	}
}

// Receive-time anchoring: every ack takes 1.5 s; the last one, sent at 9 s,
// is handled at 10.5 s. The worker believes its lease lasts until 15.5 s and
// serves at 15 s; the checker's end is 14 s.
func TestReceiveAnchoringCaught(t *testing.T) {
	ev := []history.Event{{Kind: history.KindStart, Proc: "w1", T: 1}}
	for _, t := range []float64{1, 3, 6, 9} {
		ev = append(ev, lease("w1", "A", t, t+1.5))
	}
	ev = append(ev, act("w1", "A", "x", "i1", 3), serve("w1", "A", "x", "i1", 15, 15))
	r := check(t, ev)
	if r.Violations[VServedAfter] != 1 {
		t.Fatalf("receive-time anchoring not caught:\n%s", r)
	}
}

// An ack handled after the lease lapsed renews nothing (a correct worker
// drops it); a worker that keeps serving on it is caught.
func TestLateAckRenewsNothing(t *testing.T) {
	ev := append(base(), lease("w1", "A", 12, 14.5), serve("w1", "A", "x", "i1", 16, 16))
	r := check(t, ev)
	if r.Violations[VServedAfter] != 1 {
		t.Fatalf("a late ack extended the lease:\n%s", r)
	}
}

func TestLossEndsTheSession(t *testing.T) {
	ev := append(base(), history.Event{Kind: history.KindLost, Proc: "w1", Session: "A", T: sec(10)})
	r := check(t, ev) // base serves at 13.9 s, after the loss at 10 s
	if r.Violations[VServedAfter] != 1 {
		t.Fatalf("a request after the reported loss passed:\n%s", r)
	}
}

func TestStraddlingAllowed(t *testing.T) {
	ev := append(base(), serve("w1", "A", "x", "i1", 13.99, 25)) // read in time, held by a pause
	r := check(t, ev)
	if !r.OK() || r.Straddling != 1 {
		t.Fatalf("a straddling request:\n%s", r)
	}
}

func TestEffects(t *testing.T) {
	eff := history.Event{Kind: history.KindEffect, Proc: "w1", Session: "A", ID: "x", Inst: "i1", T: sec(20)}
	r := check(t, append(base(), eff))
	if r.Violations[VEffectAfter] != 1 {
		t.Fatalf("an effect 6 s after the lease passed:\n%s", r)
	}
	pause := history.Event{Kind: history.KindNemesis, Nemesis: NemesisPause, Target: "w1", T: sec(12), End: sec(19.8)}
	r = check(t, append(base(), eff, pause))
	if !r.OK() || r.EffectsAfterPause != 1 || r.Nemeses[NemesisPause] != 1 {
		t.Fatalf("an effect right after a pause across the lease end:\n%s", r)
	}
	// The resumed process can act before the harness stamps the pause's end.
	pause.End = sec(20.001)
	if r = check(t, append(base(), eff, pause)); !r.OK() || r.EffectsAfterPause != 1 {
		t.Fatalf("an effect stamped just before the pause's recorded end:\n%s", r)
	}
	// A pause that ended long before does not excuse it.
	pause.End = sec(15)
	if r = check(t, append(base(), eff, pause)); r.Violations[VEffectAfter] != 1 {
		t.Fatalf("an effect 5 s after the pause passed:\n%s", r)
	}
}

func TestRequestClasses(t *testing.T) {
	req := func(status int, ra bool, errClass string, via int, t0 float64) history.Event {
		return history.Event{Kind: history.KindRequest, Op: "POST", ID: "x", Via: via, T: sec(t0), End: sec(t0 + 0.1), Status: status, RetryAfter: ra, Err: errClass}
	}
	kill := history.Event{Kind: history.KindNemesis, Nemesis: NemesisKillPinboard, Target: "pb2", T: sec(30), End: sec(31)}
	ev := append(base(), kill,
		req(200, false, "", 1, 5), req(404, false, "", 1, 5), req(503, true, "", 1, 5), req(502, false, "", 1, 5),
		req(0, false, "refused", 2, 30.5))
	r := check(t, ev)
	if !r.OK() {
		t.Fatal("allowed classes failed")
	}
	for _, c := range []string{Class2xx, Class4xx, Class503RA, ClassPossiblySent, ClassPinboardDown} {
		if r.Requests[c] != 1 {
			t.Fatalf("class %q counted %d", c, r.Requests[c])
		}
	}
	for _, bad := range []history.Event{req(503, false, "", 1, 5), req(500, false, "", 1, 5), req(0, false, "timeout", 1, 5), req(0, false, "reset", 1, 5)} {
		r := Check(cfg, append(base(), kill, bad))
		if r.Violations[VRequest] != 1 {
			t.Fatalf("%+v passed:\n%s", bad, r)
		}
	}
}

func TestEmptyHistoryFails(t *testing.T) {
	if r := check(t, nil); r.OK() || !strings.Contains(r.String(), VEmpty) {
		t.Fatalf("an empty history passed:\n%s", r)
	}
}

func TestUnknownSession(t *testing.T) {
	r := check(t, append(base(), act("w2", "Z", "y", "i9", 3)))
	if r.Violations[VUnknownSession] != 1 {
		t.Fatalf("an instance of an unknown session passed:\n%s", r)
	}
}

// An instance must be aborted when its lease ends (the worker's selfAbort): one that
// outlives the end by more than AbortGrace is caught, unless its process
// died or was paused across the end.
func TestNotAborted(t *testing.T) {
	late := history.Event{Kind: history.KindServe, Proc: "w2", Session: "B", ID: "y", Inst: "i5", T: sec(40), Recv: sec(40)}
	ev := append(base(), late) // A ends at 14 s; i1 is never torn down; the history runs to 40 s
	check := func(t *testing.T, ev []history.Event) *Report {
		r := Check(Config{LeaseBuffer: 5 * time.Second}, ev)
		t.Log(r)
		return r
	}
	if r := check(t, ev); r.Violations[VNotAborted] != 1 {
		t.Fatalf("an instance alive 26 s after its lease passed:\n%s", r)
	}
	if r := check(t, append(ev, down("w1", "A", "x", "i1", 18))); !r.OK() {
		t.Fatal("a teardown 4 s after the lease end failed")
	}
	if r := check(t, append(ev, history.Event{Kind: history.KindExit, Proc: "w1", T: sec(16)})); !r.OK() {
		t.Fatal("an instance whose process died failed")
	}
	pause := history.Event{Kind: history.KindNemesis, Nemesis: NemesisPause, Target: "w1", T: sec(12), End: sec(30)}
	if r := check(t, append(ev, pause, down("w1", "A", "x", "i1", 30.1))); !r.OK() {
		t.Fatal("a teardown right after a pause across the lease end failed")
	}
}

// 502/504 answers are split by method: a non-idempotent request's is
// "possibly sent"; an idempotent one's has its own class (a violation with
// StrictIdempotent), and Gateway counts them by method, status and
// Retry-After. A skipped nemesis counts apart.
func TestGatewayByMethod(t *testing.T) {
	req := func(op string, status int, ra bool) history.Event {
		return history.Event{Kind: history.KindRequest, Op: op, ID: "x", Via: 1, T: sec(5), End: sec(5.1), Status: status, RetryAfter: ra}
	}
	skipped := history.Event{Kind: history.KindNemesis, Nemesis: "drain-worker", Target: "w1", Cause: "skipped: no live session", T: sec(6), End: sec(7)}
	ev := append(base(), req("POST /incr", 502, false), req("POST /incr", 502, true), req("GET /", 502, true), req("HEAD /", 504, false), skipped)
	r := check(t, ev)
	if !r.OK() {
		t.Fatalf("502/504 answers failed without StrictIdempotent:\n%s", r)
	}
	if r.Requests[ClassPossiblySent] != 2 || r.Requests[ClassGatewayIdempotent] != 2 {
		t.Fatalf("classes %v; want 2 possibly sent (POST) and 2 idempotent (GET, HEAD)", r.Requests)
	}
	want := map[string]int{"POST 502 no Retry-After": 1, "POST 502 Retry-After": 1, "GET 502 Retry-After": 1, "HEAD 504 no Retry-After": 1}
	if len(r.Gateway) != len(want) {
		t.Fatalf("Gateway = %v; want %v", r.Gateway, want)
	}
	for k, n := range want {
		if r.Gateway[k] != n {
			t.Fatalf("Gateway = %v; want %v", r.Gateway, want)
		}
	}
	if r.Nemeses["drain-worker (skipped)"] != 1 || r.Nemeses["drain-worker"] != 0 {
		t.Fatalf("nemeses %v; want the skipped drain counted apart", r.Nemeses)
	}
	strict := cfg
	strict.StrictIdempotent = true
	r = Check(strict, ev)
	if r.Violations[VRequest] != 2 || r.Requests[ClassGatewayIdempotentV] != 2 {
		t.Fatalf("StrictIdempotent: violations %v, classes %v; want the GET and the HEAD", r.Violations, r.Requests)
	}
}
