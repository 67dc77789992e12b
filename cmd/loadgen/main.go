// Command loadgen is pinned's HTTP and WebSocket load generator: open loop
// (a constant rate, a ramp or steps; latency from each request's intended
// send time, coordinated-omission free) or closed loop (N connections),
// over uniform, Zipf or always-new ids, reporting HdrHistogram percentiles
// as a table, JSON (with a per-second series), an HTML page with the
// percentile and time-series charts, and an .hgrm file.
//
//	loadgen -url http://127.0.0.1:8080 -path '/counter/{id}/' -rate 12000 -c 64 -duration 30s -json out.json -plot out.html
//	loadgen -url http://127.0.0.1:8080 -rate 1000:20000 -ramp 60s        # linear ramp, then hold
//	loadgen -url http://127.0.0.1:8080 -rate 1000,5000,10000 -step 20s   # steps
//	loadgen plot -o plot.html direct.json pinboard.json
//
// Plain http runs on the event-loop engine (one loop per CPU: GOMAXPROCS is
// raised to one more than the CPUs unless the environment sets it); https
// and websocket scenarios on the fasthttp engine. See package loadgen.
//
// Before the run it resolves the target's host and opens one connection to
// it (loadgen.Runner.Probe): a host that does not resolve or a port out of
// range is a usage error, a target that refuses the connection fails at
// once, and nothing is sent to either.
//
// Exit status: 0 the run completed and its error rate (failed and unsent
// requests) is within -max-errors (1% unless set); 1 the error rate
// exceeded it, no request succeeded, or the target could not be reached;
// 2 bad flags or configuration; 3 the run was interrupted or a report
// could not be written.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/loadgen"
)

// Exit codes: those every pinned command shares (cmdline), and 3.
const (
	exitOK        = cmdline.ExitOK
	exitErrorRate = cmdline.ExitFailed // also: the target cannot be reached
	exitUsage     = cmdline.ExitUsage
	exitRun       = 3 // interrupted, or a report could not be written
)

// defaultMaxErrors is -max-errors' default: the error budget of a run.
const defaultMaxErrors = 0.01

// maxFileSize bounds a header file.
const maxFileSize = 1 << 20

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the flags that are not part of loadgen.Config.
type options struct {
	jsonPath, plotPath, hgrmPath string
	quiet                        bool
	maxErrors                    float64 // the error budget, a fraction; negative: none
}

// headerFlags collects repeated -H "Name: value" flags; -H @file reads one
// header per line from file.
type headerFlags []loadgen.Header

func (h *headerFlags) String() string { return "" }

func (h *headerFlags) Set(s string) error {
	if path, ok := strings.CutPrefix(s, "@"); ok {
		data, err := readSmallFile(path, maxFileSize)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(data), "\n") {
			line = strings.TrimRight(line, "\r")
			if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := h.add(line); err != nil {
				return fmt.Errorf("%s line %d: %w", path, i+1, err)
			}
		}
		return nil
	}
	return h.add(s)
}

func (h *headerFlags) add(s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok {
		return fmt.Errorf("want \"Name: value\", got %q", s)
	}
	*h = append(*h, loadgen.Header{Name: strings.TrimSpace(name), Value: strings.TrimSpace(value)})
	return nil
}

// readSmallFile reads a file of at most limit bytes.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return data, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "plot" {
		return plotCommand(args[1:], stdout, stderr)
	}
	cfg, opts, err := parseFlags(args, stdout)
	if err != nil { // every error of the flags is a usage error
		return cmdline.Exit(stderr, "loadgen", cmdline.Usage(err))
	}
	if !opts.quiet {
		cfg.Progress = stderr
	}
	// A loop blocks in system calls; with one idle P the runtime leaves
	// each loop its own (see package loadgen), so one loop per CPU needs
	// one P more than the CPUs.
	procs := runtime.GOMAXPROCS(0)
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(procs + 1)
		defer runtime.GOMAXPROCS(procs)
		if cfg.Loops == 0 {
			cfg.Loops = procs
		}
	}
	r, err := loadgen.New(cfg)
	if err != nil {
		return cmdline.Exit(stderr, "loadgen", cmdline.Usage(err))
	}
	if err := r.Probe(ctx); err != nil {
		switch {
		case ctx.Err() != nil:
			fmt.Fprintln(stderr, "loadgen: interrupted before the run; nothing was sent")
			return exitRun
		case errors.Is(err, loadgen.ErrUnresolvable):
			err = cmdline.Usagef("-url %s: %w", cfg.URL, err)
		default:
			err = fmt.Errorf("%w; nothing was sent", err)
		}
		return cmdline.Exit(stderr, "loadgen", err)
	}
	if r.Engine() != loadgen.EngineLoop {
		runtime.GOMAXPROCS(procs)
	}
	rep, err := r.Run(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitRun
	}
	return writeReports(rep, opts, stdout, stderr)
}

