package chaos

import (
	"cmp"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/testkit/chaoscheck"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
)

var (
	rounds     = flag.Int("rounds", 0, "chaos rounds of TestChaos (0: the short mode, one round of each nemesis)")
	seedFlag   = flag.Uint64("chaos-seed", 0, "seed of the nemesis schedule (0: from the time)")
	reportPath = flag.String("chaos-report", "", "write TestChaos's result as Markdown to this file")
	keepDir    = flag.String("chaos-keep", "", "copy the history files of every run to this directory (and the linearizability visualisations)")
	nemesesArg = flag.String("chaos-nemeses", "", "comma-separated nemeses for TestChaos: one round of each in this order, or with -rounds N, N rounds drawn from them (default: all)")
)

var builder proctest.Builder

func TestMain(m *testing.M) {
	flag.Parse()
	warnShortTimeout()
	code := m.Run()
	builder.Cleanup()
	os.Exit(code)
}

// packageTime is about what the package's short mode (thirteen rounds of
// TestChaos, the planted bugs, a Sentinel failover and the kill-recovery
// runs) takes with -race on a busy 2-core machine.
const packageTime = 15 * time.Minute

// warnShortTimeout says, before anything runs, when the whole package runs
// under a deadline it may not finish within: go test passes its default
// -timeout of 10 minutes to every test binary, and a run killed midway
// reports only a goroutine dump. The README's test command sets 30m.
func warnShortTimeout() {
	f := flag.Lookup("test.timeout")
	run := flag.Lookup("test.run")
	if f == nil || run == nil || run.Value.String() != "" {
		return
	}
	if d, err := time.ParseDuration(f.Value.String()); err == nil && d > 0 && d < packageTime {
		fmt.Fprintf(os.Stderr, "test/chaos: the whole package takes up to %v with -race on 2 cores; -timeout %v may kill it midway (the README's test command uses -timeout 30m)\n", packageTime, d)
	}
}

const (
	nIDs       = 200
	clients    = 24
	warmup     = 3 * time.Second
	settle     = 3 * time.Second
	finalCalm  = 4 * time.Second
	leaseBuf   = 5 * time.Second  // worker.DefaultLeaseBuffer
	lease      = 10 * time.Second // the pinboards' lease (PINBOARD_LEASE's default)
	shortPause = 9 * time.Second  // longest pause of the short mode
)

// scenario is one chaos run.
type scenario struct {
	cfg      clusterConfig
	nemeses  []string      // in order; empty: random kinds for rounds
	rounds   int           // with empty nemeses
	maxPause time.Duration // bound of the pause draw
	settle   time.Duration // after each nemesis
	seed     uint64
	clients  int // 0: clients
}

type result struct {
	report     *chaoscheck.Report
	rounds     []round
	recoveries []recovery // of the rounds that killed workers
	elapsed    time.Duration
	seed       uint64
}

// labels are the rounds' labels, in order.
func (r result) labels() []string {
	var out []string
	for _, x := range r.rounds {
		out = append(out, x.label)
	}
	return out
}

// skipped lists the rounds skipped, as "round N: kind (why)".
func (r result) skipped() []string {
	var out []string
	for i, x := range r.rounds {
		if x.skipped != "" {
			out = append(out, fmt.Sprintf("round %d: %s (%s)", i+1, x.kind, x.skipped))
		}
	}
	return out
}

