package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// Eviction reasons the worker passes to the hosts.
const (
	reasonLease    = wire.ReasonLease // lease lost: AbortAll
	reasonWindDown = "wind_down"      // wind_down: CloseIdle, then AbortAll at the deadline
	reasonShutdown = "shutdown"       // Shutdown and the end of Run
	reasonEvict    = "evict"          // an evict message: Evict (host.EvictEvict)
)

// Labels of pinned_lease_lost_total.
const (
	lossExpired    = "expired"
	lossReregister = "reregister"
	lossSuperseded = "superseded"
	lossStopped    = "stopped"
	lossTiming     = "bad_timing"
)

// Run registers the worker and keeps its lease until ctx ends, Shutdown
// completes, or the session is superseded. It returns nil after ctx ended or
// Shutdown, ErrSuperseded (wrapped) when another registration took over, and
// an ErrBadTiming error when the pinboard's lease cannot work with the
// configured timing. Registration failures never end it: they are retried
// with capped exponential backoff. When Run returns, the worker holds no
// lease: every instance has been aborted (a cancelled ctx is an abrupt stop;
// use Shutdown to drain first) and Ready is false for good. Run may be called
// once; it waits for its in-flight registry calls (at most RequestTimeout).
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.started {
		w.mu.Unlock()
		return ErrStarted
	}
	w.started = true
	hosts := w.hosts
	w.mu.Unlock()
	defer close(w.runDone)
	if len(hosts) == 0 {
		return ErrNoHosts
	}

	l := &loop{
		w:       w,
		ns:      namespaces(hosts),
		maxBody: maxBody(hosts),
		log:     w.log,
		results: make(chan result),
		quit:    make(chan struct{}),
		stopReq: w.stopReq,
	}
	if w.hooks != nil {
		l.poke = w.hooks.poke
	}
	l.closer.Go(l.idleCloser)
	err := l.run(ctx)
	if w.current.Load() != nil {
		l.lose(ErrStopped, w.clock.Now())
	}
	close(l.quit) // calls still in flight drop their results; the idle closer stops
	l.calls.Wait()
	l.closer.Wait()
	w.pinboard.close()
	return err
}

// callKind tells registry calls apart.
type callKind uint8

const (
	callRegister callKind = iota
	callHeartbeat
)

// result is a finished registry call, handed from its goroutine to the loop.
type result struct {
	kind  callKind
	sess  *session      // heartbeat: the session it renews
	seq   uint64        // heartbeat: attempt number within the loop
	sent  clock.Instant // when the call was sent: the lease anchor
	final bool          // the last heartbeat of Shutdown
	reply reply
}

// loop is the state of one Run. Only the Run goroutine touches it; registry
// calls run on goroutines it owns (calls) and report on results (or drop
// their result once quit is closed).
type loop struct {
	w       *Worker
	ns      []string
	maxBody int64        // the smallest of the hosts' body limits, sent at registration
	log     *slog.Logger // w.log plus the session attr while registered
	results chan result
	quit    chan struct{} // closed when the loop has stopped reading results
	calls   sync.WaitGroup
	closer  sync.WaitGroup // idleCloser
	pending int            // calls started and not yet handled, all kinds and sessions
	poke    <-chan struct{}
	stopReq <-chan struct{} // nil after it fired

	// Registration.
	sess         *session // nil while unregistered
	regInFlight  bool
	regFailures  int
	nextRegister clock.Instant
	everLost     bool

	// Heartbeats of the current session.
	seq       uint64 // attempt counter (registrations count too)
	lastAcked uint64 // seq of the call anchoring the lease
	inflight  int    // heartbeat calls of the current session in flight
	nextSend  clock.Instant
	sendNow   bool // drain state changed: tell the pinboard at once
	troubled  bool // a heartbeat failed or went unacked since the last renewal

	// Drain.
	deadlineAborted bool
	drainComplete   bool

	// Stop (Shutdown): one final heartbeat, then return.
	stopping  bool
	finalSent bool
	finalDone bool
}

