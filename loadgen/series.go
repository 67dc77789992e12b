package loadgen

import (
	"sort"
	"sync"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/pinned-go/pinned/clock"
)

// The per-second series: every recorder (event loop or worker) tallies the
// requests completing in the current second of the measured phase in an
// interval and flushes it into the shared series when a request completes
// in a later second, when it goes idle, and at the end. The series merges
// the flushes of each second and, once no recorder can still hold data for
// it, reduces the second to its SeriesPoint and recycles the histogram, so
// memory stays bounded by a few seconds of histograms whatever the run's
// length.

// interval is one recorder's tally of one second of the series.
type interval struct {
	ser    *series
	start  clock.Instant // start of the measured phase: second 0
	sec    int64         // the second being tallied; -1 before the first request
	last   int64         // the last second of the window (completions after it count in it); -1: no window
	hist   *hdrhistogram.Histogram
	count  int64 // completed requests (responses and transport errors)
	errors int64 // of which failed
}

// at returns the tally of the second containing done, flushing the tally
// of an earlier second first.
func (iv *interval) at(done clock.Instant, maxUs int64) *interval {
	sec := max(0, int64(done.Sub(iv.start)/time.Second))
	if iv.last >= 0 {
		sec = min(sec, iv.last)
	}
	if sec != iv.sec {
		iv.flush()
		iv.sec = sec
	}
	if iv.hist == nil {
		iv.hist = newDetailHist(maxUs)
	}
	iv.count++
	return iv
}

// flushBefore flushes the tally if now is past its second: a recorder about
// to wait calls it so that its data does not wait with it.
func (iv *interval) flushBefore(now clock.Instant) {
	if iv.count > 0 && iv.sec != iv.last && now.Sub(iv.start) >= time.Duration(iv.sec+1)*time.Second {
		iv.flush()
	}
}

// flush hands the tally to the series and empties it.
func (iv *interval) flush() {
	if iv.count == 0 {
		return
	}
	if iv.ser != nil {
		iv.ser.add(iv.sec, iv.hist, iv.count, iv.errors)
	}
	iv.hist.Reset()
	iv.count, iv.errors = 0, 0
}

// series merges the recorders' flushes into one SeriesPoint per second.
type series struct {
	mu      sync.Mutex
	maxUs   int64
	window  time.Duration // the measured phase's bounded duration; 0: unbounded
	settle  int64         // a second is final once a flush for second+settle arrives
	open    map[int64]*openSecond
	points  map[int64]*SeriesPoint
	recycle []*hdrhistogram.Histogram
}

type openSecond struct {
	hist          *hdrhistogram.Histogram
	count, errors int64
}

// newSeries returns a series whose seconds settle once every recorder has
// moved on: a recorder flushes a second at the latest when its next
// request completes or fails, within timeout. window, when positive, is the
// measured phase's duration: completions after it (the last requests in
// flight) count in its last second, so every point spans a whole second
// (the last one: what remains of the window).
func newSeries(maxUs int64, timeout, window time.Duration) *series {
	return &series{
		maxUs:  maxUs,
		window: max(window, 0),
		settle: int64(timeout/time.Second) + 3,
		open:   map[int64]*openSecond{},
		points: map[int64]*SeriesPoint{},
	}
}

// add merges one recorder's tally of second sec. It is safe for concurrent
// use.
func (s *series) add(sec int64, h *hdrhistogram.Histogram, count, errors int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.points[sec]; p != nil {
		// A straggler for a settled second: it still counts, its latencies
		// can no longer move the second's percentiles.
		p.Requests += count
		p.Errors += errors
		return
	}
	o := s.open[sec]
	if o == nil {
		o = &openSecond{}
		if n := len(s.recycle); n > 0 {
			o.hist, s.recycle = s.recycle[n-1], s.recycle[:n-1]
		} else {
			o.hist = newDetailHist(s.maxUs)
		}
		s.open[sec] = o
	}
	o.hist.Merge(h)
	o.count += count
	o.errors += errors
	for k, o := range s.open {
		if k+s.settle <= sec {
			s.settleLocked(k, o)
		}
	}
}

func (s *series) settleLocked(sec int64, o *openSecond) {
	p := &SeriesPoint{Second: sec, Requests: o.count, Errors: o.errors}
	if o.hist.TotalCount() > 0 {
		v := o.hist.ValueAtPercentiles([]float64{50, 99, 99.9})
		p.P50, p.P99, p.P999, p.Max = v[50], v[99], v[99.9], o.hist.Max()
	}
	s.points[sec] = p
	delete(s.open, sec)
	o.hist.Reset()
	s.recycle = append(s.recycle, o.hist)
}

// lastSecond returns the last second of the window, -1 without one.
func (s *series) lastSecond() int64 {
	if s.window <= 0 {
		return -1
	}
	return int64((s.window - 1) / time.Second)
}

// interval returns a recorder's empty tally, seconds counted from start.
func (s *series) interval(start clock.Instant) interval {
	return interval{ser: s, start: start, sec: -1, last: s.lastSecond()}
}

// finish settles every second and returns the points from second 0 to the
// last one with data, seconds without completions included as zeros. Rates
// are per second; the last second, when end (the end of the measured
// phase) cuts it, over what it spans (at least 100ms).
func (s *series) finish(end time.Duration) []SeriesPoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, o := range s.open {
		s.settleLocked(k, o)
	}
	if len(s.points) == 0 {
		return nil
	}
	keys := make([]int64, 0, len(s.points))
	for k := range s.points {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	last := keys[len(keys)-1]
	out := make([]SeriesPoint, last+1)
	for i := range out {
		if p := s.points[int64(i)]; p != nil {
			out[i] = *p
		}
		out[i].Second = int64(i)
		span := 1.0
		if i == len(out)-1 {
			span = max(0.1, min(1, end.Seconds()-float64(i)))
		}
		out[i].Rate = float64(out[i].Requests) / span
	}
	return out
}
