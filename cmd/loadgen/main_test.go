//go:debug netdns=go

package main

// The go:debug line makes the resolver Go's own, which refuses a malformed
// host name without sending a query: no test traffic leaves 127.0.0.1.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/dyingtarget"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/tlstest"
	"github.com/pinned-go/pinned/loadgen"
)

// builder builds the command for TestCommandLine.
var builder proctest.Builder

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m, builder.Cleanup) }

// TestCommandLine runs the built command: a URL it cannot use is exit
// status 2 before anything is sent (a port out of range, a host that does
// not resolve), -h and -version print to stdout.
func TestCommandLine(t *testing.T) {
	bin := builder.Build(t, "github.com/pinned-go/pinned/cmd/loadgen")
	proctest.CheckCommandLine(t, bin, "loadgen", []proctest.Case{
		{Args: []string{"-url", "http://127.0.0.1:99999"}, Code: 2,
			Stderr: `loadgen: invalid loadgen config: URL "http://127.0.0.1:99999": port 99999 is out of range; want 1 to 65535`},
		{Args: []string{"-url", "http://" + badHost}, Code: 2, Stderr: "loadgen: -url http://" + badHost + ": the target's host does not resolve"},
		{Args: []string{"-url", "http://127.0.0.1:1", "-max-errors", "x"}, Code: 2, Stderr: `loadgen: -max-errors="x": want a percentage`},
		{Args: []string{"plot", "-h"}},
	}, "GODEBUG=netdns=go") // Go's resolver: no query for badHost
	if r := proctest.Run(t, bin, []string{"plot", "-h"}); !strings.HasPrefix(r.Stdout, "Usage: loadgen plot") {
		t.Errorf("loadgen plot -h printed %q on stdout", r.Stdout)
	}
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// serve runs h on a 127.0.0.1 port until the test ends and returns its URL.
func serve(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h, Logger: quiet{}}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() {
		_ = ln.Close() // in case Shutdown runs before Serve registered ln
		_ = srv.Shutdown()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

func runArgs(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsageErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	badMix := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(badMix, []byte(`{"scenarios": [{"kind": "gett"}]}`), 0o600)
	f := func(wantInErr string, args ...string) {
		t.Helper()
		code, _, stderr := runArgs(args...)
		if code != exitUsage || !strings.Contains(stderr, wantInErr) {
			t.Errorf("loadgen %q: exit %d, stderr %q; want exit 2 mentioning %q", args, code, stderr, wantInErr)
		}
	}
	f("URL is required")
	f("bound the run by at least one", "-url", "http://127.0.0.1:1", "-duration", "0", "-requests", "0")
	f("-duration -1s", "-url", "http://127.0.0.1:1", "-duration", "-1s")
	f(`kind "put"`, "-url", "http://127.0.0.1:1", "-scenario", "put")
	f(`IDs.Dist = "pareto"`, "-url", "http://127.0.0.1:1", "-dist", "pareto")
	f(`want "Name: value"`, "-url", "http://127.0.0.1:1", "-H", "NoColon")
	f("flag provided but not defined: -nope", "-url", "http://127.0.0.1:1", "-nope")
	f("scheme must be http or https", "-url", "ftp://127.0.0.1:1")
	f("-max-workers applies to the open loop only", "-url", "http://127.0.0.1:1", "-max-workers", "3")
	f("cannot read scenario file", "-url", "http://127.0.0.1:1", "-mix", filepath.Join(dir, "missing.json"))
	f(`kind "gett"`, "-url", "http://127.0.0.1:1", "-mix", badMix)
	f("-mix replaces", "-url", "http://127.0.0.1:1", "-mix", badMix, "-body-size", "3")
	f(`unexpected argument "extra"`, "-url", "http://127.0.0.1:1", "extra")
	f("port 99999 is out of range; want 1 to 65535", "-url", "http://127.0.0.1:99999")
	f("-url http://"+badHost+": the target's host does not resolve: "+badHost, "-url", "http://"+badHost)
	f(`-max-errors="5": want a percentage`, "-url", "http://127.0.0.1:1", "-max-errors", "5")
	f(`-max-errors="101%"`, "-url", "http://127.0.0.1:1", "-max-errors", "101%")
}

// badHost does not resolve, and is refused by Go's resolver before any
// query (a label longer than 63 bytes).
var badHost = strings.Repeat("x", 64) + ".invalid"

func TestRunWritesTableJSONAndPlot(t *testing.T) {
	url := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("hello") })
	dir := t.TempDir()
	jsonPath, plotPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	code, stdout, stderr := runArgs("-url", url, "-path", "/counter/{id}/", "-requests", "50", "-c", "2", "-quiet",
		"-dist", "zipf", "-keys", "10", "-label", "direct", "-json", jsonPath, "-plot", plotPath)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("stderr %q; want nothing with -quiet", stderr)
	}
	if !strings.Contains(stdout, "stopped by the request bound (50) after") || !strings.Contains(stdout, "p99.9") {
		t.Errorf("table:\n%s", stdout)
	}
	rep := readReport(t, jsonPath)
	if rep.Requests.Sent != 50 || rep.Label != "direct" || rep.Config.IDs.Dist != loadgen.DistZipf || rep.Bytes.Received != 250 {
		t.Errorf("report: sent %d label %q dist %q bytes %d", rep.Requests.Sent, rep.Label, rep.Config.IDs.Dist, rep.Bytes.Received)
	}
	plot, err := os.ReadFile(plotPath)
	if err != nil || !bytes.Contains(plot, []byte("<svg")) {
		t.Errorf("plot file: %v, has svg %v", err, bytes.Contains(plot, []byte("<svg")))
	}

	// Saved reports plot together.
	out := filepath.Join(dir, "both.html")
	if code, _, stderr := runArgs("plot", "-title", "a vs b", "-o", out, jsonPath, jsonPath); code != exitOK {
		t.Fatalf("plot: exit %d: %s", code, stderr)
	}
	b, _ := os.ReadFile(out)
	if pct, _, _ := bytes.Cut(b, []byte("second of the measured phase")); bytes.Count(pct, []byte("<polyline")) != 2 {
		t.Errorf("combined plot has %d percentile curves; want 2", bytes.Count(pct, []byte("<polyline")))
	}
	if code, _, _ := runArgs("plot", "-o", out, plotPath); code != exitUsage {
		t.Errorf("plot of a non-JSON file: exit %d; want 2", code)
	}
}

