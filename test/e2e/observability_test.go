package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/promcheck"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// TestObservability runs the real pinboard and a counter worker, sends
// traffic through the proxy, and then checks what an operator sees:
//
//   - both /metrics outputs pass `promtool check metrics` (expfmt parsing
//     when promtool is absent) and match docs/metrics.md exactly: every
//     family printed has a row, every row is printed (the catalogue cannot
//     drift);
//   - the metrics moved with the traffic;
//   - /metrics and /debug/pprof/ answer on the admin listeners only (the
//     counter's by default in fleet mode, never on its advertised port);
//   - no captured log line of either process contains the deployment
//     token, the worker's secret (the x-pinned-proxy-secret value) or a
//     challenge or challenge value: all of them are read off the wire
//     between the worker and the pinboard by a recording relay, so the scan
//     knows the real values.
func TestObservability(t *testing.T) {
	rs := redistest.Start(t)
	pb := startPinboard(t, rs.URL)
	c := startCounter(t, pb)
	eventually(t, 15*time.Second, "the counter registers and turns ready", func() bool {
		w, ok := workerAt(t, pb, c.addr)
		return ok && w.Verified && healthy(t, c)
	})

	// Traffic: three ids placed and activated through the proxy, a cached
	// read, a stream, a request refused by the host (no proxy secret), one
	// refused by the proxy (bad id).
	for _, id := range []string{"a1", "a2", "a3"} {
		if code, _, body := do(t, "POST", "http://"+pb.public+"/counter/"+id+"/incr", nil); code != 200 {
			t.Fatalf("POST /counter/%s/incr via the pinboard = %d %s", id, code, body)
		}
	}
	// A claim leaves its route cached (its own write does not invalidate
	// it), so both GETs hit, except that the pinboard's very first claim
	// loads the place script (NOSCRIPT) and, that once, hears of its own
	// write: a1's first GET may miss.
	for range 2 {
		if code, _, body := do(t, "GET", "http://"+pb.public+"/counter/a1/", nil); code != 200 || !bytes.Contains(body, []byte(`"count":1`)) {
			t.Fatalf("GET /counter/a1/ = %d %s", code, body)
		}
	}
	if code, _, body := do(t, "GET", "http://"+pb.public+"/counter/a2/stream?n=2", nil); code != 200 || bytes.Count(body, []byte("\n")) != 2 {
		t.Fatalf("GET /counter/a2/stream = %d %q", code, body)
	}
	if code, _, _ := do(t, "POST", "http://"+c.addr+"/counter/a1/incr", nil); code != 403 {
		t.Fatalf("direct POST without the proxy secret = %d; want 403", code)
	}
	if code, _, _ := do(t, "GET", "http://"+pb.public+"/counter/"+strings.Repeat("x", wire.MaxIDLen+1)+"/", nil); code != 400 {
		t.Fatalf("GET with an id over wire.MaxIDLen = %d; want 400", code)
	}

	// The registry's per-namespace gauges are refreshed by the janitor
	// (every 5 s): wait for its pass after the placements, and for a
	// heartbeat.
	var pbOut string
	eventually(t, 20*time.Second, "the janitor publishes the placements of /counter; a heartbeat", func() bool {
		pbOut = scrape(t, "http://"+pb.admin+"/metrics")
		return hasLine(pbOut, `pinned_registry_placements{namespace="/counter"} 3`) &&
			!hasLine(pbOut, `pinned_registry_heartbeats_total 0`)
	}, func() string { return pbOut })
	cOut := scrape(t, "http://"+c.admin+"/metrics")
	// In fleet mode the counter's main listener is its advertise URL: no
	// /metrics there, only on its admin listener.
	if code, _, body := do(t, "GET", "http://"+c.addr+"/metrics", nil); code != 404 || bytes.Contains(body, []byte("pinned_")) {
		t.Errorf("counter's advertised listener /metrics = %d %.80q; want 404", code, body)
	}

	pbFams := promcheck.Strict(t, "pinboard /metrics", []byte(pbOut))
	cFams := promcheck.Strict(t, "counter /metrics", []byte(cOut))
	checkCatalogue(t, pbFams, cFams)

	// The metrics moved with the traffic.
	for _, want := range []string{
		`pinned_placement_claims_total{result="won"} 3`,
		`pinned_registry_live_workers 1`,
		`pinned_registry_namespace_workers{namespace="/counter"} 1`,
		`pinned_registry_requests_total{endpoint="register",code="200"} 1`,
		`pinned_proxy_responses_total{class="4xx"} 1`,
		`pinned_proxy_responses_total{class="2xx"} 6`,
		`pinned_proxy_tunnels_open 0`,
		`pinned_placement_sessions 1`,
		`pinned_proxy_endpoints 1`,
		`pinned_pinboard_lease_seconds 10`,
		`pinned_registry_store_up 1`,
	} {
		if !hasLine(pbOut, want) {
			t.Errorf("pinboard /metrics lacks %q", want)
		}
	}
	for series, least := range map[string]float64{
		`pinned_placecache_hits_total{cache="placements"}`:                    2, // the second GET, the stream
		`pinned_placecache_misses_total{cache="placements"}`:                  3, // 3 claims
		`pinned_placecache_entries{cache="placements"}`:                       2,
		`pinned_proxy_upstream_duration_seconds_count`:                        6,
		`pinned_registry_heartbeats_total`:                                    1,
		`pinned_registry_request_duration_seconds_count{endpoint="register"}`: 1,
	} {
		if v := value(t, pbOut, series); v < least {
			t.Errorf("pinboard %s = %v; want ≥ %v", series, v, least)
		}
	}
	for _, want := range []string{
		`pinned_instances{namespace="/counter"} 3`,
		`pinned_activations_total{namespace="/counter"} 3`,
		`pinned_rejections_total{namespace="/counter",reason="forbidden"} 1`,
		`pinned_request_duration_seconds_count{namespace="/counter"} 6`, // refusals are not timed
		`pinned_open_streams{namespace="/counter"} 0`,
		`pinned_registered 1`,
		`pinned_registrations_total{result="ok"} 1`,
	} {
		if !hasLine(cOut, want) {
			t.Errorf("counter /metrics lacks %q", want)
		}
	}
	if v := value(t, cOut, `pinned_heartbeats_total{result="ok"}`); v < 1 {
		t.Errorf("counter heartbeats ok = %v; want ≥ 1", v)
	}
	if v := value(t, cOut, `pinned_lease_remaining_seconds`); v <= 0 || v > 10 {
		t.Errorf("pinned_lease_remaining_seconds = %v; want in (0, 10]", v)
	}

	// Admin only: the public listener 404s the admin paths.
	if code, _, body := do(t, "GET", "http://"+pb.admin+"/debug/pprof/", nil); code != 200 || !bytes.Contains(body, []byte("goroutine")) {
		t.Errorf("admin /debug/pprof/ = %d", code)
	}
	// On the public port they are data-plane paths: /metrics has no id
	// (404), /debug is a namespace no worker ever served (404 unknown_namespace).
	for p, want := range map[string]int{"/metrics": 404, "/debug/pprof/": 404, "/debug/pprof/heap": 404} {
		if code, _, body := do(t, "GET", "http://"+pb.public+p, nil); code != want || bytes.Contains(body, []byte("goroutine")) {
			t.Errorf("public %s = %d %s; want %d from the proxy", p, code, body, want)
		}
	}

	// Shut the worker down (drain, release, deregister), then scan every
	// log line either process wrote.
	if !c.Terminate(20 * time.Second) {
		t.Fatalf("counter did not exit within 20s of SIGTERM:\n%s", c.Log())
	}
	for proc, log := range map[string]string{"pinboard": pb.Log(), "counter": c.Log()} {
		if !strings.Contains(log, "logger=pinned.") {
			t.Errorf("%s log has no pinned.* record:\n%s", proc, log)
		}
	}
	// noSecretInLogs (startCounter's cleanup) scans both logs.
}

