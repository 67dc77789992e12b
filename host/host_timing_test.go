package host

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// benchObj is a minimal object: what the benchmarks measure is the host.
type benchObj struct{ n int }

func benchType(torn *atomic.Int64) Type[*benchObj] {
	r := NewRoutes[*benchObj]()
	r.GET("/", func(o *benchObj, c *Ctx) error {
		o.n++
		c.RequestCtx().SetBodyString("ok")
		return nil
	})
	r.GET("/items/{item}", func(o *benchObj, c *Ctx) error {
		c.RequestCtx().SetBody(c.ParamBytes("item"))
		return nil
	})
	r.Concurrent().GET("/c", func(o *benchObj, c *Ctx) error {
		c.RequestCtx().SetBodyString("ok")
		return nil
	})
	typ := Type[*benchObj]{
		New:    func(*Instance) (*benchObj, error) { return &benchObj{}, nil },
		Routes: r,
	}
	if torn != nil {
		typ.Teardown = func(*benchObj) { torn.Add(1) }
	}
	return typ
}

func newBenchHost(tb testing.TB, cfg Config, torn *atomic.Int64) *Host {
	tb.Helper()
	cfg.Namespace = "/b"
	cfg.Logger = slog.New(slog.DiscardHandler)
	h, err := New(cfg, benchType(torn))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := h.Close(context.Background()); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return h
}

// requestCtx returns a reusable request context for method and uri.
// Init stamps the request time as fasthttp's server does, so the duration
// histogram is updated as in production.
func requestCtx(method, uri string, hdr ...string) *fasthttp.RequestCtx {
	var req fasthttp.Request
	req.SetRequestURI(uri)
	req.Header.SetMethod(method)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rc := &fasthttp.RequestCtx{}
	rc.Init(&req, nil, nil)
	return rc
}

// serveOnce runs one request through handler and checks the status.
func serveOnce(tb testing.TB, handler fasthttp.RequestHandler, rc *fasthttp.RequestCtx, want int) {
	rc.Response.Reset()
	handler(rc)
	if got := rc.Response.StatusCode(); got != want {
		tb.Fatalf("%s %s = %d %s; want %d", rc.Method(), rc.RequestURI(), got, rc.Response.Body(), want)
	}
}

// allocWorker is a Worker whose Admit does not allocate.
type allocWorker struct {
	lease context.Context
}

func (w *allocWorker) Attach(Attached) (func(), error) { return func() {}, nil }
func (w *allocWorker) Admit(secret, session []byte) (context.Context, string) {
	if string(secret) != "s" {
		return nil, wire.ReasonForbidden
	}
	return w.lease, ""
}
func (w *allocWorker) Draining() bool { return false }
func (w *allocWorker) Release(ctx context.Context, ns, id string, epoch uint64) error {
	return nil
}
func (w *allocWorker) LeaseLength() time.Duration { return 0 }

func BenchmarkDispatchGET(b *testing.B) {
	h := newBenchHost(b, Config{}, nil)
	rc := requestCtx("GET", "/b/alice/")
	serveOnce(b, h.Handler, rc, 200)
	b.ReportAllocs()
	for b.Loop() {
		rc.Response.Reset()
		h.Handler(rc)
	}
}

func BenchmarkDispatchGETParam(b *testing.B) {
	h := newBenchHost(b, Config{}, nil)
	rc := requestCtx("GET", "/b/alice/items/42")
	serveOnce(b, h.Handler, rc, 200)
	b.ReportAllocs()
	for b.Loop() {
		rc.Response.Reset()
		h.Handler(rc)
	}
}

func BenchmarkDispatchGETFleet(b *testing.B) {
	lease, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := newBenchHost(b, Config{Worker: &allocWorker{lease: lease}}, nil)
	rc := requestCtx("GET", "/b/alice/", wire.HeaderProxySecret, "s")
	serveOnce(b, h.Handler, rc, 200)
	b.ReportAllocs()
	for b.Loop() {
		rc.Response.Reset()
		h.Handler(rc)
	}
}

// BenchmarkDispatchGETRouter mounts with Register: the router's catch-all
// copy is the only difference from BenchmarkDispatchGET.
func BenchmarkDispatchGETRouter(b *testing.B) {
	h := newBenchHost(b, Config{}, nil)
	r := router.New()
	h.Register(r)
	rc := requestCtx("GET", "/b/alice/")
	serveOnce(b, r.Handler, rc, 200)
	b.ReportAllocs()
	for b.Loop() {
		rc.Response.Reset()
		r.Handler(rc)
	}
}

