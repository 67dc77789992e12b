//go:debug netdns=go

package loadgen

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/testkit/dyingtarget"
)

// The numbers a failing target gets. The go:debug line above makes the
// resolver Go's own, which refuses a malformed name without sending a
// query: no test traffic leaves 127.0.0.1.

// TestTargetDyingMidRun: a target killed after 40 of 100 requests achieves
// the rate of its successful responses, never more than 40 over the
// schedule's half second, however fast the refused requests fail after it
// died (the rate once counted them and came out above the target rate).
func TestTargetDyingMidRun(t *testing.T) {
	bothEngines(t, func(t *testing.T, eng Engine) {
		rep := runOn(t, eng, Config{URL: dyingtarget.Start(t, 40), Rate: 200, Requests: 100, Duration: Unbounded})
		ok := rep.Requests.Sent - rep.Requests.Errors
		if rep.Requests.Sent != 100 || ok < 1 || ok > 40 || rep.ErrorRate < 0.6 {
			t.Fatalf("sent %d, %d ok, error rate %.2f; want 100 sent, 1 to 40 ok, at least 60%% failed", rep.Requests.Sent, ok, rep.ErrorRate)
		}
		span := max(rep.ElapsedSeconds, 0.5) // 100 slots at 200/s
		if want := float64(ok) / span; rep.AchievedRate != want || rep.AchievedRate > 80 {
			t.Errorf("achieved %.1f req/s (target %v); want %d successes over %.3fs = %.1f", rep.AchievedRate, rep.TargetRate, ok, span, want)
		}
		var text strings.Builder
		_ = rep.WriteText(&text)
		if !strings.Contains(text.String(), "req/s achieved (successful responses per second; target 200 req/s)") {
			t.Errorf("the report does not say what the rate counts:\n%s", text.String())
		}
	})
}

// TestNoResponsesSaysSo: a run without a single response says so instead
// of a latency table of zeros.
func TestNoResponsesSaysSo(t *testing.T) {
	bothEngines(t, func(t *testing.T, eng Engine) {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close()
		rep := runOn(t, eng, Config{URL: url, Rate: 1000, Requests: 10, Duration: Unbounded, Connections: 1})
		var b strings.Builder
		_ = rep.WriteText(&b)
		text := b.String()
		if rep.AchievedRate != 0 || !strings.Contains(text, "10 sent, 0 unsent, 0 ok; no successful responses (target 1000 req/s)") ||
			!strings.Contains(text, "latency (from intended send time): none, no request got a response (see errors)") {
			t.Errorf("achieved %v; text:\n%s", rep.AchievedRate, text)
		}
		for l := range strings.Lines(text) {
			if strings.HasPrefix(strings.TrimSpace(l), "all ") || strings.HasPrefix(strings.TrimSpace(l), "service time") {
				t.Errorf("a latency row without a response: %q", l)
			}
		}
	})
}

func TestProbe(t *testing.T) {
	live := startTCPTarget(t, &fasthttp.Server{Handler: func(*fasthttp.RequestCtx) {}})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()
	tg := startTarget(t, func(*fasthttp.RequestCtx) {})
	inmem := tg.config()
	for _, c := range []struct {
		cfg  Config
		want error
		text string
	}{
		{Config{URL: live}, nil, ""},
		{inmem, nil, ""}, // through Config.Dial
		{Config{URL: gone}, ErrUnreachable, "refused"},
		{Config{URL: "http://" + strings.Repeat("x", 64) + ".invalid:80"}, ErrUnresolvable, strings.Repeat("x", 64)},
	} {
		err := mustNew(t, c.cfg).Probe(context.Background())
		if !errors.Is(err, c.want) || (err != nil && !strings.Contains(err.Error(), c.text)) {
			t.Errorf("Probe(%s) = %v; want %v mentioning %q", c.cfg.URL, err, c.want, c.text)
		}
	}
}
