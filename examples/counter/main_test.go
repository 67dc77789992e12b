package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/pinned-go/pinned/examples/counter/countercmd"
	"github.com/pinned-go/pinned/fence"
	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/promcheck"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// builder builds the counter (and a pinboard) for the tests that run them
// as processes.
var builder proctest.Builder

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m, builder.Cleanup) }

// TestCommandLine runs the built counter: every setting it cannot run
// with, alone or together, is exit status 2 with a message naming it and
// what is wrong, before anything starts; -h and -version print to stdout
// and exit 0.
func TestCommandLine(t *testing.T) {
	// Never the default port: a command that wrongly starts must not take
	// 127.0.0.1:8080 (a case's -listen, the flag, wins).
	proctest.CheckCommandLine(t, builder.Build(t, "github.com/pinned-go/pinned/examples/counter"), "counter", []proctest.Case{
		{Args: []string{"-listen", ":99999"}, Code: 2, Stderr: `counter: -listen (PINNED_LISTEN)=":99999": want host:port with a port from 0 to 65535`},
		{Env: []string{"PINNED_MAX_INSTANCES=-3"}, Code: 2, Stderr: `counter: PINNED_MAX_INSTANCES="-3": want a positive number of instances`},
		{Env: []string{"PINNED_PINBOARD_URL=http://127.0.0.1:1"}, Code: 2,
			Stderr: "counter: fleet mode needs PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL; missing [PINNED_TOKEN PINNED_ADVERTISE_URL]"},
		{Args: []string{"-admin-listen", ":99999"}, Code: 2, Stderr: `counter: -admin-listen (PINNED_ADMIN_LISTEN)=":99999": want host:port with a port from 0 to 65535`, Not: "loopback"},
		{Args: []string{"-admin-listen", "0.0.0.0:9091"}, Code: 2, Stderr: "the admin listener must be on a loopback address, such as 127.0.0.1:9091"},
		{Args: []string{"-shutdown-timeout", "0s"}, Code: 2, Stderr: `-shutdown-timeout (PINNED_SHUTDOWN_TIMEOUT)="0s": want a positive duration`},
		{Env: []string{"PINNED_PINBOARD_URL=ftp://127.0.0.1:1", "PINNED_TOKEN=t", "PINNED_ADVERTISE_URL=http://127.0.0.1:2"}, Code: 2, Stderr: "PinboardURL"},
		{Args: []string{"-nope"}, Code: 2, Stderr: "counter: flag provided but not defined: -nope (see counter -h)"},
	}, "PINNED_LISTEN=127.0.0.1:0")
}

// TestFleetModeNamesThePinboardAndTheTokenVariable runs the built counter
// in fleet mode with a wrong token against a real pinboard: its "try" hint
// is a request through the pinboard (its own listener answers only the
// pinboard), and the refusal names PINNED_TOKEN, the variable its operator
// sets, not a Go field.
func TestFleetModeNamesThePinboardAndTheTokenVariable(t *testing.T) {
	pb := proctest.Start(t, proctest.Spec{
		Name:  "pinboard",
		Bin:   builder.Build(t, "github.com/pinned-go/pinned/cmd/pinboard"),
		Args:  []string{"-dev"},
		Env:   []string{"PINBOARD_TOKEN=right-token-0123456789", "PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0"},
		Ready: regexp.MustCompile(`msg="pinboard listening".* public=(\S+)`),
	})
	pinboardURL := "http://" + pb.Ready()[1]
	addr := proctest.FreeAddr(t)
	c := proctest.Start(t, proctest.Spec{
		Name: "counter",
		Bin:  builder.Build(t, "github.com/pinned-go/pinned/examples/counter"),
		Env: []string{"PINNED_LISTEN=" + addr, "PINNED_ADVERTISE_URL=http://" + addr, "PINNED_PINBOARD_URL=" + pinboardURL,
			"PINNED_TOKEN=wrong-token-0123456789"},
		Ready: regexp.MustCompile(`msg="counter demo listening".* try="([^"]*)"`),
	})
	if want := "curl -X POST " + pinboardURL + "/counter/alice/incr"; c.Ready()[1] != want {
		t.Errorf("try=%q; want %q (through the pinboard)", c.Ready()[1], want)
	}
	refused := regexp.MustCompile(`level=ERROR msg="registration failed: the pinboard refused the deployment token \(401\); set PINNED_TOKEN to the pinboard's token"`)
	if c.WaitLog(refused, 20*time.Second) == nil || strings.Contains(c.Log(), "Config.Token") {
		t.Errorf("the refused token does not name PINNED_TOKEN alone:\n%s", c.Log())
	}
}

const timeout = 10 * time.Second

// env is the environment (as os.Environ) holding m.
func env(m map[string]string) []string {
	var e []string
	for k, v := range m {
		e = append(e, k+"="+v)
	}
	return e
}

