package worker

import (
	"context"
	"crypto/subtle"
	"errors"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/faults"
	"github.com/pinned-go/pinned/internal/wire"
)

// Causes of a lost lease, delivered to LeaseOptions.OnLost and readable with
// context.Cause on the context Admit returned.
var (
	// ErrLeaseExpired: no heartbeat was acknowledged before the local deadline
	// (send time of the last acked call + lease − buffer), or the machine was
	// suspended past it. The worker registers again by itself; if it happens
	// often, the pinboard or the network to it is too slow for the timing
	// (see CheckTiming) or the process is being paused.
	ErrLeaseExpired = errors.New("lease expired: no heartbeat acknowledged before the local deadline")
	// ErrReregister: the pinboard does not know the session (409 reregister,
	// typically after it expired there). The worker registers again by itself.
	ErrReregister = errors.New("the pinboard does not know the session (reregister)")
	// ErrSuperseded: another registration with this worker's clientId or
	// advertise URL took over (409 superseded). Run returns it and the worker
	// stops for good. Two processes share an AdvertiseURL, or a process was
	// restarted under the same identity while the old one still ran: give
	// every process its own AdvertiseURL.
	ErrSuperseded = errors.New("the session was superseded by another registration")
	// ErrStopped: Run ended (its context was cancelled, or Shutdown finished)
	// and the worker no longer heartbeats, so it cannot keep its lease.
	ErrStopped = errors.New("the worker stopped")
)

// session is one registration with the pinboard. Its context is the lease
// context handed out by Admit; it is cancelled (with the loss cause) exactly
// once, by selfAbort.
type session struct {
	id     string
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newSession(id string) *session {
	ctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), sessionKey{}, id))
	return &session{id: id, ctx: ctx, cancel: cancel}
}

// sessionKey is the context key under which a session's context (the one
// Admit returns) carries its session id.
type sessionKey struct{}

// SessionOf returns the session id carried by ctx: a lease context returned
// by Admit, or any context derived from one or carrying its values (such as
// context.WithoutCancel of it). ok is false for other contexts.
func SessionOf(ctx context.Context) (id string, ok bool) {
	id, ok = ctx.Value(sessionKey{}).(string)
	return id, ok
}

// lease is an immutable snapshot of the current lease, replaced whole on each
// renewal and read lock-free by Admit.
type lease struct {
	sess      *session
	sent      clock.Instant // send time of the call whose ack anchors the lease
	expiresIn time.Duration // lease length supplied by the pinboard in that ack
	seq       uint64        // sequence number of that call (newer acks only move the anchor forward)
}

// anchorLease is THE place where an ack extends the lease. The lease counts
// from when the acknowledged call was SENT, never from when its answer came
// back: the pinboard refreshed its TTL some time after our send, so
// sent + expiresIn is a lower bound of its expiry, whereas receive time +
// expiresIn would overshoot it by one network delay (etcd's mistake, see
// research/reliability.md §0).
//
// received is when the ack arrived; it is used only by the planted fault
// faults.ReceiveAnchor (test binaries built with the pinned_faults tag).
func anchorLease(sess *session, sent, received clock.Instant, seq uint64, expiresIn time.Duration) *lease {
	if faults.Has(faults.ReceiveAnchor) {
		sent = received
	}
	return &lease{sess: sess, sent: sent, expiresIn: expiresIn, seq: seq}
}

// leaseValid is THE inline lease check: l is usable at now when fewer than
// expiresIn − buffer have elapsed since its anchor, measured by
// clock.Instant.Sub, which counts machine suspend. Admit and Ready call it on
// every use, so a frozen or suspended process refuses work the moment it
// wakes, whether or not the watchdog has run.
func (w *Worker) leaseValid(l *lease, now clock.Instant) bool {
	return l != nil && !now.Elapsed(l.sent, l.expiresIn-time.Duration(w.buffer.Load()))
}

// selfAbort is THE place where the worker fences itself after losing its
// lease (deadline passed, reregister, superseded, stopped): it withdraws the
// lease so Admit refuses at once, cancels the session context with cause
// (every instance context derived from it ends), and force-ends every
// instance of every attached host with reason. It returns the number of
// instances the hosts held. Callers register a new session only after it
// returns, so no instance of the old session outlives the switch.
func (w *Worker) selfAbort(cause error, reason string) int {
	if faults.Has(faults.NoSelfAbort) {
		w.current.Store(nil) // planted bug: refuse new requests, abort nothing
		return 0
	}
	if l := w.current.Swap(nil); l != nil {
		l.sess.cancel(cause)
	}
	n := 0
	for _, h := range w.attached() {
		n += h.Len()
		h.AbortAll(reason)
	}
	return n
}

// Admit implements host.Worker: the inline check of one data-plane request.
// In order: secret must equal the worker's secret (constant time) else
// wire.ReasonForbidden; a non-empty session must equal the current session
// id, and the current lease must be valid on the clock right now, else
// wire.ReasonLease. On success it returns the session's lease context, which
// is cancelled when the lease is lost. Admit does not allocate.
func (w *Worker) Admit(secret, session []byte) (context.Context, string) {
	if subtle.ConstantTimeCompare(secret, w.secret) != 1 {
		return nil, wire.ReasonForbidden
	}
	l := w.current.Load()
	if l == nil {
		return nil, wire.ReasonLease
	}
	if len(session) != 0 && string(session) != l.sess.id {
		return nil, wire.ReasonLease
	}
	if !faults.Has(faults.WatchdogOnly) && !w.leaseValid(l, w.clock.Now()) {
		return nil, wire.ReasonLease
	}
	return l.sess.ctx, ""
}

