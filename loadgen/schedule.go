package loadgen

import (
	"math"
	"time"

	"github.com/pinned-go/pinned/clock"
)

// schedule is the open loop's timetable: slot i is intended to be sent at
// t0 + offset(i) = t0 + ⌈i·10⁹/rate⌉ ns. Slots [0, warmup) are warmup;
// slots [warmup, total) are measured. A schedule is immutable.
type schedule struct {
	t0     clock.Instant
	rate   float64 // slots per second
	warmup int64   // number of warmup slots
	total  int64   // warmup + measured slots
}

// slotsIn returns how many slots of a schedule at rate start in a window of
// length d: the integers i ≥ 0 with i/rate < d, that is ⌈rate·d⌉, with a
// millionth of a slot of tolerance for floating-point noise so that, for
// example, 1000/s over 1s is exactly 1000 slots.
func slotsIn(rate float64, d time.Duration) int64 {
	x := rate * d.Seconds()
	return int64(max(0, math.Ceil(x-1e-6)))
}

// newSchedule lays out the slots for a run: warmup slots for the Warmup
// window, then measured slots for Duration, capped at Requests.
func newSchedule(t0 clock.Instant, cfg *Config) (s schedule, stoppedBy string) {
	s = schedule{t0: t0, rate: cfg.Rate, warmup: slotsIn(cfg.Rate, cfg.Warmup)}
	measured, stoppedBy := int64(math.MaxInt64/2), StopDuration
	if cfg.Duration != Unbounded {
		measured = slotsIn(cfg.Rate, cfg.Duration)
	}
	if cfg.Requests != Unbounded && cfg.Requests < measured {
		measured, stoppedBy = cfg.Requests, StopRequests
	}
	s.total = s.warmup + measured
	return s, stoppedBy
}

// offset returns slot i's intended send time relative to t0.
func (s *schedule) offset(i int64) time.Duration {
	return time.Duration(math.Ceil(float64(i) * 1e9 / s.rate))
}

// intended returns slot i's intended send time.
func (s *schedule) intended(i int64) clock.Instant { return s.t0.Add(s.offset(i)) }

// due returns how many slots are due elapsed after t0: the number of
// slots i with offset(i) ≤ elapsed, at most total. It agrees exactly with
// offset (the float estimate is corrected by at most a step or two).
func (s *schedule) due(elapsed time.Duration) int64 {
	if elapsed < 0 {
		return 0
	}
	n := int64(float64(elapsed)*s.rate/1e9) + 1
	for n > 0 && s.offset(n-1) > elapsed {
		n--
	}
	for n < s.total && s.offset(n) <= elapsed {
		n++
	}
	return min(n, s.total)
}
