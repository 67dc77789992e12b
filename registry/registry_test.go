package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
)

var bg = context.Background()

// The whole protocol, happy path: register, heartbeat (re-proving the
// URL), push delivered once, release, introspection.
func TestProtocol(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "worker-secret")
		sid := e.register(registerBody(w, "client1", "/counter", "/chat"))
		if len(sid) != wire.SessionIDLen || wire.CheckSessionID(sid) != wire.SegmentOK {
			t.Fatalf("session id %q: want %d URL-safe characters", sid, wire.SessionIDLen)
		}
		hits := w.Hits()
		r, hb := e.heartbeat(heartbeatBody(sid, w, 1))
		if r.code != 200 || hb.ExpiresInMs != e.reg.leaseMs || hb.Reregister || len(hb.Messages) != 0 {
			t.Fatalf("heartbeat = %d %s; want 200 with expiresInMs %d", r.code, r.body, e.reg.leaseMs)
		}
		if w.Hits() != hits+1 {
			t.Fatalf("the heartbeat's challenge pair was not re-proved (hits %d -> %d)", hits, w.Hits())
		}
		// A pairless heartbeat of a verified session: accepted, no reregister.
		if r, hb := e.heartbeat(heartbeatBody(sid, nil, 0)); r.code != 200 || hb.Reregister {
			t.Fatalf("pairless heartbeat = %d %s; want 200 without reregister", r.code, r.body)
		}

		r = e.post(wire.PathPush, wire.PushRequest{ClientID: "client1", Type: wire.MessageDrain, DeadlineMs: 1234})
		if r.code != 202 {
			t.Fatalf("push = %d %s; want 202", r.code, r.body)
		}
		e.post(wire.PathPush, wire.PushRequest{ClientID: "client1", Type: wire.MessageWindDown})
		if got := e.metric("pinned_registry_messages_pushed_total"); got != "2" {
			t.Errorf("messages pushed = %s; want 2", got)
		}
		_, hb = e.heartbeat(heartbeatBody(sid, w, 2))
		want := []wire.Message{{Type: wire.MessageDrain, DeadlineMs: 1234}, {Type: wire.MessageWindDown}}
		if !slices.Equal(hb.Messages, want) {
			t.Fatalf("heartbeat messages = %v; want %v", hb.Messages, want)
		}
		if got := e.metric("pinned_registry_messages_delivered_total"); got != "2" {
			t.Errorf("messages delivered = %s; want 2", got)
		}
		if _, hb = e.heartbeat(heartbeatBody(sid, w, 3)); len(hb.Messages) != 0 {
			t.Fatalf("messages delivered twice: %v", hb.Messages)
		}

		if w, _ := e.st.Claim(bg, "/counter", "abc", sid); w != sid {
			t.Fatal("claim failed")
		}
		e.st.Claim(bg, "/counter", "def", sid)
		var ws wire.WorkersResponse
		e.do("GET", wire.PathWorkers, token, nil).decode(t, &ws)
		if len(ws.Workers) != 1 {
			t.Fatalf("workers = %+v; want one", ws)
		}
		wi := ws.Workers[0]
		if wi.SessionID != sid || wi.ClientID != "client1" || wi.AdvertiseURL != w.URL || !wi.Verified ||
			wi.Headroom != 9 || wi.Placements["/counter"] != 2 || wi.Placements["/chat"] != 0 || wi.ExpiresAtMs <= wi.LastHeartbeatMs {
			t.Fatalf("worker info = %+v", wi)
		}

		var rel wire.ReleaseResponse
		r = e.post(wire.PathRelease, wire.ReleaseRequest{ClientID: "client1", Namespace: "/counter", ID: "abc"})
		r.decode(t, &rel)
		if r.code != 200 || !rel.Released {
			t.Fatalf("release = %d %s; want released", r.code, r.body)
		}
		if p, _ := e.st.Placement(bg, "/counter", "abc"); p != "" {
			t.Fatalf("placement after release = %q", p)
		}

		var ov wire.OverviewResponse
		e.do("GET", wire.PathOverview, token, nil).decode(t, &ov)
		if ov.ProtocolVersion != wire.Version || ov.LeaseMs != e.reg.leaseMs || ov.Sessions != 1 ||
			ov.Namespaces["/counter"] != (wire.NamespaceOverview{Workers: 1, AvailableWorker: 1, Headroom: 9, Placements: 1}) ||
			ov.Namespaces["/chat"].Workers != 1 {
			t.Fatalf("overview = %+v", ov)
		}
		if !strings.Contains(e.logs.String(), "worker registered") || strings.Contains(e.logs.String(), "worker-secret") ||
			strings.Contains(e.logs.String(), token) {
			t.Fatalf("logs must record the registration and never a secret or token:\n%s", e.logs)
		}
	})
}

