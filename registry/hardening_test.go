package registry

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/ci"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
)

var mp = netip.MustParsePrefix

// The advertise-URL rules (docs/registry.md, "Hardening"), as the
// parser and the parse-time policy apply them.
func TestAdvertiseURLPolicy(t *testing.T) {
	policy := func(allow []netip.Prefix, ports []uint16) *addrPolicy {
		t.Helper()
		p, err := newAddrPolicy(allow, ports)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	f := func(p *addrPolicy, in string, wantOK bool) {
		t.Helper()
		canon, err := canonicalAdvertiseURL(in)
		if err == nil {
			err = p.checkURL(canon)
		}
		if (err == nil) != wantOK {
			t.Errorf("advertiseUrl %q: err = %v; want accepted = %v", in, err, wantOK)
		}
	}
	def := policy(nil, nil)
	for _, u := range []string{
		// Numeric-obfuscated spellings of 127.0.0.1 (resolvers built on
		// inet_aton read them as addresses).
		"http://2130706433", "http://0177.0.0.1", "http://0x7f.0.0.1", "http://0x7f000001",
		"http://127.1", "http://127.0.0.0x1", "http://0",
		// Unspecified, special-purpose and metadata addresses, also mapped.
		"http://[::ffff:169.254.169.254]", "http://[::ffff:a9fe:a9fe]", "http://[::]", "http://[::]:8080",
		"http://0.0.0.0", "http://0.0.0.0:8080", "http://169.254.1.1", "http://169.254.169.254",
		"http://[fe80::1]", "http://[fe80::1%25eth0]", "http://100.64.0.1", "http://100.127.255.255",
		"http://100.100.100.200", "http://[fd00:ec2::254]", "http://224.0.0.1", "http://255.255.255.255",
		"http://[ff02::1]", "http://[64:ff9b::a9fe:a9fe]", "http://[2002:a9fe:a9fe::1]", "http://[::169.254.169.254]",
		"http://192.0.2.1", "http://198.18.0.1",
		// Metadata host names, in any case, with or without the root dot.
		"http://metadata.google.internal", "http://METADATA.Google.Internal.", "http://metadata", "http://instance-data",
		// Shape: userinfo, query, fragment, scheme, bad names.
		"http://user:pw@10.0.0.1", "http://10.0.0.1#f", "http://10.0.0.1?q", "gopher://10.0.0.1", "http://a_b..c",
		"http://-x-.y%2f", "http://[1.2.3.4]", "http://ex ample.com",
	} {
		f(def, u, false)
	}
	for _, u := range []string{
		"http://127.0.0.1:8080", "http://[::1]:9000", "http://[::ffff:127.0.0.1]", "http://localhost:8080",
		"http://10.1.2.3", "http://172.16.5.4", "http://192.168.0.10:8000", "http://[fd12:3456::1]",
		"https://worker-3.internal", "http://8.8.8.8", "http://w_1.svc.cluster.local", "http://1e100.net",
	} {
		f(def, u, true)
	}
	// An allow-list narrows the defaults...
	p10 := policy([]netip.Prefix{mp("10.0.0.0/8")}, nil)
	f(p10, "http://10.9.8.7", true)
	f(p10, "http://192.168.0.1", false)
	f(p10, "http://127.0.0.1", false)
	f(p10, "http://worker.internal", true) // a name is checked at dial time
	// ...an entry inside a special range opts into it (never into metadata)...
	overlay := policy([]netip.Prefix{mp("100.64.0.0/10"), mp("169.254.0.0/16")}, nil)
	f(overlay, "http://100.101.102.103", true)
	f(overlay, "http://169.254.3.4", true)
	f(overlay, "http://169.254.169.254", false)
	f(overlay, "http://100.100.100.200", false)
	f(overlay, "http://10.0.0.1", false)
	// ...and a broader one does not.
	wide := policy([]netip.Prefix{mp("0.0.0.0/0"), mp("::/0")}, nil)
	f(wide, "http://169.254.3.4", false)
	f(wide, "http://100.64.0.1", false)
	f(wide, "http://[fe80::1]", false)
	f(wide, "http://10.0.0.1", true)
	f(policy([]netip.Prefix{mp("::ffff:10.0.0.0/104")}, nil), "http://10.1.1.1", true)
	// The port allow-list, with the scheme's default port.
	ports := policy(nil, []uint16{8080, 443})
	f(ports, "http://10.0.0.1:8080", true)
	f(ports, "https://w", true)
	f(ports, "http://w", false)
	f(ports, "http://10.0.0.1:8081", false)

	if _, err := newAddrPolicy([]netip.Prefix{{}}, nil); err == nil {
		t.Error("newAddrPolicy accepted an invalid prefix")
	}
	if _, err := newAddrPolicy(nil, []uint16{0}); err == nil {
		t.Error("newAddrPolicy accepted port 0")
	}
}

// Refused advertise URLs are a 400 naming advertiseUrl, and nobody is
// dialled.
func TestRefusedAdvertiseURLIs400(t *testing.T) {
	e := newEnv(t, "memstore", func(c *Config) { c.AdvertisePorts = []uint16{1} })
	w := fakeworker.Start(t, "s")
	for _, u := range []string{"http://2130706433:1", "http://[::ffff:169.254.169.254]:1", "http://metadata.google.internal:1", w.URL} {
		b := registerBody(w, "c1")
		b.AdvertiseURL = u
		r := e.post(wire.PathRegister, b)
		if r.code != 400 || r.errField(t).Field != "advertiseUrl" {
			t.Errorf("register with advertiseUrl %q = %d %s; want 400 advertiseUrl", u, r.code, r.body)
		}
	}
	if w.Hits() != 0 {
		t.Fatalf("refused registrations dialled the worker %d times", w.Hits())
	}
}

// DNS rebinding: a name that resolved to an allowed address at
// registration and resolves to a refused one at the next proof is refused
// at dial time, before any connection.
func TestDNSRebindingRefusedAtDialTime(t *testing.T) {
	w := fakeworker.Start(t, "s")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(w.URL, "http://"))
	// Where the rebound name points: a listener that counts connections.
	ln, err := net.Listen("tcp", "127.0.0.2:"+port)
	if err != nil {
		ci.Missing(t, "cannot listen on 127.0.0.2 (all of 127/8 is loopback on Linux): "+err.Error())
	}
	var accepted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })

	f := func(name string, allow []netip.Prefix, rebound string) {
		t.Helper()
		e := newEnv(t, "memstore", func(c *Config) { c.AdvertiseNetworks = allow })
		var lookups atomic.Int64
		e.reg.verifier.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
			if host != "rebind.test" {
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
			if lookups.Add(1) == 1 {
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			}
			return []netip.Addr{netip.MustParseAddr(rebound)}, nil
		}
		b := registerBody(w, "c-"+strings.ReplaceAll(name, " ", "-"))
		b.AdvertiseURL = "http://rebind.test:" + port
		sid := e.register(b)
		hits := w.Hits()
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody(sid, w, 1))); n != wire.NackReregister {
			t.Fatalf("%s: heartbeat after the name flipped to %s: nack %q; want reregister", name, rebound, n)
		}
		if w.Hits() != hits || accepted.Load() != 0 || lookups.Load() != 2 {
			t.Fatalf("%s: worker hits %d -> %d, rebound listener accepted %d, lookups %d; want no connection and 2 lookups",
				name, hits, w.Hits(), accepted.Load(), lookups.Load())
		}
		if got := e.metric(`pinned_registry_challenge_failures_total{reason="network_not_allowed"}`); got != "1" {
			t.Fatalf("%s: network_not_allowed failures = %s; want 1", name, got)
		}
	}
	f("allow-list", []netip.Prefix{mp("127.0.0.1/32")}, "127.0.0.2")
	f("metadata", nil, "169.254.169.254")
	f("mapped link-local", nil, "::ffff:169.254.10.1")
}

