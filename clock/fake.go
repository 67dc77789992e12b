package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a manually driven Clock for tests. Its zero value is not usable;
// call NewFake. It is safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     Instant
	timers  []*fakeTimer
	changed chan struct{} // closed and replaced whenever the pending set changes
}

// NewFake returns a Fake whose wall clock starts at start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: Instant{mono: 1, wall: start.UnixNano()}, changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() Instant {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer makes a timer that fires when Advance moves the monotonic reading
// d past now.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan struct{}, 1)}
	t.Reset(d)
	return t
}

// Advance moves both readings forward by d and fires, in order, every timer
// that falls due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	target := f.now.mono + int64(d)
	for {
		sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].at < f.timers[j].at })
		if len(f.timers) == 0 || f.timers[0].at > target {
			break
		}
		t := f.timers[0]
		f.timers = f.timers[1:]
		// Move time to the timer's instant so that code woken by it reads the
		// time it fired at.
		step := t.at - f.now.mono
		f.now.mono += step
		f.now.wall += step
		t.armed = false
		f.notifyLocked()
		select {
		case t.c <- struct{}{}:
		default:
		}
	}
	step := target - f.now.mono
	f.now.mono += step
	f.now.wall += step
	f.mu.Unlock()
}

// Suspend simulates a machine suspend (or a forward wall-clock step) of d:
// the wall reading advances, the monotonic one does not, and no timer fires.
func (f *Fake) Suspend(d time.Duration) {
	f.mu.Lock()
	f.now.wall += int64(d)
	f.mu.Unlock()
}

// StepWall moves only the wall reading by d (which may be negative).
func (f *Fake) StepWall(d time.Duration) { f.Suspend(d) }

// Pending returns how many timers are armed.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// BlockUntil waits until at least n timers are armed, or done is closed.
// Tests use it to know that the code under test has gone to sleep on the
// clock before they advance it. It reports whether n timers were reached.
func (f *Fake) BlockUntil(n int, done <-chan struct{}) bool {
	for {
		f.mu.Lock()
		if len(f.timers) >= n {
			f.mu.Unlock()
			return true
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

type fakeTimer struct {
	f     *Fake
	c     chan struct{}
	at    int64
	armed bool
}

func (t *fakeTimer) C() <-chan struct{} { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	if !t.armed {
		return false
	}
	t.armed = false
	for i, x := range t.f.timers {
		if x == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			break
		}
	}
	t.f.notifyLocked()
	return true
}

func (t *fakeTimer) Reset(d time.Duration) {
	t.Stop()
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	t.at = t.f.now.mono + int64(max(d, 0))
	t.armed = true
	t.f.timers = append(t.f.timers, t)
	t.f.notifyLocked()
}