func TestAuth(t *testing.T) {
	e := newEnv(t, "memstore", func(c *Config) { c.Tokens = []string{token, oldToken} })
	f := func(name string, hdr string, wantCode int) {
		t.Helper()
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(e.url + wire.PathWorkers)
		if hdr != "" {
			req.Header.Set("Authorization", hdr)
		}
		if err := e.hc.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != wantCode {
			t.Errorf("%s: GET /registry/workers = %d; want %d", name, resp.StatusCode(), wantCode)
		}
		if wantCode == 401 && !strings.HasPrefix(string(resp.Header.Peek("WWW-Authenticate")), "Bearer") {
			t.Errorf("%s: 401 without WWW-Authenticate: Bearer", name)
		}
	}
	f("no header", "", 401)
	f("current token", "Bearer "+token, 200)
	f("previous token (rotation)", "Bearer "+oldToken, 200)
	f("scheme is case-insensitive", "bearer "+token, 200)
	f("basic scheme", "Basic "+token, 401)
	f("prefix of the token", "Bearer "+token[:len(token)-1], 401)
	f("token plus a byte", "Bearer "+token+"x", 401)
	f("much longer", "Bearer "+strings.Repeat(token, 10), 401)
	f("empty token", "Bearer ", 401)
	f("same length, last byte differs", "Bearer "+token[:len(token)-1]+"X", 401)

	// Every registry endpoint is authenticated; /healthz is not.
	for _, p := range []struct{ method, path string }{
		{"POST", wire.PathRegister}, {"POST", wire.PathHeartbeat}, {"POST", wire.PathRelease}, {"POST", wire.PathDeregister},
		{"POST", wire.PathPush}, {"GET", wire.PathWorkers}, {"GET", wire.PathOverview},
	} {
		if r := e.do(p.method, p.path, "", "{}"); r.code != 401 || r.hdr["www-authenticate"] == "" {
			t.Errorf("%s %s without a token = %d; want 401 with WWW-Authenticate", p.method, p.path, r.code)
		}
	}
	if r := e.do("GET", wire.PathHealthz, "", nil); r.code != 200 {
		t.Errorf("GET /healthz without a token = %d; want 200", r.code)
	}

	// Rotation finished: the old token is dropped on reload.
	if err := e.reg.SetTokens([]string{token}); err != nil {
		t.Fatal(err)
	}
	f("previous token after reload", "Bearer "+oldToken, 401)
	f("current token after reload", "Bearer "+token, 200)
	if err := e.reg.SetTokens([]string{"short"}); err == nil {
		t.Fatal("SetTokens accepted a 5-byte token")
	}
	f("current token after a refused reload", "Bearer "+token, 200)
}

// The token check hashes both sides and compares the digests with
// crypto/subtle for every configured token, whatever is presented.
func TestTokenCheckIsConstantTimeOverDigests(t *testing.T) {
	ts, err := newTokenSet([]string{token, oldToken})
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	real := ts.eq
	ts.eq = func(a, b []byte) int {
		calls++
		if len(a) != sha256.Size || len(b) != sha256.Size {
			t.Fatalf("compared %d and %d bytes; want two SHA-256 digests", len(a), len(b))
		}
		return real(a, b)
	}
	for _, p := range []string{"", "x", token, oldToken, token[:5], token + token, oldToken[:len(oldToken)-1] + "Z"} {
		calls = 0
		id, got := ts.check([]byte(p))
		if want := p == token || p == oldToken; got != want {
			t.Errorf("check(%q) = %v; want %v", p, got, want)
		}
		if wantID := map[string]string{token: tokenID(token), oldToken: tokenID(oldToken)}[p]; id != wantID {
			t.Errorf("check(%q) id = %q; want %q", p, id, wantID)
		}
		if calls != 2 {
			t.Errorf("check(%q) made %d comparisons; want 2 (every token, no early exit)", p, calls)
		}
	}
}

func TestTokenValidation(t *testing.T) {
	f := func(tokens []string, wantSub string) {
		t.Helper()
		_, err := newTokenSet(tokens)
		if err == nil || !strings.Contains(err.Error(), wantSub) {
			t.Errorf("newTokenSet(%q) = %v; want an error containing %q", tokens, err, wantSub)
		}
	}
	f(nil, "no deployment token")
	f([]string{"short"}, "at least 16")
	f([]string{token, oldToken, token + "3"}, "at most 2")
	f([]string{"has space in it 0123456789"}, "visible ASCII")
	f([]string{"has,comma,0123456789"}, "without commas")
}