// A challenge is single use: replaying a body, or its challenge for
// another advertise URL or session, is refused without dialling anyone.
func TestChallengeReplayRefused(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		w2 := fakeworker.Start(t, "s2")
		body := registerBody(w, "c1")
		sid := e.register(body)
		hb := heartbeatBody(sid, w, 0)
		if r, _ := e.heartbeat(hb); r.code != 200 {
			t.Fatalf("heartbeat = %d %s", r.code, r.body)
		}
		sid2 := e.register(registerBody(w2, "c2"))
		hits := w.Hits()
		replay := func(what, path string, b any) {
			t.Helper()
			r := e.post(path, b)
			if r.code != 422 || r.errField(t).Field != "challenge" || !strings.Contains(string(r.body), "already used") {
				t.Errorf("%s = %d %s; want 422 challenge already used", what, r.code, r.body)
			}
		}
		replay("the same registration again", wire.PathRegister, body)
		other := registerBody(w2, "c3")
		other.Challenge, other.ChallengeValue = body.Challenge, body.ChallengeValue
		replay("its challenge for another advertise URL", wire.PathRegister, other)
		replay("the same heartbeat again", wire.PathHeartbeat, hb)
		hb2 := hb
		hb2.SessionID = sid2
		replay("a heartbeat's challenge for another session", wire.PathHeartbeat, hb2)
		reg := registerBody(w, "c4")
		reg.Challenge, reg.ChallengeValue = hb.Challenge, hb.ChallengeValue
		replay("a heartbeat's challenge in a registration", wire.PathRegister, reg)
		if w.Hits() != hits {
			t.Errorf("replays dialled the worker %d times; want 0", w.Hits()-hits)
		}
		if s, _ := e.st.Sessions(bg); len(s) != 2 {
			t.Errorf("%d sessions after the replays; want the 2 registered", len(s))
		}
		if got := e.metric(`pinned_registry_challenge_failures_total{reason="replay"}`); got != "5" {
			t.Errorf("replay failures = %s; want 5", got)
		}
		if r, _ := e.heartbeat(heartbeatBody(sid, w, 1)); r.code != 200 {
			t.Errorf("a fresh heartbeat after the replays = %d; want 200", r.code)
		}
	})
}

