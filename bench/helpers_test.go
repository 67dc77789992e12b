package bench

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseCommandStats(t *testing.T) {
	got := parseCommandStats("# Commandstats\r\ncmdstat_get:calls=5102,usec=25912,usec_per_call=5.08\r\ncmdstat_client|caching:calls=4,usec=6\r\nnoise\r\n")
	if len(got) != 2 || got["get"] != 5102 || got["client|caching"] != 4 {
		t.Fatalf("parseCommandStats = %v", got)
	}
	d := delta(map[string]int64{"get": 1, "info": 3}, map[string]int64{"get": 4, "info": 9, "set": 2})
	if len(d) != 2 || d["get"] != 3 || d["set"] != 2 || sum(d) != 5 {
		t.Fatalf("delta = %v; want get 3, set 2, info excluded", d)
	}
}

func TestStatFields(t *testing.T) {
	// A command name with spaces and parentheses must not shift the fields.
	line := "1234 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 111 222 0 0"
	f := statFields(line)
	if f[0] != "S" || f[1] != "1" || f[11] != "111" || f[12] != "222" {
		t.Fatalf("statFields = %q", f)
	}
	self, err := cpuTicks(os.Getpid())
	if err != nil || self < 0 {
		t.Fatalf("cpuTicks(self) = %d, %v", self, err)
	}
}

func TestMedianAndRatio(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Errorf("median odd = %v", m)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median even = %v", m)
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing is not NaN")
	}
	// Per-round ratios, then the median: a round missing on one side is
	// left out, and a slow round on both sides does not skew the result.
	num := map[int]Sample{1: {Rate: 50}, 2: {Rate: 10}, 3: {Rate: 60}, 4: {Rate: 1}}
	den := map[int]Sample{1: {Rate: 100}, 2: {Rate: 20}, 3: {Rate: 100}}
	if r := ratio(num, den, rateOf); r != 0.5 {
		t.Errorf("ratio = %v; want 0.5 (median of 0.5, 0.5, 0.6)", r)
	}
	var b strings.Builder
	table(&b, []string{"a", "b"}, [][]string{{"1", "2"}})
	if b.String() != "| a | b |\n|---|---|\n| 1 | 2 |\n\n" {
		t.Errorf("table = %q", b.String())
	}
}

func TestParsePerf(t *testing.T) {
	out := "# started on Wed Dec  2 18:04:51 2026\n\n142129,,raw_syscalls:sys_enter,2062604312,100.00,,\n26371,,context-switches,2062604312,100.00,,\n"
	n, c, ok := parsePerf(out)
	if !ok || n != 142129 || c != 26371 {
		t.Fatalf("parsePerf = %v %v %v", n, c, ok)
	}
	if _, _, ok := parsePerf("<not counted>,,raw_syscalls:sys_enter,0,0,,\n"); ok {
		t.Error("an uncounted event was accepted")
	}
}

func TestResultsJSONWithoutNaN(t *testing.T) {
	r := &Results{Suites: []*SuiteResult{{Name: "x",
		Values:  map[string]float64{"ok": 1, "missing": math.NaN()},
		Samples: []Sample{{OtherBusy: math.NaN(), CPUus: map[string]float64{"proxy": math.Inf(1)}}}}}}
	r.dropNaN()
	if _, err := jsonMarshal(r); err != nil {
		t.Fatalf("JSON after dropNaN: %v", err)
	}
	if _, ok := r.Suites[0].Values["missing"]; ok || r.Suites[0].Values["ok"] != 1 {
		t.Errorf("Values = %v", r.Suites[0].Values)
	}
}

func TestParseWrk(t *testing.T) {
	out := `Running 5s test @ http://127.0.0.1:1/counter/bench/
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   713.79us    1.14ms  22.10ms   90.63%
    Req/Sec    70.24k     8.35k   90.68k    72.00%
  Latency Distribution
     50%  373.00us
     75%  500.00us
     90%    1.20ms
     99%    5.67ms
  698610 requests in 5.01s, 123.92MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec: 139557.94
Transfer/sec:     24.76MB
`
	r, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.requests != 698610 || r.rate != 139557.94 || r.p50 != 0.373 || r.p99 != 5.67 || r.errors != 12 ||
		r.errorText != "Socket errors: connect 0, read 2, write 0, timeout 3; Non-2xx or 3xx responses: 7" {
		t.Errorf("parseWrk = %+v", r)
	}
	if _, err := parseWrk("wrk: cannot connect\n"); err == nil {
		t.Error("parseWrk accepted output without a count")
	}
}

// wrk2's summary (the head and tail of a real run against the local
// counter): its percentiles read "50.000%", and neither "99.900%" nor the
// detailed spectrum below them may be mistaken for them.
func TestParseWrk2(t *testing.T) {
	out := `Running 8s test @ http://127.0.0.1:7300/counter/bench/
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.32ms  616.22us   5.46ms   65.82%
    Req/Sec       -nan      -nan   0.00      0.00%
  Latency Distribution (HdrHistogram - Recorded Latency)
 50.000%    1.28ms
 75.000%    1.73ms
 90.000%    2.15ms
 99.000%    2.86ms
 99.900%    3.65ms
 99.990%    4.90ms
 99.999%    5.11ms
100.000%    5.47ms

  Detailed Percentile spectrum:
       Value   Percentile   TotalCount 1/(1-Percentile)

       0.059     0.000000            1         1.00
       1.276     0.500000        44769         2.00
       6.587     1.000000        89522          inf
#[Mean    =        1.289, StdDeviation   =        0.596]
----------------------------------------------------------
  89537 requests in 8.00s, 18.02MB read
Requests/sec:  11191.36
Transfer/sec:      2.25MB
`
	r, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.requests != 89537 || r.rate != 11191.36 || r.p50 != 1.28 || r.p99 != 2.86 || r.errors != 0 {
		t.Errorf("parseWrk(wrk2) = %+v", r)
	}
}

// The bench passes the operator's PINBOARD_* settings to its pinboards,
// never over the ones the rig sets, and nothing else.
func TestPassThrough(t *testing.T) {
	got := passThrough([]string{"PINBOARD_LOOPS=0", "PINBOARD_LISTEN=0.0.0.0:80", "HOME=/root", "PINNED_LISTEN=x", "PINBOARD_CACHE_REFRESH_AHEAD=off"},
		"PINBOARD_", []string{"PINBOARD_LISTEN=127.0.0.1:0"})
	if want := []string{"PINBOARD_LOOPS=0", "PINBOARD_CACHE_REFRESH_AHEAD=off"}; !slices.Equal(got, want) {
		t.Fatalf("passThrough = %q; want %q", got, want)
	}
}
