package wire

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// refSegment restates the id grammar as plainly as possible: the reference
// CheckSegment is fuzzed against.
func refSegment(s string, max int) SegmentError {
	if max <= 0 {
		max = MaxIDLen
	}
	switch {
	case s == "":
		return SegmentEmpty
	case len(s) > max:
		return SegmentTooLong
	case strings.HasPrefix(s, "."):
		return SegmentDot
	}
	const allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~@:+=-"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if strings.IndexByte(allowed, c) >= 0 {
			continue
		}
		switch c {
		case '%':
			return SegmentPercent
		case '/', '\\':
			return SegmentSlash
		}
		return SegmentBadByte
	}
	return SegmentOK
}

// FuzzIdent checks the id grammar and the placement names built from it:
// CheckSegment agrees with the plain reference above (error kind included);
// CheckNamespace is "/" plus a segment of at most MaxNamespaceLen; an
// accepted segment has no byte a path, a Redis key or a header could read
// specially; PlacementName and SplitPlacementName round-trip for every
// valid (namespace, id); whatever SplitPlacementName accepts rebuilds the
// same name; AppendKeyPlacement agrees with KeyPlacement.
func FuzzIdent(f *testing.F) {
	for _, s := range []string{"counter", "alice", "user@example.com", ".hidden", "a%2Fb", "a/b", "a b", "é", "", "a:b+c=d~e-f_g"} {
		f.Add(s, s, int16(0))
	}
	f.Add("counter", strings.Repeat("x", 300), int16(256))
	f.Fuzz(func(t *testing.T, ns, id string, max int16) {
		for _, s := range []string{ns, id} {
			got, want := CheckSegment([]byte(s), int(max)), refSegment(s, int(max))
			if got != want {
				t.Fatalf("CheckSegment(%q, %d) = %v; want %v", s, max, got, want)
			}
			if got == SegmentOK && strings.ContainsAny(s, "/\\%?#{} \t\r\n\x00") {
				t.Fatalf("CheckSegment(%q) accepted a special byte", s)
			}
		}
		nsWire := "/" + ns
		wantNS := SegmentNamespace
		if ns != "" {
			wantNS = refSegment(ns, MaxNamespaceLen)
		}
		if got := CheckNamespace(nsWire); got != wantNS {
			t.Fatalf("CheckNamespace(%q) = %v; want %v", nsWire, got, wantNS)
		}
		if CheckNamespace(ns) == SegmentOK && (ns == "" || ns[0] != '/') {
			t.Fatalf("CheckNamespace(%q) accepted a namespace without its slash", ns)
		}

		// Round trip of valid names.
		if CheckNamespace(nsWire) == SegmentOK && CheckSegment([]byte(id), 0) == SegmentOK {
			name := PlacementName(nsWire, id)
			gns, gid, ok := SplitPlacementName(name)
			if !ok || gns != nsWire || gid != id {
				t.Fatalf("SplitPlacementName(%q) = %q, %q, %v; want %q, %q", name, gns, gid, ok, nsWire, id)
			}
			if got, want := string(AppendKeyPlacement(nil, []byte(name))), KeyPlacement(nsWire, id); got != want {
				t.Fatalf("AppendKeyPlacement(%q) = %q; KeyPlacement = %q", name, got, want)
			}
		}
		// Whatever splits rebuilds the same name, with a one-segment
		// namespace and a non-empty id.
		for _, name := range []string{ns, id, ns + id} {
			gns, gid, ok := SplitPlacementName(name)
			if !ok {
				continue
			}
			if PlacementName(gns, gid) != name || len(gns) < 2 || gns[0] != '/' || strings.Contains(gns[1:], "/") || gid == "" {
				t.Fatalf("SplitPlacementName(%q) = %q, %q", name, gns, gid)
			}
		}
	})
}

// wireBodies are the JSON bodies of the protocol, by index.
var wireBodies = []func() any{
	func() any { return new(RegisterRequest) },
	func() any { return new(RegisterResponse) },
	func() any { return new(HeartbeatRequest) },
	func() any { return new(HeartbeatResponse) },
	func() any { return new(Message) },
	func() any { return new(Nack) },
	func() any { return new(ReleaseRequest) },
	func() any { return new(ReleaseResponse) },
	func() any { return new(PushRequest) },
	func() any { return new(ChallengeResponse) },
	func() any { return new(Error) },
	func() any { return new(WorkerInfo) },
	func() any { return new(WorkersResponse) },
	func() any { return new(OverviewResponse) },
	func() any { return new(Healthz) },
	func() any { return new(PushResponse) },
	func() any { return new(AlarmSetRequest) },
	func() any { return new(AlarmSetResponse) },
	func() any { return new(AlarmDeleteRequest) },
	func() any { return new(AlarmDeleteResponse) },
	func() any { return new(AlarmListRequest) },
	func() any { return new(AlarmListResponse) },
	func() any { return new(DeadAlarmsResponse) },
}