// Once its record expired (NonceTTL), a replayed challenge reaches the
// worker, which no longer answers it: a worker answers only the
// challenges of its calls in flight, and NonceTTL covers that window.
func TestExpiredChallengeRefused(t *testing.T) {
	e := newEnv(t, "memstore")
	w := fakeworker.Start(t, "s")
	w.SetMode(fakeworker.ArmedOnly)
	body := registerBody(w, "c1")
	w.Arm(body.Challenge)
	e.register(body)
	w.Disarm(body.Challenge) // its call returned
	e.fake.Advance(e.reg.nonceTTL + time.Second)
	r := e.post(wire.PathRegister, body)
	if r.code != 422 || !strings.Contains(string(r.body), "404") {
		t.Fatalf("replay after the nonce TTL = %d %s; want 422 (the worker answers 404)", r.code, r.body)
	}
	if _, err := New(Config{Store: e.st, Tokens: []string{token}, NonceTTL: MaxNonceTTL + time.Second}); err == nil {
		t.Fatalf("New accepted a NonceTTL above %v", MaxNonceTTL)
	}
}

// 100 concurrent submits of one challenge: exactly one succeeds, on both
// stores, for registrations and for heartbeats.
func TestConcurrentSubmitsOfOneNonce(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		const n = 100
		storm := func(path string, body any) map[int]int {
			t.Helper()
			codes := make([]int, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					r, err := e.try("POST", path, token, body)
					if err != nil {
						t.Error(err)
						return
					}
					codes[i] = r.code
				})
			}
			close(start)
			wg.Wait()
			count := map[int]int{}
			for _, c := range codes {
				count[c]++
			}
			return count
		}
		got := storm(wire.PathRegister, registerBody(w, "c1"))
		if got[200] != 1 || got[422] != n-1 {
			t.Fatalf("%d concurrent registrations with one challenge: %v; want one 200 and %d × 422", n, got, n-1)
		}
		if w.Hits() != 1 {
			t.Fatalf("the worker was dialled %d times; want once", w.Hits())
		}
		all, _ := e.st.Sessions(bg)
		if len(all) != 1 {
			t.Fatalf("%d sessions; want 1", len(all))
		}
		got = storm(wire.PathHeartbeat, heartbeatBody(all[0].ID, w, 0))
		if got[200] != 1 || got[422] != n-1 {
			t.Fatalf("%d concurrent heartbeats with one challenge: %v; want one 200 and %d × 422", n, got, n-1)
		}
		t.Logf("%d concurrent submits of one nonce: 1 accepted, %d refused as replays", n, n-1)
	})
}

