package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/internal/wire"
	"github.com/pinned-go/pinned/loadgen"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
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
	f("scheme must be http", "-url", "https://127.0.0.1:1")
	f("-max-workers applies to the open loop only", "-url", "http://127.0.0.1:1", "-max-workers", "3")
	f("cannot read scenario file", "-url", "http://127.0.0.1:1", "-mix", filepath.Join(dir, "missing.json"))
	f(`kind "gett"`, "-url", "http://127.0.0.1:1", "-mix", badMix)
	f("-mix replaces", "-url", "http://127.0.0.1:1", "-mix", badMix, "-body-size", "3")
	f(`unexpected argument "extra"`, "-url", "http://127.0.0.1:1", "extra")
}

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
	if !strings.Contains(stdout, "stopped by requests") || !strings.Contains(stdout, "p99.9") {
		t.Errorf("table:\n%s", stdout)
	}
	f, err := os.Open(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := loadgen.ReadReport(f)
	if err != nil {
		t.Fatal(err)
	}
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
	if b, _ := os.ReadFile(out); bytes.Count(b, []byte("<polyline")) != 2 {
		t.Errorf("combined plot has %d curves; want 2", bytes.Count(b, []byte("<polyline")))
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
	if rep["targetRate"] != 500.0 || rep["stoppedBy"] != "duration" {
		t.Errorf("targetRate %v stoppedBy %v", rep["targetRate"], rep["stoppedBy"])
	}
	if !strings.Contains(stderr, "latency (from intended send time)") {
		t.Errorf("stderr lacks the table:\n%s", stderr)
	}
}

func TestMaxErrorRateExit1(t *testing.T) {
	url := serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.Error("full", 503)
		ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonCapacity)
	})
	args := []string{"-url", url, "-requests", "20", "-quiet"}
	if code, stdout, _ := runArgs(args...); code != exitOK || !strings.Contains(stdout, "reason capacity×20") {
		t.Errorf("without -max-error-rate: exit %d; want 0 and the reasons in the table:\n%s", code, stdout)
	}
	if code, _, stderr := runArgs(append(args, "-max-error-rate", "0.5")...); code != exitErrorRate || !strings.Contains(stderr, "exceeds -max-error-rate") {
		t.Errorf("with -max-error-rate 0.5: exit %d, stderr %q; want 1", code, stderr)
	}
}

func TestInterruptExit3(t *testing.T) {
	url := serve(t, func(ctx *fasthttp.RequestCtx) {})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var o, e bytes.Buffer
	if code := run(ctx, []string{"-url", url, "-rate", "100", "-duration", "10s", "-quiet"}, &o, &e); code != exitRun {
		t.Errorf("cancelled run: exit %d; want 3; stderr %q", code, e.String())
	}
	if !strings.Contains(o.String(), "stopped by canceled") {
		t.Errorf("table:\n%s", o.String())
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
