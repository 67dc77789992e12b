package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/pinned-go/pinned/loadgen"
)

// target is one configuration a workload runs against.
type target struct {
	name    string
	url     string // http://host:port
	proxy   *proc  // nil for direct
	backend *proc
	redis   *proc // counted when set (pinboard)
}

// workload is one loadgen setting.
type workload struct {
	name string
	desc string
	args []string // loadgen flags besides -url, -duration
	perf bool     // count syscalls and context switches
	open bool     // open loop: compare latency, not rate
	// overload: more connections than the backend takes; compare goodput
	// and count shed and broken requests.
	overload bool
}

// measure runs one workload against one target and returns the sample.
func (s *session) measure(ctx context.Context, r *rig, w workload, t target, round int) (Sample, error) {
	roles := map[string]*proc{"backend": t.backend}
	if t.proxy != nil {
		roles["proxy"] = t.proxy
	}
	if t.redis != nil {
		roles["redis"] = t.redis
	}
	var ps []*proc
	for _, p := range roles {
		ps = append(ps, p)
	}
	var perfs = map[string]*perfStat{}
	if w.perf {
		for role, p := range roles {
			if role == "redis" {
				continue
			}
			pst, err := startPerf(r.dir, p.pids)
			if err != nil {
				return Sample{}, err
			}
			perfs[role] = pst
		}
	}
	// Everything the rig runs, to tell the CPU of other processes apart.
	all := snapshotCPU(r.procs...)
	busy0, total0, _ := machineTicks()
	win := snapshotCPU(ps...)
	args := append([]string{"-url", t.url, "-duration", s.o.Duration.String(), "-requests", "0"}, w.args...)
	rep, genCPU, err := r.runLoadgen(ctx, fmt.Sprintf("%s-%s-%d", w.name, t.name, round), args...)
	cpu := win.since()
	busy1, total1, _ := machineTicks()
	var rigTicks float64
	for _, v := range all.since() {
		rigTicks += v * clkTck
	}
	other := math.NaN()
	if total1 > total0 {
		// Busy ticks not spent by the rig's processes or loadgen (perf's own
		// CPU and softirq work in kernel threads land here too).
		other = math.Max(0, float64(busy1-busy0)-rigTicks-genCPU*clkTck) / float64(total1-total0)
	}
	sys, cs := map[string]float64{}, map[string]float64{}
	for role, p := range perfs {
		if n, c, ok := p.stop(); ok && rep != nil && rep.Requests.Sent > 0 {
			sys[role] = n / float64(rep.Requests.Sent)
			cs[role] = c / float64(rep.Requests.Sent)
		}
	}
	if err != nil {
		return Sample{}, err
	}
	smp := sampleOf(rep)
	smp.Workload, smp.Target, smp.Round = w.name, t.name, round
	smp.OtherBusy = other
	smp.CPUus = map[string]float64{}
	if n := float64(rep.Requests.Sent); n > 0 {
		for role, p := range roles {
			smp.CPUus[role] = cpu[p] * 1e6 / n
		}
		smp.CPUus["loadgen"] = genCPU * 1e6 / n
	}
	if len(sys) > 0 {
		smp.Syscalls, smp.CSwitches = sys, cs
	}
	if t.proxy != nil {
		smp.ProxyRSSKiB, smp.ProxyPeakRSSKiB = rssKiB(t.proxy.Pid())
	}
	s.logf("  %-12s %-10s round %d: %8.0f/s p50 %.2f ms p99 %.2f ms errors %d %s", w.name, t.name, round, smp.Rate, smp.P50, smp.P99, smp.Errors, smp.ErrorDetail)
	return smp, nil
}