func TestBodies(t *testing.T) {
	e := newEnv(t, "memstore")
	w := fakeworker.Start(t, "s")
	valid := registerBody(w, "c1")
	f := func(path, body string, wantCode int, wantField string) {
		t.Helper()
		r := e.post(path, body)
		if r.code != wantCode {
			t.Errorf("POST %s %.80q = %d %s; want %d", path, body, r.code, r.body, wantCode)
			return
		}
		if we := r.errField(t); we.Field != wantField || we.Error == "" {
			t.Errorf("POST %s %.80q error = %+v; want field %q and a message", path, body, we, wantField)
		}
	}
	mod := func(m func(*wire.RegisterRequest)) string {
		b := valid
		b.Namespaces = slices.Clone(valid.Namespaces)
		m(&b)
		j, _ := jsonMarshal(b)
		return j
	}
	f(wire.PathRegister, "", 400, "")
	f(wire.PathRegister, "{", 400, "")
	f(wire.PathRegister, "[1,2]", 400, "")
	f(wire.PathRegister, `{"clientId": 5}`, 400, "clientId")
	f(wire.PathRegister, `{"clientId":"c","headroom":"many"}`, 400, "headroom")
	f(wire.PathRegister, `{"clientId":"c","namespaces":"/counter"}`, 400, "namespaces")
	f(wire.PathRegister, "null", 400, "clientId")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.ClientID = "" }), 400, "clientId")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.ClientID = "a/b" }), 400, "clientId")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Secret = "" }), 400, "secret")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Secret = "two words" }), 400, "secret")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Namespaces = nil }), 400, "namespaces")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Namespaces = []string{"counter"} }), 400, "namespaces")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Namespaces = []string{"/registry"} }), 400, "namespaces")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Namespaces = []string{"/a%2Fb"} }), 400, "namespaces")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.AdvertiseURL = "ftp://h" }), 400, "advertiseUrl")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Headroom = -1 }), 400, "headroom")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Challenge = "" }), 400, "challenge")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.ChallengeValue = "" }), 400, "challengeValue")
	f(wire.PathRegister, mod(func(b *wire.RegisterRequest) { b.Challenge, b.ChallengeValue = "", "" }), 400, "challenge")
	f(wire.PathRegister, `{"clientId":"c",`+strings.Repeat(" ", wire.MaxBodyBytes)+`}`, 413, "")

	f(wire.PathHeartbeat, `{}`, 400, "sessionId")
	f(wire.PathHeartbeat, `{"sessionId":"a b"}`, 400, "sessionId")
	f(wire.PathHeartbeat, `{"sessionId":"s","headroom":-2}`, 400, "headroom")
	f(wire.PathHeartbeat, `{"sessionId":"s","drainDeadline":-2}`, 400, "drainDeadline")
	f(wire.PathHeartbeat, `{"sessionId":"s","challenge":"x"}`, 400, "challengeValue")
	f(wire.PathHeartbeat, `{"sessionId":"s","challengeValue":"x"}`, 400, "challenge")
	f(wire.PathHeartbeat, `{"sessionId":"s","draining":"yes"}`, 400, "draining")
	f(wire.PathRelease, `{"clientId":"c","namespace":"/n"}`, 400, "id")
	f(wire.PathRelease, `{"clientId":"c","namespace":"n","id":"x"}`, 400, "namespace")
	f(wire.PathRelease, `{"namespace":"/n","id":"x"}`, 400, "clientId")
	f(wire.PathRelease, `{"clientId":"c","namespace":"/n","id":".."}`, 400, "id")
	f(wire.PathPush, `{"clientId":"c","type":"reboot"}`, 400, "type")
	f(wire.PathPush, `{"clientId":"c","type":"drain","deadlineMs":-1}`, 400, "deadlineMs")
	f(wire.PathPush, `{"clientId":"nobody","type":"drain"}`, 404, "clientId")

	// Unknown fields are ignored; duplicate namespaces collapse.
	body := mod(func(b *wire.RegisterRequest) { b.Namespaces = []string{"/counter", "/counter"} })
	body = strings.Replace(body, "{", `{"futureField":{"nested":[1,2]},`, 1)
	r := e.post(wire.PathRegister, body)
	if r.code != 200 {
		t.Fatalf("register with an unknown field = %d %s; want 200", r.code, r.body)
	}
	var ws wire.WorkersResponse
	e.do("GET", wire.PathWorkers, token, nil).decode(t, &ws)
	if len(ws.Workers) != 1 || !slices.Equal(ws.Workers[0].Namespaces, []string{"/counter"}) {
		t.Fatalf("workers = %+v; want one worker serving [/counter]", ws)
	}

	// A body over the limit sent chunked (no Content-Length) is refused too.
	big := `{"clientId":"` + strings.Repeat("x", wire.MaxBodyBytes) + `"}`
	if r := e.postChunked(wire.PathRegister, big); r.code != 413 {
		t.Fatalf("chunked oversized body = %d; want 413", r.code)
	}
}

