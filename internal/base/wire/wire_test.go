package wire

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCheckSegment(t *testing.T) {
	f := func(in string, want SegmentError) {
		t.Helper()
		if got := CheckSegment([]byte(in), 0); got != want {
			t.Errorf("CheckSegment(%q) = %v; want %v", in, got, want)
		}
	}
	f("abc", SegmentOK)
	f("A-Za-z0-9._~@:+=-", SegmentOK)
	f("user@example.com", SegmentOK)
	f("a.b", SegmentOK)
	f(strings.Repeat("x", MaxIDLen), SegmentOK)
	f("", SegmentEmpty)
	f(strings.Repeat("x", MaxIDLen+1), SegmentTooLong)
	f(".", SegmentDot)
	f("..", SegmentDot)
	f(".hidden", SegmentDot)
	f("a%2Fb", SegmentPercent)
	f("%2E%2E", SegmentPercent)
	f("a%252Fb", SegmentPercent)
	f("a/b", SegmentSlash)
	f(`a\b`, SegmentSlash)
	f("a b", SegmentBadByte)
	f("a\x00b", SegmentBadByte)
	f("a;b", SegmentBadByte)
	f("a{b}", SegmentBadByte)
	f("é", SegmentBadByte)
	f("a?b", SegmentBadByte)
	f("a#b", SegmentBadByte)

	if got := CheckSegment([]byte("abcd"), 3); got != SegmentTooLong {
		t.Errorf("CheckSegment(abcd, 3) = %v; want SegmentTooLong", got)
	}
}

func TestCheckNamespace(t *testing.T) {
	f := func(in string, want SegmentError) {
		t.Helper()
		if got := CheckNamespace(in); got != want {
			t.Errorf("CheckNamespace(%q) = %v; want %v", in, got, want)
		}
	}
	f("/counter", SegmentOK)
	f("counter", SegmentNamespace)
	f("/", SegmentNamespace)
	f("", SegmentNamespace)
	f("/a/b", SegmentSlash)
	f("/..", SegmentDot)
	f("/"+strings.Repeat("n", MaxNamespaceLen+1), SegmentTooLong)
}

func TestCheckSegmentDoesNotAllocate(t *testing.T) {
	b := []byte("some-id.with:chars")
	if n := testing.AllocsPerRun(100, func() { _ = CheckSegment(b, 0) }); n != 0 {
		t.Fatalf("CheckSegment allocates %v times per call", n)
	}
}

// The JSON names are the protocol: a rename here breaks every deployed peer.
func TestJSONNames(t *testing.T) {
	f := func(v any, want string) {
		t.Helper()
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != want {
			t.Errorf("json(%T) = %s; want %s", v, b, want)
		}
	}
	f(RegisterRequest{ClientID: "c", Secret: "s", Namespaces: []string{"/n"}, AdvertiseURL: "http://a", Headroom: 3, Draining: true, Challenge: "x", ChallengeValue: "y"},
		`{"clientId":"c","secret":"s","namespaces":["/n"],"advertiseUrl":"http://a","headroom":3,"draining":true,"challenge":"x","challengeValue":"y"}`)
	f(RegisterResponse{SessionID: "s", ExpiresInMs: 10000}, `{"sessionId":"s","expiresInMs":10000}`)
	f(HeartbeatRequest{SessionID: "s", Headroom: 1}, `{"sessionId":"s","headroom":1,"draining":false}`)
	f(HeartbeatRequest{SessionID: "s", DrainDeadline: 5, Challenge: "c", ChallengeValue: "v"},
		`{"sessionId":"s","headroom":0,"draining":false,"drainDeadline":5,"challenge":"c","challengeValue":"v"}`)
	f(HeartbeatResponse{ExpiresInMs: 10000, Messages: []Message{{Type: MessageDrain, DeadlineMs: 7}}, Reregister: true},
		`{"expiresInMs":10000,"messages":[{"type":"drain","deadlineMs":7}],"reregister":true}`)
	f(Nack{Nack: NackSuperseded}, `{"nack":"superseded"}`)
	f(ReleaseRequest{ClientID: "c", Namespace: "/n", ID: "i"}, `{"clientId":"c","namespace":"/n","id":"i"}`)
	f(PushRequest{ClientID: "c", Type: MessageWindDown}, `{"clientId":"c","type":"wind_down"}`)
	f(ChallengeResponse{Value: "v"}, `{"value":"v"}`)
}

