package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/procrun"
)

// Suite names, in the order "all" runs them.
var Suites = []string{"proxy", "activation", "streaming", "websocket", "redis", "memory", "alarms", "failover", "loadgen"}

// Options configure Run. The zero value of a field means its default
// (full mode) or its smoke default when Smoke is set.
type Options struct {
	// Suites to run (names from Suites, or "profile"); empty means all.
	Suites []string
	// OutDir receives the markdown report and its JSON twin. Default
	// "bench/results" (relative to ModuleDir).
	OutDir string
	// ModuleDir is the module root, where binaries are built. Default ".".
	ModuleDir string
	// Smoke runs every suite for about a second per measurement, one
	// round, no load check, no install: a check that the suites work, not a
	// measurement.
	Smoke bool
	// Rounds is the number of A B C D … rounds (default 5; smoke 1).
	Rounds int
	// Duration of each measured load run (default 5 s; smoke 500 ms).
	Duration time.Duration
	// Warmup is the unmeasured run before a target's first round
	// (default 1 s; smoke 200 ms).
	Warmup time.Duration
	// Force runs on a loaded machine (the report says so).
	Force bool
	// MaxBusy is the busy fraction of all cores above which Run refuses
	// (default 0.10).
	MaxBusy float64
	// NoPeers skips nginx and HAProxy; Install installs them when missing,
	// and wrk for the loadgen suite.
	NoPeers, Install bool
	// Wrk2 is the path of a wrk2 binary for the loadgen suite's wrk2 rows
	// (empty: "wrk2" on PATH; rows skipped when there is none).
	Wrk2 string
	// PinGen, PinProxy and PinBackend are taskset CPU lists for the load
	// generator, the proxies (pinboard, nginx, HAProxy) and the backends
	// (counter workers, redis-server); empty means not pinned.
	PinGen, PinProxy, PinBackend string
	// Workers is the number of fleet workers in the activation and alarms
	// suites (default 2; every other suite uses one backend process).
	Workers int
	// PinboardB, when set, is a second pinboard binary run next to the
	// built one on the same Redis and worker: the proxy suite then
	// alternates both ("pinboard-b"), for before/after comparisons.
	PinboardB string
	// Workloads, when set, restricts the proxy suite to these workloads
	// (closed-64, closed-256, open-12k, cost-5k).
	Workloads []string
	// Failover sizes the failover suite.
	Failover FailoverOptions
	// ProfileDir receives the profile suite's .pb.gz files (default
	// "profiles").
	ProfileDir string
	// ScaleRows selects the rows of the scale suite (S1 … S8, ScaleRows);
	// empty means all. ScaleMax bounds its points: the largest multiple of
	// a row's first point it runs (1, 10, 100 or 1000; 0 means 1000).
	ScaleRows []string
	ScaleMax  int
	// Log receives progress lines; nil means io.Discard.
	Log io.Writer
	// Command is the command line recorded in the report.
	Command string
}