// parseFlags reads the command line into a loadgen.Config and the options;
// -h and -version write to stdout.
func parseFlags(args []string, stdout io.Writer) (loadgen.Config, options, error) {
	var (
		cfg         loadgen.Config
		opts        options
		headers     headerFlags
		scenario    = loadgen.Scenario{}
		kind        string
		mix         string
		dist        string
		rate        string
		ramp        time.Duration
		step        time.Duration
		duration    time.Duration
		durationSet bool
		kindSet     bool
		requests    int64
		requestsSet bool
		engine      string
		bodyFile    string
		insecure    bool
		caFile      string
	)
	set := cmdline.New("loadgen", "", `pinned's HTTP and WebSocket load generator: loadgen -url http[s]://host:port [flags].
loadgen plot [-title T] -o plot.html report.json... overlays saved runs.

-rate takes N (constant), A:B with -ramp D (linear from A to B over D, then B), or
A,B,C with -step D (each rate for D, the last one held); -duration then defaults to
the ramp or the steps. A run is bounded by -duration (10s unless -requests alone is
given) or -requests; with both the first reached ends it, and the report names it.
Before the run the target's host is resolved and one connection opened: an unresolvable
host is a usage error, a refused connection fails at once. The achieved rate counts
successful responses per second. Exit status: 0 ok; 1 the error rate (failed and unsent
requests) is above -max-errors, no request succeeded, or the target refused; 2 bad flags
or config; 3 interrupted or output failed.`)
	set.String(&cfg.URL, "url", "", "URL", "", "target base URL, http://host:port or https://host:port (required)")
	set.String(&cfg.Path, "path", "", "template", loadgen.DefaultPath, "path template; every {id} is replaced by the request's id")
	set.String(&rate, "rate", "", "N|A:B|A,B,C", "0", "open loop at this many requests/s (see above), latency from the intended send time; 0: closed loop")
	set.Duration(&ramp, "ramp", "", 0, "with -rate A:B: the ramp's duration")
	set.Duration(&step, "step", "", 0, "with -rate A,B,C: how long each rate holds")
	set.Int(&cfg.Connections, "c", "", loadgen.DefaultConnections, "connections (closed loop: all busy back to back; open loop: at most this many)")
	set.String(&engine, "engine", "", "engine", string(loadgen.EngineAuto), "auto, loop (event loops, plain http) or fasthttp (https, websocket)")
	set.Int(&cfg.Loops, "loops", "", 0, "event loops of the loop engine (0: one per CPU)")
	set.Duration(&cfg.Coalesce, "coalesce", "", 0, "loop engine, open loop: send a slot up to this late to send it with the next ones in one wake-up (less CPU, more lag; 0: every slot on time)")
	set.Int(&cfg.MaxWorkers, "max-workers", "", 0, "fasthttp engine, open loop: bound on the worker pool (0: -c)")
	set.Var(tracked(&duration, &durationSet, loadgen.DefaultDuration, time.ParseDuration, time.Duration.String), "duration", "", "duration",
		"measured duration; 0: no time bound (with -ramp or -step: the schedule's length)")
	set.Var(tracked(&requests, &requestsSet, 0, parseInt64, formatInt64), "requests", "", "int",
		"measured requests; 0: no count bound. Alone, the run has no time bound; with -duration the first bound reached ends\nthe run, and the report says which")
	set.Duration(&cfg.Warmup, "warmup", "", 0, "load before the measured phase, excluded from every statistic")
	set.Var(tracked(&kind, &kindSet, string(loadgen.KindGet), func(v string) (string, error) { return v, nil }, func(v string) string { return v }),
		"scenario", "", "kind", "kind of request: get, post, download, upload or ws")
	set.String(&mix, "mix", "", "file", "", "scenario file (JSON weighted mix, see docs/testing.md); replaces -scenario, -method, -body-size and -body-file")
	set.Var(int64Value(&scenario.BodySize, 0), "body-size", "", "bytes", "generated request body (post, upload) or websocket message (ws); 0: the kind's default")
	set.String(&bodyFile, "body-file", "", "file", "", "request body from file (post; every {id} is replaced by the id); implies -scenario post")
	set.String(&scenario.Method, "method", "", "method", "", "HTTP method, {id} allowed (empty: GET, or POST for post and upload)")
	set.Var(&headers, "H", "", "header", "extra request header \"Name: value\" (repeatable); @file reads one per line")
	set.String(&dist, "dist", "", "distribution", string(loadgen.DistUniform), "ids: uniform, zipf or new (a new id per request: activation storm)")
	set.Int(&cfg.IDs.Keys, "keys", "", loadgen.DefaultKeys, "number of distinct ids for uniform and zipf")
	set.Float(&cfg.IDs.ZipfS, "zipf-s", "", loadgen.DefaultZipfS, "Zipf exponent s > 0 (1: classic Zipf; larger: more skewed)")
	set.String(&cfg.IDs.Prefix, "id-prefix", "", "string", loadgen.DefaultIDPrefix, "prefix of every id")
	set.String(&cfg.IDs.RunID, "run-id", "", "string", "", "run id that makes -dist new ids unique across runs (empty: random)")
	set.Var(cmdline.Parsed[uint64]{P: &cfg.IDs.Seed, Parse: func(v string) (uint64, error) {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, errors.New("want an unsigned integer")
		}
		return n, nil
	}, Format: func(v uint64) string { return strconv.FormatUint(v, 10) }}, "seed", "", "uint", "seed of the id and scenario choices (0: random)")
	set.Duration(&cfg.Timeout, "timeout", "", loadgen.DefaultTimeout, "timeout of each request, including streamed bodies")
	set.Duration(&cfg.ConnWaitTimeout, "conn-wait", "", loadgen.DefaultConnWaitTimeout, "fasthttp engine: how long a request waits for a free connection (error class pool)")
	set.Duration(&cfg.DrainTimeout, "drain", "", loadgen.DefaultDrainTimeout, "open loop: how long waiting requests may still be sent after the schedule ends (then: unsent)")
	set.Duration(&cfg.MaxLatency, "max-latency", "", loadgen.DefaultMaxLatency, "histogram range; larger latencies are clamped and counted")
	set.Bool(&insecure, "insecure", "", "https: do not verify the target's certificate")
	set.String(&caFile, "cacert", "", "file", "", "https: verify the target's certificate against the PEM certificates in file (instead of the system roots)")
	set.String(&cfg.Label, "label", "", "string", "", "run label in reports and plots")
	set.String(&opts.jsonPath, "json", "", "file", "", "write the JSON report to file (-: stdout; the table then goes to stderr)")
	set.String(&opts.plotPath, "plot", "", "file", "", "write the HTML report (percentile and time-series charts) to file")
	set.String(&opts.hgrmPath, "hgrm", "", "file", "", "write the latency distribution in HdrHistogram's .hgrm text format to file")
	set.String(&cfg.TraceFile, "trace-out", "", "file", "", "number every request in a Trace-Seq field and write one CSV line per measured request to file: seq, status, and when it was due, sent, received by the kernel and done (absolute CLOCK_MONOTONIC ns; event-loop engine)")
	set.Bool(&opts.quiet, "quiet", "", "no progress line on stderr")
	opts.maxErrors = defaultMaxErrors
	set.Var(cmdline.Parsed[float64]{P: &opts.maxErrors, Parse: parseBudget, Format: formatBudget}, "max-errors", "", "percent|off",
		"error budget: exit 1 if the error rate (failed+unsent)/(sent+unsent) exceeds it; off: only when nothing succeeded")
	if err := set.Parse(args, nil, stdout); err != nil {
		return cfg, opts, err
	}
	scheduled, err := parseRate(&cfg, rate, ramp, step)
	if err != nil {
		return cfg, opts, err
	}
	switch {
	case durationSet:
	case scheduled > 0:
		duration = scheduled
	case requestsSet && requests > 0:
		duration = 0 // a count alone bounds the run
	}
	switch {
	case duration < 0:
		return cfg, opts, fmt.Errorf("-duration %v: want ≥ 0 (0 = no time bound)", duration)
	case requests < 0:
		return cfg, opts, fmt.Errorf("-requests %d: want ≥ 0 (0 = no count bound)", requests)
	case duration == 0 && requests == 0:
		return cfg, opts, errors.New("-duration 0 and -requests 0: bound the run by at least one of them")
	case cfg.Connections <= 0:
		return cfg, opts, fmt.Errorf("-c %d: want ≥ 1", cfg.Connections)
	case !cfg.IsOpenLoop() && cfg.MaxWorkers != 0:
		return cfg, opts, errors.New("-max-workers applies to the open loop only; set -rate too")
	case insecure && caFile != "":
		return cfg, opts, errors.New("-insecure and -cacert: choose one")
	}
	cfg.Duration, cfg.Requests = duration, requests
	if duration == 0 {
		cfg.Duration = loadgen.Unbounded
	}
	if requests == 0 {
		cfg.Requests = loadgen.Unbounded
	}
	cfg.Engine = loadgen.Engine(engine)
	cfg.IDs.Dist = loadgen.Dist(dist)
	cfg.Headers = headers
	if insecure {
		cfg.TLS = &tls.Config{InsecureSkipVerify: true}
	}
	if caFile != "" {
		pem, err := readSmallFile(caFile, maxFileSize)
		if err != nil {
			return cfg, opts, fmt.Errorf("-cacert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return cfg, opts, fmt.Errorf("-cacert %s: no PEM certificate in it", caFile)
		}
		cfg.TLS = &tls.Config{RootCAs: pool}
	}
	if mix != "" {
		if scenario.BodySize != 0 || scenario.Method != "" || kindSet || bodyFile != "" {
			return cfg, opts, errors.New("-mix replaces -scenario, -method, -body-size and -body-file; set them in the scenario file")
		}
		scs, err := loadgen.LoadScenarioFile(mix, cfg.Path)
		if err != nil {
			return cfg, opts, err
		}
		cfg.Scenarios = scs
		return cfg, opts, nil
	}
	scenario.Kind = loadgen.Kind(kind)
	if bodyFile != "" {
		if kindSet && scenario.Kind != loadgen.KindPost {
			return cfg, opts, fmt.Errorf("-body-file with -scenario %s: a body file is for post", kind)
		}
		body, err := readSmallFile(bodyFile, loadgen.MaxHeldBodySize)
		if err != nil {
			return cfg, opts, fmt.Errorf("-body-file: %w", err)
		}
		scenario.Kind, scenario.Body = loadgen.KindPost, string(body)
		if len(body) == 0 {
			return cfg, opts, fmt.Errorf("-body-file %s is empty", bodyFile)
		}
	}
	cfg.Scenarios = []loadgen.Scenario{scenario}
	return cfg, opts, nil
}

