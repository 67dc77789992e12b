package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// The failover suite's measuring client: an open loop over the victim ids
// with a record of every request, so that each id's first 200 after the
// kill is known.

// failoverLoad asks each of ids every interval through the pinboard, open
// loop: id k mod N at start + k·interval/N, whatever came back before.
type failoverLoad struct {
	client   *fasthttp.HostClient
	base     string // http://pinboard
	ids      []string
	interval time.Duration
	preKill  time.Duration // load before the kill
	within   time.Duration // bound after the kill
	timeout  time.Duration // per request
	inFlight int           // senders, and so requests in flight
}

// failoverReq is one request of the load; times are from the load's start.
type failoverReq struct {
	id                   int
	status               int    // 0: no HTTP answer
	reason               string // X-Pinned-Reason of a non-2xx answer, or the error of no answer
	intended, sent, done time.Duration
}

// failoverTrace is every request of one load and the kill among them.
type failoverTrace struct {
	ids      int
	interval time.Duration
	kill     time.Duration // from the load's start, taken just before SIGKILL
	reqs     []failoverReq
	cpu      time.Duration // the client's (this process's) CPU over the load
	elapsed  time.Duration
}

// run runs the load for preKill, calls prepare (the counters before the
// kill), takes the kill time and calls kill, and goes on until every id was
// answered 200 by a request sent after the kill, or within passed. Every
// goroutine it starts has ended when it returns; requests due after the
// end are not sent.
func (l *failoverLoad) run(ctx context.Context, prepare func() error, kill func()) (*failoverTrace, error) {
	n := len(l.ids)
	gap := max(l.interval/time.Duration(n), 1)
	maxSlots := int64((l.preKill+l.within)/gap) + 1 // the count bound; within is the time bound
	urls := make([]string, n)
	for i, id := range l.ids {
		urls[i] = l.base + "/counter/" + id + "/"
	}
	cpu0 := processCPU()
	start := time.Now()
	var killAt atomic.Int64
	killAt.Store(math.MaxInt64)
	served := make([]atomic.Bool, n)
	var recovered atomic.Int64
	allServed, stop := make(chan struct{}), make(chan struct{})
	var allOnce sync.Once
	jobs := make(chan failoverReq, l.inFlight)
	per := make([][]failoverReq, l.inFlight)
	var senders sync.WaitGroup
	for w := range l.inFlight {
		senders.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for j := range jobs {
				select {
				case <-stop:
					continue // due after the end: not sent
				default:
				}
				req.SetRequestURI(urls[j.id])
				j.sent = time.Since(start)
				err := l.client.DoTimeout(req, resp, l.timeout)
				j.done = time.Since(start)
				switch {
				case err != nil:
					j.reason = errorKind(err)
				default:
					j.status = resp.StatusCode()
					if j.status/100 != 2 {
						j.reason = string(resp.Header.Peek(wire.HeaderReason))
					}
				}
				per[w] = append(per[w], j)
				if j.status == 200 && int64(j.sent) >= killAt.Load() && served[j.id].CompareAndSwap(false, true) {
					if recovered.Add(1) == int64(n) {
						allOnce.Do(func() { close(allServed) })
					}
				}
			}
		})
	}
	scheduled := make(chan struct{})
	go func() { // the schedule; run waits for it
		defer close(scheduled)
		defer close(jobs)
		t := time.NewTimer(0)
		defer t.Stop()
		<-t.C
		for k := range maxSlots {
			at := time.Duration(k) * gap
			if d := at - time.Since(start); d > 0 {
				t.Reset(d)
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
			select {
			case jobs <- failoverReq{id: int(k % int64(n)), intended: at}:
			case <-stop:
				return
			}
		}
	}()
	end := func() *failoverTrace {
		close(stop)
		<-scheduled
		senders.Wait()
		tr := &failoverTrace{ids: n, interval: l.interval, kill: time.Duration(killAt.Load()), elapsed: time.Since(start), cpu: processCPU() - cpu0}
		for _, p := range per {
			tr.reqs = append(tr.reqs, p...)
		}
		return tr
	}
	if err := sleepCtx(ctx, l.preKill); err != nil {
		end()
		return nil, err
	}
	if err := prepare(); err != nil {
		end()
		return nil, err
	}
	killAt.Store(int64(time.Since(start)))
	kill()
	bound := time.NewTimer(l.within)
	defer bound.Stop()
	select {
	case <-allServed:
	case <-bound.C:
	case <-ctx.Done():
	}
	tr := end()
	return tr, ctx.Err()
}

