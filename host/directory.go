package host

import (
	"hash/maphash"
	"sync"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/activation"
)

// shard is one part of the in-memory directory. Each id hashes to one
// shard; nothing is ever locked for all requests.
type shard struct {
	mu sync.Mutex
	m  map[string]*Instance
	// Idle list: exactly the active instances whose activity is 0, in the
	// order they became idle (see releaseAt).
	head, tail *Instance
	// released remembers the epochs of the shard's ids whose instances
	// closed within the stale-route window (fleet mode): a route at or below
	// one of them is refused stale instead of activating (internal/base/activation).
	released activation.Released
	_        [64]byte // keep neighbouring shards' mutexes off this cache line
}

func (h *Host) shardIndex(id []byte) uint16 {
	return uint16(maphash.Bytes(h.seed, id) & uint64(len(h.shards)-1))
}

// hold counts one more activity on inst, taking it off the idle list.
// Called with sh.mu held.
func (sh *shard) hold(inst *Instance) {
	inst.activity++
	if inst.linked {
		sh.unlink(inst)
	}
}

// pushIdle appends inst to the idle list. Called with sh.mu held.
func (sh *shard) pushIdle(inst *Instance) {
	inst.prev, inst.next = sh.tail, nil
	if sh.tail != nil {
		sh.tail.next = inst
	} else {
		sh.head = inst
	}
	sh.tail = inst
	inst.linked = true
}

// unlink removes inst from the idle list. Called with sh.mu held.
func (sh *shard) unlink(inst *Instance) {
	if inst.prev != nil {
		inst.prev.next = inst.next
	} else {
		sh.head = inst.next
	}
	if inst.next != nil {
		inst.next.prev = inst.prev
	} else {
		sh.tail = inst.prev
	}
	inst.prev, inst.next, inst.linked = nil, nil, false
}

// release ends one activity of inst (a request, stream, websocket or task).
// At zero an active instance joins the idle list and a closing one lets its
// closer proceed.
func (h *Host) release(inst *Instance) { h.releaseAt(inst, h.clock.Now()) }

// releaseAt is release with the current time already read. The time is read
// before taking the lock, so concurrent releases may append to the idle list
// slightly out of order; the sweep then closes an instance at most one tick
// late, never early.
func (h *Host) releaseAt(inst *Instance, now clock.Instant) {
	sh := &h.shards[inst.shard]
	sh.mu.Lock()
	inst.activity--
	if inst.activity == 0 {
		switch inst.state {
		case stateActive:
			inst.idleSince = now
			sh.pushIdle(inst)
		case stateClosing:
			if x := inst.x; x.drained != nil {
				close(x.drained)
				x.drained = nil
			}
		}
	}
	sh.mu.Unlock()
}

// forEachShard calls fn for every shard with its lock held.
func (h *Host) forEachShard(fn func(sh *shard)) {
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.Lock()
		fn(sh)
		sh.mu.Unlock()
	}
}
