package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/pinned-go/pinned/examples/counter/countercmd"
	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
)

// TestAdminListener: PINNED_ADMIN_LISTEN adds a loopback listener with
// pprof and metrics (the bench's profiles come from it) and refuses a
// non-loopback address or a bad port saying which.
func TestAdminListener(t *testing.T) {
	for bad, want := range map[string]string{
		"0.0.0.0:0": "loopback", "10.1.2.3:0": "loopback", "[::]:9091": "loopback",
		"nonsense": "port from 0 to 65535", "127.0.0.1:99999": "port from 0 to 65535", ":99999": "port from 0 to 65535",
	} {
		_, err := loadOptions(nil, []string{"PINNED_ADMIN_LISTEN=" + bad}, io.Discard)
		if cmdline.Status(err) != cmdline.ExitUsage || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "PINNED_ADMIN_LISTEN") {
			t.Errorf("PINNED_ADMIN_LISTEN=%s: %v; want a usage error naming the variable and %q", bad, err, want)
		}
	}

	var logs logtest.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	opts, err := loadOptions([]string{"-listen", "127.0.0.1:0"}, []string{"PINNED_ADMIN_LISTEN=127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan countercmd.Listening, 1)
	done := make(chan error, 1)
	go func() {
		done <- countercmd.Run(ctx, opts.counter, countercmd.Extras{}, logger, func(l countercmd.Listening) { addrs <- l })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	var l countercmd.Listening
	select {
	case l = <-addrs:
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	}
	m := regexp.MustCompile(`msg="counter admin listening" addr=(\S+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no admin listening line in the log:\n%s", logs.String())
	}
	admin := m[1]
	if l.Admin == nil || l.Admin.String() != admin {
		t.Fatalf("run reported admin listener %v; the log says %s", l.Admin, admin)
	}
	addr := l.Addr
	get := func(url string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	if code, body := get("http://" + admin + "/debug/pprof/"); code != 200 || !bytes.Contains(body, []byte("goroutine")) {
		t.Errorf("admin /debug/pprof/ = %d %.80q", code, body)
	}
	if code, body := get("http://" + admin + "/metrics"); code != 200 || !bytes.Contains(body, []byte("go_goroutines")) {
		t.Errorf("admin /metrics = %d without go_goroutines", code)
	}
	// The data plane is not on the admin listener, pprof not on the public one.
	if code, _ := get("http://" + admin + "/counter/a/"); code != 404 {
		t.Errorf("admin /counter/a/ = %d; want 404", code)
	}
	if code, _ := get("http://" + addr.String() + "/debug/pprof/"); code != 404 {
		t.Errorf("public /debug/pprof/ = %d; want 404", code)
	}
	// GET /blob is the test fixture's (test/app/counter), not the demo's.
	if code, _ := get("http://" + addr.String() + "/counter/b/blob?size=1"); code != 404 {
		t.Errorf("the demo's GET /counter/b/blob = %d; want 404", code)
	}
}
