package chaos

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/chaoscheck"
	"github.com/pinned-go/pinned/internal/testkit/history"
)

// Nemesis kinds (history.Event.Nemesis). pause and kill-pinboard are the
// ones the checker interprets (chaoscheck.Nemesis*).
const (
	nemKillWorker   = "kill-worker"
	nemPause        = chaoscheck.NemesisPause
	nemRedisRestart = "redis-restart"
	nemKillPinboard = chaoscheck.NemesisKillPinboard
	nemDrain        = "drain-worker"
	nemPartition    = "control-latency+cut"
	// The store path (pinboard → redis-server, through the harness's
	// proxies): latency on the replies, a pinboard cut off from Redis while
	// the other keeps working, and latency across a worker's death or
	// drain (the placement races: two pinboards replacing or claiming the
	// same ids while the replies are slow).
	nemRedisLatency   = "redis-latency"
	nemRedisPartition = "redis-partition"
	nemLatencyKill    = "redis-latency+kill-2-workers"
	nemLatencyDrain   = "redis-latency+drain-worker"
	// Stale routes (stale_test.go): one pinboard's link to Redis frozen
	// (silent, not closed), or its replies and invalidations late, while
	// placements move through the other pinboard,
	nemFreeze    = "redis-freeze+move"
	nemSlowInval = "redis-slow-invalidations+move"
	// and their counterpart on the control path: releases held in the
	// network and delivered after their senders gave up.
	nemLateRelease = "late-releases+move"
)

// allNemeses is the order of the short mode: one of each.
var allNemeses = []string{nemPause, nemKillWorker, nemRedisRestart, nemKillPinboard, nemDrain, nemPartition,
	nemRedisLatency, nemRedisPartition, nemLatencyKill, nemLatencyDrain, nemFreeze, nemSlowInval, nemLateRelease}

// maySkip are the nemeses that may legitimately be skipped (recorded
// "skipped: ..."): a drain the registry refuses because the worker has no
// live session (right after a Redis restart). Any other skip, or more than
// maxSkipped of these, fails TestChaos.
var maySkip = map[string]bool{nemDrain: true, nemLatencyDrain: true}

// maxSkipped bounds the skipped rounds of a run of n rounds.
func maxSkipped(n int) int { return max(1, n/10) }

// round is one nemesis as it ran.
type round struct {
	kind    string
	label   string // the kind, with its parameters and outcome
	skipped string // why nothing was done ("" when the fault happened)
	kills   []kill // the worker processes it killed -9 (recovery_test.go)
}

// storeFault is how long the store-path faults last.
const storeFault = 8 * time.Second

// redisDelay draws the reply latency of a store-path nemesis: 50–500 ms.
func redisDelay(rng *rand.Rand) time.Duration {
	return 50*time.Millisecond + time.Duration(rng.Int64N(int64(450*time.Millisecond)+1)).Round(time.Millisecond)
}

// pauses are the SIGSTOP durations drawn from.
var pauses = []time.Duration{2 * time.Second, 4 * time.Second, 6 * time.Second, 9 * time.Second, 12 * time.Second, 30 * time.Second}

// nemesis runs one fault of the given kind against a random target and
// returns when the system has been repaired (processes restarted and
// ready, signals undone, paths healed). It returns the round: a label for
// the schedule (the kind, with the pause's duration and what happened) and
// why it was skipped, if it was.
func (c *cluster) nemesis(kind string, rng *rand.Rand, maxPause time.Duration) round {
	t := c.t
	e := history.Event{Kind: history.KindNemesis, Nemesis: kind, T: history.Now()}
	var kills []kill
	switch kind {
	case nemKillWorker:
		n := 1 + rng.IntN(3)
		e.Target = c.worker(n).proc
		kills = append(kills, c.killWorker(n))
	case nemPause:
		n := 1 + rng.IntN(3)
		var d time.Duration
		for d = maxPause + 1; d > maxPause; {
			d = pauses[rng.IntN(len(pauses))]
		}
		w := c.worker(n)
		e.Target = w.proc + fmt.Sprintf(" %v", d)
		if err := w.Signal(syscall.SIGSTOP); err != nil {
			t.Errorf("SIGSTOP %s: %v", w.proc, err)
		}
		e.T = history.Now()
		time.Sleep(d) // the fault itself: the process is frozen this long
		if err := w.Signal(syscall.SIGCONT); err != nil {
			t.Errorf("SIGCONT %s: %v", w.proc, err)
		}
		e.Target = w.proc // the checker matches pauses to the process
		e.Cause = d.String()
	case nemRedisRestart:
		e.Target = "redis"
		c.redis.Restart(t)
	case nemKillPinboard:
		n := 1 + rng.IntN(2)
		e.Target = fmt.Sprintf("pb%d", n)
		c.killPinboard(n)
	case nemDrain:
		n := 1 + rng.IntN(3)
		e.Target = c.worker(n).proc
		e.Cause = c.drainWorker(n)
	case nemRedisLatency:
		d := redisDelay(rng)
		pbs := []int{1, 2}
		if k := rng.IntN(3); k < 2 {
			pbs = pbs[k : k+1] // one pinboard, or both
		}
		e.Target, e.Cause = pbNames(pbs), d.String()
		c.storeDelay(pbs, d)
		time.Sleep(storeFault)
		c.storeDelay(pbs, 0)
	case nemRedisPartition:
		n := 1 + rng.IntN(2)
		e.Target = fmt.Sprintf("pb%d", n)
		c.rproxys[n-1].SetCut(true) // the other pinboard keeps its store
		time.Sleep(storeFault)
		c.rproxys[n-1].SetCut(false)
	case nemLatencyKill, nemLatencyDrain:
		// Slow replies on both pinboards while workers' ids move, and
		// bursts of requests for every id through both pinboards at once
		// (storm), so that both re-place the same ids at the same moment:
		// kill two workers (restarted at once: two fresh sessions with the
		// same room, so the pinboards' choices for an id differ as often
		// as not) whose sessions a death probe ends (the new process at the
		// address does not know the old secret) or, failing that, expire;
		// or drain one (it releases its ids, then deregisters). The latency
		// and the bursts last past the dead sessions' lease.
		d := 100*time.Millisecond + time.Duration(rng.Int64N(int64(200*time.Millisecond)+1)).Round(time.Millisecond)
		c.storeDelay([]int{1, 2}, d)
		start := time.Now()
		if kind == nemLatencyKill {
			a := 1 + rng.IntN(3)
			b := 1 + (a+rng.IntN(2))%3 // another one
			e.Target, e.Cause = c.worker(a).proc+"+"+c.worker(b).proc, d.String()
			kills = append(kills, c.killWorker(a), c.killWorker(b))
		} else {
			n := 1 + rng.IntN(3)
			e.Target, e.Cause = c.worker(n).proc, d.String()
			if why := c.drainWorker(n); why != "" {
				e.Cause += " " + why
			}
		}
		c.mu.Lock()
		storm := c.storm
		c.mu.Unlock()
		if end := start.Add(lease + 2*time.Second); storm != nil {
			storm(end)
		} else {
			time.Sleep(time.Until(end))
		}
		c.storeDelay([]int{1, 2}, 0)
	case nemFreeze, nemSlowInval, nemLateRelease:
		c.staleRoutes(kind, rng, &e)
	case nemPartition:
		n := 1 + rng.IntN(3)
		px := c.proxys[n-1]
		e.Target = c.worker(n).proc
		// 1.5 s round trip on the control path, long enough for two
		// heartbeats (3 s apart) to be acked through it: the last ack
		// before the cut arrives 1.5 s after its send.
		px.SetDelay(750 * time.Millisecond)
		time.Sleep(8 * time.Second)
		px.SetCut(true) // the lease runs out 5 s after the last acked send
		time.Sleep(9 * time.Second)
		px.SetCut(false)
		px.SetDelay(0)
	default:
		t.Fatalf("unknown nemesis %q", kind)
	}
	e.End = history.Now()
	c.hist.Write(e)
	r := round{kind: kind, label: kind, kills: kills}
	if e.Cause != "" {
		r.label += " " + e.Cause
	}
	if i := strings.Index(e.Cause, "skipped: "); i >= 0 {
		r.skipped = e.Cause[i+len("skipped: "):]
	}
	return r
}

