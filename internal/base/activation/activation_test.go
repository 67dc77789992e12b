package activation

import (
	"fmt"
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
)

func TestDecide(t *testing.T) {
	for _, c := range []struct {
		epoch       uint64
		live        bool
		liveEpoch   uint64
		released    uint64
		wasReleased bool
		want        Verdict
	}{
		// A live instance.
		{epoch: 5, live: true, liveEpoch: 5, want: Serve},
		{epoch: 0, live: true, liveEpoch: 5, want: Serve}, // unfenced
		{epoch: 4, live: true, liveEpoch: 5, want: Stale},
		{epoch: 6, live: true, liveEpoch: 5, want: Supersede},
		{epoch: 6, live: true, liveEpoch: 0, want: Supersede}, // an unfenced instance is superseded by any epoch
		// None live, nothing released: the route activates.
		{epoch: 5, want: Activate},
		{epoch: 0, want: Activate},
		// None live, released within the window: at or below is stale.
		{epoch: 5, released: 5, wasReleased: true, want: Stale},
		{epoch: 3, released: 5, wasReleased: true, want: Stale},
		{epoch: 6, released: 5, wasReleased: true, want: Activate},
		{epoch: 0, released: 5, wasReleased: true, want: Activate}, // unfenced
	} {
		got := Decide(c.epoch, c.live, c.liveEpoch, c.released, c.wasReleased)
		if got != c.want {
			t.Errorf("Decide(epoch %d, live %v@%d, released %d/%v) = %v; want %v",
				c.epoch, c.live, c.liveEpoch, c.released, c.wasReleased, got, c.want)
		}
	}
}

func TestReleasedRemembersTheLargestEpochForTheWindow(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	const window = 10 * time.Second
	var r Released
	floor := func(id string) (uint64, bool) { return r.Floor([]byte(id), clk.Now(), window) }

	if e, ok := floor("a"); ok {
		t.Fatalf("Floor of an id never released = %d, true; want none", e)
	}
	r.Add("a", 7, clk.Now())
	clk.Advance(3 * time.Second)
	r.Add("a", 5, clk.Now()) // an older epoch closing later never lowers the floor
	if e, ok := floor("a"); !ok || e != 7 {
		t.Fatalf("Floor(a) = %d, %v; want 7", e, ok)
	}
	// The window counts from the id's last close (3 s in): at 12 s it still
	// holds, Expire included.
	clk.Advance(9 * time.Second)
	if n := r.Expire(clk.Now(), window); n != 0 {
		t.Fatalf("Expire inside the window forgot %d ids", n)
	}
	if e, ok := floor("a"); !ok || e != 7 {
		t.Fatalf("Floor(a) 9 s after its last close = %d, %v; want 7", e, ok)
	}
	// Past the window Floor ignores it whether or not Expire ran.
	clk.Advance(time.Second)
	if e, ok := floor("a"); ok {
		t.Fatalf("Floor(a) a window after its last close = %d, true; want none", e)
	}
	if n := r.Expire(clk.Now(), window); n != 1 || r.Len() != 0 {
		t.Fatalf("Expire past the window forgot %d (left %d); want 1 (0 left)", n, r.Len())
	}
}

func TestReleasedExpireCostsWhatItForgets(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	const window = time.Second
	var r Released
	for i := range 1000 {
		r.Add(fmt.Sprint(i), uint64(i+1), clk.Now())
		clk.Advance(time.Millisecond)
	}
	// 1000 closes 1 ms apart, at 0..999 ms; at 1499 ms those at 0..499 ms
	// are a window old.
	clk.Advance(499 * time.Millisecond)
	if n := r.Expire(clk.Now(), window); n != 500 {
		t.Fatalf("Expire forgot %d; want 500", n)
	}
	if r.Len() != 500 {
		t.Fatalf("Len = %d; want 500", r.Len())
	}
	if _, ok := r.Floor([]byte("499"), clk.Now(), window); ok {
		t.Fatal("an expired id is still remembered")
	}
	if e, ok := r.Floor([]byte("500"), clk.Now(), window); !ok || e != 501 {
		t.Fatalf("Floor(500) = %d, %v; want 501", e, ok)
	}
	// The queue was compacted: its live part is what remains.
	if got := len(r.q) - r.head; got != 500 {
		t.Fatalf("queue holds %d live slots; want 500", got)
	}
	clk.Advance(window)
	if n := r.Expire(clk.Now(), window); n != 500 || r.Len() != 0 || len(r.q) != 0 {
		t.Fatalf("Expire of the rest forgot %d, left %d ids and %d slots; want 500, 0, 0", n, r.Len(), len(r.q))
	}
}

func TestReleasedFloorDoesNotAllocate(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	var r Released
	r.Add("alice", 9, clk.Now())
	id := []byte("alice")
	now := clk.Now()
	if n := testing.AllocsPerRun(100, func() { r.Floor(id, now, time.Minute) }); n != 0 {
		t.Fatalf("Floor allocates %v times; want 0", n)
	}
}
