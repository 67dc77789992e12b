package host

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fasthttp/websocket"
)

func TestInvalidIDs(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{MaxIDLen: 16}, e)
	f := func(rawPath, wantErr string) {
		t.Helper()
		// Raw request line: net/http would clean or escape some of these.
		conn, err := ts.ln.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: pinned.test\r\nConnection: close\r\n\r\n", rawPath)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("GET %s: %v", rawPath, err)
		}
		defer resp.Body.Close()
		var body strings.Builder
		_, _ = bufioCopy(&body, resp)
		if resp.StatusCode != 400 || !strings.Contains(body.String(), wantErr) || !strings.Contains(body.String(), `"field":"id"`) {
			t.Errorf("GET %s = %d %s; want 400 mentioning %q with field id", rawPath, resp.StatusCode, body.String(), wantErr)
		}
	}
	f("/p/a%2Fb/", "percent")
	f("/p/%2E%2E/", "percent")
	f("/p/a%252F/", "percent")
	f("/p/../", "starts with '.'")
	f("/p/./", "starts with '.'")
	f("/p/.hidden/", "starts with '.'")
	f("/p/a\\b/", "slash")
	f("/p/"+strings.Repeat("x", 17)+"/", "too long")
	f("/p/a*b/", "outside")
	f("/p/caf\xc3\xa9/", "outside")
	f("/p//", "empty")
	if ts.h.Len() != 0 {
		t.Errorf("invalid ids activated %d instances", ts.h.Len())
	}
	// The whole allowed alphabet is accepted.
	ts.expect(200, "GET", "/p/Az09._~@:+=-/")
	ts.expect(200, "GET", "/p/"+strings.Repeat("x", 16)+"/")
}

func bufioCopy(dst *strings.Builder, resp *http.Response) (int64, error) {
	b := make([]byte, 4096)
	var n int64
	for {
		k, err := resp.Body.Read(b)
		dst.Write(b[:k])
		n += int64(k)
		if err != nil {
			return n, nil
		}
	}
}

