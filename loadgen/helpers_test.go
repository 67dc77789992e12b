package loadgen

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(targetProcessEnv) != "" {
		serveTargetProcess()
		return
	}
	goleak.VerifyTestMain(m,
		// fasthttp's HostClient closes idle connections from a goroutine that
		// sleeps up to MaxIdleConnDuration before noticing it has none left.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		// fasthttp's default TCP dialer caches resolved addresses and
		// cleans the cache from a process-wide goroutine.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		// The test targets' fasthttp.Server: its worker-pool cleaner notices
		// Shutdown only after sleeping MaxIdleWorkerDuration, and the Date
		// header updater is process-wide.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}

// fakeExec is an executor whose request is a function: the scheduler tests
// use it inside a synctest bubble, where time.Sleep advances fake time.
type fakeExec func(id []byte, o *outcome)

func (f fakeExec) exec(id []byte, o *outcome) { f(id, o) }
func (fakeExec) close()                       {}

// withExec installs f as every worker's executor, on the fasthttp engine
// (the only one with executors).
func withExec(r *Runner, f func(id []byte, o *outcome)) {
	r.cfg.Engine = EngineFastHTTP
	r.newExec = func(*worker, int) executor { return fakeExec(f) }
}

// mustNew is New that fails the test on error.
func mustNew(t testing.TB, cfg Config) *Runner {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

// target is an in-process fasthttp server on an in-memory listener.
type target struct {
	ln  *fasthttputil.InmemoryListener
	srv *fasthttp.Server
	wg  sync.WaitGroup
}

// startTarget serves h until the test ends. Configure the Runner with
// target.config.
func startTarget(t testing.TB, h fasthttp.RequestHandler) *target {
	t.Helper()
	tg := &target{ln: fasthttputil.NewInmemoryListener(), srv: &fasthttp.Server{Handler: h, Logger: quiet{}}}
	tg.wg.Go(func() { _ = tg.srv.Serve(tg.ln) })
	t.Cleanup(func() {
		_ = tg.srv.Shutdown()
		tg.wg.Wait()
	})
	return tg
}

// config returns a Config aimed at the target.
func (tg *target) config() Config {
	return Config{
		URL:  "http://target.test",
		Dial: func(string) (net.Conn, error) { return tg.ln.Dial() },
	}
}

// startTCPTarget serves h on a real 127.0.0.1 port until the test ends and
// returns its base URL.
func startTCPTarget(t testing.TB, srv *fasthttp.Server) string {
	t.Helper()
	srv.Logger = quiet{}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() {
		_ = srv.Shutdown()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}

// quiet discards fasthttp's server log (connections closed by the client
// at the end of each run are expected).
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// targetProcessEnv makes the test binary serve a tiny target instead of
// running tests: a target in its own process shares no Go scheduler with
// the generator under test.
const targetProcessEnv = "LOADGEN_TEST_TARGET_PROCESS"

// serveTargetProcess serves {"count":1} on a 127.0.0.1 port, prints the
// port's address on stdout and exits when stdin closes.
func serveTargetProcess() {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"count":1}`) }, Logger: quiet{}}
	go func() { _ = srv.Serve(ln) }()
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// startProcessTarget runs serveTargetProcess in a child process until the
// test ends and returns its base URL.
func startProcessTarget(t testing.TB) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), targetProcessEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error") {
		t.Fatalf("target process: %q, %v", line, err)
	}
	return "http://" + strings.TrimSpace(line)
}