func TestRegistrationRateLimits(t *testing.T) {
	t.Run("per IP", func(t *testing.T) {
		e := newEnv(t, "memstore", func(c *Config) { c.RegisterIPLimit = Limit{Events: 1, Per: time.Minute, Burst: 3} })
		w := fakeworker.Start(t, "s")
		for _, c := range []string{"c0", "c1", "c2"} {
			e.register(registerBody(w, c))
		}
		r := e.post(wire.PathRegister, registerBody(w, "c3"))
		if r.code != 429 || r.hdr["retry-after"] != "60" || !strings.Contains(r.errField(t).Error, "from this address") {
			t.Fatalf("4th registration = %d %v %s; want 429, Retry-After: 60, a JSON error", r.code, r.hdr, r.body)
		}
		if got := e.metric(`pinned_registry_rate_limited_total{limit="register_ip"}`); got != "1" {
			t.Errorf(`rate_limited{limit="register_ip"} = %s; want 1`, got)
		}
		if w.Hits() != 3 {
			t.Errorf("the refused registration dialled the worker (hits %d; want 3)", w.Hits())
		}
		e.fake.Advance(time.Minute)
		e.register(registerBody(w, "c3"))
	})
	t.Run("per token", func(t *testing.T) {
		e := newEnv(t, "memstore", func(c *Config) {
			c.RegisterTokenLimit = Limit{Events: 1, Per: time.Minute, Burst: 2}
			c.Tokens = []string{token, oldToken}
		})
		w := fakeworker.Start(t, "s")
		e.register(registerBody(w, "c0"))
		e.register(registerBody(w, "c1"))
		r := e.post(wire.PathRegister, registerBody(w, "c2"))
		if r.code != 429 || r.hdr["retry-after"] != "60" || !strings.Contains(r.errField(t).Error, "deployment token") {
			t.Fatalf("3rd registration with one token = %d %v %s; want 429 naming the token limit", r.code, r.hdr, r.body)
		}
		if r := e.do("POST", wire.PathRegister, oldToken, registerBody(w, "c2")); r.code != 200 {
			t.Fatalf("registration with the other token = %d %s; want 200 (its own bucket)", r.code, r.body)
		}
	})
	t.Run("failed auth per IP", func(t *testing.T) {
		e := newEnv(t, "memstore", func(c *Config) { c.AuthFailureLimit = Limit{Events: 3, Per: time.Minute} })
		w := fakeworker.Start(t, "s")
		sid := e.register(registerBody(w, "c1")) // a worker behind the same address
		f := func(tok string, want int, wantRetry string) {
			t.Helper()
			r := e.do("GET", wire.PathWorkers, tok, nil)
			if r.code != want || r.hdr["retry-after"] != wantRetry {
				t.Fatalf("GET /registry/workers with %.8q… = %d (Retry-After %q) %s; want %d (%q)", tok, r.code, r.hdr["retry-after"], r.body, want, wantRetry)
			}
			if want == 429 && r.errField(t).Error == "" {
				t.Fatal("429 without a JSON error")
			}
		}
		for range 3 {
			f("wrong-token-0123456789", 401, "")
		}
		// Over the limit: even the right token is not looked at.
		f(token, 429, "20")
		f("wrong-token-0123456789", 429, "20")
		if r := e.do("GET", wire.PathHealthz, "", nil); r.code != 200 {
			t.Fatalf("/healthz while the address is limited = %d; want 200 (unauthenticated, unlimited)", r.code)
		}
		// The worker sharing the address keeps its lease: a heartbeat of a
		// live session with the right token is served; with a wrong token,
		// or for an unknown session, it is refused like everything else.
		hbf := func(tok, sid string, want int) {
			t.Helper()
			if r := e.do("POST", wire.PathHeartbeat, tok, heartbeatBody(sid, w, 0)); r.code != want {
				t.Fatalf("heartbeat(%s) with %.8q… while limited = %d %s; want %d", sid, tok, r.code, r.body, want)
			}
		}
		hbf(token, sid, 200)
		hbf(token, "unknownSession", 429)
		hbf("wrong-token-0123456789", sid, 429)
		if r := e.post(wire.PathRegister, registerBody(w, "c2")); r.code != 429 {
			t.Fatalf("registration while limited = %d; want 429", r.code)
		}
		e.fake.Advance(20 * time.Second) // one failure's worth refilled
		f(token, 200, "")
		f("wrong-token-0123456789", 401, "")
		f(token, 429, "20")
		if got := e.metric(`pinned_registry_rate_limited_total{limit="auth_ip"}`); got != "6" {
			t.Errorf(`rate_limited{limit="auth_ip"} = %s; want 6`, got)
		}
	})
}