func run(t *testing.T, sc scenario) result {
	t.Helper()
	start := time.Now()
	if sc.seed == 0 {
		sc.seed = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(sc.seed, 0x5eed))
	c := startCluster(t, sc.cfg)
	for n := 1; n <= 3; n++ {
		waitReady(t, c.worker(n))
	}
	lc := startClient(c, nIDs, cmp.Or(sc.clients, clients), sc.seed)
	lc.waitWarm(t, 40*time.Second)
	time.Sleep(warmup) // a little steady traffic before the first fault
	kinds := sc.nemeses
	if sc.rounds > 0 {
		pool := kinds
		if len(pool) == 0 {
			pool = allNemeses
		}
		kinds = nil
		for range sc.rounds {
			kinds = append(kinds, pool[rng.IntN(len(pool))])
		}
	}
	var rounds []round
	for i, k := range kinds {
		if t.Failed() {
			break
		}
		t.Logf("round %d/%d: %s (%v)", i+1, len(kinds), k, time.Since(start).Round(time.Second))
		r := c.nemesis(k, rng, sc.maxPause)
		t.Logf("round %d/%d: %s", i+1, len(kinds), r.label)
		rounds = append(rounds, r)
		time.Sleep(sc.settle) // the system recovers before the next fault
	}
	time.Sleep(finalCalm)
	lc.close()
	c.awaitAlarms(t, alarmDrain) // alarms_test.go
	c.stop()
	c.recordStored(lc.ids)
	cfg := chaoscheck.Config{LeaseBuffer: leaseBuf, ClientTimeout: clientTimeout, PendingWindow: time.Millisecond}
	if *keepDir != "" {
		cfg.VisualizeDir = filepath.Join(*keepDir, strings.ReplaceAll(t.Name(), "/", "_"))
		c.keep(cfg.VisualizeDir)
	}
	events := c.events()
	rep := chaoscheck.Check(cfg, events)
	return result{report: rep, rounds: rounds, recoveries: recoveries(rounds, events), elapsed: time.Since(start), seed: sc.seed}
}

// waitReady polls a worker's /healthz (another process's state) until it
// reports a lease.
func waitReady(t *testing.T, w *workerProc) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _, err := fasthttp.GetTimeout(nil, "http://"+w.addr+"/healthz", time.Second)
		if err == nil && code == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 20 s:\n%s", w.proc, w.Log())
		}
		time.Sleep(50 * time.Millisecond) // polling another process
	}
}

// TestChaos runs the harness on release binaries and requires the checker
// to pass. Short mode: one round of each nemesis (pauses ≤ 9 s). With
// -rounds N: N rounds of random nemeses (pauses up to 30 s). -chaos-nemeses
// picks the nemeses. A skipped round fails the test unless its nemesis may
// be skipped (maySkip), and more than maxSkipped of those fail it too.
func TestChaos(t *testing.T) {
	kinds, err := parseNemeses(*nemesesArg)
	if err != nil {
		t.Fatal(err)
	}
	sc := scenario{cfg: clusterConfig{idle: shortIdle}, nemeses: kinds, maxPause: shortPause, settle: settle, seed: *seedFlag}
	if len(kinds) == 0 {
		sc.nemeses = allNemeses
	}
	if *rounds > 0 {
		sc.rounds, sc.maxPause = *rounds, 30*time.Second
	}
	res := run(t, sc)
	t.Logf("seed %d, %d rounds in %v\n%s", res.seed, len(res.rounds), res.elapsed.Round(time.Second), res.report)
	for _, r := range res.recoveries {
		t.Logf("recovery after kill -9, %s", r)
	}
	if *reportPath != "" {
		writeReport(t, *reportPath, res)
	}
	if !res.report.OK() {
		t.Errorf("the checker found violations (seed %d)", res.seed)
	}
	if err := skipVerdict(res.rounds); err != nil {
		t.Error(err)
	}
	if res.report.Requests[chaoscheck.Class2xx] < 1000 {
		t.Errorf("only %d requests succeeded: the run did not exercise the system", res.report.Requests[chaoscheck.Class2xx])
	}
}

// parseNemeses reads -chaos-nemeses: known kinds, in order ("": none).
func parseNemeses(arg string) ([]string, error) {
	var kinds []string
	for _, k := range strings.Split(arg, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !slices.Contains(allNemeses, k) {
			return nil, fmt.Errorf("-chaos-nemeses: unknown nemesis %q (known: %s)", k, strings.Join(allNemeses, ", "))
		}
		kinds = append(kinds, k)
	}
	return kinds, nil
}

// skipVerdict fails a run in which a nemesis that may not be skipped was,
// or more rounds were skipped than maxSkipped allows.
func skipVerdict(rounds []round) error {
	var bad, all []string
	for i, r := range rounds {
		if r.skipped == "" {
			continue
		}
		s := fmt.Sprintf("round %d: %s (%s)", i+1, r.kind, r.skipped)
		all = append(all, s)
		if !maySkip[r.kind] {
			bad = append(bad, s)
		}
	}
	switch {
	case len(bad) > 0:
		return fmt.Errorf("nemeses skipped that may not be (the round proved nothing): %s", strings.Join(bad, "; "))
	case len(all) > maxSkipped(len(rounds)):
		return fmt.Errorf("%d of %d rounds skipped, more than the %d allowed: %s", len(all), len(rounds), maxSkipped(len(rounds)), strings.Join(all, "; "))
	}
	return nil
}

