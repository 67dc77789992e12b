package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"

	"github.com/pinned-go/pinned/clock"
)

// Instance states. Transitions happen under the shard lock:
//
//	activating ──setup ok──► active ──close/abort──► closing ──teardown, release──► closed
//	     │                                              ▲
//	     ├──setup ok, close requested meanwhile─────────┘
//	     └──setup error──► closed (never served; no teardown)
const (
	stateActivating uint8 = iota
	stateActive
	stateClosing
	stateClosed
)

// Instance is one live object of a host, for one id. Its methods are safe
// for concurrent use. An application keeps the *Instance its New received
// (typically in the object) to reach the id, the context, tasks and turns.
type Instance struct {
	h     *Host
	id    string
	obj   any
	lease context.Context // the lease it was activated under; nil in local mode
	epoch uint64          // activation epoch; 0 in fleet mode when the request carried none
	turn  chan struct{}   // a send acquires the turn, a receive releases it

	// Guarded by the shard's mutex.
	prev, next *Instance     // idle list links
	idleSince  clock.Instant // when activity dropped to 0
	activity   int32         // in-flight requests + streams + websockets + tasks
	shard      uint16
	state      uint8
	linked     bool           // in the shard's idle list
	ready      chan struct{}  // closed when activation ends; nil afterwards
	x          *instanceExtra // rarely used parts, allocated on first use

	// The instance's context (instanceContext): cancelled, and the
	// standard context it is made into on first use.
	cancelled atomic.Bool
	stdCtx    atomic.Pointer[stdContext]
}

// instanceExtra holds what most idle instances never need, so that an idle
// instance stays small. Guarded by the shard's mutex.
type instanceExtra struct {
	setupErr     error         // activation failed (state closed)
	reason       string        // eviction reason once closing
	pendingClose string        // close requested while activating
	pendingAbort bool          // abort requested while activating
	aborted      bool          // abort ran
	superseded   bool          // a newer epoch arrived: closes without Worker.Release
	drained      chan struct{} // closed when activity drops to 0 while closing
	done         chan struct{} // closed when the instance is closed
	streams      map[*stream]struct{}
	sockets      map[*WebSocket]struct{}
}

func (inst *Instance) extra() *instanceExtra {
	if inst.x == nil {
		inst.x = &instanceExtra{}
	}
	return inst.x
}

// ID returns the instance's id (one path segment, see wire.CheckSegment).
func (inst *Instance) ID() string { return inst.id }

// Epoch returns the instance's activation epoch: strictly greater than the
// epoch of every earlier activation of its (namespace, id), in this process
// or anywhere in the fleet. Use it as the fencing token of writes to the
// application's own store (package fence does it for Redis), so that a
// write from an instance that lost its id (a paused process, a stale
// route) is refused once a newer activation has written. In fleet mode it
// is the epoch of the placement the activating request was routed by
// (wire.HeaderEpoch), 0 when that request carried none (an unfenced
// instance: any epoch supersedes it); in local mode the host allocates it
// (wire.NextEpoch on the host's clock: increasing across a restart of the
// process as long as the clock does not step back).
func (inst *Instance) Epoch() uint64 { return inst.epoch }

// Namespace returns the namespace of the instance's host, "/name".
func (inst *Instance) Namespace() string { return inst.h.ns }

// Context returns the instance's context. It is cancelled when the instance
// is aborted (Abort, a handler panic, Host.Close past its deadline,
// Worker-driven AbortAll), when the lease it was activated under ends (fleet
// mode), and otherwise right after its teardown returns. Handlers, stream
// generators, websocket handlers and tasks should all honour it.
func (inst *Instance) Context() context.Context { return (*instanceContext)(inst) }

// cancel cancels the instance's context.
func (inst *Instance) cancel() { (*instanceContext)(inst).cancel() }

// Abort force-ends the instance: its context is cancelled, waiting requests
// get 503, open streams fail their next write, websockets are closed, tasks
// see their context cancelled; once every in-flight handler, stream,
// websocket and task has returned, teardown runs (once). Abort does not
// wait; it may be called from a handler of the instance.
func (inst *Instance) Abort() { inst.h.abort(inst, EvictAbort) }

// Go runs fn in a new goroutine bound to the instance (the create_task of
// the object API): while it runs the instance is not idle, teardown waits
// for it, and abort cancels ctx (the instance's context). fn runs without
// the turn; use Do to touch the object's state. An error fn returns is
// logged unless it comes from ctx's cancellation. Go returns
// ErrInstanceClosed once the instance is closing.
func (inst *Instance) Go(fn func(ctx context.Context) error) error {
	h := inst.h
	sh := &h.shards[inst.shard]
	sh.mu.Lock()
	if inst.state != stateActive && inst.state != stateActivating {
		sh.mu.Unlock()
		return ErrInstanceClosed
	}
	sh.hold(inst)
	// The instance itself holds a WaitGroup count while it is live, so this
	// Add never races with Close's Wait at zero.
	h.wg.Add(1)
	sh.mu.Unlock()
	h.met.tasks.Inc()
	go inst.runTask(fn)
	return nil
}

func (inst *Instance) runTask(fn func(ctx context.Context) error) {
	h := inst.h
	defer h.wg.Done()
	defer h.met.tasks.Dec()
	defer h.release(inst)
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("task panicked: %v\n%s", p, debug.Stack())
				h.abort(inst, EvictAbort)
			}
		}()
		return fn(inst.Context())
	}()
	if err != nil && !(inst.Context().Err() != nil && errors.Is(err, context.Canceled)) {
		h.logThrottled(slog.LevelWarn, "task failed", "instance", inst.id, "error", err)
	}
}

// Do runs fn inside the instance's turn: no handler of a non-concurrent
// route, stream step or other Do of the instance runs at the same time, so
// fn may read and write the object's state. Use it from websocket handlers,
// tasks and concurrent routes. It returns ErrInstanceClosed (without
// running fn) when the instance is aborted while waiting or has been torn
// down, and, in fleet mode, when the lease the instance was activated under
// has ended (its context's Err, checked inline after the turn is taken,
// whether or not the worker's watchdog has run).
//
// Do must not be called while the caller already holds the turn (from a
// non-concurrent handler, a stream step of a non-concurrent route, or
// inside another Do): turns are not reentrant and that deadlocks. Call it
// only from code that keeps the instance busy (a handler, stream,
// websocket or task of this instance); otherwise the instance may be torn
// down concurrently and Do returns ErrInstanceClosed.
func (inst *Instance) Do(fn func()) error {
	if !inst.acquireTurn() {
		return ErrInstanceClosed
	}
	defer inst.releaseTurn()
	if inst.lease != nil && inst.lease.Err() != nil {
		return ErrInstanceClosed
	}
	fn()
	return nil
}

// acquireTurn takes the instance's turn, or gives up when the instance's
// context is cancelled (abort, lease loss, after teardown).
func (inst *Instance) acquireTurn() bool {
	select {
	case inst.turn <- struct{}{}:
	default:
		select {
		case inst.turn <- struct{}{}:
		case <-inst.Context().Done():
			return false
		}
	}
	if inst.Context().Err() != nil {
		<-inst.turn
		return false
	}
	return true
}

func (inst *Instance) releaseTurn() { <-inst.turn }
