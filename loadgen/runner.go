package loadgen

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
)

// Values of Report.StoppedBy.
const (
	StopDuration = "duration" // the Duration bound ended the run
	StopRequests = "requests" // the Requests bound ended the run
	StopCanceled = "canceled" // Run's context was cancelled
)

// queueCap bounds the open loop's queue of released slots. When it is full
// the scheduler waits for room; slots are delayed, never skipped, and their
// latency still counts from their intended time.
const queueCap = 1 << 16

// ErrAlreadyRun is returned by a second call to Run: a Runner runs once.
var ErrAlreadyRun = errors.New("loadgen: Runner already ran; make a new one with New")

// Runner runs one load test. Make it with New, call Run once.
type Runner struct {
	cfg      Config
	runID    string
	seed     uint64
	ids      idSource
	cum      []float64 // cumulative scenario weights
	hc       *fasthttp.HostClient
	wsd      *websocket.Dialer
	httpBase string
	wsBase   string
	maxUs    int64
	ran      atomic.Bool
	live     liveCounters

	// Test hooks, set before Run.
	newExec func(w *worker, sc int) executor               // replaces the real executors
	observe func(slot int64, intended, done clock.Instant) // sees every open-loop slot
}

// liveCounters feed the progress line; they count warmup requests too.
type liveCounters struct {
	sent, done, errs atomic.Int64
}

// New validates cfg, applies its defaults and prepares a Runner. It does no
// I/O and starts no goroutines. Errors wrap ErrConfig.
func New(cfg Config) (*Runner, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: c, runID: c.IDs.RunID, seed: c.IDs.Seed, maxUs: c.MaxLatency.Microseconds()}
	if r.runID == "" {
		r.runID = randomRunID()
	}
	if r.seed == 0 {
		r.seed = rand.Uint64()
	}
	r.ids = newIDSource(c.IDs, r.runID)
	sum := 0.0
	for _, s := range c.Scenarios {
		sum += s.Weight
		r.cum = append(r.cum, sum)
	}
	u, _ := url.Parse(c.URL) // validated by withDefaults
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	r.httpBase, r.wsBase = "http://"+u.Host, "ws://"+u.Host
	for _, s := range c.Scenarios {
		if s.Kind == KindWS {
			if r.wsd == nil {
				r.wsd = newWSDialer(&r.cfg)
			}
		} else if r.hc == nil {
			r.hc = &fasthttp.HostClient{
				Addr:                      addr,
				MaxConns:                  c.Connections,
				MaxConnWaitTimeout:        c.ConnWaitTimeout,
				MaxIdleConnDuration:       c.IdleConnTimeout,
				ReadTimeout:               c.Timeout,
				WriteTimeout:              c.Timeout,
				ReadBufferSize:            8 << 10,
				NoDefaultUserAgentHeader:  true,
				DisablePathNormalizing:    true,
				DialDualStack:             true,
				MaxIdemponentCallAttempts: 1, // never retry: a retry would hide an error and its latency
			}
			if c.Dial != nil {
				r.hc.Dial = c.Dial
			}
		}
	}
	return r, nil
}

// RunID returns the run's id (the prefix of DistNew ids).
func (r *Runner) RunID() string { return r.runID }

func randomRunID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	var b [8]byte
	v := rand.Uint64()
	for i := range b {
		b[i] = alphabet[v&31]
		v >>= 5
	}
	return string(b[:])
}

