package loadgen

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/pinned-go/pinned/clock"
)

// The fasthttp engine: worker goroutines on fasthttp's HostClient (and
// websocket dialer). It runs what the event loops cannot (https, websocket
// scenarios, a custom Dial, an injected Clock) and feeds the same stats.

// queueCap bounds the open loop's queue of released slots. When it is full
// the scheduler waits for room; slots are delayed, never skipped, and their
// latency still counts from their intended time.
const queueCap = 1 << 16

// runFastHTTP runs the fasthttp engine.
func (r *Runner) runFastHTTP(ctx context.Context, t0 clock.Instant, sch *schedule, ser *series, measureStart clock.Instant) engineResult {
	res := engineResult{measureStart: measureStart, stoppedBy: StopDuration}
	var workers []*worker
	if sch != nil {
		workers = r.runOpen(ctx, sch, ser, measureStart)
	} else {
		var limitHit bool
		workers, limitHit = r.runClosed(ctx, t0, ser, measureStart)
		if limitHit {
			res.stoppedBy = StopRequests
		}
	}
	for _, w := range workers {
		res.stats = append(res.stats, &w.st)
	}
	res.recorders = len(workers)
	return res
}

// runOpen runs the open loop: a scheduler (this goroutine) releases slot
// numbers into a queue as their intended times come, and a pool of workers,
// grown up to MaxWorkers when slots wait and no worker is idle, sends them.
func (r *Runner) runOpen(ctx context.Context, sch *schedule, ser *series, measureStart clock.Instant) []*worker {
	clk := r.cfg.Clock
	q := make(chan int64, queueCap)
	var (
		wg      sync.WaitGroup
		idle    atomic.Int64 // workers waiting on q
		abandon atomic.Bool  // set after DrainTimeout or cancel: count queued slots as unsent
		workers []*worker
	)
	spawn := func() {
		w := r.newWorker(len(workers), ser, measureStart)
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
func (r *Runner) runClosed(ctx context.Context, t0 clock.Instant, ser *series, measureStart clock.Instant) ([]*worker, bool) {
	var (
		wg      sync.WaitGroup
		issued  atomic.Int64
		workers = make([]*worker, r.cfg.Connections)
	)
	for i := range workers {
		w := r.newWorker(i, ser, measureStart)
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
	pick  picker
	execs []executor
	out   outcome
	st    stats
}

func (r *Runner) newWorker(idx int, ser *series, measureStart clock.Instant) *worker {
	return &worker{
		r:     r,
		idx:   idx,
		pick:  r.newPicker(idx),
		execs: make([]executor, len(r.cfg.Scenarios)),
		st:    newStats(len(r.cfg.Scenarios), r.maxUs, ser, measureStart),
	}
}

func (w *worker) runOpen(q <-chan int64, sch *schedule, idle *atomic.Int64, abandon *atomic.Bool) {
	defer w.closeExecs()
	// idle counts this worker from its spawn until it takes a slot, and
	// again from when it finishes one.
	for {
		var (
			i  int64
			ok bool
		)
		select {
		case i, ok = <-q:
		default:
			// About to wait: hand this second's tally to the series first.
			w.st.iv.flushBefore(w.r.cfg.Clock.Now())
			i, ok = <-q
		}
		if !ok {
			break
		}
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
	sc, id := w.pick.next()
	e := w.execs[sc]
	if e == nil {
		e = w.r.makeExec(w, sc)
		w.execs[sc] = e
	}
	w.out = outcome{}
	live := &w.r.live[0]
	live.sent.Add(1)
	e.exec(id, &w.out)
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