func jsonMarshal(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

func TestCanonicalAdvertiseURL(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got, err := canonicalAdvertiseURL(in)
		if want == "" {
			if err == nil {
				t.Errorf("canonicalAdvertiseURL(%q) = %q; want an error", in, got)
			}
			return
		}
		if got != want || err != nil {
			t.Errorf("canonicalAdvertiseURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	f("http://10.0.0.1:8080", "http://10.0.0.1:8080")
	f("HTTP://Worker.Internal:8080/", "http://worker.internal:8080")
	f("https://w", "https://w")
	f("http://[::1]:9000", "http://[::1]:9000")
	f("", "")
	f("10.0.0.1:8080", "")
	f("ftp://h", "")
	f("file:///etc/passwd", "")
	f("http://user:pw@h", "")
	f("http://h/path", "")
	f("http://h?x=1", "")
	f("http://h#f", "")
	f("http://h?", "")
	f("http://h:0", "")
	f("http://h:99999", "")
	f("http://h:", "")
	f("http://", "")
	f("http://h{x}", "")
	f("http://"+strings.Repeat("a", MaxAdvertiseURLLen), "")
	f("http://W.Internal.:8080", "http://w.internal:8080")
	f("http://10.0.0.1:80", "http://10.0.0.1")
	f("https://h:443", "https://h")
	f("http://h:0080", "http://h")
	f("http://h:08080", "http://h:8080")
	f("https://h:80", "https://h:80")
	f("http://[0:0:0:0:0:0:0:1]:9000", "http://[::1]:9000")
	f("http://[::FFFF:7F00:1]", "http://[::ffff:127.0.0.1]")
	f("http://[1.2.3.4]", "")
	f("http://::1", "")
	f("http://2130706433", "")
	f("http://0177.0.0.1", "")
}

// Every way a challenge can fail refuses the registration with 422, creates
// no session, and never echoes what the worker sent.
func TestChallengeFailuresRefuseRegistration(t *testing.T) {
	e := newEnv(t, "memstore", func(c *Config) { c.ChallengeTimeout = 300 * time.Millisecond })
	w := fakeworker.Start(t, "right-secret")
	f := func(name string, mode fakeworker.Mode, mutate func(*wire.RegisterRequest), wantReason string) {
		t.Helper()
		w.SetMode(mode)
		b := registerBody(w, "c-"+strings.ReplaceAll(name, " ", "-"))
		if mutate != nil {
			mutate(&b)
		}
		failures := `pinned_registry_registration_failures_total{reason="` + wantReason + `"}`
		challenges := `pinned_registry_challenge_failures_total{reason="` + wantReason + `"}`
		f0, c0 := e.metric(failures), e.metric(challenges)
		r := e.post(wire.PathRegister, b)
		if f1, c1 := e.metric(failures), e.metric(challenges); f1 != inc(f0) || c1 != inc(c0) {
			t.Errorf("%s: %s %s -> %s, %s %s -> %s; want +1 each", name, failures, f0, f1, challenges, c0, c1)
		}
		if r.code != 422 {
			t.Errorf("%s: register = %d %s; want 422", name, r.code, r.body)
			return
		}
		we := r.errField(t)
		if we.Field != "challenge" || !strings.HasPrefix(we.Error, "challenge failed") {
			t.Errorf("%s: error = %+v; want field challenge", name, we)
		}
		if bytes.Contains(r.body, []byte(fakeworker.Marker)) {
			t.Errorf("%s: the worker's body leaked into the response: %s", name, r.body)
		}
		if !strings.Contains(e.logs.String(), "msg=\"registration refused\" logger=pinned.registry client="+b.ClientID) ||
			!strings.Contains(e.logs.String(), "reason="+wantReason) {
			t.Errorf("%s: no log line with reason=%s:\n%s", name, wantReason, e.logs)
		}
	}
	f("mismatch", fakeworker.WrongValue, nil, challengeMismatch)
	f("wrong secret", fakeworker.OK, func(b *wire.RegisterRequest) { b.Secret = "wrong-secret" }, challengeStatus)
	f("redirect", fakeworker.Redirect, nil, challengeRedirect)
	f("oversized", fakeworker.Huge, nil, challengeTooLarge)
	f("oversized chunked", fakeworker.HugeChunked, nil, challengeTooLarge)
	f("malformed", fakeworker.Malformed, nil, challengeMalformed)
	f("status 500", fakeworker.Status500, nil, challengeStatus)
	start := time.Now()
	f("timeout", fakeworker.Slow, nil, challengeTimeout)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a silent worker held the registration for %v; want about the 300ms challenge timeout", d)
	}
	closed := fakeworker.Start(t, "s")
	closed.Close()
	f("unreachable", fakeworker.OK, func(b *wire.RegisterRequest) { b.AdvertiseURL = closed.URL }, challengeUnreachable)
	if s, _ := e.st.Sessions(bg); len(s) != 0 {
		t.Fatalf("refused registrations created sessions: %v", s)
	}
	w.SetMode(fakeworker.OK)
	e.register(registerBody(w, "finally-ok"))
}

func TestAdvertiseNetworkAllowList(t *testing.T) {
	w := fakeworker.Start(t, "s")
	e := newEnv(t, "memstore", func(c *Config) { c.AdvertiseNetworks = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")} })
	// An IP literal outside the list is refused when the body is parsed.
	r := e.post(wire.PathRegister, registerBody(w, "c1"))
	if r.code != 400 || r.errField(t).Field != "advertiseUrl" || !strings.Contains(string(r.body), "outside the pinboard's advertise networks") {
		t.Fatalf("register of 127.0.0.1 with allow-list 10/8 = %d %s; want 400 advertiseUrl", r.code, r.body)
	}
	// A name is checked at dial time, on the address it resolves to.
	b := registerBody(w, "c2")
	b.AdvertiseURL = strings.Replace(w.URL, "127.0.0.1", "localhost", 1)
	r = e.post(wire.PathRegister, b)
	if r.code != 422 || !strings.Contains(string(r.body), "outside the pinboard's advertise networks") {
		t.Fatalf("register of localhost with allow-list 10/8 = %d %s; want 422", r.code, r.body)
	}
	if w.Hits() != 0 {
		t.Fatalf("the worker was contacted %d times; the dial must be refused before connecting", w.Hits())
	}
	e2 := newEnv(t, "memstore", func(c *Config) { c.AdvertiseNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")} })
	e2.register(registerBody(w, "c1"))
	e2.register(b)
}

func TestHeartbeatNacks(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody("unknownSession", nil, 0))); n != wire.NackReregister {
			t.Fatalf("heartbeat of an unknown session: nack %q; want reregister", n)
		}
		hits := w.Hits()
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody("unknownSession", w, 0))); n != wire.NackReregister {
			t.Fatalf("heartbeat with a pair of an unknown session: nack %q; want reregister", n)
		}
		if w.Hits() != hits {
			t.Fatal("an unknown session's heartbeat made the pinboard dial the worker")
		}
		sid := e.register(registerBody(w, "c1"))
		// A heartbeat whose challenge fails is refused.
		w.SetMode(fakeworker.WrongValue)
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody(sid, w, 1))); n != wire.NackReregister {
			t.Fatalf("heartbeat with a failing challenge: nack %q; want reregister", n)
		}
		w.SetMode(fakeworker.OK)
		if r, _ := e.heartbeat(heartbeatBody(sid, w, 2)); r.code != 200 {
			t.Fatalf("heartbeat = %d %s", r.code, r.body)
		}
	})
}