func TestJSONToStdoutMovesTableToStderr(t *testing.T) {
	url := serve(t, func(ctx *fasthttp.RequestCtx) {})
	code, stdout, stderr := runArgs("-url", url, "-rate", "500", "-duration", "100ms", "-json", "-")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var rep map[string]any
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, stdout)
	}
	if rep["targetRate"] != 500.0 || rep["stoppedBy"] != "duration" || rep["config"].(map[string]any)["requests"] != 0.0 {
		t.Errorf("targetRate %v stoppedBy %v", rep["targetRate"], rep["stoppedBy"])
	}
	if !strings.Contains(stderr, "latency (from intended send time)") {
		t.Errorf("stderr lacks the table:\n%s", stderr)
	}
}

// TestErrorBudget: past the error budget (-max-errors, 1% unless set) the
// run fails.
func TestErrorBudget(t *testing.T) {
	var n atomic.Int64
	url := serve(t, func(ctx *fasthttp.RequestCtx) {
		if n.Add(1)%2 == 0 {
			ctx.Error("full", 503)
			ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonCapacity)
		}
	})
	args := []string{"-url", url, "-requests", "20", "-c", "1", "-quiet"}
	if code, stdout, stderr := runArgs(args...); code != exitErrorRate || !strings.Contains(stdout, "reason capacity×10") ||
		!strings.Contains(stderr, "error rate 50.000% exceeds the error budget -max-errors 1%") {
		t.Errorf("half failing, default budget: exit %d, stderr %q; want 1 and the reasons in the table:\n%s", code, stderr, stdout)
	}
	if code, _, stderr := runArgs(append(args, "-max-errors", "40%")...); code != exitErrorRate || !strings.Contains(stderr, "exceeds the error budget -max-errors 40%") {
		t.Errorf("with -max-errors 40%%: exit %d, stderr %q; want 1", code, stderr)
	}
	for _, budget := range []string{"60%", "off"} {
		if code, _, stderr := runArgs(append(args, "-max-errors", budget)...); code != exitOK {
			t.Errorf("with -max-errors %s: exit %d, stderr %q; want 0", budget, code, stderr)
		}
	}
	ok := serve(t, func(*fasthttp.RequestCtx) {})
	if code, _, stderr := runArgs("-url", ok, "-requests", "20", "-quiet"); code != exitOK || stderr != "" {
		t.Errorf("no error: exit %d, stderr %q; want 0", code, stderr)
	}
}

