package chaos

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/history"
	"github.com/pinned-go/pinned/internal/testkit/chaoscheck"
	"github.com/pinned-go/pinned/internal/wire"
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
)

// allNemeses is the order of the short mode: one of each.
var allNemeses = []string{nemPause, nemKillWorker, nemRedisRestart, nemKillPinboard, nemDrain, nemPartition}

// pauses are the SIGSTOP durations drawn from.
var pauses = []time.Duration{2 * time.Second, 4 * time.Second, 6 * time.Second, 9 * time.Second, 12 * time.Second, 30 * time.Second}

// nemesis runs one fault of the given kind against a random target and
// returns when the system has been repaired (processes restarted and
// ready, signals undone, paths healed). It returns a label for the
// schedule (the kind, with the pause's duration).
func (c *cluster) nemesis(kind string, rng *rand.Rand, maxPause time.Duration) string {
	t := c.t
	e := history.Event{Kind: history.KindNemesis, Nemesis: kind, T: history.Now()}
	switch kind {
	case nemKillWorker:
		n := 1 + rng.IntN(3)
		e.Target = c.worker(n).proc
		c.killWorker(n)
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
		w := c.worker(n)
		e.Target = w.proc
		c.pushDrain(w)
		time.Sleep(2 * time.Second) // let the drain reach the worker in an ack and act
		c.terminateWorker(n)
	case nemPartition:
		n := 1 + rng.IntN(3)
		px := c.proxys[n-1]
		e.Target = c.worker(n).proc
		// 1.5 s round trip on the control path, long enough for two
		// heartbeats (3 s apart) to be acked through it: the last ack
		// before the cut arrives 1.5 s after its send.
		px.setDelay(750 * time.Millisecond)
		time.Sleep(8 * time.Second)
		px.setCut(true) // the lease runs out 5 s after the last acked send
		time.Sleep(9 * time.Second)
		px.setCut(false)
		px.setDelay(0)
	default:
		t.Fatalf("unknown nemesis %q", kind)
	}
	e.End = history.Now()
	c.hist.Write(e)
	if e.Cause != "" {
		return kind + " " + e.Cause
	}
	return kind
}

// pushDrain queues a drain for w through its pinboard's registry.
func (c *cluster) pushDrain(w *workerProc) {
	if w.clientID == "" {
		c.t.Errorf("%s: clientId unknown (no registration line in its log)", w.proc)
		return
	}
	c.mu.Lock()
	addr := c.pbs[(w.n-1)%2].addr
	c.mu.Unlock()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + wire.PathPush)
	req.Header.SetMethod("POST")
	req.Header.Set("Authorization", "Bearer "+token)
	req.SetBodyString(fmt.Sprintf(`{"clientId":%q,"type":"drain"}`, w.clientID))
	if err := fasthttp.DoTimeout(req, resp, 5*time.Second); err != nil || resp.StatusCode() != 202 {
		c.t.Errorf("push drain to %s = %v %d %s", w.proc, err, resp.StatusCode(), resp.Body())
	}
}
