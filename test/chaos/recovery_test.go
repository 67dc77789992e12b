package chaos

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

// recovery is how fast the ids of the workers a round killed were served
// again, as the client saw it: for every id a killed process held at the
// kill and the client asked for after it, the time from the kill to the
// end of the first request answered 2xx by another instance (it includes
// the time until the client next asked the id: the closed loop asks each
// of the 200 ids about every few hundred ms).
type recovery struct {
	round   int    // 1-based
	kind    string // the nemesis
	workers string // the killed processes
	ids     int    // ids the killed processes held that the client asked for after the kill
	unasked int    // ids they held that it never asked for again (a storm's fresh ids)
	left    int    // of ids, never answered 2xx by another instance before the run ended
	p50     time.Duration
	p99     time.Duration
	max     time.Duration
}

func (r recovery) String() string {
	s := fmt.Sprintf("round %d %s (%s): %d ids, p50 %v, p99 %v, max %v", r.round, r.kind, r.workers, r.ids,
		r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.max.Round(time.Millisecond))
	if r.left > 0 {
		s += fmt.Sprintf(", %d never served again", r.left)
	}
	if r.unasked > 0 {
		s += fmt.Sprintf(" (%d more held, never asked for again)", r.unasked)
	}
	return s
}

// kill is one worker process killed by a round: its history name and when
// (the shared clock) the harness sent SIGKILL.
type kill struct {
	proc string
	at   int64
}

// recoveries measures every round that killed workers, from the run's
// events.
func recoveries(rounds []round, events []history.Event) []recovery {
	var out []recovery
	for i, r := range rounds {
		if len(r.kills) == 0 {
			continue
		}
		rec := killRecovery(events, r.kills)
		var procs []string
		for _, k := range r.kills {
			procs = append(procs, k.proc)
		}
		rec.round, rec.kind, rec.workers = i+1, r.kind, strings.Join(procs, "+")
		out = append(out, rec)
	}
	return out
}

// killRecovery measures the recovery of the ids that the killed processes
// held, each from its own kill: an id is held when an instance of it was
// activated there before the kill and not torn down before it, and it is
// measured when the client asked for it after the kill. An id recovers
// with the first request for it that ends after the kill answered 2xx by
// another instance: one whose instance the answer names and is not the
// killed process's, or, for an answer that names none (a task or an alarm
// request), one sent after the killed process was known dead.
func killRecovery(events []history.Event, kills []kill) recovery {
	at := map[string]int64{} // killed process → its kill
	for _, k := range kills {
		at[k.proc] = k.at
	}
	dead := map[string]int64{}  // killed process → known dead (its exit event)
	torn := map[string]int64{}  // instance of a killed process → its teardown
	victim := map[string]bool{} // instances of the killed processes
	held := map[string]string{} // id → the killed process that held it
	for _, e := range events {
		if _, ok := at[e.Proc]; !ok {
			continue
		}
		switch e.Kind {
		case history.KindTeardown:
			torn[e.Inst] = e.T
		case history.KindExit:
			dead[e.Proc] = e.T
		}
	}
	for _, e := range events {
		kill, ok := at[e.Proc]
		if e.Kind != history.KindActivate || !ok {
			continue
		}
		victim[e.Inst] = true
		if t, torn := torn[e.Inst]; e.T < kill && (!torn || t >= kill) {
			held[e.ID] = e.Proc
		}
	}
	first := map[string]int64{} // id → from its kill to its first 2xx from another instance
	asked := map[string]bool{}  // held ids asked for after the kill
	for _, e := range events {
		proc, ok := held[e.ID]
		if e.Kind != history.KindRequest || !ok {
			continue
		}
		if e.T > at[proc] {
			asked[e.ID] = true
		}
		if e.Status/100 != 2 || e.End <= at[proc] {
			continue
		}
		if e.Inst != "" && victim[e.Inst] || e.Inst == "" && (dead[proc] == 0 || e.T <= dead[proc]) {
			continue
		}
		if d, ok := first[e.ID]; !ok || e.End-at[proc] < d {
			first[e.ID] = e.End - at[proc]
		}
	}
	ds := make([]time.Duration, 0, len(first))
	for _, d := range first {
		ds = append(ds, time.Duration(d))
	}
	slices.Sort(ds)
	rec := recovery{ids: len(asked), unasked: len(held) - len(asked), left: len(asked) - len(ds)}
	if n := len(ds); n > 0 {
		rank := func(q float64) time.Duration { return ds[max(0, int(q*float64(n)+0.999999)-1)] }
		rec.p50, rec.p99, rec.max = rank(0.50), rank(0.99), ds[n-1]
	}
	return rec
}

