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

// Handing names over.
//
// A refresh is due on the request path (Lookup, on a proxy event loop), and
// waking a goroutine from there costs that loop: the woken goroutine takes
// the loop's processor next, and the store round trip it starts wakes
// rueidis's goroutines and Redis on the same cores. So a due name only goes
// into a list (a mutex held for an append), and only the first name of a
// batch wakes the batcher, which waits Config.RefreshBatch, takes the whole
// list and feeds it to the refreshers: one wake-up from the request path
// per batch rather than one per refresh (at 1 000 hot ids with a 10 s cache,
// ten a second rather than a hundred). A batch's wait is part of the
// refresh's time, well inside RefreshAhead (RefreshBatch is at most a
// quarter of it).

// queueRefresh adds name to the next batch without blocking; beyond
// MaxRefreshes waiting names it is dropped (the entry then expires as
// without refreshing).
func (r *Resolver) queueRefresh(name []byte) {
	r.refreshMu.Lock()
	if len(r.refreshPending) >= r.cfg.MaxRefreshes {
		r.refreshMu.Unlock()
		r.m.refreshDropped.Inc()
		return
	}
	r.refreshPending = append(r.refreshPending, string(name))
	first := len(r.refreshPending) == 1
	r.refreshMu.Unlock()
	if first {
		select {
		case r.refreshKick <- struct{}{}:
		default:
		}
	}
}

// refreshBatcher waits for a batch's first name, lets the batch gather for
// RefreshBatch, and hands its names to the refreshers, until ctx or the
// resolver ends; Run runs one.
func (r *Resolver) refreshBatcher(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(r.ctx, cancel) // the resolver's end ends it too
	defer stop()
	gather := time.NewTimer(time.Hour)
	gather.Stop()
	defer gather.Stop()
	var batch []string
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.refreshKick:
		}
		gather.Reset(r.cfg.RefreshBatch)
		select {
		case <-ctx.Done():
			return
		case <-gather.C:
		}
		r.refreshMu.Lock()
		batch, r.refreshPending = r.refreshPending, batch[:0]
		r.refreshMu.Unlock()
		r.m.refreshBatches.Inc()
		for i, key := range batch {
			select {
			case <-ctx.Done():
				return
			case r.refreshQ <- key:
			}
			batch[i] = ""
		}
	}
}

// refresher takes names from the batcher and refreshes them until ctx or
// the resolver ends; Run runs Config.Refreshers of them.
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
