package host

import (
	"context"
	"errors"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Alarm is one named alarm of an instance: SetAlarm's arguments, and an
// entry of Instance.Alarms.
type Alarm struct {
	// Name identifies the alarm within its instance: 1 to 64 bytes of the
	// id grammar (A-Za-z0-9._~@:+=-, not starting with '.').
	Name string
	// At is the scheduled time of the alarm's (next) occurrence,
	// millisecond precision. A time in the past fires at once.
	At time.Time
	// Every, when positive (at least a second), repeats the alarm at At +
	// k·Every.
	Every time.Duration
	// SkipMissed is the missed-tick policy of a repeating alarm: false
	// fires once for all the occurrences that passed while it could not be
	// delivered, true skips them.
	SkipMissed bool
	// MaxAttempts bounds the attempts of one occurrence (default 6); after
	// the last failed one it is dead-lettered.
	MaxAttempts int
	// Backoff is the wait after the first failed attempt, doubled after
	// each further one (default 2 s).
	Backoff time.Duration
	// Failures counts the failed attempts of the current occurrence
	// (listings only).
	Failures int
	// Due is when the alarm is delivered next: At, or later while it is
	// retried (listings only).
	Due time.Time
}

// AlarmOption adjusts an alarm set with Instance.SetAlarm.
type AlarmOption struct{ apply func(*Alarm) }

// Every repeats the alarm every d (at least one second).
func Every(d time.Duration) AlarmOption { return AlarmOption{func(a *Alarm) { a.Every = d }} }

// SkipMissed makes a repeating alarm skip the occurrences that passed
// while it could not be delivered, instead of firing once for them.
func SkipMissed() AlarmOption { return AlarmOption{func(a *Alarm) { a.SkipMissed = true }} }

// MaxAttempts bounds the attempts of one occurrence (1 to 100; default 6).
func MaxAttempts(n int) AlarmOption { return AlarmOption{func(a *Alarm) { a.MaxAttempts = n }} }

// RetryBackoff sets the wait after the first failed attempt (10 ms to
// 1 h; default 2 s); it doubles after each further failure.
func RetryBackoff(d time.Duration) AlarmOption {
	return AlarmOption{func(a *Alarm) { a.Backoff = d }}
}

// wire is the alarm as the protocol carries it.
func (a Alarm) wire() wire.Alarm {
	return wire.Alarm{Name: a.Name, AtMs: a.At.UnixMilli(), EveryMs: a.Every.Milliseconds(), SkipMissed: a.SkipMissed,
		MaxAttempts: a.MaxAttempts, BackoffMs: a.Backoff.Milliseconds()}
}

// alarmOf converts a stored alarm.
func alarmOf(w wire.Alarm) Alarm {
	a := Alarm{Name: w.Name, At: time.UnixMilli(w.AtMs), Every: time.Duration(w.EveryMs) * time.Millisecond,
		SkipMissed: w.SkipMissed, MaxAttempts: w.MaxAttempts, Backoff: time.Duration(w.BackoffMs) * time.Millisecond,
		Failures: w.Failures}
	if w.DueMs > 0 {
		a.Due = time.UnixMilli(w.DueMs)
	}
	return a
}

// DeadAlarm is an occurrence whose last attempt failed (Host.DeadAlarms, in
// local mode; the pinboard keeps the fleet's).
type DeadAlarm struct {
	ID     string
	Alarm  Alarm
	DeadAt time.Time
	// Error says how the last attempt failed.
	Error string
}

// AlarmCtx is what an Alarm handler receives: which alarm fired, for which
// occurrence, and which attempt this is.
type AlarmCtx struct {
	inst *Instance
	d    wire.AlarmDelivery
}

// Name returns the alarm's name.
func (x *AlarmCtx) Name() string { return x.d.Name }

// Scheduled returns the scheduled time of the occurrence being delivered
// (with Name, it identifies the occurrence: delivery is at least once).
func (x *AlarmCtx) Scheduled() time.Time { return time.UnixMilli(x.d.ScheduledMs) }

// Attempt returns the attempt number, 1 for the first. A delivery whose
// outcome was lost (a pinboard or worker crash) is repeated with the same
// number.
func (x *AlarmCtx) Attempt() int { return x.d.Attempt }

// Instance returns the instance the alarm belongs to.
func (x *AlarmCtx) Instance() *Instance { return x.inst }

// ID returns the instance's id.
func (x *AlarmCtx) ID() string { return x.inst.id }

// Context returns the instance's context.
func (x *AlarmCtx) Context() context.Context { return x.inst.Context() }

// AlarmStore is implemented by a Worker that keeps alarms durably
// (*worker.Worker: in the pinboard's store). In fleet mode the host's
// Instance.SetAlarm, DeleteAlarm and Alarms call it, with a context derived
// from the instance's (so its lease names the session that must hold the
// id) and bounded by Config.AlarmTimeout. A Worker that does not implement
// it makes those calls fail with ErrAlarmsUnsupported.
type AlarmStore interface {
	// SetAlarm sets (or replaces) the alarm a.Name of (namespace, id).
	SetAlarm(ctx context.Context, namespace, id string, a Alarm) error
	// DeleteAlarm removes the alarm name of (namespace, id), reporting
	// whether it existed.
	DeleteAlarm(ctx context.Context, namespace, id, name string) (bool, error)
	// Alarms lists the alarms of (namespace, id) by name.
	Alarms(ctx context.Context, namespace, id string) ([]Alarm, error)
}

// Alarm errors.
var (
	// ErrAlarmsUnsupported: the host runs in fleet mode under a Worker that
	// does not implement AlarmStore.
	ErrAlarmsUnsupported = errors.New("host: the worker keeps no alarms (it does not implement host.AlarmStore)")
	// ErrTooManyAlarms: the instance holds Config.MaxAlarmsPerInstance
	// alarms already (the pinboard's limit in fleet mode).
	ErrTooManyAlarms = errors.New("host: too many alarms for this instance")
	// ErrAlarmNotHolder: the pinboard refused the call because this
	// instance's session no longer holds its id (its lease ended, or the
	// directory lost it). A handler returning it (or an error wrapping it)
	// answers 503 lease + Retry-After: the proxy re-resolves the id.
	ErrAlarmNotHolder = errors.New("host: this instance's session no longer holds its id")
	// ErrAlarmUnavailable: the alarm could not be stored now (the pinboard
	// or its store did not answer within Config.AlarmTimeout); a later try
	// may succeed. A handler returning it answers 503 store + Retry-After.
	ErrAlarmUnavailable = errors.New("host: the alarm store is unavailable; retry later")
)

// SetAlarm sets the alarm name of the instance to fire at at, replacing an
// alarm of the same name. When it fires, the type's Alarm handler runs
// inside the instance's turn, after the id is activated if it is not live
// (an evicted instance wakes; in fleet mode wherever the id is placed then).
// A handler error retries the occurrence with exponential backoff, bounded
// in attempts, then dead-letters it.
//
// In fleet mode the alarm is stored by the pinboard (durable, survives the
// worker) before SetAlarm returns; in local mode it is an in-process timer
// of the host, lost when the process exits. An invalid alarm is refused
// with an *Error (status 400) naming the field; a call the worker or
// pinboard refuses returns their error.
func (inst *Instance) SetAlarm(name string, at time.Time, opts ...AlarmOption) error {
	a := Alarm{Name: name, At: at}
	for _, o := range opts {
		if o.apply != nil {
			o.apply(&a)
		}
	}
	w := a.wire()
	if field, err := w.Check(); err != nil {
		return &Error{Status: fasthttp.StatusBadRequest, Message: "alarm " + field + " " + err.Error(), Field: field}
	}
	h := inst.h
	if h.alarms != nil {
		return h.alarms.set(inst.id, w)
	}
	return h.withAlarmStore(inst, func(ctx context.Context, s AlarmStore) error {
		return s.SetAlarm(ctx, h.ns, inst.id, a)
	})
}

// DeleteAlarm removes the instance's alarm name; removing an alarm that
// does not exist is not an error. A delivery already in flight may still
// run the handler once.
func (inst *Instance) DeleteAlarm(name string) error {
	h := inst.h
	if h.alarms != nil {
		h.alarms.delete(inst.id, name)
		return nil
	}
	return h.withAlarmStore(inst, func(ctx context.Context, s AlarmStore) error {
		_, err := s.DeleteAlarm(ctx, h.ns, inst.id, name)
		return err
	})
}

// Alarms lists the instance's alarms by name.
func (inst *Instance) Alarms() ([]Alarm, error) {
	h := inst.h
	if h.alarms != nil {
		return h.alarms.list(inst.id), nil
	}
	var out []Alarm
	err := h.withAlarmStore(inst, func(ctx context.Context, s AlarmStore) (err error) {
		out, err = s.Alarms(ctx, h.ns, inst.id)
		return err
	})
	return out, err
}

// withAlarmStore runs fn with the worker's AlarmStore under the instance's
// context, bounded by AlarmTimeout.
func (h *Host) withAlarmStore(inst *Instance, fn func(context.Context, AlarmStore) error) error {
	s, ok := h.w.(AlarmStore)
	if !ok {
		return ErrAlarmsUnsupported
	}
	ctx, cancel := context.WithTimeout(inst.Context(), h.cfg.AlarmTimeout)
	defer cancel()
	return fn(ctx, s)
}

// alarmMetrics are the host's alarm metrics.
type alarmMetrics struct {
	ok, failed *metrics.Counter // pinned_alarm_runs_total{result}
	dead       *metrics.Counter // pinned_local_alarms_dead_lettered_total
}

func newAlarmMetrics(set *metrics.Set, ns string, pending func() float64) *alarmMetrics {
	l := `namespace="` + escapeLabelValue(ns) + `"`
	set.GetOrCreateGauge("pinned_local_alarms{"+l+"}", pending)
	return &alarmMetrics{
		ok:     set.GetOrCreateCounter(`pinned_alarm_runs_total{` + l + `,result="ok"}`),
		failed: set.GetOrCreateCounter(`pinned_alarm_runs_total{` + l + `,result="failed"}`),
		dead:   set.GetOrCreateCounter(`pinned_local_alarms_dead_lettered_total{` + l + `}`),
	}
}

// isAlarmDelivery reports whether a request that passed Worker.Admit is an
// alarm delivery: POST to <id>/_pinned/alarm with the alarm field. It does
// not allocate.
func isAlarmDelivery(rc *fasthttp.RequestCtx, rest []byte) bool {
	return len(rest) == len(wire.PathAlarm) && string(rest) == wire.PathAlarm && rc.IsPost() &&
		len(rc.Request.Header.Peek(wire.HeaderAlarm)) > 0
}

// serveAlarmRequest answers an alarm delivery from the pinboard.
func (h *Host) serveAlarmRequest(rc *fasthttp.RequestCtx, id []byte, lease context.Context, epoch uint64) {
	d, err := wire.ParseAlarmDelivery(rc.Request.Header.Peek(wire.HeaderAlarm))
	if err != nil {
		h.writeError(rc, fasthttp.StatusBadRequest, err.Error(), wire.HeaderAlarm)
		return
	}
	h.runAlarm(rc, id, lease, epoch, d)
}

// runAlarm activates id if needed and runs the type's Alarm handler inside
// its turn, after checking the instance's lease inline once it holds the
// turn (503 lease when it ended). It answers 204 when the handler returned nil; 500 with the
// handler's message when it failed, panicked, or its instance was aborted
// under it (the outcome is unknown: an attempt, never a 503, which would
// mean nothing ran); 404 without an Alarm handler; and the host's usual
// refusals (503 capacity, closing, draining, lease) when no handler ran.
// epoch is the delivery's X-Pinned-Epoch (0: none), checked as any
// request's.
func (h *Host) runAlarm(rc *fasthttp.RequestCtx, id []byte, lease context.Context, epoch uint64, d wire.AlarmDelivery) {
	if h.alarm == nil {
		h.writeError(rc, fasthttp.StatusNotFound, "this object type has no Alarm handler", "")
		return
	}
	inst := h.acquire(rc, id, lease, epoch)
	if inst == nil {
		return // acquire answered
	}
	if !inst.acquireTurn() {
		h.release(inst)
		h.reject(rc, wire.ReasonClosing)
		return
	}
	if inst.lease != nil && inst.lease.Err() != nil {
		// The lease ended while the delivery waited for the turn: checked
		// inline, as Instance.Do does, so no Alarm handler runs under an
		// ended lease whatever the worker's watchdog is doing. Nothing ran:
		// the pinboard retries it without counting an attempt.
		inst.releaseTurn()
		h.release(inst)
		h.reject(rc, wire.ReasonLease)
		return
	}
	err := h.callAlarm(inst, d)
	inst.releaseTurn()
	h.release(inst)
	if err == nil {
		h.am.ok.Inc()
		rc.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	h.am.failed.Inc()
	msg := err.Error()
	var he *Error
	if errors.As(err, &he) {
		msg = he.Message
	}
	attrs := []any{"instance", inst.id, "alarm", d.Name, "attempt", d.Attempt, "error", err}
	if p, ok := err.(*panicError); ok {
		attrs = append(attrs, "stack", string(p.stack))
	} else if inst.Context().Err() != nil {
		msg = "the instance was aborted under the alarm handler: " + msg
	}
	h.logThrottled(slog.LevelWarn, "alarm handler failed", attrs...)
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	h.writeError(rc, fasthttp.StatusInternalServerError, "alarm handler failed: "+msg, "")
}

// callAlarm runs the Alarm handler, turning a panic into an error and an
// abort of the instance.
func (h *Host) callAlarm(inst *Instance, d wire.AlarmDelivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &panicError{value: p, stack: debug.Stack()}
			h.abort(inst, EvictAbort)
		}
	}()
	return h.alarm(inst.obj, &AlarmCtx{inst: inst, d: d})
}

// DeadAlarms returns the dead letters of a local-mode host, the newest
// first (nil in fleet mode: GET /registry/alarms/dead on the pinboard).
func (h *Host) DeadAlarms() []DeadAlarm {
	if h.alarms == nil {
		return nil
	}
	return h.alarms.deadLetters()
}
