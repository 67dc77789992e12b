package security

import (
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/smuggle"
)

// The public port also serves the registry and /healthz, which the proxy's
// handler never sees. Before the pinboard wrapped them in proxy.Guard, a
// chunked request there ending in a bare-LF trailer ("0\r\n\n") kept its
// connection, and the GET /counter/b behind it (which a front end reading
// on to CRLFCRLF never saw) reached the worker; obs-fold, bare LF, leading
// zeros and field floods reached the registry. Now the target-independent
// cases get the proxy's answer there too; chunk errors, which only reading
// the body reveals, get the registry's own refusal, and the connection
// closes either way.
func TestRegistryPathsScreened(t *testing.T) {
	addr := startInProcess(t)
	c := startCapture(t, addr)
	warm(t, addr, c)
	n := 0
	for _, target := range []string{"/registry/heartbeat", "/registry/register", "/healthz"} {
		cases := smuggle.Requests()
		cases = append(cases, smuggle.Request{Name: "bare-LF trailer end", Class: smuggle.ClassChunk,
			Raw: "POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\nGET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n"})
		for _, tc := range cases {
			if !tc.AnyPath() {
				continue
			}
			tc = tc.WithTarget(target)
			n++
			before := len(c.requests())
			r, err := smuggle.Send(addr, tc.Raw, 5*time.Second)
			if err != nil {
				t.Errorf("%s %s: %v", target, tc.Name, err)
				continue
			}
			if tc.Class == smuggle.ClassChunk {
				if len(r.Statuses) != 1 || !r.Closed || tc.Status != 0 && r.Statuses[0] < 400 {
					t.Errorf("%s %s: %v closed=%v; want one refusal and close", target, tc.Name, r.Statuses, r.Closed)
				}
			} else if err := tc.Check(r); err != nil {
				t.Errorf("%s %s: %v", target, tc.Name, err)
			}
			if got := c.requests()[before:]; len(got) != 0 {
				t.Errorf("%s %s: the worker saw %s %s", target, tc.Name, got[0].method, got[0].uri)
			}
		}
	}
	t.Logf("%d registry and /healthz cases", n)
}