// tracked is a setting that records whether the command line set it.
func tracked[T any](p *T, isSet *bool, def T, parse func(string) (T, error), format func(T) string) cmdline.Parsed[T] {
	*p = def
	return cmdline.Parsed[T]{P: p, Format: format, Parse: func(v string) (T, error) {
		x, err := parse(v)
		if err == nil {
			*isSet = true
		}
		return x, err
	}}
}

// int64Value is an int64 setting with default def.
func int64Value(p *int64, def int64) cmdline.Parsed[int64] {
	*p = def
	return cmdline.Parsed[int64]{P: p, Format: formatInt64, Parse: parseInt64}
}

func parseInt64(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errors.New("want an integer")
	}
	return n, nil
}

func formatInt64(v int64) string { return strconv.FormatInt(v, 10) }

// parseBudget reads -max-errors: a percentage from 0% to 100%, or off (a
// negative budget: only a run with no success fails).
func parseBudget(v string) (float64, error) {
	if v == "off" {
		return -1, nil
	}
	num, ok := strings.CutSuffix(v, "%")
	f, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || !(f >= 0 && f <= 100) {
		return 0, errors.New("want a percentage from 0% to 100%, such as 1% or 0.5%, or off")
	}
	return f / 100, nil
}

func formatBudget(f float64) string {
	if f < 0 {
		return "off"
	}
	return strconv.FormatFloat(f*100, 'g', -1, 64) + "%"
}