// TestTargetKilledMidRunExit1: a target that dies after 40 of 100 requests
// is a failed run (60% errors, over the budget), its achieved rate the 40
// successes at most over the schedule's half second, not the target rate.
func TestTargetKilledMidRunExit1(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "r.json")
	code, stdout, stderr := runArgs("-url", dyingtarget.Start(t, 40), "-rate", "200", "-requests", "100", "-quiet", "-json", out)
	if code != exitErrorRate || !strings.Contains(stderr, "exceeds the error budget -max-errors 1%") {
		t.Fatalf("exit %d, stderr %q; want 1 over the error budget\n%s", code, stderr, stdout)
	}
	rep := readReport(t, out)
	ok := rep.Requests.Sent - rep.Requests.Errors
	if rep.Requests.Sent != 100 || ok > 40 || rep.AchievedRate > 80 || rep.AchievedRate != float64(ok)/max(rep.ElapsedSeconds, 0.5) {
		t.Errorf("sent %d, %d ok, achieved %.1f/s; want 100 sent, at most 40 ok, their rate", rep.Requests.Sent, ok, rep.AchievedRate)
	}
	if !strings.Contains(stdout, fmt.Sprintf("100 sent, 0 unsent, %d ok; %.1f req/s achieved (successful responses per second; target 200 req/s)", ok, rep.AchievedRate)) {
		t.Errorf("the report line does not say what was achieved:\n%s", stdout)
	}
}

// TestBounds: -duration alone is never cut short by a count, -requests
// alone has no time bound, and with both the report names the bound that
// ended the run and the other one.
func TestBounds(t *testing.T) {
	url := serve(t, func(*fasthttp.RequestCtx) {})
	dir := t.TempDir()
	for _, c := range []struct {
		args        []string
		stopped     string
		durationSec float64
		requests    float64
	}{
		{[]string{"-duration", "300ms"}, "stopped by the duration bound (300ms) after", 0.3, 0},
		{[]string{"-requests", "30"}, "stopped by the request bound (30) after", 0, 30},
		{[]string{"-requests", "30", "-duration", "1m"}, "stopped by the request bound (30), before the duration bound (1m0s) after", 60, 30},
		{[]string{"-rate", "100", "-duration", "300ms", "-requests", "1000"}, "stopped by the duration bound (300ms), before the request bound (1000) after", 0.3, 1000},
	} {
		out := filepath.Join(dir, "r.json")
		code, stdout, stderr := runArgs(append([]string{"-url", url, "-c", "2", "-quiet", "-json", out}, c.args...)...)
		if code != exitOK || !strings.Contains(stdout, c.stopped) {
			t.Errorf("%v: exit %d %s; want the line %q:\n%s", c.args, code, stderr, c.stopped, stdout)
			continue
		}
		if rep := readReport(t, out); rep.Config.DurationSeconds != c.durationSec || float64(rep.Config.Requests) != c.requests {
			t.Errorf("%v: bounds %vs and %d requests; want %vs and %v", c.args, rep.Config.DurationSeconds, rep.Config.Requests, c.durationSec, c.requests)
		}
	}
}