// TestKillRecovery: the ids a killed process held (not those it tore down
// before the kill, nor another process's) recover with the first 2xx from
// another instance; an answer from the killed process's own instance (in
// flight at the kill) does not count, nor one that names no instance and
// was sent before the process was known dead; an id never served again
// is counted apart, and one never asked for again is left out.
func TestKillRecovery(t *testing.T) {
	const ms = int64(time.Millisecond)
	killAt := 1000 * ms
	ev := []history.Event{
		{Kind: history.KindActivate, Proc: "w1.1", ID: "a", Inst: "a1", T: 100 * ms},
		{Kind: history.KindActivate, Proc: "w1.1", ID: "b", Inst: "b1", T: 100 * ms},
		{Kind: history.KindActivate, Proc: "w1.1", ID: "c", Inst: "c1", T: 100 * ms},
		{Kind: history.KindActivate, Proc: "w1.1", ID: "idle", Inst: "i1", T: 100 * ms}, // never asked for after the kill
		{Kind: history.KindRequest, ID: "idle", Status: 200, Inst: "i1", T: 200 * ms, End: 210 * ms},
		{Kind: history.KindActivate, Proc: "w1.1", ID: "gone", Inst: "g1", T: 100 * ms},
		{Kind: history.KindTeardown, Proc: "w1.1", ID: "gone", Inst: "g1", T: 500 * ms},
		{Kind: history.KindActivate, Proc: "w2.1", ID: "other", Inst: "o1", T: 100 * ms},
		{Kind: history.KindActivate, Proc: "w1.1", ID: "late", Inst: "l1", T: 1500 * ms}, // never on w1.1 at the kill
		{Kind: history.KindExit, Proc: "w1.1", T: 1010 * ms},
		// a: its own instance answers a request in flight at the kill, then another's.
		{Kind: history.KindRequest, ID: "a", Status: 200, Inst: "a1", T: 990 * ms, End: 1005 * ms},
		{Kind: history.KindRequest, ID: "a", Status: 503, T: 1100 * ms, End: 1200 * ms},
		{Kind: history.KindRequest, ID: "a", Status: 200, Inst: "a2", T: 1250 * ms, End: 1300 * ms},
		{Kind: history.KindRequest, ID: "a", Status: 200, Inst: "a2", T: 1400 * ms, End: 1450 * ms},
		// b: a task request sent before the death was known does not count.
		{Kind: history.KindRequest, ID: "b", Status: 202, T: 1005 * ms, End: 1400 * ms},
		{Kind: history.KindRequest, ID: "b", Status: 202, T: 1500 * ms, End: 1600 * ms},
		// gone, other: not held by w1.1 at the kill.
		{Kind: history.KindRequest, ID: "gone", Status: 200, Inst: "g2", T: 1100 * ms, End: 1900 * ms},
		{Kind: history.KindRequest, ID: "other", Status: 200, Inst: "o1", T: 1100 * ms, End: 1900 * ms},
		// c never answered again.
		{Kind: history.KindRequest, ID: "c", Status: 503, T: 1100 * ms, End: 1200 * ms},
	}
	got := killRecovery(ev, []kill{{"w1.1", killAt}})
	want := recovery{ids: 3, unasked: 1, left: 1, p50: 300 * time.Millisecond, p99: 600 * time.Millisecond, max: 600 * time.Millisecond}
	if got != want {
		t.Fatalf("killRecovery = %+v; want %+v", got, want)
	}
	rs := recoveries([]round{{kind: nemPause}, {kind: nemKillWorker, kills: []kill{{"w1.1", killAt}}}}, ev)
	if len(rs) != 1 || rs[0].round != 2 || rs[0].workers != "w1.1" || rs[0].p99 != want.p99 {
		t.Fatalf("recoveries = %+v; want round 2's alone", rs)
	}
	if row := "| 2 | kill-worker | w1.1 | 3 | 300ms | 600ms | 600ms | 1 | 1 |"; !strings.Contains(recoveryTable(rs), row) {
		t.Fatalf("recoveryTable:\n%s\nwant the row %s", recoveryTable(rs), row)
	}

	// Two processes killed one after the other: each id counts from its
	// own holder's kill.
	ev = append(ev,
		history.Event{Kind: history.KindActivate, Proc: "w3.1", ID: "d", Inst: "d1", T: 100 * ms},
		history.Event{Kind: history.KindExit, Proc: "w3.1", T: 2010 * ms},
		history.Event{Kind: history.KindRequest, ID: "d", Status: 200, Inst: "d2", T: 2050 * ms, End: 2100 * ms},
	)
	got = killRecovery(ev, []kill{{"w1.1", killAt}, {"w3.1", 2000 * ms}})
	want = recovery{ids: 4, unasked: 1, left: 1, p50: 300 * time.Millisecond, p99: 600 * time.Millisecond, max: 600 * time.Millisecond}
	if got != want {
		t.Fatalf("killRecovery of two kills = %+v; want %+v (d: 100 ms after its own kill)", got, want)
	}
}
