package main

// End-to-end tests: the real pinboard binary, built by the test, run as a
// process against a redis-server the test starts, driven over HTTP by a
// minimal fake worker on 127.0.0.1.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

const token = "e2e-token-0123456789abcdef"

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// build compiles the pinboard once per test binary.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pinboard-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "pinboard")
		out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
		if err != nil {
			buildErr = err
			binary = string(out)
		}
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, binary)
	}
	return binary
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binary != "" && buildErr == nil {
		os.RemoveAll(filepath.Dir(binary))
	}
	os.Exit(code)
}

// proc is a running pinboard process.
type proc struct {
	cmd    *exec.Cmd
	public string
	admin  string
	stdout *logtest.Buffer
	logs   *logtest.Buffer
	exited chan struct{}
}

var listening = regexp.MustCompile(`msg="pinboard listening".* public=(\S+) admin=(\S+)`)

// startPinboard runs the binary with env (plus ports 127.0.0.1:0) and waits
// for its "pinboard listening" line.
func startPinboard(t *testing.T, args []string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(build(t), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0"}, env...)
	p := &proc{cmd: cmd, stdout: &logtest.Buffer{}, logs: &logtest.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout = p.stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan [2]string, 1)
	go func() { // owned by the process: ends when it closes stderr
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.logs.Write([]byte(line + "\n"))
			if m := listening.FindStringSubmatch(line); m != nil {
				found <- [2]string{m[1], m[2]}
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	select {
	case a := <-found:
		p.public, p.admin = a[0], a[1]
	case <-p.exited:
		t.Fatalf("pinboard exited before listening: %v\n%s", cmd.ProcessState, p.logs)
	case <-time.After(20 * time.Second):
		t.Fatalf("pinboard not listening within 20s:\n%s", p.logs)
	}
	return p
}

var client = &fasthttp.Client{MaxIdleConnDuration: time.Second}

func call(t *testing.T, method, addr, path, tok string, body any) (int, []byte) {
	t.Helper()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	req.Header.SetMethod(method)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != nil {
		b, _ := json.Marshal(body)
		req.SetBody(b)
	}
	if err := client.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...)
}

// waitHealthy polls /healthz of an external process until it answers 200.
func waitHealthy(t *testing.T, p *proc) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if code, _ := call(t, "GET", p.public, wire.PathHealthz, "", nil); code == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pinboard not healthy within 15s:\n%s", p.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *proc) terminate(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("pinboard did not exit within 20s of SIGTERM:\n%s", p.logs)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit status after SIGTERM = %d; want 0\n%s", code, p.logs)
	}
}