// The per-client buckets live in a bounded LRU; IPv6 clients count by /64.
func TestLimiterTableIsBounded(t *testing.T) {
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	tab := newLimiterTable[string](Limit{Events: 1, Per: time.Hour, Burst: 1}, 3, fake)
	for i := range 10 {
		if ok, _ := tab.take(string(rune('a' + i))); !ok {
			t.Fatalf("first take of key %d refused", i)
		}
	}
	if tab.len() != 3 {
		t.Fatalf("table holds %d buckets after 10 keys; want the bound 3", tab.len())
	}
	if ok, wait := tab.take("j"); ok || wait != time.Hour {
		t.Fatalf("second take of a kept key = %v, %v; want refused for 1h", ok, wait)
	}
	if newLimiterTable[string](off, 3, fake) != nil {
		t.Fatal("a table for an off limit is not nil")
	}
	var nilTab *limiterTable[string]
	if ok, _ := nilTab.take("x"); !ok {
		t.Fatal("an off limit refused")
	}
	f := func(ip, want string) {
		t.Helper()
		if got := clientKey(net.ParseIP(ip)); got.String() != want {
			t.Errorf("clientKey(%s) = %q; want %q", ip, got, want)
		}
	}
	f("10.0.0.1", "10.0.0.1")
	f("::ffff:10.0.0.1", "10.0.0.1")
	f("2001:db8:1:2::1", "2001:db8:1:2::")
	f("2001:db8:1:2:ffff::9", "2001:db8:1:2::")
	f("2001:db8:1:3::1", "2001:db8:1:3::")
}

