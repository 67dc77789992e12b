// Package e2e runs pinned's real binaries as processes on 127.0.0.1: a
// redis-server started by the test, the pinboard, and counter workers in
// fleet mode. These tests prove that the pieces agree on the protocol and
// that fencing holds across real processes and signals, and measure
// failover after a worker's death or freeze (failover_test.go).
package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

const token = "e2e-deployment-token-0123456789"

var builder proctest.Builder

func TestMain(m *testing.M) {
	code := m.Run()
	builder.Cleanup()
	os.Exit(code)
}

var (
	pinboardReady = regexp.MustCompile(`msg="pinboard listening".* public=(\S+) admin=(\S+)`)
	counterReady  = regexp.MustCompile(`msg="counter demo listening".* addr=(\S+) admin=(\S+)`) // fleet mode: an admin listener by default
)

type pinboard struct {
	*proctest.Proc
	public, admin string
}

func startPinboard(t *testing.T, redisURL string, env ...string) *pinboard {
	t.Helper()
	return startPinboardAs(t, "pinboard", redisURL, env...)
}

// startPinboardAs is startPinboard with the process named name (in logs).
func startPinboardAs(t *testing.T, name, redisURL string, env ...string) *pinboard {
	t.Helper()
	return runPinboard(t, name, nil, append([]string{"PINBOARD_REDIS_URL=" + redisURL}, env...))
}

// startPinboardWith runs the pinboard with args and env (its Redis among
// them, unless args say -dev) on ports 127.0.0.1:0.
func startPinboardWith(t *testing.T, args []string, env ...string) *pinboard {
	t.Helper()
	return runPinboard(t, "pinboard", args, env)
}

// runPinboard starts the pinboard process named name with args and env.
func runPinboard(t *testing.T, name string, args, env []string) *pinboard {
	t.Helper()
	p := proctest.Start(t, proctest.Spec{
		Name: name,
		Bin:  builder.Build(t, "github.com/pinned-go/pinned/cmd/pinboard"),
		Args: args,
		Env: append([]string{
			"PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0", "PINBOARD_TOKEN=" + token,
			"PINBOARD_RESTART_FENCE=0s", // the test's Redis has just started; nothing to fence
		}, env...),
		Ready: pinboardReady,
	})
	return &pinboard{Proc: p, public: p.Ready()[1], admin: p.Ready()[2]}
}

type counter struct {
	*proctest.Proc
	addr  string // the advertised listener
	admin string // the loopback admin listener (/metrics, /debug/pprof)
	relay *relay // between the counter and the pinboard's registry
}

// The counter binaries: the demo, and the test fixture (the demo's process
// with a chaos history, for the tests that read what ran where).
const (
	demoCounter    = "github.com/pinned-go/pinned/examples/counter"
	fixtureCounter = "github.com/pinned-go/pinned/test/app/counter"
)

// startCounter runs examples/counter in fleet mode on a port chosen up
// front, because the advertise URL must name it before the process starts.
// It reaches pb's registry through a recording relay; when the test ends
// (after the processes are killed) every line the counter and pb logged is
// scanned for the deployment token and for every secret, challenge and
// challenge value the counter sent (noSecretInLogs).
func startCounter(t *testing.T, pb *pinboard, env ...string) *counter {
	t.Helper()
	return startCounterWith(t, pb, nil, env...)
}

// startCounterWith is startCounter with command-line arguments.
func startCounterWith(t *testing.T, pb *pinboard, args []string, env ...string) *counter {
	t.Helper()
	return startCounterBin(t, pb, demoCounter, args, env...)
}

// startCounterBin is startCounterWith running the binary of pkg (the demo
// or the fixture).
func startCounterBin(t *testing.T, pb *pinboard, pkg string, args []string, env ...string) *counter {
	t.Helper()
	addr := freeAddr(t)
	c := &counter{addr: addr}
	t.Cleanup(func() {
		noSecretInLogs(t, c.relay, map[string]*proctest.Proc{"pinboard": pb.Proc, c.Spec.Name: c.Proc})
	})
	c.relay = startRelay(t, pb.public)
	c.Proc = proctest.Start(t, proctest.Spec{
		Name: "counter@" + addr,
		Bin:  builder.Build(t, pkg),
		Args: args,
		Env: append([]string{
			"PINNED_LISTEN=" + addr, "PINNED_PINBOARD_URL=http://" + c.relay.addr(),
			"PINNED_TOKEN=" + token, "PINNED_ADVERTISE_URL=http://" + addr,
		}, env...),
		Ready: counterReady,
	})
	c.admin = c.Ready()[2]
	return c
}

