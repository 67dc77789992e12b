package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// ringer is the object type of the alarm tests: POST /set sets an alarm,
// DELETE /set deletes one, GET /alarms lists them, POST /incr counts; its
// Alarm handler reports every run.
type ringer struct {
	inst  *Instance
	env   *ringEnv
	nonce int64
	n     int
}

type firing struct {
	id, name  string
	scheduled time.Time
	attempt   int
	nonce     int64
	inTurn    bool
}

type ringEnv struct {
	setups atomic.Int64
	fail   atomic.Int64 // the handler fails while positive (each run takes one)
	panics atomic.Bool  // the handler panics
	fired  chan firing
	block  chan struct{} // POST /block waits for it
}

func newRingEnv() *ringEnv {
	return &ringEnv{fired: make(chan firing, 1000), block: make(chan struct{})}
}

func (e *ringEnv) typ(withAlarm bool) Type[*ringer] {
	r := NewRoutes[*ringer]()
	r.POST("/set", func(o *ringer, c *Ctx) error {
		q := c.RequestCtx().QueryArgs()
		at, _ := strconv.ParseInt(string(q.Peek("at")), 10, 64)
		var opts []AlarmOption
		if v := q.GetUintOrZero("every"); v > 0 {
			opts = append(opts, Every(time.Duration(v)*time.Millisecond))
		}
		if q.Has("skip") {
			opts = append(opts, SkipMissed())
		}
		if v := q.GetUintOrZero("max"); v > 0 {
			opts = append(opts, MaxAttempts(v))
		}
		if v := q.GetUintOrZero("backoff"); v > 0 {
			opts = append(opts, RetryBackoff(time.Duration(v)*time.Millisecond))
		}
		err := o.inst.SetAlarm(string(q.Peek("name")), time.UnixMilli(at), opts...)
		switch {
		case errors.Is(err, ErrTooManyAlarms):
			return &Error{Status: 409, Message: err.Error()}
		case errors.Is(err, ErrAlarmsUnsupported):
			return &Error{Status: 501, Message: err.Error()}
		case err != nil:
			return err
		}
		c.RequestCtx().SetStatusCode(204)
		return nil
	})
	r.DELETE("/set", func(o *ringer, c *Ctx) error {
		if err := o.inst.DeleteAlarm(string(c.RequestCtx().QueryArgs().Peek("name"))); err != nil {
			return err
		}
		c.RequestCtx().SetStatusCode(204)
		return nil
	})
	r.GET("/alarms", func(o *ringer, c *Ctx) error {
		as, err := o.inst.Alarms()
		if err != nil {
			return err
		}
		out := []map[string]any{}
		for _, a := range as {
			out = append(out, map[string]any{"name": a.Name, "at": a.At.UnixMilli(), "due": a.Due.UnixMilli(), "failures": a.Failures, "every": a.Every.Milliseconds()})
		}
		return c.JSON(200, out)
	})
	r.POST("/incr", func(o *ringer, c *Ctx) error { o.n++; return c.JSON(200, o.n) })
	r.POST("/block", func(o *ringer, c *Ctx) error { <-e.block; return nil }) // holds the turn
	typ := Type[*ringer]{
		New: func(inst *Instance) (*ringer, error) {
			return &ringer{inst: inst, env: e, nonce: e.setups.Add(1)}, nil
		},
		Routes: r,
	}
	if withAlarm {
		typ.Alarm = func(o *ringer, x *AlarmCtx) error {
			o.n++ // touched without a lock: the race detector checks the turn
			e.fired <- firing{id: x.ID(), name: x.Name(), scheduled: x.Scheduled(), attempt: x.Attempt(), nonce: o.nonce,
				inTurn: len(o.inst.turn) == 1 && x.Instance() == o.inst && x.Context() == o.inst.Context()}
			if e.panics.Load() {
				panic("alarm boom")
			}
			if e.fail.Add(-1) >= 0 {
				return errors.New("boom")
			}
			return nil
		}
	}
	return typ
}