func TestParseLimit(t *testing.T) {
	f := func(in string, want Limit) {
		t.Helper()
		got, err := ParseLimit(in)
		if err != nil || got != want {
			t.Errorf("ParseLimit(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	f("5/s burst 20", Limit{5, time.Second, 20})
	f("10/1m", Limit{10, time.Minute, 10})
	f("10/m", Limit{10, time.Minute, 10})
	f(" 100/10s ", Limit{100, 10 * time.Second, 100})
	f("off", Limit{Events: -1})
	for _, bad := range []string{"", "5", "0/s", "-1/s", "5/x", "5/0s", "5/s burst 0", "5/s burst x", "five/s"} {
		if l, err := ParseLimit(bad); err == nil {
			t.Errorf("ParseLimit(%q) = %+v; want an error", bad, l)
		}
	}
}

func TestSessionCapPerToken(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		first := e.register(registerBody(w, "c1"))
		e.register(registerBody(w, "c2"))
		r := e.post(wire.PathRegister, registerBody(w, "c3"))
		if r.code != 429 || r.hdr["retry-after"] != "10" || !strings.Contains(r.errField(t).Error, "2 live sessions") {
			t.Fatalf("3rd live session of one token = %d %v %s; want 429, Retry-After: 10 (a lease), naming the cap", r.code, r.hdr, r.body)
		}
		if got := e.metric(`pinned_registry_rate_limited_total{limit="session_cap"}`); got != "1" {
			t.Errorf(`rate_limited{limit="session_cap"} = %s; want 1`, got)
		}
		if r := e.do("POST", wire.PathRegister, oldToken, registerBody(w, "c4")); r.code != 200 {
			t.Fatalf("registration with the other token = %d %s; want 200 (its own cap)", r.code, r.body)
		}
		if r := e.post(wire.PathDeregister, wire.DeregisterRequest{SessionID: first}); r.code != 200 {
			t.Fatalf("deregister = %d %s", r.code, r.body)
		}
		e.register(registerBody(w, "c3")) // the slot was freed at once
	}, func(c *Config) {
		c.MaxSessionsPerToken = 2
		c.Tokens = []string{token, oldToken}
	})
}

func TestDeregister(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		old := e.register(registerBody(w, "c1"))
		cur := e.register(registerBody(w, "c1")) // supersedes old
		e.st.Claim(bg, "/counter", "x", cur)
		e.st.Claim(bg, "/counter", "y", old)
		dereg := func(sid string, want bool) {
			t.Helper()
			var dr wire.DeregisterResponse
			r := e.post(wire.PathDeregister, wire.DeregisterRequest{SessionID: sid})
			r.decode(t, &dr)
			if r.code != 200 || dr.Deregistered != want {
				t.Fatalf("deregister(%s) = %d %s; want 200 deregistered=%v", sid, r.code, r.body, want)
			}
		}
		// The superseded session goes; the current one is untouched.
		dereg(old, true)
		if r, _ := e.heartbeat(heartbeatBody(cur, w, 1)); r.code != 200 {
			t.Fatalf("heartbeat of the current session after deregistering the old one = %d; want 200", r.code)
		}
		if r := e.post(wire.PathPush, wire.PushRequest{ClientID: "c1", Type: wire.MessageDrain}); r.code != 202 {
			t.Fatalf("push to c1 = %d; want 202 (its pointer still names the current session)", r.code)
		}
		// Its placement can be re-placed at once.
		if h, _ := e.st.Replace(bg, "/counter", "y", old, cur); h != cur {
			t.Fatalf("Replace of the deregistered session's placement = %q; want %q", h, cur)
		}
		dereg(cur, true)
		if n := e.nack(e.post(wire.PathHeartbeat, heartbeatBody(cur, w, 2))); n != wire.NackReregister {
			t.Fatalf("heartbeat after deregister: nack %q; want reregister", n)
		}
		var ws wire.WorkersResponse
		e.do("GET", wire.PathWorkers, token, nil).decode(t, &ws)
		if len(ws.Workers) != 0 {
			t.Fatalf("workers after deregister = %+v; want none", ws)
		}
		dereg(cur, false)
		dereg("neverExisted", false)
		if got := e.metric(`pinned_registry_deregistrations_total{result="deregistered"}`); got != "2" {
			t.Errorf("deregistrations = %s; want 2", got)
		}
		for body, field := range map[string]string{`{}`: "sessionId", `{"sessionId":"a b"}`: "sessionId", `{"sessionId":5}`: "sessionId"} {
			if r := e.post(wire.PathDeregister, body); r.code != 400 || r.errField(t).Field != field {
				t.Errorf("deregister %s = %d %s; want 400 %s", body, r.code, r.body, field)
			}
		}
		if r := e.do("POST", wire.PathDeregister, "", `{"sessionId":"x"}`); r.code != 401 {
			t.Errorf("deregister without a token = %d; want 401", r.code)
		}
		if !strings.Contains(e.logs.String(), "worker deregistered") {
			t.Errorf("no log line for the deregistration:\n%s", e.logs)
		}
	})
}

