package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/activation"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// rootPath is the remainder of a request for "/ns/id" with nothing after
// the id.
var rootPath = []byte("/")

// serve dispatches one request; rest is the path after "/<namespace>/".
// This is the hot path: for a GET to an active instance it allocates
// nothing itself.
func (h *Host) serve(rc *fasthttp.RequestCtx, rest []byte) {
	idb := rest
	rest = rootPath
	for i, c := range idb {
		if c == '/' {
			idb, rest = idb[:i], idb[i:]
			break
		}
	}

	var lease context.Context
	var epoch uint64 // the request's epoch; 0: none (always in local mode)
	if h.w != nil {
		var reason string
		lease, reason = h.w.Admit(rc.Request.Header.Peek(wire.HeaderProxySecret), rc.Request.Header.Peek(wire.HeaderSession))
		if lease == nil {
			h.reject(rc, reason)
			return
		}
		if b := rc.Request.Header.Peek(wire.HeaderEpoch); len(b) > 0 {
			var ok bool
			if epoch, ok = wire.ParseEpoch(b); !ok {
				h.met.reject(rejectInvalidEpoch)
				h.writeError(rc, fasthttp.StatusBadRequest, "invalid "+wire.HeaderEpoch+" header: want a decimal epoch", wire.HeaderEpoch)
				return
			}
		}
	}
	if e := wire.CheckSegment(idb, h.maxIDLen); e != wire.SegmentOK {
		h.met.reject(rejectInvalidID)
		h.writeError(rc, fasthttp.StatusBadRequest, "invalid id: "+e.Error(), "id")
		return
	}
	if h.bodyTooLarge(rc) {
		h.met.reject(rejectBodyTooLarge)
		h.writeError(rc, fasthttp.StatusRequestEntityTooLarge, h.tooLargeMsg, "")
		return
	}
	if lease != nil && isAlarmDelivery(rc, rest) {
		// Admitted with the worker's secret: only a pinboard sends this.
		h.serveAlarmRequest(rc, idb, lease, epoch)
		return
	}

	c := h.ctxPool.Get().(*Ctx)
	e := h.table.match(rest, &c.vals)
	if e == nil {
		h.putCtx(c)
		h.writeError(rc, fasthttp.StatusNotFound, "not found", "")
		return
	}
	r, ws := h.pickRoute(rc, e)
	if r == nil {
		h.putCtx(c)
		return // pickRoute answered
	}

	inst := h.acquire(rc, idb, lease, epoch)
	if inst == nil {
		h.putCtx(c)
		return // acquire answered
	}
	c.rc, c.h, c.inst, c.route, c.path = rc, h, inst, r, rest

	if ws {
		h.upgrade(c)
		return
	}
	if !r.concurrent && !inst.acquireTurn() {
		h.putCtx(c)
		h.release(inst)
		h.reject(rc, wire.ReasonClosing)
		return
	}
	err := h.call(c)
	if !r.concurrent {
		inst.releaseTurn()
	}
	if err != nil {
		h.handlerError(c, err)
	}
	// One clock read per request: it stamps the idle time and ends the
	// duration, which starts at fasthttp's request time (read by fasthttp
	// right before calling the handler; 0 with Server.LazyRequestTime).
	now := h.clock.Now()
	if s := c.stream; s != nil && rc.Response.IsBodyStream() && s.arm() {
		// The stream now owns c and the activity; its Close releases them.
	} else {
		h.putCtx(c)
		h.releaseAt(inst, now)
	}
	if t := rc.Time(); !t.IsZero() {
		h.met.duration.Update(max(0, now.Wall().Sub(t)).Seconds())
	}
}

// pickRoute selects the route of entry e for the request's method, or
// answers 405 / OPTIONS itself and returns nil. ws reports a websocket
// upgrade.
func (h *Host) pickRoute(rc *fasthttp.RequestCtx, e *entry) (r *route, ws bool) {
	m := methodIndex(rc.Method())
	if m == methodGET && e.ws != nil && websocket.FastHTTPIsWebSocketUpgrade(rc) {
		return e.ws, true
	}
	if m >= 0 {
		r = e.byMethod[m]
	}
	switch {
	case r != nil:
		return r, false
	case m == methodHEAD && e.byMethod[methodGET] != nil:
		return e.byMethod[methodGET], false
	case m == methodGET && e.ws != nil:
		h.writeError(rc, fasthttp.StatusUpgradeRequired, "websocket upgrade required", "")
		rc.Response.Header.Set("Upgrade", "websocket")
		return nil, false
	case m == methodOPTIONS:
		rc.Response.Header.Set("Allow", e.allow)
		rc.SetStatusCode(fasthttp.StatusNoContent)
		return nil, false
	}
	h.writeError(rc, fasthttp.StatusMethodNotAllowed, "method not allowed", "")
	rc.Response.Header.Set("Allow", e.allow)
	return nil, false
}