func sampleOf(rep *loadgen.Report) Sample {
	s := Sample{
		P50: float64(rep.Latency.P50) / 1000, P99: float64(rep.Latency.P99) / 1000, P999: float64(rep.Latency.P999) / 1000,
		Sent: rep.Requests.Sent, Errors: rep.Requests.Errors, Unsent: rep.Requests.Unsent,
	}
	if rep.ElapsedSeconds > 0 {
		s.Rate = float64(rep.Requests.Sent) / rep.ElapsedSeconds
		s.MBps = float64(max(rep.Bytes.Received, rep.Bytes.Sent)) / rep.ElapsedSeconds / 1e6
	}
	var ok int64
	for code, n := range rep.Statuses {
		if len(code) == 3 && code[0] == '2' {
			ok += n
		}
	}
	if rep.ElapsedSeconds > 0 {
		s.Goodput = float64(ok) / rep.ElapsedSeconds
	}
	s.Shed = rep.Errors.Status["503"]
	s.Broken = rep.Errors.Timeout + rep.Errors.Connect + rep.Errors.Connection + rep.Errors.Pool + rep.Errors.Other
	if l := rep.ScheduleLag; l != nil {
		s.ScheduleLagP50Ms, s.ScheduleLagP99Ms, s.ScheduleLagMaxMs = float64(l.P50)/1000, float64(l.P99)/1000, float64(l.Max)/1000
	}
	if s.Errors > 0 || s.Unsent > 0 {
		b, _ := json.Marshal(rep.Errors)
		s.ErrorDetail = string(b)
	}
	return s
}

// rounds runs every workload against every target, alternating targets in
// rounds (A B C A B C …), after one unmeasured warmup run per target and
// workload. Targets that fail to start are absent from targets.
func (s *session) rounds(ctx context.Context, r *rig, ws []workload, ts []target) error {
	for _, w := range ws {
		for _, t := range ts {
			args := append([]string{"-url", t.url, "-duration", s.o.Warmup.String(), "-requests", "0"}, w.args...)
			if _, _, err := r.runLoadgen(ctx, "warmup", args...); err != nil {
				return fmt.Errorf("warmup %s %s: %w", w.name, t.name, err)
			}
		}
		for round := 1; round <= s.o.Rounds; round++ {
			for _, t := range ts {
				smp, err := s.measure(ctx, r, w, t, round)
				if err != nil {
					return fmt.Errorf("%s %s round %d: %w", w.name, t.name, round, err)
				}
				s.res.Samples = append(s.res.Samples, smp)
			}
		}
	}
	return nil
}

// pick returns the samples of one workload and target, by round.
func (s *session) pick(w, t string) map[int]Sample {
	return byRound(s.res.Samples, func(x Sample) (int, bool) { return x.Round, x.Workload == w && x.Target == t })
}

// byRound returns the xs that keep accepts, by the round it names.
func byRound[T any](xs []T, keep func(T) (round int, ok bool)) map[int]T {
	out := map[int]T{}
	for _, x := range xs {
		if round, ok := keep(x); ok {
			out[round] = x
		}
	}
	return out
}

// medianOf returns the median over rounds of f (NaN values skipped).
func medianOf[T any](m map[int]T, f func(T) float64) float64 {
	var xs []float64
	for _, x := range m {
		if v := f(x); !math.IsNaN(v) {
			xs = append(xs, v)
		}
	}
	return median(xs)
}

// maxOf returns the largest f over rounds (NaN values skipped).
func maxOf[T any](m map[int]T, f func(T) float64) float64 {
	out := math.NaN()
	for _, x := range m {
		if v := f(x); !math.IsNaN(v) && (math.IsNaN(out) || v > out) {
			out = v
		}
	}
	return out
}

// ratio is the median of per-round ratios f(num)/f(den), rounds where
// either has no value (NaN) left out.
func ratio[T any](num, den map[int]T, f func(T) float64) float64 {
	var xs []float64
	for round, n := range num {
		if d, ok := den[round]; ok && f(d) > 0 && !math.IsNaN(f(n)) {
			xs = append(xs, f(n)/f(d))
		}
	}
	return median(xs)
}

