package sim

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
)

// Defaults of Config.
const (
	// DefaultDuration is the simulated time of the faulty phase: twelve
	// leases.
	DefaultDuration = 2 * time.Minute
	// DefaultHeal is the simulated time of the quiet phase that follows.
	DefaultHeal = 40 * time.Second
	// DefaultTraceLen is how many trace lines a Result keeps.
	DefaultTraceLen = 60
)

// The protocol's timing, as the product's defaults set it.
const (
	lease          = wire.DefaultLeaseMs * time.Millisecond // the pinboard's lease
	leaseBuffer    = 5 * time.Second                        // the worker's default LeaseBuffer
	heartbeatEvery = 3 * time.Second                        // the worker's default HeartbeatInterval
	callTimeout    = 2 * time.Second                        // one registry call of a worker
	forwardTimeout = 5 * time.Second                        // the proxy's answer timeout
	dialTimeout    = time.Second                            // a dial into a partition gives up
	maxAttempts    = 3                                      // the proxy's attempts per request
	releaseTries   = 3                                      // the worker's ReleaseAttempts
	staleWindow    = time.Minute                            // host.DefaultStaleRouteWindow (≥ 3 leases)
	restartFence   = lease                                  // the pinboard's default restart fence
	connTimeout    = 10 * time.Second                       // rueidis: a silent connection is closed (cache flushed) after this
	namespace      = "/c"
)

// Config selects one run. Everything else (the cluster's size, the
// workload, which faults are allowed and how often) is drawn from Seed.
type Config struct {
	// Seed determines the run entirely: the same seed (and the same code)
	// replays the same run, step for step.
	Seed uint64
	// Duration is the simulated time during which faults are injected;
	// zero means DefaultDuration.
	Duration time.Duration
	// Heal is the simulated time after Duration with every fault healed,
	// at the end of which every id must have been served through every
	// pinboard recently (liveness); zero means DefaultHeal, negative skips
	// the phase and its check.
	Heal time.Duration
	// TraceLen is how many of the last trace lines a Result keeps; zero
	// means DefaultTraceLen.
	TraceLen int
	// Trace, when set, receives every trace line as it happens (a replay).
	Trace func(line string)
}

// Result is what a run found.
type Result struct {
	Seed uint64
	// Violation describes the first broken invariant; "" when none.
	Violation string
	// Steps is the number of events the run processed.
	Steps int
	// Swarm names the cluster and the faults the seed allowed.
	Swarm string
	// Trace holds the last trace lines up to the violation (or the end).
	Trace []string
	// Stats counts what happened.
	Stats Stats
}

// Stats counts a run's events.
type Stats struct {
	Requests, Served, Refused503, TimedOut, Activations, StaleRefusals int
	Faults                                                             int
}

// String renders a failed run: the seed, the violation and its trace.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %s\n%s; %d steps\n", r.Seed, r.Violation, r.Swarm, r.Steps)
	for _, l := range r.Trace {
		b.WriteString("  ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	if faults.Enabled {
		fmt.Fprintf(&b, "replay: %s=%s go test -tags %s ./test/sim -run TestSimulationReplay -sim.seed %d -v",
			faults.EnvVar, os.Getenv(faults.EnvVar), faults.BuildTag, r.Seed)
	} else {
		fmt.Fprintf(&b, "replay: go test ./test/sim -run TestSimulationReplay -sim.seed %d -v", r.Seed)
	}
	return b.String()
}

