package registry

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// FuzzDecodeBodies feeds arbitrary bytes to the decoder of each registry
// body (kind selects which). Properties: no panic; whatever is accepted
// satisfies every rule the handlers rely on. Seeds are in
// testdata/fuzz/FuzzDecodeBodies.
func FuzzDecodeBodies(f *testing.F) {
	f.Add(uint8(0), []byte(`{"clientId":"c1","secret":"s","namespaces":["/counter"],"advertiseUrl":"http://10.0.0.1:8080","headroom":3,"challenge":"JZ3T6ODOXDWFRZW4QBKEQBRGTU","challengeValue":"y"}`))
	f.Add(uint8(1), []byte(`{"sessionId":"abc","headroom":1,"draining":true,"drainDeadline":5,"challenge":"JZ3T6ODOXDWFRZW4QBKEQBRGTU","challengeValue":"v"}`))
	f.Add(uint8(2), []byte(`{"clientId":"c","namespace":"/n","id":"x","sessionId":"v1oDtDTikpwhdnkhj6TBnvvR"}`))
	f.Add(uint8(3), []byte(`{"clientId":"c","type":"drain","deadlineMs":7}`))
	f.Add(uint8(4), []byte(`{"clientId":"c1","secret":"s","namespaces":["/counter"],"advertiseUrl":"http://[::ffff:7f00:1]:80/"}`))
	f.Add(uint8(5), []byte(`{"sessionId":"v1oDtDTikpwhdnkhj6TBnvvR"}`))
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		// kind%6: 0 register (pair required), 4 register (pair optional),
		// 1 heartbeat, 2 release, 3 push, 5 deregister.
		switch k := kind % 6; k {
		case 0, 4:
			r, e := parseRegister(body, DefaultMaxNamespaces, k == 0)
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
			if r.Headroom < 0 || (r.Challenge == "") != (r.ChallengeValue == "") || (k == 0 && r.Challenge == "") ||
				(r.Challenge != "" && len(r.Challenge) < wire.MinChallengeLen) {
				t.Fatalf("accepted %+v", r)
			}
			// The policy never panics on an accepted URL and refuses the
			// numeric-obfuscated hosts the parser let through (none).
			if err := (&addrPolicy{}).checkURL(r.AdvertiseURL); err != nil && !errors.Is(err, errNetworkNotAllowed) &&
				!strings.Contains(err.Error(), "metadata") {
				t.Fatalf("checkURL(%q) = %v", r.AdvertiseURL, err)
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
				wire.CheckSegment([]byte(r.ClientID), MaxClientIDLen) != wire.SegmentOK ||
				(r.SessionID != "" && wire.CheckSessionID(r.SessionID) != wire.SegmentOK) {
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
		case 5:
			r, e := parseDeregister(body)
			if e != nil {
				checkBad(t, e)
				return
			}
			if wire.CheckSessionID(r.SessionID) != wire.SegmentOK {
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

// FuzzAdvertiseURL checks the advertise-URL parser and the default policy
// on arbitrary strings: no panic; an accepted URL is a fixed point of
// canonicalisation; its host is either a canonical IP literal that the
// address rules accept, or a DNS name whose last label is not numeric (so
// no resolver can read it as an address). Seeds are in
// testdata/fuzz/FuzzAdvertiseURL.
func FuzzAdvertiseURL(f *testing.F) {
	for _, s := range []string{"http://10.0.0.1:8080", "http://2130706433", "http://[::ffff:169.254.169.254]", "https://w.internal.:443/", "http://0x7f.1"} {
		f.Add(s)
	}
	def := &addrPolicy{}
	f.Fuzz(func(t *testing.T, in string) {
		canon, err := canonicalAdvertiseURL(in)
		if err != nil {
			return
		}
		if again, err := canonicalAdvertiseURL(canon); err != nil || again != canon {
			t.Fatalf("canonical %q of %q is not a fixed point: %q, %v", canon, in, again, err)
		}
		if def.checkURL(canon) != nil {
			return
		}
		addr, _ := hostPort(canon)
		host, _, _ := net.SplitHostPort(addr)
		if ip, err := netip.ParseAddr(host); err == nil {
			if ip.String() != host || def.check(ip) != nil {
				t.Fatalf("accepted %q with a non-canonical or refused address %q", canon, host)
			}
			return
		}
		labels := strings.Split(host, ".")
		if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") || net.ParseIP(host) != nil {
			t.Fatalf("accepted %q whose host %q reads as a number", canon, host)
		}
	})
}