// BenchmarkDispatchGETParallel: every goroutine hits its own instance
// (1024 ids in total), as a busy host would see.
func BenchmarkDispatchGETParallel(b *testing.B) {
	h := newBenchHost(b, Config{}, nil)
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		rc := requestCtx("GET", "/b/id"+strconv.FormatInt(next.Add(1)%1024, 10)+"/")
		for pb.Next() {
			rc.Response.Reset()
			h.Handler(rc)
		}
	})
}

// BenchmarkDispatchGETOneInstanceParallel: every goroutine hits the same
// instance; non-concurrent handlers take turns.
func BenchmarkDispatchGETOneInstanceParallel(b *testing.B) {
	for _, path := range []string{"/b/hot/", "/b/hot/c"} {
		b.Run(path, func(b *testing.B) {
			h := newBenchHost(b, Config{}, nil)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				rc := requestCtx("GET", path)
				for pb.Next() {
					rc.Response.Reset()
					h.Handler(rc)
				}
			})
		})
	}
}

// BenchmarkActivationTeardown: one op is the activation of a new id (setup
// included) plus, in batches, its idle close (closer goroutine, teardown,
// directory removal).
func BenchmarkActivationTeardown(b *testing.B) {
	var torn atomic.Int64
	h := newBenchHost(b, Config{IdleTimeout: -1}, &torn)
	const batch = 1000
	rc := requestCtx("GET", "/b/x/")
	uri := make([]byte, 0, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		uri = strconv.AppendInt(append(uri[:0], "/b/i"...), int64(i), 10)
		uri = append(uri, '/')
		rc.Request.SetRequestURIBytes(uri)
		serveOnce(b, h.Handler, rc, 200)
		i++
		if i%batch == 0 {
			h.CloseIdle(EvictIdle)
			for torn.Load() < int64(i) || h.Len() > 0 {
				runtime.Gosched()
			}
		}
	}
}

// BenchmarkIdleInstanceMemory reports the heap bytes per idle instance
// (the host's overhead: the object here is empty) at 10 000 and 100 000
// instances. Run it with -benchtime=1x.
func BenchmarkIdleInstanceMemory(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				perInstance := idleInstanceMemory(b, n)
				b.StartTimer()
				b.ReportMetric(perInstance, "B/instance")
			}
		})
	}
}

type emptyObj struct{}

