package proxy_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp's process-wide helpers: the Date refresher and the
		// idle-connection cleaner of a HostClient, which sleeps out its
		// MaxIdleConnDuration before it notices the pool is empty.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		// The worker pool's cleaner of a stopped server sleeps out its idle
		// period; the default dialer of the test clients keeps a DNS cleaner.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
	)
}

// worker is a fasthttp server on 127.0.0.1 standing in for a worker process.
type worker struct {
	t        *testing.T
	addr     string
	srv      *fasthttp.Server
	accepted atomic.Int64 // connections accepted
	bytesIn  atomic.Int64 // bytes read from all connections
	mu       sync.Mutex
	seen     []seenRequest // every request the handler ran for
}

// seenRequest is what a worker received.
type seenRequest struct {
	method, uri, proto string
	raw                string // raw header block
	headers            map[string][]string
	body               []byte
}

func (s seenRequest) get(name string) string {
	if v := s.headers[strings.ToLower(name)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// startWorker serves h on 127.0.0.1 and records every request. h may be nil
// (answer 200 "ok").
func startWorker(t *testing.T, h fasthttp.RequestHandler) *worker {
	t.Helper()
	return startWorkerWith(t, h, nil)
}

// startWorkerWith is startWorker with a hook on the server's settings.
func startWorkerWith(t *testing.T, h fasthttp.RequestHandler, mutate func(*fasthttp.Server)) *worker {
	t.Helper()
	w := &worker{t: t}
	if h == nil {
		h = func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }
	}
	w.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			s := seenRequest{
				method:  string(ctx.Method()),
				uri:     string(ctx.RequestURI()),
				proto:   string(ctx.Request.Header.Protocol()),
				raw:     string(ctx.Request.Header.RawHeaders()),
				headers: map[string][]string{},
			}
			for k, v := range ctx.Request.Header.All() {
				key := strings.ToLower(string(k))
				s.headers[key] = append(s.headers[key], string(v))
			}
			if !ctx.Request.IsBodyStream() {
				s.body = append([]byte(nil), ctx.Request.Body()...)
			}
			w.mu.Lock()
			w.seen = append(w.seen, s)
			w.mu.Unlock()
			h(ctx)
		},
		StreamRequestBody: true,
		CloseOnShutdown:   true,
		IdleTimeout:       time.Minute,
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			if st == fasthttp.StateNew {
				w.accepted.Add(1)
			}
		},
	}
	if mutate != nil {
		mutate(w.srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.addr = ln.Addr().String()
	done := make(chan struct{})
	go func() { defer close(done); _ = w.srv.Serve(countingListener{ln, &w.bytesIn}) }()
	t.Cleanup(func() {
		_ = w.srv.Shutdown()
		<-done
	})
	return w
}

// serveRaw accepts connections on 127.0.0.1 and runs serve on each, on a
// goroutine of its own, which closes the connection after serve returns;
// it returns the address. When the test ends the listener closes and every
// serve must return.
func serveRaw(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
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
				serve(c, bufio.NewReader(c))
			})
		}
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// countingListener counts the bytes read from its connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingReadConn{c, l.n}, nil
}

type countingReadConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingReadConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// requests returns what the worker has seen so far.
func (w *worker) requests() []seenRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seenRequest(nil), w.seen...)
}

func (w *worker) last() seenRequest {
	w.t.Helper()
	r := w.requests()
	if len(r) == 0 {
		w.t.Fatal("worker saw no request")
	}
	return r[len(r)-1]
}

func (w *worker) url() string { return "http://" + w.addr }

// session is a worker session on w.
func (w *worker) session(id, secret string) *proxy.Session {
	return &proxy.Session{ID: id, Secret: secret, AdvertiseURL: w.url()}
}

// tWriter sends log lines to the test log.
type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// front is a proxy served on 127.0.0.1.
type front struct {
	p    *proxy.Proxy
	addr string
	srv  *fasthttp.Server
	fr   *proxy.Front // nil when the fasthttp server serves alone
}

// The proxy's engines, as startProxy's loops: one event loop in front of
// the fasthttp server (which serves what the loop hands over), or the
// fasthttp server alone. One loop, so that consecutive connections share
// its worker connections as they would share the fasthttp path's pool
// (tests that need several loops ask for them).
const (
	loopEngine     = 1
	fasthttpEngine = 0
)