var client = &fasthttp.Client{MaxIdleConnDuration: time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}

// do sends one request and returns status, headers of interest and body.
func do(t *testing.T, method, url string, hdr map[string]string) (int, *fasthttp.ResponseHeader, []byte) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if err := client.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	h := &fasthttp.ResponseHeader{}
	resp.Header.CopyTo(h)
	return resp.StatusCode(), h, append([]byte(nil), resp.Body()...)
}

// eventually polls cond (an external process's state) until it holds.
// Each of explain, if any, adds to the failure message.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool, explain ...func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			var more []string
			for _, f := range explain {
				more = append(more, f())
			}
			t.Fatalf("not within %v: %s\n%s", within, what, strings.Join(more, "\n"))
		}
		time.Sleep(25 * time.Millisecond) // polling other processes: no event to wait on
	}
}

// workers lists the pinboard's workers; nil while its store answers 503.
func workers(t *testing.T, pb *pinboard) []wire.WorkerInfo {
	t.Helper()
	code, _, body := do(t, "GET", "http://"+pb.public+wire.PathWorkers, map[string]string{"Authorization": "Bearer " + token})
	if code == 503 {
		// The store is still connecting (or briefly down): the registry
		// says so with 503 + Retry-After; callers poll.
		return nil
	}
	if code != 200 {
		t.Fatalf("GET /registry/workers = %d %s", code, body)
	}
	var r wire.WorkersResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r.Workers
}

func workerAt(t *testing.T, pb *pinboard, addr string) (wire.WorkerInfo, bool) {
	for _, w := range workers(t, pb) {
		if w.AdvertiseURL == "http://"+addr {
			return w, true
		}
	}
	return wire.WorkerInfo{}, false
}

func healthy(t *testing.T, c *counter) bool {
	code, _, _ := do(t, "GET", "http://"+c.addr+"/healthz", nil)
	return code == 200
}

// A counter in fleet mode registers with the real pinboard, proves its
// advertise URL, turns ready, refuses data-plane requests without the
// proxy's secret, relays a pushed drain, and on SIGTERM winds down and exits.
func TestCounterJoinsPinboard(t *testing.T) {
	rs := redistest.Start(t)
	pb := startPinboard(t, rs.URL)
	c := startCounter(t, pb)

	eventually(t, 15*time.Second, "the counter registers and turns ready", func() bool {
		w, ok := workerAt(t, pb, c.addr)
		return ok && w.Verified && healthy(t, c)
	})
	w, _ := workerAt(t, pb, c.addr)
	if len(w.Namespaces) != 1 || w.Namespaces[0] != "/counter" || w.Headroom <= 0 || w.Draining {
		t.Fatalf("worker record = %+v; want /counter, headroom > 0, not draining", w)
	}

	// The data plane is the proxy's alone: no secret, or a wrong one → 403.
	for _, hdr := range []map[string]string{nil, {wire.HeaderProxySecret: "not-the-secret"}} {
		code, h, body := do(t, "POST", "http://"+c.addr+"/counter/alice/incr", hdr)
		if code != 403 || string(h.Peek(wire.HeaderReason)) != wire.ReasonForbidden {
			t.Fatalf("direct request with %v = %d %s %s; want 403 forbidden", hdr, code, h.Peek(wire.HeaderReason), body)
		}
	}

	// A drain pushed through the registry reaches the worker in a heartbeat
	// ack, and its next heartbeat reports it.
	pushDrain(t, pb, w.ClientID)
	eventually(t, 10*time.Second, "the worker reports draining", func() bool {
		w, ok := workerAt(t, pb, c.addr)
		return ok && w.Draining && w.Headroom == 0
	})

	if !c.Terminate(20 * time.Second) {
		t.Fatalf("counter did not exit within 20s of SIGTERM:\n%s", c.Log())
	}
	if code := c.ExitCode(); code != 0 {
		t.Fatalf("counter exit status = %d; want 0\n%s", code, c.Log())
	}
}

func pushDrain(t *testing.T, pb *pinboard, clientID string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + pb.public + wire.PathPush)
	req.Header.SetMethod("POST")
	req.Header.Set("Authorization", "Bearer "+token)
	req.SetBodyString(fmt.Sprintf(`{"clientId":%q,"type":"drain"}`, clientID))
	if err := client.DoTimeout(req, resp, 10*time.Second); err != nil || resp.StatusCode() != 202 {
		t.Fatalf("push drain = %v %d %s", err, resp.StatusCode(), resp.Body())
	}
}

