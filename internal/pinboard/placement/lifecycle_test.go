package placement_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
)

// heartbeatLoop keeps sid alive on Redis until the test ends.
func (e *env) heartbeatLoop(sid string, headroom int) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	e.t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() {
		tick := time.NewTicker(e.lease / 5)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _, _ = e.st.Heartbeat(ctx, sid, store.Update{Headroom: headroom}, e.lease)
			}
		}
	})
}

// A killed worker's ids answer 503 + Retry-After while its session is live
// in the store (its lease has not run out: it may still be serving), then
// activate elsewhere; the dead session is forgotten.
func TestKilledWorkerReplacedAfterLease(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind)
			if kind == "redis" {
				e.lease = time.Second // Redis expires keys on its own clock: keep the wait short
			}
			a, b := startHost(t, "a", e.fl), startHost(t, "b", e.fl)
			registered := time.Now()
			sa := e.register(a, 100)
			pb := e.pinboard(nil, nil)
			for _, id := range []string{"x", "y"} {
				if ans := pb.get(t, id); ans.host() != "a" {
					t.Fatalf("GET %s = %d %q; want a", id, ans.status, ans.body)
				}
			}
			sb := e.register(b, 100)
			a.kill()

			for range 3 {
				ans := pb.get(t, "x")
				if ans.status != 503 || ans.reason != wire.ReasonUnreachable || ans.retryAfter == "" {
					t.Fatalf("GET x with a dead = %d %q Retry-After %q; want 503 unreachable with Retry-After",
						ans.status, ans.reason, ans.retryAfter)
				}
			}
			if h := e.holder("x"); h != sa {
				t.Fatalf("placement of x moved to %q before a's lease ran out", h)
			}
			// A fresh id is not placed on the worker that just failed.
			if ans := pb.get(t, "fresh"); ans.host() != "b" {
				t.Errorf("GET fresh = %d %q; want b", ans.status, ans.body)
			}

			switch kind {
			case "memory":
				e.fake.Advance(e.lease - time.Second)
				e.heartbeat(sb, 100, false)
				if ans := pb.get(t, "x"); ans.status != 503 {
					t.Fatalf("GET x 1 s before a's lease ends = %d %q; want 503", ans.status, ans.body)
				}
				e.fake.Advance(2 * time.Second)
				if ans := pb.get(t, "x"); ans.host() != "b" {
					t.Fatalf("GET x after a's lease = %d %q %q; want b", ans.status, ans.reason, ans.body)
				}
			case "redis":
				e.heartbeatLoop(sb, 100)
				var ans answer
				waitFor(t, "x to move to b", func() bool {
					ans = pb.get(t, "x")
					if ans.status == 503 && ans.retryAfter == "" {
						t.Fatalf("503 without Retry-After: %+v", ans)
					}
					return ans.status == 200
				})
				if ans.host() != "b" {
					t.Fatalf("GET x after a's lease = %q; want b", ans.body)
				}
				if el := time.Since(registered); el < e.lease {
					t.Fatalf("x moved after %v, before a's lease (%v) could have run out", el, e.lease)
				}
			}
			if h := e.holder("x"); h != sb {
				t.Errorf("placement of x = %q; want %q", h, sb)
			}
			// y may still point at a's session in the cache: the next request
			// finds a unreachable, re-resolves and moves it too.
			if ans := pb.get(t, "y"); ans.host() != "b" {
				t.Errorf("GET y = %d %q; want b", ans.status, ans.body)
			}
			if n := pb.res.Sessions(); n != 1 {
				t.Errorf("sessions = %d; want 1 (a's forgotten)", n)
			}
			// x and y moved off a's expired session; each unreachable answer
			// was reported (Refused); a was forgotten once its session was gone.
			if n := pb.counter(`pinned_placement_replaces_total{result="won"}`); n != 2 {
				t.Errorf(`pinned_placement_replaces_total{result="won"} = %d; want 2`, n)
			}
			if n := pb.counter(`pinned_placement_claims_total{result="won"}`); n != 3 {
				t.Errorf(`pinned_placement_claims_total{result="won"} = %d; want 3 (x, y, fresh)`, n)
			}
			if n := pb.counter("pinned_placement_invalidates_total"); n < 3 {
				t.Errorf("pinned_placement_invalidates_total = %d; want ≥ 3", n)
			}
			if n := pb.counter("pinned_placement_sessions_dropped_total"); n != 1 {
				t.Errorf("pinned_placement_sessions_dropped_total = %d; want 1", n)
			}
			// The records: placements and re-placements at DEBUG with the
			// namespace, instance and session; the forgotten session at INFO.
			logs := pb.logs.String()
			for _, want := range []string{
				`level=DEBUG msg="instance placed" logger=pinned.placement namespace=` + ns + ` instance=x session=` + sa,
				`level=DEBUG msg="instance re-placed: its session expired" logger=pinned.placement namespace=` + ns + ` instance=x session=` + sb + ` previous=` + sa,
				`level=INFO msg="worker session gone; forgotten" logger=pinned.placement session=` + sa + ` reason=`,
			} {
				if !strings.Contains(logs, want) {
					t.Errorf("no record %q in:\n%s", want, logs)
				}
			}
			if d := e.fl.duplicates(); len(d) > 0 {
				t.Errorf("duplicate instances: %v", d)
			}
		})
	}
}

