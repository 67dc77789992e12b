// Package logthrottle rate-limits a repeated log line on a hot path: an
// error that every request may hit (a Redis outage, a dead worker) is
// logged once per interval, not once per request.
//
// Invariants: of any number of concurrent Allow calls within one interval
// at most one returns true; the first call ever returns true; Allow takes no
// lock and does not allocate. The zero interval lets every call through.
package logthrottle

import (
	"sync/atomic"
	"time"
)

// Every lets one caller through per Interval. Its zero value (Interval 0)
// lets every call through. An Every must not be copied after first use.
type Every struct {
	// Interval is the least time between two calls that return true.
	Interval time.Duration
	next     atomic.Int64 // unix nanoseconds before which nothing passes
}

// Allow reports whether the caller may log now; at most one caller per
// Interval gets true.
func (t *Every) Allow() bool {
	if t.Interval <= 0 {
		return true
	}
	now := time.Now().UnixNano()
	n := t.next.Load()
	return now >= n && t.next.CompareAndSwap(n, now+int64(t.Interval))
}
