package loadgen

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

func TestUniformIDsCoverEveryKeyEvenly(t *testing.T) {
	const keys, draws = 50, 50_000
	src := newIDSource(IDConfig{Dist: DistUniform, Keys: keys, Prefix: "u"}, "")
	rng := rand.New(rand.NewPCG(1, 2))
	counts := map[string]int{}
	var buf []byte
	for range draws {
		buf = src.appendID(buf[:0], rng)
		counts[string(buf)]++
	}
	if len(counts) != keys {
		t.Fatalf("%d distinct ids; want %d", len(counts), keys)
	}
	for k := range keys {
		id := "u" + strconv.Itoa(k)
		// Expected 1000 each, standard deviation ≈ 31: ±30% is > 9σ.
		if c := counts[id]; c < 700 || c > 1300 {
			t.Errorf("id %s drawn %d times; want ≈ 1000", id, c)
		}
	}
}

// TestZipfSkew checks the sampler against the exact Zipf probabilities
// P(k) = k^-s / H(n, s), for exponents below, at and above 1.
func TestZipfSkew(t *testing.T) {
	for _, s := range []float64{0.5, 0.99, 1, 1.1, 2} {
		const n, draws = 1000, 400_000
		z := newZipf(n, s)
		rng := rand.New(rand.NewPCG(3, uint64(s*100)))
		counts := make([]int, n+1)
		for range draws {
			k := z.sample(rng)
			if k < 1 || k > n {
				t.Fatalf("s=%v: sample %d outside [1, %d]", s, k, n)
			}
			counts[k]++
		}
		h := 0.0
		for k := 1; k <= n; k++ {
			h += math.Pow(float64(k), -s)
		}
		for k := 1; k <= 5; k++ {
			want := draws * math.Pow(float64(k), -s) / h
			if got := float64(counts[k]); math.Abs(got-want) > 0.05*want+5*math.Sqrt(want) {
				t.Errorf("s=%v: rank %d drawn %v times; want ≈ %.0f", s, k, got, want)
			}
			if k > 1 && counts[k] >= counts[k-1] {
				t.Errorf("s=%v: rank %d drawn %d times, not fewer than rank %d (%d)", s, k, counts[k], k-1, counts[k-1])
			}
		}
		// The tail: ranks 501..1000 together.
		tail, wantTail := 0, 0.0
		for k := 501; k <= n; k++ {
			tail += counts[k]
			wantTail += draws * math.Pow(float64(k), -s) / h
		}
		if math.Abs(float64(tail)-wantTail) > 0.05*wantTail+5*math.Sqrt(wantTail) {
			t.Errorf("s=%v: ranks 501..1000 drawn %d times; want ≈ %.0f", s, tail, wantTail)
		}
	}
}

func TestZipfIDsMapRankToID(t *testing.T) {
	src := newIDSource(IDConfig{Dist: DistZipf, Keys: 100, ZipfS: 1.5, Prefix: "z"}, "")
	rng := rand.New(rand.NewPCG(5, 6))
	counts := map[string]int{}
	var buf []byte
	for range 20_000 {
		buf = src.appendID(buf[:0], rng)
		counts[string(buf)]++
	}
	if counts["z0"] <= counts["z1"] || counts["z1"] <= counts["z2"] || counts["z100"] != 0 {
		t.Errorf("z0 %d z1 %d z2 %d z100 %d; want z0 > z1 > z2 and no z100 (ids are 0..99 by rank)",
			counts["z0"], counts["z1"], counts["z2"], counts["z100"])
	}
	if z := newZipf(1, 1.1); z.sample(rng) != 1 {
		t.Error("Zipf over one key did not return it")
	}
}

// TestNewIDsUniqueAcrossWorkersAndRuns drives the DistNew source from a
// whole closed-loop run with many workers and checks every id is new, valid
// and carries the run prefix; a second run gets another prefix.
func TestNewIDsUniqueAcrossWorkersAndRuns(t *testing.T) {
	runIDs := func() (string, []string) {
		var (
			mu  sync.Mutex
			ids []string
		)
		var r *Runner
		synctest.Test(t, func(t *testing.T) {
			r = mustNew(t, Config{URL: "http://127.0.0.1:1", Connections: 16, Requests: 3000, Duration: Unbounded,
				IDs: IDConfig{Dist: DistNew, Prefix: "storm-"}})
			withExec(r, func(id []byte, o *outcome) {
				mu.Lock()
				ids = append(ids, string(id))
				mu.Unlock()
				time.Sleep(time.Millisecond)
				o.status = 201
			})
			if _, err := r.Run(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
		return r.RunID(), ids
	}
	run1, ids1 := runIDs()
	run2, ids2 := runIDs()
	if run1 == run2 {
		t.Fatalf("two runs share run id %q", run1)
	}
	// Workers that see the Requests bound only after drawing do not send;
	// every id that was sent must be unique.
	seen := map[string]bool{}
	for _, ids := range [][]string{ids1, ids2} {
		if len(ids) != 3000 {
			t.Fatalf("%d ids sent; want 3000", len(ids))
		}
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("id %q repeated", id)
			}
			seen[id] = true
			if e := wire.CheckSegment([]byte(id), 0); e != wire.SegmentOK {
				t.Fatalf("id %q fails the id grammar: %v", id, e)
			}
		}
	}
	if !strings.HasPrefix(ids1[0], "storm-"+run1+"-") || !strings.HasPrefix(ids2[0], "storm-"+run2+"-") {
		t.Errorf("ids %q, %q; want prefixes storm-<runID>-", ids1[0], ids2[0])
	}
}
