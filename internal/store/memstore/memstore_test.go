package memstore

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts store.Options) storetest.Harness {
		fake := clock.NewFake(time.Unix(1_700_000_000, 0))
		s, err := New(Config{Options: opts, Clock: fake})
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Harness{
			Store: s,
			Lease: 10 * time.Second,
			Elapse: func(d time.Duration) {
				fake.Advance(d)
				s.Expire()
			},
			Flush: s.Flush,
		}
	})
}

// The reaper goroutine announces an expiry on its own, on the real clock.
func TestReaperAnnouncesExpiry(t *testing.T) {
	got := make(chan store.Invalidation, 16)
	s, err := New(Config{Options: store.Options{OnInvalidate: func(inv store.Invalidation) { got <- inv }}})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	s.Start() // idempotent
	defer s.Close()
	if _, err := s.Register(context.Background(), store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h"}, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	<-got // the registration itself
	timeout := time.After(5 * time.Second)
	for {
		select {
		case inv := <-got:
			if inv == (store.Invalidation{Session: "s1"}) {
				if _, err := s.Session(context.Background(), "s1"); err != store.ErrUnknownSession {
					t.Fatalf("Session after the expiry announcement = %v; want ErrUnknownSession", err)
				}
				return
			}
		case <-timeout:
			t.Fatal("no expiry invalidation within 5s of a 50ms lease")
		}
	}
}

// A suspended machine (wall clock jumps, monotonic does not) expires leases:
// pinned's clock rule applies to the dev store too.
func TestSuspendExpiresLease(t *testing.T) {
	fake := clock.NewFake(time.Unix(1_700_000_000, 0))
	s, _ := New(Config{Clock: fake})
	defer s.Close()
	if _, err := s.Register(context.Background(), store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	fake.Suspend(11 * time.Second)
	if _, err := s.Session(context.Background(), "s1"); err != store.ErrUnknownSession {
		t.Fatalf("Session after an 11s suspend of a 10s lease = %v; want ErrUnknownSession", err)
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := New(Config{MaxQueuedMessages: -1}); err == nil {
		t.Error("New(MaxQueuedMessages: -1) succeeded")
	}
	if _, err := New(Config{QueueTTL: -time.Second}); err == nil {
		t.Error("New(QueueTTL: -1s) succeeded")
	}
}

func TestAlarmConformance(t *testing.T) {
	storetest.RunAlarms(t, func(t *testing.T, opts store.Options) storetest.Harness {
		s, err := New(Config{Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		return storetest.Harness{Store: s, Flush: s.Flush}
	})
}