// event is one scheduled step. An event aimed at a worker (w != nil) runs
// only in the worker's incarnation inc (a message to a crashed process is
// lost), and waits while the worker is frozen.
type event struct {
	at   time.Duration
	seq  uint64
	w    *worker
	inc  int
	desc string
	fn   func()
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	return cmp.Or(cmp.Compare(q[i].at, q[j].at), cmp.Compare(q[i].seq, q[j].seq)) < 0
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// world is one run: the scheduler, the clock, the store and the nodes.
type world struct {
	cfg   Config
	rng   *rand.Rand
	clk   *clock.Fake
	start time.Time
	now   time.Duration
	q     queue
	seq   uint64
	steps int

	st          *memstore.Store
	restartedAt time.Duration // the store's last restart (-1: never)
	pinboards   []*pinboard
	workers     []*worker
	byAddr      map[string]*worker
	ids         []string
	swarm       swarm

	trace     []string
	traceNext int
	stats     Stats
	violation string
	healed    bool
	instances int // instance serial numbers
	// lastServed[p][id]: when pinboard p last got a 200 for id (liveness).
	lastServed [][]time.Duration
}

// Run simulates one seed and reports the first invariant it broke.
func Run(cfg Config) Result {
	if cfg.Duration == 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.Heal == 0 {
		cfg.Heal = DefaultHeal
	}
	if cfg.TraceLen == 0 {
		cfg.TraceLen = DefaultTraceLen
	}
	w := &world{
		cfg:         cfg,
		rng:         rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		start:       time.Unix(1_800_000_000, 0),
		restartedAt: -1,
		byAddr:      map[string]*worker{},
		trace:       make([]string, 0, cfg.TraceLen),
	}
	w.clk = clock.NewFake(w.start)
	w.swarm = newSwarm(w.rng)
	w.st = w.newStore()
	for i := range w.swarm.ids {
		w.ids = append(w.ids, fmt.Sprintf("id%d", i))
	}
	for i := range w.swarm.pinboards {
		w.pinboards = append(w.pinboards, newPinboard(w, i))
	}
	for i := range w.swarm.workers {
		wk := newWorker(w, i)
		w.workers = append(w.workers, wk)
		w.byAddr[wk.addr] = wk
	}
	w.lastServed = make([][]time.Duration, len(w.pinboards))
	for i := range w.lastServed {
		w.lastServed[i] = make([]time.Duration, len(w.ids))
		for j := range w.lastServed[i] {
			w.lastServed[i][j] = -1
		}
	}
	for _, wk := range w.workers {
		wk.boot()
	}
	w.scheduleClients()
	w.scheduleFaults()
	end := cfg.Duration
	if cfg.Heal > 0 {
		w.at(cfg.Duration, nil, "heal every fault", w.heal)
		end += cfg.Heal
		w.scheduleProbes(end-cfg.Heal/2, end)
	}
	w.loop(end)
	if w.violation == "" && cfg.Heal > 0 {
		w.checkLiveness(end)
	}
	w.st.Close()
	for _, p := range w.pinboards {
		p.close()
	}
	return Result{Seed: cfg.Seed, Violation: w.violation, Steps: w.steps, Swarm: w.swarm.String(), Trace: w.lastTrace(), Stats: w.stats}
}

func (w *world) newStore() *memstore.Store {
	st, err := memstore.New(memstore.Config{Clock: w.clk, Options: store.Options{OnInvalidate: w.onInvalidate}})
	if err != nil {
		panic(err) // the config is constant
	}
	return st
}

// loop runs events in time order until end or a violation.
func (w *world) loop(end time.Duration) {
	for w.q.Len() > 0 && w.violation == "" {
		e := heap.Pop(&w.q).(*event)
		if e.at > end {
			return
		}
		if e.w != nil {
			if e.inc != e.w.inc {
				continue // the process it was meant for is gone
			}
			if e.w.frozenUntil > e.at {
				// The worker is frozen: the event waits for it to thaw, in
				// order behind what already waits.
				w.schedule(&event{at: e.w.frozenUntil, w: e.w, inc: e.inc, desc: e.desc, fn: e.fn})
				continue
			}
		}
		if e.at > w.now {
			w.clk.Advance(e.at - w.now)
			w.now = e.at
		}
		w.steps++
		e.fn()
		w.checkSafety()
	}
}

func (w *world) schedule(e *event) {
	w.seq++
	e.seq = w.seq
	heap.Push(&w.q, e)
}

// at schedules fn at simulated time t (no earlier than now), aimed at wk
// when not nil.
func (w *world) at(t time.Duration, wk *worker, desc string, fn func()) {
	e := &event{at: max(t, w.now), desc: desc, fn: fn}
	if wk != nil {
		e.w, e.inc = wk, wk.inc
	}
	w.schedule(e)
}

// after is at(now + d).
func (w *world) after(d time.Duration, wk *worker, desc string, fn func()) {
	w.at(w.now+d, wk, desc, fn)
}

// delay draws one message's network delay.
func (w *world) delay() time.Duration {
	s := &w.swarm
	d := time.Duration(w.rng.Int64N(int64(s.baseDelay) + 1))
	if s.slowChance > 0 && w.rng.Float64() < s.slowChance {
		d += time.Duration(w.rng.Int64N(int64(s.slowDelay) + 1))
	}
	return d + 50*time.Microsecond
}

// between draws a duration uniformly in [lo, hi].
func (w *world) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(w.rng.Int64N(int64(hi-lo)+1))
}

