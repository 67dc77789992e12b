package host

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// fasthttp's own: the server date updater (process-wide, started
		// once) and the worker pool's cleaner, which notices a stopped
		// server only after its idle period.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}

// testTimeout bounds every wait in these tests.
const testTimeout = 10 * time.Second

// probe is the object type most tests use. Its fields are touched without
// locks by non-concurrent handlers: the race detector checks the turn
// guarantee in every test.
type probe struct {
	inst  *Instance
	env   *env
	nonce int64
	n     int
	steps int // stream generator steps taken
}

// env records what happens to the probes of one host.
type env struct {
	setups    atomic.Int64
	teardowns atomic.Int64
	nonces    atomic.Int64
	setupErr  func(id string) error // optional
	setupWait chan struct{}         // optional: setup blocks until closed
	torn      chan string           // ids torn down, in order
	block     chan struct{}         // /block waits for it (or the context)
	taskBlock chan struct{}         // /task's task waits for it (or the context)
	entered   chan string           // /block and /task report that they started
	tornMu    sync.Mutex
	tornIDs   map[string]int

	genStops        atomic.Int64 // generators that saw yield return false
	stopsAtTeardown atomic.Int64 // genStops when the last teardown ran
}

func newEnv() *env {
	return &env{
		torn:      make(chan string, 1024),
		block:     make(chan struct{}),
		taskBlock: make(chan struct{}),
		entered:   make(chan string, 1024),
		tornIDs:   map[string]int{},
	}
}

func (e *env) typ() Type[*probe] {
	r := NewRoutes[*probe]()
	r.GET("/", (*probe).get)
	r.POST("/incr", (*probe).incr)
	r.GET("/block", (*probe).blockHandler)
	r.POST("/task", (*probe).task)
	r.GET("/stream", (*probe).stream)
	r.GET("/panic", func(*probe, *Ctx) error { panic("boom") })
	r.GET("/fail", func(*probe, *Ctx) error { return errors.New("secret detail") })
	r.GET("/abort", func(p *probe, c *Ctx) error { p.inst.Abort(); return nil })
	r.POST("/stale", func(*probe, *Ctx) error { return fmt.Errorf("the store refused epoch: %w", ErrStale) })
	r.WebSocket("/ws", (*probe).ws)
	r.Concurrent().GET("/peek", func(p *probe, c *Ctx) error {
		var n int
		if err := p.inst.Do(func() { n = p.n }); err != nil {
			return err
		}
		return c.JSON(200, map[string]any{"n": n})
	})
	return Type[*probe]{
		New: func(inst *Instance) (*probe, error) {
			e.setups.Add(1)
			if e.setupWait != nil {
				<-e.setupWait
			}
			if e.setupErr != nil {
				if err := e.setupErr(inst.ID()); err != nil {
					return nil, err
				}
			}
			return &probe{inst: inst, env: e, nonce: e.nonces.Add(1)}, nil
		},
		Teardown: func(p *probe) {
			e.teardowns.Add(1)
			e.stopsAtTeardown.Store(e.genStops.Load())
			e.tornMu.Lock()
			e.tornIDs[p.inst.ID()]++
			e.tornMu.Unlock()
			e.torn <- p.inst.ID()
		},
		Routes: r,
	}
}

func (e *env) tornCount(id string) int {
	e.tornMu.Lock()
	defer e.tornMu.Unlock()
	return e.tornIDs[id]
}

// waitTorn waits for the teardown of id.
func (e *env) waitTorn(t *testing.T, id string) {
	t.Helper()
	timer := time.NewTimer(testTimeout)
	defer timer.Stop()
	for e.tornCount(id) == 0 {
		select {
		case <-e.torn: // something was torn down: check again
		case <-timer.C:
			t.Fatalf("no teardown of %q within %v", id, testTimeout)
		}
	}
}

// waitEntered waits until a /block or /task handler of id started.
func (e *env) waitEntered(t *testing.T, id string) {
	t.Helper()
	select {
	case got := <-e.entered:
		if got != id {
			t.Fatalf("entered %q; want %q", got, id)
		}
	case <-time.After(testTimeout):
		t.Fatalf("no handler of %q started within %v", id, testTimeout)
	}
}

func (p *probe) get(c *Ctx) error {
	return c.JSON(200, map[string]any{"id": c.ID(), "n": p.n, "nonce": p.nonce, "epoch": p.inst.Epoch()})
}

func (p *probe) incr(c *Ctx) error {
	p.n++ // unsynchronised on purpose: the turn protects it
	return c.JSON(200, map[string]any{"n": p.n})
}

