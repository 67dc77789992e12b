package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// newLeasedWorker returns a worker holding session "s1", anchored now on
// clk, without any network (for Admit tests and benchmarks).
func newLeasedWorker(tb testing.TB, clk clock.Clock) *Worker {
	tb.Helper()
	w, err := New(Config{PinboardURL: "http://127.0.0.1:1", AdvertiseURL: "http://127.0.0.1:2", Token: "t", Clock: clk})
	if err != nil {
		tb.Fatal(err)
	}
	w.current.Store(anchorLease(w.newSession("s1"), clk.Now(), clk.Now(), 1, DefaultLease))
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

// The lease context's Err is the inline check Instance.Do relies on: nil
// under the current lease; at the local deadline it ends the context itself
// (cause ErrLeaseExpired, derived contexts cancelled), whether or not the
// watchdog has run; an ended session's context stays ended. It does not
// allocate.
func TestLeaseContextErr(t *testing.T) {
	clk := clock.NewFake(t0Wall)
	w := newLeasedWorker(t, clk)
	lease, why := w.Admit(w.secret, nil)
	if why != "" {
		t.Fatal(why)
	}
	derived, cancel := context.WithCancel(lease)
	defer cancel()
	if lease.Err() != nil || derived.Err() != nil {
		t.Fatal("the current lease has ended")
	}
	if _, ok := lease.Deadline(); ok {
		t.Fatal("the lease context reports a deadline; its deadline moves, so it must report none")
	}
	if id, ok := SessionOf(derived); !ok || id != "s1" {
		t.Fatalf("SessionOf(derived) = %q, %v; want s1", id, ok)
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = lease.Err() }); allocs != 0 {
		t.Fatalf("Err of a live lease allocates %v times", allocs)
	}
	clk.Advance(5*time.Second - time.Nanosecond)
	if lease.Err() != nil {
		t.Fatal("the lease ended before its local deadline")
	}
	clk.Advance(time.Nanosecond)
	select {
	case <-lease.Done():
		t.Fatal("the test meant a lease whose watchdog has not run")
	default:
	}
	if !errors.Is(lease.Err(), context.Canceled) || !errors.Is(context.Cause(lease), ErrLeaseExpired) {
		t.Fatalf("at the local deadline: Err %v, Cause %v; want Canceled with cause ErrLeaseExpired", lease.Err(), context.Cause(lease))
	}
	select {
	case <-lease.Done():
	default:
		t.Fatal("Err reported the end but Done is open")
	}
	if derived.Err() == nil {
		t.Fatal("a context derived from the lease outlived its end")
	}
	if _, why := w.Admit(w.secret, nil); why != wire.ReasonLease {
		t.Fatalf("Admit after the end = %q; want %q", why, wire.ReasonLease)
	}
	// A new session's lease is a new context; the old one stays ended.
	w.current.Store(anchorLease(w.newSession("s2"), clk.Now(), clk.Now(), 2, DefaultLease))
	if lease.Err() == nil {
		t.Fatal("the previous session's lease revived under a new session")
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = lease.Err() }); allocs != 0 {
		t.Fatalf("Err of an ended lease allocates %v times", allocs)
	}
}
