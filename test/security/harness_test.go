// Package security runs pinned's smuggling and framing tables
// (internal/testkit/smuggle) against the whole pinboard: in process, wired the way
// internal/pinboard wires it (registry, dispatch and the proxy on the
// placement resolver, on the proxy's server), and as the real binary with
// Redis. The backend is a real worker.Worker (registration, challenge,
// heartbeats) whose data-plane handler records every request that reaches
// it.
package security

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/worker"
)

const token = "security-test-token-0123456789"

var builder proctest.Builder

func TestMain(m *testing.M) {
	code := m.Run()
	builder.Cleanup()
	if code == 0 {
		if err := goleak.Find(leakcheck.Options()...); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// seen is one request that reached the worker's data plane.
type seen struct {
	method, uri string
	head        string
}

// capture is a real worker.Worker for "/counter" with a stand-in host: it
// registers with a pinboard and heartbeats; every other request is
// recorded and answered "B:<body>" (or, in raw mode, with fixed bytes
// written on the hijacked connection).
type capture struct {
	w    *worker.Worker
	addr string

	mu   sync.Mutex
	reqs []seen
	raw  string // when set, the answer to every data-plane request
}

// host.Attached, for the worker.
func (c *capture) Namespace() string         { return "/counter" }
func (c *capture) Headroom() int             { return 1 << 20 }
func (c *capture) Len() int                  { return 0 }
func (c *capture) AbortAll(string)           {}
func (c *capture) CloseIdle(string)          {}
func (c *capture) Evict(string, string) bool { return false }

// MaxRequestBodySize is beyond any body the suites send: the proxy's own
// limits are under test, not the worker's.
func (c *capture) MaxRequestBodySize() int { return 1 << 30 }

var _ host.Attached = (*capture)(nil)

// startCapture runs a capturing worker registered with the pinboard at
// pinboardAddr and waits until it is ready.
func startCapture(t *testing.T, pinboardAddr string) *capture {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &capture{addr: ln.Addr().String()}
	w, err := worker.New(worker.Config{
		PinboardURL: "http://" + pinboardAddr, AdvertiseURL: "http://" + c.addr, Token: token,
		LeaseBuffer: 500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, RetryInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Attach(c); err != nil {
		t.Fatal(err)
	}
	c.w = w
	r := router.New()
	w.Mount(r)
	r.NotFound = c.serve
	srv := &fasthttp.Server{Handler: r.Handler, StreamRequestBody: true, MaxIdleWorkerDuration: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	wg.Go(func() { _ = w.Run(ctx) })
	t.Cleanup(func() {
		cancel()
		_ = ln.Close()
		_ = srv.Shutdown()
		wg.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); !w.Ready(); time.Sleep(10 * time.Millisecond) {
		// Polling: the registration crosses the pinboard's HTTP and store.
		if time.Now().After(deadline) {
			t.Fatal("the capturing worker never became ready")
		}
	}
	return c
}

func (c *capture) serve(ctx *fasthttp.RequestCtx) {
	c.mu.Lock()
	c.reqs = append(c.reqs, seen{string(ctx.Method()), string(ctx.RequestURI()), string(ctx.Request.Header.RawHeaders())})
	raw := c.raw
	c.mu.Unlock()
	if raw != "" {
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(conn net.Conn) { _, _ = io.WriteString(conn, raw) })
		return
	}
	var body []byte
	if s := ctx.RequestBodyStream(); s != nil {
		body, _ = io.ReadAll(s)
	} else {
		body = ctx.Request.Body()
	}
	ctx.SetBody(append([]byte("B:"), body...))
}

func (c *capture) requests() []seen {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]seen(nil), c.reqs...)
}

func (c *capture) setRaw(raw string) {
	c.mu.Lock()
	c.raw = raw
	c.mu.Unlock()
}

// startInProcess runs a pinboard in this process the way cmd/pinboard does
// (pinboard.New, registry and proxy), with the in-memory store, and
// returns its public address.
func startInProcess(t *testing.T) string {
	t.Helper()
	pub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := pinboard.New(pinboard.Config{
		Settings:       pinboard.Settings{Dev: true, Tokens: []string{token}, Lease: 3 * time.Second, ShutdownTimeout: 5 * time.Second},
		Logger:         slog.New(slog.DiscardHandler),
		PublicListener: pub, AdminListener: adm,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("pinboard Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("pinboard Run did not return within 10s")
		}
	})
	waitHealthy(t, pub.Addr().String())
	return pub.Addr().String()
}

var pinboardReady = regexp.MustCompile(`msg="pinboard listening".* public=(\S+) admin=(\S+)`)

// startBinary runs the pinboard binary with a real Redis and returns its
// public address.
func startBinary(t *testing.T) string {
	t.Helper()
	redis := redistest.Start(t)
	p := proctest.Start(t, proctest.Spec{
		Name: "pinboard",
		Bin:  builder.Build(t, "github.com/pinned-go/pinned/cmd/pinboard"),
		Env: []string{
			"PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0",
			"PINBOARD_REDIS_URL=" + redis.URL, "PINBOARD_TOKEN=" + token,
			"PINBOARD_RESTART_FENCE=0s", // the test's Redis has just started; nothing to fence
		},
		Ready: pinboardReady,
	})
	addr := p.Ready()[1]
	waitHealthy(t, addr)
	return addr
}

// waitHealthy polls /healthz until it answers 200.
func waitHealthy(t *testing.T, addr string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, _, err := fasthttp.GetTimeout(nil, "http://"+addr+wire.PathHealthz, time.Second)
		if err == nil && code == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/healthz never answered 200 (last %d %v)", addr, code, err)
		}
	}
}

// warm sends a request for /counter/a and checks that it reaches the
// worker: the placement exists and the path works end to end.
func warm(t *testing.T, addr string, c *capture) {
	t.Helper()
	before := len(c.requests())
	code, body, err := fasthttp.GetTimeout(nil, "http://"+addr+"/counter/a", 10*time.Second)
	if err != nil || code != 200 || !strings.HasPrefix(string(body), "B:") {
		t.Fatalf("warm-up GET /counter/a = %d %q %v", code, body, err)
	}
	if n := len(c.requests()) - before; n != 1 {
		t.Fatalf("warm-up: worker saw %d requests; want 1", n)
	}
}
