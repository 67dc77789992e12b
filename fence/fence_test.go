package fence_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/fence"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Options()...) }

// expect reads a key and requires its value and epoch.
func expect(t *testing.T, c rueidis.Client, key, value string, epoch uint64) {
	t.Helper()
	v, e, err := fence.Get(context.Background(), c, key)
	if err != nil || v != value || e != epoch {
		t.Fatalf("Get(%s) = %q, %d, %v; want %q, %d", key, v, e, err, value, epoch)
	}
}

// expectStale requires a *StaleError naming the key's current epoch that
// matches fence.ErrStale and host.ErrStale.
func expectStale(t *testing.T, err error, epoch, current uint64) {
	t.Helper()
	var se *fence.StaleError
	if !errors.As(err, &se) || se.Epoch != epoch || se.Current != current || !errors.Is(err, fence.ErrStale) || !errors.Is(err, host.ErrStale) {
		t.Fatalf("err = %v; want a *StaleError of epoch %d against %d, matching ErrStale and host.ErrStale", err, epoch, current)
	}
}

func TestSetIncrLoad(t *testing.T) {
	srv := redistest.Start(t)
	c := redistest.Client(t, srv.URL)
	ctx := context.Background()

	expect(t, c, "k", "", 0) // never written
	if err := fence.Set(ctx, c, "k", 5, "five"); err != nil {
		t.Fatal(err)
	}
	expect(t, c, "k", "five", 5)
	expectStale(t, fence.Set(ctx, c, "k", 3, "three"), 3, 5)
	expect(t, c, "k", "five", 5) // untouched
	if err := fence.Set(ctx, c, "k", 5, "five again"); err != nil {
		t.Fatalf("an equal epoch is the same activation: %v", err)
	}
	if err := fence.Set(ctx, c, "k", 7, "seven"); err != nil {
		t.Fatal(err)
	}
	expect(t, c, "k", "seven", 7)

	for i, want := range []int64{1, 2, 12} {
		n, err := fence.Incr(ctx, c, "n", 10, []int64{1, 1, 10}[i])
		if err != nil || n != want {
			t.Fatalf("Incr #%d = %d, %v; want %d", i+1, n, err, want)
		}
	}
	_, err := fence.Incr(ctx, c, "n", 9, 1)
	expectStale(t, err, 9, 10)
	expect(t, c, "n", "12", 10)
	if _, err := fence.Incr(ctx, c, "k", 7, 1); err == nil || errors.Is(err, fence.ErrStale) {
		t.Fatalf("Incr of a non-integer value = %v; want an error that is not stale", err)
	}

	// Load fences out older activations before it reads.
	if v, err := fence.Load(ctx, c, "n", 11); err != nil || v != "12" {
		t.Fatalf("Load = %q, %v; want 12", v, err)
	}
	_, err = fence.Incr(ctx, c, "n", 10, 1) // the old activation's late write
	expectStale(t, err, 10, 11)
	expect(t, c, "n", "12", 11)
	_, err = fence.Load(ctx, c, "n", 10)
	expectStale(t, err, 10, 11)
	if v, err := fence.Load(ctx, c, "fresh", 4); err != nil || v != "" {
		t.Fatalf("Load of a fresh key = %q, %v; want empty", v, err)
	}
	expectStale(t, fence.Set(ctx, c, "fresh", 3, "x"), 3, 4) // the load recorded its epoch
	expect(t, c, "fresh", "", 4)
}

// Epochs compare exactly over the whole uint64 range (Lua numbers are
// doubles: above 2^53 they would not), and by length before digits.
func TestEpochComparisonExact(t *testing.T) {
	srv := redistest.Start(t)
	c := redistest.Client(t, srv.URL)
	ctx := context.Background()
	const top = uint64(1<<64 - 1)
	if err := fence.Set(ctx, c, "big", top, "top"); err != nil {
		t.Fatal(err)
	}
	expectStale(t, fence.Set(ctx, c, "big", top-1, "below"), top-1, top)
	expect(t, c, "big", "top", top)
	if err := fence.Set(ctx, c, "len", 10, "ten"); err != nil {
		t.Fatal(err)
	}
	expectStale(t, fence.Set(ctx, c, "len", 9, "nine"), 9, 10) // "9" > "10" as strings
}

// Concurrent writers with random epochs: the key ends with the largest
// epoch and that writer's value, and its epoch never went down.
func TestConcurrentWriters(t *testing.T) {
	srv := redistest.Start(t)
	c := redistest.Client(t, srv.URL)
	ctx := context.Background()
	const writers, rounds = 8, 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	var max uint64
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				e := rng.Uint64N(1000) + 1
				err := fence.Set(ctx, c, "k", e, strconv.FormatUint(e, 10))
				var se *fence.StaleError
				if err != nil && !(errors.As(err, &se) && se.Current > e) {
					t.Errorf("Set(%d) = %v; want nil or stale against a larger epoch", e, err)
				}
				mu.Lock()
				if err == nil && e > max {
					max = e
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	expect(t, c, "k", strconv.FormatUint(max, 10), max)
}

// The scripts run on Redis Cluster: one key each.
func TestOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	c := redistest.Client(t, cl.URL)
	ctx := context.Background()
	for i := range 20 { // keys over every node
		key := "counter:" + strconv.Itoa(i)
		if _, err := fence.Load(ctx, c, key, 2); err != nil {
			t.Fatal(err)
		}
		if n, err := fence.Incr(ctx, c, key, 2, 1); err != nil || n != 1 {
			t.Fatalf("Incr(%s) = %d, %v", key, n, err)
		}
		_, err := fence.Incr(ctx, c, key, 1, 1)
		expectStale(t, err, 1, 2)
	}
}