// call runs the route's handler, turning a panic into an error and an
// abort of the instance (its state may be half-updated).
func (h *Host) call(c *Ctx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &panicError{value: p, stack: debug.Stack()}
			h.abort(c.inst, EvictAbort)
		}
	}()
	return c.route.handler(c.inst.obj, c)
}

type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("handler panicked: %v", p.value) }

// handlerError replaces the response with the answer for a handler error.
func (h *Host) handlerError(c *Ctx, err error) {
	rc := c.rc
	var he *Error
	_, panicked := err.(*panicError)
	switch {
	case errors.Is(err, ErrStale):
		// The application's own store refused this activation: a newer one
		// has written there. It must not serve again.
		h.abort(c.inst, EvictStale)
		h.reject(rc, wire.ReasonStale)
	case errors.As(err, &he):
		h.writeError(rc, he.Status, he.Message, he.Field)
	case errors.Is(err, ErrAlarmNotHolder): // alarm.go: the directory no longer places the id here
		h.reject(rc, wire.ReasonLease)
	case errors.Is(err, ErrAlarmUnavailable):
		h.reject(rc, wire.ReasonStore)
	case c.inst.Context().Err() != nil && !panicked:
		// The instance was aborted under the handler: the outcome is unknown.
		h.reject(rc, wire.ReasonAborted)
	default:
		attrs := []any{"instance", c.inst.id, "route", c.route.pattern, "error", err}
		if p, ok := err.(*panicError); ok {
			attrs = append(attrs, "stack", string(p.stack))
		}
		h.logThrottled(slog.LevelError, "handler failed", attrs...)
		h.writeError(rc, fasthttp.StatusInternalServerError, "internal server error", "")
	}
}

// acquire finds or activates the instance for id and counts the request as
// its activity. When it returns nil the response is written. epoch is the
// request's (0: none): older than the live instance's answers 503 stale and
// leaves it alone; newer supersedes it (aborted, then a new activation
// under epoch once it has closed).
func (h *Host) acquire(rc *fasthttp.RequestCtx, id []byte, lease context.Context, epoch uint64) *Instance {
	si := h.shardIndex(id)
	sh := &h.shards[si]
	for {
		sh.mu.Lock()
		inst := sh.m[string(id)]
		if inst == nil {
			sh.mu.Unlock()
			inst, retry := h.activate(rc, sh, si, id, lease, epoch)
			if retry {
				continue
			}
			return inst
		}
		switch inst.state {
		case stateActive:
			if lease != nil && (inst.lease != lease || inst.Context().Err() != nil) {
				// Activated under another session, or the lease ended: this
				// instance must not serve; it is being aborted.
				sh.mu.Unlock()
				h.abort(inst, EvictLease)
				h.reject(rc, wire.ReasonClosing)
				return nil
			}
			switch activation.Decide(epoch, true, inst.epoch, 0, false) {
			case activation.Stale:
				sh.mu.Unlock()
				h.reject(rc, wire.ReasonStale)
				return nil
			case activation.Supersede:
				sh.mu.Unlock()
				h.supersede(inst)
				continue // waits for its close below, then activates
			}
			sh.hold(inst)
			sh.mu.Unlock()
			return inst
		case stateActivating:
			sh.hold(inst)
			ready := inst.ready
			sh.mu.Unlock()
			<-ready
			inst, retry := h.joined(rc, sh, inst, lease, epoch)
			if retry {
				continue
			}
			return inst
		default: // closing
			// A request that superseded the instance waits for it to go (it
			// releases nothing); any other answers 503 closing in fleet mode.
			superseded := inst.x.superseded && epoch > inst.epoch
			if (h.w != nil && !superseded) || h.closing.Load() || h.cfg.CloseWait < 0 {
				sh.mu.Unlock()
				h.reject(rc, wire.ReasonClosing)
				return nil
			}
			done := inst.x.done
			sh.mu.Unlock()
			if !h.waitClosed(done) {
				h.reject(rc, wire.ReasonClosing)
				return nil
			}
		}
	}
}