// TestEveryRequestFailedExit1: a run where nothing succeeded is a failure
// whatever the budget, and says so; a target that refuses the first
// connection fails at once, before the run.
func TestEveryRequestFailedExit1(t *testing.T) {
	failing := serve(t, func(ctx *fasthttp.RequestCtx) { ctx.Error("no", 500) })
	for _, mode := range [][]string{{"-requests", "10"}, {"-rate", "200", "-requests", "10"}} {
		code, stdout, stderr := runArgs(append([]string{"-url", failing, "-quiet", "-max-errors", "off"}, mode...)...)
		if code != exitErrorRate || !strings.Contains(stderr, "no request succeeded (10 sent, 10 failed") || !strings.Contains(stdout, "errors         10") ||
			!strings.Contains(stdout, "0 ok; no successful responses") {
			t.Errorf("%v: exit %d, stderr %q; want 1 and why\n%s", mode, code, stderr, stdout)
		}
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	code, stdout, stderr := runArgs("-url", "http://"+gone, "-duration", "10s")
	if code != exitErrorRate || stdout != "" ||
		!strings.Contains(stderr, "loadgen: cannot connect to the target "+gone+": ") || !strings.Contains(stderr, "refused; nothing was sent") {
		t.Errorf("a refused target: exit %d, stderr %q, stdout %q; want 1 at once, naming the target", code, stderr, stdout)
	}
}

// TestInterruptExit3: an interrupted run exits 3 with the report so far;
// interrupted before it started, with nothing.
func TestInterruptExit3(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := serve(t, func(*fasthttp.RequestCtx) { cancel() }) // the first request interrupts the run
	var o, e bytes.Buffer
	if code := run(ctx, []string{"-url", url, "-rate", "100", "-duration", "10s", "-quiet"}, &o, &e); code != exitRun {
		t.Errorf("cancelled run: exit %d; want 3; stderr %q", code, e.String())
	}
	if !strings.Contains(o.String(), "interrupted after") || !strings.Contains(e.String(), "interrupted; the report covers the run so far") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", o.String(), e.String())
	}
	o.Reset()
	e.Reset()
	if code := run(ctx, []string{"-url", url, "-duration", "10s"}, &o, &e); code != exitRun || o.Len() != 0 || !strings.Contains(e.String(), "interrupted before the run") {
		t.Errorf("cancelled before the run: exit %d, stdout %q, stderr %q; want 3 and nothing sent", code, o.String(), e.String())
	}
}

func TestUnwritableOutputExit3(t *testing.T) {
	url := serve(t, func(ctx *fasthttp.RequestCtx) {})
	code, _, stderr := runArgs("-url", url, "-requests", "5", "-quiet", "-json", filepath.Join(t.TempDir(), "no", "such", "dir.json"))
	if code != exitRun || !strings.Contains(stderr, "cannot write JSON report") {
		t.Errorf("exit %d stderr %q; want 3", code, stderr)
	}
}

// TestMixFile runs the example scenario file from the README.
func TestMixFile(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	up := websocket.FastHTTPUpgrader{}
	url := serve(t, func(ctx *fasthttp.RequestCtx) {
		p := string(ctx.Path())
		key := "read"
		switch {
		case strings.HasSuffix(p, "/ws"):
			key = "ws"
		case strings.HasSuffix(p, "/incr"):
			key = "incr"
		}
		mu.Lock()
		seen[string(ctx.Method())+" "+key]++
		mu.Unlock()
		if strings.HasSuffix(p, "/ws") {
			_ = up.Upgrade(ctx, func(c *websocket.Conn) {
				defer c.Close()
				for {
					typ, msg, err := c.ReadMessage()
					if err != nil || c.WriteMessage(typ, msg) != nil {
						return
					}
				}
			})
		}
	})
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "r.json")
	code, stdout, stderr := runArgs("-url", url, "-mix", "testdata/mix.json", "-requests", "500", "-c", "4", "-quiet", "-seed", "7", "-json", jsonPath)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, row := range []string{"read", "incr", "watch", "all"} {
		if !strings.Contains(stdout, row) {
			t.Errorf("table lacks row %q:\n%s", row, stdout)
		}
	}
	if seen["GET read"] < 400 || seen["POST incr"] == 0 || seen["GET ws"] == 0 || len(seen) != 3 {
		t.Errorf("target saw %v; want mostly GET read, some POST incr and websocket handshakes", seen)
	}
}

