//go:build pinned_spans

package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/internal/base/netloop"
)

// spanStamps are one request's stamps (spans.go), on its client connection.
type spanStamps struct {
	seq int64 // the Trace-Seq value; -1 when absent
	t   [nHops]int64
}

// monoOffset turns netloop's clock into absolute CLOCK_MONOTONIC ns.
var monoOffset = func() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano() - netloop.Nanotime()
}()

// begin starts a request's stamps from its head and the loop's wake time.
func (s *spanStamps) begin(head []byte, wake int64) {
	*s = spanStamps{seq: -1}
	s.t[hopWake] = wake + monoOffset
	s.t[hopRead] = netloop.Nanotime() + monoOffset
	if i := bytes.Index(head, []byte("\r\n"+traceSeqField+": ")); i >= 0 {
		v := head[i+len(traceSeqField)+4:]
		if j := bytes.IndexByte(v, '\r'); j >= 0 {
			if n, err := strconv.ParseInt(string(v[:j]), 10, 64); err == nil {
				s.seq = n
			}
		}
	}
}

// stamp records hop now; a hop stamped twice (a resent request) keeps the
// last time.
func (s *spanStamps) stamp(hop int) { s.t[hop] = netloop.Nanotime() + monoOffset }

// worker records the worker's stamps from its answer's Trace-Worker field
// ("<in>,<out>", absolute CLOCK_MONOTONIC ns), when it has one.
func (s *spanStamps) worker(rh *fasthttp.ResponseHeader) {
	in, out, ok := bytes.Cut(rh.Peek(traceWorkerField), []byte(","))
	if !ok {
		return
	}
	a, err1 := strconv.ParseInt(string(in), 10, 64)
	b, err2 := strconv.ParseInt(string(out), 10, 64)
	if err1 == nil && err2 == nil {
		s.t[hopWorkerIn], s.t[hopWorkerOut] = a, b
	}
}

// stampAt records hop at the loop time at (netloop's clock).
func (s *spanStamps) stampAt(hop int, at int64) { s.t[hop] = at + monoOffset }

// spanLog is a loop's records, written out when the loop closes.
type spanLog struct {
	recs []spanStamps
}

// maxSpans bounds a loop's records (about 64 MiB).
const maxSpans = 1 << 20

// record keeps s when it carries a number.
func (l *spanLog) record(s *spanStamps) {
	if s.seq >= 0 && len(l.recs) < maxSpans {
		l.recs = append(l.recs, *s)
	}
	s.seq = -1
}

// flush writes the records to PINNED_SPANS_OUT/spans-<pid>-<loop>.csv.
func (l *spanLog) flush(loop int) {
	dir := os.Getenv("PINNED_SPANS_OUT")
	if dir == "" || len(l.recs) == 0 {
		return
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("spans-%d-%d.csv", os.Getpid(), loop)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "pinned spans:", err)
		return
	}
	w := bufio.NewWriter(f)
	fmt.Fprint(w, "seq")
	for _, h := range spanHopNames {
		fmt.Fprint(w, ",", h)
	}
	fmt.Fprintln(w)
	for _, r := range l.recs {
		fmt.Fprint(w, r.seq)
		for _, t := range r.t {
			fmt.Fprint(w, ",", t)
		}
		fmt.Fprintln(w)
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "pinned spans:", err)
	}
	_ = f.Close()
	l.recs = nil
}
