package registry

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/store/redisstore"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// While the store makes its first connection (the pinboard serves before
// it has one), a janitor pass logs no error; once an attempt has failed,
// it does; and a healthy store, once connected, logs nothing either.
func TestSweepWhileConnecting(t *testing.T) {
	rs := redistest.Start(t)
	var rec logtest.Recorder
	st, err := redisstore.New(redisstore.Config{URL: rs.URL, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reg, err := New(Config{Store: st, Tokens: []string{token}, Logger: rec.Logger(slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	reg.Sweep(bg) // before Connect: the first attempt has not completed
	if errs := rec.Find("store unreachable", nil); len(errs) != 0 {
		t.Fatalf("a sweep before the first connection attempt completed logged %v", errs)
	}
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	if err := st.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	reg.Sweep(bg)
	for _, r := range rec.Records() {
		if r.Level >= slog.LevelWarn {
			t.Errorf("a start with a healthy Redis logged %s", r)
		}
	}

	// A store whose first attempt failed is unreachable: that is an error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "redis://" + ln.Addr().String() + "/0"
	ln.Close()
	down, err := redisstore.New(redisstore.Config{URL: dead, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	var rec2 logtest.Recorder
	reg2, err := New(Config{Store: down, Tokens: []string{token}, Logger: rec2.Logger(slog.LevelInfo)})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel2()
	_ = down.Connect(short) // fails: nothing listens
	reg2.Sweep(bg)
	if errs := rec2.Find("store unreachable", nil); len(errs) != 1 || errs[0].Level != slog.LevelError {
		t.Fatalf("a sweep after a failed connection attempt logged %v; want one ERROR store unreachable\n%s", errs, rec2.Dump())
	}
}
