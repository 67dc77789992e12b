package main

import (
	"errors"
	"flag"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/testkit/history"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
)

// builder builds the fixture and a pinboard for the tests that run them as
// processes.
var builder proctest.Builder

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m, builder.Cleanup) }

const (
	fixture = "github.com/pinned-go/pinned/test/app/counter"
	token   = "fixture-test-token-0123456789"
	timeout = 20 * time.Second
)

var (
	pinboardReady = regexp.MustCompile(`msg="pinboard listening".* public=(\S+)`)
	counterReady  = regexp.MustCompile(`msg="counter demo listening".* addr=(\S+)`)
)

// TestCommandLine runs the built fixture: the demo's settings are refused
// as the demo refuses them, a history file it cannot create is exit status
// 1 naming PINNED_HISTORY, and -h and -version work.
func TestCommandLine(t *testing.T) {
	proctest.CheckCommandLine(t, builder.Build(t, fixture), "counter", []proctest.Case{
		{Args: []string{"-listen", ":99999"}, Code: 2, Stderr: `counter: -listen (PINNED_LISTEN)=":99999": want host:port with a port from 0 to 65535`},
		{Env: []string{"PINNED_PINBOARD_URL=http://127.0.0.1:1"}, Code: 2,
			Stderr: "counter: fleet mode needs PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL; missing [PINNED_TOKEN PINNED_ADVERTISE_URL]"},
		{Env: []string{"PINNED_HISTORY=" + filepath.Join(t.TempDir(), "missing", "h.jsonl")}, Code: 1, Stderr: "counter: PINNED_HISTORY: history: open "},
	}, "PINNED_LISTEN=127.0.0.1:0")
}

// TestLoadOptions: the fixture reads PINNED_HISTORY, knows PINNED_FAULTS
// (no warning), lists both in -h beside the demo's settings, and keeps
// reporting an unknown variable.
func TestLoadOptions(t *testing.T) {
	o, err := loadOptions([]string{"-idle-timeout", "3s"}, []string{"PINNED_HISTORY=/tmp/w1.jsonl", "PINNED_FAULTS=no_self_abort", "PINNED_LISTEM=x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.history != "/tmp/w1.jsonl" || o.counter.IdleTimeout != 3*time.Second {
		t.Errorf("history %q, idle timeout %v; want /tmp/w1.jsonl and 3s", o.history, o.counter.IdleTimeout)
	}
	if len(o.unknown) != 1 || o.unknown[0].Name != "PINNED_LISTEM" {
		t.Errorf("unknown variables %+v; want PINNED_LISTEM only", o.unknown)
	}
	var help strings.Builder
	if _, err := loadOptions([]string{"-h"}, nil, &help); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h = %v; want flag.ErrHelp", err)
	}
	for _, want := range []string{`PINNED_HISTORY path (environment only, default "")`, "PINNED_FAULTS",
		"-listen host:port (env PINNED_LISTEN, default 127.0.0.1:8080)", `-persist url (env PINNED_PERSIST, default "")`} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, help.String())
		}
	}
}

// TestBlob runs the built fixture in local mode: GET /blob streams exactly
// size bytes of the pattern and refuses a bad size with a 400 naming it,
// beside the demo's routes.
func TestBlob(t *testing.T) {
	c := proctest.Start(t, proctest.Spec{
		Name:  "counter",
		Bin:   builder.Build(t, fixture),
		Env:   []string{"PINNED_LISTEN=127.0.0.1:0"},
		Ready: counterReady,
	})
	base := "http://" + c.Ready()[1]
	for _, size := range []int{0, 1, 100_000, 3 << 20} {
		code, body, err := fasthttp.GetTimeout(nil, base+"/counter/b/blob?size="+strconv.Itoa(size), timeout)
		if err != nil || code != 200 || len(body) != size {
			t.Fatalf("blob size=%d: %d, %d bytes, %v", size, code, len(body), err)
		}
		if size > 0 && (body[0] != 'a' || body[size-1] != byte('a'+(size-1)%(32<<10)%26)) {
			t.Fatalf("blob size=%d: pattern broken", size)
		}
	}
	if code, body, err := fasthttp.GetTimeout(nil, base+"/counter/b/blob?size=-1", timeout); err != nil || code != 400 || !strings.Contains(string(body), "size") {
		t.Errorf("blob size=-1 = %d %s %v; want 400 naming size", code, body, err)
	}
	if code, body, err := fasthttp.GetTimeout(nil, base+"/counter/b/", timeout); err != nil || code != 200 || !strings.Contains(string(body), `"id":"b"`) {
		t.Errorf("GET /counter/b/ = %d %s %v; want the demo's answer", code, body, err)
	}
}

