package sim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// fault kinds a seed may allow (swarm testing: each seed allows a random
// subset, so that rare combinations and single faults both get runs).
const (
	faultSilentStore   = iota // a pinboard's Redis link stalls: no byte either way, connections open
	faultSlowInvalid          // a pinboard's invalidations arrive late (up to seconds)
	faultDeferredWrite        // a write sent into a stalled link is applied when it resumes
	faultFreeze               // a worker process stops (SIGSTOP, a GC pause) and resumes
	faultCrash                // a worker process dies (its state is gone) and restarts at its address
	faultStoreRestart         // Redis restarts without persistence
	faultEvict                // an operator evicts an instance (console)
	faultPinboardCrash        // a pinboard dies (its cache is gone) and restarts
	faultCallPartition        // a worker cannot reach the pinboards (heartbeats, releases lost)
	faultDataPartition        // a pinboard cannot reach a worker (requests time out)
	nFaults
)

var faultNames = [nFaults]string{"silent-store", "slow-invalidations", "deferred-writes", "freeze", "crash",
	"store-restart", "evict", "pinboard-crash", "call-partition", "data-partition"}

// swarm is what a seed drew: the cluster's size, the workload and the
// faults.
type swarm struct {
	pinboards, workers, ids int
	idle                    time.Duration // the hosts' idle timeout
	requestEvery            time.Duration // mean time between client requests
	baseDelay               time.Duration // a message's delay is uniform in [0, baseDelay] ...
	slowChance              float64       // ... plus, with this chance,
	slowDelay               time.Duration // uniform in [0, slowDelay]
	faults                  [nFaults]bool
	faultEvery              time.Duration // mean time between two faults
}

func newSwarm(rng *rand.Rand) swarm {
	s := swarm{
		pinboards:    2 + rng.IntN(2),
		workers:      2 + rng.IntN(3),
		ids:          2 + rng.IntN(5),
		idle:         time.Duration(300+rng.IntN(4700)) * time.Millisecond,
		requestEvery: time.Duration(10+rng.IntN(190)) * time.Millisecond,
		baseDelay:    time.Duration(100+rng.IntN(3000)) * time.Microsecond,
		faultEvery:   time.Duration(1+rng.IntN(10)) * time.Second,
	}
	if rng.IntN(2) == 0 {
		s.slowChance = float64(1+rng.IntN(50)) / 1000
		s.slowDelay = time.Duration(10+rng.IntN(3000)) * time.Millisecond
	}
	for i := range s.faults {
		s.faults[i] = rng.IntN(2) == 0
	}
	return s
}

func (s swarm) String() string {
	var on []string
	for i, f := range s.faults {
		if f {
			on = append(on, faultNames[i])
		}
	}
	if len(on) == 0 {
		on = append(on, "none")
	}
	return fmt.Sprintf("%d pinboards, %d workers, %d ids, idle %v, a request every %v, delay ≤%v (+≤%v at %.1f%%), faults every %v: %s",
		s.pinboards, s.workers, s.ids, s.idle, s.requestEvery, s.baseDelay, s.slowDelay, 100*s.slowChance, s.faultEvery, strings.Join(on, ", "))
}

// scheduleClients starts the client workload: requests at random times,
// each for a random id through a random pinboard.
func (w *world) scheduleClients() {
	var next func()
	next = func() {
		w.clientRequest()
		w.after(time.Duration(w.rng.ExpFloat64()*float64(w.swarm.requestEvery)), nil, "client", next)
	}
	w.after(time.Second, nil, "client", next)
}

func (w *world) clientRequest() {
	p := w.pinboards[w.rng.IntN(len(w.pinboards))]
	id := w.rng.IntN(len(w.ids))
	op := "GET"
	if w.rng.IntN(10) < 3 {
		op = "POST"
	}
	w.stats.Requests++
	p.handle(&request{id: id, op: op, start: w.now})
}

