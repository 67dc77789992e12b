package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/fence"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/internal/testkit/tcpfwd"
)

// staleIDs is how many ids the stale-route scenario places.
const staleIDs = 20

// TestStaleRoutesOfASilentPinboard: a pinboard whose link to Redis goes
// silent (connections open, no byte passing, no RST or FIN) keeps routing
// by its cached placements while the ids move on without it. The holder
// of an old route must not answer it with a fresh instance of its own.
//
// Real processes: one Redis; pinboard P1 reaches it through a stallable
// forwarder (internal/testkit/tcpfwd), pinboard P2 directly; two counter
// workers registered through P2. 20 ids are placed and incremented twice
// through P1, so P1 caches their routes; then P1's link to Redis stalls and
// every instance goes away, by the idle timeout (PINNED_IDLE_TIMEOUT=3s) or
// by an evict through P2's registry (the console's DELETE
// /registry/placements/...). Once every placement is released, each id is
// asked through both pinboards in both orders (P1 then P2 for one half,
// P2 then P1 for the other, then the other way round: GET / and POST /incr
// each time), so that P2 places it anew, on the other worker about half
// the time, while P1 still routes by its cache. With -persist and without.
//
// Required: no id answered by two instances (different "instance" values
// among the 2xx answers after the move, from P1 and P2, all within a
// lease); every answer of P1 is 503 with Retry-After or comes from the one
// current instance; no acknowledged increment lost (the acknowledged
// counts are distinct and the final count covers them: since the move
// without -persist, since the start with it, where the store must hold
// them too).
func TestStaleRoutesOfASilentPinboard(t *testing.T) {
	for _, move := range []string{"idle", "evict"} {
		for _, persist := range []bool{false, true} {
			name := move
			if persist {
				name += "/persist"
			}
			t.Run(name, func(t *testing.T) { staleRoutes(t, move, persist) })
		}
	}
}

// answer is one request of the scenario and what came back.
type answer struct {
	via        string // "P1" or "P2"
	method     string
	status     int
	reason     string
	retryAfter bool
	err        error
	state      counterState
}

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("%s %s: %v", a.via, a.method, a.err)
	}
	s := fmt.Sprintf("%s %s: %d", a.via, a.method, a.status)
	if a.reason != "" {
		s += " " + a.reason
	}
	if a.status == 503 && !a.retryAfter {
		s += " (no Retry-After)"
	}
	if a.status/100 == 2 {
		s += fmt.Sprintf(" count %d instance %s epoch %d", a.state.Count, a.state.Instance, a.state.Epoch)
	}
	return s
}

func (a answer) ok() bool { return a.err == nil && a.status/100 == 2 }

// ackedIncr reports whether a is an acknowledged increment.
func (a answer) ackedIncr() bool { return a.ok() && a.method == "POST" }

var staleClient = &fasthttp.Client{MaxIdemponentCallAttempts: 1, ReadTimeout: 20 * time.Second, WriteTimeout: 5 * time.Second}

// ask sends one request for id through the pinboard at addr (named via):
// GET / or POST /incr (askWithin, failover_test.go).
func ask(via, addr, method, id string) answer {
	return askWithin(staleClient, 20*time.Second, via, addr, method, id)
}

// placementOf reads the placement of /counter/id from pb's registry; ok
// false when the id is not placed (404).
func placementOf(t *testing.T, pb *pinboard, id string) (wire.PlacementInfo, bool) {
	t.Helper()
	code, _, body := do(t, "GET", "http://"+pb.public+wire.PathPlacements+"/counter/"+id, map[string]string{"Authorization": "Bearer " + token})
	switch code {
	case 404:
		return wire.PlacementInfo{}, false
	case 200:
		var p wire.PlacementInfo
		if err := json.Unmarshal(body, &p); err != nil {
			t.Fatalf("placement of %s: %q: %v", id, body, err)
		}
		return p, true
	}
	t.Fatalf("GET placement of %s = %d %s", id, code, body)
	return wire.PlacementInfo{}, false
}

