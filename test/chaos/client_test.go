package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/history"
)

// clientTimeout bounds one request. It exceeds the longest pause (30 s)
// plus the proxy's retry, so a held request is answered, not abandoned.
const clientTimeout = 45 * time.Second

// loadClient is the closed-loop client: conc goroutines, each sending one
// request at a time for a random id through a random pinboard, logging
// every request.
type loadClient struct {
	c    *cluster
	ids  []string
	conc int
	hc   *fasthttp.Client
	// stormHC carries the storm's bursts: a connection per id and
	// pinboard, so a burst never waits for or fails on the loops' pool.
	stormHC *fasthttp.Client
	wg      sync.WaitGroup
	stop    context.CancelFunc

	ok, total atomic.Int64 // requests answered 2xx, and all
	storms    atomic.Int64 // storms done (names their fresh ids)
	alarms    atomic.Int64 // alarm names handed out (each alarm request sets a new one)

	mu     sync.Mutex
	hushed map[string]bool // ids the loops leave alone (hush)
}

// plainEvery: every plainEvery-th id (id000, id004, ...) gets only GET /
// and POST /incr, no background effect (incr-later, alarms), so that the
// checker's linearizability check covers it (chaoscheck, linear.go).
const plainEvery = 4

// plain reports whether the client's id number i is a plain one.
func plain(i int) bool { return i%plainEvery == 0 }

// plainIDs returns the plain ids.
func (lc *loadClient) plainIDs() []string {
	var out []string
	for i, id := range lc.ids {
		if plain(i) {
			out = append(out, id)
		}
	}
	return out
}

// hush makes the loops leave ids alone (so that their instances go idle)
// until unhush.
func (lc *loadClient) hush(ids []string) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for _, id := range ids {
		lc.hushed[id] = true
	}
}

// unhush ends every hush.
func (lc *loadClient) unhush() {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	clear(lc.hushed)
}

func (lc *loadClient) isHushed(id string) bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.hushed[id]
}

// waitWarm waits (bounded) until nearly every request of the last second
// succeeds: the ids are placed (a fresh Redis first keeps its restart
// fence) and the cluster is in its steady state.
func (lc *loadClient) waitWarm(t testing.TB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		ok0, n0 := lc.ok.Load(), lc.total.Load()
		time.Sleep(time.Second) // sampling the client's success rate over a second
		ok, n := lc.ok.Load()-ok0, lc.total.Load()-n0
		if n > 100 && ok*100 >= n*98 {
			return
		}
	}
	t.Fatalf("the cluster did not reach a steady state within %v", within)
}

