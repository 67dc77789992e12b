package loadgen

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

func run(t testing.TB, cfg Config) *Report {
	t.Helper()
	rep, err := mustNew(t, cfg).Run(context.Background())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return rep
}

// TestGetSendsTemplatedPathsAndNoExtras checks what reaches the target: the
// path with the id substituted, not normalised, no default User-Agent, the
// configured headers.
func TestGetSendsTemplatedPathsAndNoExtras(t *testing.T) {
	var (
		mu     sync.Mutex
		paths  = map[string]int{}
		agents = map[string]int{}
		extra  = map[string]int{}
	)
	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		paths[string(ctx.Request.Header.RequestURI())]++
		agents[string(ctx.UserAgent())]++
		extra[string(ctx.Request.Header.Peek("X-Bench"))]++
		mu.Unlock()
		ctx.SetBodyString("ok")
	})
	cfg := tg.config()
	cfg.Path = "/counter/{id}/a/../{id}"
	cfg.Requests, cfg.Duration, cfg.Connections = 200, Unbounded, 4
	cfg.IDs = IDConfig{Keys: 3, Prefix: "k"}
	cfg.Headers = []Header{{"X-Bench", "1"}}
	rep := run(t, cfg)
	if rep.Requests.Sent != 200 || rep.Errors.Total != 0 || rep.Statuses["200"] != 200 {
		t.Fatalf("sent %d errors %+v statuses %v; want 200 OK", rep.Requests.Sent, rep.Errors, rep.Statuses)
	}
	if rep.Bytes.Received != 400 {
		t.Errorf("bytes received %d; want 400 (2-byte bodies)", rep.Bytes.Received)
	}
	for _, k := range []string{"k0", "k1", "k2"} {
		if p := "/counter/" + k + "/a/../" + k; paths[p] == 0 {
			t.Errorf("path %q never requested; got %v", p, paths)
		}
	}
	if len(paths) != 3 {
		t.Errorf("paths %v; want exactly the 3 templated paths", paths)
	}
	if agents[""] != 200 || extra["1"] != 200 {
		t.Errorf("user agents %v, X-Bench %v; want none and 1 on every request", agents, extra)
	}
}

func TestStatusAndReasonClassification(t *testing.T) {
	var n atomic.Int64
	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) {
		switch n.Add(1) % 3 {
		case 0:
			ctx.SetStatusCode(200)
		case 1:
			ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonCapacity)
			ctx.SetStatusCode(503)
		case 2:
			ctx.SetStatusCode(404)
		}
	})
	cfg := tg.config()
	cfg.Requests, cfg.Duration, cfg.Connections = 90, Unbounded, 1
	rep := run(t, cfg)
	e := rep.Errors
	if e.Total != 60 || e.Status["503"] != 30 || e.Status["404"] != 30 || len(e.Status) != 2 {
		t.Errorf("errors %+v; want 60: 503×30, 404×30", e)
	}
	if e.Reason[wire.ReasonCapacity] != 30 || len(e.Reason) != 1 {
		t.Errorf("reasons %v; want capacity×30 (404s carry no reason)", e.Reason)
	}
	if rep.Statuses["200"] != 30 || rep.Latency.Count != 90 {
		t.Errorf("statuses %v, latency count %d; want 200×30 and a latency for all 90 responses", rep.Statuses, rep.Latency.Count)
	}
	if rep.ErrorRate < 0.66 || rep.ErrorRate > 0.67 {
		t.Errorf("error rate %v; want 2/3", rep.ErrorRate)
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rep := run(t, Config{URL: "http://" + addr, Requests: 5, Duration: Unbounded, Connections: 1})
	if rep.Errors.Connect != 5 || rep.Errors.Total != 5 || rep.Latency.Count != 0 {
		t.Fatalf("errors %+v latency count %d; want 5 connect errors and no latency", rep.Errors, rep.Latency.Count)
	}
	if s := rep.Errors.Samples["connect"]; !strings.Contains(s, "refused") {
		t.Errorf("connect sample %q; want it to say refused", s)
	}
}