// TestHelpListsEveryFlagWithItsDefault: -h documents every flag, with its
// default even when it is zero, false or empty.
func TestHelpListsEveryFlagWithItsDefault(t *testing.T) {
	code, stdout, stderr := runArgs("-h")
	if code != exitOK || stderr != "" {
		t.Fatalf("-h: exit %d, stderr %q; want 0 and the usage on stdout", code, stderr)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := 0
	for _, line := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(line, "  -") {
			n++
		}
	}
	for _, name := range []string{"url", "path", "rate", "ramp", "step", "c", "engine", "loops", "coalesce", "max-workers", "duration", "requests", "warmup",
		"scenario", "mix", "body-size", "body-file", "method", "H", "dist", "keys", "zipf-s", "id-prefix", "run-id", "seed", "timeout",
		"conn-wait", "drain", "max-latency", "insecure", "cacert", "label", "json", "plot", "hgrm", "trace-out", "quiet", "max-errors", "version"} {
		i := strings.Index(stdout, "\n  -"+name+" ")
		if i < 0 {
			i = strings.Index(stdout, "\n  -"+name+"\n")
		}
		if i < 0 {
			t.Errorf("-h does not list -%s", name)
			continue
		}
		rest := stdout[i+1:]
		if j := strings.Index(rest[1:], "\n  -"); j >= 0 {
			rest = rest[:j+1]
		}
		if !strings.Contains(rest, "default ") {
			t.Errorf("-h lists -%s without its default:\n%s", name, rest)
		}
	}
	if n != 39 {
		t.Errorf("-h lists %d flags; the test knows 39: update one of them", n)
	}
	if !strings.Contains(stdout, "-max-errors percent|off (no variable, default 1%)") || !strings.Contains(stdout, "-requests int (no variable, default 0)") {
		t.Errorf("-h does not show the error budget and the request bound's defaults:\n%s", stdout)
	}
	code, stdout, stderr = runArgs("plot", "-h")
	if code != exitOK || stderr != "" || !strings.Contains(stdout, "-o file (default \"\")") || !strings.Contains(stdout, "-title string (default \"\")") {
		t.Errorf("plot -h: exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	if code, stdout, stderr = runArgs("plot", "-o"); code != exitUsage || stdout != "" || !strings.Contains(stderr, "Usage: loadgen plot") {
		t.Errorf("plot -o without a value: exit %d, stdout %q, stderr %q; want 2 and the usage on stderr", code, stdout, stderr)
	}
}

// TestRateSchedules: a ramp and steps reach the target as scheduled (the
// duration defaults to the schedule's length) and are echoed in the report.
func TestRateSchedules(t *testing.T) {
	url := serve(t, func(ctx *fasthttp.RequestCtx) {})
	dir := t.TempDir()
	for _, tc := range []struct {
		args   []string
		sent   int64
		stages int
	}{
		{[]string{"-rate", "100:300", "-ramp", "1s"}, 200, 1},
		{[]string{"-rate", "100,200,300", "-step", "400ms"}, 240, 3},
		{[]string{"-rate", "100,200", "-step", "500ms", "-duration", "1500ms"}, 250, 2}, // the last rate holds
	} {
		out := filepath.Join(dir, "r.json")
		code, _, stderr := runArgs(append([]string{"-url", url, "-quiet", "-json", out}, tc.args...)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d: %s", tc.args, code, stderr)
		}
		rep := readReport(t, out)
		if d := rep.Requests.Sent - tc.sent; d < -1 || d > 1 || len(rep.Config.Stages) != tc.stages || rep.Config.Mode != "open" {
			t.Errorf("%v: sent %d, stages %+v; want %d (±1) requests over %d stages", tc.args, rep.Requests.Sent, rep.Config.Stages, tc.sent, tc.stages)
		}
	}
	for _, bad := range [][]string{{"-rate", "1:2"}, {"-rate", "1,2"}, {"-rate", "10", "-ramp", "1s"}, {"-rate", "1:x", "-ramp", "1s"}, {"-rate", "1,2", "-step", "1s", "-ramp", "1s"}} {
		if code, _, _ := runArgs(append([]string{"-url", url}, bad...)...); code != exitUsage {
			t.Errorf("%v: exit %d; want 2", bad, code)
		}
	}
}

// TestBodyAndHeadersFromFiles: -body-file and -H @file put the file's
// contents on the wire, {id} substituted.
func TestBodyAndHeadersFromFiles(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	url := serve(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		seen[fmt.Sprintf("%s %s %s|%s|%s", ctx.Method(), ctx.Path(), ctx.PostBody(), ctx.Request.Header.Peek("X-A"), ctx.Request.Header.Peek("X-B"))]++
		mu.Unlock()
	})
	dir := t.TempDir()
	body, hdrs := filepath.Join(dir, "body.json"), filepath.Join(dir, "headers.txt")
	_ = os.WriteFile(body, []byte(`{"id":"{id}"}`), 0o600)
	_ = os.WriteFile(hdrs, []byte("# comment\nX-A: one\r\n\nX-B:two\n"), 0o600)
	code, _, stderr := runArgs("-url", url, "-path", "/k/{id}", "-method", "PUT", "-body-file", body, "-H", "@"+hdrs,
		"-keys", "1", "-id-prefix", "z", "-requests", "5", "-quiet")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[`PUT /k/z0 {"id":"z0"}|one|two`] != 5 || len(seen) != 1 {
		t.Errorf("target saw %v; want 5 × PUT /k/z0 with the templated body and both headers", seen)
	}
	if code, _, stderr := runArgs("-url", url, "-H", "@"+filepath.Join(dir, "none")); code != exitUsage || !strings.Contains(stderr, "none") {
		t.Errorf("missing header file: exit %d %q", code, stderr)
	}
	if code, _, stderr := runArgs("-url", url, "-scenario", "get", "-body-file", body); code != exitUsage || !strings.Contains(stderr, "for post") {
		t.Errorf("-body-file with -scenario get: exit %d %q", code, stderr)
	}
}