func TestEndToEnd(t *testing.T) {
	srv := redistest.Start(t)
	p := startPinboard(t, nil, "PINBOARD_REDIS_URL="+srv.URL, "PINBOARD_TOKEN="+token, "PINBOARD_LEASE=3s", "PINBOARD_RESTART_FENCE=0s")
	waitHealthy(t, p)
	w := fakeworker.Start(t, "worker-secret")

	code, body := call(t, "POST", p.public, wire.PathRegister, token, wire.RegisterRequest{
		ClientID: "e2e-client", Secret: "worker-secret", Namespaces: []string{"/counter"}, AdvertiseURL: w.URL,
		Headroom: 4, Challenge: "reg-1-0123456789abcdefghij", ChallengeValue: fakeworker.Value("reg-1-0123456789abcdefghij"),
	})
	if code != 200 {
		t.Fatalf("register = %d %s\n%s", code, body, p.logs)
	}
	var reg wire.RegisterResponse
	json.Unmarshal(body, &reg)
	if reg.ExpiresInMs != 3000 || reg.SessionID == "" {
		t.Fatalf("register = %+v; want a session and the 3s lease", reg)
	}
	if w.Hits() != 1 {
		t.Fatalf("the pinboard fetched the challenge %d times; want 1", w.Hits())
	}

	code, body = call(t, "POST", p.public, wire.PathPush, token, wire.PushRequest{ClientID: "e2e-client", Type: wire.MessageDrain, DeadlineMs: 99})
	if code != 202 {
		t.Fatalf("push = %d %s", code, body)
	}
	hb := func(n int) (int, wire.HeartbeatResponse) {
		c := "hb-" + string(rune('0'+n)) + "-0123456789abcdefghij"
		code, body := call(t, "POST", p.public, wire.PathHeartbeat, token, wire.HeartbeatRequest{
			SessionID: reg.SessionID, Headroom: 3, Challenge: c, ChallengeValue: fakeworker.Value(c),
		})
		var r wire.HeartbeatResponse
		json.Unmarshal(body, &r)
		return code, r
	}
	code, ack := hb(1)
	if code != 200 || len(ack.Messages) != 1 || ack.Messages[0] != (wire.Message{Type: wire.MessageDrain, DeadlineMs: 99}) || ack.ExpiresInMs != 3000 {
		t.Fatalf("heartbeat = %d %+v; want the drain message once", code, ack)
	}
	if code, ack = hb(2); code != 200 || len(ack.Messages) != 0 {
		t.Fatalf("second heartbeat = %d %+v; want no messages", code, ack)
	}

	// A placement claimed (as the proxy would) and released by the worker.
	admin := redisClient(t, srv)
	admin("SET", wire.KeyPlacement("/counter", "abc"), wire.FormatPlacement(7, 0, reg.SessionID))
	admin("HSET", "pinned:o:"+reg.SessionID, "/counter/abc", "1", "#/counter", "1")
	code, body = call(t, "POST", p.public, wire.PathRelease, token, wire.ReleaseRequest{ClientID: "e2e-client", Namespace: "/counter", ID: "abc"})
	if code != 200 || !strings.Contains(string(body), `"released":true`) {
		t.Fatalf("release = %d %s", code, body)
	}
	if v := admin("EXISTS", wire.KeyPlacement("/counter", "abc")); v != "0" {
		t.Fatalf("placement still in Redis after release: EXISTS = %s", v)
	}

	code, body = call(t, "GET", p.public, wire.PathOverview, token, nil)
	var ov wire.OverviewResponse
	json.Unmarshal(body, &ov)
	if code != 200 || ov.Sessions != 1 || ov.Namespaces["/counter"].Headroom != 3 || ov.LeaseMs != 3000 {
		t.Fatalf("overview = %d %s", code, body)
	}
	if code, _ := call(t, "GET", p.public, wire.PathWorkers, "wrong-token-0123456789", nil); code != 401 {
		t.Fatalf("workers with a wrong token = %d; want 401", code)
	}
	code, body = call(t, "GET", p.admin, "/metrics", "", nil)
	if code != 200 || !bytes.Contains(body, []byte("pinned_registry_messages_delivered_total 1")) || !bytes.Contains(body, []byte("process_cpu_seconds_total")) {
		t.Fatalf("admin /metrics = %d, lacks the registry or process metrics", code)
	}
	if strings.Contains(p.logs.String(), token) || strings.Contains(p.logs.String(), "worker-secret") {
		t.Fatalf("a token or worker secret reached the logs:\n%s", p.logs)
	}
	p.terminate(t)
	if !strings.Contains(p.logs.String(), "pinboard stopped") {
		t.Fatalf("no clean stop in the logs:\n%s", p.logs)
	}
}

// redisClient returns a function that runs one command on srv and returns
// its reply as a string (the test's view of Redis, beside the pinboard).
func redisClient(t *testing.T, srv *redistest.Server) func(args ...string) string {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return func(args ...string) string {
		t.Helper()
		r := c.Do(context.Background(), c.B().Arbitrary(args...).Build())
		if err := r.Error(); err != nil {
			t.Fatalf("redis %v: %v", args, err)
		}
		if n, err := r.AsInt64(); err == nil {
			return strconv.FormatInt(n, 10)
		}
		v, _ := r.ToString()
		return v
	}
}

func TestMissingTokenExitsTwo(t *testing.T) {
	cmd := exec.Command(build(t))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("pinboard without a token: %v; want exit status 2", err)
	}
	if !strings.Contains(stderr.String(), "PINBOARD_TOKEN") {
		t.Fatalf("stderr %q does not name PINBOARD_TOKEN", stderr.String())
	}
}