// noSecretInLogs fails the test if any log line of procs contains the
// deployment token or a secret, challenge or challenge value the relay saw
// the worker send (the secret is also the x-pinned-proxy-secret value the
// proxy sends). It also fails if the relay saw no secret and no challenge
// pair, so that the scan cannot pass by looking for nothing.
func noSecretInLogs(t *testing.T, r *relay, procs map[string]*proctest.Proc) {
	if r == nil {
		return // the counter never started
	}
	secrets := r.secrets()
	if len(secrets["secret"]) == 0 || len(secrets["challengeValue"]) == 0 || len(secrets["challenge"]) == 0 {
		t.Errorf("the relay saw no secret, challenge or challenge value: %v", secrets)
	}
	secrets["token"] = []string{token}
	n, size := 0, 0
	for name, p := range procs {
		if p == nil {
			continue
		}
		log := p.Log()
		size += len(log)
		for kind, vals := range secrets {
			for _, v := range vals {
				n++
				if i := strings.Index(log, v); i >= 0 {
					t.Errorf("the %s log contains a %s: …%s…", name, kind, log[max(0, i-80):i])
				}
			}
		}
	}
	t.Logf("secret scan: %d log bytes, %d checks", size, n)
}

// scrape GETs a /metrics URL.
func scrape(t *testing.T, url string) string {
	t.Helper()
	code, _, body := do(t, "GET", url, nil)
	if code != 200 {
		t.Fatalf("GET %s = %d %s", url, code, body)
	}
	return string(body)
}

