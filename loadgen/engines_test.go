package loadgen

import (
	"bufio"
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

// bothEngines runs f for each engine that can run on this platform, each
// against real sockets.
func bothEngines(t *testing.T, f func(t *testing.T, eng Engine)) {
	engines := []Engine{EngineFastHTTP}
	if loopEngineSupported {
		engines = append(engines, EngineLoop)
	}
	for _, eng := range engines {
		t.Run(string(eng), func(t *testing.T) { f(t, eng) })
	}
}

// runOn runs cfg with the engine forced and checks it ran.
func runOn(t *testing.T, eng Engine, cfg Config) *Report {
	t.Helper()
	cfg.Engine = eng
	rep := run(t, cfg)
	if rep.Generator.Engine != eng {
		t.Fatalf("report says engine %q; want %q", rep.Generator.Engine, eng)
	}
	return rep
}

// TestEnginesSendTheSameRequests: both engines put the same templated
// requests on the wire and count the same results.
func TestEnginesSendTheSameRequests(t *testing.T) {
	bothEngines(t, func(t *testing.T, eng Engine) {
		var (
			mu     sync.Mutex
			seen   = map[string]int{}
			agents = map[string]int{}
		)
		url := startTCPTarget(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			mu.Lock()
			seen[fmt.Sprintf("%s %s %s %s", ctx.Method(), ctx.Request.Header.RequestURI(), ctx.Request.Header.Peek("X-Bench"), ctx.PostBody())]++
			agents[string(ctx.UserAgent())]++
			mu.Unlock()
			ctx.SetBodyString("ok")
		}})
		rep := runOn(t, eng, Config{URL: url, Requests: 200, Duration: Unbounded, Connections: 4,
			IDs:     IDConfig{Keys: 2, Prefix: "k"},
			Headers: []Header{{"X-Bench", "1"}},
			Scenarios: []Scenario{
				{Name: "get", Path: "/c/{id}/a/../{id}"},
				{Name: "put", Kind: KindPost, Method: "PUT", Path: "/c/{id}", Body: `{"id":"{id}"}`},
			}})
		if rep.Requests.Sent != 200 || rep.Errors.Total != 0 || rep.Statuses["200"] != 200 || rep.Bytes.Received != 400 {
			t.Fatalf("sent %d errors %+v statuses %v received %d; want 200 OK with 2-byte bodies", rep.Requests.Sent, rep.Errors, rep.Statuses, rep.Bytes.Received)
		}
		mu.Lock()
		defer mu.Unlock()
		want := map[string]bool{
			"GET /c/k0/a/../k0 1 ": true, "GET /c/k1/a/../k1 1 ": true,
			`PUT /c/k0 1 {"id":"k0"}`: true, `PUT /c/k1 1 {"id":"k1"}`: true,
		}
		n := 0
		for k, c := range seen {
			if !want[k] {
				t.Errorf("target saw %q ×%d; want only %v", k, c, want)
			}
			n += c
		}
		if n != 200 || len(seen) != 4 || agents[""] != 200 {
			t.Errorf("target saw %v with user agents %v; want 200 requests over the 4 templated ones, no User-Agent", seen, agents)
		}
		if put := rep.Scenarios[1]; rep.Bytes.Sent != put.Sent*int64(len(`{"id":"k0"}`)) {
			t.Errorf("bytes sent %d; want %d (the PUT bodies)", rep.Bytes.Sent, put.Sent*11)
		}
	})
}

func TestEnginesClassifyStatuses(t *testing.T) {
	bothEngines(t, func(t *testing.T, eng Engine) {
		var n atomic.Int64
		url := startTCPTarget(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			switch n.Add(1) % 3 {
			case 1:
				ctx.Error("full", 503)
				ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonCapacity)
			case 2:
				ctx.SetStatusCode(404)
			}
		}})
		rep := runOn(t, eng, Config{URL: url, Requests: 90, Duration: Unbounded, Connections: 1})
		e := rep.Errors
		if e.Total != 60 || e.Status["503"] != 30 || e.Status["404"] != 30 || e.Reason[wire.ReasonCapacity] != 30 || len(e.Reason) != 1 {
			t.Errorf("errors %+v; want 503×30 with reason capacity, 404×30", e)
		}
		if rep.Latency.Count != 90 || rep.Statuses["200"] != 30 {
			t.Errorf("latency count %d statuses %v; want every response timed, 200×30", rep.Latency.Count, rep.Statuses)
		}
	})
}

