package pinboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/alarm"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// fire is one run of obj's Alarm handler.
type fire struct {
	id, worker, nonce, name string
	scheduled, at           time.Time
	attempt                 int
}

func (a *activations) fired(f fire) {
	a.mu.Lock()
	a.fires = append(a.fires, f)
	a.mu.Unlock()
}

// firesOf returns the runs of id's alarms so far.
func (a *activations) firesOf(id string) []fire {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []fire
	for _, f := range a.fires {
		if f.id == id {
			out = append(out, f)
		}
	}
	return out
}

// awaitFires waits until id's alarms ran n times.
func (a *activations) awaitFires(t *testing.T, id string, n int, within time.Duration) []fire {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		fs := a.firesOf(id)
		if len(fs) >= n {
			return fs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d alarm runs within %v; want %d", id, len(fs), within, n)
		}
		time.Sleep(5 * time.Millisecond) // the alarm crosses the scheduler, the proxy path and a worker
	}
}

// setAlarm answers POST /counter/{id}/alarm?delay=D&name=N: an alarm D from
// now (202).
func setAlarm(o *obj, x *host.Ctx) error {
	q := x.RequestCtx().QueryArgs()
	d, err := time.ParseDuration(string(q.Peek("delay")))
	if err != nil {
		return &host.Error{Status: 400, Message: "delay: " + err.Error(), Field: "delay"}
	}
	name := string(q.Peek("name"))
	if name == "" {
		name = "a"
	}
	at := time.Now().Add(d)
	if err := o.inst.SetAlarm(name, at); err != nil {
		return err
	}
	return x.JSON(202, map[string]any{"at": at.UnixMilli(), "worker": o.worker})
}

func (fp *fleetPinboard) setAlarm(t *testing.T, id, name string, delay time.Duration) (worker string, at time.Time) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod("POST")
	req.SetRequestURI(fmt.Sprintf("http://%s/counter/%s/alarm?delay=%s&name=%s", fp.public, id, delay, name))
	if err := fp.hc.DoTimeout(req, resp, 10*time.Second); err != nil || resp.StatusCode() != 202 {
		t.Fatalf("set alarm %s/%s = %d %s %v", id, name, resp.StatusCode(), resp.Body(), err)
	}
	var out struct {
		At     int64  `json:"at"`
		Worker string `json:"worker"`
	}
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		t.Fatal(err)
	}
	return out.Worker, time.UnixMilli(out.At)
}

// Alarms set through either of two pinboards fire once each, within a
// second of their time, on the instance that holds the id; the fired ones
// are removed from the store.
func TestFleetAlarmsFireOnceOnTime(t *testing.T) {
	srv := redistest.Start(t)
	p1, p2 := startFleetPinboard(t, srv.URL), startFleetPinboard(t, srv.URL)
	act := newActivations()
	startFleetWorker(t, "a", p1.public, act, time.Minute)
	startFleetWorker(t, "b", p2.public, act, time.Minute)
	type set struct {
		worker string
		at     time.Time
	}
	sets := map[string]set{}
	for i := range 20 {
		id := fmt.Sprintf("al%d", i)
		w, at := []*fleetPinboard{p1, p2}[i%2].setAlarm(t, id, "tick", time.Second+time.Duration(i)*20*time.Millisecond)
		sets[id] = set{w, at}
	}
	for id, s := range sets {
		fs := act.awaitFires(t, id, 1, 10*time.Second)
		f := fs[0]
		late := f.at.Sub(s.at)
		if f.name != "tick" || f.attempt != 1 || !f.scheduled.Equal(s.at.Truncate(time.Millisecond)) || f.worker != s.worker {
			t.Errorf("%s fired %+v; want tick, attempt 1, scheduled %v, on %s", id, f, s.at, s.worker)
		}
		if late < 0 || late > time.Second {
			t.Errorf("%s fired %v after its time; want within [0, 1s]", id, late)
		}
	}
	// No second delivery: give every shard a poll of both schedulers.
	time.Sleep(2 * alarm.DefaultPollInterval) // waiting for something that must not happen
	for id := range sets {
		if fs := act.firesOf(id); len(fs) != 1 {
			t.Errorf("%s fired %d times; want once", id, len(fs))
		}
		if as, err := p1.p.Store().(store.Alarms).ListAlarms(context.Background(), "/counter", id); err != nil || len(as) != 0 {
			t.Errorf("%s still stores %+v (%v) after firing", id, as, err)
		}
	}
	act.check(t)
}

