package bench

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/ci"
)

// TestSmoke runs every suite in smoke mode (about a second per
// measurement, one round) against real processes on 127.0.0.1 and checks
// that the report is written and its numbers are sane: traffic flowed, no
// request failed, steady-state Redis traffic is (about) zero while
// activations do cost Redis commands, memory per instance is plausible, a
// killed worker's ids move sooner with fast failover than without,
// profiles were captured, and the scale suite's rows ran their smallest
// points (checkScaleSmoke), and the trace suite joined the pinned_spans
// pinboard's spans with loadgen's records. nginx, HAProxy and wrk rows are checked when those
// binaries are installed and must be noted as skipped otherwise; in CI
// (internal/testkit/ci), which installs them, a missing one fails the test.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the smoke run starts real processes for ~90 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	out, prof := t.TempDir(), t.TempDir()
	var log strings.Builder
	res, err := Run(ctx, Options{
		Suites:     append(append([]string(nil), Suites...), "profile", "scale", "trace"),
		Smoke:      true,
		ModuleDir:  "..",
		OutDir:     out,
		ProfileDir: prof,
		Log:        &log,
		Command:    "go test ./bench -run TestSmoke",
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	md, err := os.ReadFile(res.Report)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## proxy", "## activation", "## streaming", "## websocket", "## redis", "## memory", "## alarms", "## failover", "## loadgen", "## profile", "## scale", "## trace", "| kernel |", "Pinning:"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, err := os.Stat(res.JSONPath); err != nil {
		t.Errorf("JSON twin: %v", err)
	}
	suite := map[string]*SuiteResult{}
	for _, s := range res.Suites {
		suite[s.Name] = s
	}
	positive := func(s, key string) {
		t.Helper()
		if v, ok := suite[s].Values[key]; !ok || !(v > 0) {
			t.Errorf("%s: %q = %v (present %v); want > 0", s, key, v, ok)
		}
	}
	positive("trace", "trace p99 ms") // spans joined with loadgen's records (the suite fails when none join)
	zero := func(s, key string) {
		t.Helper()
		if v, ok := suite[s].Values[key]; !ok || v != 0 {
			t.Errorf("%s: %q = %v (present %v); want 0", s, key, v, ok)
		}
	}
	for _, s := range res.Suites {
		for _, x := range s.Samples {
			if x.Sent == 0 || x.Rate <= 0 || x.Errors != 0 || x.Unsent != 0 {
				t.Errorf("%s %s %s: sent %d rate %.0f errors %d unsent %d %s", s.Name, x.Workload, x.Target, x.Sent, x.Rate, x.Errors, x.Unsent, x.ErrorDetail)
			}
			if x.P50 <= 0 || x.P99 < x.P50 {
				t.Errorf("%s %s %s: p50 %v p99 %v", s.Name, x.Workload, x.Target, x.P50, x.P99)
			}
		}
	}

	targets := []string{"direct", "pinboard"}
	for _, peer := range []string{"nginx", "haproxy"} {
		if _, err := peerBinary(peer); err == nil {
			targets = append(targets, peer)
			if strings.Contains(strings.Join(suite["proxy"].Notes, "\n"), peer) {
				t.Errorf("%s installed but skipped: %q", peer, suite["proxy"].Notes)
			}
		} else if ci.Enabled() {
			t.Errorf("%s is not installed, and CI installs it: the proxy suite ran without it", peer)
		} else if !strings.Contains(strings.Join(suite["proxy"].Notes, "\n"), peer+" rows skipped") {
			t.Errorf("%s is not installed but the proxy suite does not say it skipped it: %q", peer, suite["proxy"].Notes)
		}
	}
	for _, tg := range targets {
		positive("proxy", "closed-64 "+tg+" rate")
		zero("proxy", "closed-64 "+tg+" errors")
		positive("streaming", "1MiB "+tg+" MB/s")
		positive("streaming", "8MiB "+tg+" MB/s")
		positive("streaming", "up1MiB "+tg+" MB/s")
		zero("streaming", "up1MiB "+tg+" errors")
	}
	if v := suite["proxy"].Values["closed-64 pinboard/direct rate"]; !(v > 0.01 && v < 10) {
		t.Errorf("pinboard/direct = %v; want a sane ratio", v)
	}
	positive("proxy", "closed-64 pinboard proxy cpu us/req")
	positive("activation", "activations/s pinboard")
	positive("activation", "redis commands/activation") // placing a new id costs Redis commands
	positive("websocket", "ws pinboard round trips/s")
	positive("websocket", "ws direct round trips/s")
	positive("redis", "redis requests")
	if v := suite["redis"].Values["redis commands/request"]; !(v >= 0 && v < 0.05) {
		t.Errorf("steady-state Redis commands/request = %v; want ≈ 0 (placements are cached)", v)
	}
	for _, n := range []string{"1000", "2000"} {
		if v := suite["memory"].Values["bytes/instance "+n+" heap"]; !(v > 100 && v < 1<<20) {
			t.Errorf("memory: %v B/instance at %s; want a plausible figure", v, n)
		}
	}
	checkAlarmsSmoke(t, suite["alarms"])
	checkFailoverSmoke(t, suite["failover"])
	checkScaleSmoke(t, suite["scale"], out)
	positive("loadgen", "closed-64 loadgen rate")
	positive("loadgen", "closed-64 loadgen cpu us/req")
	positive("loadgen", "open-2k loadgen cpu us/req")
	positive("loadgen", "open-2k-coalesce loadgen lag p99 us")
	positive("loadgen", "floor wake cpu us")
	if !strings.Contains(suite["loadgen"].Markdown, "This machine's floor") {
		t.Error("the loadgen report does not show the machine's floor")
	}
	if _, err := exec.LookPath(wrkPath); err == nil {
		positive("loadgen", "closed-64 wrk rate")
		positive("loadgen", "closed-64 loadgen/wrk cpu")
	} else if ci.Enabled() {
		t.Error("wrk is not installed, and CI installs it: the loadgen suite ran without it")
	} else if !strings.Contains(strings.Join(suite["loadgen"].Notes, "\n"), "wrk rows skipped") {
		t.Errorf("wrk is not installed but the loadgen suite does not say it skipped it: %q", suite["loadgen"].Notes)
	}
	if _, err := exec.LookPath(wrk2Name); err == nil {
		positive("loadgen", "open-2k wrk2 cpu us/req")
		positive("loadgen", "open-2k wrk2 p99 ms")
		positive("loadgen", "open-2k loadgen/wrk2 cpu")
	} else if !strings.Contains(strings.Join(suite["loadgen"].Notes, "\n"), "wrk2 rows skipped") {
		t.Errorf("wrk2 is not on PATH but the loadgen suite does not say it skipped it: %q", suite["loadgen"].Notes)
	}
	for _, x := range suite["loadgen"].Samples {
		if x.Target == "loadgen" && !(x.CPUus["generator-self"] > 0) {
			t.Errorf("loadgen %s round %d: no CPU per request in its own report", x.Workload, x.Round)
		}
	}
	for _, f := range []string{"pinboard-cpu.pb.gz", "pinboard-allocs.pb.gz", "worker-cpu.pb.gz", "worker-allocs.pb.gz"} {
		if st, err := os.Stat(prof + "/" + f); err != nil || st.Size() == 0 {
			t.Errorf("profile %s: %v", f, err)
		}
	}
}