// TestEnginesReadWholeBodies: fixed-length and chunked bodies, large and
// small, are read to their end and counted; a response that asks to close
// the connection is a success and the next request gets a new one.
func TestEnginesReadWholeBodies(t *testing.T) {
	const size = 3<<20 + 123
	bothEngines(t, func(t *testing.T, eng Engine) {
		var conns atomic.Int64
		srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			var g genReader
			g.reset(size)
			switch {
			case strings.HasSuffix(string(ctx.Path()), "/chunked"):
				ctx.SetBodyStream(&g, -1)
			case strings.HasSuffix(string(ctx.Path()), "/mb"):
				g.reset(1 << 20)
				ctx.SetBodyStream(&g, 1<<20)
			case strings.HasSuffix(string(ctx.Path()), "/close"):
				ctx.SetConnectionClose()
				ctx.SetBodyString("bye")
			default:
				ctx.SetBodyStream(&g, size)
			}
		}, ConnState: func(_ net.Conn, s fasthttp.ConnState) {
			if s == fasthttp.StateNew {
				conns.Add(1)
			}
		}}
		url := startTCPTarget(t, srv)
		for _, path := range []string{"/blob/{id}", "/blob/{id}/chunked"} {
			rep := runOn(t, eng, Config{URL: url, Requests: 6, Duration: Unbounded, Connections: 2,
				Scenarios: []Scenario{{Kind: KindDownload, Path: path}}})
			if rep.Errors.Total != 0 || rep.Bytes.Received != 6*size || rep.Statuses["200"] != 6 {
				t.Errorf("%s: errors %+v, received %d; want none and %d", path, rep.Errors, rep.Bytes.Received, 6*size)
			}
		}
		// Large bodies on plain GETs in the open loop: read whole, never left
		// waiting in the socket buffer for the next slot. The slots are
		// 500 ms apart, so a body finished only at the next slot takes at
		// least that; one read at once takes a few milliseconds (tens under
		// -race on a busy machine), hence the bound just under a slot.
		rep := runOn(t, eng, Config{URL: url, Rate: 2, Requests: 6, Duration: Unbounded, Path: "/blob/{id}/mb"})
		if rep.Errors.Total != 0 || rep.Bytes.Received != 6<<20 || rep.Service == nil || rep.Service.P50 > 450_000 {
			t.Errorf("open-loop GETs of 1 MiB: errors %+v, received %d, service %+v; want all read, each before the next slot (500 ms)", rep.Errors, rep.Bytes.Received, rep.Service)
		}
		before := conns.Load()
		rep = runOn(t, eng, Config{URL: url, Requests: 20, Duration: Unbounded, Connections: 1, Path: "/x/{id}/close"})
		if rep.Errors.Total != 0 || rep.Statuses["200"] != 20 || rep.Bytes.Received != 60 {
			t.Errorf("Connection: close responses: errors %+v statuses %v received %d; want 20 successes", rep.Errors, rep.Statuses, rep.Bytes.Received)
		}
		if n := conns.Load() - before; n != 20 {
			t.Errorf("%d connections for 20 requests answered with Connection: close; want 20", n)
		}
	})
}

