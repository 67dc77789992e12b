package bench

import (
	"context"
	"fmt"
	"strconv"
)

// Probe rates of S1 and S2 (open loop, per second): lookups of placed ids,
// and activations of new ones. Smoke mode uses a quarter.
const (
	lookupProbeRate     = 2000
	activationProbeRate = 500
	hotIDs              = 1000 // the ids the cached-lookup probe keeps hot
	warmIDs             = 2000 // placed before the baseline (a tenth in smoke mode)
)

// scaleFillRows runs S1 and S2: at each point n new ids are placed through
// one pinboard on one counter worker (closed loop, 64 connections), then
// the pinboard's and the worker's memory are read, then the probes run.
// Both rows share the fill; each reports its own figures.
func (s *session) scaleFillRows(ctx context.Context, s1, s2 bool) ([]scaleReport, error) {
	pts, err := s.measurePoints("S1/S2", "S1", []string{""}, func(n int, _ string) (scalePoint, error) { return s.scaleFill(ctx, n, s1, s2) })
	if err != nil {
		return nil, err
	}
	lookup, act := s.probeRate(lookupProbeRate), s.probeRate(activationProbeRate)
	var out []scaleReport
	if s1 {
		out = append(out, scaleReport{row: "S1", pts: pts,
			about: fmt.Sprintf("One redis-server, one pinboard, one counter worker (`-max-instances 2000000`, idle timeout 1 h). At each point n new ids "+
				"are activated through the pinboard (loadgen `-dist new`, closed loop, 64 connections), after a warm-up fill of %d others "+
				"done the same way (so that what a fill sets up once is in the baseline); then a GC is forced in the pinboard "+
				"(`/debug/pprof/heap?gc=1`) and its RSS (VmRSS) and HeapInuse are read: the growth over the same figures before the fill, "+
				"÷ the ids placed, is the cost of a cached id (the placement cache, the resolver's and rueidis's share). The cache keeps an "+
				"entry at most one lease after Redis confirmed it, but expired entries stay until evicted, so every id placed is in memory. "+
				"*hot lookup*: open loop at %d req/s over %d of the placed ids, requested beforehand so that they are cached (the cache lookup "+
				"with n entries beside it); *lookup, all ids*: the same rate uniform over all n placed ids (most of them expired from the "+
				"cache at large n: the re-read from Redis); hit ratios from the pinboard's `pinned_placecache_*` counters over the probe.",
				s.warmIDs(), lookup, hotIDs),
			cols: []scaleColumn{{"placed", "placed", 0}, {"pinboard rss MB", "pinboard RSS MB", 1}, {"pinboard rss B/id", "pinboard RSS B/id", 0},
				{"pinboard heap B/id", "pinboard heap B/id", 0}, {"cache entries", "cache entries", 0},
				{"hot lookup p99 ms", "hot lookup p99 ms", 2}, {"hot lookup lag p99 ms", "lag p99 ms", 2}, {"hot lookup hit ratio", "hit ratio", 3},
				{"hot lookup pinboard cpu us", "pinboard CPU µs/req", 1},
				{"lookup p99 ms", "lookup (all ids) p99 ms", 2}, {"lookup lag p99 ms", "lag p99 ms", 2}, {"lookup hit ratio", "hit ratio", 3},
				{"redis B/id", "Redis B/id", 0}, {"redis keys/id", "Redis keys/id", 2}},
			plots: []scalePlot{
				{name: "memory", title: "pinboard memory per cached id", yLabel: "bytes per id", keys: []string{"pinboard rss B/id", "pinboard heap B/id"}},
				{name: "lookup", title: "lookup p99", yLabel: "ms", keys: []string{"hot lookup p99 ms", "lookup p99 ms"}},
			},
			verdicts: []string{
				verdictAtMost(pts, "", "pinboard rss B/id", "pinboard RSS per cached id", 128, 0),
				verdictFlat(pts, "", "hot lookup p99 ms", "hot lookup p99"),
				verdictFlat(pts, "", "lookup p99 ms", "lookup p99 over all placed ids"),
			}})
	}
	if s2 {
		out = append(out, scaleReport{row: "S2", pts: pts,
			about: fmt.Sprintf("The same fill as S1 (n new ids through the pinboard, all on one fleet-mode counter worker with `-max-instances "+
				"2000000` and a 1 h idle timeout), read on the worker: RSS and HeapInuse after a forced GC (its admin listener's "+
				"`/debug/pprof/heap?gc=1`), growth ÷ instances. *fill*: the closed-loop fill's own rate and p99 (64 connections, saturated). "+
				"*activation*: open loop at %d new ids/s through the pinboard once n instances are idle (%d runs add their activations to n).",
				act, s.o.Rounds),
			cols: []scaleColumn{{"placed", "placed", 0}, {"worker rss MB", "worker RSS MB", 1}, {"worker rss B/instance", "worker RSS B/instance", 0},
				{"worker heap B/instance", "worker heap B/instance", 0}, {"fill rate", "fill activations/s", 0}, {"fill p99 ms", "fill p99 ms", 2},
				{"activation p99 ms", "activation p99 ms", 2}, {"activation lag p99 ms", "lag p99 ms", 2},
				{"activation backend cpu us", "worker CPU µs/activation", 1}, {"activation pinboard cpu us", "pinboard CPU µs/activation", 1}},
			plots: []scalePlot{
				{name: "memory", title: "worker memory per idle instance", yLabel: "bytes per instance", keys: []string{"worker rss B/instance", "worker heap B/instance"}},
				{name: "rss", title: "worker RSS", yLabel: "MB", keys: []string{"worker rss MB"}, logY: true},
				{name: "activation", title: "activation p99", yLabel: "ms", keys: []string{"activation p99 ms", "fill p99 ms"}},
			},
			verdicts: []string{
				verdictAtMost(pts, "", "worker rss MB", "worker RSS at 1 M idle instances (MB)", 600, 1_000_000),
				verdictFlat(pts, "", "activation p99 ms", "activation p99 (open loop)"),
			}})
	}
	return out, nil
}

