package chaoscheck

import (
	"testing"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

// incr is a client POST /incr of id at t: answered status (with count on a
// 2xx), or a client error when status is 0.
func incr(id string, t float64, status int, count int64) history.Event {
	e := history.Event{Kind: history.KindRequest, Op: opIncr, ID: id, Via: 1, T: sec(t), End: sec(t + 0.01), Status: status, Count: count, RetryAfter: status == 503}
	if status == 0 {
		e.Err = "reset"
	}
	return e
}

// refused is a POST /incr answered 503 with a reason.
func refused(id string, t float64, reason string) history.Event {
	e := incr(id, t, 503, 0)
	e.Reason = reason
	return e
}

func stored(id string, n int64) history.Event {
	return history.Event{Kind: history.KindStored, ID: id, Count: n, T: sec(59)}
}

func TestStoredCounts(t *testing.T) {
	effect := history.Event{Kind: history.KindEffect, Proc: "w1", Session: "A", ID: "x", Inst: "i1", T: sec(3)}
	cases := []struct {
		name string
		ev   []history.Event
		want string // violation kind; "" = none
		ok   func(*Report) bool
	}{
		{"every acknowledged increment stored", []history.Event{incr("x", 2, 200, 1), incr("x", 3, 200, 2), incr("x", 4, 200, 3), stored("x", 3)}, "",
			func(r *Report) bool {
				return r.Stored.IDs == 1 && r.Stored.Exact == 1 && r.Stored.Final == 3 && r.Stored.Acked == 3
			}},
		{"an effect and an unknown outcome explain more", []history.Event{incr("x", 2, 200, 1), effect, incr("x", 4, 0, 0), incr("x", 5, 502, 0), stored("x", 3)}, "",
			func(r *Report) bool { return r.Stored.Effects == 1 && r.Stored.Unknown == 2 && r.Stored.Exact == 0 }},
		{"refusals change nothing", []history.Event{incr("x", 2, 200, 1), refused("x", 3, "store"), refused("x", 3.2, "stale"), incr("x", 3.5, 400, 0), stored("x", 1)}, "",
			func(r *Report) bool { return r.Stored.Unknown == 0 && r.Stored.Exact == 1 }},
		{"a refusal cannot explain a stored increment", []history.Event{incr("x", 2, 200, 1), refused("x", 3, "lease"), stored("x", 2)}, VPhantomIncrement, nil},
		{"an aborted request may have stored", []history.Event{incr("x", 2, 200, 1), refused("x", 3, "aborted"), stored("x", 2)}, "",
			func(r *Report) bool { return r.Stored.Unknown == 1 }},
		{"two answers with one count: an overwritten write", []history.Event{incr("x", 2, 200, 1), incr("x", 3, 200, 1), stored("x", 2)}, VLostIncrement, nil},
		{"stored below the largest acknowledged count", []history.Event{incr("x", 2, 200, 1), incr("x", 3, 200, 2), stored("x", 1)}, VLostIncrement, nil},
		{"stored below the number acknowledged", []history.Event{incr("x", 2, 200, 1), incr("x", 3, 200, 2), stored("x", 0)}, VLostIncrement, nil},
		{"a 2xx without a count", []history.Event{incr("x", 2, 200, 0), stored("x", 1)}, VLostIncrement, nil},
		{"stored more than any request explains", []history.Event{incr("x", 2, 200, 1), incr("x", 3, 0, 0), stored("x", 3)}, VPhantomIncrement, nil},
		{"an id never incremented holds nothing", []history.Event{stored("y", 1)}, VPhantomIncrement, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := check(t, append(base(), tc.ev...))
			if tc.want == "" {
				if r.Violations[VLostIncrement]+r.Violations[VPhantomIncrement] != 0 {
					t.Fatalf("violations %v; want none of the stored counts", r.Violations)
				}
			} else if r.Violations[tc.want] == 0 {
				t.Fatalf("violations %v; want %q", r.Violations, tc.want)
			}
			if tc.ok != nil && !tc.ok(r) {
				t.Fatalf("report %+v", r.Stored)
			}
		})
	}
	// Without KindStored events nothing is checked.
	if r := check(t, append(base(), incr("x", 2, 200, 1))); r.Stored.IDs != 0 || r.Violations[VLostIncrement] != 0 {
		t.Fatalf("no stored counts: %+v %v", r.Stored, r.Violations)
	}
}
