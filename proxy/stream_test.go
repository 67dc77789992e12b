package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// zeros is an io.Reader of n zero bytes.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

// heapPeak samples the heap in use until stop is called and returns the
// largest sample above the first.
func heapPeak() (stop func() uint64) {
	var base, peak runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	done := make(chan struct{})
	var max atomic.Uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				runtime.ReadMemStats(&peak)
				if peak.HeapInuse > base.HeapInuse && peak.HeapInuse-base.HeapInuse > max.Load() {
					max.Store(peak.HeapInuse - base.HeapInuse)
				}
			}
		}
	}()
	return func() uint64 { close(done); wg.Wait(); return max.Load() }
}

// 100 MiB go through the proxy each way, with either framing, while the
// heap (proxy, worker and clients together) stays within a few buffers.
func TestStream100MiB(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		size := int64(100 << 20)
		if testing.Short() {
			size = 10 << 20
		}
		_, f, _, _ := setupWith(t, loops, func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case "/counter/a/up":
				n, err := io.Copy(io.Discard, ctx.RequestBodyStream())
				if err != nil {
					ctx.Error(err.Error(), 500)
					return
				}
				ctx.SetBodyString(strconv.FormatInt(n, 10))
			case "/counter/a/down":
				ctx.SetBodyStream(&zeros{size}, int(size))
			case "/counter/a/down-chunked":
				ctx.SetBodyStream(&zeros{size}, -1)
			}
		}, func(c *proxy.Config) { c.MaxRequestBodySize = -1 })
		// Headroom for the runtime and test harness; a buffered body would need
		// the whole 100 MiB.
		const bound = 16 << 20

		upload := func(t *testing.T, chunked bool) {
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			bw := bufio.NewWriterSize(c, 64<<10)
			if chunked {
				fmt.Fprintf(bw, "POST /counter/a/up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
			} else {
				fmt.Fprintf(bw, "POST /counter/a/up HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n", size)
			}
			buf := make([]byte, 64<<10)
			for sent := int64(0); sent < size; sent += int64(len(buf)) {
				if chunked {
					fmt.Fprintf(bw, "%x\r\n", len(buf))
				}
				if _, err := bw.Write(buf); err != nil {
					t.Fatal(err)
				}
				if chunked {
					_, _ = bw.WriteString("\r\n")
				}
			}
			if chunked {
				_, _ = bw.WriteString("0\r\n\r\n")
			}
			if err := bw.Flush(); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			var resp fasthttp.Response
			if err := resp.Read(bufio.NewReader(c)); err != nil {
				t.Fatal(err)
			}
			if got := string(resp.Body()); resp.StatusCode() != 200 || got != strconv.FormatInt(size, 10) {
				t.Fatalf("upload: %d %q; want 200 %d", resp.StatusCode(), got, size)
			}
		}
		download := func(t *testing.T, path string) {
			hc := &fasthttp.HostClient{Addr: f.addr, StreamResponseBody: true, Dial: fasthttp.Dial}
			defer hc.CloseIdleConnections()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + f.addr + path)
			if err := hc.DoTimeout(req, resp, time.Minute); err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.BodyStream())
			if err != nil || n != size || resp.StatusCode() != 200 {
				t.Fatalf("download %s: %d bytes, %v, status %d; want %d", path, n, err, resp.StatusCode(), size)
			}
			_ = resp.CloseBodyStream()
		}

		for _, tc := range []struct {
			name string
			run  func(t *testing.T)
		}{
			{"up content-length", func(t *testing.T) { upload(t, false) }},
			{"up chunked", func(t *testing.T) { upload(t, true) }},
			{"down content-length", func(t *testing.T) { download(t, "/counter/a/down") }},
			{"down chunked", func(t *testing.T) { download(t, "/counter/a/down-chunked") }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				stop := heapPeak()
				tc.run(t)
				if peak := stop(); peak > bound {
					t.Errorf("heap grew by %d MiB streaming %d MiB; want < %d MiB", peak>>20, size>>20, bound>>20)
				} else {
					t.Logf("heap peak +%.1f MiB", float64(peak)/(1<<20))
				}
			})
		}
	})
}