// warmIDs is warmIDs, or a tenth in smoke mode.
func (s *session) warmIDs() int {
	if s.o.Smoke {
		return warmIDs / 10
	}
	return warmIDs
}

// probeRate is rate, or a quarter of it in smoke mode.
func (s *session) probeRate(rate int) int {
	if s.o.Smoke {
		return rate / 4
	}
	return rate
}

// scaleFill measures one point of S1/S2.
func (s *session) scaleFill(ctx context.Context, n int, s1, s2 bool) (scalePoint, error) {
	p := scalePoint{x: n, v: map[string]float64{}}
	sr, err := s.newScaleRig(false, 1)
	if err != nil {
		return p, err
	}
	defer sr.close()
	w, err := sr.startCounter("worker", sr.pb().addr)
	if err != nil {
		return p, err
	}
	// A warm-up fill first, so that what every fill sets up once (the 64
	// connections, their buffers, the pools) is in the baseline, not in
	// the cost per id.
	warm := s.warmIDs()
	if wf, err := sr.fill(ctx, sr.pb().addr, "w", "arm", warm); err != nil || wf.errors > 0 {
		return p, fmt.Errorf("warm-up fill of %d ids: %v %+v", warm, err, wf)
	}
	before, err := memoryOf(sr, w)
	if err != nil {
		return p, err
	}
	const idPrefix, runID = "f", "ill"
	f, err := sr.fill(ctx, sr.pb().addr, idPrefix, runID, n)
	if err != nil {
		return p, err
	}
	if f.errors > 0 {
		s.note("S1/S2 at %d ids: %d activations of the fill failed: %s", n, f.errors, f.detail)
	}
	after, err := memoryOf(sr, w)
	if err != nil {
		return p, err
	}
	v, placed := p.v, float64(f.placed)
	v["placed"], v["fill rate"], v["fill p99 ms"], v["fill errors"] = placed, f.rate, f.p99, float64(f.errors)
	v["pinboard rss MB"] = float64(after.pbRSS) / 1024
	v["pinboard rss B/id"] = perOrNaN(float64(after.pbRSS-before.pbRSS)*1024, placed)
	v["pinboard heap B/id"] = perOrNaN(float64(after.pbHeap-before.pbHeap), placed)
	v["worker rss MB"] = float64(after.wRSS) / 1024
	v["worker rss B/instance"] = perOrNaN(float64(after.wRSS-before.wRSS)*1024, placed)
	v["worker heap B/instance"] = perOrNaN(float64(after.wHeap-before.wHeap), placed)
	v["redis B/id"] = perOrNaN(float64(after.redis.memory-before.redis.memory), placed)
	v["redis keys/id"] = perOrNaN(float64(after.redis.keys-before.redis.keys), placed)
	if body, err := metrics(sr.pb().admin); err == nil {
		v["cache entries"] = metricValue(body, `pinned_placecache_entries{cache="placements"}`)
	}
	s.logf("  %d ids: pinboard %.0f B/id RSS, worker %.0f B/instance RSS, Redis %.0f B/id", n, v["pinboard rss B/id"], v["worker rss B/instance"], v["redis B/id"])
	if s1 {
		hot := strconv.Itoa(min(n, hotIDs))
		ids := fillIDs(idPrefix, runID)
		rate := s.probeRate(lookupProbeRate)
		// Request the hot ids first, so that the probe finds them cached.
		if _, _, err := sr.runLoadgen(ctx, "hot-warm", "-url", "http://"+sr.pb().addr, "-path", "/counter/{id}/", "-dist", "uniform",
			"-id-prefix", ids, "-keys", hot, "-c", "16", "-requests", strconv.Itoa(4*min(n, hotIDs)), "-duration", "1m"); err != nil {
			return p, err
		}
		for _, pr := range []struct{ name, keys string }{{"hot lookup", hot}, {"lookup", strconv.Itoa(n)}} {
			h0, err := cacheHits(sr.pb().admin)
			if err != nil {
				return p, err
			}
			xs, err := s.probe(ctx, sr, openLoop(fmt.Sprintf("S1-%s-%d", pr.name, n), rate, "-dist", "uniform", "-id-prefix", ids, "-keys", pr.keys), w)
			if err != nil {
				return p, err
			}
			h1, err := cacheHits(sr.pb().admin)
			if err != nil {
				return p, err
			}
			probeFigures(v, pr.name, xs)
			v[pr.name+" hit ratio"] = perOrNaN(h1.hits-h0.hits, h1.hits-h0.hits+h1.misses-h0.misses)
		}
	}
	if s2 {
		xs, err := s.probe(ctx, sr, openLoop(fmt.Sprintf("S2-activation-%d", n), s.probeRate(activationProbeRate), "-dist", "new"), w)
		if err != nil {
			return p, err
		}
		probeFigures(v, "activation", xs)
	}
	return p, nil
}