// Run runs the load test and returns its report. Cancelling ctx ends the
// run early (StoppedBy = "canceled") and still returns a report of what was
// measured. Run returns only after every goroutine it started has exited
// and every connection it opened is closed or idle in the HostClient (closed
// before Run returns). Request failures are results, not errors: the error
// is non-nil only for ErrAlreadyRun.
func (r *Runner) Run(ctx context.Context) (*Report, error) {
	if r.ran.Swap(true) {
		return nil, ErrAlreadyRun
	}
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	clk := r.cfg.Clock
	t0 := clk.Now()
	wallStart := time.Now()

	progStop := make(chan struct{})
	var progDone sync.WaitGroup
	if r.cfg.Progress != nil {
		progDone.Go(func() { r.progress(progStop, t0) })
	}

	var (
		workers      []*worker
		stoppedBy    string
		measureStart clock.Instant
	)
	if r.cfg.IsOpenLoop() {
		sch, by := newSchedule(t0, &r.cfg)
		workers = r.runOpen(ctx, &sch)
		stoppedBy, measureStart = by, sch.intended(sch.warmup)
	} else {
		var limitHit bool
		workers, limitHit = r.runClosed(ctx, t0)
		stoppedBy, measureStart = StopDuration, t0.Add(r.cfg.Warmup)
		if limitHit {
			stoppedBy = StopRequests
		}
	}
	if ctx.Err() != nil {
		stoppedBy = StopCanceled
	}
	close(progStop)
	progDone.Wait()
	if r.hc != nil {
		r.hc.CloseIdleConnections()
	}

	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)

	agg := newStats(len(r.cfg.Scenarios), r.maxUs)
	for _, w := range workers {
		agg.merge(&w.st)
	}
	rep := r.report(&agg, reportTimes{wallStart: wallStart, measureStart: measureStart}, stoppedBy)
	rep.Generator = generatorStats(&ms0, &ms1)
	rep.Generator.Workers = len(workers)
	return rep, nil
}

// runOpen runs the open loop: a scheduler (this goroutine) releases slot
// numbers into a queue as their intended times come, and a pool of workers,
// grown up to MaxWorkers when slots wait and no worker is idle, sends them.
func (r *Runner) runOpen(ctx context.Context, sch *schedule) []*worker {
	clk := r.cfg.Clock
	q := make(chan int64, queueCap)
	var (
		wg      sync.WaitGroup
		idle    atomic.Int64 // workers waiting on q
		abandon atomic.Bool  // set after DrainTimeout or cancel: count queued slots as unsent
		workers []*worker
	)
	spawn := func() {
		w := r.newWorker(len(workers))
		workers = append(workers, w)
		idle.Add(1) // idle from birth, so a worker still starting up is not replaced
		wg.Go(func() { w.runOpen(q, sch, &idle, &abandon) })
	}
	grow := func() {
		for waiting := int64(len(q)) - idle.Load(); waiting > 0 && len(workers) < r.cfg.MaxWorkers; waiting-- {
			spawn()
		}
	}
	spawn()

	var timer clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	next := int64(0)
	canceled := false
schedule:
	for next < sch.total {
		due := sch.due(clk.Now().Sub(sch.t0))
		for ; next < due; next++ {
			select {
			case q <- next:
				continue
			default:
			}
			grow()
			select {
			case q <- next:
			case <-ctx.Done():
				canceled = true
				break schedule
			}
		}
		grow()
		if next >= sch.total {
			break
		}
		wait := sch.offset(next) - clk.Now().Sub(sch.t0)
		if wait <= 0 {
			continue
		}
		if timer == nil {
			timer = clk.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-timer.C():
		case <-ctx.Done():
			canceled = true
			break schedule
		}
	}
	close(q)

	// Drain: let the workers send what is queued, for at most DrainTimeout.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if canceled {
		abandon.Store(true)
	} else {
		drain := clk.NewTimer(r.cfg.DrainTimeout)
		select {
		case <-done:
		case <-drain.C():
			abandon.Store(true)
		case <-ctx.Done():
			abandon.Store(true)
		}
		drain.Stop()
	}
	<-done
	return workers
}

// runClosed runs Connections workers, each sending its next request as soon
// as the previous one finished. It reports whether the Requests bound was
// reached.
func (r *Runner) runClosed(ctx context.Context, t0 clock.Instant) ([]*worker, bool) {
	var (
		wg      sync.WaitGroup
		issued  atomic.Int64
		workers = make([]*worker, r.cfg.Connections)
	)
	for i := range workers {
		w := r.newWorker(i)
		workers[i] = w
		wg.Go(func() { w.runClosed(ctx, t0, &issued) })
	}
	wg.Wait()
	return workers, r.cfg.Requests != Unbounded && issued.Load() >= r.cfg.Requests
}

