// Package console tests the pinboard's operator console in a real headless
// Chromium (driven over the DevTools protocol by chromedp) against real
// processes: a redis-server, the pinboard binary and two counter workers in
// fleet mode, all on 127.0.0.1. It proves that the page lists both workers,
// that a lookup shows an id's holder, that evicting an id gives its next
// request a fresh instance, and that a drain marks the worker draining, on
// Redis and with `pinboard -dev`.
//
// Chromium is Debian's `chromium` package (.ci/run installs it). Without it
// the test skips, except in CI (internal/testkit/ci: PINNED_CI or CI set),
// where it fails. With -console-screenshot=<path> it saves a screenshot of
// the page there (docs/console.png shows examples/fleet under some traffic
// instead: docs/console.md says how it was made).
package console

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/ci"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

var screenshot = flag.String("console-screenshot", "", "save a PNG of the console at this path")

const token = "console-deployment-token-0123456789"

var builder proctest.Builder

func TestMain(m *testing.M) {
	code := m.Run()
	builder.Cleanup()
	os.Exit(code)
}

var (
	pinboardReady = regexp.MustCompile(`msg="pinboard listening".* public=(\S+) admin=(\S+)`)
	counterReady  = regexp.MustCompile(`msg="counter demo listening".* addr=(\S+)`)
)

// chromiumPath finds Debian's chromium; it skips the test when there is
// none, except in CI (internal/testkit/ci), which installs it.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	ci.Missing(t, "chromium is not installed (Debian package chromium); the console's browser test needs it")
	return ""
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

var client = &fasthttp.Client{MaxIdleConnDuration: time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}

// call sends one request (with the token when auth) and decodes a JSON
// answer into out (when not nil).
func call(t *testing.T, method, url string, auth bool, out any) int {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	if auth {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if err := client.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	if out != nil && resp.StatusCode() < 300 {
		if err := json.Unmarshal(resp.Body(), out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, url, err, resp.Body())
		}
	}
	return resp.StatusCode()
}

// eventually polls cond (the state of other processes) until it holds.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond) // polling other processes: no event to wait on
	}
}

type counterState struct {
	ID       string `json:"id"`
	Count    int64  `json:"count"`
	Instance string `json:"instance"`
}

// The console against a pinboard on Redis and one with -dev (its memory
// store).
func TestConsoleInBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	t.Run("redis", func(t *testing.T) {
		rs := redistest.Start(t)
		testConsole(t, chromium, nil, "PINBOARD_REDIS_URL="+rs.URL, "PINBOARD_RESTART_FENCE=0s")
	})
	t.Run("dev", func(t *testing.T) { testConsole(t, chromium, []string{"-dev"}) })
}

