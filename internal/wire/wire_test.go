package wire

import (
	"encoding/json"
	"strings"
	"testing"
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
	if got, want := KeyPlacement("/counter", "abc"), "pinned:p:/counter/abc"; got != want {
		t.Errorf("KeyPlacement = %q; want %q", got, want)
	}
	if got, want := string(AppendKeyPlacement(nil, []byte(PlacementName("/counter", "abc")))), "pinned:p:/counter/abc"; got != want {
		t.Errorf("AppendKeyPlacement = %q; want %q", got, want)
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