// parseRate reads -rate (with -ramp or -step) into cfg and returns how long
// the rate schedule lasts (0 for a constant rate).
func parseRate(cfg *loadgen.Config, rate string, ramp, step time.Duration) (time.Duration, error) {
	num := func(s string) (float64, error) {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || !(v > 0) {
			return 0, fmt.Errorf("-rate %q: %q is not a rate > 0", rate, s)
		}
		return v, nil
	}
	switch {
	case strings.Contains(rate, ":"):
		a, b, _ := strings.Cut(rate, ":")
		from, err := num(a)
		if err != nil {
			return 0, err
		}
		to, err := num(b)
		if err != nil {
			return 0, err
		}
		if ramp <= 0 || step != 0 {
			return 0, fmt.Errorf("-rate %s ramps: give the ramp's duration with -ramp (and no -step)", rate)
		}
		cfg.Stages = []loadgen.Stage{{Duration: ramp, Rate: from, EndRate: to}}
		return ramp, nil
	case strings.Contains(rate, ","):
		if step <= 0 || ramp != 0 {
			return 0, fmt.Errorf("-rate %s steps: give each step's duration with -step (and no -ramp)", rate)
		}
		parts := strings.Split(rate, ",")
		for i, p := range parts {
			v, err := num(p)
			if err != nil {
				return 0, err
			}
			d := step
			if i == len(parts)-1 {
				d = 0 // the last rate holds until the run ends
			}
			cfg.Stages = append(cfg.Stages, loadgen.Stage{Duration: d, Rate: v})
		}
		return time.Duration(len(parts)) * step, nil
	}
	if ramp != 0 || step != 0 {
		return 0, errors.New("-ramp and -step need a -rate of the form A:B or A,B,C")
	}
	v, err := strconv.ParseFloat(rate, 64)
	if err != nil {
		return 0, fmt.Errorf("-rate %q: want a number of requests per second, A:B or A,B,C", rate)
	}
	cfg.Rate = v
	return 0, nil
}

