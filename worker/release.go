package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// ErrReleaseRefused is returned (wrapped) by Release when the pinboard
// refused the call in a way a retry cannot fix (a 4xx other than 408/429):
// 401 means Config.Token is wrong (the error says where to set it: TokenSource); 400 means a malformed namespace or id.
var ErrReleaseRefused = errors.New("the pinboard refused the release")

// Release implements host.Worker: POST /registry/release {clientId,
// namespace, id, sessionId, epoch} (or, for releases that wait at the same
// time, one POST /registry/releases for up to Config.ReleaseBatch of them:
// see releaseBatcher), telling the pinboard that the instance
// activated under epoch closed so the id can be placed again; the pinboard
// deletes the placement only while it still has that epoch (0: any), so a
// late release never deletes a newer placement of the id on the same
// session. sessionId is the session ctx carries (the host
// passes the values of the lease the instance was activated under; see
// SessionOf), else the current session, else, while the worker holds none
// (its lease was just lost), the last one it held: the
// pinboard frees the placement only when that session still holds it, so a
// release that arrives late, after the id was placed on a newer session,
// never deletes the newer placement. It makes at most
// Config.ReleaseAttempts calls, each bounded by Config.RequestTimeout and by
// a Shutdown's deadline, waiting Config.ReleaseBackoff (doubled each time)
// between them, and stops early when ctx ends, when a Shutdown's context
// ended (the call in flight was failed) or once its deadline has passed.
// It returns nil once the pinboard answered 200 (whether or not a placement
// was freed: the pinboard frees it only when it belongs to this client's
// current session).
// Transport errors, 5xx, 408 and 429 are retried; other answers are not.
// A give-up is logged once for every release that overlapped it (giveUpLog).
// While a Shutdown runs, Release queues the release and returns nil at once
// (QueueRelease: sent in the background, or freed by the deregistration
// that ends the Shutdown). Release is safe for concurrent use and works with
// or without Run.
func (w *Worker) Release(ctx context.Context, namespace, id string, epoch uint64) (err error) {
	w.giveUps.begin()
	var gaveUp string // the reason, when this call gives up
	made := 0         // calls made
	defer func() { w.giveUps.end(w.clock.Now(), namespace, id, gaveUp, w.log, made) }()
	sid, ok := SessionOf(ctx)
	if !ok {
		sid = w.releaseSession()
	}
	body := wire.ReleaseRequest{ClientID: w.clientID, Namespace: namespace, ID: id, SessionID: sid, Epoch: epoch}
	if w.queueRelease(body) {
		return nil
	}
	wait := w.cfg.ReleaseBackoff
	var last reply
	aborted := w.pinboard.aborted() // Shutdown's context ended: no more attempts
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("cannot release %s: %w", wire.PlacementName(namespace, id), context.Cause(ctx))
		}
		var deadline time.Time
		if d, ok := ctx.Deadline(); ok {
			deadline = d
		}
		last = w.releases.release(ctx, body, w.callDeadline(deadline))
		if errors.Is(last.err, errBatchUnsupported) {
			last = w.pinboard.post(wire.PathRelease, body, w.callDeadline(deadline))
		}
		made++
		if err := ctx.Err(); err != nil && last.err != nil {
			return fmt.Errorf("cannot release %s: %w", wire.PlacementName(namespace, id), context.Cause(ctx))
		}
		switch {
		case last.err == nil && last.status == fasthttp.StatusOK:
			w.m.releases[resultOK].Inc()
			return nil
		case last.err == nil && last.status == fasthttp.StatusUnauthorized:
			w.m.releases[resultUnauthorized].Inc()
			w.log.Error("release failed: "+w.cfg.tokenRefused(), "namespace", namespace, "instance", id)
			return fmt.Errorf("cannot release %s: %w: %s", wire.PlacementName(namespace, id), ErrReleaseRefused, last.describe())
		case last.err == nil && last.status < 500 && last.status != fasthttp.StatusRequestTimeout && last.status != fasthttp.StatusTooManyRequests:
			w.m.releases[resultFailed].Inc()
			w.log.Warn("release refused", "namespace", namespace, "instance", id, "reason", last.describe())
			return fmt.Errorf("cannot release %s: %w: %s", wire.PlacementName(namespace, id), ErrReleaseRefused, last.describe())
		}
		w.m.releases[resultFailed].Inc()
		if attempt >= w.cfg.ReleaseAttempts || isClosed(aborted) || w.shutdownPassed() {
			break
		}
		t := w.clock.NewTimer(wait)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
		case <-aborted:
			t.Stop()
		}
		if isClosed(aborted) {
			break
		}
		wait *= 2
	}
	w.m.releases[resultGaveUp].Inc()
	gaveUp = last.describe() // logged by giveUps, one line for every overlapping give-up
	return fmt.Errorf("cannot release %s after %d attempts: %s", wire.PlacementName(namespace, id), made, last.describe())
}

// QueueRelease implements host.ReleaseQueuer: while a Shutdown runs, it
// queues the release of (namespace, id) at epoch, naming the session whose
// values lease carries (else the current or last one), and reports true;
// otherwise it does nothing and reports false (the host calls Release).
func (w *Worker) QueueRelease(lease context.Context, namespace, id string, epoch uint64) bool {
	sid, ok := "", false
	if lease != nil {
		sid, ok = SessionOf(lease)
	}
	if !ok {
		sid = w.releaseSession()
	}
	return w.queueRelease(wire.ReleaseRequest{ClientID: w.clientID, Namespace: namespace, ID: id, SessionID: sid, Epoch: epoch})
}