// waitClosed waits (bounded by CloseWait) for a closing instance to finish.
func (h *Host) waitClosed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
	}
	t := h.clock.NewTimer(h.cfg.CloseWait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C():
		return false
	}
}

// joined handles a request that waited for someone else's activation of
// inst (holding one activity on it). retry reports that the request's
// newer epoch superseded inst: acquire starts over.
func (h *Host) joined(rc *fasthttp.RequestCtx, sh *shard, inst *Instance, lease context.Context, epoch uint64) (_ *Instance, retry bool) {
	sh.mu.Lock()
	state := inst.state
	var setupErr error
	if inst.x != nil {
		setupErr = inst.x.setupErr
	}
	sh.mu.Unlock()
	switch {
	case state == stateClosed:
		h.setupFailed(rc, setupErr) // the instance is gone; its activity no longer matters
		return nil, false
	case epoch != 0 && epoch < inst.epoch: // whatever became of it meanwhile
		h.release(inst)
		h.reject(rc, wire.ReasonStale)
		return nil, false
	case state != stateActive:
		h.release(inst)
		h.reject(rc, wire.ReasonClosing)
		return nil, false
	case lease != nil && (inst.lease != lease || inst.Context().Err() != nil):
		h.release(inst)
		h.abort(inst, EvictLease)
		h.reject(rc, wire.ReasonClosing)
		return nil, false
	case epoch > inst.epoch:
		h.release(inst)
		h.supersede(inst)
		return nil, true
	}
	return inst, false
}

// supersede aborts inst because a request with a newer epoch arrived (eviction
// reason stale). Such a request was routed by a newer placement of the id
// that names this worker again, so inst's close skips Worker.Release, which
// would delete that newer placement.
func (h *Host) supersede(inst *Instance) {
	sh := &h.shards[inst.shard]
	sh.mu.Lock()
	if inst.state == stateActive || inst.state == stateActivating {
		inst.extra().superseded = true
		h.beginCloseLocked(sh, inst, EvictStale, true)
	}
	sh.mu.Unlock()
}

// staleRouteWindow is how long released epochs are remembered: the larger
// of Config.StaleRouteWindow and three leases of the worker (fleet mode).
func (h *Host) staleRouteWindow() time.Duration {
	if h.w == nil {
		return h.cfg.StaleRouteWindow
	}
	return max(h.cfg.StaleRouteWindow, 3*h.w.LeaseLength())
}

// nextEpoch allocates a local-mode activation epoch: wire.NextEpoch of the
// host's last one and its clock, so epochs increase across the host's ids
// (hence per id) and, through the clock floor, across process restarts.
func (h *Host) nextEpoch() uint64 {
	now := h.clock.Now().Wall()
	for {
		last := h.lastEpoch.Load()
		if e := wire.NextEpoch(last, now); h.lastEpoch.CompareAndSwap(last, e) {
			return e
		}
	}
}