// A worker that registered without a challenge pair (AllowUnverified) is
// told to reregister in each pairless ack until a pair verifies.
func TestUnverifiedSession(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		b := registerBody(w, "legacy")
		b.Challenge, b.ChallengeValue = "", ""
		sid := e.register(b)
		if r, hb := e.heartbeat(heartbeatBody(sid, nil, 0)); r.code != 200 || !hb.Reregister {
			t.Fatalf("pairless heartbeat of an unverified session = %d %s; want 200 with reregister", r.code, r.body)
		}
		if r, hb := e.heartbeat(heartbeatBody(sid, w, 1)); r.code != 200 || hb.Reregister {
			t.Fatalf("verified heartbeat = %d %s; want 200 without reregister", r.code, r.body)
		}
		if r, hb := e.heartbeat(heartbeatBody(sid, nil, 0)); r.code != 200 || hb.Reregister {
			t.Fatalf("pairless heartbeat after verification = %d %s; want no reregister", r.code, r.body)
		}
	}, func(c *Config) { c.AllowUnverified = true })
}

func TestExpiryRemovesWorker(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		sid := e.register(registerBody(w, "c1"))
		e.st.Claim(bg, "/counter", "x", sid)
		e.expire()
		var ws wire.WorkersResponse
		e.do("GET", wire.PathWorkers, token, nil).decode(t, &ws)
		if len(ws.Workers) != 0 {
			t.Fatalf("workers after the lease = %+v; want none", ws)
		}
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody(sid, w, 1))); n != wire.NackReregister {
			t.Fatalf("heartbeat after the lease: nack %q; want reregister", n)
		}
		// The janitor collects its placement after the grace (0 here).
		e.reg.Sweep(bg)
		if p, _ := e.st.Placement(bg, "/counter", "x"); p != "" {
			t.Fatalf("placement of the expired session after a sweep = %q; want none", p)
		}
		var out bytes.Buffer
		e.reg.Metrics().WritePrometheus(&out)
		for _, want := range []string{"pinned_registry_live_workers 0", "pinned_registry_reaped_placements_total 1",
			"pinned_registry_reaped_sessions_total 1", "pinned_registry_store_up 1"} {
			if !strings.Contains(out.String(), want+"\n") {
				t.Errorf("metrics lack %q:\n%s", want, out.String())
			}
		}
	}, withLease(300*time.Millisecond), func(c *Config) { c.ReapGrace = time.Nanosecond })
}

