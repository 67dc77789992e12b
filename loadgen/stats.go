package loadgen

import (
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/pinned-go/pinned/clock"
)

// Histogram precision. The headline latency histogram keeps 3 significant
// digits (0.1 % relative error, ≈140 KB per worker at the default 60s
// range); the per-scenario breakdown of a mix and the open loop's service
// time keep 2 (1 %, ≈20 KB each), so memory stays near 140 KB per worker
// whatever the mix.
const (
	histSigFigs       = 3
	detailHistSigFigs = 2
)

// newHist returns a latency histogram in microseconds tracking 1µs..maxUs
// at full precision.
func newHist(maxUs int64) *hdrhistogram.Histogram {
	return hdrhistogram.New(1, maxUs, histSigFigs)
}

// newDetailHist is newHist at the coarser detail precision.
func newDetailHist(maxUs int64) *hdrhistogram.Histogram {
	return hdrhistogram.New(1, maxUs, detailHistSigFigs)
}

// newLagHist returns a schedule-lag histogram in microseconds: exact below
// 256µs, 1 % above.
func newLagHist(maxUs int64) *hdrhistogram.Histogram {
	return hdrhistogram.New(1, maxUs, detailHistSigFigs)
}

// outcome is what one request produced.
type outcome struct {
	status int      // HTTP status; 0 for a websocket round trip or when err != nil
	reason []byte   // X-Pinned-Reason of a non-2xx response; valid until the next request
	err    error    // transport error
	class  errClass // class of err when the engine knows it (the event loops); 0: classify(err)
	sent   int64    // body or message bytes written
	recv   int64    // body or message bytes read
	other  int64    // websocket messages skipped while waiting for the echo
}

// scenarioStats is one worker's tally for one scenario.
type scenarioStats struct {
	hist      *hdrhistogram.Histogram // mixes only: this scenario's latencies, detail precision; nil until the first
	sent      int64                   // measured requests sent
	errors    int64                   // of which failed (non-2xx or transport error)
	bytesSent int64
	bytesRecv int64
}

// stats is one recorder's tally of the measured phase: an event loop's, or
// a worker goroutine's in the fasthttp engine. It is owned by its recorder
// until the recorder exits, then read by Run: no locking, except the
// per-second flushes into the shared series (one lock per recorder and
// second, never per request).
type stats struct {
	maxUs    int64
	all      *hdrhistogram.Histogram // every response's latency, full precision; nil until the first
	sc       []scenarioStats         // one per scenario; hist only when there are several
	svc      *hdrhistogram.Histogram // open loop: service time, actual send to done, detail precision; nil until the first
	lag      *hdrhistogram.Histogram // open loop: schedule lag, detail precision; nil until the first
	iv       interval                // this second's share of the series
	clamped  int64
	statuses map[int]int64
	reasons  map[string]*int64
	classes  [numClasses]int64
	samples  [numClasses]string // first error text per transport class
	wsOther  int64
	unsent   int64
	lastDone clock.Instant // completion of the latest measured request
}

// newStats returns a tally for scenarios scenarios; ser, when set, receives
// its per-second flushes, seconds counted from measureStart.
func newStats(scenarios int, maxUs int64, ser *series, measureStart clock.Instant) stats {
	st := stats{
		maxUs:    maxUs,
		sc:       make([]scenarioStats, scenarios),
		statuses: make(map[int]int64, 4),
		reasons:  make(map[string]*int64),
		iv:       interval{sec: -1, last: -1},
	}
	if ser != nil {
		st.iv = ser.interval(measureStart)
	}
	return st
}

// recordLatency adds one latency, clamped to [0, maxUs].
func (s *stats) recordLatency(sc int, lat time.Duration) {
	if s.all == nil {
		s.all = newHist(s.maxUs)
	}
	s.clamped += recordClamped(s.all, lat, s.maxUs)
	if len(s.sc) > 1 {
		st := &s.sc[sc]
		if st.hist == nil {
			st.hist = newDetailHist(s.maxUs)
		}
		recordClamped(st.hist, lat, s.maxUs)
	}
}

// recordService adds one open-loop service time (from the actual send).
func (s *stats) recordService(d time.Duration) {
	if s.svc == nil {
		s.svc = newDetailHist(s.maxUs)
	}
	recordClamped(s.svc, d, s.maxUs)
}

