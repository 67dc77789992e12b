package loadgen

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// With TraceFile, every request carries its number in Trace-Seq, and the
// file holds one line per measured request: a number the server saw, its
// status, and due ≤ sent ≤ done on the absolute monotonic clock (within
// the run's span of CLOCK_MONOTONIC).
func TestTraceFileNumbersRequests(t *testing.T) {
	var mu sync.Mutex
	seen := map[int64]bool{}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		v := ctx.Request.Header.Peek(traceSeqField)
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			ctx.SetStatusCode(400)
			return
		}
		mu.Lock()
		seen[n] = true
		mu.Unlock()
	}}
	url := startTCPTarget(t, srv)
	path := filepath.Join(t.TempDir(), "trace.csv")
	start := monoNow(t)
	r := mustNew(t, Config{URL: url, Rate: 500, Duration: 400 * time.Millisecond, Requests: Unbounded, Connections: 4, TraceFile: path, Engine: EngineLoop})
	rep, err := r.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	end := monoNow(t)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if lines[0] != "seq,status,due,sent,rx,done" {
		t.Fatalf("header %q", lines[0])
	}
	rows := lines[1:]
	if int64(len(rows)) != rep.Requests.Responses || len(rows) < 100 {
		t.Fatalf("%d trace lines for %d completed requests (want equal, and at least 100)", len(rows), rep.Requests.Responses)
	}
	for _, row := range rows {
		f := strings.Split(row, ",")
		var v [6]int64
		for i := range v {
			if v[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
				t.Fatalf("line %q: %v", row, err)
			}
		}
		mu.Lock()
		ok := seen[v[0]]
		mu.Unlock()
		if !ok || v[1] != 200 {
			t.Fatalf("line %q: the server saw no request numbered %d, or answered it otherwise (status %d)", row, v[0], v[1])
		}
		if due, sent, done := v[2], v[3], v[5]; due < start || sent < due || done < sent || done > end {
			t.Fatalf("line %q: want %d ≤ due ≤ sent ≤ done ≤ %d", row, start, end)
		}
	}
}

// monoNow reads CLOCK_MONOTONIC.
func monoNow(t *testing.T) int64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}
