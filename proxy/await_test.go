package proxy_test

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// syscallCountingConn counts the read syscalls made on a worker connection:
// its Read does what net.Conn.Read does (read; on EAGAIN wait and read
// again) through the connection's RawConn, one count per read(2).
type syscallCountingConn struct {
	*net.TCPConn
	raw   syscall.RawConn
	reads *atomic.Int64
}

func (c *syscallCountingConn) Read(p []byte) (int, error) {
	var n int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		c.reads.Add(1)
		n, rerr = syscall.Read(int(fd), p)
		if errors.Is(rerr, syscall.EINTR) {
			return false
		}
		return !errors.Is(rerr, syscall.EAGAIN)
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// SyscallConn exposes the real descriptor, as a *net.TCPConn does.
func (c *syscallCountingConn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }

// tcpRig is a worker, the proxy and a client on 127.0.0.1 TCP sockets.
type tcpRig struct {
	p      *proxy.Proxy
	client *fasthttp.HostClient
	reads  atomic.Int64 // read syscalls on worker connections
	close  func()
}

func newTCPRig(tb testing.TB, body []byte, count bool) *tcpRig {
	tb.Helper()
	r := &tcpRig{}
	wln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	worker := &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { ctx.SetBody(body) },
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		StreamRequestBody:     true,
	}
	dial := func(addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil || !count {
			return c, err
		}
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			c.Close()
			return nil, err
		}
		return &syscallCountingConn{TCPConn: c.(*net.TCPConn), raw: raw, reads: &r.reads}, nil
	}
	res := proxytest.NewStatic()
	res.PlaceNamespace("/counter", &proxy.Session{ID: "sess", Secret: "secret", AdvertiseURL: "http://" + wln.Addr().String()})
	r.p, err = proxy.New(proxy.Config{Resolver: res, Logger: slog.New(slog.DiscardHandler), Endpoint: proxy.EndpointConfig{Dial: dial}})
	if err != nil {
		tb.Fatal(err)
	}
	fln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	front := r.p.NewServer()
	wdone, fdone := make(chan struct{}), make(chan struct{})
	go func() { _ = worker.Serve(wln); close(wdone) }()
	go func() { _ = front.Serve(fln); close(fdone) }()
	r.client = &fasthttp.HostClient{Addr: fln.Addr().String(), MaxConns: 16, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	r.close = func() {
		r.client.CloseIdleConnections()
		// The listeners are closed too, in case Shutdown runs before Serve
		// registered them.
		_ = fln.Close()
		_ = front.Shutdown()
		<-fdone
		_ = r.p.Close()
		_ = wln.Close()
		_ = worker.Shutdown()
		<-wdone
	}
	return r
}

// TestAwaitSavesARead: a request sent whole to a worker over TCP is
// answered with one read syscall on the worker connection, not the two a
// read right after the write costs (EAGAIN, wait, read); and both kinds of
// request body still arrive intact.
func TestAwaitSavesARead(t *testing.T) {
	r := newTCPRig(t, []byte(`{"count":1}`), true)
	defer r.close()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	do := func(method, body string) {
		t.Helper()
		req.Reset()
		req.SetRequestURI("http://" + r.client.Addr + "/counter/alice/")
		req.Header.SetMethod(method)
		if body != "" {
			req.SetBodyString(body)
		}
		if err := r.client.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != 200 || string(resp.Body()) != `{"count":1}` {
			t.Fatalf("%s: %d %q", method, resp.StatusCode(), resp.Body())
		}
	}
	do("GET", "") // dial and warm up
	const n = 300
	r.reads.Store(0)
	for range n {
		do("GET", "")
	}
	// One read per response; a few spurious wake-ups are tolerated. Reading
	// right after the write costs about 2n.
	if got := r.reads.Load(); got > n+n/5 {
		t.Errorf("%d read syscalls on the worker connection for %d GETs; want about %d (one per response)", got, n, n)
	}
	r.reads.Store(0)
	for range n {
		do("POST", `{"by":1}`) // a replayable body: sent whole, then awaited
	}
	if got := r.reads.Load(); got > n+n/5 {
		t.Errorf("%d read syscalls for %d POSTs; want about %d", got, n, n)
	}
	// A streamed body takes the ordinary path and still arrives.
	req.Reset()
	req.SetRequestURI("http://" + r.client.Addr + "/counter/alice/")
	req.Header.SetMethod("POST")
	req.SetBodyStream(strings.NewReader(strings.Repeat("x", 64<<10)), -1)
	if err := r.client.Do(req, resp); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("chunked POST: %v %d", err, resp.StatusCode())
	}
}
