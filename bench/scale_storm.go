package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// The storm's client: stormClients requests at a time, each id retried
// until it is served, waiting what Retry-After says but at most
// stormMaxWait between tries (so that the time to recover is resolved
// finer than Retry-After's whole seconds).
const (
	stormClients = 64
	stormMaxWait = 250 * time.Millisecond
)

// Variants of S5: the pinboard's PINBOARD_FAST_FAILOVER.
const (
	leaseOnly    = "lease-only"
	fastFailover = "fast failover"
)

// scaleStormRow runs S5: at each point n ids are placed on one counter
// worker, a second one registers, the first is killed (SIGKILL), and a
// client asks for every one of the n ids until it is served again; once
// with fast failover off and once on.
func (s *session) scaleStormRow(ctx context.Context) ([]scaleReport, error) {
	pts, err := s.measurePoints("S5", "S5", []string{leaseOnly, fastFailover}, func(n int, variant string) (scalePoint, error) {
		return s.scaleStorm(ctx, n, variant == fastFailover, false)
	})
	if err != nil {
		return nil, err
	}
	return []scaleReport{s.stormReport("S5", pts)}, nil
}

// stormReport is S5's section (and the shape of S7's S5 part).
func (s *session) stormReport(id string, pts []scalePoint) scaleReport {
	r := scaleReport{row: id, pts: pts,
		about: fmt.Sprintf("One pinboard on Redis; worker A (a counter) takes n new ids (closed loop through the pinboard), then worker B "+
			"registers, then A is killed with SIGKILL. At once a client asks for each of the n ids (GET /counter/{id}/ through the "+
			"pinboard, %d at a time, in order), retrying each until it is answered 200: after a 503 it waits what Retry-After says, "+
			"but at most %v; after another answer or a transport error, %v. *time to p %%* is from the kill until p %% of the n ids "+
			"were served again. *lease-only*: `PINBOARD_FAST_FAILOVER=off` (A's ids move when its session expires in Redis, up to a "+
			"lease after its last heartbeat); *fast failover*: on (the pinboard probes A's address, finds it refused, ends the session). "+
			"*Redis peak* is the busiest 100 ms of `total_commands_processed` during the storm; *503s* are all of them, every retry "+
			"counted. One run per point and configuration.", stormClients, stormMaxWait, stormMaxWait),
		cols: []scaleColumn{{"placed", "ids on A", 0}, {"time to 50% s", "time to 50 % s", 2}, {"time to 99% s", "time to 99 % s", 2},
			{"time to 100% s", "time to 100 % s", 2}, {"503s", "503s", 0}, {"503s/id", "503s per id", 2}, {"errors", "other errors", 0},
			{"unserved", "never served", 0}, {"redis peak ops/s", "Redis peak ops/s", 0}, {"redis cmds/id", "Redis commands/id", 1},
			{"redis cpu s", "Redis CPU s", 2}, {"pinboard cpu s", "pinboard CPU s", 2}, {"death probes", "death probes (dead)", 0},
			{"fast failovers", "fast failovers", 0}, {"replaces", "replaces", 0}},
		plots: []scalePlot{
			{name: "recovery", title: "time until 99 % of the ids are served again", yLabel: "seconds", keys: []string{"time to 99% s"}},
			{name: "redis", title: "Redis peak ops/s during the storm", yLabel: "commands/s", keys: []string{"redis peak ops/s"}, logY: true},
			{name: "503s", title: "503s per id", yLabel: "503s per id", keys: []string{"503s/id"}},
		},
	}
	for _, vr := range []string{leaseOnly, fastFailover} {
		if p, ok := largest(pts, vr, "time to 99% s"); ok {
			r.verdicts = append(r.verdicts, fmt.Sprintf("%s, %d ids: 99 %% served again %s s after the kill, %s 503s, Redis peak %s ops/s",
				vr, p.x, fmtNum(p.get("time to 99% s"), 2), fmtNum(p.get("503s"), 0), fmtNum(p.get("redis peak ops/s"), 0)))
		}
	}
	return r
}

