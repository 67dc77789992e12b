package pinboard

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/wire"
)

// A registry call whose head announces a body over wire.MaxBodyBytes is
// answered 413 with a JSON error at once, before any byte of the body is
// sent (the proxy's server prefetches a body before a handler runs: the
// refusal must not wait for it), and the connection is closed after it.
func TestRegistryRefusesAnnouncedOversizeAtOnce(t *testing.T) {
	r := start(t, Settings{Dev: true}, NewProxy)
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
	// A proxied path is the data plane's: its own limit, not the registry's.
	resp = rawRequest(t, r.public, "POST /counter/x/ HTTP/1.1\r\nHost: h\r\nContent-Length: "+fmt.Sprint(wire.MaxBodyBytes+1)+"\r\n\r\n"+
		string(make([]byte, wire.MaxBodyBytes+1)))
	if resp.StatusCode() == 413 {
		t.Errorf("a %d-byte body on a proxied path got 413: the registry's limit leaked onto the data plane", wire.MaxBodyBytes+1)
	}
}
