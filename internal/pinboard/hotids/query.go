package hotids

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// window returns the first slot epoch of the window ending at now, now's
// epoch, and how much time the window covers (less at first, when the
// first request recorded is younger than the window).
func (s *Sketch) window(now time.Time) (first, last int64, covered time.Duration) {
	ns := now.UnixNano()
	last = ns / s.slotNs
	first = last - int64(s.cfg.Slots) + 1
	start := max(first*s.slotNs, s.firstAt.Load())
	return first, last, time.Duration(max(ns-start, int64(time.Millisecond)))
}

func (sl *slot) in(first, last int64) bool { return sl.epoch >= first && sl.epoch <= last }

// agg is one name's totals over the window.
type agg struct {
	requests, bytes uint64
	hist            [histBuckets]uint64
	holder          string
	holderEpoch     int64
}

// Top returns the n ids of namespace ns ("/name") with the most requests in
// the window ending at now, hottest first (ties by id), as GET
// /registry/hot answers them. n is capped at the sketch's counters per
// window slot.
func (s *Sketch) Top(ns string, n int, now time.Time) wire.HotResponse {
	out := wire.HotResponse{Namespace: ns, WindowSeconds: int(s.cfg.Window / time.Second), IDs: []wire.HotID{}}
	ref, ok := (*s.ns.Load())[ns]
	if !ok || n <= 0 {
		return out
	}
	first, last, covered := s.window(now)
	byName := map[string]*agg{}
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		var bound uint64
		for j := range st.slots {
			sl := &st.slots[j]
			t := sl.tables[ref.i]
			if !sl.in(first, last) || t == nil || t.gen != ref.gen {
				continue
			}
			bound += t.minCount()
			for k := range t.n {
				e := &t.entries[k]
				a := byName[string(e.name)]
				if a == nil {
					a = &agg{holderEpoch: -1}
					byName[string(e.name)] = a
				}
				a.requests += t.counts[k]
				a.bytes += e.bytes
				for b, c := range e.hist {
					a.hist[b] += uint64(c)
				}
				if sl.epoch > a.holderEpoch {
					a.holder, a.holderEpoch = e.holder, sl.epoch
				}
			}
		}
		st.mu.Unlock()
		out.ErrorBound = max(out.ErrorBound, bound)
	}
	rows := make([]wire.HotID, 0, len(byName))
	for name, a := range byName {
		rows = append(rows, wire.HotID{
			ID:        strings.TrimPrefix(name, ns+"/"),
			Requests:  a.requests,
			PerSecond: float64(a.requests) / covered.Seconds(),
			P99Ms:     float64(quantile(&a.hist, 0.99)) / float64(time.Millisecond),
			Bytes:     a.bytes,
			Holder:    a.holder,
		})
	}
	slices.SortFunc(rows, func(a, b wire.HotID) int {
		return cmp.Or(cmp.Compare(b.Requests, a.Requests), strings.Compare(a.ID, b.ID))
	})
	out.IDs = rows[:min(n, len(rows))]
	return out
}

// ErrorBound is the most by which any count Top reports for the window
// ending at now may exceed the true count, over every namespace (and the
// most requests an id missing from Top may have had).
func (s *Sketch) ErrorBound(now time.Time) uint64 {
	first, last, _ := s.window(now)
	var worst uint64
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		for ti := range s.cfg.MaxNamespaces {
			var bound uint64
			for j := range st.slots {
				sl := &st.slots[j]
				if t := sl.tables[ti]; t != nil && sl.in(first, last) {
					bound += t.minCount()
				}
			}
			worst = max(worst, bound)
		}
		st.mu.Unlock()
	}
	return worst
}

// Traffic returns the requests per worker session (busiest first) and the
// non-2xx answers by status and reason (most first) in the window ending
// at now, as GET /registry/traffic answers them.
func (s *Sketch) Traffic(now time.Time) wire.TrafficResponse {
	out := wire.TrafficResponse{WindowSeconds: int(s.cfg.Window / time.Second), Holders: []wire.HolderTraffic{}, NotOK: []wire.AnswerCount{}}
	first, last, covered := s.window(now)
	holders := map[string]uint64{}
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		for j := range st.slots {
			sl := &st.slots[j]
			if !sl.in(first, last) {
				continue
			}
			out.Requests += sl.requests
			for _, h := range sl.holders {
				holders[h.holder] += h.count
			}
			if sl.other > 0 {
				holders[OtherHolder] += sl.other
			}
		}
		st.mu.Unlock()
	}
	for h, c := range holders {
		out.Holders = append(out.Holders, wire.HolderTraffic{SessionID: h, Requests: c, PerSecond: float64(c) / covered.Seconds()})
	}
	slices.SortFunc(out.Holders, func(a, b wire.HolderTraffic) int {
		return cmp.Or(cmp.Compare(b.Requests, a.Requests), strings.Compare(a.SessionID, b.SessionID))
	})

	type key struct {
		status int
		reason string
	}
	answers := map[key]uint64{}
	s.answers.mu.Lock()
	for j := range s.answers.slots {
		sl := &s.answers.slots[j]
		if sl.epoch < first || sl.epoch > last {
			continue
		}
		for _, r := range sl.rows {
			answers[key{r.status, r.reason}] += r.count
		}
		if sl.other > 0 {
			answers[key{0, OtherReason}] += sl.other
		}
	}
	s.answers.mu.Unlock()
	for k, c := range answers {
		out.NotOK = append(out.NotOK, wire.AnswerCount{Status: k.status, Reason: k.reason, Count: c})
	}
	slices.SortFunc(out.NotOK, func(a, b wire.AnswerCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Status, b.Status), strings.Compare(a.Reason, b.Reason))
	})
	return out
}