func TestKeys(t *testing.T) {
	if got, want := KeyPlacement("/counter", "abc"), "pinned:p:{/counter/abc}"; got != want {
		t.Errorf("KeyPlacement = %q; want %q", got, want)
	}
	if got, want := KeyEpoch("/counter", "abc"), "pinned:e:{/counter/abc}"; got != want {
		t.Errorf("KeyEpoch = %q; want %q", got, want)
	}
	if got, want := string(AppendKeyPlacement(nil, []byte(PlacementName("/counter", "abc")))), "pinned:p:{/counter/abc}"; got != want {
		t.Errorf("AppendKeyPlacement = %q; want %q", got, want)
	}
	for key, want := range map[string]string{"pinned:p:{/counter/abc}": "/counter/abc", "pinned:p:/counter/abc": "", "pinned:e:{/c/a}": "", "pinned:p:{}": ""} {
		if got, ok := PlacementOfKey(key); got != want || ok != (want != "") {
			t.Errorf("PlacementOfKey(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
	for _, k := range []string{KeySession("s"), KeyClient("c"), KeyAdvertise("http://h:1"), KeyQueue("c"), KeyNamespace("/n"), KeyOwned("s"), KeyWorkers} {
		if !strings.HasPrefix(k, KeyPrefix) || strings.ContainsAny(k, "{}") {
			t.Errorf("key %q must start with %q and carry no hash tag", k, KeyPrefix)
		}
	}
}

func TestNonceID(t *testing.T) {
	a, b := NonceID("challenge-a"), NonceID("challenge-b")
	if len(a) != NonceIDLen || a == b || a != NonceID("challenge-a") {
		t.Fatalf("NonceID = %q, %q; want distinct, stable ids of %d bytes", a, b, NonceIDLen)
	}
	if CheckSegment([]byte(NonceID(strings.Repeat("{x}", 80))), 0) != SegmentOK {
		t.Fatal("NonceID of a challenge with braces is not a plain segment")
	}
}

func TestParseEpoch(t *testing.T) {
	for in, want := range map[string]uint64{"0": 0, "1": 1, "1733212345678901": 1733212345678901, "18446744073709551615": 1<<64 - 1} {
		if got, ok := ParseEpoch([]byte(in)); !ok || got != want {
			t.Errorf("ParseEpoch(%q) = %d, %v; want %d", in, got, ok, want)
		}
		if got := string(AppendEpoch(nil, want)); got != in {
			t.Errorf("AppendEpoch(%d) = %q; want %q", want, got, in)
		}
	}
	for _, in := range []string{"", "-1", "+1", " 1", "1 ", "0x10", "18446744073709551616", "99999999999999999999", "123456789012345678901"} {
		if got, ok := ParseEpoch([]byte(in)); ok {
			t.Errorf("ParseEpoch(%q) = %d, ok; want refused", in, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { ParseEpoch([]byte("1733212345678901")) }); n != 0 {
		t.Errorf("ParseEpoch allocates %.0f times", n)
	}
}

func TestNextEpoch(t *testing.T) {
	now := time.UnixMicro(1_700_000_000_000_000)
	if got := NextEpoch(0, now); got != 1_700_000_000_000_000 {
		t.Errorf("NextEpoch(0, now) = %d; want the time floor", got)
	}
	if got := NextEpoch(1_700_000_000_000_000, now); got != 1_700_000_000_000_001 {
		t.Errorf("NextEpoch(floor, now) = %d; want floor+1 (strictly greater than the last)", got)
	}
	if got := NextEpoch(5, time.UnixMicro(-3)); got != 6 {
		t.Errorf("NextEpoch(5, before 1970) = %d; want 6", got)
	}
}

func TestPlacementValue(t *testing.T) {
	v := FormatPlacement(42, 1733212345678, "sess-1")
	if v != "42 1733212345678 sess-1" {
		t.Fatalf("FormatPlacement = %q", v)
	}
	e, since, sid, ok := ParsePlacement(v)
	if !ok || e != 42 || since != 1733212345678 || sid != "sess-1" {
		t.Fatalf("ParsePlacement(%q) = %d, %d, %q, %v", v, e, since, sid, ok)
	}
	if _, _, sid, ok := ParsePlacement("1 2 a b"); !ok || sid != "a b" {
		t.Fatalf("ParsePlacement keeps everything after the second space as the session: %q, %v", sid, ok)
	}
	for _, bad := range []string{"", "sess-1", "1 2", "1 2 ", "x 2 s", "1 y s", "-1 2 s"} {
		if _, _, _, ok := ParsePlacement(bad); ok {
			t.Errorf("ParsePlacement(%q) ok; want refused", bad)
		}
	}
}

func TestParseAdvertiseURL(t *testing.T) {
	for _, c := range []struct{ in, addr, prefix string }{
		{"http://127.0.0.1:8080", "127.0.0.1:8080", ""},
		{"http://worker", "worker:80", ""},
		{"http://h:1/app/", "h:1", "/app"},
		{"http://h:1/a%2Fb//", "h:1", "/a%2Fb"},
		{"http://[::1]:9", "[::1]:9", ""},
		{"http://[::1]", "[::1]:80", ""},
	} {
		addr, prefix, err := ParseAdvertiseURL(c.in)
		if err != nil || addr != c.addr || prefix != c.prefix {
			t.Errorf("ParseAdvertiseURL(%q) = %q, %q, %v; want %q, %q", c.in, addr, prefix, err, c.addr, c.prefix)
		}
	}
	for _, bad := range []string{"https://h:1", "http://u:p@h:1", "http://h:1/?q=1", "http://h:1/?", "http://h:1/#f", "http:h", "http://", "h:1", "%"} {
		if _, _, err := ParseAdvertiseURL(bad); err == nil {
			t.Errorf("ParseAdvertiseURL(%q) accepted", bad)
		}
	}
}

// Unhex agrees with strconv on every byte.
func TestUnhex(t *testing.T) {
	for c := range 256 {
		want := -1
		if v, err := strconv.ParseUint(string(rune(c)), 16, 8); err == nil {
			want = int(v)
		}
		if got := Unhex(byte(c)); got != want {
			t.Errorf("Unhex(%q) = %d, want %d", byte(c), got, want)
		}
	}
}