// The second-level-cache race, for real: the placement changes in Redis
// and its invalidation is processed after the resolver read the old holder
// and before it caches it. The stale holder must not be cached.
func TestInvalidationDuringMissIsNotUndone(t *testing.T) {
	e := newEnv(t, "redis")
	a, b := startHost(t, "a", e.fl), startHost(t, "b", e.fl)
	sa, sb := e.register(a, 100), e.register(b, 100)
	if _, err := e.st.Claim(ctxT(t), ns, "x", sa); err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{}
	var pb *pinboard
	var once sync.Once
	cs.hold = func() {
		once.Do(func() {
			// The resolver's read returned a (and made Redis track the
			// key for its connection). Now the placement moves to b
			// through another client, and the invalidation reaches the
			// resolver before the read's result is used.
			before := pb.res.CacheStats().Invalidations
			if ok, err := e.st.Release(ctxT(t), ns, "x", sa, 0); !ok || err != nil {
				t.Errorf("Release = %v, %v", ok, err)
			}
			if h, err := e.st.Claim(ctxT(t), ns, "x", sb); h != sb || err != nil {
				t.Errorf("Claim = %q, %v", h, err)
			}
			waitFor(t, "the invalidation", func() bool { return pb.res.CacheStats().Invalidations > before })
		})
	}
	pb = e.pinboard(nil, func(s store.Store) store.Store { cs.Store = s; return cs })
	rt, err := pb.res.Resolve(context.Background(), []byte("/counter/x"))
	if err != nil || rt.Session.ID != sa {
		t.Fatalf("first Resolve = %v, %v; want a's session (what the store said when read)", rt, err)
	}
	st := pb.res.CacheStats()
	if st.RefusedPuts != 1 || st.Size != 0 {
		t.Fatalf("cache after the raced miss: %+v; want 1 refused put and nothing cached", st)
	}
	rt, err = pb.res.Resolve(context.Background(), []byte("/counter/x"))
	if err != nil || rt.Session.ID != sb {
		t.Fatalf("second Resolve = %v, %v; want b's session", rt, err)
	}
	if p, _ := cs.counts(); p != 2 {
		t.Errorf("placement reads = %d; want 2 (the stale result was not served from the cache)", p)
	}
}

// commandStats returns Redis's per-command call counts.
func (e *env) commandStats() map[string]int64 {
	e.t.Helper()
	s, err := e.redis("INFO", "commandstats").ToString()
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			e.t.Fatalf("INFO commandstats line %q: %v", line, err)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return out
}

// In steady state a proxied request costs zero Redis commands: the delta of
// INFO commandstats over a window of requests (shorter than the cache TTL,
// after warm-up) is nothing but the INFO itself and rueidis's keep-alive
// PINGs.
func TestSteadyStateCostsNoRedisCommands(t *testing.T) {
	e := newEnv(t, "redis")
	for _, n := range []string{"a", "b", "c"} {
		e.register(startHost(t, n, e.fl), 1000)
	}
	pb := e.pinboard(nil, nil)
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("steady%d", i)
	}
	// The first round places every id: report what a placement costs.
	placedAt := time.Now()
	placeBefore := e.commandStats()
	for _, id := range ids {
		if ans := pb.get(t, id); ans.status != 200 {
			t.Fatalf("GET %s = %d %q", id, ans.status, ans.body)
		}
	}
	var placing int64
	for name, n := range e.commandStats() {
		if name != "info" && name != "ping" {
			placing += n - placeBefore[name]
		}
	}
	t.Logf("placing %d new ids cost %d Redis commands (%.1f per id)", len(ids), placing, float64(placing)/float64(len(ids)))
	// Warm up until a whole round is served from the cache (the
	// invalidations of the pinboard's own claims arrive after the claims and
	// drop a few fresh entries once).
	warm := false
	for round := 0; round < 50 && !warm; round++ {
		before := pb.res.CacheStats().Misses
		for _, id := range ids {
			if ans := pb.get(t, id); ans.status != 200 {
				t.Fatalf("GET %s = %d %q", id, ans.status, ans.body)
			}
		}
		warm = pb.res.CacheStats().Misses == before
	}
	if !warm {
		t.Fatal("the cache never warmed up")
	}
	const requests = 3000
	before := e.commandStats()
	missesBefore := pb.res.CacheStats().Misses
	start := time.Now()
	for i := range requests {
		if ans := pb.get(t, ids[i%len(ids)]); ans.status != 200 {
			t.Fatalf("GET = %d %q", ans.status, ans.body)
		}
	}
	elapsed := time.Since(start)
	after := e.commandStats()
	// Entries live the cache TTL (the lease) less up to a fifth of it
	// (redisstore spreads the expiries), counted from their first read;
	// refreshes are due from a quarter of the TTL before that.
	if shortest := e.lease - e.lease/5 - e.lease/4; time.Since(placedAt) >= shortest {
		t.Fatalf("placing, warming up and the window took %v, longer than the shortest cache lifetime before refreshes %v: entries may have been re-read", time.Since(placedAt), shortest)
	}
	delta := map[string]int64{}
	for name, n := range after {
		if d := n - before[name]; d != 0 && name != "info" && name != "ping" {
			delta[name] = d
		}
	}
	if len(delta) > 0 {
		t.Errorf("%d requests in %v cost Redis commands: %v; want none", requests, elapsed, delta)
	}
	if m := pb.res.CacheStats().Misses - missesBefore; m != 0 {
		t.Errorf("%d cache misses in the window; want 0", m)
	}
	t.Logf("%d requests in %v: %v Redis commands besides INFO/PING", requests, elapsed, len(delta))
}

