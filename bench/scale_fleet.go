package bench

import (
	"context"
	"fmt"
	"math"
	"time"
)

// placementProbeRate is the open-loop rate of new ids in S3 (and S7's S3
// part) and S6, per second; smoke mode uses a quarter.
const placementProbeRate = 500

// heartbeatRefusals are the pinboard's heartbeat answers that are not 200:
// a heartbeat the registry could not take (its challenge fetches at their
// cap, the store) or refused.
var heartbeatRefusals = []string{
	`pinned_registry_requests_total{endpoint="heartbeat",code="409"}`, `pinned_registry_requests_total{endpoint="heartbeat",code="429"}`,
	`pinned_registry_requests_total{endpoint="heartbeat",code="503"}`, `pinned_registry_requests_total{endpoint="heartbeat",code="other"}`,
}

// scaleFleetRows runs S3 and S4: at each point a pinboard on one
// redis-server with n simulated workers registered (test/app/simworkers),
// an idle window of heartbeats (S4, and S3's CPU per heartbeat), then the
// cold-placement probe (S3).
func (s *session) scaleFleetRows(ctx context.Context, s3, s4 bool) ([]scaleReport, error) {
	pts, err := s.measurePoints("S3/S4", "S3", []string{""}, func(n int, _ string) (scalePoint, error) { return s.scaleFleet(ctx, n, false, s3) })
	if err != nil {
		return nil, err
	}
	var out []scaleReport
	if s3 {
		out = append(out, s.fleetReport("S3", pts))
	}
	if s4 {
		out = append(out, scaleReport{row: "S4", pts: pts,
			about: fmt.Sprintf("The idle window of S3's rigs: n simulated workers heartbeating (every %v, each heartbeat with a challenge the "+
				"pinboard fetches from the worker on a fresh connection), no data-plane traffic, for %v after one heartbeat interval of "+
				"settling, after a window as long with no worker registered (the background: the pinboard's janitor and alarm "+
				"scheduler). Heartbeats are the pinboard's `pinned_registry_heartbeats_total`; Redis commands and CPU are `INFO commandstats` "+
				"and `INFO cpu` deltas; process CPU is utime+stime from /proc (the simulated workers are one process). *heartbeat p99* is the "+
				"pinboard's own handling time (`pinned_registry_request_duration_seconds{endpoint=\"heartbeat\"}`, a bucket's upper bound). "+
				"*refused* counts heartbeats answered other than 200 in the window. The figures per heartbeat are net of the background. The ceilings are linear extrapolations from the largest "+
				"point: the workers at which the heartbeats alone would take one core of the pinboard, or all of Redis's one thread.",
				heartbeatInterval, s.idleWindow()),
			cols: []scaleColumn{{"heartbeats/s", "heartbeats/s", 1}, {"heartbeat p99 ms", "heartbeat p99 ms", 1}, {"heartbeat refusals", "refused", 0},
				{"redis cmds/s", "Redis commands/s", 0}, {"background redis cmds/s", "… with no worker", 0}, {"redis cmds/heartbeat", "Redis commands/heartbeat", 2},
				{"redis cpu %", "Redis CPU % of a core", 1}, {"redis cpu us/heartbeat", "Redis CPU µs/heartbeat", 1},
				{"pinboard cpu %", "pinboard CPU % of a core", 1}, {"background pinboard cpu %", "… with no worker", 1},
				{"pinboard cpu us/heartbeat", "pinboard CPU µs/heartbeat", 1},
				{"workers cpu us/heartbeat", "simulated workers CPU µs/heartbeat", 1},
				{"pinboard ceiling workers", "pinboard ceiling (workers)", 0}, {"redis ceiling workers", "Redis ceiling (workers)", 0}},
			plots: []scalePlot{
				{name: "rates", title: "heartbeats/s and Redis commands/s", yLabel: "per second", keys: []string{"heartbeats/s", "redis cmds/s"}, logY: true},
				{name: "cpu", title: "CPU while idle", yLabel: "% of a core", keys: []string{"pinboard cpu %", "redis cpu %"}, logY: true},
			},
			verdicts: ceilingVerdicts(pts)})
	}
	return out, nil
}

