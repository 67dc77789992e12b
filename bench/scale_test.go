package bench

import (
	"context"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// The points a run measures: the full ladder bounded by ScaleMax as a
// multiple of the first point, the smoke point alone in smoke mode; bad
// rows and bounds are refused by name.
func TestScalePoints(t *testing.T) {
	for _, c := range []struct {
		max   int
		smoke bool
		row   string
		want  []int
	}{
		{0, false, "S1", []int{1_000, 10_000, 100_000, 1_000_000}},
		{10, false, "S1", []int{1_000, 10_000}},
		{1, false, "S3", []int{1}},
		{100, false, "S6", []int{1, 2, 5, 10}},
		{1, false, "S6", []int{1}},
		{0, true, "S6", []int{2}},
		{0, true, "S5", []int{100}},
	} {
		s := &session{o: &Options{ScaleMax: c.max, Smoke: c.smoke}}
		if got := s.pointsOf(c.row); !slices.Equal(got, c.want) {
			t.Errorf("points of %s with max %d smoke %v = %v; want %v", c.row, c.max, c.smoke, got, c.want)
		}
	}
	if err := CheckScale([]string{"S1", "S8"}, 100); err != nil {
		t.Errorf("CheckScale(S1,S8; 100) = %v", err)
	}
	for _, c := range []struct {
		rows []string
		max  int
		want string
	}{{[]string{"S9"}, 0, `unknown scale row "S9"`}, {nil, 20, "scale max 20; want 1, 10, 100 or 1000"}} {
		if err := CheckScale(c.rows, c.max); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CheckScale(%v, %d) = %v; want %q", c.rows, c.max, err, c.want)
		}
	}
	if !slices.Equal(ScaleRowIDs(), []string{"S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8"}) {
		t.Errorf("rows %v", ScaleRowIDs())
	}
}

func pts(variant string, xy ...float64) []scalePoint {
	var out []scalePoint
	for i := 0; i+1 < len(xy); i += 2 {
		out = append(out, scalePoint{x: int(xy[i]), variant: variant, v: map[string]float64{"y": xy[i+1]}})
	}
	return out
}

// The slope is log-log between the first and the last point measured,
// and names flat, linear and the rest; the verdicts judge it and the
// bounds at the largest point.
func TestSlopeAndVerdicts(t *testing.T) {
	flat := pts("", 1, 5, 10, 5.2, 100, 4.9, 1000, 5.5)
	linear := pts("", 1, 3, 10, 31, 100, 290, 1000, 3000)
	if sl := slope(flat, "", "y"); math.Abs(sl) > 0.05 || growth(sl) != "flat" {
		t.Errorf("flat: slope %v (%s)", sl, growth(sl))
	}
	if sl := slope(linear, "", "y"); math.Abs(sl-1) > 0.01 || growth(sl) != "linear" {
		t.Errorf("linear: slope %v (%s)", sl, growth(sl))
	}
	// NaN points are left out; one point, no slope.
	gaps := append(pts("", 1, 2), scalePoint{x: 10, v: map[string]float64{}}, pts("", 100, 20)[0])
	if sl := slope(gaps, "", "y"); math.Abs(sl-0.5) > 1e-9 {
		t.Errorf("slope over a gap = %v; want 0.5", sl)
	}
	if sl := slope(flat[:1], "", "y"); !math.IsNaN(sl) || growth(sl) != "–" {
		t.Errorf("one point: slope %v", sl)
	}
	if v := verdictFlat(linear, "", "y", "p99"); !strings.Contains(v, "slope 1.00 (linear) — **missed**") {
		t.Errorf("verdictFlat(linear) = %q", v)
	}
	if v := verdictFlat(flat, "", "y", "p99"); !strings.Contains(v, "**holds**") {
		t.Errorf("verdictFlat(flat) = %q", v)
	}
	if v := verdictAtMost(linear, "", "y", "RSS", 600, 1000); !strings.Contains(v, "3000.0 at 1000 — **missed** (≤ 600)") {
		t.Errorf("verdictAtMost over the bound = %q", v)
	}
	if v := verdictAtMost(linear[:2], "", "y", "RSS", 600, 1000); !strings.Contains(v, "not reached in this run") {
		t.Errorf("verdictAtMost short of the point = %q", v)
	}
	if v := verdictAtMost(flat, "", "y", "RSS", 600, 0); !strings.Contains(v, "**holds**") {
		t.Errorf("verdictAtMost under the bound = %q", v)
	}
}

// Ratios are cluster ÷ one node at the same point; the verdict takes the
// worst against 1.5.
func TestRatios(t *testing.T) {
	all := append(pts(singleNode, 1, 2, 10, 4), pts(cluster3, 1, 3, 10, 8)...)
	ratios(all, "y")
	if r := all[2].get("y ratio"); r != 1.5 {
		t.Errorf("ratio at 1 = %v; want 1.5", r)
	}
	if r := all[3].get("y ratio"); r != 2 {
		t.Errorf("ratio at 10 = %v; want 2", r)
	}
	if _, ok := all[0].v["y ratio"]; ok {
		t.Error("a one-node point got a ratio")
	}
	if v := ratioVerdicts(all, "y"); len(v) != 1 || !strings.Contains(v[0], "up to 2.00 (at 10) — **missed**") {
		t.Errorf("ratioVerdicts = %q", v)
	}
}

