package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// waitCircuit polls the circuit (a background prober's state) until it is
// open (or closed).
func waitCircuit(t *testing.T, s *Store, open bool, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for s.circuit.open.Load() != open {
		if time.Since(start) > within {
			t.Fatalf("the circuit is not open=%v within %v", open, within)
		}
		time.Sleep(5 * time.Millisecond) // polling the prober's state
	}
	return time.Since(start)
}

// fastFailures makes calls while the circuit is open: each must come back
// with store.ErrUnavailable without waiting for its deadline, as a call
// that met a hung Redis itself would. The deadline is long (10 s) and only
// a call that took half of it fails the test, which no stall of a busy
// machine reaches; the slowest is logged (microseconds when quiet).
func fastFailures(t *testing.T, s *Store) {
	t.Helper()
	const deadline = 10 * time.Second
	var slowest time.Duration
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		_, err := s.Placement(ctx, "/ns", "id")
		cancel()
		d := time.Since(start)
		if !errors.Is(err, store.ErrUnavailable) || d >= deadline/2 {
			t.Fatalf("Placement while Redis is known down = %v after %v; want ErrUnavailable at once, not after a wait for the %v deadline", err, d, deadline)
		}
		slowest = max(slowest, d)
	}
	t.Logf("50 calls with the circuit open: the slowest took %v", slowest)
	if err := s.Ping(context.Background()); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping while the circuit is open = %v; want ErrUnavailable", err)
	}
}

// While Redis is known to be down (killed, or hung) every call fails at
// once with store.ErrUnavailable; the prober notices Redis back and calls
// go through again; Close stops the prober (goleak checks in TestMain).
func TestCircuit(t *testing.T) {
	for _, how := range []string{"killed", "hung"} {
		t.Run(how, func(t *testing.T) {
			srv := redistest.Start(t)
			s := open(t, Config{URL: srv.URL})
			defer s.Close()
			ctx := context.Background()
			if _, err := s.Claim(ctx, "/ns", "id", "s1"); err != nil {
				t.Fatal(err)
			}
			if got := s.Metrics(); got == nil {
				t.Fatal("Metrics() = nil")
			}
			if how == "killed" {
				srv.Kill()
			} else {
				srv.Freeze()
			}
			// The first call meets the outage itself (a hung Redis holds it
			// until its deadline) and kicks the prober.
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			if _, err := s.Placement(cctx, "/ns", "id2"); err == nil {
				t.Fatal("Placement with Redis down = nil error")
			}
			cancel()
			waitCircuit(t, s, true, 3*time.Second)
			fastFailures(t, s)
			if n := s.circuit.trips.Get(); n != 1 {
				t.Errorf("trips = %d; want 1", n)
			}
			if how == "killed" {
				srv.Restart(t)
			} else {
				srv.Thaw()
			}
			d := waitCircuit(t, s, false, 5*time.Second)
			t.Logf("closed %v after Redis came back", d)
			if _, err := s.Claim(ctx, "/ns", "id3", "s1"); err != nil {
				t.Fatalf("Claim after Redis came back = %v", err)
			}
		})
	}
}

// A negative CircuitProbeInterval turns the circuit off: calls keep
// meeting Redis (and its outage) themselves.
func TestCircuitOff(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Config{URL: srv.URL, CircuitProbeInterval: -1})
	defer s.Close()
	srv.Kill()
	cctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := s.Placement(cctx, "/ns", "id")
	cancel()
	if err == nil {
		t.Fatal("Placement with Redis down = nil error")
	}
	time.Sleep(300 * time.Millisecond) // a prober, if any, would have opened the circuit by now
	if s.circuit.open.Load() {
		t.Fatal("the circuit opened although it is off")
	}
}
