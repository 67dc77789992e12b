package bench

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The trace suite (-trace-slow): where the time of the requests above the
// p99 goes, hop by hop.
//
// The pinboard is built with the pinned_spans tag (proxy/spans.go): every
// request a loop serves is stamped when its loop woke, when it was read,
// routed, written to the worker, when the worker's first bytes were read
// and when the answer was written, in absolute CLOCK_MONOTONIC time; the
// worker (the counter, built with the same tag) adds when its host began
// and finished serving the request (host/spans_on.go).
// loadgen (-trace-out) numbers each request in a Trace-Seq field and
// records when it was due, sent, and received by its kernel, on the same
// clock. The suite runs the proxy suite's cpu-5k workload through that
// pinboard for rounds × duration, stops the pinboard (it writes its spans
// as it shuts down), joins the two by number, and reports, for all
// requests and for those at or above the p99, how long each hop took.

// traceHops names the hops of a joined request, in order.
var traceHops = []struct{ name, desc string }{
	{"generator lag", "loadgen sent it after its due time (the generator's own error)"},
	{"to the proxy's loop", "from loadgen's send to the wake of the pinboard loop that read it: loopback, and the loop's wake-up"},
	{"in the loop's batch", "from that wake to the request read and parsed (events handled before it in the same batch)"},
	{"route", "read to routed (a cache hit: no store read)"},
	{"to the worker", "routed to written to the worker's connection (pool, write)"},
	{"to the worker's handler", "written to the worker to its host starting on it (host/spans_on.go): the worker's wake-up, read and parse"},
	{"worker's handler", "the host serving it (the counter's handler, instance lookup, fencing)"},
	{"back to the proxy's loop", "from the handler's end to the wake of the loop that read the answer: the worker's write, the loop's wake-up"},
	{"in the answer's batch", "from that wake to the answer's first bytes read"},
	{"answer", "first bytes read to the answer written to the client"},
	{"to the client", "written by the proxy to received by loadgen's kernel"},
}

// joined is one request with loadgen's and the proxy's stamps.
type joined struct {
	latency time.Duration // done − due
	hops    []time.Duration
}

func (s *session) traceSuite(ctx context.Context) error {
	r, err := newRig(s.o, s.bins)
	if err != nil {
		return err
	}
	defer r.close()
	redis, err := r.startRedis()
	if err != nil {
		return err
	}
	spansDir := filepath.Join(r.dir, "spans")
	if err := os.Mkdir(spansDir, 0o755); err != nil {
		return err
	}
	pb, err := r.startPinboardEnv("pinboard", s.bins.pinboardSpans, redis.addr, "PINNED_SPANS_OUT="+spansDir)
	if err != nil {
		return err
	}
	r.bins.counter = s.bins.counterSpans // its host answers Trace-Worker (host/spans_on.go)
	w, err := r.startCounter("worker-1", pb.addr)
	if err != nil {
		return err
	}
	d := s.o.Duration * time.Duration(s.o.Rounds)
	traceFile := filepath.Join(r.dir, "loadgen-trace.csv")
	args := []string{"-url", "http://" + pb.addr, "-rate", "5000", "-c", "64", "-max-workers", "512",
		"-path", "/counter/{id}/", "-dist", "uniform", "-keys", "1000", "-requests", "0"}
	// Warm up (placements, connections) without tracing, then the traced run.
	if _, _, err := r.runLoadgen(ctx, "trace-warmup", append(args, "-duration", s.o.Warmup.String())...); err != nil {
		return err
	}
	before, err := runtimeStatsOf(pb, w)
	if err != nil {
		return err
	}
	threads0 := threadSwitches(pb.Pid())
	rep, genCPU, err := r.runLoadgen(ctx, "trace", append(args, "-duration", d.String(), "-trace-out", traceFile)...)
	if err != nil {
		return err
	}
	after, err := runtimeStatsOf(pb, w)
	if err != nil {
		return err
	}
	threads1 := threadSwitches(pb.Pid())
	s.logf("  trace: %d requests in %v, p99 %.2f ms", rep.Requests.Sent, d, float64(rep.Latency.P99)/1000)
	_ = pb.Signal(15)
	select {
	case <-pb.Exited():
	case <-time.After(30 * time.Second):
		return fmt.Errorf("the pinboard did not exit within 30 s of SIGTERM (its spans are written as it shuts down)")
	}
	gen, err := readTraceCSV(traceFile, 6)
	if err != nil {
		return err
	}
	spanFiles, _ := filepath.Glob(filepath.Join(spansDir, "spans-*.csv"))
	spans := map[int64][]int64{}
	for _, f := range spanFiles {
		rows, err := readTraceCSV(f, 10)
		if err != nil {
			return err
		}
		for _, row := range rows {
			spans[row[0]] = row[1:]
		}
	}
	var all []joined
	unmatched := 0
	for _, g := range gen {
		// seq,status,due,sent,rx,done | wake,read,routed,sent,workerin,workerout,answake,first,done
		sp, ok := spans[g[0]]
		if !ok || g[4] == 0 || sp[4] == 0 {
			unmatched++
			continue
		}
		due, sent, rx, done := g[2], g[3], g[4], g[5]
		st := []int64{due, sent, sp[0], sp[1], sp[2], sp[3], sp[4], sp[5], sp[6], sp[7], sp[8], rx}
		j := joined{latency: time.Duration(done - due)}
		for i := 1; i < len(st); i++ {
			j.hops = append(j.hops, time.Duration(max(st[i]-st[i-1], 0)))
		}
		all = append(all, j)
	}
	if len(all) == 0 {
		return fmt.Errorf("trace: no request could be joined (%d loadgen records, %d span files)", len(gen), len(spanFiles))
	}
	s.traceReport(all, unmatched, len(gen), float64(rep.Latency.P99)/1000, genCPU/float64(max(rep.Requests.Sent, 1))*1e6, d)
	s.runtimeReport([]string{"pinboard", "worker"}, before, after)
	s.threadReport(threads0, threads1, rep.Requests.Sent)
	return nil
}