// checkAlarmsSmoke checks the alarms suite's figures: every alarm fired
// once, the healthy ones within a second, the outage ones after it, and
// both phases cost Redis commands.
func checkAlarmsSmoke(t *testing.T, r *SuiteResult) {
	t.Helper()
	if r == nil {
		t.Error("no alarms suite result")
		return
	}
	checkValues(t, "alarms", r.Values, []valueCheck{
		{"alarms fired", func(x float64) bool { return x == 2000 }, "2000"},
		{"alarms duplicates", func(x float64) bool { return x == 0 }, "0"},
		{"alarms healthy p50 ms", func(x float64) bool { return x >= 0 && x < 1000 }, "in [0, 1000)"},
		{"alarms healthy max ms", func(x float64) bool { return x >= 0 && x < 5000 }, "in [0, 5000)"},
		{"alarms outage fired", func(x float64) bool { return x == 200 }, "200"},
		{"alarms outage max ms", func(x float64) bool { return x > 1000 }, "> 1000 (the outage)"},
		{"redis commands/set alarm", func(x float64) bool { return x > 0 }, "> 0"},
		{"redis commands/fired alarm", func(x float64) bool { return x > 0 }, "> 0"},
	})
}

// valueCheck is one figure of a suite's Values and what it must be.
type valueCheck struct {
	key    string
	ok     func(float64) bool
	expect string
}

// checkValues fails the test for every check whose figure is missing or
// not ok.
func checkValues(t *testing.T, suite string, v map[string]float64, checks []valueCheck) {
	t.Helper()
	for _, c := range checks {
		if x, ok := v[c.key]; !ok || !c.ok(x) {
			t.Errorf("%s: %q = %v (present %v); want %s", suite, c.key, x, ok, c.expect)
		}
	}
}
