// Command bench runs pinned's benchmark suites against real processes on
// 127.0.0.1 (redis-server, pinboard, counter workers, nginx, HAProxy,
// loadgen, wrk) and writes a markdown report to bench/results/. Run it from
// the module root:
//
//	go run ./cmd/bench -suite proxy              # direct vs pinboard vs nginx vs HAProxy
//	go run ./cmd/bench -suite loadgen -install   # loadgen vs wrk: rate, CPU per request, open-loop lag
//	go run ./cmd/bench -suite failover           # a worker killed under load: fast failover vs lease-only
//	go run ./cmd/bench -suite all -install       # every suite; installs nginx/HAProxy if missing
//	go run ./cmd/bench -suite proxy -pinboard-b /tmp/pinboard-old   # before/after
//	go run ./cmd/bench -suite profile            # profiles/ *.pb.gz under load
//	go run ./cmd/bench -suite scale -scale-rows S1,S3 -scale-max 10   # how costs grow (docs/scale.md)
//	go run ./cmd/bench -trace-slow               # the requests above the p99 at 5 000 req/s, hop by hop
//	go run ./cmd/bench -smoke                    # every suite for seconds (what CI runs)
//
// It refuses to run while the machine is busy (-max-busy, -force). Exit
// status: 0 done, 1 a suite failed, 2 bad flags, 3 the machine is loaded.
// `bench -h` lists every flag with its type and default. See
// bench/README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/pinned-go/pinned/bench"
	"github.com/pinned-go/pinned/internal/base/cmdline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command: -h and -version go to stdout, everything else
// to stderr. It returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o bench.Options
	var suites, workloads, failoverIDs, scaleRows string
	var traceSlow bool
	set := cmdline.New("bench", "", `pinned's benchmark suites against real processes on 127.0.0.1; run from the
module root. Exit status: 0 done, 1 a suite failed, 2 bad flags, 3 the machine
is loaded. The rig's redis-server is PINNED_REDIS_SERVER, or redis-server on
PATH. See bench/README.md.`)
	set.String(&suites, "suite", "", "list", "all", "comma-separated suites: "+strings.Join(bench.Suites, ", ")+", profile, scale, trace, or all")
	set.String(&o.OutDir, "out", "", "path", "", "report directory (empty: bench/results)")
	set.String(&o.ProfileDir, "profile-dir", "", "path", "", "profile suite output directory (empty: profiles)")
	set.Bool(&o.Smoke, "smoke", "", "smoke mode: about a second per measurement, one round, no load check")
	set.Int(&o.Rounds, "rounds", "", 0, "rounds of alternated targets (0: 5; smoke 1)")
	set.Duration(&o.Duration, "duration", "", 0, "measured duration of each load run (0: 5s; smoke 500ms)")
	set.Duration(&o.Warmup, "warmup", "", 0, "unmeasured run per target and workload before the rounds (0: 1s)")
	set.Bool(&o.Force, "force", "", "run even when the machine is busy (the report says so)")
	set.Float(&o.MaxBusy, "max-busy", "", 0, "refuse above this busy fraction of all cores over 2 s (0: 0.10)")
	set.Bool(&o.NoPeers, "no-peers", "", "skip nginx and HAProxy")
	set.Bool(&o.Install, "install", "", "apt-get install nginx and haproxy (and wrk for the loadgen suite) when missing (root)")
	set.String(&o.Wrk2, "wrk2", "", "path", "", "loadgen suite: a wrk2 binary run beside loadgen's open loop (empty: wrk2 on PATH, else skipped)")
	set.String(&o.PinGen, "pin-gen", "", "cpu-list", "", "taskset CPU list for loadgen (empty: not pinned)")
	set.String(&o.PinProxy, "pin-proxy", "", "cpu-list", "", "taskset CPU list for pinboard, nginx, HAProxy")
	set.String(&o.PinBackend, "pin-backend", "", "cpu-list", "", "taskset CPU list for counter workers and redis-server")
	set.Int(&o.Workers, "workers", "", 0, "fleet workers in the activation and alarms suites (0: 2)")
	set.String(&o.PinboardB, "pinboard-b", "", "path", "", "a second pinboard binary alternated with the built one (before/after)")
	set.String(&workloads, "workloads", "", "list", "", "proxy suite: comma-separated workloads to run (closed-64, closed-256, open-12k, cpu-5k, cost-5k, overload; empty: all)")
	set.String(&failoverIDs, "failover-ids", "", "list", "", "failover suite: comma-separated numbers of ids the killed worker holds (empty: 100,10000; smoke 20)")
	set.Duration(&o.Failover.Interval, "failover-interval", "", 0, "failover suite: how often each id is asked (0: 100ms), unless -failover-rate needs longer")
	set.Int(&o.Failover.Rate, "failover-rate", "", 0, "failover suite: cap on requests per second over all victim ids (0: 5000)")
	set.Duration(&o.Failover.Within, "failover-within", "", 0, "failover suite: bound on one recovery from the kill; must exceed the lease (0: 1m)")
	set.Int(&o.Failover.InFlight, "failover-in-flight", "", 0, "failover suite: the measuring client's requests in flight (0: 1024)")
	set.Duration(&o.Failover.Timeout, "failover-timeout", "", 0, "failover suite: bound on one request (0: 10s)")
	set.String(&scaleRows, "scale-rows", "", "list", "", "scale suite: comma-separated rows to run ("+strings.Join(bench.ScaleRowIDs(), ", ")+"; empty: all)")
	set.Bool(&traceSlow, "trace-slow", "", "run the trace suite (alone unless -suite names others: then after them): cpu-5k through a pinboard built with -tags pinned_spans, the requests above the p99 hop by hop (bench/README.md)")
	set.Int(&o.ScaleMax, "scale-max", "", 0, "scale suite: the largest point of each row, as a multiple of its first (1, 10, 100 or 1000; 0: 1000)")
	if err := set.Parse(args, nil, stdout); err != nil {
		return cmdline.Exit(stderr, "bench", err)
	}
	if traceSlow && suites == "all" {
		suites = "trace"
	}
	for _, s := range strings.Split(suites, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.Suites = append(o.Suites, s)
		}
	}
	if traceSlow && !slices.Contains(o.Suites, "trace") {
		o.Suites = append(o.Suites, "trace")
	}
	if err := bench.CheckSuites(o.Suites); err != nil {
		return cmdline.Exit(stderr, "bench", cmdline.Usagef("-suite: %w", err))
	}
	for _, r := range strings.Split(scaleRows, ",") {
		if r = strings.TrimSpace(r); r != "" {
			o.ScaleRows = append(o.ScaleRows, r)
		}
	}
	if err := bench.CheckScale(o.ScaleRows, o.ScaleMax); err != nil {
		return cmdline.Exit(stderr, "bench", cmdline.Usagef("-scale-rows, -scale-max: %w", err))
	}
	for _, w := range strings.Split(workloads, ",") {
		if w = strings.TrimSpace(w); w != "" {
			o.Workloads = append(o.Workloads, w)
		}
	}
	for _, x := range strings.Split(failoverIDs, ",") {
		if x = strings.TrimSpace(x); x == "" {
			continue
		}
		n, err := strconv.Atoi(x)
		if err != nil || n < 1 {
			return cmdline.Exit(stderr, "bench", cmdline.Usagef("-failover-ids: %q is not a positive number of ids", x))
		}
		o.Failover.IDs = append(o.Failover.IDs, n)
	}
	if err := o.Failover.Check(); err != nil {
		return cmdline.Exit(stderr, "bench", cmdline.Usage(err))
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