// scheduleFaults injects the allowed faults at random times until the
// faulty phase ends.
func (w *world) scheduleFaults() {
	var allowed []int
	for i, f := range w.swarm.faults {
		if f {
			allowed = append(allowed, i)
		}
	}
	if len(allowed) == 0 {
		return
	}
	var next func()
	next = func() {
		if w.healed {
			return
		}
		w.inject(allowed[w.rng.IntN(len(allowed))])
		w.after(time.Duration(w.rng.ExpFloat64()*float64(w.swarm.faultEvery)), nil, "fault", next)
	}
	w.after(2*time.Second, nil, "fault", next)
}

func (w *world) inject(kind int) {
	w.stats.Faults++
	p := w.pinboards[w.rng.IntN(len(w.pinboards))]
	wk := w.workers[w.rng.IntN(len(w.workers))]
	switch kind {
	case faultSilentStore:
		p.link.stall(w.between(500*time.Millisecond, 15*time.Second))
	case faultSlowInvalid:
		p.link.slowFor(w.between(time.Second, 20*time.Second), w.between(100*time.Millisecond, 5*time.Second))
	case faultDeferredWrite:
		// Writes into a stalled link take effect later: allowed by the
		// link itself (see storeLink.deferWrites); here a stall to use it.
		p.link.stall(w.between(200*time.Millisecond, 5*time.Second))
	case faultFreeze:
		if wk.up {
			wk.freeze(w.between(100*time.Millisecond, 25*time.Second))
		}
	case faultCrash:
		if wk.up {
			wk.crash(w.between(100*time.Millisecond, 10*time.Second))
		}
	case faultStoreRestart:
		w.restartStore()
	case faultEvict:
		w.evictOne()
	case faultPinboardCrash:
		if p.up {
			p.crash(w.between(100*time.Millisecond, 5*time.Second))
		}
	case faultCallPartition:
		wk.callsLostUntil = w.now + w.between(500*time.Millisecond, 15*time.Second)
		w.logf("%s cannot reach the pinboards until %.3fs", wk.name, wk.callsLostUntil.Seconds())
	case faultDataPartition:
		until := w.now + w.between(500*time.Millisecond, 10*time.Second)
		p.cutFrom[wk.idx] = until
		w.logf("%s cannot reach %s until %.3fs", p.name, wk.name, until.Seconds())
	}
}

// restartStore restarts Redis without persistence: every session and
// placement is forgotten; every pinboard's connection drops (its caches are
// flushed); placements wait for the restart fence.
func (w *world) restartStore() {
	w.logf("store restarts without persistence")
	w.st.Close()
	w.st = w.newStore()
	w.restartedAt = w.now
	for _, p := range w.pinboards {
		p.link.connectionLost()
	}
}

// evictOne evicts a random live instance, as the console does.
func (w *world) evictOne() {
	var cands []*instance
	for _, wk := range w.workers {
		for _, id := range w.ids {
			if inst := wk.insts[id]; inst != nil && inst.active && wk.up {
				cands = append(cands, inst)
			}
		}
	}
	if len(cands) == 0 {
		return
	}
	inst := cands[w.rng.IntN(len(cands))]
	w.logf("console evicts %s", inst)
	w.at(w.now, inst.wk, "evict", func() {
		if inst.active && inst.wk.insts[inst.id] == inst {
			inst.wk.close(inst, "evict", true)
		}
	})
}

// heal ends every fault: links resume, frozen workers thaw, crashed
// processes restart; no more faults are injected.
func (w *world) heal() {
	w.healed = true
	w.logf("heal: every fault ends")
	for _, p := range w.pinboards {
		p.link.resume()
		p.link.slowUntil = 0
		clear(p.cutFrom)
		if !p.up {
			p.restart()
		}
	}
	for _, wk := range w.workers {
		wk.callsLostUntil = 0
		if wk.frozenUntil > w.now {
			wk.frozenUntil = w.now
		}
		if !wk.up {
			wk.restart()
		}
	}
}
