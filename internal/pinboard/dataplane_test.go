package pinboard

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/worker"
)

// testWorker is a real worker.Worker with a stand-in host: it registers with
// a pinboard, heartbeats, and answers data-plane requests the way a host
// does (Admit first: 403 or 503 lease), with "<name> <path> <session>".
type testWorker struct {
	name string
	w    *worker.Worker
	addr string

	mu  sync.Mutex
	ids map[string]bool // ids this worker served
}

// Attached, for the worker.
func (tw *testWorker) Namespace() string         { return "/counter" }
func (tw *testWorker) Headroom() int             { return 1000 }
func (tw *testWorker) Len() int                  { return 0 }
func (tw *testWorker) AbortAll(string)           {}
func (tw *testWorker) CloseIdle(string)          {}
func (tw *testWorker) Evict(string, string) bool { return false }
func (tw *testWorker) MaxRequestBodySize() int {
	return host.DefaultMaxRequestBodySize
}

var _ host.Attached = (*testWorker)(nil)

func startWorker(t *testing.T, name, pinboardAddr string) *testWorker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tw := &testWorker{name: name, addr: ln.Addr().String(), ids: map[string]bool{}}
	w, err := worker.New(worker.Config{
		PinboardURL: "http://" + pinboardAddr, AdvertiseURL: "http://" + tw.addr, Token: token,
		LeaseBuffer: 500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, RetryInterval: 100 * time.Millisecond,
		Logger: discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Attach(tw); err != nil {
		t.Fatal(err)
	}
	tw.w = w
	r := router.New()
	w.Mount(r)
	r.NotFound = tw.serve
	srv := &fasthttp.Server{Handler: r.Handler, MaxIdleWorkerDuration: 100 * time.Millisecond}
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
	deadline := time.Now().Add(10 * time.Second)
	for !w.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("worker %s never became ready", name)
		}
		time.Sleep(10 * time.Millisecond) // the registration crosses the pinboard's HTTP and its store
	}
	return tw
}

func (tw *testWorker) serve(ctx *fasthttp.RequestCtx) {
	_, reason := tw.w.Admit(ctx.Request.Header.Peek(wire.HeaderProxySecret), ctx.Request.Header.Peek(wire.HeaderSession))
	switch reason {
	case "":
	case wire.ReasonForbidden:
		ctx.SetStatusCode(fasthttp.StatusForbidden)
		return
	default:
		ctx.Response.Header.Set(wire.HeaderReason, reason)
		ctx.Response.Header.Set(wire.HeaderRetryAfter, "1")
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		return
	}
	path := string(ctx.Request.URI().PathOriginal())
	id, _, _ := strings.Cut(strings.TrimPrefix(path, "/counter/"), "/")
	tw.mu.Lock()
	tw.ids[id] = true
	tw.mu.Unlock()
	fmt.Fprintf(ctx, "%s %s %s", tw.name, path, ctx.Request.Header.Peek(wire.HeaderSession))
}

func (tw *testWorker) served(id string) bool {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	return tw.ids[id]
}

// rawRequest sends req on a new connection and returns the response.
func rawRequest(t *testing.T, addr, req string) *fasthttp.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp := &fasthttp.Response{}
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		t.Fatalf("reading the answer to %q: %v", req, err)
	}
	return resp
}

