package leaseterm

import (
	"testing"
	"time"

	"github.com/pinned-go/pinned/clock"
)

func TestTermCountsFromTheSendTime(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	sent := clk.Now()
	clk.Advance(3 * time.Second) // the ack comes back late
	term := Anchor(sent, clk.Now(), 10*time.Second)
	const buffer = 5 * time.Second
	if term.Sent != sent || term.Deadline(buffer) != sent.Add(5*time.Second) || term.Expires() != sent.Add(10*time.Second) {
		t.Fatalf("term %+v: deadline %v, expires %v; want both from the send time", term, term.Deadline(buffer), term.Expires())
	}
	for _, c := range []struct {
		after time.Duration // since the send
		want  bool
	}{{0, true}, {4999 * time.Millisecond, true}, {5 * time.Second, false}, {time.Hour, false}} {
		if got := term.Valid(sent.Add(c.after), buffer); got != c.want {
			t.Errorf("Valid %v after the send = %v; want %v", c.after, got, c.want)
		}
	}
	// A machine suspend counts (Instant.Sub is the larger of monotonic and
	// wall time).
	clk.Suspend(10 * time.Second)
	if term.Valid(clk.Now(), buffer) {
		t.Error("the term is still valid after the machine slept past it")
	}
}
