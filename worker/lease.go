package worker

import (
	"context"
	"crypto/subtle"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/base/leaseterm"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// Causes of a lost lease: context.Cause of the lease context, and
// LeaseEvent.Cause of the LeaseLost event.
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

// session is one registration with the pinboard, and its lease context: the
// context.Context that Admit returns, LeaseEvent carries and instance
// contexts derive from. It ends exactly once, with the loss cause: when the
// loop fences (selfAbort), or when Err finds the local deadline passed
// first.
type session struct {
	id     string
	w      *Worker
	ctx    context.Context // carries the session id; cancelled when the lease ends
	cancel context.CancelCauseFunc
}

func (w *Worker) newSession(id string) *session {
	ctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), sessionKey{}, id))
	return &session{id: id, w: w, ctx: ctx, cancel: cancel}
}

// Deadline implements context.Context: a lease context reports no deadline.
// Its local deadline moves later with every renewal, and a context's
// deadline must not move (context.WithDeadline of a derived context trusts
// an earlier parent deadline and drops its own). The end itself is exact:
// see Err.
func (s *session) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done implements context.Context: closed when the lease has ended.
func (s *session) Done() <-chan struct{} { return s.ctx.Done() }

// Value implements context.Context; the session id is under sessionKey (see
// SessionOf). Contexts derived from a lease context hang directly on its
// cancellation (no goroutine), since Value exposes the inner cancelCtx.
func (s *session) Value(key any) any { return s.ctx.Value(key) }

// Err implements context.Context and is the lease's inline check (it calls
// leaseValid on the clock right now): nil while this session holds the
// current lease and its local deadline has not passed. The first call that
// finds the deadline passed ends the lease context there and then, with
// cause ErrLeaseExpired, whether or not the loop's watchdog has run, so Err
// never reports a live lease past its end and Done is closed before Err
// returns non-nil. It does not allocate.
func (s *session) Err() error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	w := s.w
	l := w.current.Load()
	if l != nil && l.sess == s && (faults.Has(faults.WatchdogOnly) || w.leaseValid(l, w.clock.Now())) {
		return nil
	}
	if faults.Has(faults.NoSelfAbort) {
		// Planted bug: the lease was withdrawn without ending its context.
		return ErrLeaseExpired
	}
	s.cancel(ErrLeaseExpired)
	return s.ctx.Err()
}

// String names the session, for debugging.
func (s *session) String() string { return "worker.lease(" + s.id + ")" }

// sessionKey is the context key under which a lease context carries its
// session id.
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
	sess *session
	// Term: the send time of the call whose ack anchors the lease, and the
	// lease length the pinboard supplied in that ack.
	leaseterm.Term
	seq uint64 // sequence number of that call (newer acks only move the anchor forward)
}

// anchorLease is THE place where an ack extends the lease. The lease counts
// from when the acknowledged call was SENT, never from when its answer came
// back: the pinboard refreshed its TTL some time after our send, so
// sent + expiresIn is a lower bound of its expiry, whereas receive time +
// expiresIn would overshoot it by up to one network delay (the mistake of
// anchoring a lease at the answer: the planted fault receive_anchor).
//
// received is when the ack arrived; it is used only by the planted fault
// faults.ReceiveAnchor (test binaries built with the pinned_faults tag).
func anchorLease(sess *session, sent, received clock.Instant, seq uint64, expiresIn time.Duration) *lease {
	return &lease{sess: sess, Term: leaseterm.Anchor(sent, received, expiresIn), seq: seq}
}

// leaseValid is THE inline lease check: l is usable at now when fewer than
// expiresIn − buffer have elapsed since its anchor, measured by
// clock.Instant.Sub, which counts machine suspend. The lease context's Err
// (so Admit and Instance.Do) and Ready call it on every use, so a frozen or
// suspended process refuses work the moment it wakes, whether or not the
// watchdog has run.
func (w *Worker) leaseValid(l *lease, now clock.Instant) bool {
	return l != nil && l.Valid(now, w.cfg.LeaseBuffer)
}

