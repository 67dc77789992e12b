package registry

import (
	"strings"
	"testing"

	"github.com/pinned-go/pinned/internal/wire"
)

// FuzzDecodeBodies feeds arbitrary bytes to the decoder of each registry
// body (kind selects which). Properties: no panic; whatever is accepted
// satisfies every rule the handlers rely on. Seeds are in
// testdata/fuzz/FuzzDecodeBodies.
func FuzzDecodeBodies(f *testing.F) {
	f.Add(uint8(0), []byte(`{"clientId":"c1","secret":"s","namespaces":["/counter"],"advertiseUrl":"http://10.0.0.1:8080","headroom":3,"challenge":"x","challengeValue":"y"}`))
	f.Add(uint8(1), []byte(`{"sessionId":"abc","headroom":1,"draining":true,"drainDeadline":5,"challenge":"c","challengeValue":"v"}`))
	f.Add(uint8(2), []byte(`{"clientId":"c","namespace":"/n","id":"x"}`))
	f.Add(uint8(3), []byte(`{"clientId":"c","type":"drain","deadlineMs":7}`))
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		switch kind % 4 {
		case 0:
			r, e := parseRegister(body, DefaultMaxNamespaces, kind&4 == 0)
			if e != nil {
				checkBad(t, e)
				return
			}
			if wire.CheckSegment([]byte(r.ClientID), MaxClientIDLen) != wire.SegmentOK || r.Secret == "" || !headerSafe(r.Secret) {
				t.Fatalf("accepted clientId %q / secret %q", r.ClientID, r.Secret)
			}
			if len(r.Namespaces) == 0 || len(r.Namespaces) > DefaultMaxNamespaces {
				t.Fatalf("accepted %d namespaces", len(r.Namespaces))
			}
			seen := map[string]bool{}
			for _, ns := range r.Namespaces {
				if wire.CheckNamespace(ns) != wire.SegmentOK || wire.IsReservedNamespace(ns) || seen[ns] || strings.Contains(ns, ",") {
					t.Fatalf("accepted namespace %q in %q", ns, r.Namespaces)
				}
				seen[ns] = true
			}
			again, err := canonicalAdvertiseURL(r.AdvertiseURL)
			if err != nil || again != r.AdvertiseURL {
				t.Fatalf("canonical advertiseUrl %q is not a fixed point: %q, %v", r.AdvertiseURL, again, err)
			}
			if addr, _ := hostPort(r.AdvertiseURL); addr == "" || strings.ContainsAny(r.AdvertiseURL, "@?#") {
				t.Fatalf("accepted advertiseUrl %q", r.AdvertiseURL)
			}
			if r.Headroom < 0 || (r.Challenge == "") != (r.ChallengeValue == "") || (kind&4 == 0 && r.Challenge == "") {
				t.Fatalf("accepted %+v", r)
			}
		case 1:
			r, e := parseHeartbeat(body)
			if e != nil {
				checkBad(t, e)
				return
			}
			if wire.CheckSessionID(r.SessionID) != wire.SegmentOK || r.Headroom < 0 || r.DrainDeadline < 0 || (r.Challenge == "") != (r.ChallengeValue == "") {
				t.Fatalf("accepted %+v", r)
			}
		case 2:
			r, e := parseRelease(body)
			if e != nil {
				checkBad(t, e)
				return
			}
			if wire.CheckNamespace(r.Namespace) != wire.SegmentOK || wire.CheckSegment([]byte(r.ID), 0) != wire.SegmentOK ||
				wire.CheckSegment([]byte(r.ClientID), MaxClientIDLen) != wire.SegmentOK {
				t.Fatalf("accepted %+v", r)
			}
		case 3:
			r, e := parsePush(body)
			if e != nil {
				checkBad(t, e)
				return
			}
			if (r.Type != wire.MessageDrain && r.Type != wire.MessageWindDown) || r.DeadlineMs < 0 {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}

func checkBad(t *testing.T, e *badRequest) {
	t.Helper()
	if e.status != 400 || e.msg == "" {
		t.Fatalf("refusal %+v: want 400 with a message", e)
	}
}