type ringHost struct {
	*testServer
	env *ringEnv
	clk *clock.Fake
}

func newRingHost(t *testing.T, cfg Config, withAlarm bool) *ringHost {
	t.Helper()
	env := newRingEnv()
	clk := fakeClock()
	cfg.Namespace = "/r"
	cfg.Clock = clk
	cfg.IdleTimeout = -1 // no sweeper: the alarm loop owns the only fake timer
	cfg.Logger = quietLogger()
	h, err := New(cfg, env.typ(withAlarm))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	return &ringHost{testServer: serve(t, h, h.Handler), env: env, clk: clk}
}

func (r *ringHost) nowMs() int64 { return r.clk.Now().UnixMilli() }

func (r *ringHost) set(id, name string, at int64, extra string) {
	r.t.Helper()
	r.expect(204, "POST", fmt.Sprintf("/r/%s/set?name=%s&at=%d%s", id, name, at, extra))
}

type listed struct {
	Name     string `json:"name"`
	At       int64  `json:"at"`
	Due      int64  `json:"due"`
	Failures int    `json:"failures"`
	Every    int64  `json:"every"`
}

func (r *ringHost) list(id string) []listed {
	r.t.Helper()
	var out []listed
	if err := json.Unmarshal([]byte(r.expect(200, "GET", "/r/"+id+"/alarms").body), &out); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// awaitList polls the listing (the alarm loop's writes) until cond holds.
func (r *ringHost) awaitList(id, what string, cond func([]listed) bool) []listed {
	r.t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		l := r.list(id)
		if cond(l) {
			return l
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: not within %v; alarms %+v", what, testTimeout, l)
		}
		time.Sleep(time.Millisecond)
	}
}

// advance moves the fake clock once the alarm loop sleeps on it.
func (r *ringHost) advance(d time.Duration) {
	r.t.Helper()
	if !r.clk.BlockUntil(1, r.h.closedDone) {
		r.t.Fatal("host closed")
	}
	r.clk.Advance(d)
}

func (r *ringHost) fired() firing {
	r.t.Helper()
	select {
	case f := <-r.env.fired:
		if !f.inTurn {
			r.t.Errorf("alarm handler of %s ran outside the instance's turn (or with another instance's context)", f.id)
		}
		return f
	case <-time.After(testTimeout):
		r.t.Fatal("no alarm fired")
		return firing{}
	}
}

// quiet asserts that nothing fired once the loop sleeps again.
func (r *ringHost) quiet() {
	r.t.Helper()
	r.clk.BlockUntil(1, r.h.closedDone)
	select {
	case f := <-r.env.fired:
		r.t.Fatalf("unexpected alarm run %+v", f)
	default:
	}
}

func TestLocalAlarmFiresAndWakesAnEvictedInstance(t *testing.T) {
	r := newRingHost(t, Config{}, true)
	at := r.nowMs() + 1000
	r.set("a", "tick", at, "")
	if l := r.list("a"); len(l) != 1 || l[0].Name != "tick" || l[0].At != at || l[0].Due != at {
		t.Fatalf("alarms = %+v; want tick at %d", l, at)
	}
	r.h.CloseIdle(EvictIdle) // the instance goes away; its alarm stays
	deadline := time.Now().Add(testTimeout)
	for r.h.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the idle instance did not close")
		}
		time.Sleep(time.Millisecond)
	}
	r.advance(999 * time.Millisecond)
	r.quiet()
	r.advance(time.Millisecond)
	f := r.fired()
	if f.id != "a" || f.name != "tick" || f.scheduled.UnixMilli() != at || f.attempt != 1 {
		t.Fatalf("fired %+v; want a/tick scheduled %d, attempt 1", f, at)
	}
	if f.nonce != 2 {
		t.Errorf("the alarm ran on instance #%d; want a new activation (#2) of the evicted id", f.nonce)
	}
	r.awaitList("a", "the one-shot alarm removed", func(l []listed) bool { return len(l) == 0 })
	if n := r.h.am.ok.Get(); n != 1 {
		t.Errorf("pinned_alarm_runs_total{result=ok} = %d; want 1", n)
	}
}

