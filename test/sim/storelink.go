package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// errSilent is what a call into a stalled link returns: the real client
// waits for its timeout, then fails the same way.
var errSilent = fmt.Errorf("%w: the link to Redis is silent", store.ErrUnavailable)

// errFenced is the restart fence's refusal.
var errFenced = fmt.Errorf("%w: redis restarted less than a lease ago", store.ErrUnavailable)

// storeLink is one pinboard's connection to Redis, as the placement
// resolver and the registry see it: the world's store (memstore: the same
// semantics as the Redis scripts, checked by one conformance suite) behind
// a link that can stall, a client-side cache like rueidis's (reads served
// from it need no network, and a stalled link leaves it stale), the
// invalidations Redis pushes on the same connection (delayed, held while
// the link stalls, and replaced by a flush when the client gives the
// connection up), and the restart fence of the Redis scripts.
type storeLink struct {
	store.Store // the world's store: swapped in place when it restarts
	w           *world
	p           *pinboard

	stalledSince time.Duration // -1: flowing
	stalledUntil time.Duration
	dropped      bool // the client gave the stalled connection up (connTimeout): its cache was flushed
	held         []store.Invalidation
	deferred     []func() // writes sent into the stall, applied when it resumes
	slowUntil    time.Duration
	slowBy       time.Duration

	// The client-side cache: placements and the namespace's sessions.
	placements map[string]cachedPlacement
	sessions   *cachedSessions
}

type cachedPlacement struct {
	p     store.Placement
	until time.Time
}

type cachedSessions struct {
	s     []store.Session
	until time.Time
}

var _ store.CachedLookups = (*storeLink)(nil)

func newStoreLink(w *world, p *pinboard) *storeLink {
	return &storeLink{Store: w.st, w: w, p: p, stalledSince: -1, placements: map[string]cachedPlacement{}}
}

func (l *storeLink) stalled() bool { return l.stalledSince >= 0 }

// stall stops every byte on the link for d (extending a stall in progress).
func (l *storeLink) stall(d time.Duration) {
	w := l.w
	until := w.now + d
	if !l.stalled() {
		l.stalledSince, l.dropped = w.now, false
		w.after(connTimeout, nil, "connection timeout", func() {
			if l.stalled() && !l.dropped && w.now-l.stalledSince >= connTimeout {
				// rueidis's PINGs went unanswered: it closes the
				// connection and flushes its cache.
				l.dropped = true
				l.held = nil
				l.flush()
				w.logf("%s gives its silent Redis connection up: cache flushed", l.p.name)
			}
		})
	}
	if until > l.stalledUntil {
		l.stalledUntil = until
		w.at(until, nil, "link resumes", func() {
			if l.stalled() && w.now >= l.stalledUntil {
				l.resume()
			}
		})
	}
	w.logf("%s's Redis link stalls until %.3fs", l.p.name, until.Seconds())
}

// resume lets bytes pass again: held invalidations arrive in order, then the
// deferred writes take effect.
func (l *storeLink) resume() {
	if !l.stalled() {
		return
	}
	w := l.w
	l.stalledSince = -1
	l.stalledUntil = 0
	held, deferred := l.held, l.deferred
	l.held, l.deferred = nil, nil
	w.logf("%s's Redis link resumes (%d invalidations held, %d writes deferred)", l.p.name, len(held), len(deferred))
	for _, inv := range held {
		l.deliver(inv)
	}
	for _, f := range deferred {
		f()
	}
}

func (l *storeLink) slowFor(d, by time.Duration) {
	l.slowUntil, l.slowBy = l.w.now+d, by
	l.w.logf("%s's invalidations are late by up to %v until %.3fs", l.p.name, by, l.slowUntil.Seconds())
}

// invalidation is a push Redis sends this connection.
func (l *storeLink) invalidation(inv store.Invalidation) {
	if l.stalled() {
		if !l.dropped {
			l.held = append(l.held, inv)
		}
		return
	}
	l.deliver(inv)
}

func (l *storeLink) deliver(inv store.Invalidation) {
	w := l.w
	d := w.delay()
	if w.now < l.slowUntil {
		d += time.Duration(w.rng.Int64N(int64(l.slowBy) + 1))
	}
	inc := l.p.inc
	w.after(d, nil, "invalidation", func() {
		if l.p.inc != inc || !l.p.up {
			return
		}
		l.applyInvalidation(inv)
		l.p.res.OnInvalidate(inv)
	})
}

func (l *storeLink) applyInvalidation(inv store.Invalidation) {
	switch {
	case inv.All:
		l.flush()
	case inv.Placement != "":
		delete(l.placements, inv.Placement)
	case inv.Session != "":
		l.sessions = nil
	}
}

func (l *storeLink) flush() {
	clear(l.placements)
	l.sessions = nil
}