// threadSwitches reads each thread's voluntary and involuntary context
// switches from /proc/<pid>/task/*/status.
func threadSwitches(pid int) map[int][2]float64 {
	out := map[int][2]float64{}
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, d := range dirs {
		tid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "status"))
		if err != nil {
			continue
		}
		var v [2]float64
		for line := range strings.Lines(string(b)) {
			if x, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				v[0], _ = strconv.ParseFloat(strings.TrimSpace(x), 64)
			} else if x, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
				v[1], _ = strconv.ParseFloat(strings.TrimSpace(x), 64)
			}
		}
		out[tid] = v
	}
	return out
}

// threadReport writes the pinboard's context switches per request, thread
// by thread (the busiest first).
func (s *session) threadReport(before, after map[int][2]float64, requests int64) {
	type row struct {
		tid       int
		vol, invo float64
	}
	var rows []row
	var vol, invo float64
	for tid, a := range after {
		b := before[tid]
		r := row{tid, a[0] - b[0], a[1] - b[1]}
		vol, invo = vol+r.vol, invo+r.invo
		if r.vol+r.invo > 0 {
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return int((b.vol + b.invo) - (a.vol + a.invo)) })
	n := float64(max(requests, 1))
	b := &s.md
	fmt.Fprintf(b, "The pinboard's context switches over the traced run, per request, from /proc/<pid>/task/*/status: %.2f voluntary (the thread blocked) "+
		"and %.2f involuntary (preempted), over %d threads that switched; the threads (by id; the lowest is the main thread, the runtime's sysmon usually the next):\n\n",
		vol/n, invo/n, len(rows))
	b.WriteString("| thread | voluntary / request | involuntary / request |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %d | %.3f | %.3f |\n", r.tid, r.vol/n, r.invo/n)
	}
	b.WriteString("\n")
	s.res.Markdown = b.String()
}

// runtimeStats are a Go process's runtime counters, from its admin
// /metrics: GC cycles, GC CPU, and the scheduler's latency histogram
// (runtime/metrics /sched/latencies: how long goroutines waited runnable).
type runtimeStats struct {
	gcs, gcCPU float64
	sched      map[float64]float64 // cumulative count by upper bound (le)
}

