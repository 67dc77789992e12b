package bench

import (
	"context"
	"fmt"
	"math"
)

// Variants of S7: the Redis the pinboard runs on.
const (
	singleNode = "one node"
	cluster3   = "cluster"
)

// scaleClusterRow runs S7: the points of S3 (cold placement over n
// simulated workers) and of S5 (the storm, fast failover on: the default)
// on one redis-server and on a local three-master Redis Cluster, the two
// alternated at every point, and the ratios cluster ÷ one node.
func (s *session) scaleClusterRow(ctx context.Context) ([]scaleReport, error) {
	backends := []string{singleNode, cluster3}
	fleet, err := s.measurePoints("S7 (S3)", "S3", backends, func(n int, variant string) (scalePoint, error) {
		return s.scaleFleet(ctx, n, variant == cluster3, true)
	})
	if err != nil {
		return nil, err
	}
	storms, err := s.measurePoints("S7 (S5)", "S5", backends, func(n int, variant string) (scalePoint, error) {
		return s.scaleStorm(ctx, n, true, variant == cluster3)
	})
	if err != nil {
		return nil, err
	}
	fr := s.fleetReport("S7", ratios(fleet, "cold placement p99 ms", "redis cmds/activation", "pinboard cpu us/heartbeat", "store miss mean ms"))
	fr.about = "**S3 on a Redis Cluster.** The same rigs as S3, once on one redis-server and once on a local three-master Redis Cluster " +
		"(three redis-servers with `--cluster-enabled yes`, the slots split in three, joined with `CLUSTER MEET`; the pinboard names all " +
		"three as seeds), alternated at every point. Redis commands and CPU are summed over the three nodes. *ratio* rows are cluster ÷ " +
		"one node at the same point. " + fr.about
	fr.plots = append(fr.plots, scalePlot{name: "ratio-placement", title: "cluster ÷ one node", yLabel: "ratio",
		keys: []string{"cold placement p99 ms ratio", "redis cmds/activation ratio"}})
	fr.cols = append(fr.cols, scaleColumn{"cold placement p99 ms ratio", "p99 ratio", 2}, scaleColumn{"store miss mean ms ratio", "store part mean ratio", 2},
		scaleColumn{"redis cmds/activation ratio", "commands ratio", 2})
	fr.verdicts = ratioVerdicts(fleet, "cold placement p99 ms", "redis cmds/activation")
	sr := s.stormReport("S7", ratios(storms, "time to 99% s", "redis peak ops/s", "redis cmds/id"))
	sr.about = "**S5 on a Redis Cluster** (fast failover on, the default): the storm of S5 once on one node and once on the cluster, " +
		"alternated at every point. " + sr.about
	sr.cols = append(sr.cols, scaleColumn{"time to 99% s ratio", "time to 99 % ratio", 2}, scaleColumn{"redis cmds/id ratio", "commands ratio", 2})
	sr.plots = append(sr.plots, scalePlot{name: "ratio-storm", title: "cluster ÷ one node", yLabel: "ratio", keys: []string{"time to 99% s ratio", "redis cmds/id ratio"}})
	sr.verdicts = ratioVerdicts(storms, "time to 99% s", "redis cmds/id")
	fr.dim, sr.dim = row("S3").dim, row("S5").dim
	for i := range fr.plots {
		fr.plots[i].name = "s3-" + fr.plots[i].name
	}
	for i := range sr.plots {
		sr.plots[i].name = "s5-" + sr.plots[i].name
	}
	return []scaleReport{fr, sr}, nil
}

// ratios adds, to every cluster point, "<key> ratio": its value ÷ the
// one-node point's at the same x.
func ratios(pts []scalePoint, keys ...string) []scalePoint {
	for _, p := range pts {
		if p.variant != cluster3 {
			continue
		}
		for _, q := range pts {
			if q.variant == singleNode && q.x == p.x {
				for _, k := range keys {
					p.v[k+" ratio"] = perOrNaN(p.get(k), q.get(k))
				}
			}
		}
	}
	return pts
}

// ratioVerdicts judges the ratios cluster ÷ one node against 1.5 at every
// point.
func ratioVerdicts(pts []scalePoint, keys ...string) []string {
	var out []string
	for _, k := range keys {
		worst, at := math.NaN(), 0
		for _, p := range pts {
			if r := p.get(k + " ratio"); !math.IsNaN(r) && (math.IsNaN(worst) || r > worst) {
				worst, at = r, p.x
			}
		}
		switch {
		case math.IsNaN(worst):
			out = append(out, k+", cluster ÷ one node: not measured")
		case worst <= 1.5:
			out = append(out, fmt.Sprintf("%s, cluster ÷ one node: at most %.2f (at %d) — **holds** (≤ 1.5)", k, worst, at))
		default:
			out = append(out, fmt.Sprintf("%s, cluster ÷ one node: up to %.2f (at %d) — **missed** (≤ 1.5)", k, worst, at))
		}
	}
	return out
}
