package worker

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
)

var _ host.ReleaseQueuer = (*Worker)(nil)

// laterReleases holds the releases of instances that close while a
// Shutdown runs. Such a release does not keep its instance's close waiting:
// Release queues it and returns, and senders that Shutdown starts (and
// stops before it returns) send the queue in batches of POST
// /registry/releases. Shutdown ends the session with one deregistration once
// every instance has closed, which frees every placement the session still
// holds at once; what is still queued then is dropped. So a worker that
// stops with a million idle instances tears them down at its own pace and
// frees all their ids with one call, instead of waiting for a million
// releases (docs/worker.md, "Shutdown").
//
// Safety does not depend on when, or whether, a queued release is sent: it
// is sent only after its instance's teardown, and the pinboard frees a
// placement only while it still names the release's session and epoch.
type laterReleases struct {
	mu     sync.Mutex
	active int  // Shutdown calls whose senders run; releases queue only while > 0
	quit   bool // the Shutdown's context ended: the queue is dropped, not sent
	queues map[releaseKey][]wire.ReleasedItem
	keys   []releaseKey // the keys with a non-empty queue, oldest first
	n      int          // releases queued
	wake   chan struct{}
}

// queue adds a release to the queue when a Shutdown's senders run, and
// reports whether it did.
func (l *laterReleases) queue(req wire.ReleaseRequest) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active == 0 {
		return false
	}
	k := releaseKey{req.Namespace, req.SessionID}
	if len(l.queues[k]) == 0 {
		l.keys = append(l.keys, k)
	}
	l.queues[k] = append(l.queues[k], wire.ReleasedItem{ID: req.ID, Epoch: req.Epoch})
	l.n++
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true
}

// take removes up to max releases of the oldest key (within the body
// budget) from the queue.
func (l *laterReleases) take(max int) ([]wire.ReleasedItem, releaseKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.keys) == 0 {
		return nil, releaseKey{}
	}
	k := l.keys[0]
	q := l.queues[k]
	i, size := 0, 0
	for ; i < len(q) && i < max; i++ {
		n := releaseItemSize(q[i].ID)
		if i > 0 && size+n > releaseBodyBudget {
			break
		}
		size += n
	}
	batch := q[:i:i]
	l.keys = advance(l.queues, l.keys, q[i:])
	l.n -= len(batch)
	if l.n > 0 {
		// More is queued: wake another sender, so that up to
		// releaseSenders calls are in flight (queue signals only once
		// while the wake-up is pending).
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return batch, k
}

// drop forgets every queued release (a deregistration freed their
// placements, or the Shutdown gave them up) and returns how many there
// were.
func (l *laterReleases) drop() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.n
	l.queues, l.keys, l.n = map[releaseKey][]wire.ReleasedItem{}, nil, 0
	return n
}

// laterSenders are the senders of the later queue that one Shutdown runs.
type laterSenders struct {
	w    *Worker
	stop chan struct{}
	wg   sync.WaitGroup
}

// startLaterReleases starts releaseSenders senders of the later queue for a
// Shutdown. From now until finish, Release queues instead of sending.
func (w *Worker) startLaterReleases() *laterSenders {
	l := &w.later
	l.mu.Lock()
	if l.queues == nil {
		l.queues = map[releaseKey][]wire.ReleasedItem{}
		l.wake = make(chan struct{}, 1)
	}
	l.active++
	l.quit = false
	l.mu.Unlock()
	s := &laterSenders{w: w, stop: make(chan struct{})}
	for range releaseSenders {
		s.wg.Go(s.run)
	}
	return s
}

// giveUp drops what is queued, and what is queued from now on, counted as
// given up: the Shutdown's context ended, and the session ends with its
// lease.
func (s *laterSenders) giveUp() {
	l := &s.w.later
	l.mu.Lock()
	l.quit = true
	l.mu.Unlock()
	if n := l.drop(); n > 0 {
		s.w.m.releases[resultGaveUp].Add(n)
	}
}