func TestSupersede(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w1 := fakeworker.Start(t, "s1")
		w2 := fakeworker.Start(t, "s2")
		// By clientId: the same client registers again from another URL.
		old := e.register(registerBody(w1, "c1"))
		cur := e.register(registerBody(w2, "c1"))
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody(old, w1, 1))); n != wire.NackSuperseded {
			t.Fatalf("heartbeat of a session superseded by clientId: nack %q; want superseded", n)
		}
		if r, _ := e.heartbeat(heartbeatBody(cur, w2, 1)); r.code != 200 {
			t.Fatalf("heartbeat of the new session = %d", r.code)
		}
		// By advertiseUrl: another client at the same URL.
		next := e.register(registerBody(w2, "c2"))
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody(cur, nil, 0))); n != wire.NackSuperseded {
			t.Fatalf("heartbeat of a session superseded by advertiseUrl: nack %q; want superseded", n)
		}
		if r, _ := e.heartbeat(heartbeatBody(next, w2, 2)); r.code != 200 {
			t.Fatalf("heartbeat of the newest session = %d", r.code)
		}
		var ws wire.WorkersResponse
		e.do("GET", wire.PathWorkers, token, nil).decode(t, &ws)
		sup := 0
		for _, w := range ws.Workers {
			if w.Superseded {
				sup++
			}
		}
		if len(ws.Workers) != 3 || sup != 2 {
			t.Fatalf("workers = %+v; want 3 listed, 2 superseded (kept until their lease runs out)", ws)
		}
		if !strings.Contains(e.logs.String(), "session superseded") {
			t.Fatalf("no supersede log line:\n%s", e.logs)
		}
		for _, s := range []string{old, cur} {
			if !strings.Contains(e.logs.String(), "session="+s+" by=") {
				t.Errorf("no supersede record naming session %s:\n%s", s, e.logs)
			}
		}
		if got := e.metric("pinned_registry_superseded_total"); got != "2" {
			t.Errorf("pinned_registry_superseded_total = %s; want 2", got)
		}
	})
}

func TestPushExactlyOnceUnderConcurrentHeartbeats(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		sid := e.register(registerBody(w, "c1"))
		const pushes, beaters = 12, 6
		for i := range pushes {
			if r := e.post(wire.PathPush, wire.PushRequest{ClientID: "c1", Type: wire.MessageDrain, DeadlineMs: int64(i + 1)}); r.code != 202 {
				t.Fatalf("push = %d", r.code)
			}
		}
		var mu sync.Mutex
		seen := map[int64]int{}
		var wg sync.WaitGroup
		for range beaters {
			wg.Go(func() {
				for range 3 {
					r, hb := e.heartbeat(heartbeatBody(sid, nil, 0))
					if r.code != 200 {
						t.Errorf("heartbeat = %d", r.code)
					}
					mu.Lock()
					for _, m := range hb.Messages {
						seen[m.DeadlineMs]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(seen) != pushes {
			t.Fatalf("delivered %d distinct messages; want %d", len(seen), pushes)
		}
		for d, n := range seen {
			if n != 1 {
				t.Fatalf("message %d delivered %d times; want once", d, n)
			}
		}
	})
}

func TestReleaseByNonOwnerLeavesPlacement(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		wa := fakeworker.Start(t, "sa")
		wb := fakeworker.Start(t, "sb")
		a := e.register(registerBody(wa, "ca"))
		e.register(registerBody(wb, "cb"))
		e.st.Claim(bg, "/counter", "x", a)
		f := func(client string, want bool) {
			t.Helper()
			var rel wire.ReleaseResponse
			r := e.post(wire.PathRelease, wire.ReleaseRequest{ClientID: client, Namespace: "/counter", ID: "x"})
			r.decode(t, &rel)
			if r.code != 200 || rel.Released != want {
				t.Fatalf("release by %s = %d %s; want released=%v", client, r.code, r.body, want)
			}
		}
		f("cb", false)
		f("nobody", false)
		if p, _ := e.st.Placement(bg, "/counter", "x"); p != a {
			t.Fatalf("placement after releases by non-owners = %q; want %q", p, a)
		}
		f("ca", true)
		f("ca", false)
	})
}

func TestHealthz(t *testing.T) {
	e := newEnv(t, "redis")
	var h wire.Healthz
	r := e.do("GET", wire.PathHealthz, "", nil)
	r.decode(t, &h)
	if r.code != 200 || !h.OK || h.Store != "ok" {
		t.Fatalf("healthz = %d %s; want 200 ok", r.code, r.body)
	}
	e.redis.Kill()
	r = e.do("GET", wire.PathHealthz, "", nil)
	h = wire.Healthz{}
	r.decode(t, &h)
	if r.code != 503 || h.OK || h.Store == "ok" || h.Store == "" {
		t.Fatalf("healthz with Redis down = %d %s; want 503 naming the error", r.code, r.body)
	}
	// Registry calls answer 503 + Retry-After while the store is down.
	w := fakeworker.Start(t, "s")
	if r := e.post(wire.PathRegister, registerBody(w, "c1")); r.code != 503 || r.hdr["retry-after"] == "" {
		t.Fatalf("register with Redis down = %d %v; want 503 with Retry-After", r.code, r.hdr)
	}
	e.reg.MarkShuttingDown()
	h = wire.Healthz{}
	e.do("GET", wire.PathHealthz, "", nil).decode(t, &h)
	if !h.ShuttingDown || h.OK {
		t.Fatalf("healthz while shutting down = %+v; want shuttingDown", h)
	}
}

func TestShuttingDownHealthz(t *testing.T) {
	e := newEnv(t, "memstore")
	e.reg.MarkShuttingDown()
	var h wire.Healthz
	r := e.do("GET", wire.PathHealthz, "", nil)
	r.decode(t, &h)
	if r.code != 503 || !h.ShuttingDown || h.Store != "ok" {
		t.Fatalf("healthz = %d %s; want 503 shuttingDown with the store ok", r.code, r.body)
	}
}

// NewRouter hands every non-registry request to the data plane, never
// redirects, and answers a wrong method on a registry path with 405.
func TestRouterPlugsInDataPlane(t *testing.T) {
	e := newEnv(t, "memstore")
	var got []string
	var mu sync.Mutex
	rt := e.reg.NewRouter(func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		got = append(got, string(ctx.Method())+" "+string(ctx.RequestURI()))
		mu.Unlock()
		ctx.SetStatusCode(299)
	})
	srv := serve(t, rt)
	hc := &fasthttp.HostClient{Addr: srv, DisablePathNormalizing: true}
	f := func(method, uri string, want int) {
		t.Helper()
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(method)
		req.SetRequestURI("http://" + srv + uri)
		req.URI().DisablePathNormalizing = true
		if err := hc.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != want {
			t.Errorf("%s %s = %d; want %d", method, uri, resp.StatusCode(), want)
		}
	}
	f("GET", "/counter/abc/incr", 299)
	f("GET", "/counter/abc/", 299)
	f("POST", "/Counter//abc", 299)
	f("OPTIONS", "/counter/abc", 299)
	f("GET", "/registry/register", 405)
	f("GET", "/healthz", 200)
	f("GET", "/healthz/", 299)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(got, "GET /counter/abc/") || !slices.Contains(got, "POST /Counter//abc") {
		t.Fatalf("data plane saw %v; want the raw paths, unredirected", got)
	}
	hc.CloseIdleConnections()
}