func TestLocalAlarmRetriesWithBackoffThenDeadLetters(t *testing.T) {
	r := newRingHost(t, Config{}, true)
	r.env.fail.Store(10)
	at := r.nowMs()
	r.set("a", "job", at, "&max=2&backoff=100")
	r.advance(0)
	if f := r.fired(); f.attempt != 1 {
		t.Fatalf("first run is attempt %d", f.attempt)
	}
	l := r.awaitList("a", "the failure recorded", func(l []listed) bool { return len(l) == 1 && l[0].Failures == 1 })
	if l[0].Due != at+100 {
		t.Fatalf("retry due %d; want %d (100 ms backoff)", l[0].Due, at+100)
	}
	r.advance(99 * time.Millisecond)
	r.quiet()
	r.advance(time.Millisecond)
	if f := r.fired(); f.attempt != 2 || f.scheduled.UnixMilli() != at {
		t.Fatalf("second run %+v; want attempt 2 of the occurrence %d", f, at)
	}
	r.awaitList("a", "the dead alarm removed", func(l []listed) bool { return len(l) == 0 })
	dead := r.h.DeadAlarms()
	if len(dead) != 1 || dead[0].ID != "a" || dead[0].Alarm.Name != "job" || dead[0].Alarm.Failures != 2 ||
		!strings.Contains(dead[0].Error, "HTTP 500") || !strings.Contains(dead[0].Error, "boom") {
		t.Fatalf("dead letters %+v; want a/job after 2 failures, HTTP 500 boom", dead)
	}
	if r.h.am.dead.Get() != 1 || r.h.am.failed.Get() != 2 {
		t.Errorf("dead %d, failed runs %d; want 1 and 2", r.h.am.dead.Get(), r.h.am.failed.Get())
	}
}

func TestLocalAlarmSetReplacesDeleteRemoves(t *testing.T) {
	r := newRingHost(t, Config{}, true)
	now := r.nowMs()
	r.set("a", "x", now+1000, "")
	r.set("a", "x", now+5000, "") // replaces
	r.set("a", "y", now+2000, "")
	r.expect(204, "DELETE", "/r/a/set?name=y")
	r.expect(204, "DELETE", "/r/a/set?name=nope") // not an error
	if l := r.list("a"); len(l) != 1 || l[0].Name != "x" || l[0].At != now+5000 {
		t.Fatalf("alarms = %+v; want only x at %d", l, now+5000)
	}
	r.advance(4999 * time.Millisecond)
	r.quiet() // neither the replaced time nor the deleted alarm fires
	r.advance(time.Millisecond)
	if f := r.fired(); f.name != "x" || f.scheduled.UnixMilli() != now+5000 {
		t.Fatalf("fired %+v; want x at %d", f, now+5000)
	}
	r.awaitList("a", "removed", func(l []listed) bool { return len(l) == 0 })
}

func TestLocalAlarmRepeats(t *testing.T) {
	r := newRingHost(t, Config{}, true)
	at := r.nowMs() + 1000
	r.set("a", "tick", at, "&every=1000")
	for k := range int64(3) {
		r.advance(time.Second)
		if f := r.fired(); f.scheduled.UnixMilli() != at+k*1000 || f.attempt != 1 {
			t.Fatalf("run %d: %+v; want the occurrence %d", k, f, at+k*1000)
		}
		r.awaitList("a", "the next occurrence", func(l []listed) bool { return len(l) == 1 && l[0].At == at+(k+1)*1000 })
	}
}

