package host

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
)

// sweepLoop closes idle instances every SweepInterval until stop is closed.
func (h *Host) sweepLoop(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := h.clock.NewTimer(h.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C():
			h.sweep()
			t.Reset(h.cfg.SweepInterval)
		}
	}
}

// sweep closes every instance idle for at least IdleTimeout. Each shard's
// idle list is ordered by idleSince, so the sweep stops at the first
// instance that is not old enough: its cost is the number of shards plus the
// number of evicted instances, independent of busy instances.
func (h *Host) sweep() {
	n := 0
	h.forEachShard(func(sh *shard) {
		if sh.head == nil {
			return
		}
		now := h.clock.Now()
		for sh.head != nil && now.Elapsed(sh.head.idleSince, h.cfg.IdleTimeout) {
			h.beginCloseLocked(sh, sh.head, EvictIdle, false)
			n++
		}
	})
	if n > 0 {
		h.logDebug("idle sweep", "evicted", n)
	}
}

// abort aborts inst with the given reason.
func (h *Host) abort(inst *Instance, reason string) {
	sh := &h.shards[inst.shard]
	sh.mu.Lock()
	h.beginCloseLocked(sh, inst, reason, true)
	sh.mu.Unlock()
}

// beginCloseLocked starts closing inst (gracefully, or by abort) and
// returns without waiting. Called with sh.mu held. An activating instance
// is closed when its setup returns; a closing one can still be upgraded to
// an abort.
func (h *Host) beginCloseLocked(sh *shard, inst *Instance, reason string, abort bool) {
	switch inst.state {
	case stateActivating:
		x := inst.extra()
		if x.pendingClose == "" {
			x.pendingClose = reason
		}
		if abort && !x.pendingAbort {
			x.pendingAbort = true
			inst.cancel() // the setup sees it through inst.Context
		}
	case stateActive:
		if inst.linked {
			sh.unlink(inst)
		}
		inst.state = stateClosing
		x := inst.extra()
		x.reason = reason
		x.done = make(chan struct{})
		if abort {
			h.abortLocked(inst)
		} else {
			for ws := range x.sockets {
				ws.goAway()
			}
		}
		h.scheduleClose(inst)
	case stateClosing:
		if abort && !inst.x.aborted {
			h.abortLocked(inst)
		}
	}
}

// abortLocked cancels everything running for a closing instance: its
// context (handlers, tasks, turn waiters), open streams (their next write
// fails) and websockets. Called with the shard's mutex held.
func (h *Host) abortLocked(inst *Instance) {
	x := inst.x
	x.aborted = true
	h.met.aborts.Inc()
	inst.cancel()
	for s := range x.streams {
		s.kick()
	}
	for ws := range x.sockets {
		ws.kick()
	}
	if h.debug() { // the arguments would be boxed at every abort otherwise
		h.logDebug("instance aborted", "instance", inst.id, "epoch", inst.epoch, "reason", x.reason)
	}
}

// maxClosers bounds the goroutines closing idle instances at once. A worker
// that shuts down with a million idle instances would otherwise start a
// million goroutines at once (gigabytes of stacks, and a collector that
// leaves no time for the releases); a few thousand keep enough releases
// waiting together to fill the worker's release batches.
const maxClosers = 4096

// closeQueue holds the idle instances waiting for a closer (scheduleClose).
type closeQueue struct {
	mu      sync.Mutex
	q       []*Instance
	running int // closer goroutines
}

// scheduleClose runs closeInstance for inst: on a goroutine of its own when
// the instance has activity to wait for (a request, stream, websocket or
// task: a closer must not wait on it), else on one of at most maxClosers
// closers, each closing queued instances until none is left. Every queued
// instance holds its count in h.wg, so Close waits for the closers too.
// Called with the shard's mutex held.
func (h *Host) scheduleClose(inst *Instance) {
	if inst.activity > 0 {
		go h.closeInstance(inst)
		return
	}
	cq := &h.closers
	cq.mu.Lock()
	if cq.running >= maxClosers {
		cq.q = append(cq.q, inst)
		cq.mu.Unlock()
		return
	}
	cq.running++
	cq.mu.Unlock()
	go h.closer(inst)
}

