package placement

import (
	"context"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/proxy"
)

// Fast failover: death the kernel can vouch for.
//
// A worker whose process died is unreachable until its lease runs out in
// the store (10 s by default): nothing else may move its ids, since a
// worker that is only slow, frozen or cut off still serves them until then.
// But a dead process leaves evidence a live one cannot: its kernel refuses
// connections to its listening port. When the proxy reports a session
// unreachable (Refused with wire.ReasonUnreachable), Run's probers ask
// Config.ConfirmDeath about it (the pinboard dials the advertise address a
// few times: refused every time, or answered only by another process that
// does not know the session's secret). A confirmed death ends the session
// in the store (Deregister: a compare on the session id, so a later
// registration is never touched) and records the lease as ended on the
// proxy's Session, so that every route to it misses: the misses find the
// session gone and replace its placements at once, on every pinboard (the
// others find it gone in the store, or confirm it themselves).
//
// Anything less than a refusal proves nothing and keeps the lease: a dial
// that times out (a frozen process, a partition), a slow or absent
// heartbeat, a closed connection. docs/safety.md argues why a refusal is
// enough: a process without its listener cannot be reached by any pinboard,
// so it cannot serve, and its lease and the epochs bound what its
// background work may still do.

// expectedRecovery is how long after a probe starts a dead worker's ids
// are expected to be served again: the probe (three dials 50 ms apart) and
// the re-placement, rounded up to what a client's Retry-After can say.
const expectedRecovery = time.Second

// probeState is one session's death probe: in flight until done is closed,
// then its outcome, kept for DeathProbeInterval.
type probeState struct {
	done chan struct{}
	dead bool
	at   clock.Instant // when it finished
}

// requestProbe asks Run's probers to check whether the process of s is
// gone, unless a probe of it is in flight or finished within
// DeathProbeInterval. It does no I/O (Refused calls it). r.mu is held.
func (r *Resolver) requestProbeLocked(s *proxy.Session, now clock.Instant) {
	if p := r.probes[s.ID]; p != nil {
		select {
		case <-p.done:
			if !now.Elapsed(p.at, r.cfg.DeathProbeInterval) {
				return
			}
		default:
			return // in flight
		}
	}
	p := &probeState{done: make(chan struct{})}
	select {
	case r.probeQ <- s:
		r.probes[s.ID] = p
		// Clients told to retry are told to do so once the probe is due to
		// have decided, not at the end of the lease.
		s.SetRecovery(now.Wall().Add(expectedRecovery))
	default:
		r.m.probesDropped.Inc()
	}
}

// prober runs death probes until ctx or the resolver ends; Run runs
// DeathProbers of them.
func (r *Resolver) prober(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.ctx.Done():
			return
		case s := <-r.probeQ:
			r.probe(ctx, s)
		}
	}
}

// probe asks ConfirmDeath about s and, when its process is gone, ends the
// session in the store.
func (r *Resolver) probe(ctx context.Context, s *proxy.Session) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ResolveTimeout)
	defer cancel()
	var (
		dead bool
		err  error
	)
	if faults.Has(faults.NoDeathProof) {
		dead = true // planted bug (pinned_faults builds only): unreachable taken for dead
	} else {
		dead, err = r.cfg.ConfirmDeath(ctx, s)
	}
	switch {
	case err != nil:
		dead = false
		s.SetRecovery(time.Time{})
		r.m.probesFailed.Inc()
		r.warnStore(err, "cannot probe an unreachable worker", "session", s.ID, "err", err)
	case !dead:
		s.SetRecovery(time.Time{}) // the lease stands: retry at its end
		r.m.probesAlive.Inc()
		r.log.Debug("unreachable worker probed: not proven gone; its lease stands", "session", s.ID)
	default:
		// A compare on the session id: it ends this session and nothing else.
		if _, err := r.st.Deregister(ctx, s.ID); err != nil {
			dead = false
			s.SetRecovery(time.Time{})
			r.m.probesFailed.Inc()
			r.warnStore(err, "cannot end the session of a dead worker", "session", s.ID, "err", err)
			break
		}
		r.m.deaths.Inc()
		s.SetLeaseEnd(r.clock.Now().Wall()) // every cached route to it misses from now on
		r.mu.Lock()
		r.dead[s.ID] = r.clock.Now()
		r.mu.Unlock()
		r.log.Info("worker session ended: its process is gone (connections refused)", "session", s.ID, "advertise", s.AdvertiseURL)
		r.dropSession(s.ID, "its process is gone")
	}
	now := r.clock.Now()
	r.mu.Lock()
	p := r.probes[s.ID]
	if p != nil {
		p.dead, p.at = dead, now
		close(p.done)
	}
	r.pruneProbesLocked(now)
	r.mu.Unlock()
}

// pruneProbesLocked forgets finished probes older than DeathProbeInterval;
// r.mu is held.
func (r *Resolver) pruneProbesLocked(now clock.Instant) {
	for id, at := range r.dead {
		if now.Elapsed(at, r.cfg.Lease) {
			delete(r.dead, id) // the store has long forgotten it too
		}
	}
	for id, p := range r.probes {
		select {
		case <-p.done:
			if now.Elapsed(p.at, r.cfg.DeathProbeInterval) {
				delete(r.probes, id)
			}
		default:
		}
	}
}

// ProbeQueued runs the death probes waiting for Run's probers on the
// caller's goroutine, and returns how many it ran. It is for a driver that
// does not run Run, such as the protocol's simulation (test/sim), which
// probes within the step that found a worker unreachable.
func (r *Resolver) ProbeQueued(ctx context.Context) int {
	n := 0
	for {
		select {
		case s := <-r.probeQ:
			r.probe(ctx, s)
			n++
		default:
			return n
		}
	}
}

// awaitDeath waits (bounded by ctx) for the probe of session sid, when one
// is in flight or finished recently, and reports whether it confirmed the
// death. Every miss calls it before it confirms a holder, so that the
// requests that found the worker unreachable (and any other that misses
// meanwhile) are served by the new holder rather than sent to the dead one
// again; with no probe of the holder, it returns at once.
func (r *Resolver) awaitDeath(ctx context.Context, sid string) bool {
	r.mu.Lock()
	p := r.probes[sid]
	r.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return false
	}
	return p.dead
}