// rawTarget accepts connections on 127.0.0.1 and hands each to serve.
func rawTarget(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				serve(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// readRequest reads one request head from c (the requests here have no body).
func readRequest(r *bufio.Reader) error {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if line == "\r\n" {
			return nil
		}
	}
}

// TestEnginesNeverCountBrokenResponsesAsSuccesses: a target that closes
// connections (before, during or instead of a response), or answers with
// a malformed or truncated response, yields errors, never a success or a
// latency, in the closed and in the open loop.
func TestEnginesNeverCountBrokenResponsesAsSuccesses(t *testing.T) {
	behaviours := map[string]func(c net.Conn, r *bufio.Reader){
		"close at once":    func(net.Conn, *bufio.Reader) {},
		"close after read": func(_ net.Conn, r *bufio.Reader) { _ = readRequest(r) },
		"truncated head": func(c net.Conn, r *bufio.Reader) {
			_ = readRequest(r)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le")
		},
		"truncated body": func(c net.Conn, r *bufio.Reader) {
			_ = readRequest(r)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
		},
		"unterminated chunks": func(c net.Conn, r *bufio.Reader) {
			_ = readRequest(r)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		},
		"garbage": func(c net.Conn, r *bufio.Reader) {
			_ = readRequest(r)
			_, _ = io.WriteString(c, "HTTP/1.1 OK 200\r\n\r\n")
		},
	}
	bothEngines(t, func(t *testing.T, eng Engine) {
		for name, behave := range behaviours {
			url := rawTarget(t, func(c net.Conn) { behave(c, bufio.NewReader(c)) })
			for _, cfg := range []Config{
				{URL: url, Requests: 40, Duration: Unbounded, Connections: 4},
				{URL: url, Rate: 400, Requests: 40, Duration: Unbounded, Connections: 4},
			} {
				cfg.Timeout = 2 * time.Second
				rep := runOn(t, eng, cfg)
				if rep.Requests.Sent != 40 || rep.Errors.Total != 40 || rep.Latency.Count != 0 || rep.ErrorRate != 1 || len(rep.Statuses) != 0 {
					t.Errorf("%s, %s loop: sent %d, errors %+v, %d latencies, statuses %v; want 40 errors and nothing else",
						name, rep.Config.Mode, rep.Requests.Sent, rep.Errors, rep.Latency.Count, rep.Statuses)
				}
				if rep.Errors.Timeout != 0 {
					t.Errorf("%s, %s loop: %d timeouts; want the failure seen when the connection closes", name, rep.Config.Mode, rep.Errors.Timeout)
				}
			}
		}
	})
}

func TestEnginesTimeout(t *testing.T) {
	bothEngines(t, func(t *testing.T, eng Engine) {
		release := make(chan struct{})
		url := rawTarget(t, func(c net.Conn) {
			_ = readRequest(bufio.NewReader(c))
			<-release
		})
		defer close(release)
		start := time.Now()
		rep := runOn(t, eng, Config{URL: url, Requests: 3, Duration: Unbounded, Connections: 3, Timeout: 100 * time.Millisecond})
		if rep.Errors.Timeout != 3 || rep.Errors.Total != 3 || rep.Latency.Count != 0 {
			t.Errorf("errors %+v latencies %d; want 3 timeouts", rep.Errors, rep.Latency.Count)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("3 parallel requests timing out after 100ms took %v", el)
		}
	})
}

func TestEnginesConnectionRefused(t *testing.T) {
	bothEngines(t, func(t *testing.T, eng Engine) {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		for _, cfg := range []Config{
			{URL: "http://" + addr, Requests: 5, Duration: Unbounded, Connections: 1},
			{URL: "http://" + addr, Rate: 1000, Requests: 5, Duration: Unbounded, Connections: 1},
		} {
			rep := runOn(t, eng, cfg)
			if rep.Requests.Sent != 5 || rep.Errors.Connect != 5 || rep.Errors.Total != 5 || rep.Latency.Count != 0 {
				t.Errorf("%s loop: sent %d errors %+v latencies %d; want 5 connect errors", rep.Config.Mode, rep.Requests.Sent, rep.Errors, rep.Latency.Count)
			}
			if s := rep.Errors.Samples["connect"]; !strings.Contains(s, "refused") {
				t.Errorf("connect sample %q; want it to say refused", s)
			}
		}
	})
}

// TestCoalesceTradesLagForWakeUps: with Coalesce the loop engine sends
// slots late on purpose, up to the window, and the report says so.
func TestCoalesceTradesLagForWakeUps(t *testing.T) {
	if !loopEngineSupported {
		t.Skip("the loop engine needs Linux")
	}
	url := startTCPTarget(t, &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {}})
	rep := runOn(t, EngineLoop, Config{URL: url, Rate: 1000, Requests: 500, Duration: Unbounded, Coalesce: 5 * time.Millisecond})
	l := rep.ScheduleLag
	// Slots due 1ms apart go out together 5ms after the first of them:
	// their lags spread over 0..5ms, half of them at least 2ms.
	if rep.Errors.Total != 0 || l == nil || l.P50 < 1500 || l.P90 < 3500 || rep.Config.CoalesceUs != 5000 {
		t.Errorf("errors %+v, schedule lag %+v, coalesce %dµs; want lags spread over the 5ms window", rep.Errors, l, rep.Config.CoalesceUs)
	}
	if rep.Latency.P50 < l.P50 {
		t.Errorf("latency p50 %dµs below the lag p50 %dµs: latency must count from the intended time", rep.Latency.P50, l.P50)
	}
}
