// Command loadgen is pinned's HTTP and WebSocket load generator: open-loop
// (constant rate, latency from the intended send time, coordinated-omission
// free) or closed-loop (N connections), over uniform, Zipf or always-new ids,
// reporting HdrHistogram percentiles as a table, JSON and an HTML plot.
//
//	loadgen -url http://127.0.0.1:8080 -path '/counter/{id}/' -rate 12000 -c 64 -duration 30s -json out.json
//	loadgen plot -o plot.html direct.json pinboard.json
//
// Exit status: 0 the run completed (and the error rate is within
// -max-error-rate, if set); 1 the error rate exceeded -max-error-rate;
// 2 bad flags or configuration; 3 the run was interrupted or a report could
// not be written. See loadgen for the engine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the flags that are not part of loadgen.Config.
type options struct {
	jsonPath, plotPath string
	quiet              bool
	maxErrorRate       float64
}

// headerFlags collects repeated -H "Name: value" flags.
type headerFlags []loadgen.Header

func (h *headerFlags) String() string { return "" }

func (h *headerFlags) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok {
		return fmt.Errorf("want \"Name: value\", got %q", s)
	}
	*h = append(*h, loadgen.Header{Name: strings.TrimSpace(name), Value: strings.TrimSpace(value)})
	return nil
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
	r, err := loadgen.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitUsage
	}
	rep, err := r.Run(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen:", err)
		return exitRun
	}
	return writeReports(rep, opts, stdout, stderr)
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
		duration time.Duration
		requests int64
	)
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: loadgen -url http://host:port [flags]\n       loadgen plot -o plot.html report.json...\n\nflags:\n")
		fs.PrintDefaults()
		fmt.Fprint(stderr, "\nexit status: 0 ok, 1 error rate above -max-error-rate, 2 bad flags or config, 3 interrupted or output failed\n")
	}
	fs.StringVar(&cfg.URL, "url", "", "target base `URL`, http://host:port (required)")
	fs.StringVar(&cfg.Path, "path", loadgen.DefaultPath, "path `template`; every {id} is replaced by the request's id")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open loop at this many requests/s, latency measured from the intended send time; 0 = closed loop")
	fs.IntVar(&cfg.Connections, "c", loadgen.DefaultConnections, "connections (closed loop: also the number of workers)")
	fs.IntVar(&cfg.MaxWorkers, "max-workers", 0, "open loop: bound on the worker pool (0 = -c)")
	fs.DurationVar(&duration, "duration", loadgen.DefaultDuration, "measured duration; 0 = no time bound")
	fs.Int64Var(&requests, "requests", loadgen.DefaultRequests, "measured requests; 0 = no count bound (the run stops at the first bound reached)")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "load before the measured phase, excluded from every statistic")
	fs.StringVar(&kind, "scenario", string(loadgen.KindGet), "`kind` of request: get, post, download, upload or ws")
	fs.StringVar(&mix, "mix", "", "scenario `file` (JSON weighted mix, see README); replaces -scenario, -method and -body-size")
	fs.Int64Var(&scenario.BodySize, "body-size", 0, "`bytes` of request body (post, upload) or websocket message (ws); 0 = the kind's default")
	fs.StringVar(&scenario.Method, "method", "", "HTTP `method` (default GET, or POST for post and upload)")
	fs.Var(&headers, "H", "extra request `header` \"Name: value\" (repeatable)")
	fs.StringVar(&dist, "dist", string(loadgen.DistUniform), "id `distribution`: uniform, zipf or new (a new id per request: activation storm)")
	fs.IntVar(&cfg.IDs.Keys, "keys", loadgen.DefaultKeys, "number of distinct ids for uniform and zipf")
	fs.Float64Var(&cfg.IDs.ZipfS, "zipf-s", loadgen.DefaultZipfS, "Zipf exponent s > 0 (1 = classic Zipf; larger = more skewed)")
	fs.StringVar(&cfg.IDs.Prefix, "id-prefix", loadgen.DefaultIDPrefix, "prefix of every id")
	fs.StringVar(&cfg.IDs.RunID, "run-id", "", "run id that makes -dist new ids unique across runs (default random)")
	fs.Uint64Var(&cfg.IDs.Seed, "seed", 0, "seed of the id and scenario choices (0 = random)")
	fs.DurationVar(&cfg.Timeout, "timeout", loadgen.DefaultTimeout, "read and write timeout per request, including streamed bodies")
	fs.DurationVar(&cfg.ConnWaitTimeout, "conn-wait", loadgen.DefaultConnWaitTimeout, "how long a request waits for a free connection (error class pool)")
	fs.DurationVar(&cfg.DrainTimeout, "drain", loadgen.DefaultDrainTimeout, "open loop: how long queued requests may still be sent after the schedule ends (then: unsent)")
	fs.DurationVar(&cfg.MaxLatency, "max-latency", loadgen.DefaultMaxLatency, "histogram range; larger latencies are clamped and counted")
	fs.StringVar(&cfg.Label, "label", "", "run label in reports and plots")
	fs.StringVar(&opts.jsonPath, "json", "", "write the JSON report to `file` (- = stdout; the table then goes to stderr)")
	fs.StringVar(&opts.plotPath, "plot", "", "write an HTML latency-percentile plot to `file`")
	fs.BoolVar(&opts.quiet, "quiet", false, "no progress line on stderr")
	fs.Float64Var(&opts.maxErrorRate, "max-error-rate", -1, "exit 1 if the error rate (failed+unsent)/(sent+unsent) exceeds this `fraction`; negative = never")
	if err := fs.Parse(args); err != nil {
		return cfg, opts, err
	}
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("unexpected argument %q (flags go before arguments; see -h)", fs.Arg(0))
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
	case cfg.Rate == 0 && cfg.MaxWorkers != 0:
		return cfg, opts, errors.New("-max-workers applies to the open loop only; set -rate too")
	}
	cfg.Duration, cfg.Requests = duration, requests
	if duration == 0 {
		cfg.Duration = loadgen.Unbounded
	}
	if requests == 0 {
		cfg.Requests = loadgen.Unbounded
	}
	cfg.IDs.Dist = loadgen.Dist(dist)
	cfg.Headers = headers
	if mix != "" {
		if scenario.BodySize != 0 || scenario.Method != "" || kind != string(loadgen.KindGet) {
			return cfg, opts, errors.New("-mix replaces -scenario, -method and -body-size; set them in the scenario file")
		}
		scs, err := loadgen.LoadScenarioFile(mix, cfg.Path)
		if err != nil {
			return cfg, opts, err
		}
		cfg.Scenarios = scs
	} else {
		scenario.Kind = loadgen.Kind(kind)
		cfg.Scenarios = []loadgen.Scenario{scenario}
	}
	return cfg, opts, nil
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
	switch {
	case code != exitOK:
		return code
	case rep.StoppedBy == loadgen.StopCanceled:
		fmt.Fprintln(stderr, "loadgen: interrupted; the report covers the run so far")
		return exitRun
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
