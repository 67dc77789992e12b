package activation

import (
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/faults"
)

// Released remembers the epochs under which instances closed, per id, for a
// retention window: the memory Decide consults when no instance is live. The
// zero value is empty and ready to use. It is not safe for concurrent use.
//
// Cost: one map entry per id that closed within the window, and one queue
// slot per close (an id closed twice within the window holds two slots, the
// older of which Expire skips). Expire pops from the front of the queue, which
// is in close order, so a call costs the number of entries it forgets plus
// one.
type Released struct {
	m map[string]released
	q []queued // in order of at; q[head:] is live
	// head is the first live slot of q; the slots before it are spent and
	// reclaimed when the queue is compacted.
	head int
}

type released struct {
	epoch uint64
	at    clock.Instant // the last close of the id
}

type queued struct {
	id string
	at clock.Instant
}

// Add records that an instance of id, activated under epoch, closed at now.
// The id's floor becomes the larger of its current one and epoch. now must
// not be earlier than the now of an earlier Add (the caller reads its clock
// under the lock that guards r); a clock read out of order only delays a
// forget.
func (r *Released) Add(id string, epoch uint64, now clock.Instant) {
	if r.m == nil {
		r.m = make(map[string]released)
	}
	if e, ok := r.m[id]; ok && e.epoch > epoch {
		epoch = e.epoch
	}
	r.m[id] = released{epoch: epoch, at: now}
	r.q = append(r.q, queued{id: id, at: now})
}

// Floor returns the largest epoch under which an instance of id closed less
// than window before now, and whether there is one. It does not depend on
// Expire having run: an entry older than window is ignored here, and only
// its memory waits for Expire.
func (r *Released) Floor(id []byte, now clock.Instant, window time.Duration) (uint64, bool) {
	e, ok := r.m[string(id)] // no allocation: the compiler does not copy the key
	if !ok || now.Elapsed(e.at, retention(window)) {
		return 0, false
	}
	return e.epoch, true
}

// retention is the window, or the planted fault's much shorter one.
func retention(window time.Duration) time.Duration {
	if faults.Has(faults.ShortTombstone) {
		return faults.ShortTombstoneWindow
	}
	return window
}

// Expire forgets every id whose last close is at least window before now, and
// returns how many it forgot.
func (r *Released) Expire(now clock.Instant, window time.Duration) int {
	window = retention(window)
	n := 0
	for r.head < len(r.q) && now.Elapsed(r.q[r.head].at, window) {
		s := r.q[r.head]
		r.q[r.head] = queued{}
		r.head++
		if e, ok := r.m[s.id]; ok && e.at == s.at {
			delete(r.m, s.id)
			n++
		}
	}
	switch {
	case r.head == len(r.q):
		r.q, r.head = r.q[:0], 0
	case r.head > len(r.q)/2 && r.head > 64:
		k := copy(r.q, r.q[r.head:])
		clear(r.q[k:]) // drop the ids the moved slots left behind
		r.q, r.head = r.q[:k], 0
	}
	return n
}

// Len returns the number of ids remembered.
func (r *Released) Len() int { return len(r.m) }