// recordClamped records d in µs, clamped to [0, maxUs] (RecordValue fails,
// and the value would be lost, above the histogram's range). It returns 1
// if d was clamped from above.
func recordClamped(h *hdrhistogram.Histogram, d time.Duration, maxUs int64) (clamped int64) {
	v := d.Microseconds()
	if v < 0 {
		v = 0
	}
	if v > maxUs {
		v, clamped = maxUs, 1
	}
	_ = h.RecordValue(v) // cannot fail: v is within [0, maxUs]
	return clamped
}

// record tallies one measured request. lat is from the intended (open
// loop) or actual (closed loop) send time to completion.
func (s *stats) record(sc int, lat time.Duration, o *outcome, done clock.Instant) {
	st := &s.sc[sc]
	st.sent++
	st.bytesSent += o.sent
	st.bytesRecv += o.recv
	s.wsOther += o.other
	s.lastDone = done
	iv := s.iv.at(done, s.maxUs)
	if o.err != nil {
		st.errors++
		iv.errors++
		c := o.class
		if c == classNone {
			c = classify(o.err)
		}
		s.classes[c]++
		if s.samples[c] == "" {
			s.samples[c] = o.err.Error()
		}
		return
	}
	s.recordLatency(sc, lat)
	recordClamped(iv.hist, lat, s.maxUs)
	if o.status == 0 {
		return // a websocket round trip: no HTTP status
	}
	s.statuses[o.status]++
	if o.status < 200 || o.status > 299 {
		st.errors++
		iv.errors++
		s.classes[classStatus]++
		if len(o.reason) > 0 {
			if p := s.reasons[string(o.reason)]; p != nil {
				*p++
			} else {
				n := int64(1)
				s.reasons[string(o.reason)] = &n
			}
		}
	}
}

// recordLag tallies how late an open-loop request was sent.
func (s *stats) recordLag(lag time.Duration) {
	if s.lag == nil {
		s.lag = newLagHist(s.maxUs)
	}
	recordClamped(s.lag, lag, s.maxUs)
}

// merge adds o into s. Histograms are merged with Merge; both sides have
// the same range, so nothing is dropped.
func (s *stats) merge(o *stats) {
	for i := range o.sc {
		d, src := &s.sc[i], &o.sc[i]
		d.sent += src.sent
		d.errors += src.errors
		d.bytesSent += src.bytesSent
		d.bytesRecv += src.bytesRecv
		d.hist = mergeHist(d.hist, src.hist, newDetailHist, s.maxUs)
	}
	s.all = mergeHist(s.all, o.all, newHist, s.maxUs)
	s.svc = mergeHist(s.svc, o.svc, newDetailHist, s.maxUs)
	s.lag = mergeHist(s.lag, o.lag, newLagHist, s.maxUs)
	s.clamped += o.clamped
	for k, v := range o.statuses {
		s.statuses[k] += v
	}
	for k, p := range o.reasons {
		if q := s.reasons[k]; q != nil {
			*q += *p
		} else {
			n := *p
			s.reasons[k] = &n
		}
	}
	for c := range o.classes {
		s.classes[c] += o.classes[c]
		if s.samples[c] == "" {
			s.samples[c] = o.samples[c]
		}
	}
	s.wsOther += o.wsOther
	s.unsent += o.unsent
	s.lastDone = later(s.lastDone, o.lastDone)
}

// later returns the later of two instants, ignoring zero ones.
func later(a, b clock.Instant) clock.Instant {
	if a.IsZero() || (!b.IsZero() && b.Sub(a) > 0) {
		return b
	}
	return a
}

// mergeHist merges src into dst, making dst with mk if it is nil. Both
// have the same range, so Merge drops nothing.
func mergeHist(dst, src *hdrhistogram.Histogram, mk func(int64) *hdrhistogram.Histogram, maxUs int64) *hdrhistogram.Histogram {
	if src == nil {
		return dst
	}
	if dst == nil {
		dst = mk(maxUs)
	}
	dst.Merge(src)
	return dst
}

// total returns the histogram of every response's latency (empty if none).
func (s *stats) total() *hdrhistogram.Histogram {
	if s.all == nil {
		return newHist(s.maxUs)
	}
	return s.all
}

// scenarioHist returns scenario sc's latency histogram: its own in a mix,
// the total otherwise.
func (s *stats) scenarioHist(sc int) *hdrhistogram.Histogram {
	if len(s.sc) > 1 {
		return s.sc[sc].hist
	}
	return s.total()
}
