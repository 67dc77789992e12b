package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ---- loadgen: the generator measured against wrk ----

// The loadgen suite measures the instrument: loadgen and wrk side by side
// on the same direct counter, closed loop (rate and CPU per request of
// each) and loadgen's open loop at 12 000 req/s (its schedule lag, CPU per
// request and latency), in alternated rounds. When wrk2 (Gil Tene's
// open-loop fork of wrk, not packaged by Debian) is available, it runs the
// same open loop in the same rounds: the reference open-loop generator's
// cost on the same machine.

// wrkPath is where Debian's wrk package puts the binary.
const wrkPath = "/usr/bin/wrk"

// wrk2Name is the name the suite looks wrk2 up by on PATH when
// Options.Wrk2 is empty (its own build names the binary wrk, so install it
// under this name).
const wrk2Name = "wrk2"

// loadgenSuitePath is the fixed path both generators request: wrk has no
// id templates without a Lua script, so loadgen uses the same single id.
const loadgenSuitePath = "/counter/bench/"

// generatorRun is one measured run of a generator.
type generatorRun struct {
	name string // "loadgen", "wrk" or "wrk2"
	args []string
}

// suiteRun is one of the suite's runs: a generator on a workload.
type suiteRun struct {
	workload string
	gen      generatorRun
}

func (s *session) loadgenSuite(ctx context.Context) error {
	r, c, err := s.startLocalCounter()
	if err != nil {
		return err
	}
	defer r.close()
	url := "http://" + c.addr
	wrk, err := exec.LookPath(wrkPath)
	if err != nil {
		wrk = ""
		s.note("wrk rows skipped: wrk is not installed (cmd/bench -install installs it from the distribution's packages)")
	}
	wrk2 := s.o.Wrk2
	if wrk2 == "" {
		if wrk2, err = exec.LookPath(wrk2Name); err != nil {
			wrk2 = ""
			s.note("wrk2 rows skipped: no wrk2 on PATH and no -wrk2 (bench/README.md says how to build it)")
		}
	}
	rate := 12000
	if s.o.Smoke {
		rate = 2000
	}
	openName := fmt.Sprintf("open-%dk", rate/1000)
	common := []string{"-path", loadgenSuitePath, "-c", "64"}
	runs := []suiteRun{
		{"closed-64", generatorRun{"loadgen", common}},
		{"closed-64", generatorRun{"wrk", nil}},
		{openName, generatorRun{"loadgen", append([]string{"-rate", strconv.Itoa(rate)}, common...)}},
		{openName + "-coalesce", generatorRun{"loadgen", append([]string{"-rate", strconv.Itoa(rate), "-coalesce", "250us"}, common...)}},
	}
	if wrk2 != "" {
		runs = append(runs, suiteRun{openName, generatorRun{"wrk2", []string{"-R", strconv.Itoa(rate)}}})
	}
	skip := func(g generatorRun) bool { return g.name == "wrk" && wrk == "" }
	// The machine's floor first, on the quiet machine: one thread sleeping
	// until slots 1/rate apart, with no HTTP in it (8 s; 1 s in smoke).
	floorFor := 8 * time.Second
	if s.o.Smoke {
		floorFor = time.Second
	}
	gap := time.Second / time.Duration(rate)
	if f, err := measureSleepFloor(int(floorFor/gap), gap); err != nil {
		s.note("machine floor not measured: %v", err)
	} else {
		v := s.res.Values
		v["floor wake cpu us"] = f.cpuUs
		v["floor late p99 us"] = float64(f.p99) / 1e3
		v["floor late p99.9 us"] = float64(f.p999) / 1e3
		v["floor late max us"] = float64(f.max) / 1e3
		s.logf("  machine floor: %d sleeps %v apart: %.1f µs CPU per wake-up, late p99 %v p99.9 %v max %v",
			f.wakes, f.gap, f.cpuUs, f.p99, f.p999, f.max)
	}
	measure := func(workload string, g generatorRun, d time.Duration, round int) (Sample, error) {
		switch g.name {
		case "wrk":
			return s.measureWrk(ctx, r, c, "wrk", wrk, g.args, url, workload, d, round)
		case "wrk2":
			return s.measureWrk(ctx, r, c, "wrk2", wrk2, g.args, url, workload, d, round)
		}
		return s.measureLoadgen(ctx, r, c, url, workload, g.args, d, round)
	}
	for _, x := range runs {
		if skip(x.gen) {
			continue
		}
		if _, err := measure(x.workload, x.gen, s.o.Warmup, 0); err != nil {
			return fmt.Errorf("warmup %s %s: %w", x.workload, x.gen.name, err)
		}
	}
	for round := 1; round <= s.o.Rounds; round++ {
		for _, x := range runs {
			if skip(x.gen) {
				continue
			}
			smp, err := measure(x.workload, x.gen, s.o.Duration, round)
			if err != nil {
				return fmt.Errorf("%s %s round %d: %w", x.workload, x.gen.name, round, err)
			}
			s.res.Samples = append(s.res.Samples, smp)
		}
	}
	s.loadgenReport(openName, rate, wrk != "", wrk2 != "")
	return nil
}