// A histogram's quantile between two scrapes is the upper bound of the
// bucket that holds it, counting only what was observed in between.
func TestHistQuantile(t *testing.T) {
	before := []byte(`h_bucket{endpoint="heartbeat",le="0.005"} 10
h_bucket{endpoint="heartbeat",le="0.01"} 10
h_bucket{endpoint="heartbeat",le="0.1"} 10
h_bucket{endpoint="heartbeat",le="+Inf"} 10
h_bucket{endpoint="register",le="+Inf"} 5
`)
	after := []byte(`h_bucket{endpoint="heartbeat",le="0.005"} 100
h_bucket{endpoint="heartbeat",le="0.01"} 105
h_bucket{endpoint="heartbeat",le="0.1"} 110
h_bucket{endpoint="heartbeat",le="+Inf"} 110
h_bucket{endpoint="register",le="+Inf"} 500
h_sum{endpoint="heartbeat"} 0.3
`)
	b0, b1 := histBuckets(before, "h", `endpoint="heartbeat"`), histBuckets(after, "h", `endpoint="heartbeat"`)
	if len(b1) != 4 || !math.IsInf(slices.Max(keysOf(b1)), 1) {
		t.Fatalf("buckets %v", b1)
	}
	for q, want := range map[float64]float64{0.5: 0.005, 0.9: 0.005, 0.95: 0.01, 0.99: 0.1} {
		if got := histQuantile(b0, b1, q); got != want {
			t.Errorf("q%v = %v; want %v", q, got, want)
		}
	}
	if got := histQuantile(b1, b1, 0.99); !math.IsNaN(got) {
		t.Errorf("no observations: %v; want NaN", got)
	}
}

func keysOf(m map[float64]float64) []float64 {
	var out []float64
	for k := range m {
		out = append(out, k)
	}
	return out
}

// INFO's fields, summed over nodes by snapRedis: commands, CPU, memory,
// keys.
func TestParseInfo(t *testing.T) {
	body := "# Stats\r\ntotal_commands_processed:1234\r\n# CPU\r\nused_cpu_sys:1.50\r\nused_cpu_user:2.25\r\n# Keyspace\r\ndb0:keys=42,expires=3,avg_ttl=0\r\n"
	f := parseInfo(body)
	if f["total_commands_processed"] != "1234" || f["used_cpu_sys"] != "1.50" || f["db0"] != "keys=42,expires=3,avg_ttl=0" {
		t.Errorf("parseInfo = %v", f)
	}
	if _, ok := f["# Stats"]; ok {
		t.Error("a section header was read as a field")
	}
}

// The SVG has a marker per finite point, a line through them, an escaped
// legend, and says so when nothing was measured; a log scale leaves out
// what it cannot draw.
func TestChartSVG(t *testing.T) {
	c := chart{title: "t", xLabel: "x", yLabel: "y", curves: []curve{
		{name: "a<b", x: []float64{1, 10, 100, 1000}, y: []float64{1, 2, math.NaN(), 4}},
		{name: "zero", x: []float64{1, 10}, y: []float64{0, 5}},
	}}
	svg := c.svg()
	if n := strings.Count(svg, "<circle"); n != 5 {
		t.Errorf("%d markers; want 5 (3 finite + 2)", n)
	}
	if n := strings.Count(svg, "<polyline"); n != 2 || !strings.Contains(svg, "a&lt;b") || !strings.HasPrefix(svg, "<svg") {
		t.Errorf("svg:\n%s", svg)
	}
	c.logY = true
	if n := strings.Count(c.svg(), "<circle"); n != 4 {
		t.Errorf("log y: %d markers; want 4 (the 0 left out)", n)
	}
	if s := (chart{title: "none", curves: []curve{{name: "n", x: []float64{1}, y: []float64{math.NaN()}}}}).svg(); !strings.Contains(s, "not measured") {
		t.Errorf("empty chart:\n%s", s)
	}
	for v, want := range map[float64]string{1000: "1k", 1e6: "1M", 0.25: "0.25", 150: "150", 2500: "2.5k"} {
		if got := tickLabel(v); got != want {
			t.Errorf("tickLabel(%v) = %q; want %q", v, got, want)
		}
	}
}

