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
// Exit status: 0 the run completed and some request succeeded (and the
// error rate is within -max-error-rate, if set); 1 no request succeeded, or
// the error rate exceeded -max-error-rate; 2 bad flags or configuration; 3
// the run was interrupted or a report could not be written.
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pinned-go/pinned/loadgen"
)

// Exit codes.
const (
	exitOK        = 0
	exitErrorRate = 1
	exitUsage     = 2
	exitRun       = 3
)

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
	maxErrorRate                 float64
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
	cfg, opts, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitUsage
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
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitUsage
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

// usage prints every flag with its default, zero values included
// (flag.PrintDefaults leaves those out).
func usage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, `usage: loadgen -url http[s]://host:port [flags]
       loadgen plot [-title T] -o plot.html report.json...

`)
	fs.VisitAll(func(f *flag.Flag) {
		name, text := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  -%s", f.Name)
		if name != "" {
			fmt.Fprintf(w, " %s", name)
		}
		def := f.DefValue
		if def == "" {
			def = "none"
		}
		fmt.Fprintf(w, "\n    \t%s (default %s)\n", strings.ReplaceAll(text, "\n", "\n    \t"), def)
	})
	fmt.Fprint(w, `
-rate takes N (constant), A:B with -ramp D (linear from A to B over D, then B), or
A,B,C with -step D (each rate for D, the last one held); -duration then defaults to
the ramp or the steps. Exit status: 0 ok; 1 no request succeeded, or the error rate is
above -max-error-rate; 2 bad flags or config; 3 interrupted or output failed.
`)
}

