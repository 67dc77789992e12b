package metricshttp_test

import (
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/promcheck"
	"github.com/pinned-go/pinned/metricshttp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Options()...) }

// serve runs h on a 127.0.0.1 listener until the test ends.
func serve(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	// ln is closed too, in case Shutdown runs before Serve registered it.
	t.Cleanup(func() { _ = ln.Close(); _ = s.Shutdown(); <-done })
	return ln.Addr().String()
}

func get(t *testing.T, method, url string) (int, string, string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	c := &fasthttp.HostClient{Addr: strings.TrimPrefix(url, "http://")[:strings.Index(strings.TrimPrefix(url, "http://"), "/")]}
	defer c.CloseIdleConnections()
	if err := c.DoTimeout(req, resp, 5*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp.StatusCode(), string(resp.Header.ContentType()), string(resp.Body())
}

// Two sets that both hold series of the same names (two hosts of one app
// with their own sets, say) come out as one group per name, which the
// Prometheus parsers and promtool accept; the process metrics come along
// when asked for.
func TestHandlerMergesSets(t *testing.T) {
	a, b := metrics.NewSet(), metrics.NewSet()
	a.NewCounter(`pinned_activations_total{namespace="/a"}`).Add(3)
	a.NewGauge(`pinned_registered`, func() float64 { return 1 })
	a.NewPrometheusHistogram(`pinned_request_duration_seconds{namespace="/a"}`).Update(0.01)
	b.NewCounter(`pinned_activations_total{namespace="/b"}`).Add(5)
	b.NewPrometheusHistogram(`pinned_request_duration_seconds{namespace="/b"}`).Update(2)
	b.RegisterMetricsWriter(func(w io.Writer) {
		metrics.WriteCounterUint64(w, `pinned_activations_total{namespace="/c"}`, 7)
	})

	addr := serve(t, metricshttp.Handler(metricshttp.Config{Sets: []*metrics.Set{a, nil, b}, Process: true}))
	code, ctype, body := get(t, "GET", "http://"+addr+"/metrics")
	if code != 200 || ctype != metricshttp.ContentType {
		t.Fatalf("GET /metrics = %d %q", code, ctype)
	}
	fams := promcheck.Check(t, "metricshttp", []byte(body))
	if f := fams["pinned_activations_total"]; f.Series != 3 {
		t.Errorf("pinned_activations_total has %d series; want 3 (/a, /b, /c)\n%s", f.Series, body)
	}
	for _, name := range []string{"pinned_registered", "pinned_request_duration_seconds_bucket", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("output lacks %s", name)
		}
	}
	// Contiguity, asserted on the text itself (expfmt accepts split groups
	// without TYPE lines): once a name's group ends, it never reappears.
	seen, prev := map[string]bool{}, ""
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		name := l[:strings.IndexAny(l, "{ ")]
		if name != prev && seen[name] {
			t.Fatalf("lines of %s are not contiguous:\n%s", name, body)
		}
		seen[name], prev = true, name
	}
	// The /a bucket line precedes the /b one: order within a name is kept.
	if i, j := strings.Index(body, `pinned_activations_total{namespace="/a"} 3`), strings.Index(body, `pinned_activations_total{namespace="/b"} 5`); i < 0 || j < i {
		t.Errorf("order within a name not kept:\n%s", body)
	}

	code, _, body = get(t, "HEAD", "http://"+addr+"/metrics")
	if code != 200 || body != "" {
		t.Errorf("HEAD /metrics = %d %q", code, body)
	}
	code, ctype, body = get(t, "POST", "http://"+addr+"/metrics")
	if code != 405 || ctype != "application/json" || !strings.Contains(body, `"error"`) {
		t.Errorf("POST /metrics = %d %q %s; want 405 JSON", code, ctype, body)
	}
}

// Without Process, only the sets are written.
func TestWriteWithoutProcess(t *testing.T) {
	s := metrics.NewSet()
	s.NewCounter("pinned_aborts_total").Inc()
	var sb strings.Builder
	metricshttp.Write(&sb, metricshttp.Config{Sets: []*metrics.Set{s}})
	if sb.String() != "pinned_aborts_total 1\n" {
		t.Errorf("Write = %q", sb.String())
	}
}

// With Metadata, pinned's families carry their TYPE and HELP from the
// catalogue and go_*/process_* a HELP: promtool has nothing to report, and
// the parser sees typed families (a histogram's _bucket, _sum and _count
// lines folded into one).
func TestMetadata(t *testing.T) {
	a, b := metrics.NewSet(), metrics.NewSet()
	a.NewCounter(`pinned_activations_total{namespace="/a"}`).Inc()
	a.NewPrometheusHistogram(`pinned_request_duration_seconds{namespace="/a"}`).Update(0.01)
	b.NewPrometheusHistogram(`pinned_request_duration_seconds{namespace="/b"}`).Update(0.2)
	b.NewGauge(`pinned_registered`, func() float64 { return 1 })
	var sb strings.Builder
	metricshttp.Write(&sb, metricshttp.Config{Sets: []*metrics.Set{a, b}, Process: true, Metadata: true})
	out := sb.String()
	fams := promcheck.Strict(t, "metricshttp with metadata", []byte(out))
	for name, typ := range map[string]string{
		"pinned_activations_total":        "COUNTER",
		"pinned_request_duration_seconds": "HISTOGRAM",
		"pinned_registered":               "GAUGE",
	} {
		if f := fams[name]; f.Type != typ {
			t.Errorf("%s parsed as %+v; want %s", name, f, typ)
		}
	}
	if f := fams["pinned_request_duration_seconds"]; f.Series != 2 {
		t.Errorf("histogram series = %d; want 2 (/a, /b)", f.Series)
	}
	if !strings.Contains(out, "# HELP pinned_activations_total instances whose setup succeeded (host)\n# TYPE pinned_activations_total counter\n") {
		t.Errorf("no HELP/TYPE from the catalogue:\n%s", out)
	}
	if strings.Count(out, "# TYPE pinned_request_duration_seconds ") != 1 {
		t.Errorf("the histogram's TYPE is not written once:\n%s", out)
	}
	// Metadata written by the metrics library itself is not doubled.
	metrics.ExposeMetadata(true)
	defer metrics.ExposeMetadata(false)
	sb.Reset()
	metricshttp.Write(&sb, metricshttp.Config{Sets: []*metrics.Set{a}, Metadata: true})
	if n := strings.Count(sb.String(), "# TYPE pinned_activations_total "); n != 1 {
		t.Errorf("%d TYPE lines for one family with ExposeMetadata on:\n%s", n, sb.String())
	}
}

// The catalogue is docs/metrics.md's table, row for row.
func TestCatalogueMatchesDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var docs []metricshttp.Family
	for _, line := range strings.Split(string(b), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 7 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`pinned_") {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		docs = append(docs, metricshttp.Family{
			Name: strings.Trim(cells[1], "`"), Type: cells[2], Labels: cells[3], Component: cells[4],
			Help: strings.ReplaceAll(strings.Join(cells[5:len(cells)-1], "|"), "`", ""),
		})
	}
	cat := metricshttp.Catalogue()
	if len(docs) != len(cat) {
		t.Errorf("docs/metrics.md has %d pinned_* rows, the catalogue %d", len(docs), len(cat))
	}
	for i := range min(len(docs), len(cat)) {
		if docs[i] != cat[i] {
			t.Errorf("row %d differs:\n docs:      %+v\n catalogue: %+v", i, docs[i], cat[i])
		}
	}
}
