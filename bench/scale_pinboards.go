package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// trackedIDs are the ids every pinboard of S6 reads before they change
// (a tenth in smoke mode).
const trackedIDs = 2000

// invalidationSeries is a pinboard's count of placement invalidations
// applied: one per invalidation message about a placement.
const invalidationSeries = `pinned_placecache_invalidations_total{cache="placements"}`

// scalePinboardsRow runs S6: n pinboards on one redis-server and two
// counter workers; every pinboard reads the same ids (so Redis tracks each
// id for each pinboard), then both workers wind down and release them all.
func (s *session) scalePinboardsRow(ctx context.Context) ([]scaleReport, error) {
	pts, err := s.measurePoints("S6", "S6", []string{""}, func(n int, _ string) (scalePoint, error) { return s.scalePinboards(ctx, n) })
	if err != nil {
		return nil, err
	}
	return []scaleReport{{row: "S6", pts: pts,
		about: fmt.Sprintf("n pinboards on one redis-server, two counter workers registered with the first. After an idle window (%v: the "+
			"background, heartbeats and every pinboard's own polling), %d new ids are placed through the first pinboard and then requested "+
			"once through each other one, so that every pinboard caches them and Redis tracks them for each (client-side caching). Then both "+
			"workers are told to wind down (`POST /registry/push`, `wind_down`): every instance closes and releases its id, one placement "+
			"change each. *invalidations* are the pinboards' `%s` summed over all of them (one per invalidation message about a placement "+
			"that reached a pinboard), ÷ the changes (the first pinboard's `pinned_registry_releases_total{result=\"released\"}`); Redis "+
			"CPU and commands are `INFO` deltas over the changes net of the idle window's rate. Then two fresh workers register and the "+
			"*placement* probe runs: open loop at %d new ids/s through the first pinboard, %d runs of %v.",
			s.idleWindow(), s.trackedIDs(), invalidationSeries, s.probeRate(placementProbeRate), s.o.Rounds, s.o.Duration),
		cols: []scaleColumn{{"tracked", "ids tracked", 0}, {"changes", "placement changes", 0}, {"invalidations/change", "invalidations/change", 2},
			{"invalidations/change/pinboard", "… per pinboard", 2}, {"redis cpu us/change", "Redis CPU µs/change", 1},
			{"redis cpu us/change/pinboard", "… per pinboard", 1}, {"redis cmds/change", "Redis commands/change", 2},
			{"pinboards cpu us/change", "pinboards' CPU µs/change", 1}, {"idle redis cmds/s", "idle: Redis commands/s", 0},
			{"idle redis cpu %", "idle: Redis CPU %", 2}, {"placement p99 ms", "placement p99 ms", 2}, {"placement lag p99 ms", "lag p99 ms", 2}},
		plots: []scalePlot{
			{name: "invalidations", title: "invalidation messages per placement change", yLabel: "messages", keys: []string{"invalidations/change", "invalidations/change/pinboard"}},
			{name: "redis-cpu", title: "Redis CPU per placement change", yLabel: "µs", keys: []string{"redis cpu us/change", "redis cpu us/change/pinboard"}},
			{name: "placement", title: "placement p99", yLabel: "ms", keys: []string{"placement p99 ms"}},
			{name: "idle", title: "Redis commands/s with no traffic", yLabel: "commands/s", keys: []string{"idle redis cmds/s"}, logY: true},
		},
		verdicts: []string{
			verdictFlat(pts, "", "invalidations/change/pinboard", "invalidation messages per change per pinboard"),
			verdictFlat(pts, "", "redis cpu us/change/pinboard", "Redis CPU per change per pinboard"),
			verdictFlat(pts, "", "placement p99 ms", "placement p99"),
		}}}, nil
}

// trackedIDs is trackedIDs, or a tenth in smoke mode.
func (s *session) trackedIDs() int {
	if s.o.Smoke {
		return trackedIDs / 10
	}
	return trackedIDs
}

