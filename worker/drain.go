package worker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// drainMode orders the drain states; a worker only ever moves up.
type drainMode int32

const (
	modeNone     drainMode = iota
	modeDrain              // refuse new activations, keep serving
	modeWindDown           // also close idle instances, abort the rest at the deadline
)

func (m drainMode) String() string {
	switch m {
	case modeDrain:
		return wire.MessageDrain
	case modeWindDown:
		return wire.MessageWindDown
	}
	return "none"
}

// drainState is the worker's drain state: mode is read lock-free by
// Draining (on every activation); mode and deadlineMs change together under mu.
type drainState struct {
	mode       atomic.Int32
	mu         sync.Mutex
	deadlineMs int64 // unix ms; 0 = none
}

// Draining implements host.Worker: true once a drain or wind_down started
// (from the pinboard or Shutdown). It never becomes false again.
func (w *Worker) Draining() bool { return drainMode(w.drain.mode.Load()) != modeNone }

// drainSnapshot returns the mode and the deadline (unix ms, 0 = none).
func (w *Worker) drainSnapshot() (drainMode, int64) {
	w.drain.mu.Lock()
	defer w.drain.mu.Unlock()
	return drainMode(w.drain.mode.Load()), w.drain.deadlineMs
}

// enterDrain raises the drain state to at least mode and the deadline to the
// earliest one seen (0 = none). On a change it logs and wakes the loop so
// the next heartbeat reports it at once. It reports whether wind_down
// started with this call: the caller then closes the idle instances
// (Shutdown on its own goroutine, the loop through closeIdleSoon), never
// before the loop was woken.
func (w *Worker) enterDrain(mode drainMode, deadlineMs int64, source string) (windDown bool) {
	w.drain.mu.Lock()
	old, oldDeadline := drainMode(w.drain.mode.Load()), w.drain.deadlineMs
	if mode > old {
		w.drain.mode.Store(int32(mode))
	}
	if deadlineMs > 0 && (oldDeadline == 0 || deadlineMs < oldDeadline) {
		w.drain.deadlineMs = deadlineMs
	}
	now, nowDeadline := drainMode(w.drain.mode.Load()), w.drain.deadlineMs
	w.drain.mu.Unlock()
	if now == old && nowDeadline == oldDeadline {
		return false
	}
	attrs := []any{"mode", now.String(), "source", source}
	if nowDeadline != 0 {
		attrs = append(attrs, "deadline", time.UnixMilli(nowDeadline))
	}
	w.log.Info("drain started", attrs...)
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return now == modeWindDown && old != modeWindDown
}

// closeIdleSoon asks Run's idle closer (loop.idleCloser) to close the idle
// instances of every attached host, and returns at once; requests made
// while a pass runs are served by one more pass. The loop closes idle
// instances only this way: a host's CloseIdle walks every idle instance
// under its shard locks, which takes seconds at a million instances while
// thousands of closers compete for the same locks, and a loop waiting for
// it sends no heartbeat (docs/scale.md, S8).
func (w *Worker) closeIdleSoon() {
	select {
	case w.closeIdleReq <- struct{}{}:
	default:
	}
}

// applyMessage acts on one control message from a heartbeat ack.
func (w *Worker) applyMessage(m wire.Message) {
	switch m.Type {
	case wire.MessageDrain:
		w.enterDrain(modeDrain, m.DeadlineMs, "pinboard")
	case wire.MessageWindDown:
		if w.enterDrain(modeWindDown, m.DeadlineMs, "pinboard") {
			w.closeIdleSoon()
		}
	case wire.MessageEvict:
		w.evict(m.Namespace, m.ID)
	default:
		w.log.Warn("unknown control message ignored", "type", m.Type)
	}
}

// evict acts on an evict message: the host of namespace aborts the
// instance of id (teardown, then release, as for any closed instance), so
// the next request for it activates a fresh one. An id without a live
// instance here needs nothing: its next request activates a fresh one
// anyway (on this worker while the placement names its session).
func (w *Worker) evict(namespace, id string) {
	for _, h := range w.attached() {
		if h.Namespace() == namespace {
			found := h.Evict(id, reasonEvict)
			w.log.Info("instance evicted by the pinboard", "namespace", namespace, "instance", id, "found", found, "reason", reasonEvict)
			return
		}
	}
	w.log.Warn("evict for a namespace this worker does not serve ignored", "namespace", namespace, "instance", id)
}

// driveDrain does the time-driven part of draining, on the loop: abort what
// remains at the wind_down deadline, and note when the hosts are empty.
func (l *loop) driveDrain(now clock.Instant) {
	mode, deadline := l.w.drainSnapshot()
	if mode == modeNone {
		return
	}
	if mode == modeWindDown && deadline != 0 && !l.deadlineAborted && now.Wall().UnixMilli() >= deadline {
		l.deadlineAborted = true
		hosts := l.w.attached()
		n := live(hosts)
		for _, h := range hosts {
			h.AbortAll(reasonWindDown)
		}
		l.log.Warn("wind_down deadline reached; remaining instances aborted", "instances", n, "reason", reasonWindDown)
	}
	if !l.drainComplete && live(l.w.attached()) == 0 {
		l.drainComplete = true
		l.log.Info("drain complete: no instance left", "mode", mode.String())
	}
}