// measureLoadgen runs loadgen against the counter and returns its sample:
// the generator's CPU from outside (as for wrk) and from its own report.
func (s *session) measureLoadgen(ctx context.Context, r *rig, c *proc, url, workload string, args []string, d time.Duration, round int) (Sample, error) {
	win := snapshotCPU(c)
	busy0, total0, _ := machineTicks()
	rep, genCPU, err := r.runLoadgen(ctx, fmt.Sprintf("%s-%d", workload, round),
		append([]string{"-url", url, "-duration", d.String(), "-requests", "0"}, args...)...)
	cpu := win.since()
	other := otherBusy(busy0, total0, cpu[c]+genCPU)
	if err != nil {
		return Sample{}, err
	}
	smp := sampleOf(rep)
	smp.OtherBusy = other
	smp.Workload, smp.Target, smp.Round = workload, "loadgen", round
	smp.CPUus = map[string]float64{}
	if n := float64(rep.Requests.Sent); n > 0 {
		smp.CPUus["generator"] = genCPU * 1e6 / n
		smp.CPUus["backend"] = cpu[c] * 1e6 / n
	}
	smp.CPUus["generator-self"] = rep.Generator.CPUPerRequestUs
	s.logf("  %-20s loadgen round %d: %8.0f/s p99 %.2f ms lag p99 %.3f ms max %.2f ms, CPU %.1f µs/req (own figure %.1f)",
		workload, round, smp.Rate, smp.P99, smp.ScheduleLagP99Ms, smp.ScheduleLagMaxMs, smp.CPUus["generator"], rep.Generator.CPUPerRequestUs)
	return smp, nil
}

// measureWrk runs wrk or wrk2 (name; the binary at path) against the
// counter: one thread per CPU, 64 connections, plus extra (wrk2's -R rate).
func (s *session) measureWrk(ctx context.Context, r *rig, c *proc, name, path string, extra []string, url, workload string, d time.Duration, round int) (Sample, error) {
	secs := max(1, int(math.Round(d.Seconds())))
	args := append([]string{"-t", strconv.Itoa(runtime.NumCPU()), "-c", "64", "-d", strconv.Itoa(secs) + "s"}, extra...)
	args = append(args, "--latency", url+loadgenSuitePath)
	bin, full := pinned(s.o.PinGen, path, args...)
	win := snapshotCPU(c)
	busy0, total0, _ := machineTicks()
	cmd := exec.CommandContext(ctx, bin, full...)
	out, err := cmd.CombinedOutput()
	cpu := win.since()
	genCPU := 0.0
	if st := cmd.ProcessState; st != nil {
		genCPU = (st.UserTime() + st.SystemTime()).Seconds()
	}
	other := otherBusy(busy0, total0, cpu[c]+genCPU)
	if err != nil {
		return Sample{}, fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(out, 2000))
	}
	res, err := parseWrk(string(out))
	if err != nil {
		return Sample{}, fmt.Errorf("%s output: %w\n%s", name, err, tail(out, 2000))
	}
	smp := Sample{Workload: workload, Target: name, Round: round, Rate: res.rate, P50: res.p50, P99: res.p99,
		Sent: res.requests, Errors: res.errors, CPUus: map[string]float64{}, OtherBusy: other}
	if smp.Errors > 0 {
		smp.ErrorDetail = res.errorText
	}
	if n := float64(res.requests); n > 0 {
		smp.CPUus["generator"] = genCPU * 1e6 / n
		smp.CPUus["backend"] = cpu[c] * 1e6 / n
	}
	s.logf("  %-20s %-7s round %d: %8.0f/s p99 %.2f ms, CPU %.1f µs/req", workload, name, round, smp.Rate, smp.P99, smp.CPUus["generator"])
	return smp, nil
}