// selfAbort is THE place where the worker fences itself after losing its
// lease (deadline passed, reregister, superseded, stopped): it ends the
// lease context with cause (every instance context derived from it ends,
// and its Err, hence Admit and Instance.Do, refuse), withdraws the lease,
// and force-ends every instance of every attached host with reason. It
// returns the number of instances the hosts held. Callers register a new
// session only after it returns, so no instance of the old session outlives
// the switch.
func (w *Worker) selfAbort(cause error, reason string) int {
	if faults.Has(faults.NoSelfAbort) {
		w.current.Store(nil) // planted bug: refuse new requests, abort nothing
		return 0
	}
	if l := w.current.Load(); l != nil {
		l.sess.cancel(cause) // before the withdrawal: a withdrawn lease is always ended
		w.current.Store(nil)
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
// id, and the lease must not have ended (its context's Err, which checks the
// clock right now), else wire.ReasonLease. On success it returns the lease
// context. Admit does not allocate.
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
	if l.sess.Err() != nil {
		return nil, wire.ReasonLease
	}
	return l.sess, ""
}

// Ready reports whether the worker holds a valid lease right now: registered,
// not superseded or stopped, and not past the local deadline on the clock.
// Wire it to the application's readiness probe; the gauge pinned_registered
// reports the same value.
func (w *Worker) Ready() bool {
	return w.leaseValid(w.current.Load(), w.clock.Now())
}

// LeaseLength implements host.Worker: the length of the lease the pinboard
// granted in its last registration or heartbeat answer (expiresInMs), 0
// before the first one.
func (w *Worker) LeaseLength() time.Duration { return time.Duration(w.lastLease.Load()) }

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
	return l.Expires().Wall()
}

// Remaining returns how long the worker may still serve under its lease
// (until ExpiresAt − LeaseBuffer, suspend counted), or 0 without a valid lease.
func (w *Worker) Remaining() time.Duration {
	l := w.current.Load()
	if l == nil {
		return 0
	}
	left := l.ExpiresIn - w.cfg.LeaseBuffer - w.clock.Now().Sub(l.Sent)
	return max(left, 0)
}

// LeaseEventKind says what happened to the lease in a LeaseEvent.
type LeaseEventKind string

// The lease events reported to the functions registered with OnLease.
const (
	// LeaseRegistered: a registration was acknowledged; a new session
	// holds the lease, anchored at the registration's send time.
	LeaseRegistered LeaseEventKind = "registered"
	// LeaseRenewed: a heartbeat ack moved the lease's anchor forward.
	LeaseRenewed LeaseEventKind = "renewed"
	// LeaseLost: the session's lease ended (Cause says why) and selfAbort
	// ran: its context is cancelled and every instance was aborted.
	LeaseLost LeaseEventKind = "lost"
)

// LeaseEvent is one change of the worker's lease, with the raw facts an
// outside observer needs to recompute the lease: when the acknowledged call
// was sent and what lease the ack granted (never the worker's own deadline).
type LeaseEvent struct {
	Kind LeaseEventKind
	// Session is the session id (also the lease context's SessionOf).
	Session string
	// Lease is the session's lease context, the one Admit returns: live
	// after registered and renewed (until the lease ends), ended after lost.
	Lease context.Context
	// SentAgo is how long before the call the acknowledged call was sent
	// (registered, renewed).
	SentAgo time.Duration
	// HandledAgo is how long before the call the worker took the ack in hand
	// and checked that its lease had not lapsed yet (registered, renewed): an
	// ack handled after the local deadline renews nothing.
	HandledAgo time.Duration
	// ExpiresIn is the lease the ack granted (registered, renewed). The
	// local deadline is SentAgo before the call + ExpiresIn − LeaseBuffer.
	ExpiresIn time.Duration
	// Cause is why the lease ended (lost): ErrLeaseExpired, ErrReregister,
	// ErrSuperseded or ErrStopped (possibly wrapping ErrBadTiming), the
	// lease context's context.Cause.
	Cause error
}

// leaseObserver is one function registered with OnLease; its pointer is its
// identity, so the same function may be registered twice.
type leaseObserver struct{ fn func(LeaseEvent) }

// OnLease registers fn to be called for every lease event: each
// registration, each heartbeat ack that renews the lease, each loss (after
// the abort). Register before Run to see the first registration. fn runs on
// Run's goroutine, in registration order with the other functions: it must
// return promptly (heartbeats wait for it) and must not call Shutdown,
// which waits for that goroutine. stop unregisters fn; an event being
// delivered while stop runs may still reach it. It is the lease's one
// observation point besides the lease context itself (whose end, Done and
// context.Cause, needs no registration).
func (w *Worker) OnLease(fn func(LeaseEvent)) (stop func()) {
	o := &leaseObserver{fn: fn}
	w.mu.Lock()
	w.observers = append(w.observers[:len(w.observers):len(w.observers)], o)
	w.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.observers = slices.DeleteFunc(slices.Clone(w.observers), func(x *leaseObserver) bool { return x == o })
		})
	}
}

// leaseEvent reports e to every function registered with OnLease.
func (w *Worker) leaseEvent(e LeaseEvent) {
	w.mu.Lock()
	obs := w.observers
	w.mu.Unlock()
	for _, o := range obs {
		o.fn(e)
	}
}
