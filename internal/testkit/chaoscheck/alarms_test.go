package chaoscheck

import (
	"testing"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

// alarmSet is the client's 202 to POST /alarm?...&name=name for id at t.
func alarmSet(id, name string, t float64) history.Event {
	return history.Event{Kind: history.KindRequest, Op: "POST /alarm?delay=1s&name=" + name, ID: id, Via: 1, T: sec(t), End: sec(t) + 1000, Status: 202}
}

// alarmRun is a run of id's alarm name (scheduled at sched s) at t on w2.
func alarmRun(id, inst, name string, sched, t float64) history.Event {
	return history.Event{Kind: history.KindAlarm, Proc: "w2", Session: "B", ID: id, Inst: inst, Alarm: name,
		Sched: sec(sched) / 1e6, Wall: sec(t) / 1e6, Attempt: 1, T: sec(t)}
}

func nemesis(kind string, from, to float64) history.Event {
	return history.Event{Kind: history.KindNemesis, Nemesis: kind, T: sec(from), End: sec(to)}
}

// base2 is base with instance i2 of y on w2 (session B) and a client
// request at 120 s (the end of the history).
func base2() []history.Event {
	return append(base(), act("w2", "B", "y", "i2", 2),
		history.Event{Kind: history.KindRequest, Op: "GET /", ID: "y", Via: 1, T: sec(120), End: sec(120), Status: 200})
}

func TestAlarmsCleanRun(t *testing.T) {
	ev := append(base2(), alarmSet("y", "a1", 3), alarmRun("y", "i2", "a1", 4, 4.2), alarmSet("y", "a2", 100))
	r := check(t, ev)
	a := r.Alarms
	if !r.OK() || a.Set != 2 || a.Runs != 1 || a.Occurrence != 1 || a.Pending != 1 || a.Lost != 0 || a.MaxLateness.Milliseconds() != 200 {
		t.Fatalf("want a pass (one run, one pending alarm, 200 ms late):\n%s", r)
	}
}

func TestAlarmDuplicateOutsideAFaultFails(t *testing.T) {
	ev := append(base2(), alarmSet("y", "a1", 3), alarmRun("y", "i2", "a1", 4, 4.1), alarmRun("y", "i2", "a1", 4, 4.3))
	r := check(t, ev)
	if r.OK() || r.Violations[VAlarmDuplicate] != 1 || r.Alarms.Duplicates != 1 {
		t.Fatalf("want the duplicate caught:\n%s", r)
	}
	// A pinboard killed between the two runs (its claim ran out) explains it.
	ev = append(ev, nemesis(NemesisKillPinboard, 4.15, 6))
	if r := check(t, ev); !r.OK() || r.Alarms.Explained != 1 {
		t.Fatalf("want the duplicate across a pinboard kill allowed:\n%s", r)
	}
}

func TestAlarmLost(t *testing.T) {
	ev := append(base2(), alarmSet("y", "a1", 3))
	r := check(t, ev)
	if r.OK() || r.Violations[VAlarmLost] != 1 || UnrunAlarms(ev) != 1 {
		t.Fatalf("want a lost alarm:\n%s", r)
	}
	// A Redis restart after the set loses alarms by design.
	if r := check(t, append(ev, nemesis(NemesisRedisRestart, 3.5, 4))); !r.OK() || r.Alarms.LostToRedis != 1 ||
		UnrunAlarms(append(ev, nemesis(NemesisRedisRestart, 3.5, 4))) != 0 {
		t.Fatalf("want the loss excused by the Redis restart:\n%s", r)
	}
}

func TestAlarmRunAfterTheLeaseFails(t *testing.T) {
	// w1's session A ends at 14 s.
	run := history.Event{Kind: history.KindAlarm, Proc: "w1", Session: "A", ID: "x", Inst: "i1", Alarm: "a", Sched: 15000, Wall: 15000, Attempt: 1, T: sec(15)}
	r := check(t, append(base(), run))
	if r.OK() || r.Violations[VAlarmAfter] != 1 {
		t.Fatalf("want the run after the lease caught:\n%s", r)
	}
	// Right after a pause of w1 across the end: the pause race, allowed.
	paused := append(base(), run, history.Event{Kind: history.KindNemesis, Nemesis: NemesisPause, Target: "w1", T: sec(12), End: sec(14.5)})
	if r := check(t, paused); !r.OK() {
		t.Fatalf("want the run right after a pause allowed:\n%s", r)
	}
}

func TestAlarmName(t *testing.T) {
	for op, want := range map[string]string{
		"POST /alarm?delay=1s&name=c17": "c17",
		"POST /alarm?name=x":            "x",
		"POST /incr":                    "",
		"POST /incr-later?delay=2s":     "",
		"POST /alarm?delay=1s":          "",
	} {
		if got := alarmName(op); got != want {
			t.Errorf("alarmName(%q) = %q; want %q", op, got, want)
		}
	}
}