// spread returns min–max of f over rounds as text.
func spread(m map[int]Sample, f func(Sample) float64) string {
	var xs []float64
	for _, x := range m {
		xs = append(xs, f(x))
	}
	if len(xs) < 2 {
		return ""
	}
	sort.Float64s(xs)
	return fmt.Sprintf("%.0f–%.0f", xs[0], xs[len(xs)-1])
}

// fmtNum formats v with prec decimals, "–" for NaN.
func fmtNum(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// table writes a markdown table.
func table(b *strings.Builder, head []string, rows [][]string) {
	b.WriteString("| " + strings.Join(head, " | ") + " |\n|")
	for range head {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	b.WriteString("\n")
}

// workloadTable summarises one workload: medians over rounds per target.
func (s *session) workloadTable(w workload, ts []target) {
	b := &s.md
	fmt.Fprintf(b, "#### %s — %s\n\n", w.name, w.desc)
	head := []string{"target", "req/s (median)", "req/s min–max", "p50 ms", "p99 ms", "p99.9 ms", "errors", "proxy CPU µs/req", "backend CPU µs/req", "loadgen CPU µs/req", "other CPU % (max)"}
	if w.open {
		head = append(head, "loadgen lag p99 µs", "loadgen lag max µs (max)")
	}
	if w.perf {
		head = append(head, "proxy syscalls/req", "proxy cs/req", "backend syscalls/req", "backend cs/req")
	}
	if w.overload {
		head = append(head, "goodput 2xx/s", "503 shed (all rounds)", "no answer (all rounds)")
	}
	var rows [][]string
	for _, t := range ts {
		m := s.pick(w.name, t.name)
		if len(m) == 0 {
			continue
		}
		var errs int64
		for _, x := range m {
			errs += x.Errors + x.Unsent
		}
		role := func(name string) func(Sample) float64 {
			return func(x Sample) float64 {
				if v, ok := x.CPUus[name]; ok {
					return v
				}
				return math.NaN()
			}
		}
		row := []string{t.name,
			fmtNum(medianOf(m, func(x Sample) float64 { return x.Rate }), 0),
			spread(m, func(x Sample) float64 { return x.Rate }),
			fmtNum(medianOf(m, func(x Sample) float64 { return x.P50 }), 2),
			fmtNum(medianOf(m, func(x Sample) float64 { return x.P99 }), 2),
			fmtNum(medianOf(m, func(x Sample) float64 { return x.P999 }), 2),
			fmt.Sprint(errs),
			fmtNum(medianOf(m, role("proxy")), 1),
			fmtNum(medianOf(m, role("backend")), 1),
			fmtNum(medianOf(m, role("loadgen")), 1),
			fmtNum(100*maxOf(m, func(x Sample) float64 { return x.OtherBusy }), 0),
		}
		if w.open {
			// The generator's own slop, beside the latencies it measured.
			row = append(row, fmtNum(medianOf(m, func(x Sample) float64 { return x.ScheduleLagP99Ms * 1000 }), 0),
				fmtNum(maxOf(m, func(x Sample) float64 { return x.ScheduleLagMaxMs * 1000 }), 0))
		}
		if w.perf {
			for _, rl := range []string{"proxy", "backend"} {
				row = append(row,
					fmtNum(medianOf(m, func(x Sample) float64 {
						if v, ok := x.Syscalls[rl]; ok {
							return v
						}
						return math.NaN()
					}), 2),
					fmtNum(medianOf(m, func(x Sample) float64 {
						if v, ok := x.CSwitches[rl]; ok {
							return v
						}
						return math.NaN()
					}), 2))
			}
		}
		if w.overload {
			var shed, broken int64
			for _, x := range m {
				shed += x.Shed
				broken += x.Broken
			}
			row = append(row, fmtNum(medianOf(m, func(x Sample) float64 { return x.Goodput }), 0), fmt.Sprint(shed), fmt.Sprint(broken))
		}
		rows = append(rows, row)
	}
	table(b, head, rows)
}
