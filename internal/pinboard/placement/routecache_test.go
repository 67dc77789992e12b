package placement

import (
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/placecache"
	"github.com/pinned-go/pinned/proxy"
)

// A dropped session's handle names nothing, and a slot reused for another
// session does not revive it.
func TestHandlesAreNeverReused(t *testing.T) {
	h := newHandles()
	a, b := &proxy.Session{ID: "a"}, &proxy.Session{ID: "b"}
	ha := h.add(a)
	if got := h.session(ha); got != a {
		t.Fatalf("session(a's handle) = %v; want a", got)
	}
	if again := h.add(a); again != ha {
		t.Fatalf("add(a) twice: %x, then %x; want the same handle", ha, again)
	}
	h.drop(a)
	if got := h.session(ha); got != nil {
		t.Fatalf("session(a's handle) after drop = %v; want nil", got.ID)
	}
	if _, ok := h.of(a); ok {
		t.Fatal("a has a handle after its drop")
	}
	hb := h.add(b)
	if uint32(hb) != uint32(ha) {
		t.Fatalf("b took slot %d; want a's freed slot %d", uint32(hb), uint32(ha))
	}
	if got := h.session(ha); got != nil {
		t.Fatalf("a's old handle names %q after b took its slot; want nothing", got.ID)
	}
	if got := h.session(hb); got != b {
		t.Fatalf("session(b's handle) = %v; want b", got)
	}
	if got := h.session(0); got != nil {
		t.Fatal("handle 0 names a session")
	}
	if got := h.session(handle(1<<32 | 99)); got != nil {
		t.Fatal("a handle past the table names a session")
	}
}

// The route cache answers routes as they were put, forgets those of a
// dropped session (a miss, not another session's route), and never
// caches a route whose session has no handle.
func TestRouteCacheForgetsDroppedSessions(t *testing.T) {
	c, err := placecache.New[cachedRoute](placecache.Config{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rc := routeCache{c: c, h: newHandles()}
	now := clock.Real{}.Now()
	until := now.Wall().Add(time.Minute)
	a, b := &proxy.Session{ID: "a"}, &proxy.Session{ID: "b"}
	rc.h.add(a)
	x, y := []byte("/counter/x"), []byte("/counter/y")
	if !rc.PutUntil(x, proxy.Route{Session: a, Epoch: 7}, rc.Begin(x), until) {
		t.Fatal("PutUntil of a's route refused")
	}
	if rt, ok, _ := rc.GetAhead(x, now); !ok || rt.Session != a || rt.Epoch != 7 {
		t.Fatalf("GetAhead(x) = %+v, %v; want a's route at epoch 7", rt, ok)
	}
	if rc.PutUntil(y, proxy.Route{Session: b, Epoch: 1}, rc.Begin(y), until) {
		t.Fatal("a route of b, which has no handle, was cached")
	}
	if rc.PutUntil(y, proxy.Route{}, rc.Begin(y), until) {
		t.Fatal("a route without a session was cached")
	}
	rc.h.drop(a)
	rc.h.add(b) // takes a's slot
	if rt, ok, refresh := rc.GetAhead(x, now); ok || refresh {
		t.Fatalf("GetAhead(x) after a's drop = %+v, %v, %v; want a miss", rt, ok, refresh)
	}
	if rt, ok := rc.Peek(x, now); ok {
		t.Fatalf("Peek(x) after a's drop = %+v; want a miss", rt)
	}
	if !rc.PutUntil(x, proxy.Route{Session: b, Epoch: 8}, rc.Begin(x), until) {
		t.Fatal("PutUntil of b's route refused")
	}
	rc.InvalidateIf(x, func(rt proxy.Route) bool { return rt.Session == a })
	if rt, ok := rc.Peek(x, now); !ok || rt.Session != b {
		t.Fatalf("Peek(x) after an invalidation naming a = %+v, %v; want b's route kept", rt, ok)
	}
	rc.InvalidateIf(x, func(rt proxy.Route) bool { return rt.Session == b })
	if _, ok := rc.Peek(x, now); ok {
		t.Fatal("b's route survived an invalidation naming b")
	}
}