// The missed-tick policy: an alarm whose occurrences passed while it was
// not delivered (here: set 3.5 periods in the past) fires once for them by
// default (the latest passed one), or skips them with SkipMissed.
func TestLocalAlarmMissedTicks(t *testing.T) {
	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprintf("skip=%v", skip), func(t *testing.T) {
			r := newRingHost(t, Config{}, true)
			at := r.nowMs() - 3500
			extra := "&every=1000"
			if skip {
				extra += "&skip=1"
			}
			r.set("a", "tick", at, extra)
			r.advance(0) // the clock does not move: every delivery runs at at+3500
			if f := r.fired(); f.scheduled.UnixMilli() != at {
				t.Fatalf("first run scheduled %d; want %d", f.scheduled.UnixMilli()-at, 0)
			}
			if !skip {
				if f := r.fired(); f.scheduled.UnixMilli() != at+3000 {
					t.Fatalf("catch-up run scheduled %d; want 3000 (the latest passed occurrence, once)", f.scheduled.UnixMilli()-at)
				}
			}
			r.awaitList("a", "the next future occurrence", func(l []listed) bool { return len(l) == 1 && l[0].At == at+4000 })
			r.quiet()
		})
	}
}

func TestLocalAlarmLimitsAndValidation(t *testing.T) {
	r := newRingHost(t, Config{MaxAlarmsPerInstance: 2}, true)
	now := r.nowMs() + 60_000
	r.set("a", "x", now, "")
	r.set("a", "y", now, "")
	r.expect(409, "POST", fmt.Sprintf("/r/a/set?name=z&at=%d", now))
	r.set("a", "y", now+1, "") // replacing at the cap is fine
	for _, c := range []struct{ q, field string }{
		{"name=&at=1", "name"},
		{"name=a%2Fb&at=1", "name"},
		{"name=x&at=1&every=10", "everyMs"},
		{"name=x&at=1&max=1000", "maxAttempts"},
		{"name=x&at=1&backoff=1", "backoffMs"},
	} {
		resp := r.expect(400, "POST", "/r/b/set?"+c.q)
		if m := resp.json(t); m["field"] != c.field {
			t.Errorf("%s: field %v; want %q (%s)", c.q, m["field"], c.field, resp.body)
		}
	}
}

// In local mode the delivery path is not reachable from clients.
func TestLocalAlarmPathIsNotServedToClients(t *testing.T) {
	r := newRingHost(t, Config{}, true)
	r.expect(404, "POST", "/r/a"+wire.PathAlarm, wire.HeaderAlarm, "1 1 x")
	select {
	case f := <-r.env.fired:
		t.Fatalf("a client ran the alarm handler: %+v", f)
	default:
	}
}

// fakeAlarmWorker is a fakeWorker that keeps alarms (host.AlarmStore).
type fakeAlarmWorker struct {
	*fakeWorker
	mu     sync.Mutex
	alarms map[string]Alarm // "<id>/<name>"
	calls  []string         // op ns id session
	fail   error            // SetAlarm's answer when set
}

func (w *fakeAlarmWorker) record(ctx context.Context, op, ns, id string) {
	sess, _ := ctx.Value(leaseKey{}).(string)
	_, hasDeadline := ctx.Deadline()
	w.calls = append(w.calls, fmt.Sprintf("%s %s %s %s deadline=%v", op, ns, id, sess, hasDeadline))
}

func (w *fakeAlarmWorker) SetAlarm(ctx context.Context, ns, id string, a Alarm) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.record(ctx, "set", ns, id)
	if w.fail != nil {
		return fmt.Errorf("scripted: %w", w.fail)
	}
	w.alarms[id+"/"+a.Name] = a
	return nil
}

func (w *fakeAlarmWorker) DeleteAlarm(ctx context.Context, ns, id, name string) (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.record(ctx, "delete", ns, id)
	_, ok := w.alarms[id+"/"+name]
	delete(w.alarms, id+"/"+name)
	return ok, nil
}

func (w *fakeAlarmWorker) Alarms(ctx context.Context, ns, id string) ([]Alarm, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.record(ctx, "list", ns, id)
	var out []Alarm
	for k, a := range w.alarms {
		if strings.HasPrefix(k, id+"/") {
			out = append(out, a)
		}
	}
	return out, nil
}

