package redisstore

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// A Redis restarted without persistence forgets every placement and every
// epoch counter. The restart fence keeps ids unplaced until every lease
// granted before the restart has ended, and the first epoch allocated after
// it still exceeds every epoch allocated before: the time floor of
// wire.NextEpoch on Redis's clock, which has moved on by at least the fence.
func TestEpochsIncreaseAcrossRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	s := open(t, Config{URL: srv.URL, RestartFence: time.Second})
	defer s.Close()
	ctx := context.Background()
	waitUptime(t, adm, 1)
	var last store.Placement
	for i := range 50 { // an id activated again and again
		p, err := s.ClaimPlacement(ctx, "/n", "x", "s1")
		if err != nil || p.Session != "s1" || p.Epoch <= last.Epoch {
			t.Fatalf("claim #%d = %+v, %v; want s1 above epoch %d", i+1, p, err, last.Epoch)
		}
		last = p
		if ok, err := s.Release(ctx, "/n", "x", "s1", p.Epoch); !ok || err != nil {
			t.Fatalf("release = %v, %v", ok, err)
		}
	}
	if _, err := s.ClaimPlacement(ctx, "/n", "y", "s1"); err != nil { // a placement that the restart loses
		t.Fatal(err)
	}

	srv.Restart(t)

	// The admin client's connection died with the server: its first
	// command may fail while it reconnects.
	var n int64
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err = adm.Do(ctx, adm.B().Exists().Key(wire.KeyEpoch("/n", "x"), wire.KeyPlacement("/n", "y")).Build()).AsInt64()
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || n != 0 {
		t.Fatalf("%d keys survived the restart (%v); the test needs a Redis that forgot them", n, err)
	}
	// The store's connection died with the server too: a claim may first
	// fail on it (EOF) while the client reconnects, then meets the fence.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := s.ClaimPlacement(ctx, "/n", "x", "s2")
		if errors.Is(err, ErrRestartFence) {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("claim right after the restart: %v; want the restart fence", err)
		}
	}
	waitUptime(t, adm, 1)
	for _, id := range []string{"x", "y"} {
		p, err := s.ClaimPlacement(ctx, "/n", id, "s2")
		if err != nil || p.Session != "s2" || p.Epoch <= last.Epoch {
			t.Fatalf("claim of %s after the restart = %+v, %v; want an epoch above %d (the last before the restart)", id, p, err, last.Epoch)
		}
	}
}

// The epoch counter guards against Redis's clock stepping back: while it is
// kept, a new epoch exceeds it whatever TIME says; Replace also exceeds the
// epoch of the placement it replaces when the counter is gone; Release
// keeps the released epoch in the counter for another EpochTTL.
func TestEpochCounterAndTTL(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	const ttl = 30 * time.Second
	s := open(t, Config{URL: srv.URL, EpochTTL: ttl})
	defer s.Close()
	ctx := context.Background()
	do := func(args ...string) {
		t.Helper()
		if err := adm.Do(ctx, adm.B().Arbitrary(args...).Build()).Error(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	get := func(key string) string {
		t.Helper()
		v, err := adm.Do(ctx, adm.B().Get().Key(key).Build()).ToString()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		return v
	}
	pttl := func(key string) int64 {
		t.Helper()
		n, err := adm.Do(ctx, adm.B().Pttl().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	future := uint64(time.Now().Add(time.Hour).UnixMicro()) // as if Redis's clock had stepped back an hour
	do("SET", wire.KeyEpoch("/n", "x"), strconv.FormatUint(future, 10))
	p, err := s.ClaimPlacement(ctx, "/n", "x", "s1")
	if err != nil || p.Epoch != future+1 {
		t.Fatalf("claim = %+v, %v; want epoch %d (counter + 1)", p, err, future+1)
	}
	if n := pttl(wire.KeyEpoch("/n", "x")); n <= 0 || n > ttl.Milliseconds() {
		t.Fatalf("epoch counter PTTL = %d; want (0, %d]", n, ttl.Milliseconds())
	}
	// Counter gone (expired): Replace still goes past the placement's epoch.
	do("DEL", wire.KeyEpoch("/n", "x"))
	p2, err := s.ReplacePlacement(ctx, "/n", "x", "s1", "s2")
	if err != nil || p2.Epoch != future+2 {
		t.Fatalf("replace without a counter = %+v, %v; want epoch %d (placement's + 1)", p2, err, future+2)
	}
	// Release keeps the released epoch for another TTL, even without a counter.
	do("DEL", wire.KeyEpoch("/n", "x"))
	if ok, err := s.Release(ctx, "/n", "x", "s2", 0); !ok || err != nil {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if v := get(wire.KeyEpoch("/n", "x")); v != strconv.FormatUint(future+2, 10) {
		t.Fatalf("epoch counter after release = %s; want the released epoch %d", v, future+2)
	}
	if n := pttl(wire.KeyEpoch("/n", "x")); n <= 0 || n > ttl.Milliseconds() {
		t.Fatalf("epoch counter PTTL after release = %d; want (0, %d]", n, ttl.Milliseconds())
	}
	p3, err := s.ClaimPlacement(ctx, "/n", "x", "s3")
	if err != nil || p3.Epoch != future+3 {
		t.Fatalf("claim after release = %+v, %v; want epoch %d", p3, err, future+3)
	}
	// A failed write allocates nothing.
	if p, err := s.ClaimPlacement(ctx, "/n", "x", "s4"); err != nil || p.Epoch != p3.Epoch {
		t.Fatalf("losing claim = %+v, %v; want the winner's %+v", p, err, p3)
	}
	if v := get(wire.KeyEpoch("/n", "x")); v != strconv.FormatUint(future+3, 10) {
		t.Fatalf("epoch counter after a lost claim = %s; want %d (unchanged)", v, future+3)
	}
}