// A release naming a session frees only that session's placement: a late
// release from an old session never deletes what the client's new session
// holds (it would without the sessionId).
func TestReleaseWithSessionID(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		old := e.register(registerBody(w, "c1"))
		e.st.Claim(bg, "/counter", "a", old)
		e.st.Claim(bg, "/counter", "x", old)
		cur := e.register(registerBody(w, "c1"))
		// x was re-placed on the new session (the old one's lease ran out
		// for the proxy, say); a's placement is still the old session's.
		if h, _ := e.st.Replace(bg, "/counter", "x", old, cur); h != cur {
			t.Fatal("replace failed")
		}
		rel := func(body wire.ReleaseRequest, wantCode int, want bool) {
			t.Helper()
			r := e.post(wire.PathRelease, body)
			if r.code != wantCode {
				t.Fatalf("release %+v = %d %s; want %d", body, r.code, r.body, wantCode)
			}
			if wantCode == 200 {
				var rr wire.ReleaseResponse
				r.decode(t, &rr)
				if rr.Released != want {
					t.Fatalf("release %+v = %s; want released=%v", body, r.body, want)
				}
			}
		}
		rel(wire.ReleaseRequest{ClientID: "c1", Namespace: "/counter", ID: "x", SessionID: old}, 200, false)
		if p, _ := e.st.Placement(bg, "/counter", "x"); p != cur {
			t.Fatalf("placement after the old session's late release = %q; want the new session's %q", p, cur)
		}
		rel(wire.ReleaseRequest{ClientID: "c2", Namespace: "/counter", ID: "a", SessionID: old}, 403, false)
		rel(wire.ReleaseRequest{ClientID: "c1", Namespace: "/counter", ID: "a", SessionID: old}, 200, true)
		rel(wire.ReleaseRequest{ClientID: "c1", Namespace: "/counter", ID: "x", SessionID: "unknownSession"}, 200, false)
		rel(wire.ReleaseRequest{ClientID: "c1", Namespace: "/counter", ID: "x", SessionID: cur}, 200, true)
		if r := e.post(wire.PathRelease, `{"clientId":"c1","namespace":"/n","id":"x","sessionId":"a b"}`); r.code != 400 || r.errField(t).Field != "sessionId" {
			t.Fatalf("release with a malformed sessionId = %d %s; want 400 sessionId", r.code, r.body)
		}
		if got := e.metric(`pinned_registry_releases_total{result="refused"}`); got != "1" {
			t.Errorf(`releases{result="refused"} = %s; want 1`, got)
		}
	})
}

// DialControl is the policy the data plane dials workers through.
func TestDialControl(t *testing.T) {
	e := newEnv(t, "memstore", func(c *Config) { c.AdvertiseNetworks = []netip.Prefix{mp("127.0.0.0/8"), mp("10.0.0.0/8")} })
	for addr, ok := range map[string]bool{
		"127.0.0.1:80": true, "10.1.2.3:8080": true, "[::ffff:10.0.0.1]:80": true,
		"192.168.0.1:80": false, "169.254.169.254:80": false, "[::]:80": false, "0.0.0.0:80": false, "not-an-address": false,
	} {
		if err := e.reg.DialControl("tcp", addr, nil); (err == nil) != ok {
			t.Errorf("DialControl(%s) = %v; want allowed = %v", addr, err, ok)
		}
	}
}