// A configuration the pinboard cannot run with is exit status 2 (bad
// configuration) with a message naming the variable, before anything
// listens: here a port beyond 65535.
func TestBadListenExitsTwo(t *testing.T) {
	for _, env := range []string{"PINBOARD_LISTEN=:99999", "PINBOARD_ADMIN_LISTEN=127.0.0.1:65536"} {
		cmd := exec.Command(build(t), "-dev")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), env}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Fatalf("pinboard with %s: %v (%s); want exit status 2", env, err, stderr.String())
		}
		name, _, _ := strings.Cut(env, "=")
		if !strings.Contains(stderr.String(), name) || !strings.Contains(stderr.String(), "65535") {
			t.Fatalf("stderr %q does not name %s and the port range", stderr.String(), name)
		}
	}
}

// -h prints every setting, with its type, default and variable, and exits 0.
func TestHelpExitsZero(t *testing.T) {
	cmd := exec.Command(build(t), "-h")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pinboard -h: %v; want exit status 0", err)
	}
	help := string(out)
	for _, want := range []string{
		"-listen host:port (env PINBOARD_LISTEN, default :8080)",
		"-lease duration (env PINBOARD_LEASE, default 10s)",
		`-register-ip-rate rate (env PINBOARD_REGISTER_IP_RATE, default "5/s burst 20")`,
		"-max-body-bytes int (env PINBOARD_MAX_BODY_BYTES, default 67108864)",
		"-worker-dial-timeout duration (env PINBOARD_WORKER_DIAL_TIMEOUT, default 3s)",
		`PINBOARD_TOKEN tokens (environment only, default "")`,
		"-dev bool (no variable, default false)",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("pinboard -h lacks %q", want)
		}
	}
	if n := strings.Count(help, " string ("); n > 1 {
		t.Errorf("pinboard -h shows %d settings as plain strings; want typed ones:\n%s", n, help)
	}
}

// -version prints the module version and VCS revision on stdout and exits
// 0, whatever the configuration (no token needed).
func TestVersion(t *testing.T) {
	proctest.CheckVersion(t, "pinboard", proctest.Run(t, build(t), []string{"-version"}).Stdout)
}

// An unknown PINBOARD_* variable (a typo) is reported by one warning line.
func TestUnknownVariableWarned(t *testing.T) {
	p := startPinboard(t, []string{"-dev"}, "PINBOARD_LEAES=5s")
	waitHealthy(t, p)
	n := 0
	for l := range strings.Lines(p.logs.String()) {
		if strings.Contains(l, "unknown environment variable") {
			n++
			if !strings.Contains(l, "name=PINBOARD_LEAES") || !strings.Contains(l, "didYouMean=PINBOARD_LEASE") || !strings.Contains(l, "level=WARN") {
				t.Errorf("warning %q; want level=WARN naming PINBOARD_LEAES and PINBOARD_LEASE", l)
			}
		}
	}
	if n != 1 {
		t.Fatalf("%d warnings about unknown variables; want 1:\n%s", n, p.logs)
	}
	p.terminate(t)
}

func TestDevMode(t *testing.T) {
	p := startPinboard(t, []string{"-dev"})
	waitHealthy(t, p)
	re := regexp.MustCompile(`dev token \(Authorization: Bearer <token>\): (\S+)`)
	var m []string
	for deadline := time.Now().Add(10 * time.Second); m == nil; {
		if m = re.FindStringSubmatch(p.stdout.String()); m == nil {
			if time.Now().After(deadline) {
				t.Fatalf("no dev token printed on stdout: %q", p.stdout.String())
			}
			time.Sleep(10 * time.Millisecond) // polling another process's output
		}
	}
	if code, body := call(t, "GET", p.public, wire.PathOverview, m[1], nil); code != 200 {
		t.Fatalf("overview with the printed dev token = %d %s", code, body)
	}
	if strings.Contains(p.logs.String(), m[1]) {
		t.Fatal("the dev token reached the log (it belongs on stdout only)")
	}
	// The proxy serves every other path: no worker served /counter yet.
	if code, body := call(t, "GET", p.public, "/counter/alice/", "", nil); code != 404 || !strings.Contains(string(body), "unknown namespace") {
		t.Fatalf("GET /counter/alice/ = %d %s; want the proxy's 404 unknown_namespace", code, body)
	}
	p.terminate(t)
}

