package hotids

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// req is one Record call with named fields, for readable tests.
type req struct {
	Name    []byte
	Holder  string
	Status  int
	Reason  string
	Bytes   int64
	Latency time.Duration
	At      time.Time
}

func record(s *Sketch, r req) {
	s.Record(r.Name, r.Holder, r.Status, r.Reason, r.Bytes, r.Latency, r.At)
}

// t0 is a slot boundary, so tests know which slot a time falls in.
var t0 = time.Unix(1_800_000_000, 0)

func newSketch(t testing.TB, cfg Config) *Sketch {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// names returns n placement names "/<ns>/id-<i>".
func names(ns string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("/%s/id-%05d", ns, i))
	}
	return out
}

// zipf draws n ranks in [0, imax] with exponent 1.1, seeded.
func zipf(seed uint64, n int, imax uint64) []int {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, seed)), 1.1, 1, imax)
	out := make([]int, n)
	for i := range out {
		out[i] = int(z.Uint64())
	}
	return out
}

func TestNewValidates(t *testing.T) {
	for _, cfg := range []Config{{Stripes: 3}, {Capacity: -1}, {Slots: 1}, {Window: time.Millisecond, Slots: 6}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	s := newSketch(t, Config{})
	if c := s.Config(); c.Window != time.Minute || c.Slots != 6 || c.Stripes != 8 || c.Capacity != 32 {
		t.Fatalf("defaults = %+v", c)
	}
}

// Record allocates nothing once warm, including when new names take over
// counters, non-2xx answers are counted and holders change.
func TestRecordDoesNotAllocate(t *testing.T) {
	s := newSketch(t, Config{})
	all := names("counter", 5000)
	holders := []string{"session-a", "session-b", "session-c"}
	reasons := []string{"", wire.ReasonNoWorker, "something-else"}
	i := 0
	rec := func() {
		record(s, req{Name: all[i%len(all)], Holder: holders[i%3], Status: 200 + 300*(i%7/6), Reason: reasons[i%3],
			Bytes: 100, Latency: time.Duration(i%5000) * time.Microsecond, At: t0.Add(time.Duration(i) * time.Microsecond)})
		i++
	}
	for range 20_000 { // every counter of every table has held a name
		rec()
	}
	if n := testing.AllocsPerRun(10_000, rec); n != 0 {
		t.Fatalf("Record allocates %v times per call; want 0", n)
	}
	// Through an interface the proxy declares, as the proxy calls it.
	var r interface {
		Record(name []byte, holder string, status int, reason string, bytes int64, latency time.Duration, at time.Time)
	} = s
	at := t0.Add(time.Second)
	if n := testing.AllocsPerRun(10_000, func() {
		r.Record(all[i%len(all)], holders[i%3], 503, wire.ReasonClosing, 10, time.Millisecond, at)
		i++
	}); n != 0 {
		t.Fatalf("Record through an interface allocates %v times per call; want 0", n)
	}
}

// exact counts per id of a load.
func exactTop(counts map[string]uint64, n int) []string {
	ids := make([]string, 0, len(counts))
	for id := range counts {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		if counts[a] != counts[b] {
			if counts[a] > counts[b] {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		return 1
	})
	return ids[:n]
}

// Under a Zipf load over 10 000 ids spread over the window, the top 10 are
// the true top 10 and each count is within 5 % of the truth; every
// reported count is within the reported error bound.
func TestTopZipfAccuracy(t *testing.T) {
	s := newSketch(t, Config{})
	all := names("counter", 10_000)
	const n = 300_000
	ranks := zipf(1, n, uint64(len(all)-1))
	exact := map[string]uint64{}
	for i, r := range ranks {
		// Spread over 59 s: every slot of the window.
		at := t0.Add(time.Duration(i) * 59 * time.Second / n)
		record(s, req{Name: all[r], Holder: "h", Status: 200, At: at})
		exact[string(all[r][len("/counter/"):])]++
	}
	now := t0.Add(59 * time.Second)
	top := s.Top("/counter", 10, now)
	want := exactTop(exact, 10)
	if len(top.IDs) != 10 {
		t.Fatalf("Top returned %d ids; want 10", len(top.IDs))
	}
	for i, row := range top.IDs {
		if !slices.Contains(want, row.ID) {
			t.Errorf("row %d: %s (%d requests) is not in the true top 10 %v", i, row.ID, row.Requests, want)
		}
		truth := exact[row.ID]
		if diff := float64(row.Requests) - float64(truth); diff < 0 || diff > 0.05*float64(truth) {
			t.Errorf("row %d: %s counted %d; true %d (more than 5%% off, or under)", i, row.ID, row.Requests, truth)
		}
		if row.Requests-truth > top.ErrorBound {
			t.Errorf("row %d: %s overcounted by %d, beyond the error bound %d", i, row.ID, row.Requests-truth, top.ErrorBound)
		}
	}
	if top.ErrorBound == 0 || s.ErrorBound(now) < top.ErrorBound {
		t.Errorf("error bound %d (sketch-wide %d); want > 0 with 10 000 ids, sketch-wide ≥ namespace's", top.ErrorBound, s.ErrorBound(now))
	}
	t.Logf("top-10 with %d requests over %d ids: error bound %d requests (%.2f%% of the 10th id's %d)",
		n, len(all), top.ErrorBound, 100*float64(top.ErrorBound)/float64(exact[want[9]]), exact[want[9]])
}

// The window forgets what is older than a minute; rates divide by the
// time covered; bytes, p99 and the latest holder are per id.
func TestTopWindowRatesAndStats(t *testing.T) {
	s := newSketch(t, Config{})
	old := []byte("/counter/old")
	hot := []byte("/counter/hot")
	record(s, req{Name: old, Holder: "s1", Status: 200, At: t0})
	for i := range 100 {
		// 100 requests over 50 s; latencies 1..100 ms; the holder moves at i=90.
		h := "s1"
		if i >= 90 {
			h = "s2"
		}
		record(s, req{Name: hot, Holder: h, Status: 200, Bytes: 10, Latency: time.Duration(i+1) * time.Millisecond,
			At: t0.Add(10*time.Second + time.Duration(i)*500*time.Millisecond)})
	}
	top := s.Top("/counter", 5, t0.Add(59*time.Second))
	if len(top.IDs) != 2 || top.IDs[0].ID != "hot" || top.IDs[1].ID != "old" {
		t.Fatalf("Top within the first minute = %+v; want hot, old", top.IDs)
	}
	r := top.IDs[0]
	if r.Requests != 100 || r.Bytes != 1000 || r.Holder != "s2" {
		t.Fatalf("hot = %+v; want 100 requests, 1000 bytes, holder s2 (the latest)", r)
	}
	if r.P99Ms < 99 || r.P99Ms > 100*1.25 {
		t.Errorf("p99 = %v ms; want the bucket holding 99 ms, at most 25%% above", r.P99Ms)
	}
	if r.PerSecond < 100/59.0*0.99 || r.PerSecond > 100/59.0*1.01 {
		t.Errorf("perSecond = %v; want 100 over the 59 s covered", r.PerSecond)
	}
	if top.WindowSeconds != 60 || top.Namespace != "/counter" {
		t.Errorf("window %d s, namespace %q", top.WindowSeconds, top.Namespace)
	}
	// 75 s after t0 the first slot (t0..t0+10s) has left the window.
	top = s.Top("/counter", 5, t0.Add(75*time.Second))
	if len(top.IDs) != 1 || top.IDs[0].ID != "hot" {
		t.Fatalf("Top at t0+75s = %+v; want only hot", top.IDs)
	}
	if got := s.Top("/counter", 5, t0.Add(3*time.Minute)).IDs; len(got) != 0 {
		t.Fatalf("Top three minutes later = %+v; want nothing", got)
	}
	// A late request for a slot already reused is dropped, not counted in
	// the newer slot.
	record(s, req{Name: hot, Status: 200, At: t0.Add(3 * time.Minute)})
	record(s, req{Name: hot, Status: 200, At: t0.Add(3*time.Minute - time.Minute)})
	if got := s.Top("/counter", 5, t0.Add(3*time.Minute)).IDs; len(got) != 1 || got[0].Requests != 1 {
		t.Fatalf("Top after a late request = %+v; want hot with 1", got)
	}
}

func TestNamespacesAreSeparateAndBounded(t *testing.T) {
	s := newSketch(t, Config{MaxNamespaces: 2})
	for _, name := range []string{"/a/x", "/a/x", "/b/y", "/c/z", "bad", "/a/", "//x"} {
		record(s, req{Name: []byte(name), Status: 200, At: t0})
	}
	if got := s.Top("/a", 5, t0).IDs; len(got) != 1 || got[0].ID != "x" || got[0].Requests != 2 {
		t.Fatalf("Top(/a) = %+v; want x twice", got)
	}
	if got := s.Top("/b", 5, t0).IDs; len(got) != 1 || got[0].ID != "y" {
		t.Fatalf("Top(/b) = %+v; want y", got)
	}
	if got := s.Top("/c", 5, t0).IDs; len(got) != 0 {
		t.Fatalf("Top(/c) beyond MaxNamespaces = %+v; want nothing (not tracked)", got)
	}
	if got := s.Traffic(t0).Requests; got != 7 {
		t.Fatalf("Traffic requests = %d; want 7 (untracked and unnamed requests count too)", got)
	}
	// Once /b has had no traffic for a window, /c takes its place; /b's
	// old counts never show up under /c.
	later := t0.Add(2 * time.Minute)
	record(s, req{Name: []byte("/a/x"), Status: 200, At: later})
	record(s, req{Name: []byte("/c/z"), Status: 200, At: later})
	if got := s.Top("/c", 5, later).IDs; len(got) != 1 || got[0].ID != "z" || got[0].Requests != 1 {
		t.Fatalf("Top(/c) after /b went quiet = %+v; want z once", got)
	}
	if got := s.Top("/b", 5, later).IDs; len(got) != 0 {
		t.Fatalf("Top(/b) after it was replaced = %+v", got)
	}
}

func TestTrafficHoldersAndAnswers(t *testing.T) {
	s := newSketch(t, Config{MaxHolders: 2, Stripes: 1})
	rec := func(holder string, status int, reason string) {
		record(s, req{Name: []byte("/a/x"), Holder: holder, Status: status, Reason: reason, At: t0})
	}
	for range 3 {
		rec("s1", 200, "")
	}
	rec("s2", 503, wire.ReasonClosing)
	rec("s3", 200, "") // beyond MaxHolders
	rec("", 503, wire.ReasonNoWorker)
	rec("", 503, wire.ReasonNoWorker)
	rec("s1", 404, "")
	rec("s1", 503, "made-up")
	tr := s.Traffic(t0.Add(time.Second))
	if tr.Requests != 9 || tr.WindowSeconds != 60 {
		t.Fatalf("requests %d, window %d; want 9, 60", tr.Requests, tr.WindowSeconds)
	}
	wantHolders := []wire.HolderTraffic{{SessionID: "s1", Requests: 5}, {SessionID: OtherHolder, Requests: 1}, {SessionID: "s2", Requests: 1}}
	if len(tr.Holders) != len(wantHolders) {
		t.Fatalf("holders = %+v; want %+v", tr.Holders, wantHolders)
	}
	for i, h := range tr.Holders {
		if h.SessionID != wantHolders[i].SessionID || h.Requests != wantHolders[i].Requests || h.PerSecond != float64(h.Requests) {
			t.Fatalf("holder %d = %+v; want %+v at %d/s", i, h, wantHolders[i], h.Requests)
		}
	}
	want := []wire.AnswerCount{{Status: 503, Reason: wire.ReasonNoWorker, Count: 2}, {Status: 404, Count: 1},
		{Status: 503, Reason: wire.ReasonClosing, Count: 1}, {Status: 503, Reason: OtherReason, Count: 1}}
	if !slices.Equal(tr.NotOK, want) {
		t.Fatalf("answers = %+v; want %+v", tr.NotOK, want)
	}
	if got := s.Traffic(t0.Add(2 * time.Minute)); got.Requests != 0 || len(got.NotOK) != 0 || len(got.Holders) != 0 {
		t.Fatalf("Traffic two minutes later = %+v; want empty", got)
	}
}

func TestBuckets(t *testing.T) {
	for _, d := range []time.Duration{0, 10 * time.Microsecond, 40 * time.Microsecond, time.Millisecond, 99 * time.Millisecond, 3 * time.Second, time.Hour} {
		i := bucketOf(d)
		if i == histBuckets-1 { // slower than the histogram reaches
			if d < bucketUpper(i-1) {
				t.Errorf("%v falls in the last bucket", d)
			}
			continue
		}
		if up := bucketUpper(i); d > up || (i > 0 && float64(up) > 1.25*float64(d)+1) {
			t.Errorf("%v falls in bucket %d with upper bound %v; want d ≤ bound ≤ 1.25 d", d, i, up)
		}
	}
}

func TestErrorBoundGauge(t *testing.T) {
	s := newSketch(t, Config{Capacity: 4, Stripes: 1})
	set := metrics.NewSet()
	s.RegisterMetrics(set)
	now := time.Now()
	for i := range 100 {
		record(s, req{Name: []byte(fmt.Sprintf("/a/id-%d", i%10)), Status: 200, At: now})
	}
	if b := s.ErrorBound(now); b == 0 {
		t.Fatal("ErrorBound = 0 with 10 ids in 4 counters")
	}
	var buf []byte
	w := &bytesWriter{&buf}
	set.WritePrometheus(w)
	if !slices.Contains(splitLines(string(buf)), fmt.Sprintf("pinned_hotids_error_bound %d", s.ErrorBound(time.Now()))) {
		t.Fatalf("metrics = %q; want the error bound gauge", buf)
	}
}

type bytesWriter struct{ b *[]byte }

func (w *bytesWriter) Write(p []byte) (int, error) { *w.b = append(*w.b, p...); return len(p), nil }

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		out = append(out, s[:i])
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return out
}

// Concurrent Record, Top and Traffic (run with -race): totals add up.
func TestConcurrent(t *testing.T) {
	s := newSketch(t, Config{})
	all := names("a", 50)
	var wg sync.WaitGroup
	const workers, per = 4, 5000
	for w := range workers {
		wg.Go(func() {
			for i := range per {
				record(s, req{Name: all[(i*7+w)%len(all)], Holder: "h", Status: 200, At: t0})
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			s.Top("/a", 10, t0)
			s.Traffic(t0)
		}
	})
	wg.Wait()
	var total uint64
	for _, r := range s.Top("/a", 100, t0).IDs {
		total += r.Requests
	}
	if total != workers*per {
		t.Fatalf("counts add up to %d; want %d (50 ids fit in the counters: no error)", total, workers*per)
	}
}

func benchNames() ([][]byte, []int) {
	return names("counter", 10_000), zipf(7, 1<<16, 9_999)
}

func BenchmarkRecord(b *testing.B) {
	s := newSketch(b, Config{})
	all, ranks := benchNames()
	at := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		record(s, req{Name: all[ranks[i&(len(ranks)-1)]], Holder: "session", Status: 200, Bytes: 64, Latency: 300 * time.Microsecond, At: at})
		i++
	}
}

func BenchmarkRecordParallel(b *testing.B) {
	s := newSketch(b, Config{})
	all, ranks := benchNames()
	at := time.Now()
	b.ReportAllocs()
	var seq sync.Mutex
	start := 0
	b.RunParallel(func(pb *testing.PB) {
		seq.Lock()
		i := start
		start += 7919
		seq.Unlock()
		for pb.Next() {
			record(s, req{Name: all[ranks[i&(len(ranks)-1)]], Holder: "session", Status: 200, Bytes: 64, Latency: 300 * time.Microsecond, At: at})
			i++
		}
	})
}

// One hot id from every goroutine: the worst case for striping by id.
func BenchmarkRecordParallelOneID(b *testing.B) {
	s := newSketch(b, Config{})
	name := []byte("/counter/hot")
	at := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			record(s, req{Name: name, Holder: "session", Status: 200, Bytes: 64, Latency: 300 * time.Microsecond, At: at})
		}
	})
}

func BenchmarkTop(b *testing.B) {
	s := newSketch(b, Config{})
	all, ranks := benchNames()
	at := time.Now()
	for i, r := range ranks {
		record(s, req{Name: all[r], Holder: "session", Status: 200, At: at.Add(time.Duration(i) * time.Millisecond)})
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Top("/counter", 20, at.Add(time.Minute))
	}
}
