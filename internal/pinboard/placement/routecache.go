package placement

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/placecache"
	"github.com/pinned-go/pinned/proxy"
)

// routeCache is the placement cache as the resolver uses it: routes in,
// routes out, but held without pointers. A cached route names its session
// by a handle (below), so the cache's values hold no pointer and
// placecache keeps its tables outside the Go heap: at a million cached
// ids the tables are about 60 MB that the collector neither scans nor
// doubles (GOGC) before a cycle.
//
// Invariants: a handle is never reused for another session (a slot's
// generation changes whenever its session does), so an entry outliving its
// session reads as a miss, never as another session's route; a route whose
// session has no handle (dropped meanwhile) is not cached.
type routeCache struct {
	c *placecache.Cache[cachedRoute]
	h *handles
}

// cachedRoute is a proxy.Route as the cache holds it.
type cachedRoute struct {
	session handle
	epoch   uint64
}

func (rc routeCache) route(v cachedRoute) (proxy.Route, bool) {
	s := rc.h.session(v.session)
	return proxy.Route{Session: s, Epoch: v.epoch}, s != nil
}

// GetAhead is placecache's GetAhead for routes; an entry whose session was
// dropped is a miss (and no refresh).
func (rc routeCache) GetAhead(name []byte, now clock.Instant) (proxy.Route, bool, bool) {
	v, ok, refresh := rc.c.GetAhead(name, now)
	if !ok {
		return proxy.Route{}, false, false
	}
	rt, ok := rc.route(v)
	return rt, ok, ok && refresh
}

// Peek is placecache's Peek for routes.
func (rc routeCache) Peek(name []byte, now clock.Instant) (proxy.Route, bool) {
	v, ok := rc.c.Peek(name, now)
	if !ok {
		return proxy.Route{}, false
	}
	return rc.route(v)
}

// PutUntil is placecache's PutUntil for routes; a route whose session has
// no handle is not cached (false).
func (rc routeCache) PutUntil(name []byte, rt proxy.Route, t placecache.Token, until time.Time) bool {
	h, ok := rc.h.of(rt.Session)
	if !ok {
		return false
	}
	return rc.c.PutUntil(name, cachedRoute{session: h, epoch: rt.Epoch}, t, until)
}

// InvalidateIf is placecache's InvalidateIf for routes (an entry whose
// session was dropped is matched as a route without a session).
func (rc routeCache) InvalidateIf(name []byte, match func(proxy.Route) bool) {
	rc.c.InvalidateIf(name, func(v cachedRoute) bool {
		rt, _ := rc.route(v)
		return match(rt)
	})
}

// Begin is placecache's Begin.
func (rc routeCache) Begin(name []byte) placecache.Token { return rc.c.Begin(name) }

// Invalidate is placecache's Invalidate.
func (rc routeCache) Invalidate(name string) { rc.c.Invalidate(name) }

// InvalidateAll is placecache's InvalidateAll.
func (rc routeCache) InvalidateAll() { rc.c.InvalidateAll() }

// Stats is placecache's Stats.
func (rc routeCache) Stats() placecache.Stats { return rc.c.Stats() }

// handle names a proxy.Session for the cache: its slot's index plus one in
// the low 32 bits, the slot's generation in the high 32; 0 names nothing.
type handle uint64

// handles maps handles to sessions. Reads (every cached lookup, on the
// event loops) take no lock: the table is replaced whole when a session is
// added or dropped, which happens at worker registrations and ends, not
// per request.
type handles struct {
	tab atomic.Pointer[[]handleSlot]

	mu    sync.Mutex
	byPtr map[*proxy.Session]handle // guarded by mu
	free  []uint32                  // free slots; guarded by mu
	gen   uint32                    // the last generation given; guarded by mu
}

type handleSlot struct {
	gen uint32 // 0: free
	s   *proxy.Session
}

func newHandles() *handles {
	h := &handles{byPtr: make(map[*proxy.Session]handle)}
	h.tab.Store(&[]handleSlot{})
	return h
}

// session returns the session x names, or nil when it names none (dropped,
// or 0).
func (h *handles) session(x handle) *proxy.Session {
	tab := *h.tab.Load()
	i := uint64(uint32(x)) - 1 // 0 wraps past any table
	if i >= uint64(len(tab)) || tab[i].gen != uint32(x>>32) {
		return nil
	}
	return tab[i].s
}

// of returns s's handle, if it has one.
func (h *handles) of(s *proxy.Session) (handle, bool) {
	if s == nil {
		return 0, false
	}
	h.mu.Lock()
	x, ok := h.byPtr[s]
	h.mu.Unlock()
	return x, ok
}

// add gives s a handle (its own, if it has one already).
func (h *handles) add(s *proxy.Session) handle {
	h.mu.Lock()
	defer h.mu.Unlock()
	if x, ok := h.byPtr[s]; ok {
		return x
	}
	if h.gen++; h.gen == 0 {
		h.gen = 1 // after 2^32 sessions; a slot's own generation still changes
	}
	tab := append([]handleSlot(nil), *h.tab.Load()...)
	var i uint32
	if n := len(h.free); n > 0 {
		i, h.free = h.free[n-1], h.free[:n-1]
	} else {
		i = uint32(len(tab))
		tab = append(tab, handleSlot{})
	}
	tab[i] = handleSlot{gen: h.gen, s: s}
	h.tab.Store(&tab)
	x := handle(uint64(h.gen)<<32 | uint64(i+1))
	h.byPtr[s] = x
	return x
}

// drop ends s's handle: routes cached with it read as misses from now on.
func (h *handles) drop(s *proxy.Session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x, ok := h.byPtr[s]
	if !ok {
		return
	}
	delete(h.byPtr, s)
	tab := append([]handleSlot(nil), *h.tab.Load()...)
	i := uint32(x) - 1
	tab[i] = handleSlot{}
	h.tab.Store(&tab)
	h.free = append(h.free, i)
}