func (p *probe) blockHandler(c *Ctx) error {
	p.env.entered <- c.ID()
	select {
	case <-p.env.block:
		return c.JSON(200, map[string]any{"ok": true})
	case <-c.Context().Done():
		return c.Context().Err()
	}
}

func (p *probe) task(c *Ctx) error {
	id := c.ID()
	err := p.inst.Go(func(ctx context.Context) error {
		p.env.entered <- id
		select {
		case <-p.env.taskBlock:
			return p.inst.Do(func() { p.n++ })
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		return err
	}
	c.RequestCtx().SetStatusCode(202)
	return nil
}

// stream yields n lines ("line <i> n=<p.n>\n"); n=0 means forever. Each
// step increments p.n and p.steps without locks.
func (p *probe) stream(c *Ctx) error {
	n, _ := strconv.Atoi(string(c.RequestCtx().QueryArgs().Peek("n")))
	size, _ := strconv.Atoi(string(c.RequestCtx().QueryArgs().Peek("size")))
	c.RequestCtx().SetContentType("text/plain")
	return c.Stream(func(yield func([]byte, error) bool) {
		var buf []byte
		for i := 0; n == 0 || i < n; i++ {
			p.n++
			p.steps++
			buf = fmt.Appendf(buf[:0], "line %d n=%d", i, p.n)
			for len(buf) < size {
				buf = append(buf, '.')
			}
			buf = append(buf, '\n')
			if !yield(buf, nil) {
				p.env.genStops.Add(1)
				return
			}
		}
	})
}

func (p *probe) ws(ws *WebSocket) error {
	for {
		mt, msg, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		if string(msg) == "count" {
			var n int
			if err := p.inst.Do(func() { n = p.n }); err != nil {
				return err
			}
			msg = []byte(strconv.Itoa(n))
		}
		if err := ws.WriteMessage(mt, msg); err != nil {
			return err
		}
	}
}

// testServer is a host served by a real fasthttp server on an in-memory
// listener, with a net/http client.
type testServer struct {
	t      *testing.T
	h      *Host
	ln     *fasthttputil.InmemoryListener
	srv    *fasthttp.Server
	client *http.Client
	tr     *http.Transport
	done   chan error
}

// quietLogger discards logs unless -v.
func quietLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(&testWriter{}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

type testWriter struct{}

func (testWriter) Write(p []byte) (int, error) { return len(p), nil }

// newTestHost builds a host of the probe type for cfg (Namespace defaults
// to /p) and serves it. Cleanup closes the server, the host and the client.
func newTestHost(t *testing.T, cfg Config, e *env) *testServer {
	t.Helper()
	if cfg.Namespace == "" {
		cfg.Namespace = "/p"
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	h, err := New(cfg, e.typ())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := h.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return serve(t, h, h.Handler)
}

func serve(t *testing.T, h *Host, handler fasthttp.RequestHandler) *testServer {
	t.Helper()
	ln := fasthttputil.NewInmemoryListener()
	ts := &testServer{
		t:    t,
		h:    h,
		ln:   ln,
		srv:  &fasthttp.Server{Handler: handler, Logger: discardLogger{}},
		done: make(chan error, 1),
	}
	ts.tr = &http.Transport{
		DialContext:         func(context.Context, string, string) (net.Conn, error) { return ln.Dial() },
		MaxIdleConnsPerHost: 100,
	}
	ts.client = &http.Client{Transport: ts.tr, Timeout: testTimeout}
	go func() { ts.done <- ts.srv.Serve(ln) }()
	t.Cleanup(ts.stop)
	return ts
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

func (ts *testServer) stop() {
	ts.tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	alreadyClosed := false
	if ts.h != nil {
		select {
		case <-ts.h.closedDone:
			alreadyClosed = true
		default:
		}
	}
	if ts.h != nil && !alreadyClosed {
		if err := ts.h.Close(ctx); err != nil {
			ts.t.Errorf("Host.Close: %v", err)
		}
	}
	if err := ts.srv.ShutdownWithContext(ctx); err != nil {
		ts.t.Errorf("server shutdown: %v", err)
	}
	<-ts.done
	ts.tr.CloseIdleConnections()
}

type response struct {
	status int
	header http.Header
	body   string
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(r.body), &m); err != nil {
		t.Fatalf("body %q is not JSON: %v", r.body, err)
	}
	return m
}

// do sends one request and reads the whole response.
func (ts *testServer) do(method, path string, hdr ...string) response {
	ts.t.Helper()
	req, err := http.NewRequest(method, "http://pinned.test"+path, nil)
	if err != nil {
		ts.t.Fatalf("NewRequest(%s %s): %v", method, path, err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		ts.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		ts.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// doErr is do for goroutines other than the test's: it returns errors.
func (ts *testServer) doErr(method, path string, hdr ...string) (response, error) {
	req, err := http.NewRequest(method, "http://pinned.test"+path, nil)
	if err != nil {
		return response{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

// expect asserts a status and returns the response.
// A 403 (and, in expect503, a 503) must also add one to
// pinned_rejections_total{reason}: every refusal the host makes is counted.
func (ts *testServer) expect(status int, method, path string, hdr ...string) response {
	ts.t.Helper()
	var before uint64
	if status == 403 {
		before = ts.rejections(wire.ReasonForbidden)
	}
	r := ts.do(method, path, hdr...)
	if r.status != status {
		ts.t.Fatalf("%s %s = %d %s; want %d", method, path, r.status, r.body, status)
	}
	if status == 403 {
		if after := ts.rejections(wire.ReasonForbidden); after != before+1 {
			ts.t.Errorf("%s %s: pinned_rejections_total{reason=forbidden} %d -> %d; want +1", method, path, before, after)
		}
	}
	return r
}

// rejections reads pinned_rejections_total{reason}.
func (ts *testServer) rejections(reason string) uint64 {
	i := rejectIndex(reason)
	if i < 0 {
		ts.t.Fatalf("no rejection counter for reason %q", reason)
	}
	return ts.h.met.rejections[i].Get()
}

// expect503 asserts a host 503 with Retry-After and the reason, counted in
// pinned_rejections_total{reason}.
func (ts *testServer) expect503(reason, method, path string, hdr ...string) {
	ts.t.Helper()
	before := ts.rejections(reason)
	r := ts.expect(503, method, path, hdr...)
	if after := ts.rejections(reason); after != before+1 {
		ts.t.Errorf("%s %s: pinned_rejections_total{reason=%s} %d -> %d; want +1", method, path, reason, before, after)
	}
	if got := r.header.Get("X-Pinned-Reason"); got != reason {
		ts.t.Fatalf("%s %s: X-Pinned-Reason = %q; want %q", method, path, got, reason)
	}
	if got := r.header.Get("Retry-After"); got == "" {
		ts.t.Fatalf("%s %s: 503 without Retry-After", method, path)
	}
	r.json(ts.t)
}

// openStream starts a GET whose body the caller reads.
func (ts *testServer) openStream(path string) *http.Response {
	ts.t.Helper()
	req, _ := http.NewRequest("GET", "http://pinned.test"+path, nil)
	resp, err := ts.tr.RoundTrip(req)
	if err != nil {
		ts.t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != 200 {
		resp.Body.Close()
		ts.t.Fatalf("GET %s = %d; want 200", path, resp.StatusCode)
	}
	return resp
}

// dialWS opens a websocket to path.
func (ts *testServer) dialWS(path string) *websocket.Conn {
	ts.t.Helper()
	d := websocket.Dialer{
		NetDialContext:   func(context.Context, string, string) (net.Conn, error) { return ts.ln.Dial() },
		HandshakeTimeout: testTimeout,
	}
	conn, resp, err := d.Dial("ws://pinned.test"+path, nil)
	if err != nil {
		ts.t.Fatalf("dial %s: %v (response %v)", path, err, resp)
	}
	resp.Body.Close()
	return conn
}

// wsEcho sends msg and returns the reply.
func wsEcho(t *testing.T, conn *websocket.Conn, msg string) string {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(testTimeout))
	if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		t.Fatalf("ws write: %v", err)
	}
	_, b, err := conn.ReadMessage()
	if err != nil {
		t.Fatalf("ws read: %v", err)
	}
	return string(b)
}

// instance returns the directory entry for id, or nil.
func (h *Host) instance(id string) *Instance {
	sh := &h.shards[h.shardIndex([]byte(id))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.m[id]
}

// fakeClock returns a fake clock at a fixed start.
func fakeClock() *clock.Fake { return clock.NewFake(time.Unix(1_700_000_000, 0)) }

// readLine reads one line of a streamed body.
func readLine(t *testing.T, br *bufio.Reader) string {
	t.Helper()
	s, err := br.ReadString('\n')
	if err != nil {
		t.Fatalf("stream read: %v", err)
	}
	return strings.TrimSuffix(s, "\n")
}
