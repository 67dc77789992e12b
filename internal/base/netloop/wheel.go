package netloop

import (
	"math/bits"
	"time"
)

// TimerHandler is called when a timer fires, on the loop goroutine.
type TimerHandler interface {
	OnTimer()
}

// Timer is a deadline on a loop's timer wheel. The zero value is a disarmed
// timer; set H before arming it. A Timer belongs to one loop and is touched
// only on that loop's goroutine; it is usually embedded in the state it times
// out, so arming allocates nothing.
type Timer struct {
	// H is called when the timer fires.
	H TimerHandler

	when       int64 // deadline, monotonic ns
	next, prev *Timer
	armed      bool
}

// Armed reports whether t is armed.
func (t *Timer) Armed() bool { return t.armed }

// When returns the deadline t was last armed for.
func (t *Timer) When() int64 { return t.when }

// wheel is a hashed timing wheel: slot i holds the timers whose deadline
// falls in a tick ≡ i (mod slots), in any round. A bitmap of non-empty slots
// finds the next deadline without walking empty slots.
type wheel struct {
	tick  int64
	slots []Timer // list heads (sentinels)
	busy  []uint64
	mask  int64
	last  int64 // the last tick whose slot was processed
	count int
	// due holds timers taken off their slot by advance, fired one by one;
	// a timer disarmed meanwhile leaves it without firing.
	due Timer
}

func (w *wheel) init(tick time.Duration, slots int) {
	slots = (slots + 63) &^ 63
	if slots&(slots-1) != 0 {
		slots = 1 << bits.Len(uint(slots))
	}
	w.tick = int64(tick)
	w.slots = make([]Timer, slots)
	for i := range w.slots {
		h := &w.slots[i]
		h.next, h.prev = h, h
	}
	w.busy = make([]uint64, slots/64)
	w.mask = int64(slots - 1)
	w.due.next, w.due.prev = &w.due, &w.due
}

func (w *wheel) tickOf(t int64) int64 { return t / w.tick }

// Arm sets t to fire at the loop-clock deadline when (Now() + d). Re-arming
// an armed timer moves it. Loop goroutine only.
func (l *Loop) Arm(t *Timer, when int64) {
	w := &l.wheel
	if t.armed {
		w.unlink(t)
	}
	t.when = when
	tk := w.tickOf(when)
	if tk <= w.last {
		tk = w.last + 1 // due: fires at the next advance
	}
	i := tk & w.mask
	h := &w.slots[i]
	t.prev, t.next = h.prev, h
	h.prev.next = t
	h.prev = t
	t.armed = true
	w.busy[i>>6] |= 1 << (i & 63)
	w.count++
}

// ArmAfter arms t to fire d after the loop's current time.
func (l *Loop) ArmAfter(t *Timer, d time.Duration) { l.Arm(t, l.now+int64(d)) }

// Disarm stops t from firing. Disarming a disarmed timer does nothing.
func (l *Loop) Disarm(t *Timer) {
	if t.armed {
		l.wheel.unlink(t)
	}
}

func (w *wheel) unlink(t *Timer) {
	t.prev.next = t.next
	t.next.prev = t.prev
	t.next, t.prev = nil, nil
	t.armed = false
	w.count--
}

// advance fires every timer due at now in the ticks that have ended: a timer
// in tick T fires once now has passed T's end, so it fires at most one tick
// late and its slot never holds, once processed, a timer of that same tick.
func (w *wheel) advance(now int64) {
	cur := w.tickOf(now) - 1
	if cur <= w.last {
		return
	}
	from := w.last + 1
	if cur-from >= int64(len(w.slots)) {
		from = cur - int64(len(w.slots)) + 1 // one full round visits every slot
	}
	for tk := from; tk <= cur; tk++ {
		i := tk & w.mask
		if w.busy[i>>6]&(1<<(i&63)) == 0 {
			continue
		}
		h := &w.slots[i]
		for t := h.next; t != h; {
			next := t.next
			if t.when <= now {
				w.unlink(t)
				// Onto the due list, still counted as armed.
				t.prev, t.next = w.due.prev, &w.due
				w.due.prev.next = t
				w.due.prev = t
				t.armed = true
				w.count++
			}
			t = next
		}
		if h.next == h {
			w.busy[i>>6] &^= 1 << (i & 63)
		}
	}
	w.last = cur
	for w.due.next != &w.due {
		t := w.due.next
		w.unlink(t)
		t.H.OnTimer()
	}
}

// timeout returns the epoll_wait timeout in milliseconds until the next
// non-empty slot's tick (-1: no timer armed).
func (w *wheel) timeout(now int64) int {
	if w.count == 0 {
		return -1
	}
	// The next busy slot after w.last, in wheel order.
	n := int64(len(w.slots))
	start := (w.last + 1) & w.mask
	var off int64 = -1
	for k := int64(0); k < int64(len(w.busy))+1; k++ {
		word := (start>>6 + k) % int64(len(w.busy))
		b := w.busy[word]
		if k == 0 {
			b &^= (1 << (start & 63)) - 1 // slots before start in its word
		}
		if k == int64(len(w.busy)) {
			b &= (1 << (start & 63)) - 1 // wrapped round to start's word
		}
		if b != 0 {
			slot := word<<6 | int64(bits.TrailingZeros64(b))
			off = (slot - start + n) & w.mask
			break
		}
	}
	if off < 0 {
		return -1
	}
	at := (w.last + 2 + off) * w.tick // the end of that slot's tick
	d := at - now
	if d <= 0 {
		return 0
	}
	ms := (d + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	return int(ms)
}