func idleInstanceMemory(b *testing.B, n int) float64 {
	r := NewRoutes[*emptyObj]()
	r.GET("/", func(*emptyObj, *Ctx) error { return nil })
	h, err := New(Config{Namespace: "/m", MaxInstances: n + 1, Logger: slog.New(slog.DiscardHandler)},
		Type[*emptyObj]{New: func(*Instance) (*emptyObj, error) { return &emptyObj{}, nil }, Routes: r})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(context.Background())
	rc := requestCtx("GET", "/m/x/")
	// Warm the pools and maps with one instance.
	serveOnce(b, h.Handler, rc, 200)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	activateIdle(h, rc, n)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if h.Len() != n+1 {
		b.Fatalf("Len() = %d; want %d", h.Len(), n+1)
	}
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// BenchmarkSweep: one idle sweep that evicts nothing, with 0 and 10 000
// busy instances. Busy instances are not on the idle lists, so the cost is
// the same: one lock per shard.
func BenchmarkSweep(b *testing.B) {
	for _, busy := range []int{0, 10_000} {
		b.Run("busy="+strconv.Itoa(busy), func(b *testing.B) {
			h := newBenchHost(b, Config{MaxInstances: busy + 1}, nil)
			rc := requestCtx("GET", "/b/x/")
			uri := make([]byte, 0, 64)
			var held []*Instance
			for i := range busy {
				uri = fmt.Appendf(uri[:0], "/b/busy-%d/", i)
				rc.Request.SetRequestURIBytes(uri)
				serveOnce(b, h.Handler, rc, 200)
				inst := h.instance(fmt.Sprintf("busy-%d", i))
				sh := &h.shards[inst.shard]
				sh.mu.Lock()
				sh.hold(inst) // as an in-flight request would
				sh.mu.Unlock()
				held = append(held, inst)
			}
			b.ReportAllocs()
			for b.Loop() {
				h.sweep()
			}
			b.StopTimer()
			for _, inst := range held {
				h.release(inst)
			}
		})
	}
}

// BenchmarkRoutingFieldsParse: what the fields a proxy adds cost a worker's
// fasthttp to parse, against the same GET without them: the pinboard's
// three (session, proxy secret, epoch) and the three X-Forwarded-* fields
// every reverse proxy sends. The difference between the sub-benchmarks is
// the per-request price of the fields, before any use of them.
func BenchmarkRoutingFieldsParse(b *testing.B) {
	const base = "GET /counter/k42/ HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: loadgen\r\nAccept: */*\r\n"
	pinned := wire.HeaderSession + ": 0f3c9a7e5b1d4c2a\r\n" +
		wire.HeaderProxySecret + ": 6b1e0c5d9f2a4e8b7c3d1a0f9e8d7c6b\r\n" +
		wire.HeaderEpoch + ": 1796306226218094\r\n"
	forwarded := "X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: 127.0.0.1:8080\r\n"
	for _, c := range []struct{ name, head string }{
		{"none", base + "\r\n"},
		{"pinned", base + pinned + "\r\n"},
		{"forwarded", base + forwarded + "\r\n"},
		{"both", base + pinned + forwarded + "\r\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			raw := []byte(c.head)
			rd := bytes.NewReader(raw)
			br := bufio.NewReaderSize(rd, 4096)
			var h fasthttp.RequestHeader
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(raw)
				br.Reset(rd)
				h.Reset()
				if err := h.Read(br); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCloseIdleMany: closing 200 000 idle instances at once (a worker's
// shutdown), per instance: CloseIdle, then every teardown. Run it with
// -benchtime=1x.
func BenchmarkCloseIdleMany(b *testing.B) {
	b.Run("teardown=0", func(b *testing.B) { benchCloseIdleMany(b, 0) })
	// A teardown of 10 µs: what a close costs a fleet-mode worker
	// (docs/scale.md, S8), so that the closes take seconds.
	b.Run("teardown=10µs", func(b *testing.B) { benchCloseIdleMany(b, 10*time.Microsecond) })
}

func benchCloseIdleMany(b *testing.B, spin time.Duration) {
	const n = 200_000
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		r := NewRoutes[*emptyObj]()
		r.GET("/", func(*emptyObj, *Ctx) error { return nil })
		var torn atomic.Int64
		h, err := New(Config{Namespace: "/m", MaxInstances: n, Logger: slog.New(slog.DiscardHandler)},
			Type[*emptyObj]{New: func(*Instance) (*emptyObj, error) { return &emptyObj{}, nil }, Routes: r,
				Teardown: func(*emptyObj) {
					for t0 := time.Now(); time.Since(t0) < spin; {
					}
					torn.Add(1)
				}})
		if err != nil {
			b.Fatal(err)
		}
		activateIdle(h, requestCtx("GET", "/m/x/"), n)
		runtime.GC()
		b.StartTimer()
		start := time.Now()
		stopProbe, wakeMax := wakeProbe(b)
		h.CloseIdle(EvictIdle)
		if err := h.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/n, "ns/instance")
		stopProbe()
		b.ReportMetric(float64(wakeMax().Microseconds())/1000, "wake-max-ms")
		if torn.Load() != n {
			b.Fatalf("%d teardowns; want %d", torn.Load(), n)
		}
	}
}

// wakeProbe measures, while it runs, how long a goroutine that the network
// poller makes runnable waits for a CPU: a writer sends a byte over a
// loopback TCP connection every millisecond and a reader, blocked in Read
// as a worker's heartbeat or challenge handler waits for its socket,
// notes how late each arrives. It returns how to stop it and the largest
// wait.
func wakeProbe(b *testing.B) (stop func(), worst func() time.Duration) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	r, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	var sent atomic.Int64
	var late time.Duration
	done, readerDone, writerDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() { // reader: stops when w closes
		defer close(readerDone)
		buf := make([]byte, 1)
		for {
			if _, err := r.Read(buf); err != nil {
				return
			}
			late = max(late, time.Duration(time.Now().UnixNano()-sent.Load()))
		}
	}()
	go func() { // writer
		defer close(writerDone)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sent.Store(time.Now().UnixNano())
				if _, err := w.Write([]byte{1}); err != nil {
					return
				}
			}
		}
	}()
	return func() {
			close(done)
			<-writerDone
			w.Close()
			<-readerDone
			r.Close()
		}, func() time.Duration {
			return late
		}
}

// activateIdle activates n instances of h's namespace /m (ids id-0000000,
// id-0000001, ...) with GETs through rc, which leaves them idle.
func activateIdle(h *Host, rc *fasthttp.RequestCtx, n int) {
	uri := make([]byte, 0, 64)
	for i := range n {
		uri = fmt.Appendf(uri[:0], "/m/id-%07d/", i)
		rc.Request.SetRequestURIBytes(uri)
		rc.Response.Reset()
		h.Handler(rc)
	}
}
