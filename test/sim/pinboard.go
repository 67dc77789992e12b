package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/proxy"
)

// pinboard is a simulated pinboard: the real placement resolver (its cache,
// its misses, claims, replaces and renewals, Refused), in front of its own
// link to the store, and the proxy's per-request decisions around it (a
// host's 503 closing, draining, lease or stale, and an unreachable worker,
// tell the resolver and try again within the attempt budget; no answer
// within the forward timeout is a 504).
type pinboard struct {
	w    *world
	idx  int
	name string
	res  *placement.Resolver
	link *storeLink
	up   bool
	inc  int // incarnation: replies to an earlier one are lost
	// cutFrom[i]: until when requests to worker i are lost (a partition).
	cutFrom map[int]time.Duration
}

func newPinboard(w *world, i int) *pinboard {
	p := &pinboard{w: w, idx: i, name: fmt.Sprintf("p%d", i+1), up: true, cutFrom: map[int]time.Duration{}}
	p.link = newStoreLink(w, p)
	p.res = p.newResolver()
	return p
}

func (p *pinboard) newResolver() *placement.Resolver {
	w := p.w
	r, err := placement.New(placement.Config{
		ConfirmDeath: p.confirmDeath,
		Store:        p.link,
		Lease:        lease,
		RefreshAhead: -1, // refreshes run on Run's goroutines; the simulation has none
		CacheShards:  1,  // one shard: which names share one does not depend on a hash seed
		Clock:        w.clk,
		Rand:         func(n int64) int64 { return w.rng.Int64N(n) },
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err) // the config is constant
	}
	return r
}

func (p *pinboard) close() { p.res.Close() }

func (p *pinboard) crash(d time.Duration) {
	w := p.w
	w.logf("%s crashes (restarts in %v)", p.name, d)
	p.up = false
	p.inc++
	p.res.Close()
	w.after(d, nil, "pinboard restarts", func() {
		if !p.up {
			p.restart()
		}
	})
}

func (p *pinboard) restart() {
	p.up, p.inc = true, p.inc+1
	p.link.flush()
	p.res = p.newResolver()
	p.w.logf("%s restarts with an empty cache", p.name)
}

// request is one client request through a pinboard.
type request struct {
	id      int
	op      string
	start   time.Duration
	attempt int
	pending int // the attempt whose answer is awaited; 0 when answered
}

// reply is a worker's answer.
type reply struct {
	status int
	reason string
	inst   *instance // 200: the instance that served
}

// handle routes a client request.
func (p *pinboard) handle(rq *request) {
	if !p.up {
		return // connection refused: the client retries elsewhere
	}
	p.forward(rq)
}

func (p *pinboard) forward(rq *request) {
	w := p.w
	rq.attempt++
	id := w.ids[rq.id]
	name := []byte(wire.PlacementName(namespace, id))
	rt, ok := p.res.Lookup(name, w.clk.Now().Wall())
	if !ok {
		var err error
		rt, err = p.res.Resolve(bg, name)
		if err != nil {
			reason := wire.ReasonStore
			if errors.Is(err, proxy.ErrNoWorker) {
				reason = wire.ReasonNoWorker
			}
			p.answer(rq, 503, reason, nil, "resolve: "+err.Error())
			return
		}
	}
	wk := w.byAddr[rt.Session.AdvertiseURL]
	attempt, inc := rq.attempt, p.inc
	rq.pending = attempt
	if wk == nil || !wk.up {
		// Nothing listens there: the connection is refused, so the
		// request provably did not leave.
		w.after(w.delay(), nil, "connection refused", func() {
			if p.inc == inc && rq.pending == attempt {
				p.refused(rq, rt, wire.ReasonUnreachable)
			}
		})
		return
	}
	w.after(forwardTimeout, nil, "forward timeout", func() {
		if p.inc == inc && rq.pending == attempt {
			p.answer(rq, 504, "", nil, "no answer from "+wk.name)
		}
	})
	if until := p.cutFrom[wk.idx]; w.now < until {
		// A partition: the dial times out, so the worker is reported
		// unreachable (which proves nothing: its lease stands).
		w.after(dialTimeout, nil, "dial timeout", func() {
			if p.inc == inc && rq.pending == attempt {
				p.refused(rq, rt, wire.ReasonUnreachable)
			}
		})
		return
	}
	msg := dataRequest{id: id, op: rq.op, secret: rt.Session.Secret, session: rt.Session.ID, epoch: rt.Epoch}
	w.after(w.delay(), wk, "request", func() {
		rep := wk.serve(msg)
		w.after(w.delay(), nil, "reply", func() {
			if p.inc != inc || rq.pending != attempt {
				return // answered already (timed out), or this pinboard restarted
			}
			switch {
			case rep.status == 200:
				p.answer(rq, 200, "", rep.inst, "")
			case rep.status == 503 && (rep.reason == wire.ReasonClosing || rep.reason == wire.ReasonDraining ||
				rep.reason == wire.ReasonLease || rep.reason == wire.ReasonStale):
				p.refused(rq, rt, rep.reason)
			case rep.status == 403:
				// Another process at the session's address (a restart):
				// nothing ran; the proxy treats it as unreachable.
				p.refused(rq, rt, wire.ReasonUnreachable)
			default:
				p.answer(rq, rep.status, rep.reason, nil, "")
			}
		})
	})
}

// refused is the proxy's answer to a host's refusal or an unreachable
// worker: tell the resolver, and try again while the budget lasts.
func (p *pinboard) refused(rq *request, rt proxy.Route, reason string) {
	p.res.Refused([]byte(wire.PlacementName(namespace, p.w.ids[rq.id])), rt, reason)
	// Fast failover's probe runs within the step (Run's probers would run it
	// concurrently; the retry below waits for it either way).
	p.res.ProbeQueued(bg)
	if rq.attempt < maxAttempts {
		p.forward(rq)
		return
	}
	p.answer(rq, 503, reason, nil, "")
}

func (p *pinboard) answer(rq *request, status int, reason string, inst *instance, note string) {
	w := p.w
	rq.pending = 0
	id := w.ids[rq.id]
	switch status {
	case 200:
		w.stats.Served++
		if w.healed {
			w.lastServed[p.idx][rq.id] = w.now
		}
		w.logf("%s %s %s: 200 from %s", p.name, rq.op, id, inst)
	case 504:
		w.stats.TimedOut++
		w.logf("%s %s %s: 504 (%s)", p.name, rq.op, id, note)
	default:
		w.stats.Refused503++
		w.logf("%s %s %s: %d %s %s", p.name, rq.op, id, status, reason, note)
	}
}

// confirmDeath is fast failover's probe as the pinboard's does it
// (placement.Config.ConfirmDeath), against the simulated process at the
// session's address: dead when nothing listens there (a crashed process,
// not restarted) or another process does (restarted: it does not know the
// session's secret); a frozen process (its kernel still accepts) or one
// behind a partition (the dial times out) proves nothing.
func (p *pinboard) confirmDeath(_ context.Context, s *proxy.Session) (bool, error) {
	wk := p.w.byAddr[s.AdvertiseURL]
	switch {
	case wk == nil || !wk.up:
		return true, nil // refused
	case s.Secret != wk.secret():
		return true, nil // a stranger answers 403 forbidden
	case p.w.now < p.cutFrom[wk.idx] || wk.frozenUntil > p.w.now:
		return false, nil
	}
	return false, nil // it answers: alive
}
