package host

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func isDone(c context.Context) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// An instance's context honours the context contract whether it is
// cancelled before or after its Done channel is made, and Err alone never
// makes the standard context.
func TestInstanceContextCancel(t *testing.T) {
	t.Run("cancel before Done", func(t *testing.T) {
		inst := &Instance{id: "a"}
		c := inst.Context()
		if c.Err() != nil {
			t.Fatalf("Err() = %v before cancel", c.Err())
		}
		inst.cancel()
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err() = %v after cancel; want Canceled", c.Err())
		}
		if inst.stdCtx.Load() != nil {
			t.Fatal("Err made the standard context")
		}
		if !isDone(c) {
			t.Fatal("Done made after cancel is not closed")
		}
	})
	t.Run("Done before cancel", func(t *testing.T) {
		inst := &Instance{id: "a"}
		c := inst.Context()
		if isDone(c) {
			t.Fatal("Done closed before cancel")
		}
		derived, stop := context.WithTimeout(c, time.Hour)
		defer stop()
		inst.cancel()
		if !isDone(c) || !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("after cancel: done %v, Err %v; want closed, Canceled", isDone(c), c.Err())
		}
		if !isDone(derived) || !errors.Is(derived.Err(), context.Canceled) {
			t.Fatalf("derived context after cancel: done %v, Err %v; want closed, Canceled", isDone(derived), derived.Err())
		}
	})
}

type ctxKey struct{}

// The lease's end reaches the instance's context, made or not, with the
// lease's error and cause; the lease's values are the context's.
func TestInstanceContextFollowsTheLease(t *testing.T) {
	for _, made := range []bool{false, true} {
		lease, end := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "s1"))
		inst := &Instance{id: "a", lease: lease}
		c := inst.Context()
		if made {
			_ = c.Done()
		}
		if c.Err() != nil {
			t.Fatalf("made %v: Err() = %v under a live lease", made, c.Err())
		}
		cause := errors.New("lease lost")
		end(cause)
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("made %v: Err() = %v after the lease ended; want Canceled", made, c.Err())
		}
		if !made && inst.stdCtx.Load() != nil {
			t.Fatal("Err made the standard context")
		}
		if !isDone(c) || context.Cause(c) != cause {
			t.Fatalf("made %v: done %v, cause %v; want closed, %v", made, isDone(c), context.Cause(c), cause)
		}
		if v := c.Value(ctxKey{}); v != "s1" {
			t.Fatalf("Value = %v; want the lease's s1", v)
		}
	}
}

// cancel and the first Done race: whichever comes first, Done ends closed.
func TestInstanceContextCancelRacesDone(t *testing.T) {
	for range 2000 {
		inst := &Instance{id: "a"}
		var wg sync.WaitGroup
		var done <-chan struct{}
		wg.Go(func() { done = inst.Context().Done() })
		wg.Go(inst.cancel)
		wg.Wait()
		select {
		case <-done:
		default:
			t.Fatal("Done not closed after a cancel that raced its creation")
		}
	}
}

// Serving requests does not make an instance's standard context: an idle
// instance keeps only its flag (the memory an idle instance costs,
// docs/scale.md), in local and fleet mode.
func TestServingLeavesTheInstanceContextUnmade(t *testing.T) {
	check := func(t *testing.T, ts *testServer, hdr ...string) {
		for range 3 {
			ts.expect(200, "GET", "/p/a/", hdr...)
		}
		inst := ts.h.instance("a")
		if inst == nil {
			t.Fatal("no instance a")
		}
		if inst.stdCtx.Load() != nil {
			t.Fatal("serving requests made the instance's standard context")
		}
		if inst.Context().Err() != nil {
			t.Fatalf("Err() = %v on a live instance", inst.Context().Err())
		}
	}
	t.Run("local", func(t *testing.T) { check(t, newTestHost(t, Config{}, newEnv())) })
	t.Run("fleet", func(t *testing.T) {
		ts, _, _ := newFleetHost(t, Config{})
		check(t, ts, auth("")...)
	})
}