// finish stops the senders: they send what is still queued (nothing after
// giveUp, or after a deregistration dropped it) and return; finish returns
// once they have. From now on Release sends again (unless another Shutdown
// runs).
func (s *laterSenders) finish() {
	l := &s.w.later
	l.mu.Lock()
	l.active--
	l.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
}

// run sends batches from the later queue until stop is closed and the queue
// is empty. Each call is bounded by the Shutdown's deadline
// (callDeadline); once it has passed, the rest is given up.
func (s *laterSenders) run() {
	w, l := s.w, &s.w.later
	for {
		if w.shutdownPassed() || l.quitting() {
			if n := l.drop(); n > 0 {
				w.m.releases[resultGaveUp].Add(n)
			}
		}
		if w.heartbeatLate() {
			// The lease comes first: a sender pauses while the last
			// heartbeat is unanswered, so that its batches do not hold up
			// the pinboard and Redis the heartbeat needs. (Past stop, it
			// sends: the Shutdown is ending either way.)
			w.m.laterPauses.Inc()
			if !clock.Sleep(w.clock, w.cfg.RetryInterval, true, nil, s.stop) {
				continue
			}
		}
		batch, k := l.take(max(1, w.cfg.ReleaseBatch))
		if len(batch) == 0 {
			select {
			case <-l.wake:
				continue
			case <-s.stop:
				if l.lenQueued() == 0 {
					return
				}
				continue
			}
		}
		w.postLater(k, batch)
	}
}

// heartbeatLate reports whether no heartbeat was acknowledged for longer
// than the heartbeat interval and one retry: the loop is retrying, and the
// lease nears its local deadline.
func (w *Worker) heartbeatLate() bool {
	l := w.current.Load()
	return l != nil && w.clock.Now().Sub(l.Sent) > w.cfg.HeartbeatInterval+w.cfg.RetryInterval
}

func (l *laterReleases) quitting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quit
}

func (l *laterReleases) lenQueued() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// postLater sends one batch of later releases and counts each outcome in
// pinned_releases_total (no retry: the deregistration, or else the lease,
// frees what a failed call did not).
func (w *Worker) postLater(k releaseKey, batch []wire.ReleasedItem) {
	deadline := w.callDeadline(time.Time{})
	if w.cfg.ReleaseBatch <= 1 || w.releases.fallback.Load() {
		for _, it := range batch {
			rep := w.pinboard.post(wire.PathRelease, wire.ReleaseRequest{ClientID: w.clientID, Namespace: k.ns, ID: it.ID, SessionID: k.sid, Epoch: it.Epoch}, deadline)
			w.countLater(rep, 1)
		}
		return
	}
	rep := w.pinboard.post(wire.PathReleases, wire.ReleasesRequest{ClientID: w.clientID, Namespace: k.ns, SessionID: k.sid, Releases: batch}, deadline)
	if rep.err == nil && (rep.status == fasthttp.StatusNotFound || rep.status == fasthttp.StatusMethodNotAllowed) {
		w.releases.fallback.Store(true)
		w.postLater(k, batch)
		return
	}
	if rep.err != nil || rep.status != fasthttp.StatusOK {
		w.countLater(rep, len(batch))
		return
	}
	var out wire.ReleasesResponse
	if err := json.Unmarshal(rep.body, &out); err != nil || len(out.Results) != len(batch) {
		w.m.releases[resultFailed].Add(len(batch))
		return
	}
	for _, res := range out.Results {
		w.countLater(resultReply(res), 1)
	}
}

// countLater counts n releases that got rep.
func (w *Worker) countLater(rep reply, n int) {
	switch {
	case rep.err == nil && rep.status == fasthttp.StatusOK:
		w.m.releases[resultOK].Add(n)
	case rep.err == nil && rep.status == fasthttp.StatusUnauthorized:
		w.m.releases[resultUnauthorized].Add(n)
	default:
		w.m.releases[resultFailed].Add(n)
	}
}
