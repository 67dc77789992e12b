package bench

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// counterShutdownTimeout is the counter's default -shutdown-timeout, which
// S8's workers run with.
const counterShutdownTimeout = 10 * time.Second

// replaceSample bounds how many of a drained worker's ids S8 asks for
// again to check that they are re-placed.
const replaceSample = 1000

// scaleDrainRow runs S8: at each point n ids are placed on one counter
// worker, a second one registers, and the first gets SIGTERM.
func (s *session) scaleDrainRow(ctx context.Context) ([]scaleReport, error) {
	pts, err := s.measurePoints("S8", "S8", []string{""}, func(n int, _ string) (scalePoint, error) { return s.scaleDrain(ctx, n) })
	if err != nil {
		return nil, err
	}
	r := scaleReport{row: "S8", pts: pts,
		about: fmt.Sprintf("One pinboard on Redis; worker A (a counter with its default `-shutdown-timeout` of %v) takes n new ids, worker B "+
			"registers, then A gets SIGTERM: it winds down (new ids 503 `draining`, idle instances close; their releases are queued and "+
			"sent in batches of `POST /registry/releases` meanwhile, then the final heartbeat and the deregistration, which frees what is "+
			"still placed; at the deadline what is left is aborted and the session ends with its lease). *held at SIGTERM* and *A's "+
			"leases lost in the fill* are A's own `pinned_instances` and `pinned_lease_lost_total` just before the SIGTERM: a worker that "+
			"lost its lease during the fill fenced itself, and that point does not measure a shutdown of n idle instances. The bench polls the pinboard (`GET /registry/workers` and its `/metrics`) every 20 ms. "+
			"*released* counts `pinned_registry_releases_total{result=\"released\"}`; *all released* is when it reached n; *session gone* "+
			"when A's session left Redis (deregistered, or expired); *re-placeable* is the earlier of the two (after it every id of A "+
			"is placed anew on its next request; *session gone* waits for every session of A, so a session A lost and replaced during the "+
			"shutdown counts until it was deregistered too: *deregistered* is then 2). Then up to %d of A's ids are requested again (all must be served, by B). "+
			"*release calls/instance* is the registry's `pinned_registry_requests_total` of the endpoints `release` and `releases` (a batch) ÷ n "+
			"(1 = one round trip each); Redis commands are `INFO commandstats` from the SIGTERM to the end (B's heartbeats and the bench's polls "+
			"included). One run per point.", counterShutdownTimeout, replaceSample),
		cols: []scaleColumn{{"placed", "instances on A", 0}, {"held", "held at SIGTERM", 0}, {"leases lost", "A's leases lost in the fill", 0},
			{"exit s", "A exited after s", 2}, {"exit code", "exit status", 0},
			{"released", "released", 0}, {"all released s", "all released s", 2}, {"gone s", "session gone s", 2},
			{"replaceable s", "re-placeable s", 2}, {"deregistered", "deregistered", 0}, {"release calls/instance", "release calls/instance", 2},
			{"redis cmds/instance", "Redis commands/instance", 2}, {"replace errors", "ids not served again", 0}},
		plots: []scalePlot{
			{name: "time", title: "time until every id is re-placeable", yLabel: "seconds", keys: []string{"replaceable s", "exit s"}},
			{name: "calls", title: "release calls and Redis commands per instance", yLabel: "per instance", keys: []string{"release calls/instance", "redis cmds/instance"}},
		},
	}
	what := fmt.Sprintf("every id re-placeable within the shutdown timeout (%v) at 1 M (s)", counterShutdownTimeout)
	if p, ok := largest(pts, "", "replaceable s"); ok && (p.get("leases lost") > 0 || p.get("held") < p.get("placed")) {
		// A fenced itself during the fill: its shutdown had little to close.
		r.verdicts = append(r.verdicts, fmt.Sprintf("%s: **not measured** at %d: worker A lost its lease during the fill and held %s of %s instances at the SIGTERM",
			what, p.x, fmtNum(p.get("held"), 0), fmtNum(p.get("placed"), 0)))
	} else {
		r.verdicts = append(r.verdicts, verdictAtMost(pts, "", "replaceable s", what, counterShutdownTimeout.Seconds(), 1_000_000))
	}
	if p, ok := largest(pts, "", "release calls/instance"); ok {
		verdict := "**holds**: releases are batched"
		if p.get("release calls/instance") >= 0.5 {
			verdict = "**missed**: about one round trip per instance"
		}
		r.verdicts = append(r.verdicts, fmt.Sprintf("releases batched: %s release calls per instance at %d — %s", fmtNum(p.get("release calls/instance"), 2), p.x, verdict))
	}
	return []scaleReport{r}, nil
}

