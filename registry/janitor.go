package registry

import (
	"context"
	"errors"

	"github.com/pinned-go/pinned/internal/store"
)

// Run is the registry's janitor: every ReapInterval it collects sessions
// whose lease ran out at least ReapGrace ago (when the store is a
// store.Reaper: their placements are compare-and-deleted, so several
// pinboards may run it at once) and refreshes the gauges. It returns nil
// when ctx ends. Run must not be called twice concurrently.
func (r *Registry) Run(ctx context.Context) error {
	r.runMu.Lock()
	if r.running {
		r.runMu.Unlock()
		return errors.New("registry: Run is already running")
	}
	r.running = true
	r.runMu.Unlock()
	defer func() {
		r.runMu.Lock()
		r.running = false
		r.runMu.Unlock()
	}()
	for {
		r.Sweep(ctx)
		t := r.clock.NewTimer(r.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// Sweep runs one janitor pass: Reap, then the gauges. Run calls it; it is
// exported for tests and tools.
func (r *Registry) Sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(r.interval, r.storeTO))
	defer cancel()
	if err := r.st.Ping(ctx); err != nil {
		r.m.storeUp.Set(0)
		if store.IsConnecting(err) {
			// The first connection is still being made (the pinboard
			// starts serving before it): nothing has failed yet.
			r.log.Debug("store not connected yet", "err", err)
			return
		}
		r.m.sweepErrors.Inc()
		if r.storeLog.Allow() {
			r.log.Error("store unreachable", "err", err)
		}
		return
	}
	r.m.storeUp.Set(1)
	if rp, ok := r.st.(store.Reaper); ok {
		st, err := rp.Reap(ctx, r.grace)
		if err != nil {
			r.m.sweepErrors.Inc()
			r.log.Warn("reap failed", "err", err)
		}
		if st.Sessions > 0 || st.Placements > 0 {
			r.m.reapedSessions.Add(st.Sessions)
			r.m.reapedPlacements.Add(st.Placements)
			r.log.Info("collected expired sessions", "sessions", st.Sessions, "placements", st.Placements, "reason", "lease")
		}
	}
	ws, err := r.workerInfos(ctx)
	if err != nil {
		r.m.sweepErrors.Inc()
		return
	}
	live := 0
	perNS, workersNS := map[string]int{}, map[string]int{}
	for _, w := range ws {
		if !w.Superseded {
			live++
			for _, ns := range w.Namespaces {
				workersNS[ns]++
			}
		}
		for ns, n := range w.Placements {
			perNS[ns] += n
		}
	}
	r.m.sessions.Set(float64(len(ws)))
	r.m.liveWorkers.Set(float64(live))
	r.m.setPlacements(perNS)
	r.m.setNamespaceWorkers(workersNS)
}