// connectionLost: Redis went away (a restart): the client flushes its cache
// and tells the resolver, after the connection's loss reaches it.
func (l *storeLink) connectionLost() {
	l.Store = l.w.st
	l.held = nil
	l.deferred = nil
	l.deliver(store.Invalidation{All: true})
}

// write runs a write through the link: refused at once while it stalls
// (the caller times out), in which case it may still take effect when the
// link resumes (when the swarm allows deferred writes).
func (l *storeLink) write(what string, f func()) error {
	if l.stalled() {
		if l.w.swarm.faults[faultDeferredWrite] && l.w.chance(0.5) {
			l.deferred = append(l.deferred, func() {
				l.w.logf("%s: deferred %s takes effect", l.p.name, what)
				f()
			})
		}
		return errSilent
	}
	f()
	return nil
}

func (l *storeLink) fenced() bool {
	return l.w.restartedAt >= 0 && l.w.now-l.w.restartedAt < restartFence
}

func (l *storeLink) cacheUntil() time.Time { return l.w.clk.Now().Wall().Add(lease) }

// LookupUntil implements store.CachedLookups: from the client-side cache
// when it holds the placement (no network), else from the server.
func (l *storeLink) LookupUntil(ctx context.Context, ns, id string) (store.Placement, time.Time, error) {
	name := wire.PlacementName(ns, id)
	if c, ok := l.placements[name]; ok && l.w.clk.Now().Wall().Before(c.until) {
		return c.p, c.until, nil
	}
	if l.stalled() {
		return store.Placement{}, time.Time{}, errSilent
	}
	p, err := l.Store.Lookup(ctx, ns, id)
	if err != nil {
		return p, time.Time{}, err
	}
	until := l.cacheUntil()
	l.placements[name] = cachedPlacement{p: p, until: until}
	return p, until, nil
}

// Lookup implements store.Store through the client-side cache.
func (l *storeLink) Lookup(ctx context.Context, ns, id string) (store.Placement, error) {
	p, _, err := l.LookupUntil(ctx, ns, id)
	return p, err
}

// NamespaceSessions implements store.Store through the client-side cache,
// in session id order (the store's own order is a map's).
func (l *storeLink) NamespaceSessions(ctx context.Context, ns string) ([]store.Session, error) {
	if c := l.sessions; c != nil && l.w.clk.Now().Wall().Before(c.until) {
		return slices.Clone(c.s), nil
	}
	if l.stalled() {
		return nil, errSilent
	}
	s, err := l.Store.NamespaceSessions(ctx, ns)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(s, func(a, b store.Session) int { return strings.Compare(a.ID, b.ID) })
	l.sessions = &cachedSessions{s: s, until: l.cacheUntil()}
	return slices.Clone(s), nil
}

// NamespaceKnown implements store.Store (read from the server).
func (l *storeLink) NamespaceKnown(ctx context.Context, ns string) (bool, error) {
	if l.stalled() {
		return false, errSilent
	}
	return l.Store.NamespaceKnown(ctx, ns)
}

// Session implements store.Store (read from the server).
func (l *storeLink) Session(ctx context.Context, id string) (store.Session, error) {
	if l.stalled() {
		return store.Session{}, errSilent
	}
	return l.Store.Session(ctx, id)
}

// LookupOrClaim implements store.Store: one script on the server; the claim
// is refused by the restart fence.
func (l *storeLink) LookupOrClaim(ctx context.Context, ns, id, sid string) (p store.Placement, claimed bool, err error) {
	var ferr error
	werr := l.write("claim of "+wire.PlacementName(ns, id), func() {
		cur, e := l.Store.Lookup(ctx, ns, id)
		switch {
		case e != nil:
			ferr = e
		case cur.Session == "" && l.fenced():
			ferr = errFenced
		default:
			p, claimed, ferr = l.Store.LookupOrClaim(ctx, ns, id, sid)
		}
	})
	return p, claimed, errors.Join(werr, ferr)
}

// ReplacePlacement implements store.Store, behind the restart fence.
func (l *storeLink) ReplacePlacement(ctx context.Context, ns, id, old, sid string) (p store.Placement, err error) {
	var ferr error
	werr := l.write("replace of "+wire.PlacementName(ns, id), func() {
		if l.fenced() {
			ferr = errFenced
			return
		}
		p, ferr = l.Store.ReplacePlacement(ctx, ns, id, old, sid)
	})
	return p, errors.Join(werr, ferr)
}

// RenewPlacement implements store.Store.
func (l *storeLink) RenewPlacement(ctx context.Context, ns, id, sid string, epoch uint64) (p store.Placement, err error) {
	var ferr error
	werr := l.write("renewal of "+wire.PlacementName(ns, id), func() {
		p, ferr = l.Store.RenewPlacement(ctx, ns, id, sid, epoch)
	})
	return p, errors.Join(werr, ferr)
}