// warmAll requests ids until one round is served wholly from the cache.
func warmAll(t *testing.T, pb *pinboard, ids ...string) {
	t.Helper()
	waitFor(t, "a warm cache", func() bool {
		before := pb.res.CacheStats().Misses
		for _, id := range ids {
			pb.get(t, id)
		}
		return pb.res.CacheStats().Misses == before
	})
}

// FLUSHALL and a lost connection drop every cached placement (rueidis
// reports both as a nil invalidation: anything may have changed).
func TestFlushAndConnectionLossClearTheCache(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		a := startHost(t, "a", e.fl)
		e.register(a, 100)
		pb := e.pinboard(nil, nil)
		ids := []string{"f1", "f2", "f3", "f4"}
		warmAll(t, pb, ids...)
		if n := pb.res.CacheStats().Size; n != len(ids) {
			t.Fatalf("cached = %d; want %d", n, len(ids))
		}
		switch e.kind {
		case "memory":
			e.mem.Flush()
		case "redis":
			if err := e.redis("FLUSHALL").Error(); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "the cache to empty after FLUSHALL", func() bool { return pb.res.CacheStats().Size == 0 })
		if ans := pb.get(t, "f1"); ans.status != 503 || ans.reason != wire.ReasonNoWorker {
			t.Errorf("GET after FLUSHALL = %d %q; want 503 no_worker (the directory is empty)", ans.status, ans.reason)
		}
		e.register(a, 100)
		if ans := pb.get(t, "f1"); ans.host() != "a" {
			t.Fatalf("GET after re-registering = %d %q", ans.status, ans.body)
		}
		if e.kind != "redis" {
			return
		}
		warmAll(t, pb, ids...)
		if err := e.redis("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Error(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the cache to empty after a connection loss", func() bool { return pb.res.CacheStats().Size == 0 })
		waitFor(t, "service after reconnecting", func() bool { return pb.get(t, "f2").host() == "a" })
	})
}

// WebSocket tunnels of a placement close when the placement leaves their
// session (here: released), and stay when an invalidation turns out
// spurious (the holder did not change).
func TestTunnelsCloseWhenPlacementMoves(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		a := startHost(t, "a", e.fl)
		sa := e.register(a, 100)
		pb := e.pinboard(nil, nil)
		dial := func(id string) *websocket.Conn {
			c, _, err := websocket.DefaultDialer.Dial("ws://"+pb.addr+ns+"/"+id+"/ws", nil)
			if err != nil {
				t.Fatalf("dial %s: %v", id, err)
			}
			t.Cleanup(func() { c.Close() })
			if err := c.WriteMessage(websocket.TextMessage, []byte("ping")); err != nil {
				t.Fatal(err)
			}
			if _, b, err := c.ReadMessage(); err != nil || string(b) != "ping" {
				t.Fatalf("echo = %q, %v", b, err)
			}
			return c
		}
		x, y := dial("x"), dial("y")
		// Placements of x and y exist now (the handshakes placed them).
		if h := e.holder("x"); h != sa {
			t.Fatalf("placement of x = %q", h)
		}
		checks := pb.res.Metrics().GetOrCreateCounter("pinned_placement_tunnel_checks_total")
		// A spurious invalidation: the holder is still a; nothing closes.
		pb.res.OnInvalidate(store.Invalidation{Placement: ns + "/y"})
		waitFor(t, "the spurious check", func() bool { return checks.Get() >= 1 })
		// The release of x: x's tunnel closes, y's stays.
		if ok, err := e.st.Release(ctxT(t), ns, "x", sa, 0); !ok || err != nil {
			t.Fatalf("Release = %v, %v", ok, err)
		}
		_ = x.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := x.ReadMessage(); err == nil {
			t.Fatal("x's tunnel still carries messages after its placement was released")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("x's tunnel was not closed within 5 s of its placement's release")
		}
		if err := y.WriteMessage(websocket.TextMessage, []byte("still")); err != nil {
			t.Fatal(err)
		}
		_ = y.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, b, err := y.ReadMessage(); err != nil || string(b) != "still" {
			t.Errorf("y's tunnel after x's release: %q, %v; want the echo", b, err)
		}
		if e.kind != "redis" {
			return
		}
		// A lost connection ends Redis's tracking of y for this pinboard;
		// the re-check it triggers tracks y again, so y's later release
		// still closes its tunnel.
		before := checks.Get()
		if err := e.redis("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Error(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the re-check after the connection loss", func() bool { return checks.Get() > before })
		if ok, err := e.st.Release(ctxT(t), ns, "y", sa, 0); !ok || err != nil {
			t.Fatalf("Release y = %v, %v", ok, err)
		}
		_ = y.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := y.ReadMessage(); err == nil {
			t.Fatal("y's tunnel still carries messages after its placement was released")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("y's tunnel was not closed within 5 s of its release after a reconnect")
		}
	})
}