// serve serves rt on a 127.0.0.1 port until the test ends.
func serve(t *testing.T, rt *router.Router) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: rt.Handler, MaxIdleWorkerDuration: 100 * time.Millisecond}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = ln.Close() // in case Shutdown runs before Serve registered ln
		_ = srv.Shutdown()
		<-done
	})
	return ln.Addr().String()
}

func TestRequestMetrics(t *testing.T) {
	e := newEnv(t, "memstore")
	e.do("GET", wire.PathWorkers, "", nil)
	e.do("GET", wire.PathWorkers, token, nil)
	e.post(wire.PathPush, "{")
	var out bytes.Buffer
	e.reg.Metrics().WritePrometheus(&out)
	for _, want := range []string{
		`pinned_registry_requests_total{endpoint="workers",code="401"} 1`,
		`pinned_registry_requests_total{endpoint="workers",code="200"} 1`,
		`pinned_registry_requests_total{endpoint="push",code="400"} 1`,
		`pinned_registry_auth_failures_total 1`,
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if !strings.Contains(out.String(), `pinned_registry_request_duration_seconds_bucket{endpoint="workers",le=`) {
		t.Error("metrics lack the classic-bucket duration histogram")
	}
}

func TestPlacementGaugesAreBoundedAndSanitised(t *testing.T) {
	m := newRegistryMetrics(metrics.NewSet(), 2)
	m.setPlacements(map[string]int{"/a": 1, "/b": 2, "/c": 3, "/d\"\n\\": 4})
	var out bytes.Buffer
	m.set.WritePrometheus(&out)
	s := out.String()
	for _, want := range []string{`pinned_registry_placements{namespace="/a"} 1`, `pinned_registry_placements{namespace="/b"} 2`, `pinned_registry_placements{namespace="_other"} 7`} {
		if !strings.Contains(s, want+"\n") {
			t.Errorf("gauges lack %q:\n%s", want, s)
		}
	}
	m.setPlacements(map[string]int{"/b": 5})
	out.Reset()
	m.set.WritePrometheus(&out)
	if strings.Contains(out.String(), `namespace="/a"`) || !strings.Contains(out.String(), `namespace="/b"} 5`) {
		t.Errorf("vanished namespaces must drop their series:\n%s", out.String())
	}
	if got := labelValue("/x\"y\\z\n"); got != "/x_y_z_" {
		t.Errorf("labelValue = %q; want /x_y_z_", got)
	}
}

func TestConfigValidation(t *testing.T) {
	st := &nopStore{}
	f := func(cfg Config, wantSub string) {
		t.Helper()
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), wantSub) {
			t.Errorf("New(%+v) = %v; want an error containing %q", cfg, err, wantSub)
		}
	}
	f(Config{Tokens: []string{token}}, "Store is nil")
	f(Config{Store: st}, "no deployment token")
	f(Config{Store: st, Tokens: []string{token}, Lease: time.Millisecond}, "below the minimum")
	f(Config{Store: st, Tokens: []string{token}, ChallengeTimeout: -1}, "ChallengeTimeout")
	f(Config{Store: st, Tokens: []string{token}, AdvertiseNetworks: []netip.Prefix{{}}}, "invalid prefix")
	if r, err := New(Config{Store: st, Tokens: []string{token}}); err != nil || r.Lease() != DefaultLease {
		t.Fatalf("New with defaults = %v; want lease %v", err, DefaultLease)
	}
}

