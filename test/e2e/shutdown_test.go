package e2e

// The commands' shutdown, as processes with real peers: the pinboard with
// counter workers connected and heartbeating (their keep-alive connections
// handed over to the fasthttp path), a counter whose pinboard is gone or
// frozen, the fleet demo on Ctrl-C. Each ends within its shutdown timeout,
// logs what it waits for and how long it took, and a second signal ends it
// at once with status 128 + the signal's number.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

const (
	// shutdownTimeout is the shutdown timeout the tests give a process.
	shutdownTimeout = 3 * time.Second
	// exitGrace is how long past its shutdown timeout a process may take to
	// exit (a busy 2-core machine under -race); it is also the bound on an
	// exit that must be immediate (a second signal).
	exitGrace = 5 * time.Second
)

// stopWithin sends sig to p and waits up to within for it to exit; past
// that it kills p and fails the test with p's log (it hung). It returns how
// long the exit took.
func stopWithin(t *testing.T, p *proctest.Proc, sig syscall.Signal, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
		return time.Since(start)
	case <-time.After(within):
		p.Kill()
		t.Fatalf("%s did not exit within %v of %v; killed:\n%s", p.Spec.Name, within, sig, p.Log())
		return 0
	}
}

// heartbeating waits until the counter has registered and heartbeated at
// least once since: its keep-alive connection to the pinboard is open.
func heartbeating(t *testing.T, pb *pinboard, c *counter) {
	t.Helper()
	eventually(t, 20*time.Second, "the counter registers and heartbeats", func() bool {
		w, ok := workerAt(t, pb, c.addr)
		return ok && w.Verified && w.LastHeartbeatMs > w.RegisteredAtMs
	}, c.Log)
}

// placeIDs activates n counter instances through the pinboard.
func placeIDs(t *testing.T, pb *pinboard, n int) {
	t.Helper()
	for i := range n {
		if code, _, body := do(t, "POST", fmt.Sprintf("http://%s/counter/id%d/incr", pb.public, i), nil); code != 200 {
			t.Fatalf("incr id%d through the pinboard = %d %s", i, code, body)
		}
	}
}

// wantLog fails the test unless p's log has a line matching re.
func wantLog(t *testing.T, p *proctest.Proc, re string) {
	t.Helper()
	if p.WaitLog(regexp.MustCompile(re), time.Second) == nil {
		t.Errorf("%s logged no line matching %s:\n%s", p.Spec.Name, re, p.Log())
	}
}

// The pinboard ends within its shutdown timeout on SIGTERM while counter
// workers are connected and heartbeating: on Redis and with -dev, the
// heartbeat connections handed over by the event loops to the fasthttp
// path, and with the fasthttp server alone (-loops 0).
func TestPinboardStopsWithWorkersConnected(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		env   []string
		loops bool
	}{
		{name: "redis", loops: true},
		{name: "dev", args: []string{"-dev"}, loops: true},
		{name: "dev-no-loops", args: []string{"-dev"}, env: []string{"PINBOARD_LOOPS=0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"PINBOARD_SHUTDOWN_TIMEOUT=" + shutdownTimeout.String()}, tc.env...)
			if tc.args == nil {
				env = append(env, "PINBOARD_REDIS_URL="+redistest.Start(t).URL)
			}
			pb := startPinboardWith(t, tc.args, env...)
			cs := []*counter{startCounter(t, pb), startCounter(t, pb)}
			for _, c := range cs {
				heartbeating(t, pb, c)
			}
			placeIDs(t, pb, 3)
			if tc.loops {
				// The workers' registry calls are the event loops' to hand
				// over: the connections Shutdown used to wait for forever.
				if n := value(t, scrape(t, "http://"+pb.admin+"/metrics"), "pinned_proxy_handovers_total"); n < 2 {
					t.Fatalf("pinned_proxy_handovers_total = %v; want the workers' connections handed over", n)
				}
			}
			took := stopWithin(t, pb.Proc, syscall.SIGTERM, shutdownTimeout+exitGrace)
			if code := pb.ExitCode(); code != 0 {
				t.Errorf("exit status %d after SIGTERM; want 0\n%s", code, pb.Log())
			}
			wantLog(t, pb.Proc, `msg="shutting down" .*timeout=3s`)
			wantLog(t, pb.Proc, `msg="pinboard stopped" .*took=\S+`)
			t.Logf("the pinboard exited %v after SIGTERM", took)
		})
	}
}

