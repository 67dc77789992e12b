package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/history"
)

// The stale-route nemeses: one pinboard (n) keeps routing by placements it
// cached while they move on through the other (o).
//
//   - redis-freeze+move: pinboard n's link to Redis goes silent for at
//     least staleFault (tcpfwd's stall: connections open, nothing passes,
//     no RST or FIN; its cached routes live on for up to a lease after
//     Redis last confirmed them);
//   - redis-slow-invalidations+move: the bytes from Redis to pinboard n
//     (its replies and the invalidation pushes) are delayed by 1–2.5 s, so
//     it learns of every move late.
//
// Meanwhile placements move: staleIdle plain ids the client leaves alone
// go idle (PINNED_IDLE_TIMEOUT) and are released; staleEvict others are
// evicted through pinboard o's registry (the console's DELETE
// /registry/placements/...); with the freeze, one worker is also drained
// (through o) and restarted. As soon as each has moved (released, or
// placed anew), it is asked through both pinboards in both orders
// (askOne: n first for every other id), the client's loops asking through
// both all along; pinboard
// n's old routes lead to the old holder under the old epoch, which must
// refuse them rather than activate a second instance (the checker's
// overlap and linearizability checks). Workers whose control path goes to
// pinboard n turn to o for the duration, as behind a load balancer that
// checks the pinboards' health: they keep their leases, so the old holder
// is alive and serving, the case that matters.
//
// late-releases+move is their counterpart on the control path: every
// worker's release calls are held in the network (tcpfwd.HoldRequests on
// "POST /registry/release", which also matches the batches' "POST
// /registry/releases"; heartbeats pass) while staleIdle ids go idle
// and staleEvict are evicted. The holders close the instances and give up
// releasing (the host's release timeout), so the placements stay and the
// next route to them is refused stale and renewed under a newer epoch on
// the same holder (the evicted ids by the client's loops, the idle ones by
// askBoth); then the held releases are delivered, late, and must leave the
// renewed placements alone: a release that deleted one would let the id be
// placed again elsewhere beside its live renewed instance. Each id is
// asked through both pinboards again after the delivery. A round in which no
// placement moved proves nothing and fails ("skipped: ...", not allowed).

// Parameters of the stale-route nemeses.
const (
	staleIdle  = 8                // plain ids left alone to go idle
	staleEvict = 8                // plain ids evicted
	staleFault = 12 * time.Second // the shortest freeze or delay
	staleMove  = 10 * time.Second // bound of the wait for the ids to move
	// lateMove bounds the wait of late-releases+move for the evicted ids'
	// placements to be renewed: the eviction (a heartbeat), then the
	// host's release timeout (10 s), then a stale refusal.
	lateMove = 25 * time.Second
)

// slowInvalidations draws the delay of redis-slow-invalidations+move:
// 1–2.5 s, above a heartbeat's round trip and around the proxy's resolve
// timeout (2 s).
func slowInvalidations(rng *rand.Rand) time.Duration {
	return time.Second + time.Duration(rng.Int64N(int64(1500*time.Millisecond)+1)).Round(time.Millisecond)
}

// placed is a placement as a registry reports it; zero when not placed.
type placed struct {
	session string
	epoch   uint64
}