// nopStore is a Store that is never called.
type nopStore struct{ store.Store }

func TestMintSessionID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := mintSessionID()
		if len(id) != wire.SessionIDLen || wire.CheckSessionID(id) != wire.SegmentOK || seen[id] {
			t.Fatalf("mintSessionID() = %q: want %d URL-safe, unique characters", id, wire.SessionIDLen)
		}
		seen[id] = true
	}
}

// failingStore fails every call with a non-availability error.
type failingStore struct{ store.Store }

func (failingStore) Sessions(context.Context) ([]store.Session, error) {
	return nil, errors.New("corrupt record")
}

func (failingStore) Ping(context.Context) error { return nil }

func TestStoreErrorsAre500(t *testing.T) {
	e := newEnv(t, "memstore")
	reg, err := New(Config{Store: failingStore{e.st}, Tokens: []string{token}, Logger: e.reg.log})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, reg.NewRouter(nil))
	e.url, e.hc = "http://"+addr, &fasthttp.HostClient{Addr: addr}
	r := e.do("GET", wire.PathWorkers, token, nil)
	if r.code != 500 || r.errField(t).Error == "" || strings.Contains(string(r.body), "corrupt") {
		t.Fatalf("workers with a failing store = %d %s; want 500 without internals", r.code, r.body)
	}
	reg.Sweep(bg) // lists the sessions: fails
	var b bytes.Buffer
	reg.Metrics().WritePrometheus(&b)
	for _, want := range []string{
		"pinned_registry_store_errors_total 1",
		`pinned_registry_requests_total{endpoint="workers",code="500"} 1`,
		"pinned_registry_sweep_errors_total 1",
		"pinned_registry_store_up 1", // Ping answered
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, b.String())
		}
	}
}

// inc adds one to a metric value as e.metric prints it.
func inc(v string) string {
	n, err := strconv.Atoi(v)
	if err != nil {
		return "<not a number: " + v + ">"
	}
	return strconv.Itoa(n + 1)
}

// With the server streaming large request bodies (as the proxy wants), the
// registry still reads bodies up to its limit and refuses larger ones.
func TestStreamedBodies(t *testing.T) {
	e := newEnv(t, "memstore")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: e.reg.NewRouter(nil).Handler, StreamRequestBody: true, MaxRequestBodySize: 1024, MaxIdleWorkerDuration: 100 * time.Millisecond}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ln.Close()
		srv.Shutdown()
		<-done
	})
	e.url, e.hc = "http://"+ln.Addr().String(), &fasthttp.HostClient{Addr: ln.Addr().String()}
	padded := `{"sessionId":"unknownSession"` + strings.Repeat(" ", 8<<10) + `}`
	if r := e.post(wire.PathHeartbeat, padded); r.code != 409 {
		t.Fatalf("8 KiB streamed heartbeat = %d %s; want it read and answered 409 reregister", r.code, r.body)
	}
	if r := e.postChunked(wire.PathHeartbeat, padded); r.code != 409 {
		t.Fatalf("8 KiB chunked heartbeat = %d %s; want 409", r.code, r.body)
	}
	huge := `{"sessionId":"s"` + strings.Repeat(" ", wire.MaxBodyBytes) + `}`
	if r := e.postChunked(wire.PathHeartbeat, huge); r.code != 413 {
		t.Fatalf("oversized chunked heartbeat = %d; want 413", r.code)
	}
}

// A worker's request body limit is validated, kept on its session (the
// proxy reads it there) and shown in /registry/workers; a worker that says
// none (protocol 1) gets 0.
func TestRegisterBodyLimit(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "worker-secret")
		body := registerBody(w, "client1")
		body.MaxBodyBytes = -1
		if r := e.post(wire.PathRegister, body); r.code != 400 || !strings.Contains(string(r.body), `"field":"maxBodyBytes"`) {
			t.Fatalf("register with maxBodyBytes -1 = %d %s; want 400 naming the field", r.code, r.body)
		}
		body = registerBody(w, "client1")
		body.MaxBodyBytes = 3 << 20
		sid := e.register(body)
		if s, err := e.st.Session(bg, sid); err != nil || s.MaxBodyBytes != 3<<20 {
			t.Fatalf("session = %+v, %v; want MaxBodyBytes %d", s, err, 3<<20)
		}
		w2 := fakeworker.Start(t, "worker-secret-2")
		old := e.register(registerBody(w2, "client2"))
		var ws wire.WorkersResponse
		e.do("GET", wire.PathWorkers, token, nil).decode(t, &ws)
		got := map[string]int64{}
		for _, wi := range ws.Workers {
			got[wi.SessionID] = wi.MaxBodyBytes
		}
		if got[sid] != 3<<20 || got[old] != 0 || len(got) != 2 {
			t.Fatalf("workers' maxBodyBytes = %v; want %s: %d and %s: 0", got, sid, 3<<20, old)
		}
	})
}