// A client that stops reading a large response holds one worker connection
// and nothing else: other clients keep being served.
func TestSlowReaderDoesNotStallOthers(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			if strings.HasPrefix(string(ctx.Path()), "/counter/slow") {
				ctx.SetBodyStream(&zeros{64 << 20}, 64<<20)
				return
			}
			ctx.SetBodyString("fast")
		})
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.Endpoint.MaxConns = 16 })

		// Eight clients read the head of a 64 MiB response and stop.
		for i := 0; i < 8; i++ {
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "GET /counter/slow%d HTTP/1.1\r\nHost: h\r\n\r\n", i)
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
				t.Fatalf("slow client %d: %q %v", i, line, err)
			}
		}

		start := time.Now()
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hc := &fasthttp.HostClient{Addr: f.addr, Dial: fasthttp.Dial}
				defer hc.CloseIdleConnections()
				for j := 0; j < 25; j++ {
					code, body, err := hc.GetTimeout(nil, "http://"+f.addr+"/counter/fast"+strconv.Itoa(j), 5*time.Second)
					if err != nil || code != 200 || string(body) != "fast" {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := failed.Load(); n != 0 {
			t.Fatalf("%d fast requests failed while slow readers held streams", n)
		}
		t.Logf("100 fast requests beside 8 stalled streams in %v", time.Since(start))
	})
}

// A body known to exceed the limit is refused before any byte reaches the
// worker; a chunked one that grows past it is cut off with 413.
func TestRequestBodyLimit(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			_, err := io.Copy(io.Discard, ctx.RequestBodyStream())
			if err != nil {
				ctx.Error("broken body", 400)
			}
		})
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) { c.MaxRequestBodySize = 1000 })

		resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 2000\r\n\r\n"+strings.Repeat("x", 2000))
		if !strings.HasPrefix(resp, "HTTP/1.1 413") || !strings.Contains(resp, "Connection: close") {
			t.Errorf("known length: %q", resp)
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests; want 0", n)
		}
		body := strings.Repeat("600\r\n"+strings.Repeat("y", 0x600)+"\r\n", 2) + "0\r\n\r\n"
		resp = raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"+body)
		if !strings.HasPrefix(resp, "HTTP/1.1 413") || !strings.Contains(resp, "Connection: close") {
			t.Errorf("chunked: %q", resp)
		}
		// Within the limit, both go through.
		resp = raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n"+strings.Repeat("z", 1000)+"\r\n0\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Errorf("chunked at the limit: %q", resp)
		}
	})
}

// P5: deadlines bound stalls, not streams. A stream that keeps moving
// outlives HeaderTimeout, WriteTimeout and StreamIdleTimeout; one that
// stalls is cut after StreamIdleTimeout.
func TestStreamDeadlines(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		stall := make(chan struct{})
		defer close(stall)
		w := startWorker(t, func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case "/counter/a/trickle":
				ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
					for i := 0; i < 10; i++ {
						_, _ = bw.WriteString("tick\n")
						_ = bw.Flush()
						time.Sleep(60 * time.Millisecond)
					}
				})
			case "/counter/a/stall":
				ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
					_, _ = bw.WriteString("first\n")
					_ = bw.Flush()
					<-stall
				})
			case "/counter/a/up":
				n, err := io.Copy(io.Discard, ctx.RequestBodyStream())
				if err != nil {
					ctx.Error(err.Error(), 400)
					return
				}
				ctx.SetBodyString(strconv.FormatInt(n, 10))
			}
		})
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.HeaderTimeout = 200 * time.Millisecond
			c.WriteTimeout = 200 * time.Millisecond
			c.StreamIdleTimeout = 300 * time.Millisecond
		})

		start := time.Now()
		resp := raw(t, f.addr, "GET /counter/a/trickle HTTP/1.1\r\nHost: h\r\n\r\n")
		if strings.Count(resp, "tick\n") != 10 {
			t.Errorf("trickle stream cut after %v: %q", time.Since(start), resp)
		}

		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /counter/a/up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := 0; i < 8; i++ { // 8 × 60 ms: well past HeaderTimeout
			fmt.Fprintf(c, "4\r\ndata\r\n")
			time.Sleep(60 * time.Millisecond)
		}
		fmt.Fprintf(c, "0\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var r fasthttp.Response
		if err := r.Read(bufio.NewReader(c)); err != nil || string(r.Body()) != "32" {
			t.Errorf("slow upload: %q, %v", r.Body(), err)
		}

		start = time.Now()
		s, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		fmt.Fprintf(s, "GET /counter/a/stall HTTP/1.1\r\nHost: h\r\n\r\n")
		got := readAllQuiet(s, 5*time.Second)
		if el := time.Since(start); el > 3*time.Second || !strings.Contains(got, "first") {
			t.Errorf("stalled stream: closed after %v with %q; want the first line and a close after ~300ms", el, got)
		}
	})
}