func testConsole(t *testing.T, chromium string, args []string, env ...string) {
	pb := proctest.Start(t, proctest.Spec{
		Name: "pinboard",
		Bin:  builder.Build(t, "github.com/pinned-go/pinned/cmd/pinboard"),
		Args: args,
		Env: append([]string{"PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0",
			"PINBOARD_TOKEN=" + token}, env...),
		Ready: pinboardReady,
	})
	public, admin := "http://"+pb.Ready()[1], "http://"+pb.Ready()[2]
	var addrs []string
	for i := range 2 {
		addr := freeAddr(t)
		addrs = append(addrs, addr)
		proctest.Start(t, proctest.Spec{
			Name: fmt.Sprintf("counter%d", i+1),
			Bin:  builder.Build(t, "github.com/pinned-go/pinned/examples/counter"),
			Env: []string{"PINNED_LISTEN=" + addr, "PINNED_PINBOARD_URL=" + public, "PINNED_TOKEN=" + token,
				"PINNED_ADVERTISE_URL=http://" + addr},
			Ready: counterReady,
		})
	}
	var workers wire.WorkersResponse
	eventually(t, 20*time.Second, "both counters register", func() bool {
		call(t, "GET", public+wire.PathWorkers, true, &workers)
		verified := 0
		for _, w := range workers.Workers {
			if w.Verified {
				verified++
			}
		}
		return verified == 2
	})
	clientOf := map[string]string{} // session -> client
	for _, w := range workers.Workers {
		clientOf[w.SessionID] = w.ClientID
	}

	// alice gets an instance with a count of 2.
	var st counterState
	for range 2 {
		if code := call(t, "POST", public+"/counter/alice/incr", false, nil); code != 200 {
			t.Fatalf("POST /counter/alice/incr = %d", code)
		}
	}
	if code := call(t, "GET", public+"/counter/alice/", false, &st); code != 200 || st.Count != 2 {
		t.Fatalf("GET /counter/alice/ = %d %+v; want count 2", code, st)
	}
	var placed wire.PlacementInfo
	if code := call(t, "GET", public+wire.PathPlacements+"/counter/alice", true, &placed); code != 200 || !placed.Live {
		t.Fatalf("placement of alice = %d %+v", code, placed)
	}

	// The browser: headless, no network but 127.0.0.1, a fresh profile.
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 1000))
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// Every uncaught exception and console error of the page fails the test.
	var pageErrs struct {
		sync.Mutex
		list []string
	}
	if err := chromedp.Listen(bctx, func(ev any) {
		var msg string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			msg = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				msg += " " + ev.ExceptionDetails.Exception.Description
			}
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				msg = "console.error"
			}
		}
		if msg != "" {
			pageErrs.Lock()
			pageErrs.list = append(pageErrs.list, msg)
			pageErrs.Unlock()
		}
	}); err != nil {
		t.Fatalf("start the browser: %v", err)
	}
	defer func() {
		pageErrs.Lock()
		defer pageErrs.Unlock()
		for _, e := range pageErrs.list {
			t.Errorf("the page reported %s", e)
		}
	}()
	if err := chromedp.Do(bctx, chromedp.Navigate(admin+"/")); err != nil {
		t.Fatalf("open the console: %v", err)
	}
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// clickNow clicks the element sel names in one step inside the page:
	// the page re-renders its tables and the lookup every 2 s, so a click
	// that finds a node first and clicks it in a second call can find it
	// replaced ("Could not find node with given id"). A button's armed
	// state survives a re-render (the page keeps it by action).
	clickNow := func(what, sel string) {
		t.Helper()
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
			`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true })()`, sel)))
		if err != nil || !ok {
			t.Fatalf("%s: clicking %s: found %v, %v", what, sel, ok, err)
		}
	}
	// waitFor polls a JavaScript predicate in the page (the page refreshes
	// itself every 2 s).
	waitFor := func(what, predicate string, within time.Duration) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](predicate,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(within))); err != nil {
			text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("%s: %v\npage:\n%s", what, err, text)
		}
	}

	// The token is asked once, then every call carries it.
	do("enter the token", chromedp.WaitVisible(chromedp.ID("token-input")),
		chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.CSS(`#token-form button`)))
	if stored, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("pinboard.console.token")`)); stored != token {
		t.Fatalf("sessionStorage token = %q; want the token", stored)
	}
	if cookies, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.cookie`)); cookies != "" {
		t.Fatalf("the console set cookies: %q", cookies)
	}

	// Both workers are listed.
	var rowsJS []string
	for _, w := range workers.Workers {
		rowsJS = append(rowsJS, fmt.Sprintf(`document.querySelector('#workers tr[data-client=%q]')`, w.ClientID))
	}
	waitFor("both workers listed", strings.Join(rowsJS, " && ")+
		` && document.querySelectorAll('#workers tbody tr[data-client]').length === 2`, 15*time.Second)
	waitFor("the namespace listed", `document.querySelector('#namespaces tr[data-namespace="/counter"]')`, 10*time.Second)

	// A lookup shows the holder.
	do("look alice up", chromedp.SendKeys(chromedp.ID("lookup-ns"), "/counter"), chromedp.SendKeys(chromedp.ID("lookup-id"), "alice"),
		chromedp.Click(chromedp.CSS(`#lookup-form button`)))
	waitFor("the lookup shows alice's holder", fmt.Sprintf(
		`(document.querySelector('#lookup-result .holder') || {}).textContent === %q && document.querySelector('#lookup-result .session').textContent === %q`,
		placed.ClientID, placed.SessionID), 10*time.Second)

	// Evict (a second click confirms): the next request gets a fresh
	// instance, within a heartbeat interval (3 s) plus the close.
	evict := `#lookup-result button[data-action="evict:/counter/alice"]`
	waitFor("alice's evict button", fmt.Sprintf(`document.querySelector(%q)`, evict), 10*time.Second)
	clickNow("evict alice", evict)
	waitFor("the evict button armed", fmt.Sprintf(`document.querySelector(%q)`, evict+".armed"), 10*time.Second)
	clickNow("confirm the evict", evict+".armed")
	waitFor("the evict is reported", `document.querySelector('#flash').textContent.includes('evict /counter/alice: the holder closes it')`, 10*time.Second)
	evicted := time.Now()
	eventually(t, 15*time.Second, "alice's next request gets a fresh instance", func() bool {
		var now counterState
		return call(t, "GET", public+"/counter/alice/", false, &now) == 200 && now.Instance != st.Instance && now.Count == 0
	})
	t.Logf("a fresh instance of alice %v after the evict", time.Since(evicted).Round(time.Millisecond))
	// The lookup on display follows the new placement.
	var moved wire.PlacementInfo
	if code := call(t, "GET", public+wire.PathPlacements+"/counter/alice", true, &moved); code != 200 {
		t.Fatalf("placement of alice after the evict = %d", code)
	}
	waitFor("the lookup shows alice's new placement", fmt.Sprintf(
		`(document.querySelector('#lookup-result .session') || {}).textContent === %q`, moved.SessionID), 10*time.Second)

	// Drain one worker (a second click confirms): its row says draining.
	target := workers.Workers[0].ClientID
	drain := fmt.Sprintf(`#workers tr[data-client=%q] button[data-action="drain:%s"]`, target, target)
	waitFor("the drain button", fmt.Sprintf(`document.querySelector(%q)`, drain), 10*time.Second)
	clickNow("drain", drain)
	waitFor("the drain button armed", fmt.Sprintf(`document.querySelector(%q)`, drain+".armed"), 10*time.Second)
	clickNow("confirm the drain", drain+".armed")
	waitFor("the drained worker's row says draining", fmt.Sprintf(
		`(document.querySelector('#workers tr[data-client=%q] td.draining') || {}).textContent?.startsWith('draining')`, target), 20*time.Second)
	other := workers.Workers[1].ClientID
	if txt, _ := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector('#workers tr[data-client=%q] td.draining').textContent`, other))); txt != "no" {
		t.Fatalf("the other worker's draining cell = %q; want no", txt)
	}

	if *screenshot != "" && t.Name() == "TestConsoleInBrowser/redis" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// A wrong token is refused and the token asked again.
	do("forget the token", chromedp.Click(chromedp.ID("forget")), chromedp.WaitVisible(chromedp.ID("token-input")),
		chromedp.SendKeys(chromedp.ID("token-input"), "not-the-deployment-token"), chromedp.Click(chromedp.CSS(`#token-form button`)))
	waitFor("a wrong token is refused", `!document.querySelector('#token-box').hidden && document.querySelector('#token-error').textContent !== ''`, 10*time.Second)

}
