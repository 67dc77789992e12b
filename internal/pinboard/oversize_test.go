package pinboard

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/registry"
)

// A registry call whose head announces a body over wire.MaxBodyBytes is
// answered 413 with a JSON error at once, before any byte of the body is
// sent (the proxy's server prefetches a body before a handler runs: the
// refusal must not wait for it), and the connection is closed after it.
func TestRegistryRefusesAnnouncedOversizeAtOnce(t *testing.T) {
	for _, loops := range []int{0, 1} { // the fasthttp server alone, or behind the event loops
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) { refusesOversize(t, loops) })
	}
}

func refusesOversize(t *testing.T, loops int) {
	r := start(t, Settings{Dev: true, Loops: loops})
	r.waitHealth(t, 200)
	for _, tc := range []struct{ name, extra string }{
		{"plain", ""},
		{"expect 100-continue", "Expect: 100-continue\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", r.public)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			head := "POST " + wire.PathHeartbeat + " HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + token +
				"\r\nContent-Type: application/json\r\n" + tc.extra + "Content-Length: " + fmt.Sprint(2<<20) + "\r\n\r\n"
			if _, err := c.Write([]byte(head)); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_ = c.SetReadDeadline(start.Add(time.Second))
			resp := &fasthttp.Response{}
			br := bufio.NewReader(c)
			if err := resp.Read(br); err != nil {
				t.Fatalf("no answer within 1 s to a head announcing 2 MiB (only the head sent): %v", err)
			}
			var e wire.Error
			if resp.StatusCode() != 413 || json.Unmarshal(resp.Body(), &e) != nil || e.Error == "" {
				t.Fatalf("answer = %d %q; want 413 with a JSON error", resp.StatusCode(), resp.Body())
			}
			if !resp.ConnectionClose() {
				t.Errorf("413 without Connection: close: the unread body would be read as the next request")
			}
			t.Logf("413 after %v: %s", time.Since(start).Round(time.Microsecond), resp.Body())
		})
	}
	// Under the limit, a registry call is served as before (401: a bad token).
	body := `{"sessionId":"AAAAAAAAAAAAAAAAAAAAAAAA"}`
	resp := rawRequest(t, r.public, "POST "+wire.PathHeartbeat+" HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer wrong-token-0123456789abcdef\r\n"+
		"Content-Type: application/json\r\nContent-Length: "+fmt.Sprint(len(body))+"\r\n\r\n"+body)
	if resp.StatusCode() != 401 {
		t.Errorf("small heartbeat with a bad token = %d %s; want 401", resp.StatusCode(), resp.Body())
	}
	// With Expect: 100-continue too: the registry's call, invited to send
	// its body and served, never routed as if /registry were a namespace.
	c, err := net.Dial("tcp", r.public)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "POST "+wire.PathHeartbeat+" HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer wrong-token-0123456789abcdef\r\n"+
		"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: "+fmt.Sprint(len(body))+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("small heartbeat with Expect: first line %q, %v; want 100 Continue", line, err)
	}
	_, _ = br.ReadString('\n')
	_, _ = io.WriteString(c, body)
	if err := resp.Read(br); err != nil || resp.StatusCode() != 401 {
		t.Errorf("small heartbeat with Expect and a bad token = %d %s, %v; want 401", resp.StatusCode(), resp.Body(), err)
	}
	// A proxied path is the data plane's: its own limit, not the registry's.
	resp = rawRequest(t, r.public, "POST /counter/x/ HTTP/1.1\r\nHost: h\r\nContent-Length: "+fmt.Sprint(wire.MaxBodyBytes+1)+"\r\n\r\n"+
		string(make([]byte, wire.MaxBodyBytes+1)))
	if resp.StatusCode() == 413 {
		t.Errorf("a %d-byte body on a proxied path got 413: the registry's limit leaked onto the data plane", wire.MaxBodyBytes+1)
	}
}

// While Redis is known to be down, registry calls are answered 503 +
// Retry-After at once, not after a wait per request (the store's circuit),
// and everything comes back when Redis does.
func TestStoreOutageAnsweredAtOnce(t *testing.T) {
	rs := redistest.Start(t)
	r := start(t, Settings{RedisURL: rs.URL})
	r.waitHealth(t, 200)
	rs.Kill()
	h := r.waitHealth(t, 503)
	if !strings.Contains(h.Store, "unavailable") {
		t.Fatalf("/healthz store = %q; want unavailable", h.Store)
	}
	// /healthz turns 503 on its own failed ping; the circuit opens once
	// the prober's ping has failed too ("failing fast"): from then on
	// Redis is known to be down.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(h.Store, "failing fast"); h = r.waitHealth(t, 503) {
		if time.Now().After(deadline) {
			t.Fatalf("/healthz store = %q; the circuit never opened", h.Store)
		}
		time.Sleep(20 * time.Millisecond) // polling the pinboard's view of an external process
	}
	hb := `{"sessionId":"AAAAAAAAAAAAAAAAAAAAAAAA"}`
	var slowest time.Duration
	for i := range 20 {
		req := "GET " + wire.PathWorkers + " HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + token + "\r\n\r\n" // reads: Redis's client retries them
		if i%2 == 1 {
			req = "POST " + wire.PathHeartbeat + " HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + token +
				"\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(hb)) + "\r\n\r\n" + hb
		}
		start := time.Now()
		resp := rawRequest(t, r.public, req)
		d := time.Since(start)
		// A request that waited for Redis would take up to the registry's
		// store timeout; only half of it fails the test, which no stall of a
		// busy machine reaches (the slowest is logged: milliseconds when quiet).
		if resp.StatusCode() != 503 || len(resp.Header.Peek(wire.HeaderRetryAfter)) == 0 || d >= registry.DefaultStoreTimeout/2 {
			t.Fatalf("%s while Redis is down = %d (Retry-After %q) after %v; want 503 + Retry-After at once, not after a wait for the store timeout (%v)",
				strings.Fields(req)[1], resp.StatusCode(), resp.Header.Peek(wire.HeaderRetryAfter), d, registry.DefaultStoreTimeout)
		}
		slowest = max(slowest, d)
	}
	t.Logf("20 registry calls while Redis was down: the slowest answered after %v", slowest)
	rs.Restart(t)
	r.waitHealth(t, 200)
}

func TestParseStoreProbe(t *testing.T) {
	for _, tc := range []struct {
		probe, timeout string
		want, wantTO   time.Duration
		err            bool
	}{
		{"", "", 250 * time.Millisecond, time.Second, false},
		{"off", "", -1, time.Second, false},
		{"100ms", "3s", 100 * time.Millisecond, 3 * time.Second, false},
		{"soon", "", 0, 0, true},
		{"", "0s", 0, 0, true},
	} {
		s, err := ParseSettings([]string{"-dev"}, envOf(map[string]string{EnvStoreProbe: tc.probe, EnvStoreProbeTimeout: tc.timeout}), io.Discard)
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), "PINBOARD_STORE_PROBE") {
				t.Errorf("probe %q timeout %q: err = %v; want one naming the variable", tc.probe, tc.timeout, err)
			}
			continue
		}
		if err != nil || s.StoreProbe != tc.want || s.StoreProbeTimeout != tc.wantTO {
			t.Errorf("probe %q timeout %q = %v, %v, %v; want %v, %v", tc.probe, tc.timeout, s.StoreProbe, s.StoreProbeTimeout, err, tc.want, tc.wantTO)
		}
	}
}
