package placement

import (
	"context"
	"errors"
	"sync"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// ErrRunning is returned by Run when it is called a second time.
var ErrRunning = errors.New("placement: Run called twice")

// Run does the resolver's background work until ctx ends or Close is called,
// then returns nil:
//
//   - tunnel checks: for each watched placement (Watch: a WebSocket tunnel
//     is open) that was invalidated, or just watched, it reads the
//     placement's holder and calls Config.OnMoved(name, holder), so that
//     the name's tunnels to every other session close (OnInvalidate must
//     not read the store);
//   - the sweep: every SweepInterval it asks the store about every session
//     it knows and forgets those that are gone, so that records of dead
//     workers do not accumulate;
//   - refreshes: a batcher gathers the names requests found due
//     (Config.RefreshAhead, Config.RefreshBatch) and Config.Refreshers
//     goroutines re-read their cached placements (refresh.go);
//   - death probes: with Config.ConfirmDeath, Config.DeathProbers
//     goroutines probe the sessions the proxy found unreachable and end
//     those whose process is gone (failover.go).
//
// Run waits for its refreshers and probers before it returns. Call it once.
func (r *Resolver) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return ErrRunning
	}
	var refreshers sync.WaitGroup
	defer refreshers.Wait()
	refreshers.Go(func() { r.refreshBatcher(ctx) })
	for range r.cfg.Refreshers {
		refreshers.Go(func() { r.refresher(ctx) })
	}
	if r.cfg.ConfirmDeath != nil {
		for range r.cfg.DeathProbers {
			refreshers.Go(func() { r.prober(ctx) })
		}
	}
	sweep := r.clock.NewTimer(r.cfg.SweepInterval)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.ctx.Done():
			return nil
		case <-r.wake:
			r.checkTunnels(ctx)
		case <-sweep.C():
			r.sweep(ctx)
			sweep.Reset(r.cfg.SweepInterval)
		}
	}
}

// queueCheckLocked asks Run to check the tunnels of name; r.checksMu is
// held. Names beyond MaxTunnelChecks are dropped (and counted): their
// tunnels then end by themselves, by idleness or when the old holder's
// process closes them.
func (r *Resolver) queueCheckLocked(name string) {
	if len(r.checks) < r.cfg.MaxTunnelChecks {
		r.checks[name] = struct{}{}
	} else if _, ok := r.checks[name]; !ok {
		r.m.tunnelChecksDropped.Inc()
	}
}

// wakeRun tells Run that checks are queued.
func (r *Resolver) wakeRun() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// checkTunnels handles the queued tunnel checks.
func (r *Resolver) checkTunnels(ctx context.Context) {
	r.checksMu.Lock()
	names := make([]string, 0, len(r.checks))
	for n := range r.checks {
		if r.watched[n] > 0 {
			names = append(names, n)
		}
	}
	clear(r.checks)
	r.checksMu.Unlock()
	for _, name := range names {
		if ctx.Err() != nil || r.ctx.Err() != nil {
			return
		}
		r.checkTunnel(ctx, name)
	}
}

func (r *Resolver) checkTunnel(ctx context.Context, name string) {
	ns, id, ok := wire.SplitPlacementName(name)
	if !ok {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.ResolveTimeout)
	holder, err := r.st.Placement(cctx, ns, id)
	cancel()
	if err != nil {
		// Undecided: leave the tunnels; they end with their worker or by
		// idleness.
		r.warnStore(err, "cannot check the tunnels of an invalidated placement", "name", name, "err", err)
		return
	}
	r.m.tunnelChecks.Inc()
	if r.cfg.OnMoved != nil {
		r.cfg.OnMoved(name, holder)
	}
}

// sweep forgets the sessions (usable or not) gone from the store.
func (r *Resolver) sweep(ctx context.Context) {
	r.mu.Lock()
	ids := make([]string, 0, len(r.sessions)+len(r.unusable))
	for sid := range r.sessions {
		ids = append(ids, sid)
	}
	for sid := range r.unusable {
		ids = append(ids, sid)
	}
	r.mu.Unlock()
	for _, sid := range ids {
		if ctx.Err() != nil || r.ctx.Err() != nil {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.ResolveTimeout)
		_, err := r.st.Session(cctx, sid)
		cancel()
		switch {
		case errors.Is(err, store.ErrUnknownSession):
			r.dropSession(sid, "expired")
		case err != nil:
			r.warnStore(err, "cannot check a worker session", "session", sid, "err", err)
			return
		}
	}
}