func TestTimeoutAndPoolExhaustion(t *testing.T) {
	release := make(chan struct{})
	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) { <-release })
	t.Cleanup(func() { close(release) }) // runs before the target's cleanup

	cfg := tg.config()
	cfg.Requests, cfg.Duration, cfg.Connections = 3, Unbounded, 1
	cfg.Timeout = 50 * time.Millisecond
	rep := run(t, cfg)
	if rep.Errors.Timeout != 3 || rep.Errors.Total != 3 {
		t.Errorf("errors %+v; want 3 timeouts", rep.Errors)
	}

	// Open loop: 5 slots due within 4ms, 2 workers, 1 connection. Whichever
	// worker gets the connection holds it for the whole Timeout; the other
	// fails each remaining slot after ConnWaitTimeout.
	cfg = tg.config()
	cfg.Rate, cfg.Requests, cfg.Duration = 1000, 5, Unbounded
	cfg.Connections, cfg.MaxWorkers = 1, 2
	cfg.Timeout, cfg.ConnWaitTimeout = time.Second, 20*time.Millisecond
	rep = run(t, cfg)
	if rep.Errors.Pool != 4 || rep.Errors.Timeout != 1 {
		t.Errorf("errors %+v; want 4 pool (no free connection) and 1 timeout", rep.Errors)
	}
}

// TestStreamedDownloadCountsBytes: large bodies, fixed-length and chunked,
// are read to the end and counted, not buffered.
func TestStreamedDownloadCountsBytes(t *testing.T) {
	const size = 3<<20 + 123
	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) {
		var g genReader
		g.reset(size)
		if strings.HasSuffix(string(ctx.Path()), "/chunked") {
			ctx.SetBodyStream(&g, -1)
		} else {
			ctx.SetBodyStream(&g, size)
		}
	})
	for _, path := range []string{"/blob/{id}", "/blob/{id}/chunked"} {
		cfg := tg.config()
		cfg.Requests, cfg.Duration, cfg.Connections = 6, Unbounded, 2
		cfg.Scenarios = []Scenario{{Kind: KindDownload, Path: path}}
		rep := run(t, cfg)
		if rep.Errors.Total != 0 || rep.Bytes.Received != 6*size || rep.Scenarios[0].Bytes.Received != 6*size {
			t.Errorf("%s: errors %+v, received %d; want 0 and %d", path, rep.Errors, rep.Bytes.Received, 6*size)
		}
	}
}

func TestStreamedUploadCountsBytes(t *testing.T) {
	const size = 5<<20 + 7 // above fasthttp's default 4 MiB body limit: streamed on both ends
	var got atomic.Int64
	srv := &fasthttp.Server{StreamRequestBody: true, Handler: func(ctx *fasthttp.RequestCtx) {
		n, err := io.Copy(io.Discard, ctx.RequestBodyStream())
		if err != nil || n != size {
			ctx.Error("short body", 400)
			return
		}
		got.Add(n)
	}}
	url := startTCPTarget(t, srv)
	rep := run(t, Config{URL: url, Requests: 4, Duration: Unbounded, Connections: 2,
		Scenarios: []Scenario{{Kind: KindUpload, Path: "/up/{id}", BodySize: size}}})
	if rep.Errors.Total != 0 || rep.Bytes.Sent != 4*size || got.Load() != 4*size {
		t.Fatalf("errors %+v, sent %d, target got %d; want 0, %d, %d", rep.Errors, rep.Bytes.Sent, got.Load(), 4*size, 4*size)
	}
}

