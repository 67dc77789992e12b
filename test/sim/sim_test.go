package sim

import (
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/faults"
)

var (
	seeds    = flag.Int("sim.seeds", 300, "how many seeds TestSimulation runs")
	first    = flag.Uint64("sim.first", 1, "the first seed TestSimulation runs")
	seed     = flag.Uint64("sim.seed", 0, "the seed TestSimulationReplay replays (0: skip)")
	duration = flag.Duration("sim.duration", 0, "the faulty phase of every run (0: DefaultDuration)")
)

// runSeeds runs seeds [from, from+n) on every CPU and returns the failures,
// lowest seed first, and the steps run.
func runSeeds(from uint64, n int) (failed []Result, steps int64) {
	var (
		next  atomic.Uint64
		total atomic.Int64
		mu    sync.Mutex
		wg    sync.WaitGroup
	)
	next.Store(from)
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				s := next.Add(1) - 1
				if s >= from+uint64(n) {
					return
				}
				r := Run(Config{Seed: s, Duration: *duration})
				total.Add(int64(r.Steps))
				if r.Violation != "" {
					mu.Lock()
					failed = append(failed, r)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for i := 1; i < len(failed); i++ { // a few at most: insertion sort
		for j := i; j > 0 && failed[j].Seed < failed[j-1].Seed; j-- {
			failed[j], failed[j-1] = failed[j-1], failed[j]
		}
	}
	return failed, total.Load()
}

// TestSimulation runs the protocol under faults for many seeds and checks
// the single-activation invariant after every step (and liveness once the
// faults heal). A failure prints the seed, the invariant and the last steps
// before it; TestSimulationReplay replays one seed with every step.
func TestSimulation(t *testing.T) {
	if faults.Enabled {
		t.Skip("a planted-bug build: TestSimulationFindsPlantedBug runs instead")
	}
	start := time.Now()
	failed, steps := runSeeds(*first, *seeds)
	t.Logf("%d seeds from %d, %d steps in %v", *seeds, *first, steps, time.Since(start).Round(time.Millisecond))
	for i, r := range failed {
		if i == 3 {
			t.Errorf("... and %d more failing seeds", len(failed)-3)
			break
		}
		t.Errorf("%s", r)
	}
}

// TestSimulationReplay replays -sim.seed, printing every step.
func TestSimulationReplay(t *testing.T) {
	if *seed == 0 {
		t.Skip("no -sim.seed given")
	}
	r := Run(Config{Seed: *seed, Duration: *duration, Trace: func(line string) { t.Log(line) }})
	t.Logf("%s; %d steps; %+v", r.Swarm, r.Steps, r.Stats)
	if r.Violation != "" {
		t.Fatalf("seed %d: %s", r.Seed, r.Violation)
	}
}

// A seed replays exactly: the same steps in the same order, the same trace.
func TestSimulationIsDeterministic(t *testing.T) {
	trace := func(s uint64) (uint64, Result) {
		h := fnv.New64a()
		r := Run(Config{Seed: s, Trace: func(line string) { h.Write([]byte(line)) }})
		return h.Sum64(), r
	}
	for _, s := range []uint64{7, 42, 1234} {
		h1, r1 := trace(s)
		h2, r2 := trace(s)
		if h1 != h2 || r1.Steps != r2.Steps || r1.Stats != r2.Stats {
			t.Fatalf("seed %d ran twice: trace %x vs %x, %d vs %d steps, %+v vs %+v", s, h1, h2, r1.Steps, r2.Steps, r1.Stats, r2.Stats)
		}
		if r1.Stats.Served == 0 || r1.Stats.Activations == 0 {
			t.Fatalf("seed %d served nothing: %+v", s, r1.Stats)
		}
	}
}

// plantedSeeds is how many seeds each planted bug gets to be found in.
const plantedSeeds = 400

// TestSimulationFindsPlantedBug runs in a planted-bug build (tag
// pinned_faults, PINNED_FAULTS naming one bug; TestSimulationCatchesPlantedBugs
// starts it): some seed must break the invariant.
func TestSimulationFindsPlantedBug(t *testing.T) {
	if !faults.Enabled {
		t.Skip("not a planted-bug build")
	}
	failed, _ := runSeeds(1, plantedSeeds)
	var found []Result
	for _, r := range failed {
		if !strings.HasPrefix(r.Violation, "liveness") {
			found = append(found, r)
		}
	}
	if len(found) == 0 {
		t.Fatalf("no seed of %d broke single activation", plantedSeeds)
	}
	fmt.Printf("FOUND by %d of %d seeds, first seed %d: %s\n", len(found), plantedSeeds, found[0].Seed, found[0].Violation)
}

// Each planted twin of the stale-route fence and of fast failover's proof of
// death, built in (tag pinned_faults)
// and switched on, is caught by the simulation within plantedSeeds seeds:
// proof that the invariant check and the fault model can see the hole.
func TestSimulationCatchesPlantedBugs(t *testing.T) {
	if faults.Enabled {
		t.Skip("already a planted-bug build")
	}
	if testing.Short() {
		t.Skip("builds the package with -tags pinned_faults")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	bin := filepath.Join(t.TempDir(), "sim.test")
	build := exec.Command(gobin, "test", "-c", "-tags", faults.BuildTag, "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c -tags %s: %v\n%s", faults.BuildTag, err, out)
	}
	for _, f := range []faults.Fault{faults.NoTombstone, faults.ShortTombstone, faults.ReleaseAnyEpoch, faults.NoDeathProof} {
		t.Run(string(f), func(t *testing.T) {
			cmd := exec.Command(bin, "-test.run", "^TestSimulationFindsPlantedBug$", "-test.count=1")
			cmd.Env = append(os.Environ(), faults.EnvVar+"="+string(f))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("the simulation did not catch %s: %v\n%s", f, err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(line, "FOUND") {
					t.Log(line)
				}
			}
		})
	}
}