// queueRelease queues req while a Shutdown runs: sent in the background, or
// freed with the session's deregistration (laterReleases).
func (w *Worker) queueRelease(req wire.ReleaseRequest) bool {
	if !w.later.queue(req) {
		return false
	}
	w.m.releases[resultDeferred].Inc()
	return true
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// giveUpMaxDelay bounds how long a give-up waits for overlapping releases
// to end before it is logged.
const giveUpMaxDelay = 10 * time.Second

// giveUpLog aggregates the "release gave up" warnings. When a pinboard
// stops, every instance closing meanwhile gives up its release at about the
// same time: one line per instance would flood the log (thousands). So a
// give-up is logged only when no other release is in flight (or when the
// oldest unlogged one is giveUpMaxDelay old), as one WARN with the count
// and the first instance: a burst of overlapping releases that all give up
// is one line. It is safe for concurrent use and starts no goroutine.
type giveUpLog struct {
	mu       sync.Mutex
	inflight int // Release calls running
	n        int // give-ups not logged yet
	ns, id   string
	reason   string
	since    clock.Instant // when the first of them gave up
}

// begin counts a Release call in.
func (g *giveUpLog) begin() {
	g.mu.Lock()
	g.inflight++
	g.mu.Unlock()
}

// end counts a Release call out; reason is non-empty when it gave up. It
// writes the aggregated warning when it is due.
func (g *giveUpLog) end(now clock.Instant, ns, id, reason string, log *slog.Logger, attempts int) {
	g.mu.Lock()
	g.inflight--
	if reason != "" {
		if g.n == 0 {
			g.ns, g.id, g.reason, g.since = ns, id, reason, now
		}
		g.n++
	}
	if g.n == 0 || g.inflight > 0 && now.Sub(g.since) < giveUpMaxDelay {
		g.mu.Unlock()
		return
	}
	n, fns, fid, freason := g.n, g.ns, g.id, g.reason
	g.n = 0
	g.mu.Unlock()
	log.Warn("release gave up; the placement is freed when the session expires",
		"instances", n, "namespace", fns, "instance", fid, "attempts", attempts, "reason", freason)
}

// releaseSession is the session a release names: the current one, else the
// last one registered ("" before the first registration).
func (w *Worker) releaseSession() string {
	if s := w.Session(); s != "" {
		return s
	}
	if p := w.lastSess.Load(); p != nil {
		return *p
	}
	return ""
}

// deregister ends the last session at the pinboard (POST
// /registry/deregister), once: the last step of Shutdown, after every
// instance has closed and released its placement, so the ids it may still
// hold become placeable at once instead of a lease later. It then ends the
// sessions a later registration replaced, which may still hold placements
// until their leases run out at the pinboard: a worker that lost its lease
// during the Shutdown (its instances aborted, the rest drained under a new
// session) frees the old session's ids too. Shutdown calls it only once
// every host is empty, so no instance of any of its sessions runs. One
// attempt per session, bounded by RequestTimeout and by Shutdown's
// deadline (callDeadline); a failure only costs that wait (the session
// expires with its lease). It reports whether the last session ended.
func (w *Worker) deregister() bool {
	p := w.lastSess.Load()
	if p == nil || !w.deregOnce.CompareAndSwap(false, true) {
		return false
	}
	ok := w.deregisterSession(*p, "deregistered: the pinboard may place this worker's ids elsewhere now")
	for _, id := range w.ended.take() {
		w.deregisterSession(id, "deregistered a session this worker held before: the pinboard may place its ids elsewhere now")
	}
	return ok
}

// deregisterSession makes one deregistration call for session id and
// reports whether it succeeded; msg is logged when it did.
func (w *Worker) deregisterSession(id, msg string) bool {
	rep := w.pinboard.post(wire.PathDeregister, wire.DeregisterRequest{SessionID: id}, w.callDeadline(time.Time{}))
	log := w.log.With("session", id)
	switch {
	case rep.err == nil && rep.status == fasthttp.StatusOK:
		w.m.deregisters[resultOK].Inc()
		var out wire.DeregisterResponse
		if json.Unmarshal(rep.body, &out) == nil && !out.Deregistered {
			log.Debug("deregister: the session had already ended at the pinboard")
			return true
		}
		log.Info(msg)
		return true
	case rep.err == nil && rep.status == fasthttp.StatusUnauthorized:
		w.m.deregisters[resultUnauthorized].Inc()
		log.Error("deregister failed: the pinboard refused the deployment token (401); the session ends with its lease")
	default:
		w.m.deregisters[resultFailed].Inc()
		log.Warn("deregister failed; the session ends with its lease", "reason", rep.describe())
	}
	return false
}

// maxEndedSessions bounds the replaced sessions a worker remembers for its
// deregistration: the newest ones; an older one's lease has long run out.
const maxEndedSessions = 4

// endedSessions are the ids of sessions a later registration replaced,
// oldest first, at most maxEndedSessions.
type endedSessions struct {
	mu  sync.Mutex
	ids []string
}

func (e *endedSessions) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.ids) == maxEndedSessions {
		e.ids = append(e.ids[:0], e.ids[1:]...)
	}
	e.ids = append(e.ids, id)
}

// take returns the remembered ids and forgets them.
func (e *endedSessions) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := e.ids
	e.ids = nil
	return ids
}