// memorySnap is the memory of a fill's processes at one instant.
type memorySnap struct {
	pbRSS, wRSS   int64 // KiB, after a forced GC
	pbHeap, wHeap int64 // HeapInuse, bytes
	redis         redisSnap
}

// memoryOf forces a GC in the pinboard and the worker, then reads their
// HeapInuse and RSS, and Redis's memory and keys.
func memoryOf(sr *scaleRig, w *proc) (memorySnap, error) {
	var m memorySnap
	ph, err := heapStats(sr.pb().admin)
	if err != nil {
		return m, err
	}
	wh, err := heapStats(w.admin)
	if err != nil {
		return m, err
	}
	m.pbHeap, m.wHeap = ph["HeapInuse"], wh["HeapInuse"]
	m.pbRSS, _ = rssKiB(sr.pb().Pid())
	m.wRSS, _ = rssKiB(w.Pid())
	m.redis, err = snapRedis(sr.redis)
	return m, err
}

// hitCounts are a pinboard's placement cache counters.
type hitCounts struct{ hits, misses float64 }

func cacheHits(admin string) (hitCounts, error) {
	body, err := metrics(admin)
	if err != nil {
		return hitCounts{}, err
	}
	return hitCounts{metricValue(body, `pinned_placecache_hits_total{cache="placements"}`),
		metricValue(body, `pinned_placecache_misses_total{cache="placements"}`)}, nil
}