func newFleetRingHost(t *testing.T, w Worker, withAlarm bool) (*testServer, *ringEnv) {
	t.Helper()
	env := newRingEnv()
	h, err := New(Config{Namespace: "/r", Worker: w, Logger: quietLogger()}, env.typ(withAlarm))
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, h, h.Handler), env
}

func TestFleetAlarmDelivery(t *testing.T) {
	w := newFakeWorker()
	ts, env := newFleetRingHost(t, w, true)
	secret := []string{wire.HeaderProxySecret, w.secret}
	deliver := func(status int, id, header string) response {
		t.Helper()
		return ts.expect(status, "POST", "/r/"+id+wire.PathAlarm, append([]string{wire.HeaderAlarm, header}, secret...)...)
	}
	deliver(204, "x", "3 1234 tick")
	select {
	case f := <-env.fired:
		if f.id != "x" || f.name != "tick" || f.scheduled.UnixMilli() != 1234 || f.attempt != 3 || !f.inTurn {
			t.Fatalf("fired %+v; want x/tick scheduled 1234, attempt 3, in the turn", f)
		}
	case <-time.After(testTimeout):
		t.Fatal("the handler did not run")
	}
	// Without the alarm field, or with another method, the path is an
	// ordinary (unrouted) request; without the secret it is refused.
	ts.expect(404, "POST", "/r/x"+wire.PathAlarm, secret...)
	ts.expect(404, "GET", "/r/x"+wire.PathAlarm, append([]string{wire.HeaderAlarm, "1 1 tick"}, secret...)...)
	ts.expect(403, "POST", "/r/x"+wire.PathAlarm, wire.HeaderAlarm, "1 1 tick")
	if r := deliver(400, "x", "1 1 bad/name"); !strings.Contains(r.body, "alarm name") {
		t.Errorf("malformed alarm field: %s", r.body)
	}
	// A failing handler is a failed attempt (500), never a 503.
	env.fail.Store(1)
	if r := deliver(500, "x", "1 1 tick"); !strings.Contains(r.body, "alarm handler failed: boom") {
		t.Errorf("failed handler answered %s", r.body)
	}
	env.panics.Store(true)
	deliver(500, "x", "1 1 tick")
	env.panics.Store(false)
	// A refusal before any handler ran is a 503 (not an attempt).
	w.draining.Store(true)
	ts.expect503(wire.ReasonDraining, "POST", "/r/new"+wire.PathAlarm, append([]string{wire.HeaderAlarm, "1 1 tick"}, secret...)...)
}

func TestFleetAlarmWithoutHandlerIs404(t *testing.T) {
	w := newFakeWorker()
	ts, _ := newFleetRingHost(t, w, false)
	r := ts.expect(404, "POST", "/r/x"+wire.PathAlarm, wire.HeaderAlarm, "1 1 tick", wire.HeaderProxySecret, w.secret)
	if !strings.Contains(r.body, "no Alarm handler") {
		t.Errorf("body %s", r.body)
	}
}