func TestLoadOptions(t *testing.T) {
	f := func(args []string, vars map[string]string, want string) {
		t.Helper()
		o, err := loadOptions(args, env(vars), io.Discard)
		if err != nil {
			t.Fatalf("loadOptions(%q, %v): %v", args, vars, err)
		}
		if o.counter.Listen != want {
			t.Errorf("loadOptions(%q, %v).listen = %q; want %q", args, vars, o.counter.Listen, want)
		}
	}
	f(nil, nil, "127.0.0.1:8080")
	f(nil, map[string]string{"PINNED_LISTEN": "127.0.0.1:9"}, "127.0.0.1:9")
	f([]string{"-listen", "127.0.0.1:7"}, map[string]string{"PINNED_LISTEN": "127.0.0.1:9"}, "127.0.0.1:7")
	if o, err := loadOptions(nil, env(map[string]string{"PINNED_MAX_BODY_BYTES": "1000"}), io.Discard); err != nil || o.counter.MaxBodyBytes != 1000 {
		t.Errorf("PINNED_MAX_BODY_BYTES=1000: %d, %v; want 1000", o.counter.MaxBodyBytes, err)
	}
	if o, err := loadOptions([]string{"-max-body-bytes", "7"}, env(map[string]string{"PINNED_MAX_BODY_BYTES": "1000"}), io.Discard); err != nil || o.counter.MaxBodyBytes != 7 {
		t.Errorf("-max-body-bytes 7 over PINNED_MAX_BODY_BYTES: %d, %v; want 7", o.counter.MaxBodyBytes, err)
	}
	if _, err := loadOptions(nil, env(map[string]string{"PINNED_MAX_BODY_BYTES": "-1"}), io.Discard); err == nil {
		t.Error("PINNED_MAX_BODY_BYTES=-1 was accepted")
	}
	if _, err := loadOptions([]string{"-nope"}, env(nil), io.Discard); err == nil {
		t.Error("an unknown flag was accepted")
	}
	if o, err := loadOptions(nil, env(map[string]string{countercmd.EnvPersist: "redis://127.0.0.1:1/0"}), io.Discard); err != nil || o.counter.Persist != "redis://127.0.0.1:1/0" {
		t.Errorf("%s: persist = %q, %v", countercmd.EnvPersist, o.counter.Persist, err)
	}
	if o, _ := loadOptions([]string{"-persist", "redis://127.0.0.1:2/0"}, env(map[string]string{countercmd.EnvPersist: "redis://127.0.0.1:1/0"}), io.Discard); o.counter.Persist != "redis://127.0.0.1:2/0" {
		t.Errorf("-persist does not beat %s: %q", countercmd.EnvPersist, o.counter.Persist)
	}
	if _, err := loadOptions([]string{"-persist", "mysql://x"}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "-persist") {
		t.Errorf("a bad -persist URL: %v; want an error naming -persist", err)
	}
	if _, err := loadOptions(nil, env(map[string]string{"PINNED_IDLE_TIMEOUT": "soon"}), io.Discard); err == nil || !strings.Contains(err.Error(), "PINNED_IDLE_TIMEOUT") {
		t.Errorf("a bad PINNED_IDLE_TIMEOUT gave %v; want an error naming it", err)
	}
	o, err := loadOptions(nil, []string{"PINNED_LISTEM=x", "PINNED_TOKEN=t",
		"PINNED_PINBOARD_URL=http://127.0.0.1:1", "PINNED_ADVERTISE_URL=http://127.0.0.1:2"}, io.Discard)
	if err != nil || len(o.unknown) != 1 || o.unknown[0].Name != "PINNED_LISTEM" || o.unknown[0].Near != "PINNED_LISTEN" {
		t.Errorf("unknown variables %+v, %v; want PINNED_LISTEM (near PINNED_LISTEN) only", o.unknown, err)
	}
	// The demo has no test-only setting: the test fixture's variables
	// (test/app/counter) are unknown here, reported like any other.
	o, err = loadOptions(nil, []string{"PINNED_HISTORY=/tmp/h.jsonl", "PINNED_FAULTS=no_self_abort"}, io.Discard)
	if err != nil || len(o.unknown) != 2 || o.unknown[0].Name != "PINNED_HISTORY" || o.unknown[1].Name != "PINNED_FAULTS" {
		t.Errorf("unknown variables %+v, %v; want PINNED_HISTORY and PINNED_FAULTS", o.unknown, err)
	}
	var help strings.Builder
	if _, err := loadOptions([]string{"-h"}, nil, &help); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h = %v; want flag.ErrHelp (exit 0)", err)
	}
	for _, want := range []string{
		"-listen host:port (env PINNED_LISTEN, default 127.0.0.1:8080)",
		"-idle-timeout duration (env PINNED_IDLE_TIMEOUT, default 5m0s)",
		"-max-instances int (env PINNED_MAX_INSTANCES, default 10000)",
		`-admin-listen host:port (env PINNED_ADMIN_LISTEN, default "")`,
		`PINNED_TOKEN token (environment only, default "")`,
		`-persist url (env PINNED_PERSIST, default "")`,
	} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, help.String())
		}
	}
	if strings.Contains(help.String(), "HISTORY") || strings.Contains(help.String(), "chaos") {
		t.Errorf("-h lists a test-only setting:\n%s", help.String())
	}
	if _, err := loadOptions(nil, env(map[string]string{"PINNED_PINBOARD_URL": "http://127.0.0.1:1"}), io.Discard); cmdline.Status(err) != cmdline.ExitUsage ||
		!strings.Contains(err.Error(), "fleet mode") {
		t.Errorf("PINNED_PINBOARD_URL alone: %v; want a usage error about fleet mode", err)
	}
}

