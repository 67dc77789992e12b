// Command bench runs pinned's benchmark suites against real processes on
// 127.0.0.1 (redis-server, pinboard, counter workers, nginx, HAProxy,
// loadgen) and writes a markdown report to bench/results/. Run it from the
// module root:
//
//	go run ./cmd/bench -suite proxy              # direct vs pinboard vs nginx vs HAProxy
//	go run ./cmd/bench -suite all -install       # every suite; installs nginx/HAProxy if missing
//	go run ./cmd/bench -suite proxy -pinboard-b /tmp/pinboard-old   # before/after
//	go run ./cmd/bench -suite profile            # profiles/ *.pb.gz under load
//	go run ./cmd/bench -smoke                    # every suite for seconds (what CI runs)
//
// It refuses to run while the machine is busy (-max-busy, -force). Exit
// status: 0 done, 1 a suite failed, 2 bad flags, 3 the machine is loaded.
// See bench/README.md.
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

	"github.com/pinned-go/pinned/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	var o bench.Options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	suites := fs.String("suite", "all", "comma-separated suites: "+strings.Join(bench.Suites, ", ")+", profile, or all")
	fs.StringVar(&o.OutDir, "out", "", "report directory (default bench/results)")
	fs.StringVar(&o.ProfileDir, "profile-dir", "", "profile suite output directory (default profiles)")
	fs.BoolVar(&o.Smoke, "smoke", false, "smoke mode: about a second per measurement, one round, no load check")
	fs.IntVar(&o.Rounds, "rounds", 0, "rounds of alternated targets (default 5; smoke 1)")
	fs.DurationVar(&o.Duration, "duration", 0, "measured duration of each load run (default 5s; smoke 500ms)")
	fs.DurationVar(&o.Warmup, "warmup", 0, "unmeasured run per target and workload before the rounds (default 1s)")
	fs.BoolVar(&o.Force, "force", false, "run even when the machine is busy (the report says so)")
	fs.Float64Var(&o.MaxBusy, "max-busy", 0, "refuse above this busy fraction of all cores over 2 s (default 0.10)")
	fs.BoolVar(&o.NoPeers, "no-peers", false, "skip nginx and HAProxy")
	fs.BoolVar(&o.Install, "install", false, "apt-get install nginx and haproxy when missing (root)")
	fs.StringVar(&o.PinGen, "pin-gen", "", "taskset CPU list for loadgen (default: not pinned)")
	fs.StringVar(&o.PinProxy, "pin-proxy", "", "taskset CPU list for pinboard, nginx, HAProxy")
	fs.StringVar(&o.PinBackend, "pin-backend", "", "taskset CPU list for counter workers and redis-server")
	fs.IntVar(&o.Workers, "workers", 0, "fleet workers in the activation and alarms suites (default 2)")
	fs.StringVar(&o.PinboardB, "pinboard-b", "", "a second pinboard binary alternated with the built one (before/after)")
	workloads := fs.String("workloads", "", "proxy suite: comma-separated workloads to run (closed-64, closed-256, open-12k, cost-5k; default all)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	for _, s := range strings.Split(*suites, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.Suites = append(o.Suites, s)
		}
	}
	for _, w := range strings.Split(*workloads, ",") {
		if w = strings.TrimSpace(w); w != "" {
			o.Workloads = append(o.Workloads, w)
		}
	}
	o.Log = stderr
	o.Command = "go run ./cmd/bench " + strings.Join(args, " ")
	res, err := bench.Run(ctx, o)
	if errors.Is(err, bench.ErrLoaded) {
		fmt.Fprintln(stderr, "bench:", err)
		return 3
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	fmt.Fprintln(stderr, "bench: report", res.Report)
	return 0
}