// scaleStorm measures one point of S5 (and of S7's S5 part, on a cluster
// when cluster is set).
func (s *session) scaleStorm(ctx context.Context, n int, fast, cluster bool) (scalePoint, error) {
	p := scalePoint{x: n, v: map[string]float64{}}
	mode := "off"
	if fast {
		mode = "on"
	}
	const idPrefix, runID = "s", "torm"
	sr, a, b, f, err := s.handover(ctx, "S5", n, cluster, idPrefix, runID, "PINBOARD_FAST_FAILOVER="+mode)
	if err != nil {
		return p, err
	}
	defer sr.close()
	pb := sr.pb()
	s0, err := sr.snap()
	if err != nil {
		return p, err
	}
	cpu := snapshotCPU(pb, b)
	sampler := sampleRedis(sr.redis, 100*time.Millisecond)
	killed := time.Now()
	a.Kill()
	// A storm ends long before this bound: a lease (the ids' wait in
	// lease-only mode) plus the ids at 500 a second plus a minute.
	bound := killed.Add(2*10*time.Second + time.Duration(n)*2*time.Millisecond + time.Minute)
	res := storm(ctx, "http://"+pb.addr, fillIDs(idPrefix, runID), n, killed, bound)
	peak := sampler.end()
	since := cpu.since()
	s1, err := sr.snap()
	if err != nil {
		return p, err
	}
	if err := ctx.Err(); err != nil {
		return p, err
	}
	v, placed := p.v, float64(f.placed)
	v["placed"] = placed
	for _, q := range []float64{50, 99, 100} {
		v[fmt.Sprintf("time to %g%% s", q)] = res.timeTo(q/100, int(f.placed))
	}
	var shed int64
	for _, c := range res.shed {
		shed += c
	}
	v["503s"], v["503s/id"], v["errors"], v["unserved"] = float64(shed), perOrNaN(float64(shed), placed), float64(res.other), float64(n-len(res.served))
	v["redis peak ops/s"] = peak
	d := s0.redis.to(s1.redis)
	v["redis cmds/id"] = perOrNaN(float64(d.commands), placed)
	v["redis cpu s"], v["pinboard cpu s"] = d.cpu, since[pb]
	v["death probes"] = s0.diff(s1, `pinned_placement_death_probes_total{result="dead"}`)
	v["fast failovers"] = s0.diff(s1, "pinned_placement_fast_failovers_total")
	v["replaces"] = s0.diff(s1, `pinned_placement_replaces_total{result="won"}`)
	if len(res.served) < n {
		s.note("S5 at %d ids (fast failover %s): %d ids not served again within %v of the kill", n, mode, n-len(res.served), bound.Sub(killed).Round(time.Second))
	}
	s.logf("  %d ids, fast failover %s: 99%% served in %.2f s, %d 503s (%v), Redis peak %.0f ops/s", n, mode, v["time to 99% s"], shed, res.shed, peak)
	return p, nil
}

// stormResult is what the storm's client saw.
type stormResult struct {
	mu     sync.Mutex       // guards the fields below while the clients run
	served []time.Duration  // per id served, from the kill to its first 200, sorted
	shed   map[string]int64 // 503 answers by X-Pinned-Reason
	other  int64            // other statuses and transport errors
}

// timeTo returns the time from the kill until the fraction q of placed ids
// were served (NaN when fewer were).
func (r *stormResult) timeTo(q float64, placed int) float64 {
	k := int(math.Ceil(q * float64(placed)))
	if placed == 0 || k > len(r.served) || k < 1 {
		return math.NaN()
	}
	return r.served[k-1].Seconds()
}

// storm asks for ids <prefix>0 … <prefix>(n-1) through the pinboard at
// base, stormClients at a time, each until it is served or until passes,
// and returns when every id was served or until passed.
func storm(ctx context.Context, base, prefix string, n int, killed, until time.Time) *stormResult {
	r := &stormResult{shed: map[string]int64{}}
	client := &fasthttp.Client{MaxConnsPerHost: 2 * stormClients, NoDefaultUserAgentHeader: true}
	defer client.CloseIdleConnections()
	var next atomic.Int64 // the next id to ask for
	var wg sync.WaitGroup
	for range stormClients {
		wg.Go(func() { // owned by storm: each ends when the ids run out or until passes
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			for k := next.Add(1) - 1; k < int64(n); k = next.Add(1) - 1 {
				req.SetRequestURI(base + "/counter/" + prefix + strconv.FormatInt(k, 10) + "/")
				for ctx.Err() == nil && time.Now().Before(until) {
					err := client.DoTimeout(req, resp, 10*time.Second)
					if err == nil && resp.StatusCode() == 200 {
						r.mu.Lock()
						r.served = append(r.served, time.Since(killed))
						r.mu.Unlock()
						break
					}
					wait := stormMaxWait
					r.mu.Lock()
					if err == nil && resp.StatusCode() == 503 {
						r.shed[string(resp.Header.Peek(wire.HeaderReason))]++
						if sec, perr := strconv.Atoi(string(resp.Header.Peek(wire.HeaderRetryAfter))); perr == nil && sec > 0 {
							wait = min(wait, time.Duration(sec)*time.Second)
						}
					} else {
						r.other++
					}
					r.mu.Unlock()
					if sleepCtx(ctx, min(wait, time.Until(until))) != nil {
						return
					}
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(r.served)
	return r
}
