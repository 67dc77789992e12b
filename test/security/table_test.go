package security

import (
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/smuggle"
)

// runTables runs the smuggling tables against the pinboard at addr whose
// only worker is c: every refused case gets its status, one response and a
// closed connection, and the worker sees nothing; every control and
// tolerated case reaches it once; every bad worker answer becomes the
// proxy's 502 with nothing relayed.
func runTables(t *testing.T, addr string, c *capture) {
	warm(t, addr, c)
	cases := smuggle.Requests()
	t.Logf("smuggling table against the pinboard at %s: %d request cases", addr, len(cases))
	for _, tc := range cases {
		before := len(c.requests())
		r, err := smuggle.Send(addr, tc.Raw, 5*time.Second)
		if err != nil {
			t.Errorf("%s: %v", tc.Name, err)
			continue
		}
		if err := tc.Check(r); err != nil {
			t.Errorf("%s: %v (%s)", tc.Name, err, tc.Why)
		} else if _, err := r.JSONError(); err != nil {
			t.Errorf("%s: %v", tc.Name, err)
		}
		if got := c.requests()[before:]; len(got) != 0 {
			t.Errorf("%s: the worker saw %d requests (first %s %s)", tc.Name, len(got), got[0].method, got[0].uri)
		}
	}

	for _, tc := range append(smuggle.Controls(), smuggle.Tolerated()...) {
		before := len(c.requests())
		raw := strings.Replace(tc.Raw, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1)
		r, err := smuggle.Send(addr, raw, 5*time.Second)
		if err != nil {
			t.Errorf("%s: %v", tc.Name, err)
			continue
		}
		if r.Status() != 200 || string(r.Body) != "B:"+tc.Body {
			t.Errorf("control %s: %v %q; want 200 B:%s", tc.Name, r.Statuses, r.Body, tc.Body)
		}
		if n := len(c.requests()) - before; n != 1 {
			t.Errorf("control %s: the worker saw %d requests; want 1", tc.Name, n)
		}
	}

	resps := smuggle.Responses()
	t.Logf("%d response cases", len(resps))
	for _, tc := range resps {
		c.setRaw(tc.Raw)
		r, err := smuggle.Send(addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", 5*time.Second)
		c.setRaw("")
		if err != nil {
			t.Errorf("response %s: %v", tc.Name, err)
			continue
		}
		if r.Status() != 502 || string(r.Body) != `{"error":"bad gateway"}` {
			t.Errorf("response %s: %v %q; want the proxy's 502 (%s)", tc.Name, r.Statuses, r.Raw, tc.Why)
		}
		if s := string(r.Raw); strings.Contains(s, "EVIL") || strings.Contains(s, "X-Evil") || strings.Contains(s, "Set-Cookie") {
			t.Errorf("response %s: worker bytes reached the client: %q", tc.Name, s)
		}
	}
}

// The tables against a pinboard built in process the way cmd/pinboard
// builds it (memory store).
func TestSmugglingPinboardInProcess(t *testing.T) {
	addr := startInProcess(t)
	runTables(t, addr, startCapture(t, addr))
}

// The tables against the pinboard binary, with Redis.
func TestSmugglingPinboardBinary(t *testing.T) {
	addr := startBinary(t)
	runTables(t, addr, startCapture(t, addr))
}