// LeaseValid implements host.LeaseChecker: lease is the context Admit
// returned under the current session and that lease is valid on the clock
// right now (leaseValid). Instance.Do calls it before every effect, so a
// task never takes effect after the local deadline, whatever the loop's
// watchdog is doing. It does not allocate.
func (w *Worker) LeaseValid(lease context.Context) bool {
	l := w.current.Load()
	if l == nil || l.sess.ctx != lease {
		return false
	}
	return faults.Has(faults.WatchdogOnly) || w.leaseValid(l, w.clock.Now())
}

// Ready reports whether the worker holds a valid lease right now: registered,
// not superseded or stopped, and not past the local deadline on the clock.
// Wire it to the application's readiness probe; the gauge pinned_registered
// reports the same value.
func (w *Worker) Ready() bool {
	return w.leaseValid(w.current.Load(), w.clock.Now())
}

// Session returns the current session id, or "" while the worker holds no
// lease. The id may be past its local deadline; Ready says whether it is usable.
func (w *Worker) Session() string {
	if l := w.current.Load(); l != nil {
		return l.sess.id
	}
	return ""
}

// ExpiresAt returns the lease expiry as the pinboard sees it: the send time
// of the last acknowledged call plus the lease length, in wall-clock time. The
// worker itself stops serving LeaseBuffer earlier. It is the zero time while
// the worker holds no lease.
func (w *Worker) ExpiresAt() time.Time {
	l := w.current.Load()
	if l == nil {
		return time.Time{}
	}
	return l.sent.Wall().Add(l.expiresIn)
}

// Remaining returns how long the worker may still serve under its lease
// (until ExpiresAt − LeaseBuffer, suspend counted), or 0 without a valid lease.
func (w *Worker) Remaining() time.Duration {
	l := w.current.Load()
	if l == nil {
		return 0
	}
	left := l.expiresIn - time.Duration(w.buffer.Load()) - w.clock.Now().Sub(l.sent)
	return max(left, 0)
}

// LeaseOptions changes the lease's local safety margin and its handlers (the
// seed's lease.configure).
type LeaseOptions struct {
	// Buffer replaces Config.LeaseBuffer; 0 keeps the current buffer. It is
	// validated with CheckTiming against the current lease (the default lease
	// before the first registration).
	Buffer time.Duration
	// OnLost is called after the worker lost its lease and aborted every
	// instance, with the cause (ErrLeaseExpired, ErrReregister,
	// ErrSuperseded, ErrStopped). nil means no handler.
	OnLost func(cause error)
	// OnRegained is called when a new session is registered after a lost
	// lease (not on the first registration), with the new session id. nil
	// means no handler.
	OnRegained func(session string)
}

// leaseHandlers is the handler part of LeaseOptions, swapped atomically.
type leaseHandlers struct {
	onLost     func(error)
	onRegained func(string)
}

// ConfigureLease replaces the lease buffer (when o.Buffer is not 0) and both
// handlers (nil removes one). Handlers run on the worker's loop goroutine and
// must return promptly (while one runs, heartbeats are not processed) and
// must not call Shutdown, which waits for that goroutine. A buffer change
// applies at once, to the current lease too.
func (w *Worker) ConfigureLease(o LeaseOptions) error {
	if o.Buffer < 0 {
		return errors.New("worker: LeaseOptions.Buffer is negative: use a positive duration, or 0 to keep the current one")
	}
	if o.Buffer != 0 {
		lease := DefaultLease
		if l := w.current.Load(); l != nil {
			lease = l.expiresIn
		} else if n := w.lastLease.Load(); n > 0 {
			lease = time.Duration(n)
		}
		if err := CheckTiming(lease, o.Buffer, w.cfg.HeartbeatInterval, w.cfg.RetryInterval); err != nil {
			return err
		}
		w.buffer.Store(int64(o.Buffer))
	}
	w.handlers.Store(&leaseHandlers{onLost: o.OnLost, onRegained: o.OnRegained})
	return nil
}

// LeaseEventKind says what happened to the lease in a LeaseEvent.
type LeaseEventKind string

// The lease events reported to Config.OnLease.
const (
	// LeaseRegistered: a registration was acknowledged; a new session
	// holds the lease, anchored at the registration's send time.
	LeaseRegistered LeaseEventKind = "registered"
	// LeaseRenewed: a heartbeat ack moved the lease's anchor forward.
	LeaseRenewed LeaseEventKind = "renewed"
	// LeaseLost: the session's lease was given up (Cause says why) and
	// selfAbort ran.
	LeaseLost LeaseEventKind = "lost"
)

// LeaseEvent is one change of the worker's lease, reported to
// Config.OnLease with the raw facts an outside observer needs to recompute
// the lease: when the acknowledged call was sent and what lease the ack
// granted (never the worker's own deadline).
type LeaseEvent struct {
	Kind    LeaseEventKind
	Session string
	// SentAgo is how long before the OnLease call the acknowledged call was
	// sent (registered, renewed).
	SentAgo time.Duration
	// HandledAgo is how long before the OnLease call the worker took the
	// ack in hand and checked that its lease had not lapsed yet (registered,
	// renewed): an ack handled after the local deadline renews nothing.
	HandledAgo time.Duration
	// ExpiresIn is the lease the ack granted (registered, renewed).
	ExpiresIn time.Duration
	// Cause is why the lease was lost (lost).
	Cause error
}

// leaseEvent reports e to Config.OnLease, if set.
func (w *Worker) leaseEvent(e LeaseEvent) {
	if w.cfg.OnLease != nil {
		w.cfg.OnLease(e)
	}
}