// planted is one case of TestPlantedBugs.
type planted struct {
	faults  string // PINNED_FAULTS
	nemeses []string
	settle  time.Duration
	want    string // the violation kind expected, or kinds separated by "|" (any one); "": none (a control)
	// leaseOnly runs the pinboards without fast failover: the replace race
	// needs two pinboards that find a dead worker's session gone at the
	// same moment, its lease's end (with fast failover, the first to prove
	// the death ends the session and the other finds the id moved).
	leaseOnly bool
}

// idle is the workers' idle timeout for a planted case: shortIdle for the
// stale-route nemeses (ids must go idle within the fault), else the
// counter's default (0), under which blind_renew's old instances outlive
// the restart fence instead of idling out during it.
func (p planted) idle() time.Duration {
	for _, k := range p.nemeses {
		if k == nemFreeze || k == nemSlowInval || k == nemLateRelease {
			return shortIdle
		}
	}
	return 0
}

// plantedBugs are TestPlantedBugs's cases: every fault of internal/base/faults
// appears in one that wants a violation (TestEveryFaultIsPlanted).
var plantedBugs = []planted{
	// Instances outlive the lease (Admit and Do still refuse them: the bug
	// shows as instances never aborted).
	{string(faults.NoSelfAbort), []string{nemPartition}, 2 * time.Second, chaoscheck.VNotAborted, false},
	// The lease counted from the ack's arrival (1.5 s late): requests
	// served after the lease the checker computes from the send time,
	// or task effects then when no request reached the worker in those
	// 1.5 s (it happened: the same late deadline, seen from the tasks).
	{string(faults.ReceiveAnchor), []string{nemPartition}, 2 * time.Second, chaoscheck.VServedAfter + "|" + chaoscheck.VEffectAfter, false},
	// No inline check and a watchdog 4 s late: served after the lease.
	{string(faults.WatchdogOnly) + "," + string(faults.LateWatchdog), []string{nemPartition}, 2 * time.Second, chaoscheck.VServedAfter, false},
	// Heartbeats re-create sessions lost with Redis: old instances stay
	// live while a restarted worker takes every id once the restart
	// fence (10 s) has passed.
	{string(faults.BlindRenew), []string{nemRedisRestart, nemKillWorker}, 8 * time.Second, chaoscheck.VOverlap, false},
	// The store's placement writes without their checks, exposed by
	// slow Redis replies while a worker's ids move: two pinboards both
	// re-place an id of a dead session (replace) or a released one
	// (claim) on different workers: two live instances of one id.
	{faults: string(faults.ReplaceNoCompare), nemeses: []string{nemLatencyKill}, settle: 2 * time.Second, want: chaoscheck.VOverlap, leaseOnly: true},
	{string(faults.ClaimNoNX), []string{nemLatencyDrain}, 2 * time.Second, chaoscheck.VOverlap, false},
	// The stale-route fence undone: a host that forgets the epochs it
	// released (or remembers them 50 ms) activates a second instance for
	// the stale pinboard's cached route while the id lives on elsewhere:
	// two live instances, and reads that go back in time.
	{string(faults.NoTombstone), []string{nemFreeze}, 2 * time.Second, chaoscheck.VOverlap + "|" + chaoscheck.VNotLinearizable, false},
	{string(faults.ShortTombstone), []string{nemSlowInval}, 2 * time.Second, chaoscheck.VOverlap + "|" + chaoscheck.VNotLinearizable, false},
	// A release delivered late (after its sender gave up) that deletes the
	// placement its holder renewed under a newer epoch after a stale
	// refusal: the id is placed again elsewhere while the renewed instance
	// lives.
	{string(faults.ReleaseAnyEpoch), []string{nemLateRelease}, 2 * time.Second, chaoscheck.VOverlap + "|" + chaoscheck.VNotLinearizable, false},
	// Control: a watchdog 4 s late alone is harmless, because Admit
	// checks the lease inline (the lease context's Err): the run passes.
	{string(faults.LateWatchdog), []string{nemPartition}, 2 * time.Second, "", false},
}

