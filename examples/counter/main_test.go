package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/internal/testkit/promcheck"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	)
}

const timeout = 10 * time.Second

func TestLoadOptions(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	f := func(args []string, vars map[string]string, want string) {
		t.Helper()
		o, err := loadOptions(args, env(vars))
		if err != nil {
			t.Fatalf("loadOptions(%q, %v): %v", args, vars, err)
		}
		if o.listen != want {
			t.Errorf("loadOptions(%q, %v).listen = %q; want %q", args, vars, o.listen, want)
		}
	}
	f(nil, nil, "127.0.0.1:8080")
	f(nil, map[string]string{"PINNED_LISTEN": "127.0.0.1:9"}, "127.0.0.1:9")
	f([]string{"-listen", "127.0.0.1:7"}, map[string]string{"PINNED_LISTEN": "127.0.0.1:9"}, "127.0.0.1:7")
	if o, err := loadOptions(nil, env(map[string]string{"PINNED_MAX_BODY_BYTES": "1000"})); err != nil || o.maxBodyBytes != 1000 {
		t.Errorf("PINNED_MAX_BODY_BYTES=1000: %d, %v; want 1000", o.maxBodyBytes, err)
	}
	if o, err := loadOptions([]string{"-max-body-bytes", "7"}, env(map[string]string{"PINNED_MAX_BODY_BYTES": "1000"})); err != nil || o.maxBodyBytes != 7 {
		t.Errorf("-max-body-bytes 7 over PINNED_MAX_BODY_BYTES: %d, %v; want 7", o.maxBodyBytes, err)
	}
	if _, err := loadOptions(nil, env(map[string]string{"PINNED_MAX_BODY_BYTES": "-1"})); err == nil {
		t.Error("PINNED_MAX_BODY_BYTES=-1 was accepted")
	}
	if _, err := loadOptions([]string{"-nope"}, env(nil)); err == nil {
		t.Error("an unknown flag was accepted")
	}
	o, _ := loadOptions(nil, env(map[string]string{"PINNED_PINBOARD_URL": "http://127.0.0.1:1"}))
	if err := run(context.Background(), o, slog.New(slog.DiscardHandler), nil); err == nil || !strings.Contains(err.Error(), "fleet mode") {
		t.Errorf("run with PINNED_PINBOARD_URL = %v; want a fleet-mode error", err)
	}
}

// TestDemo runs the demo on a real 127.0.0.1 listener and walks through
// everything the README promises.
func TestDemo(t *testing.T) {
	opts, err := loadOptions([]string{"-listen", "127.0.0.1:0"}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, opts, slog.New(slog.DiscardHandler), func(a net.Addr) { addrs <- a }) }()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a.String()
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
	if first["id"] != "alice" || first["count"] != 0.0 || first["instance"] == "" {
		t.Errorf("GET /counter/alice/ = %v; want id alice, count 0, an instance nonce", first)
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
