package worker

import (
	"context"
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/wire"
)

// newLeasedWorker returns a worker holding session "s1", anchored now on
// clk, without any network (for Admit tests and benchmarks).
func newLeasedWorker(tb testing.TB, clk clock.Clock) *Worker {
	tb.Helper()
	w, err := New(Config{PinboardURL: "http://127.0.0.1:1", AdvertiseURL: "http://127.0.0.1:2", Token: "t", Clock: clk})
	if err != nil {
		tb.Fatal(err)
	}
	w.current.Store(anchorLease(newSession("s1"), clk.Now(), clk.Now(), 1, DefaultLease))
	return w
}

func TestAdmit(t *testing.T) {
	clk := clock.NewFake(t0Wall)
	w := newLeasedWorker(t, clk)
	secret := w.secret
	f := func(name string, secret, session []byte, want string) {
		t.Helper()
		ctx, why := w.Admit(secret, session)
		if why != want {
			t.Errorf("Admit(%s) = %q; want %q", name, why, want)
		}
		if (ctx != nil) != (want == "") {
			t.Errorf("Admit(%s) context = %v; want one exactly when admitted", name, ctx)
		}
	}
	f("right secret, no session header", secret, nil, "")
	f("right secret, empty session header", secret, []byte{}, "")
	f("right secret, current session", secret, []byte("s1"), "")
	f("right secret, other session", secret, []byte("s0"), wire.ReasonLease)
	f("right secret, session prefix", secret, []byte("s"), wire.ReasonLease)
	f("wrong secret", []byte("nope"), nil, wire.ReasonForbidden)
	f("wrong secret, current session", append([]byte{}, secret[:len(secret)-1]...), []byte("s1"), wire.ReasonForbidden)
	f("missing secret", nil, nil, wire.ReasonForbidden)

	clk.Advance(5*time.Second - time.Nanosecond)
	f("1ns before the local deadline", secret, nil, "")
	clk.Advance(time.Nanosecond)
	f("at the local deadline", secret, nil, wire.ReasonLease)
	f("wrong secret past the deadline", []byte("nope"), nil, wire.ReasonForbidden)

	w.current.Store(nil)
	f("unregistered", secret, nil, wire.ReasonLease)
}

func BenchmarkAdmit(b *testing.B) {
	w := newLeasedWorker(b, clock.Real{})
	secret, session := w.secret, []byte("s1")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, why := w.Admit(secret, session); why != "" {
				b.Fatal(why)
			}
		}
	})
}

// LeaseValid (host.LeaseChecker, used by Instance.Do) is the inline check
// for a lease context outside the request path: the current lease, on the
// clock right now, whether or not the watchdog has run.
func TestLeaseValid(t *testing.T) {
	clk := clock.NewFake(t0Wall)
	w := newLeasedWorker(t, clk)
	lease, why := w.Admit(w.secret, nil)
	if why != "" {
		t.Fatal(why)
	}
	if !w.LeaseValid(lease) {
		t.Fatal("the current lease is not valid")
	}
	if w.LeaseValid(context.Background()) {
		t.Fatal("a context that is not the current lease is valid")
	}
	clk.Advance(5 * time.Second)
	if w.LeaseValid(lease) {
		t.Fatal("the lease is valid at the local deadline")
	}
	if lease.Err() != nil {
		t.Fatal("the test meant a lease whose watchdog has not run")
	}
	old := lease
	w.current.Store(anchorLease(newSession("s2"), clk.Now(), clk.Now(), 2, DefaultLease))
	if w.LeaseValid(old) {
		t.Fatal("the previous session's lease is valid under a new session")
	}
	if allocs := testing.AllocsPerRun(100, func() { w.LeaseValid(old) }); allocs != 0 {
		t.Fatalf("LeaseValid allocates %v times", allocs)
	}
}