// TestDemo runs the demo on a real 127.0.0.1 listener and walks through
// everything the README promises.
func TestDemo(t *testing.T) {
	opts, err := loadOptions([]string{"-listen", "127.0.0.1:0"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan countercmd.Listening, 1)
	done := make(chan error, 1)
	go func() {
		done <- countercmd.Run(ctx, opts.counter, countercmd.Extras{}, slog.New(slog.DiscardHandler), func(l countercmd.Listening) { addrs <- l })
	}()
	var base string
	select {
	case l := <-addrs:
		base = "http://" + l.Addr.String()
		if l.Admin != nil {
			t.Errorf("local mode without -admin-listen has an admin listener on %v", l.Admin)
		}
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: timeout}
	defer tr.CloseIdleConnections()
	call := func(method, path string, want int) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s = %d %s; want %d", method, path, resp.StatusCode, b, want)
		}
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return m
	}

	if m := call("GET", "/healthz", 200); m["ok"] != true {
		t.Errorf("healthz = %v", m)
	}
	first := call("GET", "/counter/alice/", 200)
	if first["id"] != "alice" || first["count"] != 0.0 || first["instance"] == "" || first["epoch"].(float64) <= 0 {
		t.Errorf("GET /counter/alice/ = %v; want id alice, count 0, an instance nonce, an epoch", first)
	}

	// A websocket sees the pushes.
	d := websocket.Dialer{HandshakeTimeout: timeout}
	ws, resp, err := d.Dial(strings.Replace(base, "http", "ws", 1)+"/counter/alice/ws", nil)
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	resp.Body.Close()
	defer ws.Close()
	_ = ws.SetReadDeadline(time.Now().Add(timeout))
	if err := ws.WriteMessage(websocket.TextMessage, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := ws.ReadMessage(); err != nil || string(msg) != "hello" {
		t.Fatalf("echo = %q, %v; want hello", msg, err)
	}

	for i := 1; i <= 3; i++ {
		if m := call("POST", "/counter/alice/incr", 200); m["count"] != float64(i) || m["instance"] != first["instance"] {
			t.Errorf("incr %d = %v", i, m)
		}
	}
	// Pushes coalesce: read until the latest count arrives.
	for {
		_, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("no push of count 3: %v", err)
		}
		if string(msg) == `{"count":3}` {
			break
		}
	}

	// The stream.
	req, _ := http.NewRequest("GET", base+"/counter/alice/stream?n=4", nil)
	sresp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(sresp.Body)
	lines := 0
	for sc.Scan() {
		var l struct{ Line, Count int }
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Line != lines || l.Count != 3 {
			t.Errorf("stream line %d = %q", lines, sc.Text())
		}
		lines++
	}
	sresp.Body.Close()
	if lines != 4 {
		t.Errorf("stream lines = %d; want 4", lines)
	}
	call("GET", "/counter/alice/stream?n=x", 400)

	// The background task.
	call("POST", "/counter/alice/incr-later?delay=10ms", 202)
	for {
		_, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("no push from the task: %v", err)
		}
		if string(msg) == `{"count":4}` {
			break
		}
	}

	// The alarm (local mode: an in-process timer): 202, listed, and the
	// count grows by one when it fires.
	if m := call("POST", "/counter/alice/alarm?delay=50ms", 202); m["alarm"] != "incr" {
		t.Errorf("POST /alarm = %v", m)
	}
	for {
		_, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("no push from the alarm: %v", err)
		}
		if string(msg) == `{"count":5}` {
			break
		}
	}
	call("POST", "/counter/alice/alarm?delay=1h&name=later", 202)
	req, _ = http.NewRequest("GET", base+"/counter/alice/alarms", nil)
	aresp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	ab, _ := io.ReadAll(aresp.Body)
	aresp.Body.Close()
	if !strings.Contains(string(ab), `"name":"later"`) || strings.Contains(string(ab), `"name":"incr"`) {
		t.Errorf("GET /alarms = %s; want only the pending alarm", ab)
	}
	call("DELETE", "/counter/alice/alarm?name=later", 204)
	call("POST", "/counter/alice/alarm?delay=-1s", 400)
	call("POST", "/counter/alice/alarm?delay=1s&name=bad/name", 400)

	call("GET", "/counter/bob/", 200)
	call("GET", "/counter/..", 400)
	call("GET", "/nope", 404)
	req, _ = http.NewRequest("GET", base+"/metrics", nil)
	mresp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(mb), `pinned_instances{namespace="/counter"} 2`) {
		t.Errorf("metrics lack pinned_instances 2:\n%s", mb)
	}
	// metricshttp: valid exposition (promtool when installed), with the
	// runtime and process metrics.
	fams := promcheck.Strict(t, "counter /metrics", mb)
	for _, name := range []string{"pinned_activations_total", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}

	// Shutdown closes the websocket and returns cleanly.
	cancel()
	if _, _, err := ws.ReadMessage(); err == nil {
		t.Error("websocket still open after shutdown")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run returned %v; want nil", err)
		}
	case <-time.After(timeout):
		t.Fatal("run did not return after its context ended")
	}
}