// The storm's client asks for every id until it is served, honours
// Retry-After up to stormMaxWait, and counts 503s by reason: here each id
// is refused once (unreachable), then served.
func TestStormClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	srv := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
		mu.Lock()
		seen[string(c.Path())]++
		first := seen[string(c.Path())] == 1
		mu.Unlock()
		if first {
			c.Response.Header.Set(wire.HeaderReason, wire.ReasonUnreachable)
			c.Response.Header.Set(wire.HeaderRetryAfter, "10")
			c.SetStatusCode(503)
			return
		}
		c.SetStatusCode(200)
	}}
	go func() { _ = srv.Serve(ln) }() // owned by the test: Shutdown below
	defer srv.Shutdown()
	start := time.Now()
	res := storm(context.Background(), "http://"+ln.Addr().String(), "id-", 200, start, start.Add(time.Minute))
	if len(res.served) != 200 || res.shed[wire.ReasonUnreachable] != 200 || res.other != 0 {
		t.Fatalf("served %d, shed %v, other %d; want 200, 200 unreachable, 0", len(res.served), res.shed, res.other)
	}
	// Every id waited stormMaxWait once (not Retry-After's 10 s).
	if t99 := res.timeTo(0.99, 200); t99 < stormMaxWait.Seconds() || t99 > 9 {
		t.Errorf("time to 99%% = %v s; want at least one wait of %v and far less than Retry-After", t99, stormMaxWait)
	}
	if got := res.timeTo(1, 201); !math.IsNaN(got) {
		t.Errorf("time to 100%% of 201 with 200 served = %v; want NaN", got)
	}
	if len(seen) != 200 {
		t.Errorf("%d distinct ids asked for; want 200", len(seen))
	}
}

// checkScaleSmoke checks the scale suite's smoke figures (TestSmoke): every
// row ran its smallest point with sane numbers, and wrote its plots.
func checkScaleSmoke(t *testing.T, r *SuiteResult, outDir string) {
	t.Helper()
	if r == nil {
		t.Error("no scale suite result")
		return
	}
	v := r.Values
	checkValues(t, "scale", v, []valueCheck{
		{"S1 1000 placed", func(x float64) bool { return x == 1000 }, "1000"},
		{"S1 1000 pinboard heap B/id", func(x float64) bool { return x > 0 && x < 1<<20 }, "in (0, 1 MiB)"},
		{"S1 1000 hot lookup p99 ms", func(x float64) bool { return x > 0 }, "> 0"},
		{"S1 1000 hot lookup hit ratio", func(x float64) bool { return x > 0.8 && x <= 1 }, "in (0.8, 1]"},
		{"S2 1000 worker heap B/instance", func(x float64) bool { return x > 0 && x < 1<<20 }, "in (0, 1 MiB)"},
		{"S2 1000 activation p99 ms", func(x float64) bool { return x > 0 }, "> 0"},
		{"S3 1 cold placement p99 ms", func(x float64) bool { return x > 0 }, "> 0"},
		{"S3 1 redis cmds/activation", func(x float64) bool { return x > 1 && x < 100 }, "in (1, 100): a claim costs commands"},
		{"S4 1 heartbeats/s", func(x float64) bool { return x > 0 }, "> 0"},
		{"S4 1 redis cmds/s", func(x float64) bool { return x > 0 }, "> 0"},
		{"S5 100 lease-only unserved", func(x float64) bool { return x == 0 }, "0"},
		{"S5 100 fast failover unserved", func(x float64) bool { return x == 0 }, "0"},
		{"S5 100 lease-only 503s", func(x float64) bool { return x > 0 }, "> 0: the ids wait for the lease"},
		{"S5 100 fast failover death probes", func(x float64) bool { return x >= 1 }, "≥ 1"},
		{"S6 2 invalidations/change", func(x float64) bool { return x >= 1 }, "≥ 1: every release reached the pinboards"},
		{"S7 1 cluster cold placement p99 ms ratio", func(x float64) bool { return x > 0 }, "> 0"},
		{"S7 100 cluster time to 99% s ratio", func(x float64) bool { return x > 0 }, "> 0"},
		{"S8 1000 released", func(x float64) bool { return x == 1000 }, "1000"},
		{"S8 1000 replace errors", func(x float64) bool { return x == 0 }, "0"},
		{"S8 1000 release calls/instance", func(x float64) bool { return x > 0 }, "> 0"},
	})
	if lo, fast := v["S5 100 lease-only time to 99% s"], v["S5 100 fast failover time to 99% s"]; !(fast < lo) {
		t.Errorf("S5: fast failover %v s, lease-only %v s to 99 %%; want fast failover sooner", fast, lo)
	}
	for _, id := range ScaleRowIDs() {
		if m, _ := filepath.Glob(filepath.Join(outDir, "*-scale-"+id+"-*.svg")); len(m) == 0 {
			t.Errorf("no plot of %s in %s", id, outDir)
		} else if b, err := os.ReadFile(m[0]); err != nil || !strings.Contains(string(b), "<polyline") && !strings.Contains(string(b), "<circle") {
			t.Errorf("plot %s: %v, no point drawn", m[0], err)
		}
		if !strings.Contains(r.Markdown, "### "+id+" — ") {
			t.Errorf("the report has no section %s", id)
		}
	}
}
