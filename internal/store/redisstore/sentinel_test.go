package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// Through Redis Sentinel (?master_set=): the store follows a failover of
// the primary to its replica; sessions and placements written before
// survive on the replica, and the store is back within the failover time
// plus a second.
func TestSentinelFailover(t *testing.T) {
	p := redistest.Start(t)
	r := redistest.StartReplica(t, p)
	g := redistest.StartSentinels(t, p, 3, r)
	s := open(t, Config{URL: g.URL()})
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", Secret: "x", AdvertiseURL: "http://10.0.0.1:1", Namespaces: []string{"/ns"}, Headroom: 1}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if h, err := s.Claim(ctx, "/ns", "id", "s1"); err != nil || h != "s1" {
		t.Fatalf("Claim = %q, %v", h, err)
	}
	// The writes must have reached the replica before the primary dies
	// (asynchronous replication: WAIT makes sure of it here).
	if _, err := redistest.Command(p.Addr, "WAIT", "1", "2000"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	p.Kill()
	var promoted time.Time
	var back time.Time
	for deadline := killed.Add(30 * time.Second); back.IsZero(); {
		if promoted.IsZero() {
			if m, err := g.Master(); err == nil && m == r.Addr {
				promoted = time.Now()
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		_, err := s.Claim(cctx, "/ns", "probe", "s1")
		cancel()
		if err == nil {
			back = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store did not come back within 30 s of the primary's death (promoted: %v): %v", !promoted.IsZero(), err)
		}
		time.Sleep(20 * time.Millisecond) // polling across a failover
	}
	if promoted.IsZero() {
		promoted = back
	}
	t.Logf("failover (kill to promotion seen) %v; store back after %v", promoted.Sub(killed).Round(time.Millisecond), back.Sub(killed).Round(time.Millisecond))
	if back.Sub(promoted) > time.Second {
		t.Errorf("store back %v after the promotion; want at most 1 s", back.Sub(promoted))
	}
	if h, err := s.Placement(ctx, "/ns", "id"); err != nil || h != "s1" {
		t.Errorf("placement after the failover = %q, %v; want s1 (it was replicated)", h, err)
	}
	if sess, err := s.Session(ctx, "s1"); err != nil || sess.ClientID != "c1" {
		t.Errorf("session after the failover = %+v, %v; want s1 of c1", sess, err)
	}
	if _, _, err := s.Heartbeat(ctx, "s1", store.Update{Headroom: 1}, time.Minute); err != nil {
		t.Errorf("heartbeat after the failover = %v", err)
	}
}

// A node that cannot take writes now (a replica, as a demoted primary is
// right after a failover, until the client follows the sentinels) is
// store.ErrUnavailable (503 + Retry-After upstream), not a store failure
// (500).
func TestReplicaWritesAreUnavailable(t *testing.T) {
	p := redistest.Start(t)
	r := redistest.StartReplica(t, p)
	s := open(t, Config{URL: r.URL, CircuitProbeInterval: -1})
	defer s.Close()
	_, err := s.Claim(context.Background(), "/ns", "id", "s1")
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("Claim on a replica = %v; want ErrUnavailable naming READONLY", err)
	}
}