// TestTurnGuarantee is the concurrency model's proof: many clients hammer
// a few instances with non-concurrent handlers that mutate the object
// without locks (POST /incr), stream generators that do the same on every
// step, tasks that use Do, and a concurrent route that reads through Do.
// The race detector must stay silent and no increment may be lost.
func TestTurnGuarantee(t *testing.T) {
	const (
		ids     = 3
		clients = 24
		perCli  = 40
		lines   = 25
	)
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	ts.tr.MaxIdleConnsPerHost = clients * 2
	close(e.taskBlock) // tasks increment at once
	go func() {
		for range e.entered { // drain task notifications
		}
	}()
	defer close(e.entered)

	var wg sync.WaitGroup
	errs := make(chan error, clients*perCli)
	for c := range clients {
		wg.Go(func() {
			for i := range perCli {
				id := fmt.Sprintf("t%d", (c+i)%ids)
				var path, method string
				switch i % 4 {
				case 0, 1:
					method, path = "POST", "/p/"+id+"/incr"
				case 2:
					method, path = "GET", fmt.Sprintf("/p/%s/stream?n=%d", id, lines)
				case 3:
					method, path = "GET", "/p/"+id+"/peek"
				}
				r, err := ts.doErr(method, path)
				if err == nil && r.status != 200 {
					err = fmt.Errorf("%s %s = %d %s", method, path, r.status, r.body)
				}
				if err == nil && i%4 == 2 && strings.Count(r.body, "\n") != lines {
					err = fmt.Errorf("stream returned %d lines; want %d", strings.Count(r.body, "\n"), lines)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Tasks run concurrently with all of it.
	const tasks = 30
	for i := range tasks {
		wg.Go(func() {
			if r, err := ts.doErr("POST", fmt.Sprintf("/p/t%d/task", i%ids)); err != nil || r.status != 202 {
				errs <- fmt.Errorf("POST task = %v %v", r.status, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitFor(t, "all tasks to end", func() bool { return ts.h.met.tasks.Get() == 0 })

	total := 0
	for i := range ids {
		total += int(ts.expect(200, "GET", fmt.Sprintf("/p/t%d/", i)).json(t)["n"].(float64))
	}
	want := clients*perCli/4*2 + clients*perCli/4*lines + tasks
	if total != want {
		t.Errorf("sum of counters = %d; want %d (lost updates mean the turn guarantee broke)", total, want)
	}
}

// TestSlowStreamReaderDoesNotBlockOthers: a client that stops reading an
// infinite stream holds no turn; other requests to the same instance are
// served, and the generator does not run ahead of the connection.
func TestSlowStreamReaderDoesNotBlockOthers(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	resp := ts.openStream("/p/s/stream?n=0&size=1000")
	br := bufio.NewReader(resp.Body)
	if got := readLine(t, br); !strings.HasPrefix(got, "line 0 ") {
		t.Fatalf("first line = %q", got)
	}
	// The client now stops reading. Other requests are served.
	for range 20 {
		ts.expect(200, "POST", "/p/s/incr")
	}
	ts.expect(200, "GET", "/p/s/")
	ts.expect(200, "GET", "/p/other/")
	resp.Body.Close()
	waitFor(t, "the stream to close", func() bool { return ts.h.met.streams.Get() == 0 })
}

// TestStreamIsPullBased reads a stream over a raw in-memory connection,
// whose pipe buffers only a few writes, and checks after every line that
// the generator ran at most a few steps ahead of the reader.
func TestStreamIsPullBased(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	conn, err := ts.ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /p/pull/stream?n=0&size=2000 HTTP/1.1\r\nHost: pinned.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	// No resp.Body.Close: it would drain the infinite body; closing conn
	// ends the stream.
	br := bufio.NewReaderSize(resp.Body, 16)
	// The bound: fasthttp's 4 KiB writer plus the pipe's 4 buffered writes
	// (fasthttputil) plus our reader's buffering — a handful of 2 KB lines.
	const ahead = 12
	steps := func() int {
		var n int
		inst := ts.h.instance("pull")
		if err := inst.Do(func() { n = inst.obj.(*probe).steps }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	maxLead := 0
	defer func() { t.Logf("generator ran at most %d steps ahead of the reader", maxLead) }()
	for i := range 50 {
		readLine(t, br)
		s := steps()
		maxLead = max(maxLead, s-(i+1))
		if s > i+1+ahead {
			t.Fatalf("after reading %d lines the generator took %d steps; want at most %d", i+1, s, i+1+ahead)
		}
	}
	// Stop reading: the generator stops too.
	before := steps()
	for range 20 {
		ts.expect(200, "GET", "/p/pull/") // other requests go through meanwhile
	}
	if after := steps(); after > before+ahead {
		t.Errorf("generator advanced from %d to %d steps while the client did not read", before, after)
	}
}

// TestStreamAbortStopsGenerator: abort ends an open stream whose client
// stopped reading, and the generator's code after its last yield runs
// before the teardown.
func TestStreamAbortStopsGenerator(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	resp := ts.openStream("/p/g/stream?n=0&size=100")
	defer resp.Body.Close()
	readLine(t, bufio.NewReader(resp.Body))
	ts.h.abort(ts.h.instance("g"), EvictAbort)
	e.waitTorn(t, "g")
	if got := e.genStops.Load(); got != 1 {
		t.Errorf("generator stops = %d; want 1", got)
	}
	if got := e.stopsAtTeardown.Load(); got != 1 {
		t.Errorf("generator stops seen by teardown = %d; want 1 (cleanup must run before teardown)", got)
	}
}

// TestWebSocketEchoAndBroadcast: sockets of one instance see counts pushed
// from another request's handler; abort closes them with the instance.
func TestWebSocketEchoAndBroadcast(t *testing.T) {
	e := newEnv()
	ts := newTestHost(t, Config{}, e)
	a := ts.dialWS("/p/w/ws")
	defer a.Close()
	b := ts.dialWS("/p/w/ws")
	defer b.Close()
	if got := wsEcho(t, a, "ping"); got != "ping" {
		t.Errorf("echo = %q; want ping", got)
	}
	ts.expect(200, "POST", "/p/w/incr")
	if got := wsEcho(t, b, "count"); got != "1" {
		t.Errorf("count over websocket = %q; want 1", got)
	}
	if got := ts.h.met.websockets.Get(); got != 2 {
		t.Errorf("pinned_open_websockets = %v; want 2", got)
	}
	ts.h.AbortAll(EvictLease)
	for _, c := range []*websocket.Conn{a, b} {
		_ = c.SetReadDeadline(time.Now().Add(testTimeout))
		if _, _, err := c.ReadMessage(); err == nil {
			t.Error("websocket open after AbortAll")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Error("websocket not closed by AbortAll (read timed out)")
		}
	}
	e.waitTorn(t, "w")
	waitFor(t, "sockets to end", func() bool { return ts.h.met.websockets.Get() == 0 })
}

func TestWebSocketHandshakeFailureReleasesActivity(t *testing.T) {
	fc := fakeClock()
	e := newEnv()
	ts := newTestHost(t, Config{Clock: fc, IdleTimeout: time.Minute, SweepInterval: time.Second}, e)
	// Upgrade headers without a key: the upgrader answers 400.
	r := ts.do("GET", "/p/h/ws", "Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13")
	if r.status != 400 {
		t.Fatalf("bad handshake = %d %s; want 400", r.status, r.body)
	}
	r.json(t)
	fc.Advance(time.Hour)
	ts.h.sweep()
	e.waitTorn(t, "h")
}

// TestHeadOnStreamRouteReleasesActivity: fasthttp never reads the body of
// a HEAD response; the stream is still closed and the instance can idle.
func TestHeadOnStreamRouteReleasesActivity(t *testing.T) {
	fc := fakeClock()
	e := newEnv()
	ts := newTestHost(t, Config{Clock: fc, IdleTimeout: time.Minute, SweepInterval: time.Second}, e)
	r := ts.expect(200, "HEAD", "/p/h/stream?n=0")
	if r.body != "" {
		t.Errorf("HEAD body = %q; want none", r.body)
	}
	waitFor(t, "the stream to close", func() bool { return ts.h.met.streams.Get() == 0 })
	if e.genStops.Load() != 0 {
		t.Error("the generator of a HEAD response ran")
	}
	fc.Advance(time.Hour)
	ts.h.sweep()
	e.waitTorn(t, "h")
}
