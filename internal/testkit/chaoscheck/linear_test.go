package chaoscheck

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

// req is a client request for id through pinboard via, sent at from and
// answered at to (seconds), answered by instance inst with count n.
func req(op, id string, via int, inst string, n int64, from, to float64) history.Event {
	return history.Event{Kind: history.KindRequest, Op: op, ID: id, Via: via, Inst: inst, Status: 200, Count: n, T: sec(from), End: sec(to)}
}

func add(id string, via int, inst string, n int64, from, to float64) history.Event {
	return req(opIncr, id, via, inst, n, from, to)
}

func read(id string, via int, inst string, n int64, from, to float64) history.Event {
	return req(opRead, id, via, inst, n, from, to)
}

// linear runs the linearizability check alone and returns its report and
// the violations by kind.
func linear(t *testing.T, cfg Config, ev []history.Event) (*LinearReport, map[string][]string) {
	t.Helper()
	cfg.LinearTimeout = cmp.Or(cfg.LinearTimeout, time.Minute)
	got := map[string][]string{}
	rep := checkLinear(cfg, ev, func(kind, format string, args ...any) {
		got[kind] = append(got[kind], fmt.Sprintf(format, args...))
	})
	t.Log(rep)
	for k, vs := range got {
		for _, v := range vs {
			t.Logf("%s: %s", k, v)
		}
	}
	return rep, got
}

func TestLinearSequentialAndConcurrent(t *testing.T) {
	ev := []history.Event{
		read("x", 1, "i1", 0, 1, 1.1),
		add("x", 2, "i1", 1, 2, 2.1),
		// Two increments at once: either order.
		add("x", 1, "i1", 3, 3, 3.5),
		add("x", 2, "i1", 2, 3.1, 3.4),
		// A read concurrent with an increment may see either count.
		read("x", 2, "i1", 2, 3.45, 3.6),
		read("x", 1, "i1", 3, 4, 4.1),
	}
	rep, v := linear(t, Config{}, ev)
	if len(v) != 0 || rep.IDs != 1 || rep.Ops != 6 || rep.Illegal != 0 {
		t.Fatalf("report %+v, violations %v; want one id, six operations, linearizable", rep, v)
	}
}

// Two instances of one id answering at once (the stale route to a
// re-activated holder): the history is not linearizable, and the violation
// names the id, both instances and the operations.
func TestLinearTwoInstances(t *testing.T) {
	dir := t.TempDir()
	ev := []history.Event{
		act("w1", "A", "x", "i1", 0.5),
		add("x", 1, "i1", 1, 1, 1.1),
		act("w2", "B", "x", "i2", 2),
		add("x", 2, "i2", 2, 2.5, 2.6),
		read("x", 1, "i1", 1, 3, 3.1), // the stale instance: the count went back
		add("x", 2, "i2", 3, 3.5, 3.6),
	}
	rep, v := linear(t, Config{VisualizeDir: dir}, ev)
	if rep.Illegal != 1 || len(v[VNotLinearizable]) != 1 {
		t.Fatalf("report %+v, violations %v; want x not linearizable", rep, v)
	}
	msg := v[VNotLinearizable][0]
	for _, want := range []string{"id x", "i1 (w1", "i2 (w2", "i1 and i2 answered at the same time", "pb1 GET → 1 (i1) ◀"} {
		if !strings.Contains(msg, want) {
			t.Errorf("violation %q lacks %q", msg, want)
		}
	}
	html, err := os.ReadFile(filepath.Join(dir, "linear-x.html"))
	if err != nil || !strings.Contains(string(html), "pb1 GET") {
		t.Fatalf("visualisation: %v (%d bytes); want porcupine's HTML with the operations", err, len(html))
	}
	if len(rep.Files) != 1 {
		t.Fatalf("files %v; want the one visualisation", rep.Files)
	}
}

// Without persistence a fresh instance starts at 0: a reset in the volatile
// model, a violation in the persisted one.
func TestLinearVolatileResets(t *testing.T) {
	ev := []history.Event{
		act("w1", "A", "x", "i1", 0.5),
		add("x", 1, "i1", 1, 1, 1.1),
		down("w1", "A", "x", "i1", 1.5),
		act("w2", "B", "x", "i2", 2),
		read("x", 2, "i2", 0, 2.5, 2.6),
	}
	if rep, v := linear(t, Config{Volatile: true}, ev); len(v) != 0 || rep.Resets != 2 {
		t.Fatalf("volatile: report %+v, violations %v; want linearizable with two resets", rep, v)
	}
	if _, v := linear(t, Config{}, ev); len(v[VNotLinearizable]) != 1 {
		t.Fatalf("persisted: violations %v; want the lost count found", v)
	}
}

// An increment without an answer may take effect later or never; one
// refused with a no-effect reason never does.
func TestLinearUnknownOutcomes(t *testing.T) {
	open := add("x", 1, "", 0, 1, 1.5)
	open.Status, open.Err = 0, "timeout"
	gateway := add("x", 2, "", 0, 2, 2.5)
	gateway.Status = 502
	ev := []history.Event{open, gateway, read("x", 1, "i1", 0, 3, 3.1), read("x", 2, "i1", 1, 4, 4.1), read("x", 2, "i1", 2, 5, 5.1)}
	if rep, v := linear(t, Config{}, ev); len(v) != 0 || rep.Open != 2 {
		t.Fatalf("report %+v, violations %v; want two open increments, linearizable", rep, v)
	}
	refused := add("x", 1, "", 0, 1, 1.5)
	refused.Status, refused.Reason, refused.RetryAfter = 503, "store", true
	if _, v := linear(t, Config{}, []history.Event{refused, read("x", 1, "i1", 1, 3, 3.1)}); len(v[VNotLinearizable]) != 1 {
		t.Fatalf("violations %v; a 503 store promised no effect, so a later count of 1 is not linearizable", v)
	}
}

// Ids with background effects are not checked; the others are.
func TestLinearExcludesBackgroundEffects(t *testing.T) {
	ev := []history.Event{
		add("x", 1, "i1", 1, 1, 1.1),
		req("POST /incr-later?delay=2s", "x", 1, "i1", 0, 1.2, 1.3),
		read("x", 1, "i1", 2, 4, 4.1), // the task's effect: not modelled
		{Kind: history.KindAlarm, ID: "y", T: sec(2)},
		read("y", 1, "j1", 1, 3, 3.1),
		read("z", 1, "k1", 0, 3, 3.1),
	}
	rep, v := linear(t, Config{}, ev)
	if len(v) != 0 || rep.IDs != 1 || rep.Excluded != 2 {
		t.Fatalf("report %+v, violations %v; want z checked, x and y excluded", rep, v)
	}
}

// A check that cannot decide in time fails.
func TestLinearUndecidedFails(t *testing.T) {
	ev := []history.Event{read("x", 1, "i1", 0, 1, 1.1)}
	rep, v := linear(t, Config{LinearTimeout: time.Nanosecond}, ev)
	if rep.Unknown != 1 || len(v[VLinearUnknown]) != 1 {
		t.Fatalf("report %+v, violations %v; want the id undecided, a violation", rep, v)
	}
	r := Check(Config{LeaseBuffer: 5 * time.Second, LinearTimeout: time.Nanosecond}, append(base(), ev...))
	if r.OK() || r.Violations[VLinearUnknown] != 1 {
		t.Fatalf("Check with an undecided id: %v; want a failure", r.Violations)
	}
}