// run is the event loop: act on the clock, sleep until the next due instant,
// a call result, or a nudge; repeat.
func (l *loop) run(ctx context.Context) error {
	w := l.w
	l.nextRegister = w.clock.Now()
	for {
		now := w.clock.Now()
		l.act(now)
		if l.finished() {
			return nil
		}
		var timer clock.Timer
		var fired <-chan struct{}
		if at, ok := l.nextWake(now); ok {
			timer = w.clock.NewTimer(max(at.Sub(now), 0))
			fired = timer.C()
		}
		if w.hooks != nil && w.hooks.idle != nil {
			w.hooks.idle(l.pending)
		}
		var err error
		select {
		case <-ctx.Done():
		case <-fired:
		case r := <-l.results:
			err = l.handle(r)
		case <-w.kick:
			l.sendNow = true
		case <-l.stopReq:
			l.stopReq = nil
			l.stopping = true
		case <-l.poke:
		}
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// due reports whether now has reached at.
func due(now, at clock.Instant) bool { return now.Sub(at) >= 0 }

// act does everything that is due at now, fencing first.
func (l *loop) act(now clock.Instant) {
	w := l.w
	if l.sess != nil && !w.leaseValid(w.current.Load(), now.Add(-faults.LateWatchdogDelay())) {
		l.lose(ErrLeaseExpired, now)
	}
	l.driveDrain(now)
	switch {
	case l.stopping:
		if l.sess != nil && !l.finalSent && l.inflight < maxInflightHeartbeats {
			l.finalSent = true
			l.sendHeartbeat(now, true)
		}
	case l.sess != nil:
		if l.inflight < maxInflightHeartbeats && (l.sendNow || due(now, l.nextSend)) {
			l.sendHeartbeat(now, false)
		}
	case !l.regInFlight && due(now, l.nextRegister):
		l.sendRegister(now)
	}
	l.sendNow = false
}

// finished reports whether a stopping loop is done: the final heartbeat was
// answered, or there is no session to report on.
func (l *loop) finished() bool {
	return l.stopping && (l.sess == nil || l.finalDone)
}

// nextWake returns the earliest future instant the loop must act at: the
// watchdog (local lease deadline), the next heartbeat, the next registration
// attempt, the wind_down deadline.
func (l *loop) nextWake(now clock.Instant) (clock.Instant, bool) {
	var at clock.Instant
	ok := false
	consider := func(t clock.Instant) {
		if !ok || at.Sub(t) > 0 {
			at, ok = t, true
		}
	}
	w := l.w
	if l.sess != nil {
		if cur := w.current.Load(); cur != nil {
			consider(cur.Deadline(w.cfg.LeaseBuffer).Add(faults.LateWatchdogDelay())) // the watchdog
		}
		if !l.stopping && l.inflight < maxInflightHeartbeats {
			consider(l.nextSend)
		}
	} else if !l.stopping && !l.regInFlight {
		consider(l.nextRegister)
	}
	if mode, dl := w.drainSnapshot(); mode == modeWindDown && dl != 0 && !l.deadlineAborted {
		consider(now.Add(time.UnixMilli(dl).Sub(now.Wall())))
	}
	return at, ok
}

// start sends one registry call on a goroutine owned by the loop. The
// challenge pair is live exactly while the call is in flight.
func (l *loop) start(r result, path string, body any, pair challengePair) {
	w := l.w
	w.challenges.add(pair)
	l.pending++
	l.calls.Add(1)
	go func() {
		defer l.calls.Done()
		r.reply = w.pinboard.post(path, body, w.callDeadline(time.Time{}))
		w.challenges.remove(pair.challenge)
		select {
		case l.results <- r:
		case <-l.quit:
		}
	}()
}

// idleCloser closes the idle instances of every attached host
// (CloseIdle(wind_down)) each time closeIdleSoon asks, until quit. It runs
// beside the loop so that a pass, which takes seconds with a million idle
// instances, never delays a heartbeat or the handling of its ack.
func (l *loop) idleCloser() {
	for {
		select {
		case <-l.w.closeIdleReq:
			for _, h := range l.w.attached() {
				h.CloseIdle(reasonWindDown)
			}
		case <-l.quit:
			return
		}
	}
}

// headroom is what the worker offers in registrations and heartbeats: the
// attached hosts' headroom, or 0 while draining.
func (l *loop) headroom() int {
	if l.w.Draining() {
		return 0
	}
	n := 0
	for _, h := range l.w.attached() {
		n += h.Headroom()
	}
	return n
}

func (l *loop) sendRegister(now clock.Instant) {
	w := l.w
	pair := newChallengePair()
	l.regInFlight = true
	l.start(result{kind: callRegister, sent: now}, wire.PathRegister, wire.RegisterRequest{
		ClientID:       w.clientID,
		Secret:         string(w.secret),
		Namespaces:     l.ns,
		AdvertiseURL:   w.adv,
		Headroom:       l.headroom(),
		Draining:       w.Draining(),
		Challenge:      pair.challenge,
		ChallengeValue: pair.value,
		MaxBodyBytes:   l.maxBody,
	}, pair)
}

func (l *loop) sendHeartbeat(now clock.Instant, final bool) {
	w := l.w
	mode, dl := w.drainSnapshot()
	if mode == modeWindDown && !w.shuttingDown.Load() {
		w.closeIdleSoon() // close instances as they go idle, off the loop (Shutdown's awaitEmpty does it itself)
	}
	pair := newChallengePair()
	l.seq++
	l.inflight++
	l.nextSend = now.Add(w.cfg.RetryInterval) // resend if no ack by then
	hb := wire.HeartbeatRequest{
		SessionID:      l.sess.id,
		Headroom:       l.headroom(),
		Draining:       mode != modeNone,
		DrainDeadline:  dl,
		Challenge:      pair.challenge,
		ChallengeValue: pair.value,
	}
	if final {
		hb.Headroom, hb.Draining = 0, true
	}
	l.start(result{kind: callHeartbeat, sess: l.sess, seq: l.seq, sent: now, final: final}, wire.PathHeartbeat, hb, pair)
}

// handle processes one finished call. A non-nil error ends Run.
func (l *loop) handle(r result) error {
	w := l.w
	now := w.clock.Now()
	// An answer that arrives after the local deadline cannot save the lease:
	// fence before looking at it.
	if l.sess != nil && !w.leaseValid(w.current.Load(), now.Add(-faults.LateWatchdogDelay())) {
		l.lose(ErrLeaseExpired, now)
	}
	l.pending--
	switch r.kind {
	case callRegister:
		l.regInFlight = false
		return l.onRegister(r, now)
	default:
		if r.final {
			l.finalDone = true
		}
		if r.sess != l.sess {
			return nil // answer for a session already given up
		}
		l.inflight--
		return l.onHeartbeat(r, now)
	}
}

func (l *loop) onRegister(r result, now clock.Instant) error {
	w := l.w
	if l.stopping {
		return nil // a session registered while stopping is never used; it expires
	}
	rep := r.reply
	if rep.err == nil && rep.status == fasthttp.StatusOK {
		resp, err := decodeRegister(rep.body)
		if err == nil {
			lease := time.Duration(resp.ExpiresInMs) * time.Millisecond
			if err := CheckTiming(lease, w.cfg.LeaseBuffer, w.cfg.HeartbeatInterval, w.cfg.RetryInterval); err != nil {
				l.log.Error("the pinboard's lease cannot work with this worker's timing; stopping", "error", err)
				return fmt.Errorf("cannot serve under the pinboard's lease: %w", err)
			}
			w.lastLease.Store(int64(lease))
			sess := w.newSession(resp.SessionID)
			l.sess = sess
			if prev := w.lastSess.Load(); prev != nil {
				w.ended.add(*prev)
			}
			w.lastSess.Store(&sess.id)
			l.seq++
			l.lastAcked = l.seq
			w.current.Store(anchorLease(sess, r.sent, now, l.seq, lease))
			w.leaseEvent(LeaseEvent{Kind: LeaseRegistered, Session: sess.id, Lease: sess, SentAgo: w.clock.Now().Sub(r.sent), HandledAgo: w.clock.Now().Sub(now), ExpiresIn: lease})
			l.nextSend = r.sent.Add(w.cfg.HeartbeatInterval)
			l.regFailures = 0
			l.troubled = false
			l.log = w.log.With("session", sess.id)
			w.m.registrations[resultOK].Inc()
			l.log.Info("registered", "namespaces", l.ns, "lease", lease, "advertise", w.adv)
			if l.everLost {
				l.log.Info("lease regained")
			}
			return nil
		}
		rep = reply{err: err}
	}
	l.regFailures++
	delay := backoffDelay(l.regFailures, w.cfg.BackoffBase, w.cfg.BackoffMax, w.jitter)
	l.nextRegister = now.Add(delay)
	if rep.err == nil && rep.status == fasthttp.StatusUnauthorized {
		w.m.registrations[resultUnauthorized].Inc()
		l.log.Error("registration failed: "+w.cfg.tokenRefused(), "reason", "unauthorized", "attempt", l.regFailures, "retryIn", delay)
		return nil
	}
	w.m.registrations[resultFailed].Inc()
	l.log.Warn("registration failed", "reason", rep.describe(), "attempt", l.regFailures, "retryIn", delay)
	return nil
}

func (l *loop) onHeartbeat(r result, now clock.Instant) error {
	w := l.w
	rep := r.reply
	switch {
	case rep.err == nil && rep.status == fasthttp.StatusOK:
		ack, err := decodeAck(rep.body)
		if err != nil {
			l.heartbeatFailed(resultFailed, err.Error())
			return nil
		}
		for _, m := range ack.Messages {
			w.applyMessage(m)
		}
		if ack.Reregister {
			w.m.heartbeats[resultReregister].Inc()
			l.log.Warn("the pinboard asks for a new registration")
			l.lose(ErrReregister, now)
			return nil
		}
		lease := time.Duration(ack.ExpiresInMs) * time.Millisecond
		if int64(lease) != w.lastLease.Load() {
			if err := CheckTiming(lease, w.cfg.LeaseBuffer, w.cfg.HeartbeatInterval, w.cfg.RetryInterval); err != nil {
				l.log.Error("the pinboard's lease changed to one this worker's timing cannot work with; stopping", "error", err)
				l.lose(fmt.Errorf("%w: %w", ErrStopped, err), now)
				return fmt.Errorf("cannot serve under the pinboard's lease: %w", err)
			}
			w.lastLease.Store(int64(lease))
		}
		late := now.Sub(r.sent) > w.cfg.RetryInterval
		if late {
			w.m.heartbeats[resultLate].Inc()
		} else {
			w.m.heartbeats[resultOK].Inc()
		}
		if r.seq <= l.lastAcked {
			return nil // an older attempt; a newer one already anchors the lease
		}
		prev := w.current.Load()
		w.current.Store(anchorLease(l.sess, r.sent, now, r.seq, lease))
		w.leaseEvent(LeaseEvent{Kind: LeaseRenewed, Session: l.sess.id, Lease: l.sess, SentAgo: w.clock.Now().Sub(r.sent), HandledAgo: w.clock.Now().Sub(now), ExpiresIn: lease})
		l.lastAcked = r.seq
		l.nextSend = r.sent.Add(w.cfg.HeartbeatInterval)
		if l.troubled || late {
			attrs := []any{"ackDelay", now.Sub(r.sent), "remaining", w.Remaining()}
			if prev != nil {
				attrs = append(attrs, "sinceLastRenew", r.sent.Sub(prev.Sent))
			}
			l.log.Warn("lease renewed late", attrs...)
		}
		l.troubled = false
	case rep.nack() == wire.NackSuperseded:
		w.m.heartbeats[resultSuperseded].Inc()
		l.log.Error("superseded: another registration took over this worker's clientId or advertise URL; stopping for good",
			"reason", "superseded")
		l.lose(ErrSuperseded, now)
		return fmt.Errorf("worker stopped: %w", ErrSuperseded)
	case rep.nack() == wire.NackReregister:
		w.m.heartbeats[resultReregister].Inc()
		l.log.Warn("the pinboard does not know the session; registering again", "reason", "reregister")
		l.lose(ErrReregister, now)
	case rep.err == nil && rep.status == fasthttp.StatusUnauthorized:
		l.heartbeatFailed(resultUnauthorized, w.cfg.tokenRefused())
	default:
		l.heartbeatFailed(resultFailed, rep.describe())
	}
	return nil
}

// heartbeatFailed counts a failed heartbeat; only the first failure after a
// renewal is logged (the retry follows by itself at nextSend).
func (l *loop) heartbeatFailed(label, reason string) {
	l.w.m.heartbeats[label].Inc()
	if l.troubled {
		return
	}
	l.troubled = true
	if label == resultUnauthorized {
		l.log.Error("heartbeat failed", "reason", reason, "remaining", l.w.Remaining())
		return
	}
	l.log.Warn("heartbeat failed; retrying", "reason", reason, "remaining", l.w.Remaining())
}

// lose ends the current session after the lease was lost: self-abort, log,
// count, report LeaseLost, and arrange a fresh registration right away.
func (l *loop) lose(cause error, now clock.Instant) {
	w := l.w
	old := w.current.Load()
	n := w.selfAbort(cause, lossReason(cause))
	if l.sess != nil && !faults.Has(faults.NoSelfAbort) {
		l.sess.cancel(cause) // already done by selfAbort; harmless
	}
	attrs := []any{"reason", lossLabel(cause), "instances", n}
	if old != nil {
		attrs = append(attrs, "renewSent", old.Sent.Wall(), "sinceRenewSent", now.Sub(old.Sent))
	}
	if errors.Is(cause, ErrStopped) {
		l.log.Info("lease released: the worker stopped", attrs...)
	} else {
		l.log.Error("lease lost; every instance aborted", attrs...)
	}
	w.m.leaseLost[lossLabel(cause)].Inc()
	if l.sess != nil {
		w.leaseEvent(LeaseEvent{Kind: LeaseLost, Session: l.sess.id, Lease: l.sess, Cause: cause})
	}
	l.sess = nil
	l.inflight = 0 // the old session's calls no longer hold slots
	l.log = w.log
	l.everLost = true
	l.troubled = false
	l.regFailures = 0
	l.nextRegister = now
}

// lossReason is the eviction reason passed to AbortAll for a loss cause.
func lossReason(cause error) string {
	if errors.Is(cause, ErrStopped) {
		return reasonShutdown
	}
	return reasonLease
}

// lossLabel is the pinned_lease_lost_total label of a loss cause.
func lossLabel(cause error) string {
	switch {
	case errors.Is(cause, ErrLeaseExpired):
		return lossExpired
	case errors.Is(cause, ErrReregister):
		return lossReregister
	case errors.Is(cause, ErrSuperseded):
		return lossSuperseded
	case errors.Is(cause, ErrBadTiming):
		return lossTiming
	default:
		return lossStopped
	}
}