// staleRoutes runs one stale-route nemesis (kind) and records it in e.
func (c *cluster) staleRoutes(kind string, rng *rand.Rand, e *history.Event) {
	if kind == nemLateRelease {
		c.lateReleases(rng, e)
		return
	}
	m := c.planMoves(rng)
	lc, n, o, moving, before := m.lc, m.n, m.o, m.all, m.before
	e.Target = fmt.Sprintf("pb%d", n)

	start := time.Now()
	e.T = history.Now()
	restore := c.moveControl(n, o)
	var what string
	if kind == nemFreeze {
		c.rproxys[n-1].Stall(true, true)
		what = "frozen"
	} else {
		d := slowInvalidations(rng)
		c.rproxys[n-1].SetDelays(0, d)
		what = "replies " + d.String() + " late"
	}
	refused := c.startMoves(m)
	asked := make(chan int, 1)
	go func() { // joined below; it makes no testing.TB call
		// Each id is asked as soon as it has moved, while pinboard n still
		// routes by its old placement: n first for every other id.
		var wg sync.WaitGroup
		k := 0
		ask := func(id string) {
			a, b := n, o
			if k%2 == 1 {
				a, b = o, n
			}
			k++
			wg.Go(func() { lc.askOne(id, a, b) })
		}
		gone := c.awaitMoved(o, moving, before, staleMove, ask)
		wg.Wait()
		lc.unhush()
		asked <- gone
	}()
	drain := ""
	if kind == nemFreeze { // on the test's goroutine: it starts processes
		w := 1 + rng.IntN(3)
		name := c.worker(w).proc
		drain = "drained " + name
		if why := c.drainWorkerVia(w, o); why != "" {
			drain = fmt.Sprintf("drain of %s refused (%s)", name, strings.TrimPrefix(why, "skipped: "))
		}
	}
	gone := <-asked
	time.Sleep(time.Until(start.Add(staleFault))) // the fault lasts at least staleFault
	if kind == nemFreeze {
		c.rproxys[n-1].Stall(false, false)
	} else {
		c.rproxys[n-1].SetDelays(0, 0)
	}
	restore()

	what = fmt.Sprintf("%s %v: %d idled out, %d evicted", what, time.Since(start).Round(100*time.Millisecond), staleIdle, staleEvict-refused)
	if drain != "" {
		what += ", " + drain
	}
	e.Cause = movedCause(what, moving, before, c.placements(o, moving), gone)
}

// movedCause is the outcome of a stale-route nemesis: what was done, how
// many of the ids moved by the end (and how many of them while awaitMoved
// watched); "skipped: ..." when none did (the round proved nothing).
func movedCause(what string, ids []string, before, after map[string]placed, early int) string {
	moved, elsewhere := changed(ids, before, after)
	s := fmt.Sprintf("%s; %d of %d moved (%d to another worker), %d of them within the wait", what, moved, len(ids), elsewhere, early)
	if moved == 0 {
		return "skipped: no placement moved (" + s + ")"
	}
	return s
}

// lateReleases runs late-releases+move (see above) and records it in e.
func (c *cluster) lateReleases(rng *rand.Rand, e *history.Event) {
	m := c.planMoves(rng) // evicts through o; asked through n first for half the ids
	lc, n, o, moving, before, evict := m.lc, m.n, m.o, m.all, m.before, m.evict
	e.Target = "every worker's releases"

	start := time.Now()
	e.T = history.Now()
	for _, px := range c.proxys {
		px.HoldRequests("POST " + wire.PathRelease) // a prefix of "POST " + wire.PathReleases too
	}
	refused := c.startMoves(m)
	// The evicted ids move (renewed on a stale refusal) once their
	// holders gave up releasing; the idle ones, left alone, move when asked.
	gone := c.awaitMoved(o, evict, before, lateMove, nil)
	lc.unhush()
	lc.askBoth(moving, n, o)
	for _, px := range c.proxys {
		px.Deliver()
	}
	delivered := time.Since(start)
	lc.askBoth(moving, o, n)
	what := fmt.Sprintf("held %v: %d idled out, %d evicted", delivered.Round(100*time.Millisecond), staleIdle, staleEvict-refused)
	e.Cause = movedCause(what, moving, before, c.placements(o, moving), gone)
}

// moves is the plan of a stale-route nemesis.
type moves struct {
	lc          *loadClient
	n, o        int // the faulted pinboard; the other, which evicts and reads the registry
	idle, evict []string
	all         []string          // idle and evict
	before      map[string]placed // their placements before the fault (read through o)
}

// planMoves draws the pinboards and the plain ids of a stale-route
// nemesis and reads the ids' placements.
func (c *cluster) planMoves(rng *rand.Rand) *moves {
	c.mu.Lock()
	m := &moves{lc: c.client, n: 1 + rng.IntN(2)}
	c.mu.Unlock()
	m.o = 3 - m.n
	ids := m.lc.plainIDs()
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	m.idle, m.evict = ids[:staleIdle], ids[staleIdle:staleIdle+staleEvict]
	m.all = slices.Concat(m.idle, m.evict)
	m.before = c.placements(m.o, m.all)
	return m
}

