package placement

import (
	"context"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/proxy"
)

// Refresh ahead of expiry.
//
// A cached placement expires CacheTTL after the store last confirmed it
// (less a random fifth). Without refreshing, the first request after that
// waits for a store read: on Redis one round trip, once per CacheTTL for
// every hot name (0.27 % of the requests of the bench's redis suite, 1000
// ids at ~34 000 req/s; none with refreshing). With RefreshAhead, a Lookup that finds its
// entry within RefreshAhead of its expiry queues the name (once per entry:
// placecache.GetAhead), and Run's refreshers re-read it while the entry is
// still served:
//
//   - The read goes to the store's server, not to a cache below (the
//     client-side cache would answer with the value it holds and the same
//     expiry): LookupUntil when its answer comes with an expiry later than
//     RefreshAhead from now (the client-side cache had no entry, so the
//     server answered and tracks the key again), else LookupFresh (the
//     client-side cache holds the key, so the server tracks it, and a
//     change still reaches OnInvalidate).
//   - The entry is extended only when the store names the same session
//     and epoch and that session is still live; otherwise it is dropped and
//     the next request takes the ordinary miss path (which claims, replaces
//     or waits as a miss does). A refresh never places an instance.
//   - The cache token is taken before any read, as for a miss: an
//     invalidation processed after it refuses the refresh's Put.
//
// So an entry is still never served longer than CacheTTL after the store's
// server last confirmed it, and an invalidation still wins.

// queueRefresh hands name to Run's refreshers without blocking; a full
// queue drops it (the entry then expires as without refreshing).
func (r *Resolver) queueRefresh(name []byte) {
	select {
	case r.refreshQ <- string(name):
	default:
		r.m.refreshDropped.Inc()
	}
}

// refresher takes names from the queue and refreshes them until ctx or the
// resolver ends; Run runs Config.Refreshers of them.
func (r *Resolver) refresher(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.ctx.Done():
			return
		case key := <-r.refreshQ:
			r.refresh(ctx, key)
		}
	}
}

// refresh re-reads the placement of key and extends its cached route, or
// drops the route when the store disagrees with it.
func (r *Resolver) refresh(ctx context.Context, key string) {
	ns, id, ok := wire.SplitPlacementName(key)
	if !ok {
		return
	}
	name := []byte(key)
	tok := r.cache.Begin(name)
	cur, ok := r.cache.Peek(name, r.clock.Now())
	if !ok || cur.Session == nil {
		return // expired or invalidated since: the next request misses
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ResolveTimeout)
	defer cancel()
	live, _, err := r.namespaceSessions(ctx, ns, false)
	var (
		pl    store.Placement
		until time.Time
		sess  *proxy.Session
		gone  = true // unless the holder is read below
	)
	if err == nil {
		pl, until, err = r.refreshRead(ctx, ns, id)
	}
	if err == nil && pl.Session == cur.Session.ID && pl.Epoch == cur.Epoch {
		sess, gone, err = r.holderSession(ctx, key, pl.Session, live, false)
	}
	switch {
	case err != nil:
		// Undecided: the entry runs out as it would have; its next
		// request's miss reports the failure if it persists.
		r.m.refreshFailed.Inc()
		r.warnStore(err, "cannot refresh a cached placement", "name", key, "err", err)
	case !gone && sess == cur.Session:
		if r.cache.PutUntil(name, cur, tok, until) {
			r.m.refreshExtended.Inc()
		} else {
			r.m.refreshRefused.Inc()
		}
	default: // another holder or epoch, or the holder is gone
		r.m.refreshChanged.Inc()
		r.cache.InvalidateIf(name, func(v proxy.Route) bool { return v == cur })
	}
}

// refreshRead reads the placement of (ns, id) from the store's server and
// returns until when it may be cached (zero: CacheTTL from now).
func (r *Resolver) refreshRead(ctx context.Context, ns, id string) (store.Placement, time.Time, error) {
	pl, until, err := r.readPlacement(ctx, ns, id, false)
	if err != nil || until.IsZero() || until.Sub(r.clock.Now().Wall()) > r.cfg.RefreshAhead {
		return pl, until, err
	}
	fl, ok := r.st.(store.FreshLookups)
	if !ok {
		return pl, until, nil
	}
	pl, err = fl.LookupFresh(ctx, ns, id)
	return pl, r.freshUntil(), err
}
