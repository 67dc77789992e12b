package alarm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ns = "/counter"

var t0 = time.Unix(1_800_000_000, 0)

// call is one Deliver the test answers.
type call struct {
	id    string
	d     wire.AlarmDelivery
	at    int64 // the scheduler's clock when it delivered (unix ms)
	reply chan reply
}

type reply struct {
	status int
	err    error
}

// stepDeliverer hands every delivery to the test and waits for its answer.
type stepDeliverer struct {
	clk   clock.Clock
	calls chan call
}

func (f *stepDeliverer) Deliver(ctx context.Context, namespace, id string, d wire.AlarmDelivery) (int, error) {
	c := call{id: id, d: d, at: f.clk.Now().UnixMilli(), reply: make(chan reply, 1)}
	f.calls <- c
	select {
	case r := <-c.reply:
		return r.status, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// rig is a scheduler on a memory store with a fake clock and a stepDeliverer.
type rig struct {
	t    *testing.T
	clk  *clock.Fake
	st   *memstore.Store
	d    *stepDeliverer
	s    *Scheduler
	mset *metrics.Set
	stop context.CancelFunc
	done chan struct{}
}

func newRig(t *testing.T, tweak func(*Config)) *rig {
	t.Helper()
	clk := clock.NewFake(t0)
	st, err := memstore.New(memstore.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, clk: clk, st: st, d: &stepDeliverer{clk: clk, calls: make(chan call, 1000)}, mset: metrics.NewSet(), done: make(chan struct{})}
	cfg := Config{Store: st, Deliverer: r.d, Clock: clk, Metrics: r.mset, Concurrency: 4, Batch: 4}
	if tweak != nil {
		tweak(&cfg)
	}
	if r.s, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() { defer close(r.done); _ = r.s.Run(ctx) }()
	t.Cleanup(r.close)
	return r
}

func (r *rig) close() {
	r.stop()
	<-r.done
	r.st.Close()
}

func (r *rig) nowMs() int64 { return r.clk.Now().UnixMilli() }

// set stores an alarm of id and nudges the scheduler, as the registry does.
func (r *rig) set(id string, a wire.Alarm) wire.Alarm {
	r.t.Helper()
	a = a.Normalized(fmt.Sprintf("g%d", rand.Int64()))
	if err := r.st.SetAlarm(context.Background(), ns, id, a, 100); err != nil {
		r.t.Fatal(err)
	}
	r.s.Nudge(wire.AlarmShard(wire.PlacementName(ns, id)), a.AtMs)
	return a
}

// advance moves the clock by d once the loop sleeps on it.
func (r *rig) advance(d time.Duration) {
	r.t.Helper()
	if !r.clk.BlockUntil(1, r.done) {
		r.t.Fatal("the scheduler stopped")
	}
	r.clk.Advance(d)
}

// next waits for the next delivery.
func (r *rig) next() call {
	r.t.Helper()
	select {
	case c := <-r.d.calls:
		return c
	case <-time.After(5 * time.Second):
		r.t.Fatal("no delivery within 5 s")
		return call{}
	}
}

// quiet asserts that no delivery is waiting once the loop sleeps.
func (r *rig) quiet() {
	r.t.Helper()
	r.clk.BlockUntil(1, r.done)
	if n := len(r.d.calls); n > 0 {
		c := <-r.d.calls
		r.t.Fatalf("%d unexpected deliveries, the first %s %+v at %d", n, c.id, c.d, c.at)
	}
}

// await polls the store (another goroutine's write) until cond holds.
func (r *rig) await(what string, cond func([]wire.Alarm) bool, id string) []wire.Alarm {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		as, err := r.st.ListAlarms(context.Background(), ns, id)
		if err != nil {
			r.t.Fatal(err)
		}
		if cond(as) {
			return as
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("not within 5 s: %s; alarms %+v", what, as)
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *rig) counter(name string) uint64 { return r.mset.GetOrCreateCounter(name).Get() }

// awaitCounter polls a counter (another goroutine's increment) until it
// reaches n.
func (r *rig) awaitCounter(name string, n uint64) {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.counter(name) < n {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s = %d, not %d within 5 s", name, r.counter(name), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDeliversWhenDueThenRemoves(t *testing.T) {
	r := newRig(t, nil)
	a := r.set("x", wire.Alarm{Name: "tick", AtMs: r.nowMs() + 1000})
	r.advance(999 * time.Millisecond)
	r.quiet()
	r.advance(time.Millisecond)
	c := r.next()
	if c.id != "x" || c.d != (wire.AlarmDelivery{Name: "tick", ScheduledMs: a.AtMs, Attempt: 1}) || c.at != a.AtMs {
		t.Fatalf("delivery %s %+v at %d; want x {tick %d 1} at %d", c.id, c.d, c.at, a.AtMs, a.AtMs)
	}
	c.reply <- reply{status: 204}
	r.await("the alarm removed after its 2xx", func(as []wire.Alarm) bool { return len(as) == 0 }, "x")
	r.advance(time.Minute)
	r.quiet()
	if n := r.counter(`pinned_alarm_deliveries_total{result="ok"}`); n != 1 {
		t.Errorf("ok deliveries = %d; want 1", n)
	}
}

func TestFailedAttemptsBackOffThenDeadLetter(t *testing.T) {
	r := newRig(t, nil)
	a := r.set("x", wire.Alarm{Name: "job", AtMs: r.nowMs(), MaxAttempts: 3, BackoffMs: 100})
	r.advance(0)
	for attempt := 1; attempt <= 3; attempt++ {
		c := r.next()
		if c.d.Attempt != attempt || c.d.ScheduledMs != a.AtMs {
			t.Fatalf("attempt %d delivered as %+v; want attempt %d of the occurrence %d", attempt, c.d, attempt, a.AtMs)
		}
		c.reply <- reply{status: 500, err: errors.New("boom")}
		if attempt == 3 {
			break
		}
		as := r.await("the failure recorded", func(as []wire.Alarm) bool { return len(as) == 1 && as[0].Failures == attempt }, "x")
		wait := time.Duration(100<<(attempt-1)) * time.Millisecond
		if as[0].DueMs != c.at+wait.Milliseconds() {
			t.Fatalf("after attempt %d due at %d; want %d (backoff %v)", attempt, as[0].DueMs, c.at+wait.Milliseconds(), wait)
		}
		r.advance(wait - time.Millisecond)
		r.quiet()
		r.advance(time.Millisecond)
	}
	r.await("the dead alarm removed", func(as []wire.Alarm) bool { return len(as) == 0 }, "x")
	dead, err := r.st.DeadAlarms(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].ID != "x" || dead[0].Alarm.Name != "job" || dead[0].Alarm.Failures != 3 || dead[0].Error != "HTTP 500: boom" {
		t.Fatalf("dead letters = %+v; want x/job after 3 failures with the last error", dead)
	}
	if n := r.counter("pinned_alarms_dead_lettered_total"); n != 1 {
		t.Errorf("dead-lettered = %d; want 1", n)
	}
}

func TestNoWorkerIsNotAnAttempt(t *testing.T) {
	r := newRig(t, nil)
	r.set("x", wire.Alarm{Name: "job", AtMs: r.nowMs(), MaxAttempts: 1})
	r.advance(0)
	for i, rep := range []reply{{status: 503, err: errors.New("no_worker")}, {err: fmt.Errorf("dial: %w", ErrNotDelivered)}} {
		c := r.next()
		if c.d.Attempt != 1 {
			t.Fatalf("delivery %d is attempt %d; want 1 (no attempt was made before)", i+1, c.d.Attempt)
		}
		c.reply <- rep
		as := r.await("the wait recorded", func(as []wire.Alarm) bool { return len(as) == 1 && as[0].Waits == i+1 }, "x")
		if wait := DefaultUnavailableBackoff.Milliseconds() << i; as[0].DueMs != c.at+wait || as[0].Failures != 0 {
			t.Fatalf("after %d unavailable deliveries: %+v; want due %d later, no failure", i+1, as[0], wait)
		}
		r.advance(time.Duration(DefaultUnavailableBackoff.Milliseconds()<<i) * time.Millisecond)
	}
	c := r.next()
	c.reply <- reply{status: 200}
	r.await("delivered", func(as []wire.Alarm) bool { return len(as) == 0 }, "x")
	if dead, _ := r.st.DeadAlarms(context.Background(), 10); len(dead) != 0 {
		t.Fatalf("dead letters %+v: a one-attempt alarm that found no worker twice must not die", dead)
	}
}

func TestRepeatingAlarmMovesToItsNextOccurrence(t *testing.T) {
	r := newRig(t, nil)
	a := r.set("x", wire.Alarm{Name: "tick", AtMs: r.nowMs() + 1000, EveryMs: 1000})
	r.advance(time.Second)
	c := r.next()
	c.reply <- reply{status: 204}
	as := r.await("the next occurrence", func(as []wire.Alarm) bool { return len(as) == 1 && as[0].AtMs == a.AtMs+1000 }, "x")
	if as[0].DueMs != a.AtMs+1000 {
		t.Fatalf("next occurrence due %d; want %d", as[0].DueMs, a.AtMs+1000)
	}
	r.advance(time.Second)
	if c := r.next(); c.d.ScheduledMs != a.AtMs+1000 || c.d.Attempt != 1 {
		t.Fatalf("second delivery %+v; want the occurrence %d, attempt 1", c.d, a.AtMs+1000)
	} else {
		c.reply <- reply{status: 204}
	}
}

func TestAlarmSetAgainDuringDeliveryIsKept(t *testing.T) {
	r := newRig(t, nil)
	r.set("x", wire.Alarm{Name: "tick", AtMs: r.nowMs()})
	r.advance(0)
	c := r.next()
	later := r.set("x", wire.Alarm{Name: "tick", AtMs: r.nowMs() + 5000})
	c.reply <- reply{status: 204}
	deadline := time.Now().Add(5 * time.Second)
	for r.counter("pinned_alarms_stale_total") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the finish of the replaced alarm was not counted as stale")
		}
		time.Sleep(time.Millisecond)
	}
	as := r.await("still listed", func(as []wire.Alarm) bool { return len(as) == 1 }, "x")
	if as[0].Gen != later.Gen || as[0].DueMs != later.AtMs {
		t.Fatalf("alarm = %+v; want the one set during the delivery (gen %s, due %d)", as[0], later.Gen, later.AtMs)
	}
}

// A claim of a pinboard that died ends after Claim: the alarm is then
// delivered by another, with the same attempt number (the first outcome is
// unknown).
func TestAlarmOfADeadClaimerIsDeliveredAfterItsClaim(t *testing.T) {
	r := newRig(t, nil)
	a := r.set("x", wire.Alarm{Name: "tick", AtMs: r.nowMs() + 1})
	shard := wire.AlarmShard(wire.PlacementName(ns, "x"))
	cs, _, err := r.st.ClaimAlarms(context.Background(), shard, a.AtMs, DefaultClaim, 10) // the pinboard that dies
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim = %v, %v", cs, err)
	}
	r.advance(DefaultClaim) // the claim ends at AtMs + Claim, 1 ms later
	r.quiet()
	r.advance(time.Millisecond)
	c := r.next()
	if c.d.Attempt != 1 || c.at != a.AtMs+DefaultClaim.Milliseconds() {
		t.Fatalf("redelivery %+v at %d; want attempt 1 at %d", c.d, c.at, a.AtMs+DefaultClaim.Milliseconds())
	}
	c.reply <- reply{status: 204}
}

// While every delivery finds no worker the scheduler stops claiming and
// sends one probe per pause; the first answer from a worker resumes it.
func TestOutagePausesClaimsAndProbes(t *testing.T) {
	// One delivery at a time, so that the deliveries before the pause
	// are exactly pauseAfter.
	r := newRig(t, func(c *Config) { c.Concurrency = 1 })
	for i := range 20 {
		r.set(fmt.Sprintf("id%d", i), wire.Alarm{Name: "a", AtMs: r.nowMs()})
	}
	r.advance(0)
	for range pauseAfter {
		r.next().reply <- reply{err: fmt.Errorf("refused: %w", ErrNotDelivered)}
	}
	unavailable := `pinned_alarm_deliveries_total{result="unavailable"}`
	r.awaitCounter(unavailable, pauseAfter) // the outcome read the clock: the pause runs from now
	pause := DefaultUnavailableBackoff
	for probe := range 3 {
		r.advance(pause - time.Millisecond)
		r.quiet() // paused: nothing is claimed
		r.advance(time.Millisecond)
		c := r.next() // the probe
		r.quiet()     // alone
		if probe < 2 {
			c.reply <- reply{status: 503}
			r.awaitCounter(unavailable, uint64(pauseAfter+probe+1))
			pause = min(2*pause, DefaultUnavailableBackoffMax)
			continue
		}
		c.reply <- reply{status: 204} // a worker is back
	}
	delivered := 1
	for delivered < 20 {
		select {
		case c := <-r.d.calls:
			c.reply <- reply{status: 204}
			delivered++
		case <-time.After(5 * time.Second):
			// The alarms that found no worker are due again a little later.
			r.advance(DefaultUnavailableBackoffMax)
		}
	}
	for i := range 20 {
		r.await("delivered", func(as []wire.Alarm) bool { return len(as) == 0 }, fmt.Sprintf("id%d", i))
	}
	if n := r.counter(`pinned_alarm_deliveries_total{result="unavailable"}`); n != pauseAfter+2 {
		t.Errorf("unavailable deliveries = %d; want %d (%d before the pause, 2 probes)", n, pauseAfter+2, pauseAfter)
	}
}

// countingDeliverer records how many deliveries of each alarm overlap.
type countingDeliverer struct {
	mu      sync.Mutex
	active  map[string]int
	total   map[string]int
	overlap []string
	n       atomic.Int64
}

func (c *countingDeliverer) Deliver(ctx context.Context, namespace, id string, d wire.AlarmDelivery) (int, error) {
	k := id + "/" + d.Name
	c.mu.Lock()
	c.active[k]++
	c.total[k]++
	if c.active[k] > 1 {
		c.overlap = append(c.overlap, k)
	}
	c.mu.Unlock()
	time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // a worker's handler takes a little time
	c.mu.Lock()
	c.active[k]--
	c.mu.Unlock()
	c.n.Add(1)
	return 204, nil
}

// Two schedulers on one store (two pinboards on one Redis) deliver every
// alarm exactly once when neither dies.
func TestTwoSchedulersNeverDeliverOneAlarmTwice(t *testing.T) {
	st, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := &countingDeliverer{active: map[string]int{}, total: map[string]int{}}
	const n = 400
	now := time.Now().UnixMilli()
	for i := range n {
		a := wire.Alarm{Name: "a", AtMs: now + int64(i%50)}.Normalized("g")
		if err := st.SetAlarm(context.Background(), ns, fmt.Sprintf("id%d", i), a, 100); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		s, err := New(Config{Store: st, Deliverer: d, Concurrency: 8, Batch: 5, PollInterval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = s.Run(ctx) })
	}
	deadline := time.Now().Add(20 * time.Second)
	for d.n.Load() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // waiting for another goroutine's deliveries
	}
	cancel()
	wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.total) != n {
		t.Fatalf("%d alarms delivered; want %d", len(d.total), n)
	}
	for k, c := range d.total {
		if c != 1 {
			t.Errorf("%s delivered %d times; want once", k, c)
		}
	}
	if len(d.overlap) > 0 {
		t.Errorf("deliveries of one alarm overlapped: %v", d.overlap)
	}
}

func TestConfigValidation(t *testing.T) {
	st, _ := memstore.New(memstore.Config{})
	defer st.Close()
	d := &stepDeliverer{}
	for _, c := range []Config{
		{},
		{Store: st},
		{Store: st, Deliverer: d, Claim: time.Second, DeliveryTimeout: time.Second},
		{Store: st, Deliverer: d, Concurrency: -1},
		{Store: st, Deliverer: d, UnavailableBackoff: time.Second, UnavailableBackoffMax: time.Millisecond},
		{Store: st, Deliverer: d, Batch: 1001},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	var _ store.Alarms = st
}