// closer closes inst, then queued instances until the queue is empty.
func (h *Host) closer(inst *Instance) {
	cq := &h.closers
	for {
		h.closeInstance(inst)
		cq.mu.Lock()
		if len(cq.q) == 0 {
			cq.running--
			cq.q = nil // the backing array of a large burst goes with it
			cq.mu.Unlock()
			return
		}
		inst = cq.q[0]
		cq.q[0] = nil
		cq.q = cq.q[1:]
		cq.mu.Unlock()
	}
}

// closeInstance finishes closing inst: it waits until no handler, stream,
// websocket or task of it runs, tears it down inside the turn, cancels its
// context, releases the placement (fleet mode, unless a newer epoch
// superseded it), and removes it from the
// directory. Requests that find it meanwhile answer 503 closing (fleet
// mode) or wait for it (local mode). The instance's WaitGroup count, taken
// at activation, ends here.
func (h *Host) closeInstance(inst *Instance) {
	defer h.wg.Done()
	sh := &h.shards[inst.shard]
	sh.mu.Lock()
	x := inst.x
	if inst.activity > 0 {
		drained := make(chan struct{})
		x.drained = drained
		sh.mu.Unlock()
		<-drained
	} else {
		sh.mu.Unlock()
	}

	// Nothing holds activity now and nothing can take new activity, so only
	// a stray Do can compete for the turn; teardown excludes it.
	inst.turn <- struct{}{}
	h.callTeardown(inst)
	inst.cancel()
	<-inst.turn

	if h.w != nil && !x.superseded {
		err := h.releasePlacement(inst)
		if err != nil {
			h.logThrottled(slog.LevelWarn, "release failed", "instance", inst.id, "error", err)
		}
	}

	window := h.staleRouteWindow()
	now := h.clock.Now()
	sh.mu.Lock()
	if sh.m[inst.id] == inst {
		delete(sh.m, inst.id)
	}
	if h.w != nil && inst.epoch != 0 {
		// From now on a route naming this epoch (or an older one) finds no
		// instance; it must not activate one: its placement was released
		// (or superseded), and the id may live elsewhere already. Remembered
		// in the same critical section that removes the instance, so no
		// request sees neither.
		sh.released.Add(inst.id, inst.epoch, now)
		sh.released.Expire(now, window)
	}
	inst.state = stateClosed
	reason := x.reason
	// Counted before the waiters wake: a request that waited for this close
	// activates against a live count (MaxInstances) and metrics that
	// already include it.
	h.live.Add(-1)
	h.met.instances.Dec()
	h.met.evictions[evictIndex(reason)].Inc()
	close(x.done)
	x.streams, x.sockets = nil, nil
	sh.mu.Unlock()

	if h.debug() { // the arguments would be boxed at every close otherwise
		h.logDebug("instance closed", "instance", inst.id, "epoch", inst.epoch, "reason", reason)
	}
}

func (h *Host) callTeardown(inst *Instance) {
	if h.teardown == nil {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			h.logThrottled(slog.LevelError, "teardown panicked", "instance", inst.id,
				"error", fmt.Sprintf("%v", p), "stack", string(debug.Stack()))
		}
	}()
	h.teardown(inst.obj)
}

// ReleaseQueuer is implemented by a Worker that can take a release without
// a call (worker.Worker does during its Shutdown: the release is queued and
// sent in the background). QueueRelease reports whether it took the
// release of (namespace, id) at epoch, activated under lease (whose values
// name the session; nil in local mode); when it did not, the host calls
// Release. The host asks first for every closed instance, so that a
// million closing at once cost no timer and no context each.
type ReleaseQueuer interface {
	QueueRelease(lease context.Context, namespace, id string, epoch uint64) bool
}

// releasePlacement calls Worker.Release for a closed instance, bounded by
// ReleaseTimeout and by Close, with a context that carries the values of the
// lease the instance was activated under (so the worker names that session)
// but not its cancellation (the lease may be gone already). A worker that
// queues the release (ReleaseQueuer) takes it without the call.
func (h *Host) releasePlacement(inst *Instance) error {
	if q, ok := h.w.(ReleaseQueuer); ok && q.QueueRelease(inst.lease, h.ns, inst.id, inst.epoch) {
		return nil
	}
	parent := context.Background()
	if inst.lease != nil {
		parent = context.WithoutCancel(inst.lease)
	}
	ctx, cancel := context.WithTimeout(parent, h.cfg.ReleaseTimeout)
	defer cancel()
	stop := context.AfterFunc(h.stopCtx, cancel)
	defer stop()
	return h.w.Release(ctx, h.ns, inst.id, inst.epoch)
}