func hasLine(out, line string) bool {
	for _, l := range strings.Split(out, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// value returns the value of the sample named exactly series (name and
// labels).
func value(t *testing.T, out, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: bad value %q", series, v)
			}
			return f
		}
	}
	t.Fatalf("no sample %s", series)
	return 0
}

// catalogueRow is one row of docs/metrics.md.
type catalogueRow struct{ name, typ string }

var rowRE = regexp.MustCompile("^\\| `([a-z_*]+)` \\| ([a-z]+) \\|")

func readCatalogue(t *testing.T) []catalogueRow {
	t.Helper()
	b, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []catalogueRow
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		m := rowRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if seen[m[1]] {
			t.Errorf("docs/metrics.md: %s has two rows", m[1])
		}
		seen[m[1]] = true
		rows = append(rows, catalogueRow{m[1], m[2]})
		switch {
		case m[2] == "counter" && !strings.HasSuffix(m[1], "_total"):
			t.Errorf("docs/metrics.md: counter %s does not end in _total", m[1])
		case m[2] != "counter" && strings.HasSuffix(m[1], "_total"):
			t.Errorf("docs/metrics.md: %s ends in _total but is a %s", m[1], m[2])
		}
	}
	if len(rows) < 40 {
		t.Fatalf("docs/metrics.md: only %d catalogue rows parsed", len(rows))
	}
	return rows
}

// checkCatalogue compares the families printed with docs/metrics.md.
func checkCatalogue(t *testing.T, outs ...map[string]promcheck.Family) {
	t.Helper()
	rows := readCatalogue(t)
	byName := map[string]catalogueRow{}
	var wild []string
	for _, r := range rows {
		if p, ok := strings.CutSuffix(r.name, "*"); ok {
			wild = append(wild, p)
		} else {
			byName[r.name] = r
		}
	}
	printed := map[string]bool{}
	for _, fams := range outs {
		for name := range fams {
			fam := name
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suf); ok && byName[base].typ == "histogram" {
					fam = base
				}
			}
			if _, ok := byName[fam]; ok {
				printed[fam] = true
				continue
			}
			matched := false
			for _, p := range wild {
				if strings.HasPrefix(fam, p) {
					printed[p+"*"], matched = true, true
				}
			}
			if !matched {
				t.Errorf("%s is printed but has no row in docs/metrics.md", fam)
			}
		}
	}
	var missing []string
	for _, r := range rows {
		if !printed[r.name] {
			missing = append(missing, r.name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/metrics.md rows never printed by the pinboard or the counter: %v", missing)
	}
}

// relay is a TCP relay between the worker and the pinboard that records
// what the worker sends, to learn the secret and challenges it uses.
type relay struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	sent  bytes.Buffer
	conns map[net.Conn]struct{}
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, conns: map[net.Conn]struct{}{}}
	r.wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			r.mu.Lock()
			r.conns[in], r.conns[out] = struct{}{}, struct{}{}
			r.mu.Unlock()
			r.wg.Go(func() {
				_, _ = io.Copy(out, io.TeeReader(in, lockedWriter{r}))
				out.Close()
			})
			r.wg.Go(func() {
				_, _ = io.Copy(in, out)
				in.Close()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

type lockedWriter struct{ r *relay }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	return w.r.sent.Write(p)
}

var secretFieldRE = regexp.MustCompile(`"(secret|challenge|challengeValue)":"([^"]+)"`)

// secrets returns the values of the secret, challenge and challengeValue
// fields the worker sent, by field.
func (r *relay) secrets() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]string{}
	seen := map[string]bool{}
	for _, m := range secretFieldRE.FindAllStringSubmatch(r.sent.String(), -1) {
		if !seen[m[2]] {
			seen[m[2]] = true
			out[m[1]] = append(out[m[1]], m[2])
		}
	}
	return out
}