func TestSmallPostSendsBody(t *testing.T) {
	var bodies sync.Map
	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) {
		bodies.Store(string(ctx.Method())+" "+string(ctx.PostBody()), true)
	})
	cfg := tg.config()
	cfg.Requests, cfg.Duration, cfg.Connections, cfg.IDs.Seed = 40, Unbounded, 1, 1 // one worker, fixed seed: deterministic picks
	cfg.Scenarios = []Scenario{{Kind: KindPost, BodySize: 10}, {Kind: KindPost, Name: "put", Method: "PUT", BodySize: 3}}
	rep := run(t, cfg)
	if rep.Errors.Total != 0 || rep.Requests.Sent != 40 {
		t.Fatalf("errors %+v sent %d", rep.Errors, rep.Requests.Sent)
	}
	if _, ok := bodies.Load("POST abcdefghij"); !ok {
		t.Error(`target never saw "POST abcdefghij"`)
	}
	if _, ok := bodies.Load("PUT abc"); !ok {
		t.Error(`target never saw "PUT abc"`)
	}
	if want := rep.Scenarios[0].Sent*10 + rep.Scenarios[1].Sent*3; rep.Bytes.Sent != want {
		t.Errorf("bytes sent %d; want %d", rep.Bytes.Sent, want)
	}
}

// TestBoundsOnRealTarget: the duration bound and the count bound each stop
// a run against a real 127.0.0.1 listener, in both loops.
func TestBoundsOnRealTarget(t *testing.T) {
	url := startTCPTarget(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {}})
	f := func(name string, cfg Config, check func(*Report) string) {
		t.Run(name, func(t *testing.T) {
			cfg.URL = url
			start := time.Now()
			rep := run(t, cfg)
			if msg := check(rep); msg != "" {
				t.Error(msg)
			}
			if el := time.Since(start); el > 5*time.Second {
				t.Errorf("run took %v", el)
			}
			if rep.Errors.Total != 0 {
				t.Errorf("errors %+v", rep.Errors)
			}
		})
	}
	// The last response may arrive just before the duration ends: a
	// completion is the kernel's receive time, not the loop's.
	f("closed duration", Config{Duration: 200 * time.Millisecond, Requests: Unbounded, Connections: 4}, func(r *Report) string {
		if r.StoppedBy != StopDuration || r.ElapsedSeconds < 0.19 || r.ElapsedSeconds > 1 || r.Requests.Sent == 0 {
			return "stopped by " + r.StoppedBy + " after " + time.Duration(r.ElapsedSeconds*1e9).String()
		}
		return ""
	})
	f("closed requests", Config{Duration: time.Minute, Requests: 321, Connections: 4}, func(r *Report) string {
		if r.StoppedBy != StopRequests || r.Requests.Sent != 321 {
			return "stopped by " + r.StoppedBy
		}
		return ""
	})
	f("open duration", Config{Rate: 200, Duration: 250 * time.Millisecond, Requests: Unbounded}, func(r *Report) string {
		// The achieved rate is only loosely checked: a scheduling hiccup of
		// the test machine delays the last sends.
		if r.StoppedBy != StopDuration || r.Requests.Sent != 50 || r.AchievedRate <= 0 || r.AchievedRate > 201 {
			return fmt.Sprintf("stopped by %s, sent %d at %.1f/s; want duration, 50 at ≈200/s", r.StoppedBy, r.Requests.Sent, r.AchievedRate)
		}
		return ""
	})
	f("open requests", Config{Rate: 1000, Duration: time.Minute, Requests: 100}, func(r *Report) string {
		if r.StoppedBy != StopRequests || r.Requests.Sent != 100 {
			return "stopped by " + r.StoppedBy
		}
		return ""
	})
}

// TestReportRedactsHeaderValues: a credential passed as a header reaches
// the target but not the shared report.
func TestReportRedactsHeaderValues(t *testing.T) {
	var got atomic.Value
	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) { got.Store(string(ctx.Request.Header.Peek("Authorization"))) })
	cfg := tg.config()
	cfg.Requests = 3
	cfg.Scenarios = []Scenario{{Headers: map[string]string{"Authorization": "Bearer s3cret"}}}
	rep := run(t, cfg)
	if got.Load() != "Bearer s3cret" {
		t.Fatalf("target got Authorization %q", got.Load())
	}
	var buf strings.Builder
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "s3cret") || !strings.Contains(buf.String(), `"Authorization": "(redacted)"`) {
		t.Errorf("report leaks or drops the header:\n%s", buf.String())
	}
}