// Connections still busy when the pinboard's shutdown timeout passes are
// closed then, one on an event loop (a request head that never ends) and
// one handed over to the fasthttp path (a registry call whose body never
// ends), long before their own timeout (PINBOARD_HEADER_TIMEOUT, the
// fasthttp server's read timeout too) would: the pinboard exits within
// its timeout, having logged once a second what it waited for.
func TestPinboardShutdownClosesWhatRemains(t *testing.T) {
	pb := startPinboardWith(t, []string{"-dev"}, "PINBOARD_SHUTDOWN_TIMEOUT="+shutdownTimeout.String(), "PINBOARD_HEADER_TIMEOUT=1m")
	stalled := func(req string) net.Conn {
		c, err := net.Dial("tcp", pb.public)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		return c
	}
	onLoop := stalled("GET /counter/a/ HTTP/1.1\r\nHost: h\r\n")
	handed := stalled("POST /registry/heartbeat HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + token +
		"\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n{")
	eventually(t, 10*time.Second, "the registry call handed over", func() bool {
		return value(t, scrape(t, "http://"+pb.admin+"/metrics"), "pinned_proxy_handovers_total") >= 1
	})
	took := stopWithin(t, pb.Proc, syscall.SIGTERM, shutdownTimeout+exitGrace)
	if code := pb.ExitCode(); code != 0 {
		t.Errorf("exit status %d; want 0\n%s", code, pb.Log())
	}
	wantLog(t, pb.Proc, `msg="shutting down: waiting" logger=pinned.pinboard connections=[23] `)
	wantLog(t, pb.Proc, `msg="in-flight requests did not finish within the shutdown timeout; their connections were closed"`)
	wantLog(t, pb.Proc, `msg="pinboard stopped" .*took=`)
	for name, c := range map[string]net.Conn{"the loop's": onLoop, "the handed-over": handed} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var ne net.Error
		if _, err := io.ReadAll(c); errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s connection is still open after the pinboard exited", name)
		}
	}
	t.Logf("the pinboard exited %v after SIGTERM", took)
}

// A second signal ends the pinboard's shutdown at once, here while it
// waits out its ShutdownDelay: status 130 for a SIGINT, and the log says so.
func TestPinboardSecondSignalExitsAtOnce(t *testing.T) {
	pb := startPinboardWith(t, []string{"-dev"}, "PINBOARD_SHUTDOWN_DELAY=1m")
	if err := pb.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if pb.WaitLog(regexp.MustCompile(`msg="shutting down"`), 10*time.Second) == nil {
		t.Fatalf("no shutdown began after SIGTERM:\n%s", pb.Log())
	}
	stopWithin(t, pb.Proc, syscall.SIGINT, exitGrace)
	if code := pb.ExitCode(); code != 130 {
		t.Errorf("exit status %d after a second signal (SIGINT); want 130\n%s", code, pb.Log())
	}
	wantLog(t, pb.Proc, `msg="second signal: exiting at once.*signal=interrupt`)
}

// A counter in fleet mode whose pinboard is gone (killed) or frozen
// (SIGSTOP: connections open, nothing answers) still ends within its
// shutdown timeout on SIGTERM: its releases and its last calls give up.
func TestCounterStopsWithoutItsPinboard(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
	}{{"killed", syscall.SIGKILL}, {"frozen", syscall.SIGSTOP}} {
		t.Run(tc.name, func(t *testing.T) {
			pb := startPinboardWith(t, []string{"-dev"})
			c := startCounter(t, pb, "PINNED_SHUTDOWN_TIMEOUT="+shutdownTimeout.String())
			heartbeating(t, pb, c)
			placeIDs(t, pb, 5)
			if err := pb.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			took := stopWithin(t, c.Proc, syscall.SIGTERM, shutdownTimeout+exitGrace)
			wantLog(t, c.Proc, `msg="counter stopped" took=\S+`)
			t.Logf("the counter exited %v after SIGTERM (status %d)", took, c.ExitCode())
		})
	}
}