// bothEngines runs test on each engine of the proxy, as subtests named
// "loops" and "fasthttp". Every test of the proxy's behaviour runs on both
// (an engine that does not serve a request hands it over, so a test of the
// fasthttp path's own requests covers that too); a test of one engine's
// mechanics names it.
func bothEngines(t *testing.T, test func(t *testing.T, loops int)) {
	t.Run("loops", func(t *testing.T) { test(t, loopEngine) })
	t.Run("fasthttp", func(t *testing.T) { test(t, fasthttpEngine) })
}

// startProxy serves a proxy for r on 127.0.0.1 on an engine: loops event
// loops in front of the fasthttp server, or (0) the fasthttp server alone.
func startProxy(t testing.TB, loops int, r proxy.Resolver, mutate func(*proxy.Config)) *front {
	t.Helper()
	cfg := proxy.Config{Resolver: r, Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil))}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := p.NewServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	if loops == 0 {
		go func() { defer close(done); _ = srv.Serve(ln) }()
		t.Cleanup(func() {
			_ = srv.Shutdown()
			<-done
			_ = p.Close()
		})
		return &front{p: p, addr: ln.Addr().String(), srv: srv}
	}
	fr, err := p.NewFront(proxy.FrontConfig{Loops: loops, Fallback: srv})
	if err != nil {
		t.Fatal(err)
	}
	go func() { defer close(done); _ = fr.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = fr.Shutdown(ctx)
		<-done
		_ = ln.Close()
		_ = p.Close()
	})
	return &front{p: p, addr: ln.Addr().String(), srv: srv, fr: fr}
}

// setup starts a worker with h, an endpoint on it placed for namespace
// "/counter", and a proxy in front on an engine (startProxy's loops).
func setup(t *testing.T, loops int, h fasthttp.RequestHandler) (*worker, *front, *proxytest.Static, *proxy.Session) {
	t.Helper()
	return setupWith(t, loops, h, nil)
}

// setupWith is setup with a hook on the proxy's Config.
func setupWith(t *testing.T, loops int, h fasthttp.RequestHandler, mutate func(*proxy.Config)) (*worker, *front, *proxytest.Static, *proxy.Session) {
	t.Helper()
	w := startWorker(t, h)
	res := proxytest.NewStatic()
	ep := w.session("sess-1", "secret-1")
	res.PlaceNamespace("/counter", ep)
	f := startProxy(t, loops, res, mutate)
	return w, f, res, ep
}

// raw sends req on a new connection and returns the bytes of the response,
// read as far as its framing says (to EOF for one delimited by close).
func raw(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rec := &recorder{r: c}
	var resp fasthttp.Response
	resp.SkipBody = strings.HasPrefix(req, "HEAD ")
	if err := resp.Read(bufio.NewReader(rec)); err != nil {
		// Not a well-formed response: return whatever arrived.
		rest := readAllQuiet(c, 200*time.Millisecond)
		return rec.b.String() + rest
	}
	return rec.b.String()
}

// recorder keeps a copy of what is read through it.
type recorder struct {
	r io.Reader
	b strings.Builder
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.b.Write(p[:n])
	return n, err
}

// closedAfter reports whether the peer closes c within d without sending
// anything more.
func closedAfter(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err := c.Read(b[:])
	return err == io.EOF
}

// readAllQuiet reads until EOF or until nothing arrives for quiet.
func readAllQuiet(c net.Conn, quiet time.Duration) string {
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		_ = c.SetReadDeadline(time.Now().Add(quiet))
		n, err := c.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// rawResponse sends req on c and parses one response.
func rawResponse(t *testing.T, c net.Conn, br *bufio.Reader, req string) *fasthttp.Response {
	t.Helper()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp := &fasthttp.Response{}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if err := resp.Read(br); err != nil {
		t.Fatalf("reading response to %q: %v", req, err)
	}
	return resp
}

// do sends one request through a fasthttp client and returns the response.
func do(t *testing.T, addr, method, uri string, body []byte, headers ...string) *fasthttp.Response {
	t.Helper()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + addr + uri)
	req.Header.SetMethod(method)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	if body != nil {
		req.SetBody(body)
	}
	resp := &fasthttp.Response{}
	c := &fasthttp.HostClient{Addr: addr, DisablePathNormalizing: true}
	defer c.CloseIdleConnections()
	if err := c.DoTimeout(req, resp, 5*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, uri, err)
	}
	return resp
}
