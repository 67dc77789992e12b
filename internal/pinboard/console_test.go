package pinboard

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// The admin listener serves the console page and the registry API (token
// checked as on the public port); on the public port / is a proxied path;
// what is recorded in the pinboard's sketch reaches GET /registry/hot. In
// -dev and on Redis.
func TestConsoleOnAdminListener(t *testing.T) {
	for _, dev := range []bool{true, false} {
		t.Run(map[bool]string{true: "dev", false: "redis"}[dev], func(t *testing.T) {
			s := Settings{Dev: dev}
			if !dev {
				s.RedisURL = redistest.Start(t).URL
			}
			r := start(t, s)
			r.waitHealth(t, 200)
			hot := r.p.Hot()

			// The page and its assets, with a policy that allows nothing else.
			for path, ctype := range map[string]string{"/": "text/html", "/console.js": "text/javascript", "/console.css": "text/css"} {
				code, hdr, body := r.get(r.admin, path)
				if code != 200 || !strings.HasPrefix(string(hdr.ContentType()), ctype) || len(body) == 0 ||
					!strings.Contains(string(hdr.Peek("Content-Security-Policy")), "script-src 'self'") || string(hdr.Peek("X-Frame-Options")) != "DENY" {
					t.Fatalf("admin %s = %d %q csp %q", path, code, string(hdr.ContentType()), string(hdr.Peek("Content-Security-Policy")))
				}
			}
			if _, _, body := r.get(r.admin, "/"); !bytes.Contains(body, []byte(`<script src="/console.js">`)) {
				t.Fatalf("the page does not load its script:\n%s", body)
			}
			// Never on the public port: / and the assets are proxied paths (no
			// id: 404).
			for _, path := range []string{"/", "/console.js"} {
				if code, _, body := r.get(r.public, path); code != 404 || bytes.Contains(body, []byte("pinboard console")) {
					t.Errorf("public %s = %d; want the proxy's 404, never the console", path, code)
				}
			}

			// The registry on the admin listener: token checked, calls served.
			if code, _ := r.do("GET", r.admin, wire.PathOverview, "", nil); code != 401 {
				t.Fatalf("admin overview without a token = %d; want 401", code)
			}
			w := fakeworker.Start(t, "secret")
			c := "c-0123456789abcdefghijkl"
			if code, body := r.do("POST", r.admin, wire.PathRegister, token, wire.RegisterRequest{
				ClientID: "c1", Secret: "secret", Namespaces: []string{"/counter"}, AdvertiseURL: w.URL, Headroom: 1,
				Challenge: c, ChallengeValue: fakeworker.Value(c),
			}); code != 200 {
				t.Fatalf("register through the admin listener = %d %s", code, body)
			}
			code, body := r.do("GET", r.admin, wire.PathOverview, token, nil)
			var ov wire.OverviewResponse
			json.Unmarshal(body, &ov)
			if code != 200 || len(ov.Workers) != 1 || ov.ProtocolVersion != wire.Version {
				t.Fatalf("admin overview = %d %s", code, body)
			}
			sid := ov.Workers[0].SessionID
			r.p.Store().Claim(context.Background(), "/counter", "alice", sid)
			if code, body := r.do("GET", r.admin, wire.PathPlacements+"/counter/alice", token, nil); code != 200 || !bytes.Contains(body, []byte(`"clientId":"c1"`)) {
				t.Fatalf("admin placement lookup = %d %s", code, body)
			}
			if code, body := r.do("DELETE", r.admin, wire.PathPlacements+"/counter/alice", token, nil); code != 202 {
				t.Fatalf("admin evict = %d %s", code, body)
			}
			if code, body := r.do("POST", r.admin, wire.PathPush, token, wire.PushRequest{ClientID: "c1", Type: wire.MessageDrain}); code != 202 {
				t.Fatalf("admin push = %d %s", code, body)
			}

			// What the data plane records, GET /registry/hot reads.
			now := time.Now()
			for range 3 {
				hot.Record([]byte("/counter/alice"), sid, 200, "", 0, 0, now)
			}
			code, body = r.do("GET", r.admin, wire.PathHot+"?namespace=/counter", token, nil)
			var hr wire.HotResponse
			json.Unmarshal(body, &hr)
			if code != 200 || len(hr.IDs) != 1 || hr.IDs[0].ID != "alice" || hr.IDs[0].Requests != 3 || hr.IDs[0].Holder != sid {
				t.Fatalf("admin hot = %d %s; want alice with 3 requests", code, body)
			}
			if _, body := r.do("GET", r.admin, "/metrics", "", nil); !bytes.Contains(body, []byte("pinned_hotids_error_bound 0")) {
				t.Error("admin /metrics lacks pinned_hotids_error_bound")
			}
		})
	}
}

// get returns status, headers and body of a GET without a token.
func (r *running) get(addr, path string) (int, *fasthttp.ResponseHeader, []byte) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	if err := r.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		return 0, nil, []byte(err.Error())
	}
	h := &fasthttp.ResponseHeader{}
	resp.Header.CopyTo(h)
	return resp.StatusCode(), h, append([]byte(nil), resp.Body()...)
}