// TestHistory runs the built fixture in fleet mode with PINNED_HISTORY
// against a real pinboard (-dev): after requests, a background increment
// and an alarm through the pinboard, and a SIGTERM, its history holds its
// start, the lease's registration with its send time, the instance's
// activation under that session with its epoch, every request served with
// its read time, the task's effect, the alarm run and the teardown.
func TestHistory(t *testing.T) {
	pb := proctest.Start(t, proctest.Spec{
		Name:  "pinboard",
		Bin:   builder.Build(t, "github.com/pinned-go/pinned/cmd/pinboard"),
		Args:  []string{"-dev"},
		Env:   []string{"PINBOARD_TOKEN=" + token, "PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0"},
		Ready: pinboardReady,
	})
	pinboard := "http://" + pb.Ready()[1]
	addr := proctest.FreeAddr(t)
	hist := filepath.Join(t.TempDir(), "w1.jsonl")
	c := proctest.Start(t, proctest.Spec{
		Name: "counter",
		Bin:  builder.Build(t, fixture),
		Env: []string{"PINNED_LISTEN=" + addr, "PINNED_ADVERTISE_URL=http://" + addr, "PINNED_PINBOARD_URL=" + pinboard,
			"PINNED_TOKEN=" + token, "PINNED_HISTORY=" + hist},
		Ready: counterReady,
	})
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	call := func(method, url string) int {
		t.Helper()
		req, _ := http.NewRequest(method, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Registered: /healthz answers 200 only then (another process's state:
	// polled).
	waitFor(t, "the fixture registers", func() bool { return call("GET", "http://"+addr+"/healthz") == 200 }, c.Log)
	for _, r := range []struct {
		method, path string
		want         int
	}{
		{"POST", "/counter/alice/incr", 200},
		{"GET", "/counter/alice/", 200},
		{"POST", "/counter/alice/incr-later?delay=0s", 202},
		{"POST", "/counter/alice/alarm?delay=0s&name=a1", 202},
	} {
		if code := call(r.method, pinboard+r.path); code != r.want {
			t.Fatalf("%s %s = %d; want %d\n%s", r.method, r.path, code, r.want, c.Log())
		}
	}
	has := func(kind string) bool {
		evs, err := history.Read(hist)
		return err == nil && len(of(evs, kind)) > 0
	}
	waitFor(t, "the task's effect and the alarm run in the history", func() bool { return has(history.KindEffect) && has(history.KindAlarm) }, c.Log)
	if !c.Terminate(timeout) || c.ExitCode() != 0 {
		t.Fatalf("the fixture did not stop cleanly within %v of SIGTERM:\n%s", timeout, c.Log())
	}

	evs, err := history.Read(hist)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || evs[0].Kind != history.KindStart || evs[0].Proc != "w1" {
		t.Fatalf("history starts with %+v; want the start of w1", evs[:min(1, len(evs))])
	}
	leases := of(evs, history.KindLease)
	if len(leases) == 0 || leases[0].Cause != "registered" || leases[0].Session == "" || leases[0].Sent <= 0 || leases[0].Sent > leases[0].T || leases[0].ExpiresMs <= 0 {
		t.Fatalf("lease events %+v; want the registration first, with its session, send time and lease", leases)
	}
	sess := leases[0].Session
	acts := of(evs, history.KindActivate)
	if len(acts) != 1 || acts[0].ID != "alice" || acts[0].Session != sess || acts[0].Epoch == 0 || acts[0].Inst == "" {
		t.Fatalf("activations %+v; want alice's, under session %s, with an epoch and an instance", acts, sess)
	}
	inst := acts[0].Inst
	serves := of(evs, history.KindServe)
	if len(serves) != 4 {
		t.Errorf("%d serve events; want 4 (incr, get, incr-later, alarm)", len(serves))
	}
	for _, e := range serves {
		if e.Inst != inst || e.Session != sess || e.Recv <= 0 || e.Recv > e.T {
			t.Errorf("serve event %+v; want instance %s under %s, read before it was served", e, inst, sess)
		}
	}
	if effects := of(evs, history.KindEffect); len(effects) != 1 || effects[0].Inst != inst {
		t.Errorf("effect events %+v; want one of instance %s", effects, inst)
	}
	if alarms := of(evs, history.KindAlarm); len(alarms) != 1 || alarms[0].Alarm != "a1" || alarms[0].Sched <= 0 || alarms[0].Wall < alarms[0].Sched || alarms[0].Attempt < 1 {
		t.Errorf("alarm events %+v; want one run of a1, after its scheduled time, with its attempt", alarms)
	}
	if tds := of(evs, history.KindTeardown); len(tds) != 1 || tds[0].Inst != inst {
		t.Errorf("teardown events %+v; want instance %s's on shutdown", tds, inst)
	}
}

// of returns the events of kind.
func of(evs []history.Event, kind string) []history.Event {
	var out []history.Event
	for _, e := range evs {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// waitFor polls cond (another process's state: no event to wait on) until
// it holds, failing t after timeout with log's output.
func waitFor(t *testing.T, what string, cond func() bool, log func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s\n%s", timeout, what, log())
		}
		time.Sleep(25 * time.Millisecond)
	}
}