// fleetReport is S3's section (and the shape of S7's S3 part).
func (s *session) fleetReport(id string, pts []scalePoint) scaleReport {
	r := scaleReport{row: id, pts: pts,
		about: fmt.Sprintf("One pinboard on Redis with n simulated workers (test/app/simworkers: real workers and hosts in one process, each on "+
			"its own listener, registered and heartbeating). *cold placement*: open loop at %d new ids/s through the pinboard "+
			"(every request places an id: power of two choices among the n workers, one claim in Redis, then the worker activates it), "+
			"%d runs of %v. *Redis commands per activation* are the `INFO commandstats` delta over the probe (every command, those a "+
			"script calls included) minus the idle window's rate "+
			"(heartbeats) over the same time, ÷ successful activations (*raw*: without subtracting). *store part mean* is the mean of "+
			"`pinned_placement_miss_duration_seconds` over the probe (its sum ÷ its count; its buckets are too coarse for a p99) (the resolver's store work per miss: reads, claim, index), "+
			"*cores busy* the machine's CPU over the probe (all processes, both cores). *pinboard CPU per heartbeat* is from "+
			"the idle window (S4).", s.probeRate(placementProbeRate), s.o.Rounds, s.o.Duration),
		cols: []scaleColumn{{"cold placement p99 ms", "cold placement p99 ms", 2}, {"cold placement p50 ms", "p50 ms", 2},
			{"cold placement lag p99 ms", "lag p99 ms", 2}, {"cold placement loadgen cpu us", "loadgen CPU µs/req", 1},
			{"redis cmds/activation", "Redis commands/activation", 2}, {"redis cmds/activation raw", "raw", 2},
			{"cold placement pinboard cpu us", "pinboard CPU µs/activation", 1}, {"pinboard cpu us/heartbeat", "pinboard CPU µs/heartbeat", 1},
			{"store miss mean ms", "store part mean ms", 2}, {"machine busy %", "cores busy %", 0},
			{"registration s", "registration of all s", 2}},
		plots: []scalePlot{
			{name: "placement", title: "cold placement p99", yLabel: "ms", keys: []string{"cold placement p99 ms"}},
			{name: "commands", title: "Redis commands per activation", yLabel: "commands", keys: []string{"redis cmds/activation"}},
			{name: "heartbeat-cpu", title: "pinboard CPU per heartbeat", yLabel: "µs", keys: []string{"pinboard cpu us/heartbeat"}},
		},
	}
	if id == "S3" {
		r.verdicts = []string{
			verdictFlat(pts, "", "cold placement p99 ms", "cold placement p99"),
			verdictFlat(pts, "", "redis cmds/activation", "Redis commands per activation"),
			verdictFlat(pts, "", "pinboard cpu us/heartbeat", "pinboard CPU per heartbeat"),
		}
	}
	return r
}

// ceilingVerdicts says where S4's ceilings are, from the largest point.
func ceilingVerdicts(pts []scalePoint) []string {
	p, ok := largest(pts, "", "pinboard cpu %")
	if !ok {
		return []string{"ceiling: not measured"}
	}
	return []string{
		fmt.Sprintf("at %d workers (%s heartbeats/s) the pinboard ran at %s %% of a core and Redis at %s %% of its thread, background "+
			"included; net of it, linearly, the heartbeats alone would take one pinboard core at about %s workers and Redis's thread at "+
			"about %s", p.x, fmtNum(p.get("heartbeats/s"), 1), fmtNum(p.get("pinboard cpu %"), 1), fmtNum(p.get("redis cpu %"), 1),
			fmtNum(p.get("pinboard ceiling workers"), 0), fmtNum(p.get("redis ceiling workers"), 0)),
		verdictFlat(pts, "", "pinboard cpu us/heartbeat", "pinboard CPU per heartbeat"),
		verdictFlat(pts, "", "redis cmds/heartbeat", "Redis commands per heartbeat"),
	}
}

// idleWindow is how long S4 watches the heartbeats: three heartbeat
// intervals (one and a bit in smoke mode).
func (s *session) idleWindow() time.Duration {
	if s.o.Smoke {
		return heartbeatInterval + 500*time.Millisecond
	}
	return 3 * heartbeatInterval
}

// scaleFleet measures one point of S3/S4 (and of S7's S3 part, on a
// cluster when cluster is set); place runs the cold-placement probe.
func (s *session) scaleFleet(ctx context.Context, n int, cluster, place bool) (scalePoint, error) {
	p := scalePoint{x: n, v: map[string]float64{}}
	sr, err := s.newScaleRig(cluster, 1)
	if err != nil {
		return p, err
	}
	defer sr.close()
	// The background first: the pinboard and Redis with no worker (the
	// janitor, the alarm scheduler's polls), to be told apart from the
	// heartbeats' cost.
	quiet, cpu, err := s.quietWindow(ctx, sr, sr.pb())
	if err != nil {
		return p, err
	}
	base := background{redis: quiet, pinboardCPU: cpu[sr.pb()]}
	start := time.Now()
	sim, err := sr.startSimworkers(n)
	if err != nil {
		return p, err
	}
	v := p.v
	v["registration s"] = time.Since(start).Seconds()
	if err := sleepCtx(ctx, heartbeatInterval); err != nil { // the registrations' burst passes: no event marks its end
		return p, err
	}
	idle, err := s.heartbeatWindow(ctx, sr, sim, n, base, v)
	if err != nil {
		return p, err
	}
	if !place {
		return p, nil
	}
	w := openLoop(fmt.Sprintf("S3-place-%d", n), s.probeRate(placementProbeRate), "-dist", "new")
	var raw, net, acts float64
	var xs []Sample
	// Where a placement's time goes: the resolver's own histogram of its
	// store work per miss, and how busy the machine's cores were.
	m0, err := metrics(sr.pb().admin)
	if err != nil {
		return p, err
	}
	busy0, total0, busyErr := machineTicks()
	for round := 1; round <= s.o.Rounds; round++ {
		r0, err := snapRedis(sr.redis)
		if err != nil {
			return p, err
		}
		smp, err := s.measure(ctx, sr.rig, w, target{name: "pinboard", url: "http://" + sr.pb().addr, proxy: sr.pb(), backend: sim, redis: sr.redis[0]}, round)
		if err != nil {
			return p, err
		}
		r1, err := snapRedis(sr.redis)
		if err != nil {
			return p, err
		}
		d := r0.to(r1)
		c, _ := d.net(idle)
		raw, net, acts = raw+float64(d.commands), net+c, acts+float64(smp.Sent-smp.Errors)
		xs = append(xs, smp)
		s.res.Samples = append(s.res.Samples, smp)
	}
	probeFigures(v, "cold placement", xs)
	v["redis cmds/activation"], v["redis cmds/activation raw"] = perOrNaN(net, acts), perOrNaN(raw, acts)
	m1, err := metrics(sr.pb().admin)
	if err != nil {
		return p, err
	}
	const miss = "pinned_placement_miss_duration_seconds"
	v["store miss mean ms"] = 1000 * perOrNaN(metricValue(m1, miss+"_sum")-metricValue(m0, miss+"_sum"),
		metricValue(m1, miss+"_count")-metricValue(m0, miss+"_count"))
	v["machine busy %"] = math.NaN()
	if busy1, total1, err := machineTicks(); busyErr == nil && err == nil && total1 > total0 {
		v["machine busy %"] = 100 * float64(busy1-busy0) / float64(total1-total0)
	}
	return p, nil
}

