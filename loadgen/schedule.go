package loadgen

import (
	"math"
	"sort"
	"time"

	"github.com/pinned-go/pinned/clock"
)

// schedule is the open loop's timetable. The rate over time is piecewise
// linear: the warmup at the first stage's starting rate, then each stage
// (constant, or a linear ramp), then the last rate held until the run ends.
// Λ(t), the integral of the rate from 0 to t, counts the slots due by t:
// slot i is intended at offset(i) = the first t with Λ(t) ≥ i, rounded up to
// the nanosecond. Slots [0, warmup) fall in the warmup; [warmup, total) are
// measured. A schedule is immutable and shared by every loop and worker.
type schedule struct {
	t0     clock.Instant
	segs   []segment // by start time; the last one is open-ended and constant
	warmup int64     // number of warmup slots
	total  int64     // warmup + measured slots
	end    time.Duration
}

// segment is one piece of the rate curve: from start (where Λ = lambda0)
// the rate goes linearly from r0 to r1 over dur (dur = 0: open-ended, r0).
type segment struct {
	start   float64 // ns from t0
	dur     float64 // ns; 0 for the last, open-ended segment
	lambda0 float64 // slots due at start
	r0, r1  float64 // slots per ns at start and end
}

// slotsIn returns how many slots of a constant-rate schedule start in a
// window of length d: the integers i ≥ 0 with i/rate < d, that is ⌈rate·d⌉,
// with a millionth of a slot of tolerance for floating-point noise so that,
// for example, 1000/s over 1s is exactly 1000 slots.
func slotsIn(rate float64, d time.Duration) int64 {
	return ceilSlots(rate * d.Seconds())
}

func ceilSlots(x float64) int64 {
	return int64(max(0, math.Ceil(x-1e-6)))
}

// newSchedule lays out the slots for a run: warmup slots for the Warmup
// window, then measured slots for Duration, capped at Requests.
func newSchedule(t0 clock.Instant, cfg *Config) (s schedule, stoppedBy string) {
	s.t0 = t0
	stages := cfg.stages()
	at, lambda := 0.0, 0.0
	add := func(dur float64, r0, r1 float64) {
		s.segs = append(s.segs, segment{start: at, dur: dur, lambda0: lambda, r0: r0 / 1e9, r1: r1 / 1e9})
		at += dur
		lambda += dur * (r0 + r1) / 2 / 1e9
	}
	if cfg.Warmup > 0 {
		add(float64(cfg.Warmup), stages[0].Rate, stages[0].Rate)
	}
	for _, st := range stages {
		if st.Duration > 0 {
			add(float64(st.Duration), st.Rate, st.endRate())
		}
	}
	last := stages[len(stages)-1].endRate()
	s.segs = append(s.segs, segment{start: at, lambda0: lambda, r0: last / 1e9, r1: last / 1e9})

	s.warmup = ceilSlots(s.lambda(float64(cfg.Warmup)))
	measured, stoppedBy := int64(math.MaxInt64/4), StopDuration
	if cfg.Duration != Unbounded {
		measured = ceilSlots(s.lambda(float64(cfg.Warmup+cfg.Duration))) - s.warmup
	}
	if cfg.Requests != Unbounded && cfg.Requests < measured {
		measured, stoppedBy = cfg.Requests, StopRequests
	}
	s.total = s.warmup + measured
	if s.total > 0 {
		s.end = s.offset(s.total - 1)
	}
	return s, stoppedBy
}

// lambda returns Λ(t): the slots due by t ns after t0.
func (s *schedule) lambda(t float64) float64 {
	g := s.segAt(t)
	x := t - g.start
	if g.dur > 0 {
		x = min(x, g.dur)
	}
	return g.lambda0 + g.r0*x + (g.r1-g.r0)*x*x/(2*max(g.dur, 1))
}

// segAt returns the segment containing time t.
func (s *schedule) segAt(t float64) *segment {
	i := sort.Search(len(s.segs), func(i int) bool { return s.segs[i].start > t }) - 1
	return &s.segs[max(i, 0)]
}

// offset returns slot i's intended send time relative to t0.
func (s *schedule) offset(i int64) time.Duration {
	x := float64(i)
	k := sort.Search(len(s.segs), func(k int) bool { return s.segs[k].lambda0 > x }) - 1
	g := &s.segs[max(k, 0)]
	d := x - g.lambda0
	var tau float64
	if g.dur == 0 || g.r1 == g.r0 {
		tau = d / g.r0
	} else {
		// Solve r0·τ + a·τ² = d with a = (r1-r0)/(2·dur), in the form that
		// stays exact as a → 0 and for falling rates.
		a := (g.r1 - g.r0) / (2 * g.dur)
		tau = 2 * d / (g.r0 + math.Sqrt(max(0, g.r0*g.r0+4*a*d)))
	}
	return time.Duration(math.Ceil(g.start + tau))
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
	n := int64(s.lambda(float64(elapsed))) + 1
	for n > 0 && s.offset(n-1) > elapsed {
		n--
	}
	for n < s.total && s.offset(n) <= elapsed {
		n++
	}
	return min(n, s.total)
}
