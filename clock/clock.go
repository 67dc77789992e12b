// Package clock is pinned's injectable clock. It exists for two reasons:
//
//  1. Leases must be measured on a clock that keeps counting while the
//     machine is suspended. Go's monotonic clock (CLOCK_MONOTONIC on Linux)
//     stops during suspend (golang/go#24595), so a VM that wakes from a pause
//     would believe its lease is still valid. An [Instant] therefore carries
//     both a monotonic and a wall reading, and [Instant.Sub] returns the
//     larger of the two elapsed times: suspend shows up through the wall
//     clock, a backward wall step cannot shorten elapsed time, and a forward
//     wall step can only make a lease expire early (the safe direction).
//  2. Tests drive time instead of sleeping: [Fake] advances on demand and
//     fires its timers synchronously from Advance.
//
// Invariants: Real.Now never allocates and makes no syscall beyond the vDSO
// clock read of time.Now. Timers fire on monotonic time only, as Go's do;
// a suspend (Fake.Suspend) moves the wall reading but fires nothing, so code
// that must notice a suspend checks Now inline instead of relying on a timer.
package clock

import (
	"time"
)

// Instant is a point in time read from a Clock: monotonic and wall readings
// in nanoseconds. The zero Instant is "never".
type Instant struct {
	mono int64 // nanoseconds on the clock's monotonic scale
	wall int64 // unix nanoseconds
}

// IsZero reports whether i is the zero Instant.
func (i Instant) IsZero() bool { return i == Instant{} }

// Add returns i moved by d on both scales.
func (i Instant) Add(d time.Duration) Instant {
	return Instant{mono: i.mono + int64(d), wall: i.wall + int64(d)}
}

// Sub returns the time elapsed from u to i: the larger of the monotonic and
// the wall differences, so that a suspend (wall advances, monotonic does not)
// counts as elapsed time.
func (i Instant) Sub(u Instant) time.Duration {
	m, w := i.mono-u.mono, i.wall-u.wall
	return time.Duration(max(m, w))
}

// Elapsed reports whether at least d has passed from anchor to i, by Sub's
// measure. Instants are not totally ordered (after a backward wall step both
// a.Sub(b) and b.Sub(a) can be positive), so deadlines are always expressed
// as an anchor plus a duration and checked with Elapsed.
func (i Instant) Elapsed(anchor Instant, d time.Duration) bool { return i.Sub(anchor) >= d }

// Wall returns the wall-clock reading as a time.Time (no monotonic part).
func (i Instant) Wall() time.Time { return time.Unix(0, i.wall) }

// Split returns i's monotonic and wall readings relative to base, for
// storing many Instants compactly (a cache keeps one per entry); base.Join
// inverts it.
func (i Instant) Split(base Instant) (mono, wall time.Duration) {
	return time.Duration(i.mono - base.mono), time.Duration(i.wall - base.wall)
}

// Join returns the Instant that Split(base) turned into mono and wall.
func (base Instant) Join(mono, wall time.Duration) Instant {
	return Instant{mono: base.mono + int64(mono), wall: base.wall + int64(wall)}
}

// UnixMilli returns the wall reading in unix milliseconds.
func (i Instant) UnixMilli() int64 { return i.wall / int64(time.Millisecond) }

// Timer is a one-shot timer created by a Clock.
type Timer interface {
	// C delivers one value when the timer fires.
	C() <-chan struct{}
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
	// Reset re-arms the timer to fire after d. Call it only on a stopped or
	// fired timer whose channel has been drained.
	Reset(d time.Duration)
}

// Clock reads time and makes timers.
type Clock interface {
	Now() Instant
	NewTimer(d time.Duration) Timer
}

// Real is the process clock. The zero value is ready to use; all Real values
// share one monotonic origin.
type Real struct{}

var origin = time.Now()

// Now reads the current time.
func (Real) Now() Instant {
	return FromTime(time.Now())
}

// FromTime converts a time.Time read from the runtime clock (time.Now, or a
// value derived from it such as fasthttp's RequestCtx.Time) into the Instant
// Real.Now would have returned then, without reading the clock again.
func FromTime(t time.Time) Instant {
	return Instant{mono: int64(t.Sub(origin)), wall: t.UnixNano()}
}

// NewTimer starts a runtime timer.
func (Real) NewTimer(d time.Duration) Timer {
	rt := &realTimer{c: make(chan struct{}, 1)}
	rt.t = time.AfterFunc(d, rt.fire)
	return rt
}

type realTimer struct {
	t *time.Timer
	c chan struct{}
}

func (r *realTimer) fire() {
	select {
	case r.c <- struct{}{}:
	default:
	}
}

func (r *realTimer) C() <-chan struct{}    { return r.c }
func (r *realTimer) Stop() bool            { return r.t.Stop() }
func (r *realTimer) Reset(d time.Duration) { r.t.Reset(d) }

// Or returns c, or Real when c is nil.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Sleep is the wait of a goroutine that sleeps until its next deadline or a
// nudge: it returns when d has passed on c (only when timed: a goroutine
// with no deadline waits for wake or stop alone), when wake delivers, or
// when stop is closed, and reports whether stop is closed. The timer it
// makes is stopped before it returns.
func Sleep(c Clock, d time.Duration, timed bool, wake, stop <-chan struct{}) (stopped bool) {
	var fired <-chan struct{}
	if timed {
		t := c.NewTimer(d)
		defer t.Stop()
		fired = t.C()
	}
	select {
	case <-fired:
	case <-wake:
	case <-stop:
		return true
	}
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