// TestEveryFaultIsPlanted: every planted bug internal/base/faults offers has a
// TestPlantedBugs case that requires the checker to catch it.
// caughtElsewhere names the planted faults the harness cannot expose, and
// the tests that catch them instead.
var caughtElsewhere = map[faults.Fault]string{
	// It needs a worker that one pinboard cannot reach (its dials time out)
	// while it lives and heartbeats through another path: a partition of
	// the data path the harness's processes on one loopback cannot make
	// (its forwarders accept connections; a closed one refuses them, which
	// is a proof of death).
	faults.NoDeathProof: "test/sim TestSimulationCatchesPlantedBugs (partitions); internal/pinboard TestFleetPartitionedWorkerKeepsItsIDs",
}

func TestEveryFaultIsPlanted(t *testing.T) {
	caught := map[faults.Fault]bool{}
	for _, tc := range plantedBugs {
		for _, f := range strings.Split(tc.faults, ",") {
			if !slices.Contains(faults.All(), faults.Fault(f)) {
				t.Errorf("case %q plants %q, which internal/base/faults does not know", tc.faults, f)
			}
			if tc.want != "" {
				caught[faults.Fault(f)] = true
			}
		}
	}
	for _, f := range faults.All() {
		if elsewhere, ok := caughtElsewhere[f]; ok {
			if caught[f] {
				t.Errorf("fault %s has a TestPlantedBugs case now: drop it from caughtElsewhere", f)
			}
			if elsewhere == "" {
				t.Errorf("fault %s: caughtElsewhere must name the tests that catch it", f)
			}
			continue
		}
		if !caught[f] {
			t.Errorf("fault %s has no TestPlantedBugs case that wants a violation", f)
		}
	}
}

// TestPlantedBugs runs the harness on binaries built with the pinned_faults
// tag, each with one planted bug and the nemesis that exposes it, and
// requires the checker to fail with the expected violation; a frozen
// watchdog alone (the inline check still on) must pass.
func TestPlantedBugs(t *testing.T) {
	for _, tc := range plantedBugs {
		t.Run(tc.faults, func(t *testing.T) {
			// Two clusters at a time: the package stays within a few
			// minutes on 2 cores, and each fault's window (≥ 1.5 s) is far
			// above the scheduling noise this adds.
			t.Parallel()
			sc := scenario{
				cfg:     clusterConfig{tags: []string{faults.BuildTag}, faults: tc.faults, idle: tc.idle(), leaseOnly: tc.leaseOnly},
				nemeses: tc.nemeses, maxPause: shortPause, settle: tc.settle, seed: *seedFlag, clients: 12,
			}
			// A planted bug shows only when the nemesis lands in its window
			// and requests come then: one run in a few dozen misses it on a
			// loaded machine (receive_anchor's window is 1.5 s). A bug must be
			// caught in one of two runs, each on its own cluster; the control
			// (no violation wanted) gets one run and must pass it.
			tries := 2
			if tc.want == "" {
				tries = 1
			}
			var res result
			caught := func() bool {
				for _, kind := range strings.Split(tc.want, "|") {
					if res.report.Violations[kind] > 0 {
						return true
					}
				}
				return false
			}
			for attempt := 1; attempt <= tries; attempt++ {
				t.Run(fmt.Sprintf("run%d", attempt), func(t *testing.T) { res = run(t, sc) })
				t.Logf("planted %s, run %d, seed %d:\n%s", tc.faults, attempt, res.seed, res.report)
				if tc.want == "" || caught() {
					break
				}
			}
			if tc.want == "" {
				if !res.report.OK() {
					t.Fatalf("%s alone must be harmless; the checker found violations", tc.faults)
				}
				return
			}
			if res.report.OK() {
				t.Fatalf("the checker passed %d runs with the planted bug %s", tries, tc.faults)
			}
			if !caught() {
				t.Fatalf("planted %s: want a %q violation; got %v", tc.faults, tc.want, res.report.Violations)
			}
		})
	}
}
