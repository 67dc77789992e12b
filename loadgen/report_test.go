package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// sampleReport runs a small open-loop run with known latencies (1..100ms,
// one slot per ms, the 1000th slot with a 503 and a reason) in a synctest
// bubble.
func sampleReport(t *testing.T, label string) *Report {
	t.Helper()
	var rep *Report
	synctest.Test(t, func(t *testing.T) {
		r := mustNew(t, Config{URL: "http://127.0.0.1:1", Rate: 1000, Duration: time.Second, Requests: Unbounded,
			Connections: 200, Label: label})
		var count atomic.Int64
		withExec(r, func(_ []byte, o *outcome) {
			n := count.Add(1)
			d := time.Duration(1+n%100) * time.Millisecond
			time.Sleep(d)
			o.status, o.recv = 200, 10
			if n%100 == 0 {
				o.status, o.reason = 503, []byte("overloaded")
			}
		})
		var err error
		if rep, err = r.Run(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	return rep
}

func TestReportJSONRoundTrip(t *testing.T) {
	rep := sampleReport(t, "direct")
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	// The schema uses these exact keys; bench scripts read them.
	var raw map[string]any
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "label", "runId", "start", "config", "stoppedBy", "elapsedSeconds", "requests",
		"targetRate", "achievedRate", "errorRate", "latencyUs", "serviceUs", "scheduleLagUs", "distribution",
		"histogram", "bytes", "statuses", "errors", "scenarios", "generator"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("JSON report has no key %q", k)
		}
	}
	lat := raw["latencyUs"].(map[string]any)
	for _, k := range []string{"count", "clamped", "min", "mean", "stddev", "p50", "p90", "p99", "p99_9", "p99_99", "max"} {
		if _, ok := lat[k]; !ok {
			t.Errorf("latencyUs has no key %q", k)
		}
	}
	back, err := ReadReport(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rep) {
		t.Errorf("ReadReport(WriteJSON(r)) differs from r:\n%+v\n%+v", back, rep)
	}
	if rep.Errors.Status["503"] != 10 || rep.Errors.Reason["overloaded"] != 10 || rep.Bytes.Received != 10_000 {
		t.Errorf("errors %+v bytes %+v; want 503×10 overloaded×10, 10000 bytes", rep.Errors, rep.Bytes)
	}
	// The encoded histogram decodes to the reported latencies.
	h, err := hdrhistogram.Decode([]byte(rep.Histogram))
	if err != nil || h.TotalCount() != rep.Latency.Count || h.ValueAtPercentile(99) != rep.Latency.P99 {
		t.Errorf("decoded histogram count %d p99 %d (err %v); want %d, %d", h.TotalCount(), h.ValueAtPercentile(99), err, rep.Latency.Count, rep.Latency.P99)
	}
	last := rep.Distribution[len(rep.Distribution)-1]
	if last.Percentile != 100 || last.Us != rep.Latency.Max || last.Count != rep.Latency.Count {
		t.Errorf("distribution ends at %+v; want 100%% at max %d with count %d", last, rep.Latency.Max, rep.Latency.Count)
	}
	if _, err := ReadReport(strings.NewReader(`{"version": 99}`)); err == nil {
		t.Error("ReadReport accepted version 99")
	}
	// The achieved rate counts the successful responses over the measured
	// phase (at least the schedule's second), not the requests sent.
	if want := 990 / max(rep.ElapsedSeconds, 1); rep.AchievedRate != want {
		t.Errorf("achieved rate %v; want 990 successes over %.3fs = %v", rep.AchievedRate, max(rep.ElapsedSeconds, 1), want)
	}
	// A version 2 report (its achievedRate counted sent requests) reads as
	// version 3, its rate recomputed from its counts.
	raw["version"], raw["achievedRate"] = 2, 1000
	old, _ := json.Marshal(raw)
	if v2, err := ReadReport(bytes.NewReader(old)); err != nil || v2.Version != ReportVersion || v2.AchievedRate != 990/rep.ElapsedSeconds {
		t.Errorf("version 2 report: %v; want version 3 and an achieved rate of %v", v2, 990/rep.ElapsedSeconds)
	}
}

func TestWriteText(t *testing.T) {
	rep := sampleReport(t, "direct")
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"[direct]", "open loop 1000 req/s", "stopped by the duration bound (1s) after ", "1000 sent, 0 unsent, 990 ok; ",
		"req/s achieved (successful responses per second; target 1000 req/s)",
		"latency (from intended send time)", "p99.9", "p99.99", "service", "schedule lag",
		"statuses       200×990 503×10", "errors         10 (1.000% of sent+unsent)", "status 503×10", "reason overloaded×10",
		"bytes          sent 0 B, received 9.8 KiB",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
}

func TestWritePlotHTMLIsSelfContained(t *testing.T) {
	a, b := sampleReport(t, "direct"), sampleReport(t, `<pinboard & "co">`)
	var buf bytes.Buffer
	if err := WritePlotHTML(&buf, "proxy vs direct", []*Report{a, b}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"<svg", "</svg>", "<polyline", "90%", "99%", "99.9%", "&lt;pinboard &amp; &#34;co&#34;&gt;", "latency (ms)", "<table>"} {
		if !strings.Contains(out, want) {
			t.Errorf("plot lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "src=", "href=", "<pinboard", "https://"} {
		if strings.Contains(out, bad) {
			t.Errorf("plot contains %q: it must be self-contained and escaped", bad)
		}
	}
	percentiles, series, ok := strings.Cut(out, "second of the measured phase")
	if !ok {
		t.Fatal("no time-series chart")
	}
	if n := strings.Count(percentiles, "<polyline"); n != 2 {
		t.Errorf("%d percentile curves; want 2", n)
	}
	// Per run: p50, p99 and p99.9 over time, and the rate.
	if n := strings.Count(series, "<polyline"); n != 8 {
		t.Errorf("%d time-series lines; want 8", n)
	}
	if n := strings.Count(series, "errors in second"); n == 0 {
		t.Error("no error bars: the sample runs have 503s every second")
	}
}

func TestYScale(t *testing.T) {
	f := func(maxUs int64, wantStep float64, wantUnit string) {
		t.Helper()
		step, unit, _ := yScale(maxUs)
		if step != wantStep || unit != wantUnit {
			t.Errorf("yScale(%d) = %v %s; want %v %s", maxUs, step, unit, wantStep, wantUnit)
		}
	}
	f(1, 1, "µs")
	f(950, 200, "µs")
	f(100_000, 20_000, "ms")
	f(12_000_000, 2_500_000, "s")
}
