//go:build pinned_spans

package host

import (
	"strconv"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"
)

// With the pinned_spans build tag, a request that carries a Trace-Seq field
// (a traced load test, bench -trace-slow) is answered with Trace-Worker:
// "<in>,<out>", when the host began and finished serving it, in absolute
// CLOCK_MONOTONIC ns; the proxy's spans (proxy/spans.go) record them, so a
// slow request's time in the worker is told apart from the way there and
// back. Without the tag both calls are empty (spans_off.go).

// traceWorkerField is the response field with the host's two stamps.
const traceWorkerField = "Trace-Worker"

func spanNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func spanEnd(rc *fasthttp.RequestCtx, in int64) {
	if len(rc.Request.Header.Peek("Trace-Seq")) == 0 {
		return
	}
	v := strconv.AppendInt(nil, in, 10)
	v = append(v, ',')
	v = strconv.AppendInt(v, spanNow(), 10)
	rc.Response.Header.SetBytesV(traceWorkerField, v)
}