func writeReports(rep *loadgen.Report, opts options, stdout, stderr io.Writer) int {
	code := exitOK
	fail := func(what string, err error) {
		fmt.Fprintf(stderr, "loadgen: cannot write %s: %v\n", what, err)
		code = exitRun
	}
	table := stdout
	if opts.jsonPath == "-" {
		table = stderr
		if err := rep.WriteJSON(stdout); err != nil {
			fail("JSON report", err)
		}
	}
	if err := rep.WriteText(table); err != nil {
		fail("report", err)
	}
	if opts.jsonPath != "" && opts.jsonPath != "-" {
		if err := writeFile(opts.jsonPath, rep.WriteJSON); err != nil {
			fail("JSON report", err)
		}
	}
	if opts.plotPath != "" {
		err := writeFile(opts.plotPath, func(w io.Writer) error {
			return loadgen.WritePlotHTML(w, "", []*loadgen.Report{rep})
		})
		if err != nil {
			fail("plot", err)
		}
	}
	if opts.hgrmPath != "" {
		if err := writeFile(opts.hgrmPath, rep.WriteHgrm); err != nil {
			fail(".hgrm", err)
		}
	}
	ok := rep.Requests.Sent - rep.Requests.Errors
	switch {
	case code != exitOK:
		return code
	case rep.StoppedBy == loadgen.StopCanceled:
		fmt.Fprintln(stderr, "loadgen: interrupted; the report covers the run so far")
		return exitRun
	case ok <= 0:
		fmt.Fprintf(stderr, "loadgen: no request succeeded (%d sent, %d failed, %d unsent)\n", rep.Requests.Sent, rep.Requests.Errors, rep.Requests.Unsent)
		return exitErrorRate
	case opts.maxErrors >= 0 && rep.ErrorRate > opts.maxErrors:
		fmt.Fprintf(stderr, "loadgen: error rate %.3f%% exceeds the error budget -max-errors %s\n", 100*rep.ErrorRate, formatBudget(opts.maxErrors))
		return exitErrorRate
	}
	return exitOK
}

// writeFile writes through fn into path, replacing it only when fn and the
// close succeed.
func writeFile(path string, fn func(io.Writer) error) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := fn(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// plotCommand merges saved JSON reports into one plot:
// loadgen plot [-title T] -o plot.html a.json b.json ...
func plotCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen plot", flag.ContinueOnError)
	fs.SetOutput(stderr) // the flag package's own error lines
	out := fs.String("o", "", "")
	title := fs.String("title", "", "")
	usage := stdout // -h; after a usage error, stderr
	fs.Usage = func() {
		// Written out: flag.PrintDefaults leaves out empty defaults.
		fmt.Fprint(usage, `Usage: loadgen plot [-title T] -o plot.html report.json...

Overlays saved JSON reports (-json) on one HTML page.

  -o file (default "")
      output HTML file (required; -: stdout)
  -title string (default "")
      plot title (empty: "loadgen latency")
`)
	}
	if slices.Contains(args, "-h") || slices.Contains(args, "-help") || slices.Contains(args, "--help") {
		fs.Usage()
		return exitOK
	}
	usage = stderr
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *out == "" || fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	var reps []*loadgen.Report
	for _, p := range fs.Args() {
		f, err := os.Open(p)
		if err != nil {
			fmt.Fprintln(stderr, "loadgen plot:", err)
			return exitUsage
		}
		rep, err := loadgen.ReadReport(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "loadgen plot: %s: %v\n", p, err)
			return exitUsage
		}
		reps = append(reps, rep)
	}
	write := func(w io.Writer) error { return loadgen.WritePlotHTML(w, *title, reps) }
	var err error
	if *out == "-" {
		err = write(stdout)
	} else {
		err = writeFile(*out, write)
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadgen plot: cannot write plot:", err)
		return exitRun
	}
	return exitOK
}
