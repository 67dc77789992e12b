package proxy_test

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// inmem is a worker and a proxy on in-memory listeners, and clients for
// both: the hot path without the kernel.
type inmem struct {
	worker, front *fasthttputil.InmemoryListener
	workerSrv     *fasthttp.Server
	frontSrv      *fasthttp.Server
	p             *proxy.Proxy
	direct, via   *fasthttp.HostClient
	done          chan struct{}
}

func newInmem(tb testing.TB, body []byte) *inmem {
	tb.Helper()
	m := &inmem{
		worker: fasthttputil.NewInmemoryListener(),
		front:  fasthttputil.NewInmemoryListener(),
		done:   make(chan struct{}),
	}
	m.workerSrv = &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { ctx.SetBody(body) },
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		StreamRequestBody:     true,
	}
	res := proxytest.NewStatic()
	res.PlaceNamespace("/counter", &proxy.Session{ID: "sess", Secret: "secret", AdvertiseURL: "http://worker:1"})
	var err error
	m.p, err = proxy.New(proxy.Config{Resolver: res, Logger: slog.New(slog.DiscardHandler), Endpoint: proxy.EndpointConfig{
		Dial: func(string, time.Duration) (net.Conn, error) { return m.worker.Dial() },
	}})
	if err != nil {
		tb.Fatal(err)
	}
	m.frontSrv = m.p.NewServer()
	go func() { _ = m.workerSrv.Serve(m.worker) }()
	go func() { _ = m.frontSrv.Serve(m.front); close(m.done) }()
	dial := func(ln *fasthttputil.InmemoryListener) fasthttp.DialFunc {
		return func(string) (net.Conn, error) { return ln.Dial() }
	}
	m.direct = &fasthttp.HostClient{Addr: "worker", Dial: dial(m.worker), MaxConns: 1024}
	m.via = &fasthttp.HostClient{Addr: "front", Dial: dial(m.front), MaxConns: 1024}
	return m
}

func (m *inmem) close() {
	m.direct.CloseIdleConnections()
	m.via.CloseIdleConnections()
	_ = m.frontSrv.Shutdown()
	<-m.done
	_ = m.p.Close()
	_ = m.workerSrv.Shutdown()
}

// get sends one GET for uri with c and checks the answer.
func get(tb testing.TB, c *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, want int) {
	if err := c.Do(req, resp); err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode() != 200 || len(resp.Body()) != want {
		tb.Fatalf("status %d, %d bytes", resp.StatusCode(), len(resp.Body()))
	}
}

func benchPath(b *testing.B, m *inmem, c *fasthttp.HostClient, size int) {
	b.ReportAllocs()
	var id atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://front/counter/id" + strconv.FormatInt(id.Add(1), 10) + "/incr")
		for pb.Next() {
			get(b, c, req, resp, size)
		}
	})
}

// BenchmarkProxy is the full hot path: client → proxy (head scan, route,
// resolve, field hygiene, forward) → worker → proxy → client, over
// in-memory listeners. BenchmarkDirect is the same client and worker
// without the proxy; the difference is the proxy's cost. Allocations are
// the whole process's: client, proxy and worker.
func BenchmarkProxy(b *testing.B) {
	for _, size := range []int{16, 64 << 10} {
		b.Run("body="+strconv.Itoa(size), func(b *testing.B) {
			m := newInmem(b, make([]byte, size))
			defer m.close()
			benchPath(b, m, m.via, size)
		})
	}
}

func BenchmarkDirect(b *testing.B) {
	for _, size := range []int{16, 64 << 10} {
		b.Run("body="+strconv.Itoa(size), func(b *testing.B) {
			m := newInmem(b, make([]byte, size))
			defer m.close()
			benchPath(b, m, m.direct, size)
		})
	}
}

// BenchmarkProxyStream: a 1 MiB body, streamed through the proxy.
func BenchmarkProxyStream(b *testing.B) {
	const size = 1 << 20
	m := newInmem(b, make([]byte, size))
	defer m.close()
	b.SetBytes(size)
	b.ReportAllocs()
	c := &fasthttp.HostClient{Addr: "front", Dial: func(string) (net.Conn, error) { return m.front.Dial() },
		StreamResponseBody: true}
	defer c.CloseIdleConnections()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://front/counter/big/x")
	buf := make([]byte, 64<<10)
	for b.Loop() {
		if err := c.Do(req, resp); err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, resp.BodyStream(), buf)
		if err != nil || n != size {
			b.Fatal(n, err)
		}
		_ = resp.CloseBodyStream()
	}
}

// BenchmarkLoopUpload: a 1 MiB request body through an event loop over
// 127.0.0.1 to a worker that discards it, spliced (the default) or, with
// SpliceMin -1, handed over to the fasthttp engine, which copies it.
// Allocations are the whole process's: client, proxy and worker.
func BenchmarkLoopUpload(b *testing.B) {
	const size = 1 << 20
	for _, splice := range []bool{true, false} {
		b.Run("splice="+strconv.FormatBool(splice), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 64<<10)
			srv := &fasthttp.Server{
				Handler: func(ctx *fasthttp.RequestCtx) {
					if rs := ctx.RequestBodyStream(); rs != nil {
						_, _ = io.CopyBuffer(io.Discard, rs, buf)
					}
				},
				StreamRequestBody: true, NoDefaultServerHeader: true, NoDefaultContentType: true,
				Concurrency: 1, // one connection, one request at a time: buf is the handler's alone
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = srv.Serve(ln) }()
			defer func() { _ = srv.Shutdown(); <-done }()
			res := proxytest.NewStatic()
			res.PlaceNamespace("/counter", &proxy.Session{ID: "s", Secret: "k", AdvertiseURL: "http://" + ln.Addr().String()})
			f := startProxy(b, loopEngine, res, func(c *proxy.Config) {
				c.Logger = slog.New(slog.DiscardHandler)
				if !splice {
					c.SpliceMin = -1
				}
			})
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			msg := append([]byte("POST /counter/up/x HTTP/1.1\r\nHost: h\r\nContent-Length: "+strconv.Itoa(size)+"\r\n\r\n"), make([]byte, size)...)
			var resp fasthttp.Response
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
					b.Fatal(resp.StatusCode(), err)
				}
			}
		})
	}
}