// An alarm of an instance that idled out (closed, placement released) wakes
// the id: it is placed and activated again like a request would be.
func TestFleetAlarmWakesAnEvictedInstance(t *testing.T) {
	srv := redistest.Start(t)
	p := startFleetPinboard(t, srv.URL)
	act := newActivations()
	startFleetWorker(t, "a", p.public, act, 300*time.Millisecond)
	_, at := p.setAlarm(t, "sleepy", "wake", 2*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := p.p.Store().Placement(context.Background(), "/counter", "sleepy")
		if err != nil {
			t.Fatal(err)
		}
		if h == "" {
			break // idle-evicted and released
		}
		if time.Now().After(deadline) {
			t.Fatal("the instance was never evicted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if time.Now().After(at) {
		t.Fatal("eviction took longer than the alarm's delay; the test proves nothing")
	}
	f := act.awaitFires(t, "sleepy", 1, 10*time.Second)[0]
	act.mu.Lock()
	n := act.total["sleepy"]
	act.mu.Unlock()
	if n != 2 || f.at.Sub(at) > time.Second {
		t.Fatalf("activations %d, fired %v late; want a second activation by the alarm, within 1s", n, f.at.Sub(at))
	}
}

// The worker holding an id dies (kill: no heartbeat, port closed) before
// its alarm is due: the alarm fires on another worker once the dead one's
// lease has ended.
func TestFleetAlarmFailsOverToAnotherWorker(t *testing.T) {
	srv := redistest.Start(t)
	p := startFleetPinboard(t, srv.URL)
	act := newActivations()
	a := startFleetWorker(t, "a", p.public, act, time.Minute)
	if w, _ := p.setAlarm(t, "x", "later", time.Second); w != "a" {
		t.Fatalf("x placed on %s; want a, the only worker", w)
	}
	startFleetWorker(t, "b", p.public, act, time.Minute)
	killed := time.Now()
	a.kill()
	f := act.awaitFires(t, "x", 1, 15*time.Second)[0]
	if f.worker != "b" || f.attempt != 1 {
		t.Fatalf("fired %+v; want on b, attempt 1 (the deliveries to the dead worker were not attempts)", f)
	}
	t.Logf("x's alarm fired on b %v after a was killed (lease 2s)", f.at.Sub(killed))
	if len(act.firesOf("x")) != 1 {
		t.Errorf("fired %d times; want once", len(act.firesOf("x")))
	}
}

// pinboard -dev keeps alarms in its memory store with the same semantics.
func TestDevAlarms(t *testing.T) {
	fp := &fleetPinboard{running: start(t, Settings{Dev: true})}
	fp.waitHealth(t, 200)
	act := newActivations()
	startFleetWorker(t, "a", fp.public, act, time.Minute)
	_, at := fp.setAlarm(t, "devx", "tick", 500*time.Millisecond)
	f := act.awaitFires(t, "devx", 1, 5*time.Second)[0]
	if late := f.at.Sub(at); late < 0 || late > time.Second {
		t.Fatalf("fired %v after its time", late)
	}
	code, body := fp.do("GET", fp.public, wire.PathAlarmsDead, token, nil)
	if code != 200 || !strings.Contains(string(body), `"deadAlarms":[]`) {
		t.Fatalf("dead letters = %d %s; want none", code, body)
	}
}

func TestAlarmSettings(t *testing.T) {
	s, err := ParseSettings([]string{"-alarm-concurrency", "8", "-alarm-claim", "1m"},
		[]string{"PINBOARD_TOKEN=" + token, "PINBOARD_ALARM_POLL_INTERVAL=250ms", "PINBOARD_MAX_ALARMS_PER_INSTANCE=7"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.Alarms.Concurrency != 8 || s.Alarms.Claim != time.Minute || s.Alarms.PollInterval != 250*time.Millisecond || s.Alarms.MaxAlarmsPerInstance != 7 {
		t.Fatalf("alarm settings = %+v", s.Alarms)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-alarm-claim", "5s"}, "Claim"},
		{[]string{"-alarm-concurrency", "0"}, "alarm-concurrency"},
		{[]string{"-alarm-poll-interval", "soon"}, "alarm-poll-interval"},
		{[]string{"-alarm-batch", "5000"}, "Batch"},
	} {
		if _, err := ParseSettings(c.args, []string{"PINBOARD_TOKEN=" + token}, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error naming %s", c.args, err, c.want)
		}
	}
}