// waitLine polls the process's log (another process's output: there is no
// event to await) until a line matches re, and returns that line; "" after
// within.
func (p *proc) waitLine(re *regexp.Regexp, within time.Duration) string {
	for deadline := time.Now().Add(within); ; {
		for l := range strings.Lines(p.logs.String()) {
			if re.MatchString(l) {
				return strings.TrimSpace(l)
			}
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var warnOrError = regexp.MustCompile(`level=(WARN|ERROR)`)

// A pinboard starting against a healthy Redis logs no warning and no error,
// although its components use the store before the first connection is
// made: the janitor's first sweep, the alarm scheduler's first claims, a
// worker registering and a request proxied at once all meet "not connected
// yet" (answered 503 + Retry-After), which is no failure. On an unloaded
// machine that window lasts a few milliseconds, so a plain start shows the
// spurious ERROR only sometimes; here Redis is frozen (SIGSTOP) until every
// component has met the window, and thawed while the first attempt is still
// in flight (rueidis waits 5 s for it).
func TestStartupLogsNoErrorWhileConnecting(t *testing.T) {
	srv := redistest.Start(t)
	srv.Freeze()
	t.Cleanup(srv.Thaw) // before the server's own cleanup kills it
	w := fakeworker.Start(t, "worker-secret")
	p := startPinboard(t, nil, "PINBOARD_REDIS_URL="+srv.URL, "PINBOARD_TOKEN="+token, "PINBOARD_LOG_LEVEL=debug")

	code, body := call(t, "POST", p.public, wire.PathRegister, token, wire.RegisterRequest{
		ClientID: "early-client", Secret: "worker-secret", Namespaces: []string{"/counter"}, AdvertiseURL: w.URL,
		Headroom: 4, Challenge: "reg-early-0123456789abcdefghij", ChallengeValue: fakeworker.Value("reg-early-0123456789abcdefghij"),
	})
	if code != 503 {
		t.Errorf("register while connecting = %d %s; want 503 (retry)", code, body)
	}
	if code, body := call(t, "GET", p.public, "/counter/alice/", "", nil); code != 503 || !strings.Contains(string(body), "unavailable") {
		t.Errorf("a request while connecting = %d %s; want 503 (the directory is unavailable)", code, body)
	}
	// Every component has met the window once its DEBUG line is there; a
	// warning or an error instead fails at once.
	for _, c := range []struct{ who, msg string }{
		{"janitor", `logger=pinned.registry err=.*first attempt is in flight`},
		{"registry call", `msg="store not connected yet" logger=pinned.registry op=`},
		{"alarm scheduler", `msg="alarm store not connected yet; retrying" logger=pinned.alarm`},
		{"placement", `logger=pinned.placement .*store not connected yet|msg="cannot resolve placement \(store not connected yet\)"`},
		{"proxy", `msg="cannot resolve placement yet: the resolver is starting" logger=pinned.proxy`},
	} {
		re := regexp.MustCompile(c.msg + `|level=(WARN|ERROR)`)
		line := p.waitLine(re, 10*time.Second)
		if line == "" || warnOrError.MatchString(line) {
			t.Fatalf("waiting for the DEBUG line of the %s while the first connection is made, found %q; want no warning or error:\n%s", c.who, line, p.logs)
		}
	}
	if strings.Contains(p.logs.String(), `msg="store connected"`) {
		t.Fatalf("the store connected while Redis was frozen:\n%s", p.logs)
	}
	srv.Thaw()
	if p.waitLine(regexp.MustCompile(`msg="store connected"|cannot reach redis`), 10*time.Second) == "" {
		t.Fatalf("no store connected line within 10 s of the thaw:\n%s", p.logs)
	}
	waitHealthy(t, p)
	if strings.Contains(p.logs.String(), "cannot reach redis") {
		t.Fatalf("the first connection attempt ended before the thaw (a loaded machine: the test's window is rueidis's 5 s dial timeout):\n%s", p.logs)
	}
	for l := range strings.Lines(p.logs.String()) {
		if warnOrError.MatchString(l) {
			t.Errorf("startup against a healthy Redis logged %s", strings.TrimSpace(l))
		}
	}
	p.terminate(t)
}
