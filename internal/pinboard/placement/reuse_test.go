package placement_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
)

// listingStore counts NamespaceSessions calls.
type listingStore struct {
	store.Store
	lists atomic.Int64
}

func (s *listingStore) NamespaceSessions(ctx context.Context, ns string) ([]store.Session, error) {
	s.lists.Add(1)
	return s.Store.NamespaceSessions(ctx, ns)
}

// With SessionsReuse, cold placements within the reuse window share one
// listing of the namespace's sessions (a thousand workers cost one decode
// per window, not one per placement); past the window the sessions are
// listed again; a worker that registers inside the window is found at
// once when the reused list has no session that may take an id, and a
// drained one stops receiving ids once the window has passed.
func TestSessionsReuse(t *testing.T) {
	e := newEnv(t, "memory")
	a := startHost(t, "a", e.fl)
	sa := e.register(a, 100)
	ls := &listingStore{}
	pb := e.pinboard(func(c *placement.Config) { c.SessionsReuse = time.Second }, func(s store.Store) store.Store { ls.Store = s; return ls })
	resolve := func(id string) string {
		t.Helper()
		rt, err := pb.res.Resolve(context.Background(), []byte(ns+"/"+id))
		if err != nil {
			t.Fatalf("Resolve(%s) = %v", id, err)
		}
		return rt.Session.ID
	}
	for i := range 50 {
		if got := resolve(fmt.Sprint("x", i)); got != sa {
			t.Fatalf("x%d placed on %s; want %s", i, got, sa)
		}
	}
	if n := ls.lists.Load(); n != 1 {
		t.Fatalf("50 cold placements in one reuse window listed the sessions %d times; want 1", n)
	}
	e.fake.Advance(time.Second)
	resolve("y0")
	if n := ls.lists.Load(); n != 2 {
		t.Fatalf("a placement past the window listed the sessions %d times in all; want 2", n)
	}
	// a drains and b registers, inside the window: the reused list still
	// offers a, which takes the id (a moment's lag, by design).
	b := startHost(t, "b", e.fl)
	sb := e.register(b, 100)
	e.heartbeat(sa, 100, true)
	if got := resolve("y1"); got != sa {
		t.Fatalf("inside the window y1 went to %s; want %s from the reused list", got, sa)
	}
	// Past the window the drain is seen: new ids go to b.
	e.fake.Advance(time.Second)
	if got := resolve("y2"); got != sb {
		t.Fatalf("past the window y2 went to %s; want %s (a drains)", got, sb)
	}
	// b drains too: past the window nobody may take a new id.
	e.heartbeat(sb, 100, true)
	e.fake.Advance(time.Second)
	if _, err := pb.res.Resolve(context.Background(), []byte(ns+"/y3")); err == nil {
		t.Fatal("Resolve(y3) with every worker draining = nil error; want no worker")
	}
	// c registers inside the window of that list: a reused list with no
	// session that may take an id is listed again at once.
	c := startHost(t, "c", e.fl)
	sc := e.register(c, 100)
	if got := resolve("y4"); got != sc {
		t.Fatalf("y4 went to %s; want %s, registered inside the window when the reused list had nobody to take it", got, sc)
	}
}

// Without SessionsReuse every cold placement lists the sessions.
func TestSessionsReuseOff(t *testing.T) {
	e := newEnv(t, "memory")
	e.register(startHost(t, "a", e.fl), 100)
	ls := &listingStore{}
	pb := e.pinboard(nil, func(s store.Store) store.Store { ls.Store = s; return ls })
	for i := range 20 {
		if _, err := pb.res.Resolve(context.Background(), []byte(fmt.Sprintf("%s/x%d", ns, i))); err != nil {
			t.Fatal(err)
		}
	}
	if n := ls.lists.Load(); n < 20 {
		t.Fatalf("20 cold placements without reuse listed the sessions %d times; want one each", n)
	}
}

// A recheck (the proxy could not reach the holder) reads the holder's
// session itself instead of trusting a reused list, which may still hold a
// session that has just deregistered and would send the request back to
// it, and takes over from a gone holder without choosing it again from
// that list. A recheck of a live holder lists nothing (a thousand workers
// cost one decode per reuse window, rechecks included). Here a deregisters
// while b has registered since the list was read: the ids of a go to b at
// their first recheck, not back to a, and not "no worker".
func TestRecheckVerifiesTheHolder(t *testing.T) {
	e := newEnv(t, "memory")
	a := startHost(t, "a", e.fl)
	sa := e.register(a, 100)
	ls := &listingStore{}
	pb := e.pinboard(func(c *placement.Config) { c.SessionsReuse = time.Minute }, func(s store.Store) store.Store { ls.Store = s; return ls })
	name := []byte(ns + "/x0")
	rt, err := pb.res.Resolve(context.Background(), name)
	if err != nil || rt.Session.ID != sa {
		t.Fatalf("Resolve(x0) = %+v, %v; want %s", rt, err, sa)
	}
	pb.res.Refused(name, rt, wire.ReasonUnreachable)
	if again, err := pb.res.Resolve(context.Background(), name); err != nil || again.Session.ID != sa {
		t.Fatalf("Resolve(x0) after a refusal by its live holder = %+v, %v; want %s", again, err, sa)
	}
	if n := ls.lists.Load(); n != 1 {
		t.Fatalf("a recheck of a live holder listed the sessions again (%d listings); want 1", n)
	}
	b := startHost(t, "b", e.fl)
	sb := e.register(b, 100)
	if ok, err := e.st.Deregister(ctxT(t), sa); err != nil || !ok {
		t.Fatalf("Deregister(%s) = %v, %v", sa, ok, err)
	}
	pb.res.Refused(name, rt, wire.ReasonUnreachable)
	got, err := pb.res.Resolve(context.Background(), name)
	if err != nil {
		t.Fatalf("Resolve(x0) after its holder deregistered and was unreachable = %v; want %s", err, sb)
	}
	if got.Session.ID != sb {
		t.Fatalf("Resolve(x0) after its holder deregistered and was unreachable went to %s; want %s", got.Session.ID, sb)
	}
}
