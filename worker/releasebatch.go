package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// releaseSenders bounds the POST /registry/releases calls one worker has
// in flight at a time. Each carries every release of its (namespace,
// session) queued meanwhile, up to Config.ReleaseBatch, so a few calls
// keep the pinboard busy while the next batches fill.
const releaseSenders = 4

// releaseBodyBudget bounds the estimated size of one batch's body, below
// the registry's body limit with room for the fields every release shares.
const releaseBodyBudget = wire.MaxBodyBytes - 1024

// releaseKey groups releases that can share a batch.
type releaseKey struct{ ns, sid string }

// pendingRelease is one Release attempt waiting for its batch. Its fields
// after req are guarded by the batcher's mutex, but for the channels.
type pendingRelease struct {
	req      wire.ReleaseRequest
	deadline time.Time
	done     chan reply    // the outcome; buffered, sent once
	lead     chan struct{} // this waiter is to send batches now; buffered
	gone     bool          // the caller stopped waiting (its context ended)
	promoted bool          // lead was signalled
	sent     bool          // taken into a batch
}

// releaseBatcher turns Release attempts that wait at the same time into
// few POST /registry/releases calls (group commit): an attempt queues
// itself; when fewer than releaseSenders calls are in flight it sends
// batches itself until its own release is answered, then hands the
// sending to another waiting attempt. No goroutine of its own: every call
// is made by a Release caller, which returns only once it handed off or
// nothing is left. An attempt alone goes at once, in a batch of one.
//
// A pinboard older than the call answers 404 (or 405): the batcher then
// falls back for good to one POST /registry/release per attempt.
type releaseBatcher struct {
	p        *pinboardClient
	clientID string
	max      int // Config.ReleaseBatch
	fallback atomic.Bool

	mu      sync.Mutex
	queues  map[releaseKey][]*pendingRelease
	keys    []releaseKey // the keys with a non-empty queue, oldest first
	senders int          // attempts sending batches now
}

func newReleaseBatcher(p *pinboardClient, clientID string, max int) *releaseBatcher {
	return &releaseBatcher{p: p, clientID: clientID, max: max, queues: map[releaseKey][]*pendingRelease{}}
}

// errBatchUnsupported is the outcome of an attempt the batcher did not send
// because the pinboard has no batch call: the caller sends it alone.
var errBatchUnsupported = fmt.Errorf("the pinboard has no %s", wire.PathReleases)

// release sends req in a batch and returns its outcome as the reply a
// POST /registry/release of req alone would have had (status and body), by
// deadline. It returns early, with ctx's cause, when ctx ends first.
func (b *releaseBatcher) release(ctx context.Context, req wire.ReleaseRequest, deadline time.Time) reply {
	if b.max <= 1 || b.fallback.Load() {
		return reply{err: errBatchUnsupported}
	}
	it := &pendingRelease{req: req, deadline: deadline, done: make(chan reply, 1), lead: make(chan struct{}, 1)}
	k := releaseKey{req.Namespace, req.SessionID}
	b.mu.Lock()
	if len(b.queues[k]) == 0 {
		b.keys = append(b.keys, k)
	}
	b.queues[k] = append(b.queues[k], it)
	if b.senders < releaseSenders {
		b.senders++
		b.send(it) // unlocks
	} else {
		b.mu.Unlock()
	}
	for {
		select {
		case r := <-it.done:
			b.leave(it) // another sender answered it
			return r
		case <-it.lead:
			b.mu.Lock()
			it.promoted = false
			b.send(it)
		case <-ctx.Done():
			b.mu.Lock()
			it.gone = true
			b.mu.Unlock()
			b.leave(it)
			return reply{err: fmt.Errorf("release abandoned: %w", context.Cause(ctx))}
		}
	}
}

// leave is run by a waiter that stops waiting without sending: when it was
// handed the sending meanwhile, it passes the sending on, as any sender
// whose release is answered.
func (b *releaseBatcher) leave(it *pendingRelease) {
	b.mu.Lock()
	if !it.promoted {
		b.mu.Unlock()
		return
	}
	it.promoted = false
	<-it.lead
	b.send(nil) // unlocks
}