func (w *world) chance(p float64) bool { return w.rng.Float64() < p }

// logf adds a trace line.
func (w *world) logf(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs ", w.now.Seconds()) + fmt.Sprintf(format, args...)
	if w.cfg.Trace != nil {
		w.cfg.Trace(line)
	}
	if len(w.trace) < w.cfg.TraceLen {
		w.trace = append(w.trace, line)
		return
	}
	w.trace[w.traceNext] = line
	w.traceNext = (w.traceNext + 1) % len(w.trace)
}

func (w *world) lastTrace() []string {
	return append(slices.Clone(w.trace[w.traceNext:]), w.trace[:w.traceNext]...)
}

// onInvalidate is the store's OnInvalidate: each pinboard hears of the
// change through its own Redis connection, later.
func (w *world) onInvalidate(inv store.Invalidation) {
	for _, p := range w.pinboards {
		p.link.invalidation(inv)
	}
}

// checkSafety is the single-activation invariant, checked after every
// step: at most one live instance per id in the whole fleet. An instance is
// live when its process runs, it is active (set up, not closing), and the
// session it was activated under is its worker's current one with a lease
// the worker would still serve under (leaseterm.Term.Valid at now): exactly
// the instances that could serve a request now or as soon as their frozen
// worker thaws.
func (w *world) checkSafety() {
	now := w.clk.Now()
	for _, id := range w.ids {
		var live []*instance
		for _, wk := range w.workers {
			if inst := wk.insts[id]; inst != nil && wk.up && inst.active && wk.serves(inst, now) {
				live = append(live, inst)
			}
		}
		if len(live) > 1 {
			var parts []string
			for _, inst := range live {
				parts = append(parts, inst.String())
			}
			w.violation = fmt.Sprintf("two live instances of %s: %s", id, strings.Join(parts, " and "))
			w.logf("VIOLATION %s", w.violation)
			return
		}
	}
}

// scheduleProbes sends, from from to end, one GET of every id through
// every pinboard each second, so that the liveness check does not depend on
// where the random workload happened to go.
func (w *world) scheduleProbes(from, end time.Duration) {
	for t := from; t < end; t += time.Second {
		w.at(t, nil, "probes", func() {
			for _, p := range w.pinboards {
				for id := range w.ids {
					p.handle(&request{id: id, op: "GET", start: w.now})
				}
			}
		})
	}
}

// checkLiveness: after the quiet phase, every id was served through every
// running pinboard during its second half.
func (w *world) checkLiveness(end time.Duration) {
	since := end - w.cfg.Heal/2
	for pi, p := range w.pinboards {
		if !p.up {
			continue
		}
		for ii, id := range w.ids {
			if t := w.lastServed[pi][ii]; t < since {
				w.violation = fmt.Sprintf("liveness: %s not served through %s during the last %v of the quiet phase (last 200 at %.3fs)",
					id, p.name, w.cfg.Heal/2, t.Seconds())
				return
			}
		}
	}
}

var bg = context.Background()