// background is what the pinboard and Redis do with no worker registered.
type background struct {
	redis       redisDelta
	pinboardCPU float64 // seconds over redis.secs
}

// heartbeatWindow watches n registered workers heartbeat with no other
// traffic for idleWindow and records S4's figures in v: totals, and per
// heartbeat net of base; it returns the window's Redis delta (the
// background of the probes).
func (s *session) heartbeatWindow(ctx context.Context, sr *scaleRig, sim *proc, n int, base background, v map[string]float64) (redisDelta, error) {
	pb := sr.pb()
	m0, err := metrics(pb.admin)
	if err != nil {
		return redisDelta{}, err
	}
	r0, err := snapRedis(sr.redis)
	if err != nil {
		return redisDelta{}, err
	}
	cpu := snapshotCPU(pb, sim)
	if err := sleepCtx(ctx, s.idleWindow()); err != nil {
		return redisDelta{}, err
	}
	since := cpu.since()
	r1, err := snapRedis(sr.redis)
	if err != nil {
		return redisDelta{}, err
	}
	m1, err := metrics(pb.admin)
	if err != nil {
		return redisDelta{}, err
	}
	d := r0.to(r1)
	hb := metricValue(m1, "pinned_registry_heartbeats_total") - metricValue(m0, "pinned_registry_heartbeats_total")
	var refused float64
	for _, series := range heartbeatRefusals {
		refused += metricValue(m1, series) - metricValue(m0, series)
	}
	pbCPU, simCPU := since[pb], since[sim]
	netCmds, redisCPU := d.net(base.redis)
	pbNet := math.Max(0, pbCPU-perOrNaN(base.pinboardCPU, base.redis.secs)*d.secs)
	const hist = "pinned_registry_request_duration_seconds"
	v["heartbeats/s"] = hb / d.secs
	v["heartbeat refusals"] = refused
	v["heartbeat p99 ms"] = 1000 * histQuantile(histBuckets(m0, hist, `endpoint="heartbeat"`), histBuckets(m1, hist, `endpoint="heartbeat"`), 0.99)
	v["redis cmds/s"] = float64(d.commands) / d.secs
	v["redis cpu %"] = 100 * d.cpu / d.secs
	v["pinboard cpu %"] = 100 * pbCPU / d.secs
	v["background redis cmds/s"] = float64(base.redis.commands) / base.redis.secs
	v["background pinboard cpu %"] = 100 * base.pinboardCPU / base.redis.secs
	v["redis cmds/heartbeat"] = perOrNaN(netCmds, hb)
	v["redis cpu us/heartbeat"] = perOrNaN(1e6*redisCPU, hb)
	v["pinboard cpu us/heartbeat"] = perOrNaN(1e6*pbNet, hb)
	v["workers cpu us/heartbeat"] = perOrNaN(1e6*simCPU, hb)
	// Where the heartbeats alone would take a whole core: the workers that
	// send hb/s cost pbNet/d.secs of the pinboard's.
	v["pinboard ceiling workers"] = perOrNaN(float64(n)*d.secs, pbNet)
	v["redis ceiling workers"] = perOrNaN(float64(n)*d.secs, redisCPU)
	s.logf("  %d workers: %.1f heartbeats/s, Redis %.0f commands/s %.1f%% CPU, pinboard %.1f%% CPU", n, v["heartbeats/s"], v["redis cmds/s"], v["redis cpu %"], v["pinboard cpu %"])
	return d, nil
}