// send is run by a sender, with b.mu held (it returns with it released):
// it sends batches until own is answered (own nil: at once), then hands the
// sending to a waiting attempt, or stops when none is left.
func (b *releaseBatcher) send(own *pendingRelease) {
	for {
		if own == nil || own.sent && len(own.done) > 0 || own.gone {
			if next := b.promotable(); next != nil {
				next.promoted = true
				next.lead <- struct{}{} // the sender count passes to next
			} else {
				b.senders--
			}
			b.mu.Unlock()
			return
		}
		batch, k := b.take()
		if len(batch) == 0 {
			// own was taken by another sender: wait for its answer there.
			b.senders--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.post(k, batch)
		b.mu.Lock()
	}
}

// waiting is the oldest queued attempt whose caller still waits, or nil;
// attempts whose callers left are dropped from the queues on the way.
func (b *releaseBatcher) waiting() *pendingRelease {
	for len(b.keys) > 0 {
		k := b.keys[0]
		q := b.queues[k]
		for len(q) > 0 && q[0].gone {
			q[0] = nil
			q = q[1:]
		}
		if len(q) > 0 {
			b.queues[k] = q
			return q[0]
		}
		delete(b.queues, k)
		b.keys = b.keys[1:]
	}
	return nil
}

// promotable is the oldest queued attempt whose caller still waits and has
// not been handed the sending yet, or nil.
func (b *releaseBatcher) promotable() *pendingRelease {
	if b.waiting() == nil {
		return nil
	}
	for _, k := range b.keys {
		for _, it := range b.queues[k] {
			if !it.gone && !it.promoted {
				return it
			}
		}
	}
	return nil
}

// take removes the next batch from the queues: the oldest key's attempts
// still waited for, up to max and the body budget, marked sent.
func (b *releaseBatcher) take() ([]*pendingRelease, releaseKey) {
	if b.waiting() == nil {
		return nil, releaseKey{}
	}
	k := b.keys[0]
	q := b.queues[k]
	var batch []*pendingRelease
	size := 0
	i := 0
	for ; i < len(q) && len(batch) < b.max; i++ {
		it := q[i]
		if it.gone {
			continue
		}
		n := releaseItemSize(it.req.ID)
		if len(batch) > 0 && size+n > releaseBodyBudget {
			break
		}
		size += n
		it.sent = true
		batch = append(batch, it)
	}
	clear(q[:i])
	b.keys = advance(b.queues, b.keys, q[i:])
	return batch, k
}

// releaseItemSize bounds the bytes one release adds to a batch's body:
// {"id":"…","epoch":18446744073709551615}, with every byte of the id
// escaped in the worst case.
func releaseItemSize(id string) int { return 2*len(id) + 40 }

// advance stores rest as what is left of the queue of keys[0], the key a
// batch was just taken from, and returns the keys: that key goes to the
// back (a busy (namespace, session) does not starve the others), or away
// when its queue is empty.
func advance[T any](queues map[releaseKey][]T, keys []releaseKey, rest []T) []releaseKey {
	k := keys[0]
	if len(rest) == 0 {
		delete(queues, k)
		return keys[1:]
	}
	queues[k] = rest
	return append(keys[1:], k)
}

// post makes one POST /registry/releases for batch and answers each of its
// attempts.
func (b *releaseBatcher) post(k releaseKey, batch []*pendingRelease) {
	// An attempt whose deadline passed while it queued fails alone: its
	// deadline must not cut the call short for the others.
	now := time.Now()
	live := batch[:0]
	for _, it := range batch {
		if !it.deadline.IsZero() && !now.Before(it.deadline) {
			it.done <- reply{err: fmt.Errorf("release not sent: its deadline passed while it waited for a batch: %w", context.DeadlineExceeded)}
			continue
		}
		live = append(live, it)
	}
	if batch = live; len(batch) == 0 {
		return
	}
	body := wire.ReleasesRequest{ClientID: b.clientID, Namespace: k.ns, SessionID: k.sid, Releases: make([]wire.ReleasedItem, len(batch))}
	deadline := batch[0].deadline
	for i, it := range batch {
		body.Releases[i] = wire.ReleasedItem{ID: it.req.ID, Epoch: it.req.Epoch}
		if deadline.IsZero() || !it.deadline.IsZero() && it.deadline.Before(deadline) {
			deadline = it.deadline
		}
	}
	rep := b.p.post(wire.PathReleases, body, deadline)
	if rep.err == nil && (rep.status == fasthttp.StatusNotFound || rep.status == fasthttp.StatusMethodNotAllowed) {
		b.fallback.Store(true)
		rep = reply{err: errBatchUnsupported}
	}
	if rep.err != nil || rep.status != fasthttp.StatusOK {
		for _, it := range batch {
			it.done <- rep
		}
		return
	}
	var out wire.ReleasesResponse
	if err := json.Unmarshal(rep.body, &out); err != nil || len(out.Results) != len(batch) {
		bad := reply{err: fmt.Errorf("malformed %s answer: %d results for %d releases (%v)", wire.PathReleases, len(out.Results), len(batch), err)}
		for _, it := range batch {
			it.done <- bad
		}
		return
	}
	for i, it := range batch {
		it.done <- resultReply(out.Results[i])
	}
}

// resultReply is the reply a release alone would have had for res.
func resultReply(res wire.ReleaseResult) reply {
	if res.Status == 0 {
		b, _ := json.Marshal(wire.ReleaseResponse{Released: res.Released})
		return reply{status: fasthttp.StatusOK, body: b}
	}
	b, _ := json.Marshal(wire.Error{Error: res.Error, Field: res.Field})
	return reply{status: res.Status, body: b}
}
