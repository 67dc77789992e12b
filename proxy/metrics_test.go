package proxy_test

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/internal/testkit/logtest"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// The proxy reports on the metric set it is given and logs as pinned.proxy.
func TestMetricsAndLogger(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", w.session("s", "k"))
		set := metrics.NewSet()
		var logs logtest.Buffer
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.Metrics = set
			c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		})
		if f.p.Metrics() != set {
			t.Fatal("Metrics() is not Config.Metrics")
		}
		for i := 0; i < 3; i++ {
			_ = raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		}
		_ = raw(t, f.addr, "GET /counter/.. HTTP/1.1\r\nHost: h\r\n\r\n")
		res.SetError(errFake)
		_ = raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")

		var b bytes.Buffer
		set.WritePrometheus(&b)
		out := b.String()
		for _, want := range []string{
			`pinned_proxy_responses_total{class="2xx"} 3`,
			`pinned_proxy_responses_total{class="4xx"} 1`,
			`pinned_proxy_responses_total{class="5xx"} 1`,
			`pinned_proxy_rejected_total 1`,
			`pinned_proxy_upstream_duration_seconds_count 3`,
			`pinned_proxy_upstream_duration_seconds_bucket{le="+Inf"} 3`,
			`pinned_proxy_tunnels_open 0`,
		} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("metrics lack %q:\n%s", want, out)
			}
		}
		if l := logs.String(); !strings.Contains(l, "logger=pinned.proxy") || !strings.Contains(l, "cannot resolve") {
			t.Errorf("logs: %q", l)
		}
	})
}

// metricValue reads one series (name and labels) from the proxy's set; a
// missing series fails the test.
func metricValue(t *testing.T, f *front, series string) float64 {
	t.Helper()
	var b bytes.Buffer
	f.p.Metrics().WritePrometheus(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return x
		}
	}
	t.Fatalf("no series %s in:\n%s", series, b.String())
	return 0
}

// expectMetric fails unless series has value want.
func expectMetric(t *testing.T, f *front, series string, want float64) {
	t.Helper()
	if got := metricValue(t, f, series); got != want {
		t.Errorf("%s = %v; want %v", series, got, want)
	}
}

var errFake = fakeErr("store unreachable")

type fakeErr string

func (e fakeErr) Error() string { return string(e) }