// pbNames names pinboards for a nemesis target: "pb1", "pb1+pb2".
func pbNames(ns []int) string {
	var s []string
	for _, n := range ns {
		s = append(s, fmt.Sprintf("pb%d", n))
	}
	return strings.Join(s, "+")
}

// storeDelay sets the latency of Redis's replies to pinboards ns.
func (c *cluster) storeDelay(ns []int, d time.Duration) {
	for _, n := range ns {
		c.rproxys[n-1].SetDelays(0, d)
	}
}

// drainWorker drains worker n (a drain pushed through /registry/push, then
// SIGTERM and a restart). When the push cannot be queued (the worker has
// no live session, right after a Redis restart; or the store refuses) it
// is retried for drainRetry, then the nemesis is skipped: nothing is done
// to the worker, and the reason, returned as "skipped: ...", is recorded.
func (c *cluster) drainWorker(n int) (skipped string) { return c.drainWorkerVia(n, home(n)) }

// home is the pinboard (1-based) worker n registers and heartbeats through.
func home(n int) int { return 1 + (n-1)%2 }

// drainWorkerVia is drainWorker with the push sent through pinboard pb.
func (c *cluster) drainWorkerVia(n, pb int) (skipped string) {
	w := c.worker(n)
	if why := c.pushDrain(w, pb); why != "" {
		c.t.Logf("drain of %s skipped: %s", w.proc, why)
		return "skipped: " + why
	}
	time.Sleep(2 * time.Second) // let the drain reach the worker in an ack and act
	c.terminateWorker(n)
	return ""
}

// drainRetry bounds how long pushDrain retries a refused push: past a
// lease, a worker that had no session has registered again.
const drainRetry = lease + 5*time.Second

// pushDrain queues a drain for w through pinboard pb's registry, retrying
// every half second for c.drainRetry (drainRetry when zero). It returns why
// it could not, or "".
func (c *cluster) pushDrain(w *workerProc, pb int) string {
	if w.clientID == "" {
		return "clientId unknown (no registration line in its log)"
	}
	deadline := time.Now().Add(cmp.Or(c.drainRetry, drainRetry))
	for {
		c.mu.Lock()
		addr := c.pbs[pb-1].addr
		c.mu.Unlock()
		why := push(addr, w.clientID)
		if why == "" {
			return ""
		}
		if time.Now().After(deadline) {
			return why
		}
		time.Sleep(500 * time.Millisecond) // the registry answers again once the worker registered or the store is back
	}
}

// push sends one POST /registry/push of a drain for clientID to the
// pinboard at addr and returns what went wrong, or "".
func push(addr, clientID string) string {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + wire.PathPush)
	req.Header.SetMethod("POST")
	req.Header.Set("Authorization", "Bearer "+token)
	req.SetBodyString(fmt.Sprintf(`{"clientId":%q,"type":"drain"}`, clientID))
	if err := fasthttp.DoTimeout(req, resp, 5*time.Second); err != nil {
		return err.Error()
	}
	if resp.StatusCode() != 202 {
		return fmt.Sprintf("%d %s", resp.StatusCode(), resp.Body())
	}
	return ""
}