func (o *Options) defaults() {
	def := func(v *time.Duration, full, smoke time.Duration) {
		if *v == 0 {
			*v = full
			if o.Smoke {
				*v = smoke
			}
		}
	}
	def(&o.Duration, 5*time.Second, 500*time.Millisecond)
	def(&o.Warmup, time.Second, 200*time.Millisecond)
	if o.Rounds == 0 {
		o.Rounds = 5
		if o.Smoke {
			o.Rounds = 1
		}
	}
	if o.MaxBusy == 0 {
		o.MaxBusy = 0.10
	}
	if o.Workers == 0 {
		o.Workers = 2
	}
	if o.ModuleDir == "" {
		o.ModuleDir = "."
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join(o.ModuleDir, "bench", "results")
	}
	if o.ProfileDir == "" {
		o.ProfileDir = filepath.Join(o.ModuleDir, "profiles")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	o.Failover.defaults(o.Smoke)
	if len(o.Suites) == 0 || slices.Contains(o.Suites, "all") {
		o.Suites = Suites
	}
}

// Sample is one measured load run of one target in one round.
type Sample struct {
	Workload string `json:"workload"`
	Target   string `json:"target"`
	Round    int    `json:"round"`
	// Rate is the achieved rate: requests (or websocket round trips) per
	// second, failed ones included, as wrk counts them (loadgen's own
	// achievedRate counts successes only; Goodput is the 2xx rate).
	Rate float64 `json:"rate"`
	// MBps is body megabytes (10^6) per second the way the workload moves
	// them, the larger of the two: response bodies for downloads, request
	// bodies for uploads.
	MBps             float64 `json:"mbps,omitempty"`
	P50, P99, P999   float64 // milliseconds
	Sent, Errors     int64
	Unsent           int64              `json:"unsent,omitempty"`
	ErrorDetail      string             `json:"errorDetail,omitempty"`
	CPUus            map[string]float64 `json:"cpuUsPerRequest"` // role → CPU µs per request
	Syscalls         map[string]float64 `json:"syscallsPerRequest,omitempty"`
	CSwitches        map[string]float64 `json:"contextSwitchesPerRequest,omitempty"`
	ProxyRSSKiB      int64              `json:"proxyRssKiB,omitempty"`
	ProxyPeakRSSKiB  int64              `json:"proxyPeakRssKiB,omitempty"`
	ScheduleLagP50Ms float64            `json:"scheduleLagP50Ms,omitempty"`
	ScheduleLagP99Ms float64            `json:"scheduleLagP99Ms,omitempty"`
	ScheduleLagMaxMs float64            `json:"scheduleLagMaxMs,omitempty"`
	// Goodput is 2xx responses per second; Shed counts 503 answers and
	// Broken the requests that got no HTTP answer (reset, closed, timed
	// out): the overload workload's figures.
	Goodput float64 `json:"goodput"`
	Shed    int64   `json:"shed,omitempty"`
	Broken  int64   `json:"broken,omitempty"`
	// OtherBusy is the fraction of all cores busy during the run outside
	// the suite's processes (other work on the machine, kernel threads).
	OtherBusy float64 `json:"otherBusy"`
}

// SuiteResult is what one suite measured.
type SuiteResult struct {
	Name    string   `json:"name"`
	Samples []Sample `json:"samples,omitempty"`
	// Values are the suite's headline numbers by name (e.g.
	// "pinboard/direct closed-64", "redis commands/request").
	Values map[string]float64 `json:"values"`
	// Markdown is the suite's section of the report.
	Markdown string `json:"-"`
	// Notes are skipped parts and caveats, also in Markdown.
	Notes []string `json:"notes,omitempty"`
	// Failover holds the failover suite's kills, one per size,
	// configuration and round.
	Failover []FailoverRun `json:"failover,omitempty"`
}

// Results is everything one Run measured.
type Results struct {
	Started  time.Time      `json:"started"`
	Smoke    bool           `json:"smoke"`
	Busy     float64        `json:"busyBefore"` // /proc/stat busy fraction before the first suite
	Machine  [][2]string    `json:"machine"`
	Suites   []*SuiteResult `json:"suites"`
	Report   string         `json:"-"` // path of the markdown report
	JSONPath string         `json:"-"`
}

// ErrLoaded is returned when the machine is too busy to measure.
var ErrLoaded = errors.New("machine is loaded")

// CheckSuites returns an error naming the first of names that is not a
// suite: one of Suites, "profile", "scale", "trace" (-trace-slow) or "all".
func CheckSuites(names []string) error {
	for _, s := range names {
		if !slices.Contains(Suites, s) && s != "profile" && s != "scale" && s != "trace" && s != "all" {
			return fmt.Errorf("unknown suite %q; want one of %v, profile, scale, trace or all", s, Suites)
		}
	}
	return nil
}

// Run runs the selected suites against real processes on 127.0.0.1 and
// writes a markdown report (and its JSON twin) to OutDir. Every process it
// starts is killed before it returns.
func Run(ctx context.Context, o Options) (*Results, error) {
	o.defaults()
	if err := CheckSuites(o.Suites); err != nil {
		return nil, err
	}
	if err := o.Failover.Check(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(o.Log, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	res := &Results{Started: time.Now().UTC(), Smoke: o.Smoke}
	busy, err := busyFraction(ctx, 2*time.Second)
	if err != nil {
		return nil, err
	}
	res.Busy = busy
	logf("machine busy %.0f%% over 2 s (threshold %.0f%%)", 100*busy, 100*o.MaxBusy)
	if !o.Smoke && busy > o.MaxBusy && !o.Force {
		return nil, fmt.Errorf("%w: %.0f%% of all cores busy over 2 s (threshold %.0f%%); measure on a quiet machine or pass -force (the report will say so)", ErrLoaded, 100*busy, 100*o.MaxBusy)
	}
	if !o.Smoke && o.Install {
		var want []string
		if !o.NoPeers {
			want = append(want, "nginx", "haproxy")
		}
		if slices.Contains(o.Suites, "loadgen") {
			want = append(want, "wrk")
		}
		if err := installMissing(logf, want...); err != nil {
			return nil, err
		}
	}
	res.Machine = append(machineInfo(), [2]string{"pinned", gitDescribe(o.ModuleDir)})

	logf("building binaries")
	var b procrun.Builder
	b.Dir = o.ModuleDir
	defer b.Cleanup()
	var bins binaries
	for _, x := range []struct {
		dst *string
		pkg string
	}{
		{&bins.pinboard, "github.com/pinned-go/pinned/cmd/pinboard"},
		{&bins.counter, "github.com/pinned-go/pinned/test/app/counter"}, // the demo with GET /blob and PINNED_HISTORY
		{&bins.loadgen, "github.com/pinned-go/pinned/cmd/loadgen"},
		{&bins.simworkers, "github.com/pinned-go/pinned/test/app/simworkers"}, // the scale suite's simulated workers
	} {
		if *x.dst, err = b.Build(x.pkg); err != nil {
			return nil, err
		}
	}
	bins.pinboardB = o.PinboardB
	if slices.Contains(o.Suites, "trace") {
		if bins.pinboardSpans, err = b.Build("github.com/pinned-go/pinned/cmd/pinboard", "pinned_spans"); err != nil {
			return nil, err
		}
		if bins.counterSpans, err = b.Build("github.com/pinned-go/pinned/test/app/counter", "pinned_spans"); err != nil {
			return nil, err
		}
	}

	for _, name := range o.Suites {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		logf("suite %s", name)
		s := &session{o: &o, bins: bins, logf: logf, started: res.Started, res: &SuiteResult{Name: name, Values: map[string]float64{}}}
		var err error
		switch name {
		case "proxy":
			err = s.proxySuite(ctx)
		case "activation":
			err = s.activationSuite(ctx)
		case "streaming":
			err = s.streamingSuite(ctx)
		case "websocket":
			err = s.websocketSuite(ctx)
		case "redis":
			err = s.redisSuite(ctx)
		case "memory":
			err = s.memorySuite(ctx)
		case "alarms":
			err = s.alarmsSuite(ctx)
		case "failover":
			err = s.failoverSuite(ctx)
		case "loadgen":
			err = s.loadgenSuite(ctx)
		case "profile":
			err = s.profileSuite(ctx)
		case "scale":
			err = s.scaleSuite(ctx)
		case "trace":
			err = s.traceSuite(ctx)
		}
		if err != nil {
			return res, fmt.Errorf("suite %s: %w", name, err)
		}
		res.Suites = append(res.Suites, s.res)
	}
	if err := res.write(&o); err != nil {
		return res, err
	}
	logf("report: %s", res.Report)
	return res, nil
}

// session runs one suite.
type session struct {
	o       *Options
	bins    binaries
	logf    func(string, ...any)
	started time.Time // the run's start: the report's name (its plots sit beside it)
	res     *SuiteResult
	md      strings.Builder
}

func (s *session) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	s.res.Notes = append(s.res.Notes, n)
	s.logf("note: %s", n)
}

// median returns the median of xs (NaN when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	c := slices.Clone(xs)
	sort.Float64s(c)
	n := len(c)
	if n%2 == 1 {
		return c[n/2]
	}
	return (c[n/2-1] + c[n/2]) / 2
}

// dropNaN removes values that could not be measured (NaN, ±Inf: perf
// missing, no samples), which JSON cannot carry.
func (r *Results) dropNaN() {
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }
	clean := func(m map[string]float64) {
		for k, v := range m {
			if bad(v) {
				delete(m, k)
			}
		}
	}
	for _, s := range r.Suites {
		clean(s.Values)
		for i := range s.Samples {
			x := &s.Samples[i]
			clean(x.CPUus)
			clean(x.Syscalls)
			clean(x.CSwitches)
			if bad(x.OtherBusy) {
				x.OtherBusy = -1
			}
		}
	}
}