// Run's sweep forgets the sessions that left the store, even when no
// request comes for their ids.
func TestSweepForgetsDeadSessions(t *testing.T) {
	e := newEnv(t, "memory")
	a, b := startHost(t, "a", e.fl), startHost(t, "b", e.fl)
	e.register(a, 100)
	pb := e.pinboard(func(c *placement.Config) { c.SweepInterval = 5 * time.Second }, nil)
	pb.get(t, "x")
	sb := e.register(b, 100)
	pb.get(t, "fresh-on-b") // b is known too
	done := make(chan struct{})
	defer close(done)
	e.fake.BlockUntil(1, done)            // Run is asleep on its sweep timer
	e.fake.Advance(e.lease - time.Second) // a sweep at 5 s finds both live
	e.heartbeat(sb, 100, false)
	e.fake.BlockUntil(1, done) // the sweep is done and re-armed
	if n := pb.res.Sessions(); n != 2 {
		t.Fatalf("sessions after a sweep with both live = %d; want 2", n)
	}
	e.fake.Advance(5 * time.Second) // a expired; the next sweep runs
	waitFor(t, "the sweep", func() bool { return pb.res.Sessions() == 1 })
	if ans := pb.get(t, "x"); ans.host() != "b" {
		t.Errorf("GET x after the sweep = %d %q; want b", ans.status, ans.body)
	}
	if n := pb.counter("pinned_placement_sessions_dropped_total"); n != 1 {
		t.Errorf("pinned_placement_sessions_dropped_total = %d; want 1", n)
	}
}

// Redis down: the cache is dropped (the connection loss is a nil
// invalidation) and misses answer 503 store with Retry-After, bounded by
// ResolveTimeout; service resumes once Redis is back.
func TestRedisDownAnswersStore(t *testing.T) {
	e := newEnv(t, "redis")
	a := startHost(t, "a", e.fl)
	e.register(a, 100)
	pb := e.pinboard(func(c *placement.Config) { c.ResolveTimeout = 500 * time.Millisecond }, nil)
	warmAll(t, pb, "d1")
	e.srv.Kill()
	waitFor(t, "the cache to empty after the connection loss", func() bool { return pb.res.CacheStats().Size == 0 })
	start := time.Now()
	ans := pb.get(t, "d1")
	if ans.status != 503 || ans.reason != wire.ReasonStore || ans.retryAfter == "" {
		t.Errorf("GET with Redis down = %d %q Retry-After %q; want 503 store with Retry-After", ans.status, ans.reason, ans.retryAfter)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("the answer took %v; want it bounded by ResolveTimeout", el)
	}
	if n := pb.counter("pinned_placement_store_errors_total"); n < 1 {
		t.Errorf("pinned_placement_store_errors_total = %d; want ≥ 1", n)
	}
	e.srv.Restart(t) // empty: the worker registers again
	waitFor(t, "Redis back", func() bool {
		_, err := e.st.Register(context.Background(), store.Session{
			ID: "s-again", ClientID: "client-a", Secret: a.secret, AdvertiseURL: a.url,
			Namespaces: []string{ns}, Headroom: 100, Verified: true,
		}, e.lease)
		return err == nil
	})
	sid := "s-again"
	a.session.Store(&sid)
	waitFor(t, "service after Redis came back", func() bool { return pb.get(t, "d1").host() == "a" })
}