func parseFlags(args []string, stderr io.Writer) (loadgen.Config, options, error) {
	var (
		cfg      loadgen.Config
		opts     options
		headers  headerFlags
		scenario = loadgen.Scenario{}
		kind     string
		mix      string
		dist     string
		rate     string
		ramp     time.Duration
		step     time.Duration
		duration time.Duration
		requests int64
		engine   string
		bodyFile string
		insecure bool
		caFile   string
	)
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(fs, stderr) }
	fs.StringVar(&cfg.URL, "url", "", "target base `URL`, http://host:port or https://host:port (required)")
	fs.StringVar(&cfg.Path, "path", loadgen.DefaultPath, "path `template`; every {id} is replaced by the request's id")
	fs.StringVar(&rate, "rate", "0", "open loop at this many requests/s (`N`, A:B or A,B,C: see below), latency from the intended send time; 0 = closed loop")
	fs.DurationVar(&ramp, "ramp", 0, "with -rate A:B: the ramp's duration")
	fs.DurationVar(&step, "step", 0, "with -rate A,B,C: how long each rate holds")
	fs.IntVar(&cfg.Connections, "c", loadgen.DefaultConnections, "connections (closed loop: all busy back to back; open loop: at most this many)")
	fs.StringVar(&engine, "engine", string(loadgen.EngineAuto), "`engine`: auto, loop (event loops, plain http) or fasthttp (https, websocket)")
	fs.IntVar(&cfg.Loops, "loops", 0, "event loops of the loop engine (0 = one per CPU)")
	fs.DurationVar(&cfg.Coalesce, "coalesce", 0, "loop engine, open loop: send a slot up to this late to send it with the next ones in one wake-up (less CPU, more lag; 0 = every slot on time)")
	fs.IntVar(&cfg.MaxWorkers, "max-workers", 0, "fasthttp engine, open loop: bound on the worker pool (0 = -c)")
	fs.DurationVar(&duration, "duration", loadgen.DefaultDuration, "measured duration; 0 = no time bound")
	fs.Int64Var(&requests, "requests", loadgen.DefaultRequests, "measured requests; 0 = no count bound (the run stops at the first bound reached)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "load before the measured phase, excluded from every statistic")
	fs.StringVar(&kind, "scenario", string(loadgen.KindGet), "`kind` of request: get, post, download, upload or ws")
	fs.StringVar(&mix, "mix", "", "scenario `file` (JSON weighted mix, see README); replaces -scenario, -method, -body-size and -body-file")
	fs.Int64Var(&scenario.BodySize, "body-size", 0, "`bytes` of generated request body (post, upload) or websocket message (ws); 0 = the kind's default")
	fs.StringVar(&bodyFile, "body-file", "", "request body from `file` (post; every {id} is replaced by the id); implies -scenario post")
	fs.StringVar(&scenario.Method, "method", "", "HTTP `method`, {id} allowed (default GET, or POST for post and upload)")
	fs.Var(&headers, "H", "extra request `header` \"Name: value\" (repeatable); @file reads one per line")
	fs.StringVar(&dist, "dist", string(loadgen.DistUniform), "id `distribution`: uniform, zipf or new (a new id per request: activation storm)")
	fs.IntVar(&cfg.IDs.Keys, "keys", loadgen.DefaultKeys, "number of distinct ids for uniform and zipf")
	fs.Float64Var(&cfg.IDs.ZipfS, "zipf-s", loadgen.DefaultZipfS, "Zipf exponent s > 0 (1 = classic Zipf; larger = more skewed)")
	fs.StringVar(&cfg.IDs.Prefix, "id-prefix", loadgen.DefaultIDPrefix, "prefix of every id")
	fs.StringVar(&cfg.IDs.RunID, "run-id", "", "run id that makes -dist new ids unique across runs (empty = random)")
	fs.Uint64Var(&cfg.IDs.Seed, "seed", 0, "seed of the id and scenario choices (0 = random)")
	fs.DurationVar(&cfg.Timeout, "timeout", loadgen.DefaultTimeout, "timeout of each request, including streamed bodies")
	fs.DurationVar(&cfg.ConnWaitTimeout, "conn-wait", loadgen.DefaultConnWaitTimeout, "fasthttp engine: how long a request waits for a free connection (error class pool)")
	fs.DurationVar(&cfg.DrainTimeout, "drain", loadgen.DefaultDrainTimeout, "open loop: how long waiting requests may still be sent after the schedule ends (then: unsent)")
	fs.DurationVar(&cfg.MaxLatency, "max-latency", loadgen.DefaultMaxLatency, "histogram range; larger latencies are clamped and counted")
	fs.BoolVar(&insecure, "insecure", false, "https: do not verify the target's certificate")
	fs.StringVar(&caFile, "cacert", "", "https: verify the target's certificate against the PEM certificates in `file` (instead of the system roots)")
	fs.StringVar(&cfg.Label, "label", "", "run label in reports and plots")
	fs.StringVar(&opts.jsonPath, "json", "", "write the JSON report to `file` (- = stdout; the table then goes to stderr)")
	fs.StringVar(&opts.plotPath, "plot", "", "write the HTML report (percentile and time-series charts) to `file`")
	fs.StringVar(&opts.hgrmPath, "hgrm", "", "write the latency distribution in HdrHistogram's .hgrm text format to `file`")
	fs.BoolVar(&opts.quiet, "quiet", false, "no progress line on stderr")
	fs.Float64Var(&opts.maxErrorRate, "max-error-rate", -1, "exit 1 if the error rate (failed+unsent)/(sent+unsent) exceeds this `fraction`; negative = only when nothing succeeded")
	if err := fs.Parse(args); err != nil {
		return cfg, opts, err
	}
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("unexpected argument %q (flags go before arguments; see -h)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	scheduled, err := parseRate(&cfg, rate, ramp, step)
	if err != nil {
		return cfg, opts, err
	}
	if !set["duration"] && scheduled > 0 {
		duration = scheduled
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
		if scenario.BodySize != 0 || scenario.Method != "" || set["scenario"] || bodyFile != "" {
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
		if set["scenario"] && scenario.Kind != loadgen.KindPost {
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
	case opts.maxErrorRate >= 0 && rep.ErrorRate > opts.maxErrorRate:
		fmt.Fprintf(stderr, "loadgen: error rate %.4f exceeds -max-error-rate %g\n", rep.ErrorRate, opts.maxErrorRate)
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
	fs.SetOutput(stderr)
	out := fs.String("o", "", "output HTML `file` (required; - = stdout)")
	title := fs.String("title", "", "plot title")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: loadgen plot [-title T] -o plot.html report.json...\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
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