// activate creates the instance for id under epoch (fleet mode; local mode
// allocates one) and runs its setup. retry reports that another request
// inserted the id first.
func (h *Host) activate(rc *fasthttp.RequestCtx, sh *shard, si uint16, id []byte, lease context.Context, epoch uint64) (_ *Instance, retry bool) {
	// The worker is consulted outside the shard lock: its own lock may be
	// held while it calls AbortAll or CloseIdle, which take shard locks.
	if h.w != nil && h.w.Draining() {
		h.reject(rc, wire.ReasonDraining)
		return nil, false
	}
	if h.live.Add(1) > int64(h.cfg.MaxInstances) {
		h.live.Add(-1)
		h.reject(rc, wire.ReasonCapacity)
		return nil, false
	}
	if h.w == nil {
		epoch = h.nextEpoch()
	}
	inst := &Instance{
		h:        h,
		id:       string(id),
		lease:    lease,
		epoch:    epoch,
		turn:     make(chan struct{}, 1),
		shard:    si,
		state:    stateActivating,
		activity: 1,
		ready:    make(chan struct{}),
	}

	window := h.staleRouteWindow()
	now := h.clock.Now()
	sh.mu.Lock()
	if h.closing.Load() || sh.m[inst.id] != nil {
		closing := h.closing.Load()
		sh.mu.Unlock()
		h.live.Add(-1)
		inst.cancel()
		if closing {
			h.reject(rc, wire.ReasonClosing)
			return nil, false
		}
		return nil, true
	}
	if h.w != nil {
		// Checked under the lock that also inserts the instance, so that no
		// close of the id can fall between the check and the activation.
		floor, ok := sh.released.Floor(id, now, window)
		if activation.Decide(epoch, false, 0, floor, ok) == activation.Stale {
			sh.mu.Unlock()
			h.live.Add(-1)
			inst.cancel()
			h.met.staleRoutes.Inc()
			h.logDebug("route refused: its placement closed here", "instance", inst.id, "epoch", epoch, "released", floor)
			h.reject(rc, wire.ReasonStale)
			return nil, false
		}
	}
	sh.m[inst.id] = inst
	h.wg.Add(1) // held by the instance until closeInstance (or a failed setup) ends
	sh.mu.Unlock()
	h.met.instances.Inc()

	obj, err := h.callNew(inst)

	sh.mu.Lock()
	close(inst.ready)
	inst.ready = nil
	if err != nil {
		delete(sh.m, inst.id)
		inst.state = stateClosed
		inst.extra().setupErr = err
		sh.mu.Unlock()
		inst.cancel()
		h.live.Add(-1)
		h.met.instances.Dec()
		h.wg.Done()
		if errors.Is(err, ErrStale) {
			h.logDebug("instance setup found it stale", "instance", inst.id, "epoch", inst.epoch, "error", err)
		} else {
			h.logThrottled(slog.LevelWarn, "instance setup failed", "instance", inst.id, "epoch", inst.epoch, "error", err)
		}
		h.setupFailed(rc, err)
		return nil, false
	}
	inst.obj = obj
	inst.state = stateActive
	if x := inst.x; x != nil && x.pendingClose != "" {
		h.beginCloseLocked(sh, inst, x.pendingClose, x.pendingAbort)
	}
	active := inst.state == stateActive
	sh.mu.Unlock()
	h.met.activations.Inc()
	if h.log.Enabled(context.Background(), slog.LevelDebug) {
		attrs := []any{"instance", inst.id, "epoch", inst.epoch}
		if s := rc.Request.Header.Peek(wire.HeaderSession); len(s) > 0 {
			attrs = append(attrs, "session", string(s))
		}
		h.log.Debug("instance activated", attrs...)
	}
	if !active {
		h.release(inst)
		h.reject(rc, wire.ReasonClosing)
		return nil, false
	}
	return inst, false
}

// callNew runs the type's setup, turning a panic into an error.
func (h *Host) callNew(inst *Instance) (obj any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("setup panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return h.newObj(inst)
}

func (h *Host) setupFailed(rc *fasthttp.RequestCtx, err error) {
	if errors.Is(err, ErrStale) {
		h.reject(rc, wire.ReasonStale)
		return
	}
	var he *Error
	if errors.As(err, &he) {
		h.writeError(rc, he.Status, he.Message, he.Field)
		return
	}
	h.writeError(rc, fasthttp.StatusInternalServerError, "instance setup failed", "")
}

// reject answers a request the host refuses: 403 forbidden, or 503 with
// Retry-After and the reason for everything else.
func (h *Host) reject(rc *fasthttp.RequestCtx, reason string) {
	h.met.reject(reason)
	status, msg := fasthttp.StatusServiceUnavailable, reason
	switch reason {
	case wire.ReasonForbidden:
		status, msg = fasthttp.StatusForbidden, "forbidden"
	case wire.ReasonCapacity:
		msg = "too many instances on this host"
	case wire.ReasonDraining:
		msg = "host is draining"
	case wire.ReasonClosing:
		msg = "instance is closing"
	case wire.ReasonLease:
		msg = "no valid lease for this session"
	case wire.ReasonAborted:
		msg = "instance was aborted"
	case wire.ReasonStale:
		msg = "stale route: the placement it names has been replaced or released"
	}
	h.writeError(rc, status, msg, "")
	rc.Response.Header.Set(wire.HeaderReason, reason)
}

// writeError replaces the response with status and a JSON wire.Error body;
// a 503 (the host's own, or an *Error of the application) carries
// Retry-After.
func (h *Host) writeError(rc *fasthttp.RequestCtx, status int, msg, field string) {
	jsonError(rc, status, msg, field)
	if status == fasthttp.StatusServiceUnavailable {
		rc.Response.Header.Set(wire.HeaderRetryAfter, h.retryAfter)
	}
}

// upgradeError answers a failed websocket handshake with a JSON error.
func (h *Host) upgradeError(rc *fasthttp.RequestCtx, status int, reason error) {
	h.writeError(rc, status, reason.Error(), "")
}