// demo is one run of the counter on a 127.0.0.1 listener.
type demo struct {
	base   string
	cancel context.CancelFunc
	done   chan error
	client *http.Client
}

func startDemo(t *testing.T, args ...string) *demo {
	t.Helper()
	opts, err := loadOptions(append([]string{"-listen", "127.0.0.1:0"}, args...), nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := &demo{cancel: cancel, done: make(chan error, 1)}
	addrs := make(chan countercmd.Listening, 1)
	go func() {
		d.done <- countercmd.Run(ctx, opts.counter, countercmd.Extras{}, slog.New(slog.DiscardHandler), func(l countercmd.Listening) { addrs <- l })
	}()
	select {
	case l := <-addrs:
		d.base = "http://" + l.Addr.String()
	case err := <-d.done:
		t.Fatalf("run: %v", err)
	}
	tr := &http.Transport{}
	d.client = &http.Client{Transport: tr, Timeout: timeout}
	t.Cleanup(tr.CloseIdleConnections)
	return d
}

// state is the JSON of GET / and POST /incr.
type state struct {
	Count    int64
	Instance string
	Epoch    uint64
}

func (d *demo) call(t *testing.T, method, path string, want int) state {
	t.Helper()
	req, _ := http.NewRequest(method, d.base+path, nil)
	resp, err := d.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var s state
	if err := json.Unmarshal(b, &s); resp.StatusCode != want || err != nil {
		t.Fatalf("%s %s = %d %s; want %d", method, path, resp.StatusCode, b, want)
	}
	return s
}

func (d *demo) stop(t *testing.T) {
	t.Helper()
	d.cancel()
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("run returned %v", err)
		}
	case <-time.After(timeout):
		t.Fatal("run did not return after its context ended")
	}
}

// TestPersist: with -persist the count outlives its instance and its
// process: stored (fenced by epoch) before each answer, loaded by the next
// activation, which has a larger epoch, also in a restarted process.
func TestPersist(t *testing.T) {
	srv := redistest.Start(t)
	d := startDemo(t, "-persist", srv.URL)
	var last state
	for i := int64(1); i <= 3; i++ {
		last = d.call(t, "POST", "/counter/alice/incr", 200)
		if last.Count != i || last.Epoch == 0 {
			t.Fatalf("incr %d = %+v", i, last)
		}
	}
	d.call(t, "POST", "/counter/alice/incr-later?delay=0s", 202) // 202: its effect is stored too
	d.stop(t)

	rdb := redistest.Client(t, srv.URL)
	v, e, err := fence.Get(context.Background(), rdb, "counter:alice")
	if err != nil || v != "4" || e != last.Epoch {
		t.Fatalf("stored count = %q epoch %d (%v); want 4 under epoch %d", v, e, err, last.Epoch)
	}

	d = startDemo(t, "-persist", srv.URL)
	got := d.call(t, "GET", "/counter/alice/", 200)
	if got.Count != 4 || got.Epoch <= last.Epoch || got.Instance == last.Instance {
		t.Fatalf("after a restart: %+v; want count 4 from the store, a new instance, an epoch above %d", got, last.Epoch)
	}
	if n := d.call(t, "POST", "/counter/alice/incr", 200); n.Count != 5 {
		t.Fatalf("incr after the restart = %+v; want 5", n)
	}
	// The old activation's epoch is fenced out.
	if err := fence.Set(context.Background(), rdb, "counter:alice", last.Epoch, "99"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("a write under the old epoch: %v; want stale", err)
	}
	d.stop(t)
}