func startClient(c *cluster, nIDs, conc int, seed uint64) *loadClient {
	ids := make([]string, nIDs)
	for i := range ids {
		ids[i] = fmt.Sprintf("id%03d", i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lc := &loadClient{c: c, ids: ids, conc: conc, stop: cancel, hushed: map[string]bool{}, hc: &fasthttp.Client{
		MaxIdemponentCallAttempts: 1, // never retry: every attempt is logged
		MaxConnsPerHost:           conc,
		ReadTimeout:               clientTimeout,
		WriteTimeout:              5 * time.Second,
		MaxIdleConnDuration:       5 * time.Second,
	}}
	lc.stormHC = &fasthttp.Client{
		MaxIdemponentCallAttempts: 1,
		MaxConnsPerHost:           nIDs + stormFresh,
		ReadTimeout:               clientTimeout,
		WriteTimeout:              5 * time.Second,
		MaxIdleConnDuration:       5 * time.Second,
	}
	c.mu.Lock()
	c.onPinboardRestart = func() { // idle connections to the killed process are dead
		lc.hc.CloseIdleConnections()
		lc.stormHC.CloseIdleConnections()
	}
	c.storm = lc.storm
	c.client = lc
	c.mu.Unlock()
	for g := range conc {
		lc.wg.Add(1)
		go lc.loop(ctx, rand.New(rand.NewPCG(seed, uint64(g))))
	}
	return lc
}

// close stops the loops and waits for requests in flight (bounded by the
// client timeout).
func (lc *loadClient) close() {
	lc.stop()
	lc.wg.Wait()
	lc.hc.CloseIdleConnections()
	lc.stormHC.CloseIdleConnections()
}

func (lc *loadClient) loop(ctx context.Context, rng *rand.Rand) {
	defer lc.wg.Done()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for ctx.Err() == nil {
		i := rng.IntN(len(lc.ids))
		id := lc.ids[i]
		if lc.isHushed(id) {
			continue
		}
		via := 1 + rng.IntN(2)
		lc.c.mu.Lock()
		addr := lc.c.pbs[via-1].addr
		lc.c.mu.Unlock()
		op, path := "POST", "/incr"
		switch x := rng.IntN(10); {
		case x < 2:
			op, path = "GET", "/"
		case x < 4 && plain(i):
			// A plain id: no background effect, its history stays checkable
			// for linearizability.
		case x < 3:
			path = "/incr-later?delay=2s"
		case x < 4:
			// A durable alarm with a name of its own: the checker matches
			// every 2xx to its run and counts duplicate runs.
			path = fmt.Sprintf("/alarm?delay=1s&name=c%d", lc.alarms.Add(1))
		}
		e := lc.send(lc.hc, req, resp, addr, op, path, id, via)
		if e.Err != "" || e.Status >= 500 {
			// Back off a little after a failure, as a real client would,
			// so a dead pinboard is not hammered in a tight loop.
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		} else {
			time.Sleep(2 * time.Millisecond) // think time: keeps 2 cores from saturating
		}
	}
}

// send makes one request for id through the pinboard at addr (number via)
// and logs it.
func (lc *loadClient) send(hc *fasthttp.Client, req *fasthttp.Request, resp *fasthttp.Response, addr, op, path, id string, via int) history.Event {
	req.Reset()
	resp.Reset()
	req.Header.SetMethod(op)
	req.SetRequestURI("http://" + addr + "/counter/" + id + path)
	e := history.Event{Kind: history.KindRequest, Op: op + " " + path, ID: id, Via: via, T: history.Now()}
	err := hc.DoTimeout(req, resp, clientTimeout)
	e.End = history.Now()
	if err != nil {
		e.Err = errClass(err)
	} else {
		e.Status = resp.StatusCode()
		e.Reason = string(resp.Header.Peek(wire.HeaderReason))
		e.RetryAfter = len(resp.Header.Peek(wire.HeaderRetryAfter)) > 0
		if (path == "/incr" || path == "/") && e.Status/100 == 2 {
			// The counter's state: the count, the instance that answered
			// and its epoch (for the linearizability check).
			var b struct {
				Count    int64
				Instance string
				Epoch    uint64
			}
			_ = json.Unmarshal(resp.Body(), &b) // no count: 0, which the checker refuses
			e.Count, e.Inst, e.Epoch = b.Count, b.Instance, b.Epoch
		}
	}
	lc.c.hist.Write(e)
	lc.total.Add(1)
	if e.Status >= 200 && e.Status < 300 {
		lc.ok.Add(1)
	}
	return e
}

// stormEvery is the period of storm's bursts; stormFresh is how many new
// ids each burst adds.
const (
	stormEvery = 250 * time.Millisecond
	stormFresh = 16
)

// storm sends, every stormEvery until the deadline, one GET for every id,
// and for stormFresh ids never used before, through each pinboard at once
// (each burst waited for): both pinboards resolve the same ids at the same
// moment, re-placing moved ones and placing new ones, the races a slow
// store widens. Bounded by the deadline and the client timeout.
func (lc *loadClient) storm(until time.Time) {
	for burst := 0; time.Now().Before(until); burst++ {
		next := time.Now().Add(stormEvery)
		ids := slices.Clone(lc.ids)
		for k := range stormFresh {
			ids = append(ids, fmt.Sprintf("s%d-%d-%d", lc.storms.Load(), burst, k))
		}
		var wg sync.WaitGroup
		for _, id := range ids {
			for via := 1; via <= 2; via++ {
				lc.c.mu.Lock()
				addr := lc.c.pbs[via-1].addr
				lc.c.mu.Unlock()
				wg.Go(func() {
					req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
					defer fasthttp.ReleaseRequest(req)
					defer fasthttp.ReleaseResponse(resp)
					lc.send(lc.stormHC, req, resp, addr, "GET", "/", id, via)
				})
			}
		}
		wg.Wait()
		time.Sleep(time.Until(next)) // the burst period
	}
	lc.storms.Add(1)
}

func errClass(err error) string {
	switch {
	case errors.Is(err, fasthttp.ErrTimeout):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, fasthttp.ErrConnectionClosed), strings.Contains(err.Error(), "EOF"),
		strings.Contains(err.Error(), "broken pipe"):
		return "reset"
	default:
		return "other: " + err.Error()
	}
}

// askBoth asks every id through both pinboards (askOne), first then other
// for the ids at even positions and the other way round for the rest. Each
// id runs on its own goroutine; askBoth waits for them (bounded by the
// client timeout).
func (lc *loadClient) askBoth(ids []string, first, other int) {
	var wg sync.WaitGroup
	for i, id := range ids {
		a, b := first, other
		if i%2 == 1 {
			a, b = b, a
		}
		wg.Go(func() { lc.askOne(id, a, b) })
	}
	wg.Wait()
}

// askOne asks id through pinboard first, then other, then other and first
// again (both orders): GET / and POST /incr each time, logged like every
// request.
func (lc *loadClient) askOne(id string, first, other int) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for _, via := range []int{first, other, other, first} {
		lc.c.mu.Lock()
		addr := lc.c.pbs[via-1].addr
		lc.c.mu.Unlock()
		lc.send(lc.stormHC, req, resp, addr, "GET", "/", id, via)
		lc.send(lc.stormHC, req, resp, addr, "POST", "/incr", id, via)
	}
}