// errorKind names a request's failure for the report.
func errorKind(err error) string {
	switch {
	case errors.Is(err, fasthttp.ErrTimeout):
		return "timeout"
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return "no free connection"
	case errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection closed"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	}
	return "other"
}

// processCPU returns this process's user and system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// summary reads the trace: per id, the first 200 to a request sent after
// the kill; what every request that ended after the kill got (those in
// flight at the kill too); the schedule lag and CPU of the client.
func (t *failoverTrace) summary() FailoverRun {
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	run := FailoverRun{IDs: t.ids, IntervalMs: ms(t.interval), NotOK: map[string]int64{}, NoAnswerBy: map[string]int64{}}
	inf := time.Duration(math.MaxInt64)
	firstOK, firstAsk := make([]time.Duration, t.ids), make([]time.Duration, t.ids)
	for i := range t.ids {
		firstOK[i], firstAsk[i] = inf, inf
	}
	lag := make([]float64, 0, len(t.reqs))
	for _, r := range t.reqs {
		lag = append(lag, ms(r.sent-r.intended))
		if r.done < t.kill {
			if r.status != 200 {
				run.PreKillNotOK++
			}
			continue
		}
		// Ended after the kill: in flight at it, or sent after it.
		run.Requests++
		after := r.sent >= t.kill
		if after {
			firstAsk[r.id] = min(firstAsk[r.id], r.sent-t.kill)
		}
		switch {
		case r.status == 200:
			if after {
				firstOK[r.id] = min(firstOK[r.id], r.done-t.kill)
			}
		case r.status == 0:
			run.NoAnswer++
			run.NoAnswerBy[r.reason]++
		case r.status/100 != 2:
			reason := r.reason
			if reason == "" {
				reason = "-"
			}
			run.NotOK[fmt.Sprintf("%d %s", r.status, reason)]++
		}
	}
	pcts := func(xs []time.Duration, qs ...float64) []float64 {
		slices.Sort(xs)
		out := make([]float64, len(qs))
		for i, q := range qs {
			if v := rank(xs, q); v == inf {
				out[i] = -1
			} else {
				out[i] = ms(v)
			}
		}
		return out
	}
	for _, d := range firstOK {
		if d != inf {
			run.Recovered++
		}
	}
	rec := pcts(firstOK, 0.5, 0.99, 1)
	run.RecoveryP50Ms, run.RecoveryP99Ms, run.RecoveryMaxMs = rec[0], rec[1], rec[2]
	ask := pcts(firstAsk, 0.5, 1)
	run.FirstAskP50Ms, run.FirstAskMaxMs = ask[0], ask[1]
	sort.Float64s(lag)
	run.LagP50Ms, run.LagP99Ms, run.LagMaxMs = rank(lag, 0.5), rank(lag, 0.99), rank(lag, 1)
	if len(t.reqs) > 0 {
		run.ClientCPUUsPerReq = float64(t.cpu.Microseconds()) / float64(len(t.reqs))
	}
	if t.elapsed > 0 {
		run.ClientCores = t.cpu.Seconds() / t.elapsed.Seconds()
	}
	return run
}

// rank returns the q-quantile of sorted xs by nearest rank (the zero value
// for none).
func rank[T any](xs []T, q float64) T {
	var zero T
	if len(xs) == 0 {
		return zero
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}