// The pinboard with its proxy: the public port serves the registry (through
// the proxy's streaming server, with its body limit intact), /healthz, and
// proxies everything else to the worker holding the id, placing it first.
func TestProxyOnThePublicPort(t *testing.T) {
	for _, dev := range []bool{true, false} {
		t.Run(map[bool]string{true: "dev", false: "redis"}[dev], func(t *testing.T) {
			s := Settings{Dev: dev}
			if !dev {
				s.RedisURL = redistest.Start(t).URL
			}
			r := start(t, s)
			r.waitHealth(t, 200)

			resp := rawRequest(t, r.public, "GET /counter/x/ HTTP/1.1\r\nHost: h\r\n\r\n")
			if resp.StatusCode() != 404 || string(resp.Header.Peek(wire.HeaderReason)) != wire.ReasonUnknownNamespace ||
				len(resp.Header.Peek(wire.HeaderRetryAfter)) != 0 {
				t.Errorf("a namespace no worker ever served: %d %q; want 404 unknown_namespace without Retry-After",
					resp.StatusCode(), resp.Header.Peek(wire.HeaderReason))
			}
			// Registry paths are decided on the raw target.
			resp = rawRequest(t, r.public, "GET /registry/../counter/x HTTP/1.1\r\nHost: h\r\n\r\n")
			if resp.StatusCode() != 404 || len(resp.Header.Peek(wire.HeaderReason)) != 0 {
				t.Errorf("/registry/../counter/x = %d %q; want the registry router's 404", resp.StatusCode(), resp.Body())
			}
			resp = rawRequest(t, r.public, "GET /counter/..%2Fregistry/workers HTTP/1.1\r\nHost: h\r\n\r\n")
			if resp.StatusCode() != 400 {
				t.Errorf("/counter/..%%2Fregistry/workers = %d; want the proxy's 400", resp.StatusCode())
			}
			// Registry bodies: 64 KiB at most, by Content-Length or chunked.
			big := `{"clientId":"` + strings.Repeat("x", wire.MaxBodyBytes) + `"}`
			resp = rawRequest(t, r.public, "POST "+wire.PathRegister+" HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "+token+
				"\r\nContent-Type: application/json\r\nContent-Length: "+fmt.Sprint(len(big))+"\r\n\r\n"+big)
			if resp.StatusCode() != 413 {
				t.Errorf("register with a %d-byte body = %d; want 413", len(big), resp.StatusCode())
			}
			var chunked bytes.Buffer
			for i := 0; i < len(big); i += 8 << 10 {
				part := big[i:min(len(big), i+8<<10)]
				fmt.Fprintf(&chunked, "%x\r\n%s\r\n", len(part), part)
			}
			chunked.WriteString("0\r\n\r\n")
			resp = rawRequest(t, r.public, "POST "+wire.PathRegister+" HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "+token+
				"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked.String())
			if resp.StatusCode() != 413 {
				t.Errorf("register with a chunked %d-byte body = %d; want 413", len(big), resp.StatusCode())
			}

			// Real workers register through the same port, and the proxy
			// places ids on them.
			a, b := startWorker(t, "a", r.public), startWorker(t, "b", r.public)
			seen := map[string]int{}
			for i := range 20 {
				id := fmt.Sprintf("id%d", i)
				code, body := r.do("GET", r.public, "/counter/"+id+"/incr?x=1", "", nil)
				if code != 200 {
					t.Fatalf("GET %s = %d %s", id, code, body)
				}
				name, rest, _ := strings.Cut(string(body), " ")
				path, sess, _ := strings.Cut(rest, " ")
				if path != "/counter/"+id+"/incr" {
					t.Errorf("the worker saw path %q", path)
				}
				w := map[string]*testWorker{"a": a, "b": b}[name]
				if w == nil || sess != w.w.Session() {
					t.Fatalf("GET %s answered by %q with session %q", id, name, sess)
				}
				seen[name]++
				if code, again := r.do("GET", r.public, "/counter/"+id+"/", "", nil); code != 200 || !strings.HasPrefix(string(again), name+" ") {
					t.Fatalf("GET %s again = %d %s; want %s again", id, code, again, name)
				}
			}
			if len(seen) != 2 {
				t.Errorf("20 ids went to %v; want both workers used", seen)
			}
			code, body := r.do("GET", r.admin, "/metrics", "", nil)
			for _, want := range []string{`pinned_placecache_hits_total{cache="placements"}`, "pinned_proxy_responses_total", "pinned_placement_claims_total"} {
				if code != 200 || !bytes.Contains(body, []byte(want)) {
					t.Errorf("admin /metrics lacks %s", want)
				}
			}
		})
	}
}

// Two pinboards on one Redis: concurrent first requests for the same ids
// through both reach one worker per id.
func TestTwoPinboardsShareRedis(t *testing.T) {
	srv := redistest.Start(t)
	r1 := start(t, Settings{RedisURL: srv.URL})
	r2 := start(t, Settings{RedisURL: srv.URL})
	r1.waitHealth(t, 200)
	r2.waitHealth(t, 200)
	ws := []*testWorker{startWorker(t, "a", r1.public), startWorker(t, "b", r2.public), startWorker(t, "c", r1.public)}
	for i := range 30 {
		id := fmt.Sprintf("shared%d", i)
		var wg sync.WaitGroup
		bodies := make([]string, 6)
		for j := range bodies {
			wg.Go(func() {
				addr := []string{r1.public, r2.public}[j%2]
				code, body := r1.do("GET", addr, "/counter/"+id+"/", "", nil)
				if code != 200 {
					t.Errorf("GET %s via pinboard %d = %d %s", id, j%2+1, code, body)
				}
				bodies[j], _, _ = strings.Cut(string(body), " ")
			})
		}
		wg.Wait()
		n := 0
		for _, w := range ws {
			if w.served(id) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%s was served by %d workers (answers from %v); want 1", id, n, bodies)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