func runtimeStatsOf(ps ...*proc) ([]runtimeStats, error) {
	var out []runtimeStats
	for _, p := range ps {
		body, err := metrics(p.admin)
		if err != nil {
			return nil, err
		}
		st := runtimeStats{gcs: metricValue(body, "go_gc_duration_seconds_count"), gcCPU: metricValue(body, "go_gc_cpu_seconds_total"), sched: map[float64]float64{}}
		for line := range strings.Lines(string(body)) {
			rest, ok := strings.CutPrefix(line, `go_sched_latencies_seconds_bucket{le="`)
			if !ok {
				continue
			}
			le, v, ok := strings.Cut(rest, `"} `)
			if !ok {
				continue
			}
			bound, err1 := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				bound, err1 = math.Inf(1), nil
			}
			n, err2 := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err1 == nil && err2 == nil {
				st.sched[bound] = n
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// runtimeReport writes what each process's runtime did during the traced run.
func (s *session) runtimeReport(names []string, before, after []runtimeStats) {
	b := &s.md
	b.WriteString("What each Go process's runtime did over the traced run (admin /metrics before and after): GC cycles and their CPU, and how long " +
		"goroutines waited runnable before they ran (runtime/metrics `/sched/latencies`, bucket upper bounds).\n\n")
	b.WriteString("| process | GC cycles | GC CPU s | runnable waits | p50 ≤ ms | p99 ≤ ms | p99.9 ≤ ms | waits > 1 ms |\n|---|---|---|---|---|---|---|---|\n")
	for i, name := range names {
		bs, as := before[i], after[i]
		bounds := slices.Sorted(maps.Keys(as.sched))
		counts := make([]float64, len(bounds))
		for k, le := range bounds {
			counts[k] = as.sched[le] - bs.sched[le]
		}
		total := 0.0
		if len(counts) > 0 {
			total = counts[len(counts)-1]
		}
		q := func(f float64) string {
			for k, c := range counts {
				if c >= f*total {
					return fmt.Sprintf("%.3f", bounds[k]*1e3)
				}
			}
			return "–"
		}
		over := 0.0
		for k, le := range bounds {
			if le >= 1e-3 {
				over = total - counts[max(k-1, 0)]
				break
			}
		}
		fmt.Fprintf(b, "| %s | %.0f | %.3f | %.0f | %s | %s | %s | %.0f |\n", name, as.gcs-bs.gcs, as.gcCPU-bs.gcCPU, total, q(0.5), q(0.99), q(0.999), over)
	}
	b.WriteString("\n")
	s.res.Markdown = b.String()
}

// readTraceCSV reads a CSV of integers with a header line, each row of
// width fields.
func readTraceCSV(path string, width int) ([][]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows [][]int64
	sc := bufio.NewScanner(f)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		parts := strings.Split(sc.Text(), ",")
		if len(parts) != width {
			return nil, fmt.Errorf("%s: %d fields in %q; want %d", path, len(parts), sc.Text(), width)
		}
		row := make([]int64, width)
		for i, p := range parts {
			if row[i], err = strconv.ParseInt(p, 10, 64); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

func (s *session) traceReport(all []joined, unmatched, total int, loadgenP99 float64, genCPUus float64, d time.Duration) {
	lat := make([]time.Duration, len(all))
	for i, j := range all {
		lat[i] = j.latency
	}
	slices.Sort(lat)
	p99 := lat[int(math.Ceil(0.99*float64(len(lat))))-1]
	var slow []joined
	for _, j := range all {
		if j.latency >= p99 {
			slow = append(slow, j)
		}
	}
	ms := func(v time.Duration) string { return fmt.Sprintf("%.3f", float64(v)/1e6) }
	hopQ := func(js []joined, h int, q float64) time.Duration {
		v := make([]time.Duration, len(js))
		for i, j := range js {
			v[i] = j.hops[h]
		}
		slices.Sort(v)
		return v[min(len(v)-1, int(q*float64(len(v))))]
	}
	hopMean := func(js []joined, h int) time.Duration {
		var sum time.Duration
		for _, j := range js {
			sum += j.hops[h]
		}
		return sum / time.Duration(len(js))
	}
	// The hop that took longest in each slow request.
	worst := make([]int, len(traceHops))
	for _, j := range slow {
		worst[slices.Index(j.hops, slices.Max(j.hops))]++
	}
	b := &s.md
	b.WriteString("## trace: the requests above the p99, hop by hop\n\n")
	fmt.Fprintf(b, "cpu-5k (open loop, 5 000 req/s, 64 connections, 1000 uniform ids) for %v through a pinboard built with `-tags pinned_spans` "+
		"(proxy/spans.go) and one fleet worker built likewise (its host answers each traced request with when it began and finished serving it: host/spans_on.go); loadgen `-trace-out` numbers the requests (Trace-Seq) and all three stamp in absolute CLOCK_MONOTONIC ns. "+
		"%d of %d measured requests joined (%d without a span or a kernel receive time). p99 of the joined requests %s ms (loadgen's report: %.2f ms); "+
		"%d requests at or above it. The generator's own cost: %.1f µs CPU per request; its schedule lag is the first row. "+
		"A stamp costs one vDSO clock read (~25 ns); five per request (the two wakes are the loop's own clock).\n\n",
		d, len(all), total, unmatched, ms(p99), loadgenP99, len(slow), genCPUus)
	b.WriteString("| hop | what | all: p50 ms | all: p99 ms | ≥ p99: p50 ms | ≥ p99: mean ms | ≥ p99: max ms | ≥ p99: the longest hop in |\n|---|---|---|---|---|---|---|---|\n")
	for h, hop := range traceHops {
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %d (%.0f %%) |\n", hop.name, hop.desc,
			ms(hopQ(all, h, 0.5)), ms(hopQ(all, h, 0.99)), ms(hopQ(slow, h, 0.5)), ms(hopMean(slow, h)), ms(hopQ(slow, h, 1)),
			worst[h], 100*float64(worst[h])/float64(len(slow)))
	}
	b.WriteString("\n")
	s.res.Values["trace p99 ms"] = float64(p99) / 1e6
	s.res.Markdown = b.String()
}