func staleRoutes(t *testing.T, move string, persist bool) {
	dir := redistest.Start(t)
	link := tcpfwd.Start(t, dir.Addr)
	p1 := startPinboardAs(t, "P1", "redis://"+link.Addr()+"/0")
	p2 := startPinboardAs(t, "P2", dir.URL)
	var env []string
	if move == "idle" {
		env = append(env, "PINNED_IDLE_TIMEOUT=3s")
	}
	var app *redistest.Server
	if persist {
		app = redistest.Start(t)
		env = append(env, "PINNED_PERSIST="+app.URL)
	}
	a := startCounter(t, p2, env...)
	b := startCounter(t, p2, env...)
	eventually(t, 15*time.Second, "both counters register through P2", func() bool {
		_, okA := workerAt(t, p2, a.addr)
		_, okB := workerAt(t, p2, b.addr)
		return okA && okB && healthy(t, a) && healthy(t, b)
	})

	ids := make([]string, staleIDs)
	for i := range ids {
		ids[i] = fmt.Sprintf("stale%02d", i)
	}
	answers := map[string][]answer{} // per id, in order; the first two are the placing increments
	for _, id := range ids {
		for range 2 {
			an := ask("P1", p1.public, "POST", id)
			if !an.ok() {
				t.Fatalf("placing %s through P1: %v", id, an)
			}
			answers[id] = append(answers[id], an)
		}
	}
	before := map[string]wire.PlacementInfo{}
	for _, id := range ids {
		p, ok := placementOf(t, p2, id)
		if !ok {
			t.Fatalf("%s is not placed after two increments", id)
		}
		before[id] = p
	}

	// P1's link to Redis goes silent; the instances go away.
	link.Stall(true, true)
	if move == "evict" {
		for _, id := range ids {
			code, _, body := do(t, "DELETE", "http://"+p2.public+wire.PathPlacements+"/counter/"+id, map[string]string{"Authorization": "Bearer " + token})
			if code != 202 {
				t.Fatalf("evict %s through P2 = %d %s", id, code, body)
			}
		}
	}
	eventually(t, 20*time.Second, "every placement released ("+move+")", func() bool {
		for _, id := range ids {
			if _, placed := placementOf(t, p2, id); placed {
				return false
			}
		}
		return true
	})

	// Both pinboards, both orders, every id at once (P1's cached routes
	// last a lease at most).
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, id := range ids {
		first, second := [2]string{"P1", p1.public}, [2]string{"P2", p2.public}
		if i%2 == 1 {
			first, second = second, first
		}
		wg.Go(func() {
			var got []answer
			for _, pb := range [][2]string{first, second, second, first} {
				for _, m := range []string{"GET", "POST"} {
					got = append(got, ask(pb[0], pb[1], m, id))
				}
			}
			mu.Lock()
			answers[id] = append(answers[id], got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	link.Stall(false, false)

	// The verdict, id by id.
	var doubles, lost, badP1 []string
	moved := 0
	p1Answers := map[string]int{}
	for _, id := range ids {
		final := ask("P2", p2.public, "GET", id)
		if !final.ok() {
			t.Fatalf("final read of %s through P2: %v", id, final)
		}
		after := answers[id][2:]
		instances := map[string][]string{}
		for _, an := range after {
			if an.ok() {
				instances[an.state.Instance] = append(instances[an.state.Instance], an.via)
			}
			if an.via != "P1" {
				continue
			}
			p1Answers[cmp.Or(an.reason, strconv.Itoa(an.status))]++
			switch {
			case an.err == nil && an.status == 503 && an.retryAfter:
			case an.ok() && an.state.Instance == final.state.Instance:
			default:
				badP1 = append(badP1, fmt.Sprintf("%s: %v (the current instance is %s)", id, an, final.state.Instance))
			}
		}
		if len(instances) > 1 {
			var who []string
			for _, inst := range slices.Sorted(maps.Keys(instances)) {
				who = append(who, fmt.Sprintf("%s via %s", inst, strings.Join(slices.Compact(slices.Sorted(slices.Values(instances[inst]))), "+")))
			}
			doubles = append(doubles, fmt.Sprintf("%s: %d instances answered (%s)\n      %s", id, len(instances), strings.Join(who, "; "), timeline(after)))
		}
		// Acknowledged increments: since the move without -persist (a new
		// instance starts at 0), since the start with it.
		scope := after
		if persist {
			scope = answers[id]
		}
		var counts []int64
		for _, an := range scope {
			if an.ackedIncr() {
				counts = append(counts, an.state.Count)
			}
		}
		slices.Sort(counts)
		have := final.state.Count
		if persist {
			v, _, err := fence.Get(context.Background(), redistest.Client(t, app.URL), "counter:"+id)
			if err != nil {
				t.Fatal(err)
			}
			stored, _ := strconv.ParseInt(v, 10, 64)
			have = min(have, stored)
		}
		if n := len(counts); n > 0 && (len(slices.Compact(slices.Clone(counts))) < n || have < max(int64(n), counts[n-1])) {
			lost = append(lost, fmt.Sprintf("%s: acknowledged counts %v, final count %d\n      %s", id, counts, have, timeline(after)))
		}
		if p, ok := placementOf(t, p2, id); ok && p.SessionID != before[id].SessionID {
			moved++
		}
	}
	// P1's cached routes must have reached the old holders, or the test
	// proved nothing: either answered (2xx) or refused by the stale-route
	// fence (pinned_stale_routes_total of the workers).
	refusedStale := staleRoutesCount(t, a) + staleRoutesCount(t, b)
	t.Logf("%s, persist %v: %d of %d ids moved to the other worker; P1 answered %v after the move; the workers refused %d stale routes",
		move, persist, moved, staleIDs, p1Answers, refusedStale)
	if refusedStale+int64(p1Answers["200"]) == 0 {
		t.Errorf("P1's cached routes reached no worker after the move (all its answers came from its store path): the scenario did not happen")
	}
	if len(doubles) > 0 {
		t.Errorf("%d of %d ids had two live instances answering:\n  %s", len(doubles), staleIDs, firstFew(doubles))
	}
	if len(lost) > 0 {
		t.Errorf("%d ids lost acknowledged increments:\n  %s", len(lost), firstFew(lost))
	}
	if len(badP1) > 0 {
		t.Errorf("P1 answered %d requests neither 503 + Retry-After nor from the current instance:\n  %s", len(badP1), firstFew(badP1))
	}
	if moved == 0 {
		t.Fatalf("no id moved to the other worker: the scenario did not happen")
	}
}

// staleRoutesCount reads pinned_stale_routes_total of the counter's /counter
// namespace from its admin listener (0 when the family is absent).
func staleRoutesCount(t *testing.T, c *counter) int64 {
	t.Helper()
	const series = `pinned_stale_routes_total{namespace="/counter"} `
	for _, line := range strings.Split(scrape(t, "http://"+c.admin+"/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, series); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", series, line, err)
			}
			return n
		}
	}
	return 0
}

// firstFew joins the first examples of a failure, one a line, and says
// how many more there are.
func firstFew(lines []string) string {
	const few = 4
	if len(lines) <= few {
		return strings.Join(lines, "\n  ")
	}
	return strings.Join(lines[:few], "\n  ") + fmt.Sprintf("\n  (and %d more)", len(lines)-few)
}

// timeline renders answers in order, one line.
func timeline(as []answer) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, " | ")
}
