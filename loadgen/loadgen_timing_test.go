package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/pinned-go/pinned/clock"
)

// The generator's own cost per request, without a target: scheduler,
// queue, worker, id, scenario pick, timing and recording. b.N requests per
// run; ns/op is the generator's overhead per request.

func benchRun(b *testing.B, cfg Config) {
	cfg.URL = "http://127.0.0.1:1"
	cfg.Requests, cfg.Duration = int64(b.N), Unbounded
	r := mustNew(b, cfg)
	withExec(r, func(_ []byte, o *outcome) { o.status = 200 })
	b.ReportAllocs()
	b.ResetTimer()
	rep, err := r.Run(context.Background())
	b.StopTimer()
	if err != nil || rep.Requests.Sent != int64(b.N) {
		b.Fatalf("sent %d of %d: %v", rep.Requests.Sent, b.N, err)
	}
}

// BenchmarkOpenLoopOverhead runs the open loop at its maximum rate, so the
// schedule is always due and workers never wait: the per-slot cost of
// releasing, queueing, taking and recording a slot.
func BenchmarkOpenLoopOverhead(b *testing.B) {
	benchRun(b, Config{Rate: MaxRate, Connections: 2})
}

func BenchmarkClosedLoopOverhead(b *testing.B) {
	benchRun(b, Config{Connections: 2})
}

func BenchmarkClosedLoopOverheadMix(b *testing.B) {
	benchRun(b, Config{Connections: 2, IDs: IDConfig{Dist: DistZipf},
		Scenarios: []Scenario{{Name: "a", Weight: 3}, {Name: "b", Kind: KindPost}, {Name: "c"}}})
}

func BenchmarkRecord(b *testing.B) {
	st := newStats(1, DefaultMaxLatency.Microseconds(), nil, clock.Instant{})
	o := &outcome{status: 200, recv: 100}
	var now clock.Instant
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		st.record(0, time.Duration(100+i%5000)*time.Microsecond, o, now)
	}
}

func BenchmarkIDs(b *testing.B) {
	for _, ic := range []IDConfig{{Dist: DistUniform}, {Dist: DistZipf, ZipfS: 0.99}, {Dist: DistZipf, ZipfS: 1.1}, {Dist: DistNew}} {
		name := string(ic.Dist)
		if ic.ZipfS != 0 {
			name = fmt.Sprintf("%s-s%g", name, ic.ZipfS)
		}
		b.Run(name, func(b *testing.B) {
			if err := ic.withDefaults(); err != nil {
				b.Fatal(err)
			}
			src := newIDSource(ic, "run")
			rng := rand.New(rand.NewPCG(1, 2))
			buf := make([]byte, 0, 64)
			b.ReportAllocs()
			for b.Loop() {
				buf = src.appendID(buf[:0], rng)
			}
		})
	}
}

// inmemoryTarget serves a tiny response on an in-memory listener, for the
// HTTP client benchmarks.
func inmemoryTarget(b *testing.B) (*fasthttp.HostClient, func()) {
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"count":1}`) }}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	hc := &fasthttp.HostClient{Addr: "target.test", Dial: func(string) (net.Conn, error) { return ln.Dial() },
		NoDefaultUserAgentHeader: true, DisablePathNormalizing: true, MaxIdemponentCallAttempts: 1}
	return hc, func() { _ = srv.Shutdown(); <-done }
}

// BenchmarkHostClientDo is the baseline: a bare fasthttp request loop
// against an in-memory server (server cost included).
func BenchmarkHostClientDo(b *testing.B) {
	hc, stop := inmemoryTarget(b)
	defer stop()
	var req fasthttp.Request
	var resp fasthttp.Response
	req.SetRequestURI("http://target.test/counter/id1/")
	b.ReportAllocs()
	for b.Loop() {
		if err := hc.Do(&req, &resp); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHTTPExecGet is loadgen's GET path on the same target: the
// difference from BenchmarkHostClientDo is the generator's HTTP overhead.
func BenchmarkHTTPExecGet(b *testing.B) {
	hc, stop := inmemoryTarget(b)
	defer stop()
	e := newHTTPExec(hc, "http://target.test", &Scenario{Kind: KindGet, Method: "GET", Path: "/counter/{id}/"}, nil)
	st := newStats(1, DefaultMaxLatency.Microseconds(), nil, clock.Instant{})
	id := []byte("id1")
	b.ReportAllocs()
	for b.Loop() {
		var o outcome
		e.exec(id, &o)
		if o.err != nil || o.status != 200 {
			b.Fatal(o.err, o.status)
		}
		st.record(0, time.Millisecond, &o, clock.Instant{})
	}
}