// A frozen pinboard (SIGSTOP) cannot renew the worker's lease: the worker
// aborts everything and turns unready at its local deadline, then registers
// a fresh session when the pinboard comes back.
func TestLeaseLossAndRegain(t *testing.T) {
	rs := redistest.Start(t)
	pb := startPinboard(t, rs.URL) // lease 10 s; the worker stops 5 s after its last acked send
	c := startCounter(t, pb)
	eventually(t, 15*time.Second, "registered", func() bool { return healthy(t, c) })
	first, _ := workerAt(t, pb, c.addr)

	if err := pb.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	lost := c.WaitLog(regexp.MustCompile(`lease lost`), 15*time.Second)
	unready := !healthy(t, c)
	if err := pb.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if lost == nil {
		t.Fatalf("no lease loss logged while the pinboard was frozen:\n%s", c.Log())
	}
	if !unready {
		t.Fatal("the counter stayed ready after losing its lease")
	}
	eventually(t, 20*time.Second, "a new session after the pinboard resumed", func() bool {
		w, ok := workerAt(t, pb, c.addr)
		return ok && w.SessionID != first.SessionID && w.Verified && healthy(t, c)
	})
}

// freeAddr returns a 127.0.0.1 address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// bodyPost sends a POST with a body of n bytes on a fresh connection, the
// whole request before reading the answer (as most clients do), and
// returns the status and the decoded JSON error (if any).
func bodyPost(t *testing.T, url string, n int) (int, wire.Error, error) {
	t.Helper()
	c := &fasthttp.Client{MaxIdemponentCallAttempts: 1, ReadTimeout: 20 * time.Second, WriteTimeout: 20 * time.Second}
	defer c.CloseIdleConnections()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod("POST")
	req.SetBody(make([]byte, n))
	if err := c.DoTimeout(req, resp, 20*time.Second); err != nil {
		return 0, wire.Error{}, err
	}
	var e wire.Error
	if resp.StatusCode() != 200 {
		if err := json.Unmarshal(resp.Body(), &e); err != nil || e.Error == "" {
			t.Errorf("%d answer %q is not a JSON error", resp.StatusCode(), resp.Body())
		}
	}
	return resp.StatusCode(), e, nil
}

// The worker's body limit agrees end to end: the counter's server accepts
// exactly what its host does, the worker registers that limit (the
// pinboard keeps it on the session), and a body over it gets 413 with a
// JSON error, through the pinboard (which refuses it before forwarding)
// or straight to the worker, never a 502 or a connection reset; a body
// under it is served.
func TestBodyLimitEndToEnd(t *testing.T) {
	rs := redistest.Start(t)
	pb := startPinboard(t, rs.URL)
	const limit = 1 << 20
	c := startCounter(t, pb, fmt.Sprintf("PINNED_MAX_BODY_BYTES=%d", limit))
	eventually(t, 15*time.Second, "the counter registers and turns ready", func() bool {
		w, ok := workerAt(t, pb, c.addr)
		return ok && w.Verified && healthy(t, c)
	})
	if w, _ := workerAt(t, pb, c.addr); w.MaxBodyBytes != limit {
		t.Fatalf("registered maxBodyBytes = %d; want the counter's %d", w.MaxBodyBytes, limit)
	}
	via := "http://" + pb.public + "/counter/alice/incr"
	if code, e, err := bodyPost(t, via, limit/2); err != nil || code != 200 {
		t.Fatalf("a %d-byte POST through the pinboard = %d %+v %v; want 200", limit/2, code, e, err)
	}
	for _, url := range []string{via, "http://" + c.addr + "/counter/alice/incr"} {
		for range 3 {
			code, e, err := bodyPost(t, url, 5<<20)
			if err != nil {
				t.Fatalf("a 5 MB POST to %s: %v; want 413, never a connection error", url, err)
			}
			if code != 413 || !strings.Contains(e.Error, "larger than") {
				t.Fatalf("a 5 MB POST to %s = %d %+v; want 413 with a JSON error naming the limit", url, code, e)
			}
			// The pinboard refuses it itself, before sending a byte.
			if url == via && !strings.Contains(e.Error, fmt.Sprintf("worker accepts (%d bytes)", limit)) {
				t.Fatalf("a 5 MB POST through the pinboard = %+v; want the pinboard's 413 naming the worker's limit", e)
			}
		}
	}
}