// A second SIGTERM ends the counter's shutdown at once (status 143), here
// while its releases wait for a frozen pinboard under a long timeout.
func TestCounterSecondSignalExitsAtOnce(t *testing.T) {
	pb := startPinboardWith(t, []string{"-dev"})
	c := startCounter(t, pb, "PINNED_SHUTDOWN_TIMEOUT=1m")
	heartbeating(t, pb, c)
	placeIDs(t, pb, 3)
	if err := pb.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if c.WaitLog(regexp.MustCompile(`msg="shutting down" timeout=1m0s`), 10*time.Second) == nil {
		t.Fatalf("no shutdown began after SIGTERM:\n%s", c.Log())
	}
	stopWithin(t, c.Proc, syscall.SIGTERM, exitGrace)
	if code := c.ExitCode(); code != 143 {
		t.Errorf("exit status %d after a second SIGTERM; want 143\n%s", code, c.Log())
	}
	wantLog(t, c.Proc, `msg="second signal: exiting at once.*signal=terminated`)
}

var fleetPinboard = regexp.MustCompile(`^pinboard\s+(http://\S+)`)

// startFleet runs examples/fleet on ports 127.0.0.1:0 with the given
// shutdown timeout and returns it with its pinboard's URL.
func startFleet(t *testing.T, timeout time.Duration) (*proctest.Proc, string) {
	t.Helper()
	f := proctest.Start(t, proctest.Spec{
		Name:  "fleet",
		Bin:   builder.Build(t, "github.com/pinned-go/pinned/examples/fleet"),
		Args:  []string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-shutdown-timeout", timeout.String()},
		Ready: regexp.MustCompile(`Ctrl-C stops the fleet`),
	})
	m := f.WaitLog(fleetPinboard, time.Second)
	if m == nil {
		t.Fatalf("no pinboard URL in the fleet's banner:\n%s", f.Log())
	}
	return f, m[1]
}

// holdInstance opens a WebSocket to an instance through the fleet's
// pinboard and keeps it open: the instance stays busy, so the workers'
// drain waits for it until the deadline.
func holdInstance(t *testing.T, pinboardURL string) {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.Dial(strings.Replace(pinboardURL, "http", "ws", 1)+"/counter/alice/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := ws.WriteMessage(websocket.TextMessage, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.ReadMessage(); err != nil || string(msg) != "hi" {
		t.Fatalf("echo = %q, %v", msg, err)
	}
}

// Ctrl-C (SIGINT) ends the fleet demo within its shutdown timeout even
// while an instance stays busy (a WebSocket open through the pinboard),
// logging once a second what it waits for, then how long it took.
func TestFleetCtrlC(t *testing.T) {
	f, url := startFleet(t, shutdownTimeout)
	holdInstance(t, url)
	took := stopWithin(t, f, syscall.SIGINT, shutdownTimeout+exitGrace)
	wantLog(t, f, `msg="signal received: shutting down gracefully; send it again to exit at once" logger=fleet signal=interrupt`)
	wantLog(t, f, `msg="shutting down: waiting" logger=fleet .*instances=1 `)
	wantLog(t, f, `msg="fleet stopped" logger=fleet took=\S+`)
	t.Logf("the fleet exited %v after SIGINT (status %d)", took, f.ExitCode())
}

// A second Ctrl-C ends the fleet demo at once (status 130), here while its
// workers wait for a busy instance under a long timeout.
func TestFleetSecondCtrlC(t *testing.T) {
	f, url := startFleet(t, time.Minute)
	holdInstance(t, url)
	if err := f.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if f.WaitLog(regexp.MustCompile(`msg="shutting down: draining the workers`), 10*time.Second) == nil {
		t.Fatalf("no shutdown began after Ctrl-C:\n%s", f.Log())
	}
	stopWithin(t, f, syscall.SIGINT, exitGrace)
	if code := f.ExitCode(); code != 130 {
		t.Errorf("exit status %d after a second Ctrl-C; want 130\n%s", code, f.Log())
	}
	wantLog(t, f, `msg="second signal: exiting at once.*signal=interrupt`)
}