// FuzzBodiesRoundTrip decodes arbitrary JSON into each wire body (kind
// picks which). Whatever decodes must encode, decode to an equal value, and
// encode again to the same bytes: no body loses or invents a field on its
// way through a peer, and its encoding is canonical.
func FuzzBodiesRoundTrip(f *testing.F) {
	seeds := []string{
		`{"clientId":"c","secret":"s","namespaces":["/n"],"advertiseUrl":"http://a","headroom":3,"draining":true,"challenge":"x","challengeValue":"y"}`,
		`{"sessionId":"s","expiresInMs":10000}`,
		`{"sessionId":"s","headroom":0,"draining":false,"drainDeadline":5,"challenge":"c","challengeValue":"v"}`,
		`{"expiresInMs":10000,"messages":[{"type":"drain","deadlineMs":7}],"reregister":true}`,
		`{"type":"wind_down"}`,
		`{"nack":"superseded"}`,
		`{"clientId":"c","namespace":"/n","id":"i"}`,
		`{"released":true}`,
		`{"clientId":"c","type":"drain","deadlineMs":1}`,
		`{"value":"v"}`,
		`{"error":"e","field":"f"}`,
		`{"sessionId":"s","placements":{"/n":3},"namespaces":null}`,
		`{"workers":[{"sessionId":"s"}]}`,
		`{"protocolVersion":1,"namespaces":{"/n":{"workers":1}}}`,
		`{"ok":true,"store":"ok","shuttingDown":true}`,
		`{"queued":true}`,
		`{"sessionId":"s","namespace":"/n","id":"i","alarm":{"name":"a","atMs":5,"everyMs":1000,"skipMissed":true,"maxAttempts":3,"backoffMs":10}}`,
		`{"gen":"g"}`,
		`{"sessionId":"s","namespace":"/n","id":"i","name":"a"}`,
		`{"deleted":true}`,
		`{"sessionId":"s","namespace":"/n","id":"i"}`,
		`{"alarms":[{"name":"a","atMs":1,"failures":2,"waits":1,"gen":"g","dueMs":3}]}`,
		`{"deadAlarms":[{"namespace":"/n","id":"i","alarm":{"name":"a","atMs":1},"deadAtMs":2,"error":"HTTP 500"}]}`,
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		mk := wireBodies[int(kind)%len(wireBodies)]
		v1 := mk()
		if json.Unmarshal(data, v1) != nil {
			return
		}
		b1, err := json.Marshal(v1)
		if err != nil {
			t.Fatalf("%T decoded from %q does not encode: %v", v1, data, err)
		}
		v2 := mk()
		if err := json.Unmarshal(b1, v2); err != nil {
			t.Fatalf("%T: own encoding %s does not decode: %v", v1, b1, err)
		}
		// JSON under omitempty does not tell an empty list or map from an
		// absent one, so neither does the comparison.
		if diff := cmp.Diff(v1, v2, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("%T: %+v encodes as %s, which decodes as %+v (-first +second):\n%s", v1, v1, b1, v2, diff)
		}
		if b2, _ := json.Marshal(v2); !bytes.Equal(b1, b2) {
			t.Fatalf("%T: encoding not canonical: %s then %s", v1, b1, b2)
		}
	})
}

// ParseAdvertiseURL never panics, and what it accepts is usable: the address
// is host:port with a port, and the prefix is empty or starts with '/' and
// does not end with one.
func FuzzParseAdvertiseURL(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:8080", "http://h", "http://h:1/app/", "http://[::1]:9/x%2Fy", "https://h:1",
		"http://u@h:1", "http://h:1/?q", "http://h:1/#f", "http:opaque", "", "http://", "://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addr, prefix, err := ParseAdvertiseURL(s)
		if err != nil {
			return
		}
		if _, port, serr := net.SplitHostPort(addr); serr != nil || port == "" {
			t.Fatalf("ParseAdvertiseURL(%q) addr = %q: %v", s, addr, serr)
		}
		if prefix != "" && (prefix[0] != '/' || strings.HasSuffix(prefix, "/")) {
			t.Fatalf("ParseAdvertiseURL(%q) prefix = %q", s, prefix)
		}
	})
}