// TestHgrmAndTLSFlags: -hgrm writes the distribution; -insecure and -cacert
// reach an https target.
func TestHgrmAndTLSFlags(t *testing.T) {
	certPEM, keyPEM := tlstest.SelfSigned(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("tls") }, Logger: quiet{}}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.ServeTLSEmbed(ln, certPEM, keyPEM) })
	t.Cleanup(func() { _ = ln.Close(); _ = srv.Shutdown(); wg.Wait() })
	url := "https://" + ln.Addr().String()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	_ = os.WriteFile(ca, certPEM, 0o600)
	hgrm := filepath.Join(dir, "lat.hgrm")
	for _, extra := range [][]string{{"-insecure"}, {"-cacert", ca, "-hgrm", hgrm}} {
		code, stdout, stderr := runArgs(append([]string{"-url", url, "-requests", "10", "-c", "2", "-quiet"}, extra...)...)
		if code != exitOK || !strings.Contains(stdout, "200×10") || !strings.Contains(stdout, "fasthttp engine") {
			t.Errorf("%v: exit %d %s\n%s", extra, code, stderr, stdout)
		}
	}
	if code, _, stderr := runArgs("-url", url, "-requests", "3", "-quiet"); code != exitErrorRate || !strings.Contains(stderr, "no request succeeded") {
		t.Errorf("self-signed without -insecure: exit %d %q; want 1", code, stderr)
	}
	b, err := os.ReadFile(hgrm)
	if err != nil || !bytes.HasPrefix(b, []byte("       Value     Percentile TotalCount 1/(1-Percentile)")) || !bytes.Contains(b, []byte("Total count    =           10]")) {
		t.Errorf(".hgrm file: %v\n%s", err, b)
	}
}

func readReport(t *testing.T, path string) *loadgen.Report {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := loadgen.ReadReport(f)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
