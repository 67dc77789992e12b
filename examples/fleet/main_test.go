package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
)

// builder builds the demo for TestCommandLine.
var builder proctest.Builder

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m, builder.Cleanup) }

// TestCommandLine runs the built demo: a flag it cannot run with is exit
// status 2 naming that flag (never a pinboard variable the demo does not
// read), before anything listens; -h and -version print to stdout.
func TestCommandLine(t *testing.T) {
	proctest.CheckCommandLine(t, builder.Build(t, "github.com/pinned-go/pinned/examples/fleet"), "fleet", []proctest.Case{
		{Args: []string{"-listen", ":99999"}, Code: 2, Stderr: `fleet: -listen=":99999": want host:port with a port from 0 to 65535`, Not: "PINBOARD_"},
		{Args: []string{"-admin-listen", "127.0.0.1:65536"}, Code: 2, Stderr: `fleet: -admin-listen="127.0.0.1:65536": want host:port with a port from 0 to 65535`, Not: "PINBOARD_"},
		{Args: []string{"-workers", "0"}, Code: 2, Stderr: "fleet: -workers 0: want 1 to 16"},
		{Args: []string{"extra"}, Code: 2, Stderr: `fleet: unexpected argument "extra" (see fleet -h)`},
	})
}

func TestLoadOptions(t *testing.T) {
	o, err := loadOptions(nil, io.Discard)
	if err != nil || o.listen != "127.0.0.1:8080" || o.workers != 3 {
		t.Errorf("loadOptions(nil) = %+v, %v; want 127.0.0.1:8080 and 3 workers", o, err)
	}
	for _, args := range [][]string{{"-workers", "0"}, {"-nope"}, {"extra"}, {"-shutdown-timeout", "5"}} {
		if _, err := loadOptions(args, io.Discard); err == nil {
			t.Errorf("loadOptions(%q) accepted bad arguments", args)
		}
	}
	var help strings.Builder
	if _, err := loadOptions([]string{"-h"}, &help); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h = %v; want flag.ErrHelp (exit 0)", err)
	}
	for _, want := range []string{
		"-listen host:port (no variable, default 127.0.0.1:8080)",
		"-admin-listen host:port (no variable, default 127.0.0.1:9090)",
		"-workers int (no variable, default 3)",
		"-shutdown-timeout duration (no variable, default 5s)",
	} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, help.String())
		}
	}
}

// state is the counter's answer.
type state struct {
	ID       string `json:"id"`
	Count    int64  `json:"count"`
	Instance string `json:"instance"`
}

// TestFleet runs the demo on ephemeral 127.0.0.1 ports and walks through
// what the README's quick start promises: the counter through the
// pinboard, the same instance on every request, ids spread over the
// workers, WebSocket pass-through, and a clean stop.
func TestFleet(t *testing.T) {
	o, err := loadOptions([]string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan fleet, 1)
	done := make(chan error, 1)
	var logs logtest.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	go func() { done <- run(ctx, o, logger, logger, func(f fleet) { ready <- f }) }()
	var f fleet
	select {
	case f = <-ready:
	case err := <-done:
		t.Fatalf("run ended before the fleet was ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the fleet was not ready within 20 s")
	}
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run = %v; want nil after a clean stop", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("run did not return within 20 s of cancel")
		}
	}()
	var banner bytes.Buffer
	f.print(&banner)
	if len(f.Workers) != 3 || !strings.Contains(banner.String(), "curl -X POST "+f.Pinboard+"/counter/alice/incr") {
		t.Fatalf("banner:\n%s", banner.String())
	}

	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	call := func(method, path string) state {
		t.Helper()
		req, _ := http.NewRequest(method, f.Pinboard+path, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s state
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&s) != nil {
			t.Fatalf("%s %s = %d", method, path, resp.StatusCode)
		}
		return s
	}
	first := call("POST", "/counter/alice/incr")
	second := call("POST", "/counter/alice/incr")
	if first.Count != 1 || second.Count != 2 || first.Instance != second.Instance {
		t.Fatalf("two increments = %+v, %+v; want 1 then 2 on one instance", first, second)
	}
	for i := range 30 {
		call("GET", fmt.Sprintf("/counter/id%d/", i))
	}
	req, _ := http.NewRequest("GET", f.Pinboard+wire.PathWorkers, nil)
	req.Header.Set("Authorization", "Bearer "+f.Token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var ws wire.WorkersResponse
	err = json.NewDecoder(resp.Body).Decode(&ws)
	resp.Body.Close()
	if err != nil || len(ws.Workers) != 3 {
		t.Fatalf("workers = %+v, %v; want 3", ws, err)
	}
	used := 0
	for _, w := range ws.Workers {
		if w.Placements["/counter"] > 0 {
			used++
		}
	}
	if used < 2 {
		t.Errorf("31 ids were placed on %d worker(s); want them spread", used)
	}

	// WebSocket through the pinboard: echo, and a push on every change.
	c, _, err := websocket.DefaultDialer.Dial(strings.Replace(f.Pinboard, "http", "ws", 1)+"/counter/alice/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := c.WriteMessage(websocket.TextMessage, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.ReadMessage(); err != nil || string(msg) != "hi" {
		t.Fatalf("echo = %q, %v", msg, err)
	}
	call("POST", "/counter/alice/incr")
	if _, msg, err := c.ReadMessage(); err != nil || string(msg) != `{"count":3}` {
		t.Fatalf("push = %q, %v; want {\"count\":3}", msg, err)
	}
	c.Close()

	// A worker's fasthttp server reports a connection it could not serve
	// (here a request line that is no HTTP) through slog, not the standard
	// log package.
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.Workers[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("NOT HTTP\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.ReadAll(conn) // until the server closes the connection
	conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "logger=fasthttp") {
		if time.Now().After(deadline) {
			t.Fatalf("no logger=fasthttp record for a malformed request to a worker:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond) // the server logs after it closed the connection
	}
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "logger=fasthttp") && (!strings.Contains(l, "level=WARN") || !strings.Contains(l, "worker=w1")) {
			t.Errorf("fasthttp record %q; want level=WARN and the worker's name", l)
		}
	}
}