// In fleet mode SetAlarm, DeleteAlarm and Alarms go to the worker's
// AlarmStore under the instance's lease, bounded by AlarmTimeout.
func TestFleetAlarmCallsTheWorker(t *testing.T) {
	w := &fakeAlarmWorker{fakeWorker: newFakeWorker(), alarms: map[string]Alarm{}}
	ts, _ := newFleetRingHost(t, w, true)
	secret := []string{wire.HeaderProxySecret, w.secret}
	ts.expect(204, "POST", "/r/x/set?name=tick&at=5000&every=2000&skip=1&max=3&backoff=50", secret...)
	ts.expect(204, "DELETE", "/r/x/set?name=other", secret...)
	ts.expect(200, "GET", "/r/x/alarms", secret...)
	w.mu.Lock()
	defer w.mu.Unlock()
	want := Alarm{Name: "tick", At: time.UnixMilli(5000), Every: 2 * time.Second, SkipMissed: true, MaxAttempts: 3, Backoff: 50 * time.Millisecond}
	if got := w.alarms["x/tick"]; got.Name != want.Name || !got.At.Equal(want.At) || got.Every != want.Every || !got.SkipMissed || got.MaxAttempts != 3 || got.Backoff != want.Backoff {
		t.Errorf("stored %+v; want %+v", got, want)
	}
	wantCalls := []string{"set /r x session-1 deadline=true", "delete /r x session-1 deadline=true", "list /r x session-1 deadline=true"}
	if strings.Join(w.calls, "\n") != strings.Join(wantCalls, "\n") {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(w.calls, "\n"), strings.Join(wantCalls, "\n"))
	}
}

func TestFleetAlarmWithoutAlarmStore(t *testing.T) {
	w := newFakeWorker()
	ts, _ := newFleetRingHost(t, w, true)
	ts.expect(501, "POST", "/r/x/set?name=tick&at=5000", wire.HeaderProxySecret, w.secret)
}

// A handler whose SetAlarm failed because the instance no longer holds its
// id, or the store is unreachable, answers 503 + Retry-After (lease, store):
// retry later, elsewhere.
func TestFleetAlarmUnavailableIs503(t *testing.T) {
	w := &fakeAlarmWorker{fakeWorker: newFakeWorker(), alarms: map[string]Alarm{}}
	ts, _ := newFleetRingHost(t, w, true)
	for _, c := range []struct {
		err    error
		reason string
	}{{ErrAlarmNotHolder, wire.ReasonLease}, {ErrAlarmUnavailable, wire.ReasonStore}} {
		w.mu.Lock()
		w.fail = c.err
		w.mu.Unlock()
		ts.expect503(c.reason, "POST", "/r/x/set?name=tick&at=5000", wire.HeaderProxySecret, w.secret)
	}
}

// A delivery admitted under a lease that ends while it waits for the turn
// runs no handler: the host checks the lease inline once it holds the turn
// (whatever the worker's watchdog does) and answers 503 lease.
func TestFleetAlarmChecksTheLeaseAfterTheTurn(t *testing.T) {
	w := newFakeWorker()
	ts, env := newFleetRingHost(t, w, true)
	secret := []string{wire.HeaderProxySecret, w.secret}
	blocked := make(chan response, 1)
	go func() { r, _ := ts.doErr("POST", "/r/x/block", secret...); blocked <- r }()
	delivered := make(chan response, 1)
	deadline := time.Now().Add(testTimeout)
	for ts.h.instance("x") == nil {
		if time.Now().After(deadline) {
			t.Fatal("x never activated")
		}
		time.Sleep(time.Millisecond) // the blocking request crosses the server
	}
	go func() {
		r, _ := ts.doErr("POST", "/r/x"+wire.PathAlarm, append([]string{wire.HeaderAlarm, "1 1 tick"}, secret...)...)
		delivered <- r
	}()
	inst := ts.h.instance("x")
	sh := &ts.h.shards[inst.shard]
	for {
		sh.mu.Lock()
		n := inst.activity
		sh.mu.Unlock()
		if n == 2 { // the delivery was admitted and waits for the turn
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the delivery never reached the instance")
		}
		time.Sleep(time.Millisecond)
	}
	w.mu.Lock()
	w.lease.expired.Store(true) // the deadline passed; nobody cancelled the lease
	w.mu.Unlock()
	close(env.block)
	if r := <-delivered; r.status != 503 || r.header.Get(wire.HeaderReason) != wire.ReasonLease {
		t.Fatalf("delivery = %d %s %s; want 503 lease", r.status, r.header.Get(wire.HeaderReason), r.body)
	}
	<-blocked
	select {
	case f := <-env.fired:
		t.Fatalf("the handler ran under an ended lease: %+v", f)
	default:
	}
}