// otherBusy returns the fraction of all cores busy since (busy0, total0)
// outside the suite's processes, which used ownCPU seconds (NaN when
// /proc/stat cannot tell).
func otherBusy(busy0, total0 uint64, ownCPU float64) float64 {
	busy1, total1, err := machineTicks()
	if err != nil || total1 <= total0 {
		return math.NaN()
	}
	return math.Max(0, float64(busy1-busy0)-ownCPU*clkTck) / float64(total1-total0)
}

// wrkResult is what parseWrk reads from wrk's (or wrk2's) output.
type wrkResult struct {
	requests, errors int64
	rate, p50, p99   float64 // req/s, ms
	errorText        string
}

var (
	wrkRequests = regexp.MustCompile(`(?m)^\s*(\d+) requests in `)
	wrkRate     = regexp.MustCompile(`(?m)^Requests/sec:\s*([\d.]+)`)
	wrkPct      = regexp.MustCompile(`(?m)^\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m)\s*$`)
	wrkSocket   = regexp.MustCompile(`(?m)^\s*Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkStatus   = regexp.MustCompile(`(?m)^\s*Non-2xx or 3xx responses: (\d+)`)
)

// parseWrk reads wrk's summary (run with --latency), or wrk2's, whose
// percentiles read "50.000%" where wrk's read "50%".
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	m := wrkRequests.FindStringSubmatch(out)
	rm := wrkRate.FindStringSubmatch(out)
	if m == nil || rm == nil {
		return r, errors.New("no request count or rate")
	}
	r.requests, _ = strconv.ParseInt(m[1], 10, 64)
	r.rate, _ = strconv.ParseFloat(rm[1], 64)
	for _, p := range wrkPct.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(p[2], 64)
		switch p[3] {
		case "us":
			v /= 1000
		case "s":
			v *= 1000
		case "m":
			v *= 60000
		}
		if p[1] == "50" {
			r.p50 = v
		} else {
			r.p99 = v
		}
	}
	var texts []string
	if sm := wrkSocket.FindStringSubmatch(out); sm != nil {
		for _, x := range sm[1:] {
			n, _ := strconv.ParseInt(x, 10, 64)
			r.errors += n
		}
		texts = append(texts, strings.TrimSpace(sm[0]))
	}
	if sm := wrkStatus.FindStringSubmatch(out); sm != nil {
		n, _ := strconv.ParseInt(sm[1], 10, 64)
		r.errors += n
		texts = append(texts, strings.TrimSpace(sm[0]))
	}
	r.errorText = strings.Join(texts, "; ")
	return r, nil
}

// loadgenReport writes the suite's section and values.
func (s *session) loadgenReport(openName string, rate int, withWrk, withWrk2 bool) {
	b := &s.md
	b.WriteString("## loadgen (the instrument)\n\n")
	wrk2Order, wrk2About := "", ""
	if withWrk2 {
		wrk2Order = ", wrk2 open"
		wrk2About = " wrk2 (Gil Tene's open-loop fork of wrk, one thread per CPU, 64 connections, `-R` the same rate) sends each connection's " +
			"requests on its own schedule, corrects its latencies for coordinated omission, and times its sends with a millisecond event-loop " +
			"timer: its latencies include that timer's lateness, and it reports no schedule lag."
	}
	fmt.Fprintf(b, "loadgen and wrk (%s, closed loop, one thread per CPU, 64 connections) against the same local-mode counter, `GET %s` "+
		"(one id: wrk has no id templates), alternated in every round (loadgen closed, wrk closed, loadgen open, loadgen open with "+
		"`-coalesce 250us`%s), %d rounds; medians over rounds. Generator CPU per request is the process's utime+stime over the run "+
		"(wait4 rusage, the same for every generator) ÷ requests; loadgen's own figure (getrusage during Run) is beside it. Schedule lag is how "+
		"late loadgen sent each open-loop request (its own slop). loadgen runs its event-loop engine, one loop per CPU.%s\n\n",
		wrkVersion(), loadgenSuitePath, wrk2Order, s.o.Rounds, wrk2About)
	gens := []string{"loadgen", "wrk", "wrk2"}
	cpu := func(role string) func(Sample) float64 {
		return func(x Sample) float64 { return nanIfMissing(x.CPUus, role) }
	}
	var rows [][]string
	for _, w := range []string{"closed-64", openName, openName + "-coalesce"} {
		for _, g := range gens {
			m := s.pick(w, g)
			if len(m) == 0 {
				continue
			}
			var errs int64
			for _, x := range m {
				errs += x.Errors + x.Unsent
			}
			lag := func(f func(Sample) float64) string {
				if g != "loadgen" || w == "closed-64" {
					return "–"
				}
				return fmtNum(medianOf(m, f)*1000, 0)
			}
			rows = append(rows, []string{w, g, fmtNum(medianOf(m, rateOf), 0), spread(m, rateOf),
				fmtNum(medianOf(m, cpu("generator")), 1), fmtNum(medianOf(m, cpu("generator-self")), 1), fmtNum(medianOf(m, cpu("backend")), 1),
				fmtNum(medianOf(m, func(x Sample) float64 { return x.P50 }), 3), fmtNum(medianOf(m, p99Of), 3),
				lag(func(x Sample) float64 { return x.ScheduleLagP50Ms }), lag(func(x Sample) float64 { return x.ScheduleLagP99Ms }),
				lag(func(x Sample) float64 { return x.ScheduleLagMaxMs }), fmt.Sprint(errs)})
			key := w + " " + g
			s.res.Values[key+" rate"] = medianOf(m, rateOf)
			s.res.Values[key+" cpu us/req"] = medianOf(m, cpu("generator"))
			s.res.Values[key+" errors"] = float64(errs)
			if g != "wrk" && w != "closed-64" {
				s.res.Values[key+" p99 ms"] = medianOf(m, p99Of)
			}
			if g == "loadgen" && w != "closed-64" {
				s.res.Values[key+" lag p99 us"] = medianOf(m, func(x Sample) float64 { return x.ScheduleLagP99Ms * 1000 })
				s.res.Values[key+" lag max us"] = maxOf(m, func(x Sample) float64 { return x.ScheduleLagMaxMs * 1000 })
			}
		}
	}
	table(b, []string{"workload", "generator", "req/s (median)", "req/s min–max", "generator CPU µs/req", "loadgen's own CPU µs/req",
		"backend CPU µs/req", "p50 ms", "p99 ms", "lag p50 µs", "lag p99 µs", "lag max µs (median of rounds)", "errors"}, rows)
	v := s.res.Values
	if withWrk {
		r := ratio(s.pick("closed-64", "loadgen"), s.pick("closed-64", "wrk"), cpu("generator"))
		v["closed-64 loadgen/wrk cpu"] = r
		fmt.Fprintf(b, "Closed loop, CPU per request loadgen ÷ wrk (median of per-round ratios): **%s**; throughput ratio: %s.\n\n",
			fmtNum(r, 2), fmtNum(ratio(s.pick("closed-64", "loadgen"), s.pick("closed-64", "wrk"), rateOf), 2))
	}
	if withWrk2 {
		lg, w2 := s.pick(openName, "loadgen"), s.pick(openName, "wrk2")
		r := ratio(lg, w2, cpu("generator"))
		v[openName+" loadgen/wrk2 cpu"] = r
		fmt.Fprintf(b, "Open loop at %d req/s, CPU per request loadgen ÷ wrk2 (median of per-round ratios): **%s**; p50 ratio %s, p99 ratio %s "+
			"(wrk2's rate: %s req/s, median; its CPU per request is taken at the rate it reached).\n\n",
			rate, fmtNum(r, 2), fmtNum(ratio(lg, w2, func(x Sample) float64 { return x.P50 }), 3), fmtNum(ratio(lg, w2, p99Of), 3),
			fmtNum(medianOf(w2, rateOf), 0))
	}
	if wake, ok := v["floor wake cpu us"]; ok {
		fmt.Fprintf(b, "**This machine's floor** (measured once before the rounds, on the quiet machine: one goroutine locked to its thread "+
			"sleeps until absolute times %v apart, as the open loop does, with raw `clock_nanosleep` and a timer slack of 1 ns, and "+
			"does nothing else): **%s µs of CPU per wake-up**; woken late by p99 %s µs, p99.9 %s µs, max **%s µs**. "+
			"No open loop that sleeps until its slots spends less per request or sends more punctually than that here; "+
			"profiles/README.md compares it with C (`profiles/wake.c`, `profiles/lateness.c`).\n\n",
			time.Second/time.Duration(rate), fmtNum(wake, 1), fmtNum(v["floor late p99 us"], 0), fmtNum(v["floor late p99.9 us"], 0),
			fmtNum(v["floor late max us"], 0))
	}
	defer func() { s.res.Markdown = b.String() }()
	if s.o.Smoke {
		return
	}
	wrkCPU, ok := v["closed-64 wrk cpu us/req"]
	wrkText := fmtNum(wrkCPU, 1) + " µs (wrk, closed loop)"
	if !ok {
		wrkText = "– (wrk not installed)"
	}
	wrk2Text := "– (wrk2 not found)"
	if x, ok := v[openName+" wrk2 cpu us/req"]; ok {
		wrk2Text = fmtNum(x, 1) + " µs"
	}
	fmt.Fprintf(b, "#### against the loadgen targets\n\n")
	table(b, []string{"figure", "target", "measured"}, [][]string{
		{fmt.Sprintf("loadgen open-loop CPU per request at %d req/s", rate), "≤ " + wrkText, fmtNum(v[openName+" loadgen cpu us/req"], 1) + " µs"},
		{"… with -coalesce 250us", "", fmtNum(v[openName+"-coalesce loadgen cpu us/req"], 1) + " µs"},
		{fmt.Sprintf("wrk2's open-loop CPU per request at %d req/s (the reference open loop, in C)", rate), "", wrk2Text},
		{fmt.Sprintf("schedule lag p99 at %d req/s", rate), "≤ 100 µs", fmtNum(v[openName+" loadgen lag p99 us"], 0) + " µs"},
		{fmt.Sprintf("schedule lag max at %d req/s (largest of the rounds)", rate), "≤ 2 000 µs", fmtNum(v[openName+" loadgen lag max us"], 0) + " µs"},
	})
}

// wrkVersion returns wrk's version line, or "wrk" when unknown.
func wrkVersion() string {
	out, _ := exec.Command(wrkPath, "-v").CombinedOutput()
	l, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if f := strings.Fields(l); len(f) >= 2 {
		return "wrk " + f[1]
	}
	return "wrk"
}