// Shutdown is the application's graceful stop (e.g. on SIGTERM):
//
//  1. wind_down starts (Draining is true, so hosts refuse new activations
//     with 503 draining); the next heartbeat, sent at once, reports draining
//     with headroom 0 and ctx's deadline as drainDeadline;
//  2. idle instances are closed now and every ShutdownPollInterval, on
//     the calling goroutine (the heartbeats never wait for a pass), until
//     every host is empty (Len() == 0) or ctx ends, which aborts what
//     remains and closes the connections to the pinboard, failing the calls
//     in flight. A close does not wait for its release: Release queues it
//     (pinned_releases_total{result="deferred"}) and up to four senders
//     send the queue in batches meanwhile, so the ids of instances that
//     closed early are freed while busy ones finish;
//  3. Run sends a final heartbeat (draining, headroom 0), stops heartbeating
//     and returns nil; Shutdown waits for that;
//  4. when every host is empty (every instance closed), Shutdown
//     deregisters the session (POST /registry/deregister, one attempt
//     within RequestTimeout), so the pinboard forgets it at once and
//     re-places anything it still held: one call frees what the queued
//     releases had not yet, and they are dropped. Sessions that a new
//     registration replaced (a lease lost, its instances aborted) are
//     deregistered after it, so their ids need not wait for their leases
//     either. Shutdown returns once its
//     senders have stopped (they send what is left when the deregistration
//     did not happen, by ctx's deadline). When instances had to be
//     aborted and are still tearing down, or ctx's deadline has passed, it
//     skips this step: their ids stay placed on the session until its lease
//     runs out, so no other worker activates them while a teardown may
//     still write.
//
// From the moment Shutdown is called, no call to the pinboard (heartbeat,
// release, deregistration) outlasts ctx's deadline, so Shutdown returns
// by that deadline whatever the pinboard does (a pinboard that is gone or
// frozen only makes the releases give up), as does a host's Close given
// the same deadline. Shutdown returns nil when the hosts emptied before
// ctx ended, otherwise an error wrapping ctx's cause. It is safe to call
// without Run and more than once (the deregistration happens at most
// once; each call's deadline replaces the previous one).
func (w *Worker) Shutdown(ctx context.Context) error {
	var deadlineMs, by int64
	if d, ok := ctx.Deadline(); ok {
		deadlineMs, by = d.UnixMilli(), d.UnixNano()
	}
	w.shutdownBy.Store(by)
	w.shuttingDown.Store(true)
	later := w.startLaterReleases()
	defer later.finish()
	w.enterDrain(modeWindDown, deadlineMs, "shutdown") // awaitEmpty closes the idle instances
	err := w.awaitEmpty(ctx)
	if ctx.Err() != nil {
		// Calls in flight (a heartbeat to a pinboard that does not answer,
		// releases) would keep Run, and the hosts' Close, waiting up to
		// RequestTimeout past the deadline: fail them now.
		later.giveUp()
		w.pinboard.abort()
	}
	w.stopped.Do(func() { close(w.stopReq) })
	w.mu.Lock()
	started := w.started
	w.mu.Unlock()
	if started {
		<-w.runDone
	}
	if n := live(w.attached()); n > 0 {
		if w.lastSess.Load() != nil && !w.deregOnce.Load() {
			w.m.deregisters[resultSkipped].Inc()
			w.log.Warn("not deregistering: aborted instances are still tearing down; the session ends with its lease", "instances", n)
		}
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		if w.lastSess.Load() != nil && !w.deregOnce.Load() {
			w.m.deregisters[resultSkipped].Inc()
			w.log.Warn("not deregistering: the shutdown deadline passed; the session ends with its lease")
		}
		return err
	}
	if w.deregister() {
		// The deregistration freed every placement the session held: the
		// queued releases, and those in flight, have nothing left to do.
		if n := w.later.drop(); n > 0 {
			w.log.Info("the deregistration freed the placements of closed instances whose releases were still queued", "releases", n)
		}
		w.pinboard.abort()
	}
	return err
}

// shutdownPassed reports whether the latest Shutdown's deadline has passed.
func (w *Worker) shutdownPassed() bool {
	by := w.shutdownBy.Load()
	return by != 0 && time.Now().UnixNano() >= by
}

// callDeadline returns the deadline of a call to the pinboard that must end
// by d (zero: RequestTimeout alone), and by the latest Shutdown's deadline.
func (w *Worker) callDeadline(d time.Time) time.Time {
	if by := w.shutdownBy.Load(); by != 0 {
		if s := time.Unix(0, by); d.IsZero() || s.Before(d) {
			return s
		}
	}
	return d
}

// awaitEmpty closes idle instances until the hosts are empty or ctx ends;
// then it aborts what remains.
func (w *Worker) awaitEmpty(ctx context.Context) error {
	hosts := w.attached()
	for {
		for _, h := range hosts {
			h.CloseIdle(reasonShutdown)
		}
		if live(hosts) == 0 {
			return nil
		}
		t := w.clock.NewTimer(w.cfg.ShutdownPollInterval)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			n := live(hosts)
			for _, h := range hosts {
				h.AbortAll(reasonShutdown)
			}
			w.log.Warn("shutdown deadline reached; remaining instances aborted", "instances", n, "reason", reasonShutdown)
			return fmt.Errorf("shutdown: aborted %d instances: %w", n, context.Cause(ctx))
		}
	}
}