// worker sends requests and tallies them. Everything in it is owned by its
// goroutine until that goroutine exits.
type worker struct {
	r     *Runner
	idx   int
	rng   *rand.Rand
	id    []byte
	execs []executor
	out   outcome
	st    stats
}

func (r *Runner) newWorker(idx int) *worker {
	return &worker{
		r:     r,
		idx:   idx,
		rng:   rand.New(rand.NewPCG(r.seed, uint64(idx))),
		id:    make([]byte, 0, 64),
		execs: make([]executor, len(r.cfg.Scenarios)),
		st:    newStats(len(r.cfg.Scenarios), r.maxUs),
	}
}

func (w *worker) runOpen(q <-chan int64, sch *schedule, idle *atomic.Int64, abandon *atomic.Bool) {
	defer w.closeExecs()
	// idle counts this worker from its spawn until it takes a slot, and
	// again from when it finishes one.
	for i := range q {
		idle.Add(-1)
		w.openSlot(i, sch, abandon)
		idle.Add(1)
	}
	idle.Add(-1)
}

func (w *worker) openSlot(i int64, sch *schedule, abandon *atomic.Bool) {
	if abandon.Load() {
		if i >= sch.warmup {
			w.st.unsent++
		}
		return
	}
	clk := w.r.cfg.Clock
	intended := sch.intended(i)
	start := clk.Now()
	sc := w.send()
	done := clk.Now()
	if obs := w.r.observe; obs != nil {
		obs(i, intended, done)
	}
	if i < sch.warmup {
		return
	}
	w.st.lastStart = start
	w.st.recordLag(start.Sub(intended))
	w.st.recordService(done.Sub(start))
	w.st.record(sc, done.Sub(intended), &w.out, done)
}

func (w *worker) runClosed(ctx context.Context, t0 clock.Instant, issued *atomic.Int64) {
	defer w.closeExecs()
	clk := w.r.cfg.Clock
	cfg := &w.r.cfg
	for {
		select {
		case <-ctx.Done():
			return
		default:
		}
		start := clk.Now()
		elapsed := start.Sub(t0)
		if cfg.Duration != Unbounded && elapsed >= cfg.Warmup+cfg.Duration {
			return
		}
		warm := elapsed < cfg.Warmup
		if !warm && cfg.Requests != Unbounded && issued.Add(1) > cfg.Requests {
			return
		}
		sc := w.send()
		if warm {
			continue
		}
		done := clk.Now()
		w.st.record(sc, done.Sub(start), &w.out, done)
	}
}

// send picks a scenario and an id, performs the request into w.out and
// returns the scenario index.
func (w *worker) send() int {
	sc := 0
	if len(w.r.cum) > 1 {
		u := w.rng.Float64() * w.r.cum[len(w.r.cum)-1]
		for sc < len(w.r.cum)-1 && u >= w.r.cum[sc] {
			sc++
		}
	}
	e := w.execs[sc]
	if e == nil {
		e = w.r.makeExec(w, sc)
		w.execs[sc] = e
	}
	w.id = w.r.ids.appendID(w.id[:0], w.rng)
	w.out = outcome{}
	live := &w.r.live
	live.sent.Add(1)
	e.exec(w.id, &w.out)
	live.done.Add(1)
	if w.out.err != nil || (w.out.status != 0 && (w.out.status < 200 || w.out.status > 299)) {
		live.errs.Add(1)
	}
	return sc
}

func (w *worker) closeExecs() {
	for _, e := range w.execs {
		if e != nil {
			e.close()
		}
	}
}

func (r *Runner) makeExec(w *worker, sc int) executor {
	if r.newExec != nil {
		return r.newExec(w, sc)
	}
	s := &r.cfg.Scenarios[sc]
	if s.Kind == KindWS {
		return newWSExec(r.wsd, r.wsBase, s, r.cfg.Headers, r.cfg.Timeout, w.idx)
	}
	return newHTTPExec(r.hc, r.httpBase, s, r.cfg.Headers)
}