// scaleDrain measures one point of S8.
func (s *session) scaleDrain(ctx context.Context, n int) (scalePoint, error) {
	p := scalePoint{x: n, v: map[string]float64{}}
	const idPrefix, runID = "d", "rain"
	sr, a, _, f, err := s.handover(ctx, "S8", n, false, idPrefix, runID)
	if err != nil {
		return p, err
	}
	defer sr.close()
	pb := sr.pb()
	const (
		released = `pinned_registry_releases_total{result="released"}`
		calls    = `pinned_registry_requests_total{endpoint="release",code="200"}`
		batches  = `pinned_registry_requests_total{endpoint="releases",code="200"}`
		dereg    = `pinned_registry_deregistrations_total{result="deregistered"}`
	)
	s0, err := sr.snap()
	if err != nil {
		return p, err
	}
	// A's own view just before the SIGTERM: the instances it holds, and
	// whether it lost its lease during the fill (the machine saturated: it
	// then fenced itself and aborted what it held, and the point does not
	// measure a shutdown with n idle instances).
	am, err := metrics(a.admin)
	if err != nil {
		return p, err
	}
	held := metricValue(am, `pinned_instances{namespace="/counter"}`)
	lost := 0.0
	for _, r := range []string{"expired", "reregister", "superseded", "timing"} {
		lost += math.Max(0, metricValue(am, `pinned_lease_lost_total{reason="`+r+`"}`))
	}
	placed := float64(f.placed)
	v := p.v
	v["placed"] = placed
	v["held"], v["leases lost"] = held, lost
	if lost > 0 || held < placed {
		s.note("S8 at %d: worker A lost its lease %.0f times during the fill (the machine saturated) and held %.0f of the %.0f instances placed on it at the SIGTERM; this point does not measure a shutdown with that many idle instances", n, lost, held, placed)
	}
	for _, k := range []string{"exit s", "all released s", "gone s"} {
		v[k] = math.NaN()
	}
	start := time.Now()
	if err := a.Signal(syscall.SIGTERM); err != nil {
		return p, err
	}
	// A's shutdown is bounded by its timeout and its session by the lease
	// after that: both are over long before this bound.
	bound := counterShutdownTimeout + 2*10*time.Second + time.Minute
	err = poll(bound, "worker A exited and its session left Redis", func() bool {
		now := time.Since(start).Seconds()
		if math.IsNaN(v["exit s"]) && exited(a) {
			v["exit s"], v["exit code"] = now, float64(a.ExitCode())
		}
		if body, err := metrics(pb.admin); err == nil && math.IsNaN(v["all released s"]) && metricValue(body, released)-metricValue(s0.metrics, released) >= placed {
			v["all released s"] = now
		}
		if _, ok, err := sessionAt(pb.addr, a.addr); err == nil && !ok && math.IsNaN(v["gone s"]) {
			v["gone s"] = now
		}
		return !math.IsNaN(v["exit s"]) && !math.IsNaN(v["gone s"])
	})
	if err != nil {
		return p, err
	}
	s1, err := sr.snap()
	if err != nil {
		return p, err
	}
	v["released"] = s0.diff(s1, released)
	v["deregistered"] = s0.diff(s1, dereg)
	if v["deregistered"] > 1 {
		s.note("S8 at %d instances: A deregistered %.0f sessions: it lost its lease during the shutdown, aborted the instances it still held, registered again and deregistered the replaced session after the last one; A's log of its shutdown:\n\n```\n%s\n```", n, v["deregistered"], shutdownLog(a.Log()))
	} else if v["exit code"] == 0 && v["gone s"] > v["exit s"]+1 {
		// A exits after its deregistration: a session that outlives it
		// by more than a poll is worth the log of what A was told.
		s.note("S8 at %d instances: A's session left the registry %.1f s after A exited; A's log of its shutdown:\n\n```\n%s\n```", n, v["gone s"]-v["exit s"], shutdownLog(a.Log()))
	}
	if v["exit code"] != 0 {
		// The log says which step ran out (the teardowns, a lost lease).
		s.note("S8 at %d instances: worker A exited with status %.0f; its log of its shutdown:\n\n```\n%s\n```", n, v["exit code"], shutdownLog(a.Log()))
	}
	v["release calls/instance"] = perOrNaN(s0.diff(s1, calls)+s0.diff(s1, batches), placed)
	v["redis cmds/instance"] = perOrNaN(float64(s0.redis.to(s1.redis).commands), placed)
	v["replaceable s"] = math.Min(v["gone s"], v["all released s"])
	if math.IsNaN(v["all released s"]) {
		v["replaceable s"] = v["gone s"]
	}
	// Every id of A is placed anew on its next request.
	sample := min(n, replaceSample)
	rep, _, err := sr.runLoadgen(ctx, "replace", "-url", "http://"+pb.addr, "-path", "/counter/{id}/", "-dist", "uniform",
		"-id-prefix", fillIDs(idPrefix, runID), "-keys", strconv.Itoa(n), "-c", "16", "-requests", strconv.Itoa(sample), "-duration", "1m")
	if err != nil {
		return p, err
	}
	v["replace errors"] = float64(rep.Requests.Errors + rep.Requests.Unsent)
	if v["replace errors"] > 0 {
		s.note("S8 at %d instances: %.0f of %d ids not served again: errors %+v", n, v["replace errors"], sample, rep.Errors)
	}
	s.logf("  %d instances: A exited after %.2f s (status %.0f), %.0f released, re-placeable after %.2f s, %.2f release calls/instance",
		n, v["exit s"], v["exit code"], v["released"], v["replaceable s"], v["release calls/instance"])
	return p, nil
}

// shutdownLog is what a worker's log says about its shutdown and its
// lease: the lines of the steps and of the lease (a release's give-up is
// logged once per instance and would bury them), then the last line.
func shutdownLog(log string) string {
	var keep []string
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	for _, l := range lines {
		for _, k := range []string{"shutting down", "lease", "registered", "deregist", "closed idle", "aborted", "drain complete", "stopped", "failed"} {
			if strings.Contains(l, k) && !strings.Contains(l, "release gave up") && !strings.Contains(l, "release failed") {
				keep = append(keep, l)
				break
			}
		}
	}
	if len(keep) > 40 {
		keep = append(keep[:20:20], append([]string{"…"}, keep[len(keep)-20:]...)...)
	}
	return strings.Join(keep, "\n")
}
