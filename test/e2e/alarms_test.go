package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/history"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// alarmCounter is a counter, the test fixture, that records its alarm runs
// in a history file (PINNED_HISTORY).
type alarmCounter struct {
	*counter
	hist string
}

func startAlarmCounter(t *testing.T, pb *pinboard, name string, args ...string) *alarmCounter {
	t.Helper()
	hist := filepath.Join(t.TempDir(), name+".jsonl")
	c := startCounterBin(t, pb, fixtureCounter, args, "PINNED_HISTORY="+hist)
	eventually(t, 15*time.Second, name+" registers", func() bool { return healthy(t, c) })
	return &alarmCounter{counter: c, hist: hist}
}

// events returns the history events of kind for id ("" for every id).
func (c *alarmCounter) events(t *testing.T, kind, id string) []history.Event {
	t.Helper()
	evs, err := history.Read(c.hist)
	if err != nil {
		t.Fatal(err)
	}
	var out []history.Event
	for _, e := range evs {
		if e.Kind == kind && (id == "" || e.ID == id) {
			out = append(out, e)
		}
	}
	return out
}

// setAlarm sets id's alarm through pb: POST /counter/{id}/alarm (202) and
// returns its scheduled time (unix ms).
func setAlarm(t *testing.T, pb *pinboard, id, name string, delay time.Duration) int64 {
	t.Helper()
	code, _, body := do(t, "POST", fmt.Sprintf("http://%s/counter/%s/alarm?delay=%s&name=%s", pb.public, id, delay, name), nil)
	if code != 202 {
		t.Fatalf("POST /counter/%s/alarm = %d %s; want 202", id, code, body)
	}
	var r struct {
		At int64 `json:"at"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r.At
}

func count(t *testing.T, pb *pinboard, id string) float64 {
	t.Helper()
	code, _, body := do(t, "GET", "http://"+pb.public+"/counter/"+id+"/", nil)
	var s struct {
		Count float64 `json:"count"`
	}
	if code != 200 || json.Unmarshal(body, &s) != nil {
		t.Fatalf("GET /counter/%s/ = %d %s", id, code, body)
	}
	return s.Count
}

// Two pinboards on one Redis, a counter registered with each: alarms set
// through either fire once each, within a second of their time, and each
// grows its counter by one.
func TestAlarmsFireOnceWithinASecond(t *testing.T) {
	rs := redistest.Start(t)
	pb1, pb2 := startPinboard(t, rs.URL), startPinboard(t, rs.URL)
	c1, c2 := startAlarmCounter(t, pb1, "c1"), startAlarmCounter(t, pb2, "c2")
	const n = 30
	due := map[string]int64{}
	for i := range n {
		id := fmt.Sprintf("ring%d", i)
		due[id] = setAlarm(t, []*pinboard{pb1, pb2}[i%2], id, "tick", 2*time.Second+time.Duration(i)*30*time.Millisecond)
	}
	fires := func() []history.Event {
		return append(c1.events(t, history.KindAlarm, ""), c2.events(t, history.KindAlarm, "")...)
	}
	eventually(t, 20*time.Second, "every alarm fires", func() bool { return len(fires()) >= n })
	time.Sleep(3 * time.Second) // a duplicate would come within a poll of either scheduler
	seen := map[string]int{}
	var worst int64
	for _, e := range fires() {
		seen[e.ID]++
		late := e.Wall - e.Sched
		worst = max(worst, late)
		if e.Sched != due[e.ID] || e.Alarm != "tick" || e.Attempt != 1 {
			t.Errorf("%s fired %+v; want tick scheduled %d, attempt 1", e.ID, e, due[e.ID])
		}
		if late < 0 || late > 1000 {
			t.Errorf("%s fired %d ms after its time; want within [0, 1000]", e.ID, late)
		}
	}
	for id := range due {
		if seen[id] != 1 {
			t.Errorf("%s fired %d times; want once", id, seen[id])
		}
		if got := count(t, pb1, id); got != 1 {
			t.Errorf("%s count = %v; want 1 (the alarm's increment)", id, got)
		}
	}
	t.Logf("%d alarms through 2 pinboards, worst lateness %d ms", n, worst)
}

// The worker holding an id is killed -9 before the id's alarm is due: the
// alarm fires on another worker after the failover (at once with fast
// failover: the delivery finds the worker gone; at the latest when the dead
// session's lease, 10 s, runs out), on a fresh instance.
func TestAlarmFiresOnAnotherWorkerAfterKill9(t *testing.T) {
	rs := redistest.Start(t)
	pb := startPinboard(t, rs.URL)
	a := startAlarmCounter(t, pb, "a")
	at := setAlarm(t, pb, "doomed", "later", 2*time.Second)
	if got := len(a.events(t, history.KindActivate, "doomed")); got != 1 {
		t.Fatalf("doomed activated %d times on a; want 1 (placed on the only worker)", got)
	}
	b := startAlarmCounter(t, pb, "b")
	a.Kill()
	killed := time.Now()
	eventually(t, 30*time.Second, "the alarm fires on b", func() bool { return len(b.events(t, history.KindAlarm, "doomed")) > 0 },
		func() string { return pb.Log() })
	f := b.events(t, history.KindAlarm, "doomed")[0]
	if f.Sched != at || f.Attempt != 1 || len(a.events(t, history.KindAlarm, "doomed")) != 0 {
		t.Fatalf("b fired %+v (a fired %d); want the occurrence %d, attempt 1, only on b", f, len(a.events(t, history.KindAlarm, "doomed")), at)
	}
	if got := count(t, pb, "doomed"); got != 1 {
		t.Errorf("count on b = %v; want 1", got)
	}
	t.Logf("fired on b %v after a was killed, %d ms after its time", time.Since(killed).Round(time.Millisecond), f.Wall-f.Sched)
}

// An instance closed for idleness (its placement released) is woken by its
// alarm: the id is placed and activated again, and the count grows.
func TestAlarmWakesAnIdleEvictedInstance(t *testing.T) {
	rs := redistest.Start(t)
	pb := startPinboard(t, rs.URL)
	c := startAlarmCounter(t, pb, "c", "-idle-timeout", "500ms")
	at := setAlarm(t, pb, "sleepy", "wake", 4*time.Second)
	eventually(t, 4*time.Second, "sleepy is evicted", func() bool { return len(c.events(t, history.KindTeardown, "sleepy")) == 1 })
	// The teardown is recorded before the worker's release reaches the
	// store: wait for the release (well before the alarm re-places the id).
	var w wire.WorkerInfo
	eventually(t, 2*time.Second, "sleepy's placement is released", func() bool {
		w, _ = workerAt(t, pb, c.addr)
		return w.Placements["/counter"] == 0
	}, func() string { return fmt.Sprintf("placements %v", w.Placements) })
	eventually(t, 10*time.Second, "the alarm fires", func() bool { return len(c.events(t, history.KindAlarm, "sleepy")) == 1 })
	f := c.events(t, history.KindAlarm, "sleepy")[0]
	acts := c.events(t, history.KindActivate, "sleepy")
	if len(acts) != 2 || f.Inst != acts[1].Inst || f.Wall-at > 1000 {
		t.Fatalf("activations %+v, fire %+v; want the alarm on a second activation, within 1 s", acts, f)
	}
	if got := count(t, pb, "sleepy"); got != 1 {
		t.Errorf("count = %v; want 1", got)
	}
	if strings.Contains(pb.Log(), "dead-lettered") {
		t.Errorf("pinboard dead-lettered an alarm:\n%s", pb.Log())
	}
}
