package proxy

import (
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// A 503 unreachable tells the client when the id is expected to be served
// again: the session's expected recovery (fast failover is checking whether
// its process is gone), else the time left of its lease, else the
// configured Retry-After.
func TestUnreachableRetryAfter(t *testing.T) {
	p, err := New(Config{Resolver: noResolver{}, RetryAfter: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := &Session{ID: "s"}
	retryAfter := func() string {
		rp := p.unreachableReply(s)
		if rp.status != 503 || rp.reason != wire.ReasonUnreachable || !rp.retryAfter {
			t.Fatalf("unreachableReply = %d %q (Retry-After %v); want 503 unreachable with Retry-After", rp.status, rp.reason, rp.retryAfter)
		}
		if rp.retryIn == "" {
			return p.replies.retryAfter
		}
		return rp.retryIn
	}
	now := time.Now()
	for _, c := range []struct {
		what     string
		leaseEnd time.Time
		recovery time.Time
		want     string
	}{
		{what: "nothing known", want: "2"},
		{what: "lease ends in 7.5 s", leaseEnd: now.Add(7500 * time.Millisecond), want: "8"},
		{what: "a probe runs: recovery in 1 s", leaseEnd: now.Add(7500 * time.Millisecond), recovery: now.Add(900 * time.Millisecond), want: "2"},
		{what: "a probe runs: recovery in 3 s", leaseEnd: now.Add(7500 * time.Millisecond), recovery: now.Add(2900 * time.Millisecond), want: "3"},
		{what: "the probe proved nothing (cleared)", leaseEnd: now.Add(7500 * time.Millisecond), want: "8"},
		{what: "lease long past", leaseEnd: now.Add(-time.Minute), want: "2"},
		{what: "a lease of an hour: capped", leaseEnd: now.Add(time.Hour), want: "120"},
	} {
		s.SetLeaseEnd(c.leaseEnd)
		if c.leaseEnd.IsZero() {
			s.leaseEnd.Store(0)
		}
		s.SetRecovery(c.recovery)
		if got := retryAfter(); got != c.want {
			t.Errorf("%s: Retry-After %s; want %s", c.what, got, c.want)
		}
	}
}