// scalePinboards measures one point of S6.
func (s *session) scalePinboards(ctx context.Context, n int) (scalePoint, error) {
	p := scalePoint{x: n, v: map[string]float64{}}
	sr, err := s.newScaleRig(false, n)
	if err != nil {
		return p, err
	}
	defer sr.close()
	pb := sr.pb()
	var olds []*proc
	for i := range 2 {
		w, err := sr.startCounter(fmt.Sprintf("worker-%d", i+1), pb.addr)
		if err != nil {
			return p, err
		}
		olds = append(olds, w)
	}
	idle, _, err := s.quietWindow(ctx, sr)
	if err != nil {
		return p, err
	}
	v := p.v
	v["idle redis cmds/s"], v["idle redis cpu %"] = float64(idle.commands)/idle.secs, 100*idle.cpu/idle.secs
	// Every pinboard reads the ids: the first places them, the others find
	// them placed (same names: -dist new with the same run id).
	const idPrefix, runID = "t", "rack"
	k := s.trackedIDs()
	var placed int64
	for i, q := range sr.pinboards {
		f, err := sr.fill(ctx, q.addr, idPrefix, runID, k)
		if err != nil {
			return p, err
		}
		if f.errors > 0 {
			return p, fmt.Errorf("pinboard %d: %d of %d requests for the tracked ids failed: %s", i+1, f.errors, k, f.detail)
		}
		if i == 0 {
			placed = f.placed
		}
	}
	v["tracked"] = float64(placed)
	pbs := admins(sr.pinboards)
	inv0, err := metricSum(pbs, invalidationSeries)
	if err != nil {
		return p, err
	}
	const released = `pinned_registry_releases_total{result="released"}`
	rel0, err := metricSum(pbs[:1], released)
	if err != nil {
		return p, err
	}
	r0, err := snapRedis(sr.redis)
	if err != nil {
		return p, err
	}
	cpu := snapshotCPU(sr.pinboards...)
	for _, w := range olds {
		info, ok, err := sessionAt(pb.addr, w.addr)
		if err != nil || !ok {
			return p, fmt.Errorf("the session of %s: found %v, %v", w.name, ok, err)
		}
		if code, body := registryCall(pb.addr, fasthttp.MethodPost, wire.PathPush, wire.PushRequest{ClientID: info.ClientID, Type: wire.MessageWindDown}); code != 202 {
			return p, fmt.Errorf("push wind_down to %s: %d %s", w.name, code, body)
		}
	}
	// The releases come within a heartbeat of the push, each with its
	// invalidations; wait for all of them (no event tells the bench).
	var rel1, inv1 float64
	err = poll(2*heartbeatInterval+30*time.Second+time.Duration(k)*10*time.Millisecond, "every tracked id released", func() bool {
		rel1, _ = metricSum(pbs[:1], released)
		return rel1-rel0 >= float64(placed)
	})
	if err != nil {
		return p, fmt.Errorf("%w (%.0f of %d)", err, rel1-rel0, placed)
	}
	// The invalidations follow the deletes at once: the count is taken once
	// it has not moved for a quarter of a second.
	last, moved := -1.0, time.Now()
	_ = poll(5*time.Second, "invalidations settle", func() bool {
		inv1, _ = metricSum(pbs, invalidationSeries)
		if inv1 != last {
			last, moved = inv1, time.Now()
		}
		return time.Since(moved) >= 250*time.Millisecond
	})
	since := cpu.since()
	r1, err := snapRedis(sr.redis)
	if err != nil {
		return p, err
	}
	changes := rel1 - rel0
	var pbCPU float64
	for _, q := range sr.pinboards {
		pbCPU += since[q]
	}
	cmds, rcpu := r0.to(r1).net(idle)
	v["changes"] = changes
	v["invalidations/change"] = perOrNaN(inv1-inv0, changes)
	v["invalidations/change/pinboard"] = v["invalidations/change"] / float64(n)
	v["redis cpu us/change"] = perOrNaN(1e6*rcpu, changes)
	v["redis cpu us/change/pinboard"] = v["redis cpu us/change"] / float64(n)
	v["redis cmds/change"] = perOrNaN(cmds, changes)
	v["pinboards cpu us/change"] = perOrNaN(1e6*pbCPU, changes)
	s.logf("  %d pinboards: %.0f changes, %.2f invalidations/change, Redis %.1f µs/change", n, changes, v["invalidations/change"], v["redis cpu us/change"])
	// The winding-down workers take no new id: place on fresh ones.
	var fresh *proc
	for i := range 2 {
		if fresh, err = sr.startCounter(fmt.Sprintf("worker-%d", i+3), pb.addr); err != nil {
			return p, err
		}
	}
	xs, err := s.probe(ctx, sr, openLoop(fmt.Sprintf("S6-place-%d", n), s.probeRate(placementProbeRate), "-dist", "new"), fresh)
	if err != nil {
		return p, err
	}
	probeFigures(v, "placement", xs)
	return p, nil
}