// startMoves sets the planned ids moving: the client leaves the idle ones
// alone, the others are evicted through pinboard o. It returns how many
// evictions the registry refused.
func (c *cluster) startMoves(m *moves) (refused int) {
	m.lc.hush(m.idle)
	for _, id := range m.evict {
		if why := c.evict(m.o, id); why != "" {
			refused++
			c.t.Logf("evict %s through pb%d: %s", id, m.o, why)
		}
	}
	return refused
}

// moveControl turns the control path of the workers that heartbeat
// through pinboard n to pinboard o (their open connections dropped: the
// worker resends within its retry interval) and returns the undo.
func (c *cluster) moveControl(n, o int) (restore func()) {
	c.mu.Lock()
	from, to := c.pbs[n-1].addr, c.pbs[o-1].addr
	c.mu.Unlock()
	var moved []int
	for w := 1; w <= len(c.proxys); w++ {
		if home(w) == n {
			c.proxys[w-1].Retarget(to, true)
			moved = append(moved, w)
		}
	}
	return func() {
		for _, w := range moved {
			c.proxys[w-1].Retarget(from, true)
		}
	}
}

// registry sends one call to pinboard pb's registry and returns the
// status and body, or the error.
func (c *cluster) registry(pb int, method, path string) (int, []byte, error) {
	c.mu.Lock()
	addr := c.pbs[pb-1].addr
	c.mu.Unlock()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	req.Header.SetMethod(method)
	req.Header.Set("Authorization", "Bearer "+token)
	if err := fasthttp.DoTimeout(req, resp, 5*time.Second); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// placementPath is the registry path of /counter/id's placement.
func placementPath(id string) string { return wire.PathPlacements + "/counter/" + id }

// placements reads the placement of every id through pinboard pb's
// registry: the zero placed when the id is not placed (404); ids whose
// placement could not be read are left out.
func (c *cluster) placements(pb int, ids []string) map[string]placed {
	out := map[string]placed{}
	for _, id := range ids {
		code, body, err := c.registry(pb, "GET", placementPath(id))
		var p wire.PlacementInfo
		switch {
		case err != nil:
		case code == 404:
			out[id] = placed{}
		case code == 200 && json.Unmarshal(body, &p) == nil:
			out[id] = placed{session: p.SessionID, epoch: p.Epoch}
		}
	}
	return out
}

// changed counts the ids whose placement was read both times and differs,
// and among them those now placed on another session.
func changed(ids []string, before, after map[string]placed) (moved, elsewhere int) {
	for _, id := range ids {
		b, okB := before[id]
		a, okA := after[id]
		if okB && okA && a != b {
			moved++
			if a.session != "" && a.session != b.session {
				elsewhere++
			}
		}
	}
	return moved, elsewhere
}

// evict evicts id's instance through pinboard pb's registry; it returns
// what went wrong, or "".
func (c *cluster) evict(pb int, id string) string {
	code, body, err := c.registry(pb, "DELETE", placementPath(id))
	switch {
	case err != nil:
		return err.Error()
	case code != 202:
		return fmt.Sprintf("%d %s", code, body)
	}
	return ""
}

// awaitMoved polls pinboard pb's registry until every id's placement
// differs from before (released, or placed anew), bounded by within,
// calling moved (when not nil) once for each id as soon as it has moved,
// and for each id that had not when the time ran out; it returns how many
// had moved in time.
func (c *cluster) awaitMoved(pb int, ids []string, before map[string]placed, within time.Duration, moved func(id string)) int {
	deadline := time.Now().Add(within)
	seen := map[string]bool{}
	for {
		now := c.placements(pb, ids)
		for _, id := range ids {
			if b, ok := before[id]; ok && !seen[id] {
				if a, ok := now[id]; ok && a != b {
					seen[id] = true
					if moved != nil {
						moved(id)
					}
				}
			}
		}
		if len(seen) == len(ids) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling other processes' state
	}
	if moved != nil {
		for _, id := range ids {
			if !seen[id] {
				moved(id)
			}
		}
	}
	return len(seen)
}
