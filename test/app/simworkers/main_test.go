package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m, nil) }

// devPinboard runs `pinboard -dev` (in-memory directory) in this process on
// free 127.0.0.1 ports until the test ends; it returns the public URL and
// the generated token.
func devPinboard(t *testing.T) (url, token string) {
	t.Helper()
	s, err := pinboard.ParseSettings([]string{"-dev"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := pinboard.New(pinboard.Config{Settings: s, Logger: slog.New(slog.DiscardHandler), PublicListener: pub, AdminListener: adm})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }() // owned by the test: stopped in Cleanup
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + pub.Addr().String(), s.Tokens[0]
}

// get sends GET url (with the token when given) and returns the status and
// body.
func get(t *testing.T, url, token string) (int, []byte) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if err := fasthttp.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...)
}

// TestWorkersRegisterAndServe: five simulated workers registered in
// batches of two are five distinct verified sessions, each at its own
// advertise address, and requests through the pinboard are placed on them
// and answered by the trivial object; when the context ends run returns
// nil and stops everything it started (TestMain checks for leaks).
func TestWorkersRegisterAndServe(t *testing.T) {
	url, token := devPinboard(t)
	s, _, err := loadSettings([]string{"-workers", "5", "-register-batch", "2"},
		[]string{"PINNED_PINBOARD_URL=" + url, "PINNED_TOKEN=" + token}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan []string, 1)
	done := make(chan error, 1)
	go func() { // owned by the test: ends when ctx is cancelled below
		done <- run(ctx, s, slog.New(slog.NewTextHandler(&logs, nil)), &logs, func(a []string) { ready <- a })
	}()
	var addrs []string
	select {
	case addrs = <-ready:
	case err := <-done:
		t.Fatalf("run returned before every worker registered: %v\n%s", err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("not registered within 30 s\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), `msg="simulated workers registered" workers=5`) {
		t.Errorf("no ready line with the count:\n%s", logs.String())
	}
	code, body := get(t, url+wire.PathWorkers, token)
	var list wire.WorkersResponse
	if err := json.Unmarshal(body, &list); code != 200 || err != nil {
		t.Fatalf("GET %s = %d %s (%v)", wire.PathWorkers, code, body, err)
	}
	var urls, clients []string
	for _, w := range list.Workers {
		if !w.Verified || !slices.Equal(w.Namespaces, []string{"/counter"}) {
			t.Errorf("worker %+v: want verified, serving /counter", w)
		}
		urls, clients = append(urls, w.AdvertiseURL), append(clients, w.ClientID)
	}
	slices.Sort(urls)
	slices.Sort(clients)
	var want []string
	for _, a := range addrs {
		want = append(want, "http://"+a)
	}
	slices.Sort(want)
	if !slices.Equal(urls, want) || len(slices.Compact(clients)) != 5 {
		t.Errorf("sessions at %q with clients %q; want one per worker at %q", urls, clients, want)
	}
	for _, id := range []string{"a", "b", "c"} {
		code, body := get(t, url+"/counter/"+id+"/", "")
		if code != 200 || string(body) != `{"id":"`+id+`"}` {
			t.Errorf("GET /counter/%s/ through the pinboard = %d %s; want 200 and the id", id, code, body)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel = %v; want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return within 30 s of the cancel")
	}
}

// TestLoadSettings: the required settings and the bounds are usage errors
// naming the setting.
func TestLoadSettings(t *testing.T) {
	base := []string{"PINNED_PINBOARD_URL=http://127.0.0.1:1", "PINNED_TOKEN=t0123456789abcdef"}
	for _, c := range []struct {
		args, env []string
		want      string
	}{
		{nil, base[1:], "-pinboard-url (PINNED_PINBOARD_URL) is required"},
		{nil, base[:1], "PINNED_TOKEN is required"},
		{[]string{"-workers", "0"}, base, "-workers (PINNED_SIM_WORKERS)=0: want 1 to 10000"},
		{[]string{"-register-batch", "1001"}, base, "-register-batch (PINNED_SIM_REGISTER_BATCH)=1001: want 1 to 1000"},
		{[]string{"-log-level", "loud"}, base, `-log-level (PINNED_LOG_LEVEL)="loud": want debug, info, warn or error`},
	} {
		_, _, err := loadSettings(c.args, c.env, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("loadSettings(%q, %q) = %v; want %q", c.args, c.env, err, c.want)
		}
	}
	s, _, err := loadSettings(nil, base, io.Discard)
	if err != nil || s.workers != defaultWorkers || s.namespace != defaultNamespace || s.registerBatch != defaultRegisterBatch {
		t.Errorf("defaults = %+v, %v", s, err)
	}
}