// gitDescribe names the tree the binaries were built from.
func gitDescribe(dir string) string {
	cmd := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=12")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	return "commit " + strings.TrimSpace(string(out))
}

// write writes the markdown report and the JSON twin.
func (r *Results) write(o *Options) error {
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return err
	}
	stamp := r.Started.Format("20060102-1504")
	name := stamp + "-" + strings.Join(o.Suites, "-")
	if r.Smoke {
		name += "-smoke"
	}
	r.Report = filepath.Join(o.OutDir, name+".md")
	r.JSONPath = filepath.Join(o.OutDir, name+".json")
	var md strings.Builder
	fmt.Fprintf(&md, "# pinned bench: %s\n\n", strings.Join(o.Suites, ", "))
	if r.Smoke {
		md.WriteString("**Smoke run**: about a second per measurement, one round. It checks that the suites work; its numbers are not measurements.\n\n")
	}
	cmdline := o.Command
	if vars := passThrough(os.Environ(), "PINBOARD_", nil); len(vars) > 0 {
		cmdline = strings.Join(vars, " ") + " " + cmdline // they reach every pinboard (startPinboard)
	}
	fmt.Fprintf(&md, "Started %s UTC. Command: `%s`.\n\n", r.Started.Format("2006-01-02 15:04"), cmdline)
	busy := fmt.Sprintf("%.0f%% of all cores busy over 2 s before the run (threshold %.0f%%)", 100*r.Busy, 100*o.MaxBusy)
	if r.Busy > o.MaxBusy && !r.Smoke {
		busy += " — **the machine was loaded (-force): numbers are only indicative**"
	}
	fmt.Fprintf(&md, "Load check: %s.\n\n", busy)
	md.WriteString("| machine | |\n|---|---|\n")
	for _, kv := range r.Machine {
		fmt.Fprintf(&md, "| %s | %s |\n", kv[0], strings.ReplaceAll(kv[1], "|", "/"))
	}
	pin := func(v string) string {
		if v == "" {
			return "not pinned (all cores)"
		}
		return "taskset -c " + v
	}
	fmt.Fprintf(&md, "\nPinning: load generator %s; proxies (pinboard, nginx, HAProxy) %s; backends (counter workers, redis-server) %s. "+
		"Rounds %d, %v per measured run, %v warmup per target. Go processes run with the default GOMAXPROCS: the CPUs each may run on (%d unpinned).\n\n",
		pin(o.PinGen), pin(o.PinProxy), pin(o.PinBackend), o.Rounds, o.Duration, o.Warmup, runtime.NumCPU())
	var others []float64
	for _, s := range r.Suites {
		for _, x := range s.Samples {
			if !math.IsNaN(x.OtherBusy) && x.Rate > 0 {
				others = append(others, x.OtherBusy)
			}
		}
	}
	if len(others) > 0 {
		sort.Float64s(others)
		fmt.Fprintf(&md, "CPU outside the suites' processes during the measured runs (other work, kernel threads, perf): median %.1f%%, max %.1f%% of all cores.\n\n",
			100*median(others), 100*others[len(others)-1])
	}
	for _, s := range r.Suites {
		md.WriteString(s.Markdown)
		if len(s.Notes) > 0 {
			md.WriteString("\nNotes:\n\n")
			for _, n := range s.Notes {
				fmt.Fprintf(&md, "- %s\n", n)
			}
		}
		md.WriteString("\n")
	}
	if err := os.WriteFile(r.Report, []byte(md.String()), 0o644); err != nil {
		return err
	}
	r.dropNaN()
	js, err := jsonMarshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(r.JSONPath, js, 0o644)
}
