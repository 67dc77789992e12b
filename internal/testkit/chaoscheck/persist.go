package chaoscheck

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/history"
)

// Violation kinds of the persisted counts (see checkStored).
const (
	VLostIncrement    = "acknowledged increment lost"
	VPhantomIncrement = "stored increments no request explains"
)

// noEffect are the x-pinned-reason values of a 503 that promise the
// request had no effect: refused before it reached an instance, or (stale)
// refused with nothing written. aborted is not among them.
var noEffect = map[string]bool{
	wire.ReasonCapacity: true, wire.ReasonDraining: true, wire.ReasonClosing: true, wire.ReasonLease: true,
	wire.ReasonStale: true, wire.ReasonNoWorker: true, wire.ReasonUnreachable: true,
	wire.ReasonOverloaded: true, wire.ReasonStore: true,
}

// opIncr is the client's operation whose 2xx acknowledges one increment.
const opIncr = "POST /incr"

// Stored summarises the application store's final counts against the
// increments the client saw acknowledged.
type Stored struct {
	// IDs is how many ids the harness read from the store (0: the run did
	// not persist; nothing below was checked).
	IDs int
	// Final is the sum of the stored counts; Acked the number of POST /incr
	// answered 2xx; Effects the background increments the workers logged
	// (incr-later); Unknown the POST /incr whose outcome the client could
	// not know (no answer, or a 5xx other than a 503 whose reason promises
	// no effect).
	Final, Acked, Effects, Unknown int64
	// Exact is how many ids hold exactly Acked + Effects for that id.
	Exact int
}

func (s Stored) String() string {
	if s.IDs == 0 {
		return "stored counts: not checked (no KindStored events)"
	}
	return fmt.Sprintf("stored counts: %d ids, sum %d = %d acknowledged increments + %d of %d task effects + %d of %d unknown outcomes (%d ids exactly acknowledged + effects)",
		s.IDs, s.Final, s.Acked, min(s.Effects, max(s.Final-s.Acked, 0)), s.Effects,
		max(s.Final-s.Acked-s.Effects, 0), s.Unknown, s.Exact)
}

// checkStored checks the stored count of every id (KindStored, written by
// the harness after the run) against the client's increments:
//
//   - no acknowledged increment is lost: the counts the 2xx answers of
//     POST /incr carried are distinct (each increment stored makes a new
//     count; two answers with one count mean one of them was overwritten)
//     and positive, and the stored count is at least the largest of them
//     and at least their number;
//   - nothing is stored that no request explains: the stored count is at
//     most the acknowledged increments, plus the task effects and alarm
//     runs the workers logged (each logged before its write; the caller
//     passes both as effects), plus the increments whose
//     outcome the client could not know (no answer, or a 5xx other than a
//     503 whose x-pinned-reason promises no effect: capacity, draining,
//     closing, lease, stale, no_worker, unreachable, overloaded, store).
//
// With neither effects nor unknown outcomes this is "the stored count
// equals the number of acknowledged increments".
func checkStored(r *Report, stored map[string]int64, requests, effects []history.Event, violate func(kind, format string, args ...any)) {
	if len(stored) == 0 {
		return
	}
	type tally struct {
		counts          []int64
		effects, unsure int64
	}
	by := map[string]*tally{}
	get := func(id string) *tally {
		t := by[id]
		if t == nil {
			t = &tally{}
			by[id] = t
		}
		return t
	}
	for _, e := range requests {
		if e.Op != opIncr {
			continue
		}
		switch {
		case e.Err == "" && e.Status/100 == 2:
			get(e.ID).counts = append(get(e.ID).counts, e.Count)
		case e.Err != "" || e.Status >= 500 && !(e.Status == 503 && noEffect[e.Reason]):
			get(e.ID).unsure++
		}
	}
	for _, e := range effects {
		get(e.ID).effects++
	}
	r.Stored.IDs = len(stored)
	for _, id := range slices.Sorted(maps.Keys(stored)) {
		final := stored[id]
		t := get(id)
		r.Stored.Final += final
		r.Stored.Acked += int64(len(t.counts))
		r.Stored.Effects += t.effects
		r.Stored.Unknown += t.unsure
		if final == int64(len(t.counts))+t.effects {
			r.Stored.Exact++
		}
		slices.Sort(t.counts)
		var dup []string
		for i, c := range t.counts {
			if c <= 0 {
				violate(VLostIncrement, "id %s: a 2xx POST /incr answered no count", id)
			}
			if i > 0 && c == t.counts[i-1] {
				dup = append(dup, fmt.Sprint(c))
			}
		}
		if len(dup) > 0 {
			violate(VLostIncrement, "id %s: acknowledged increments answered the same count (%s): an older activation overwrote a newer one's write",
				id, strings.Join(slices.Compact(dup), ", "))
		}
		if n := len(t.counts); n > 0 && final < max(t.counts[n-1], int64(n)) {
			violate(VLostIncrement, "id %s: stored count %d, below the %d acknowledged increments (largest acknowledged count %d)",
				id, final, n, t.counts[n-1])
		}
		if most := int64(len(t.counts)) + t.effects + t.unsure; final > most {
			violate(VPhantomIncrement, "id %s: stored count %d, above %d acknowledged + %d task effects + %d unknown outcomes",
				id, final, len(t.counts), t.effects, t.unsure)
		}
	}
}
