package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
)

// TestSummarizeKnownInputs: 1..1000µs once each, all below 2048 where the
// histogram is exact, give exactly known percentiles.
func TestSummarizeKnownInputs(t *testing.T) {
	st := newStats(1, 60_000_000, nil, clock.Instant{})
	for v := 1; v <= 1000; v++ {
		st.recordLatency(0, time.Duration(v)*time.Microsecond)
	}
	got := summarize(st.total(), st.clamped)
	want := Latency{Count: 1000, Min: 1, Mean: 500.5, P50: 500, P90: 900, P99: 990, P999: 999, P9999: 1000, Max: 1000}
	got.StdDev = 0
	if got != want {
		t.Fatalf("summarize(1..1000) = %+v;\nwant %+v", got, want)
	}
}

// TestValueAtQuantileTakesPercent pins the hdrhistogram pitfall this
// package relies on knowing: ValueAtQuantile(0.99) is the 0.99th
// percentile, not the 99th.
func TestValueAtQuantileTakesPercent(t *testing.T) {
	h := newHist(1_000_000)
	for v := int64(1); v <= 1000; v++ {
		_ = h.RecordValue(v)
	}
	if got := h.ValueAtQuantile(0.99); got != 10 {
		t.Errorf("ValueAtQuantile(0.99) = %d; want 10 (it takes 0..100)", got)
	}
	if got := h.ValueAtQuantile(99); got != 990 {
		t.Errorf("ValueAtQuantile(99) = %d; want 990", got)
	}
}

// TestMergeEqualsSingleHistogram: per-worker histograms merged at the end
// equal one histogram that saw every value.
func TestMergeEqualsSingleHistogram(t *testing.T) {
	const maxUs = 10_000_000
	one := newStats(2, maxUs, nil, clock.Instant{})
	workers := []stats{newStats(2, maxUs, nil, clock.Instant{}), newStats(2, maxUs, nil, clock.Instant{}), newStats(2, maxUs, nil, clock.Instant{})}
	o := &outcome{status: 200, sent: 3, recv: 5}
	for i := range 30_000 {
		lat := time.Duration(1+(i*7919)%2_000_000) * time.Microsecond
		sc := i % 2
		one.record(sc, lat, o, clock.Instant{})
		workers[i%3].record(sc, lat, o, clock.Instant{})
	}
	agg := newStats(2, maxUs, nil, clock.Instant{})
	for i := range workers {
		agg.merge(&workers[i])
	}
	if a, b := summarize(agg.total(), 0), summarize(one.total(), 0); a != b {
		t.Fatalf("merged %+v;\nwant  %+v", a, b)
	}
	for sc := range 2 {
		if !agg.sc[sc].hist.Equals(one.sc[sc].hist) {
			t.Errorf("scenario %d: merged histogram differs from the single one", sc)
		}
		if agg.sc[sc].sent != 15_000 || agg.sc[sc].bytesSent != 45_000 || agg.sc[sc].bytesRecv != 75_000 {
			t.Errorf("scenario %d: sent %d bytes %d/%d; want 15000, 45000/75000", sc, agg.sc[sc].sent, agg.sc[sc].bytesSent, agg.sc[sc].bytesRecv)
		}
	}
	if agg.statuses[200] != 30_000 {
		t.Errorf("statuses = %v; want 200×30000", agg.statuses)
	}
}

func TestRecordClamps(t *testing.T) {
	st := newStats(1, 1000, nil, clock.Instant{})
	st.recordLatency(0, 5*time.Second)
	st.recordLatency(0, -time.Millisecond)
	st.recordLatency(0, 500*time.Microsecond)
	l := summarize(st.total(), st.clamped)
	if l.Count != 3 || l.Clamped != 1 || l.Max != 1000 || l.Min != 0 {
		t.Fatalf("after 5s, -1ms, 500µs into a 1000µs histogram: %+v; want count 3, clamped 1, max 1000, min 0", l)
	}
	// Without the clamp the value would be lost with an error.
	if err := newHist(1000).RecordValue(5_000_000); err == nil {
		t.Fatal("RecordValue above the range succeeded; the clamp may be unnecessary now")
	}
}

func TestRecordErrorsAndReasons(t *testing.T) {
	st := newStats(1, 1_000_000, nil, clock.Instant{})
	rec := func(o outcome) { st.record(0, time.Millisecond, &o, clock.Instant{}) }
	rec(outcome{status: 200})
	rec(outcome{status: 503, reason: []byte("capacity")})
	rec(outcome{status: 503, reason: []byte("capacity")})
	rec(outcome{status: 503, reason: []byte("draining")})
	rec(outcome{status: 404})
	rec(outcome{err: fasthttp.ErrTimeout})
	rec(outcome{}) // a websocket round trip: no status, success
	if st.sc[0].sent != 7 || st.sc[0].errors != 5 {
		t.Errorf("sent %d errors %d; want 7, 5", st.sc[0].sent, st.sc[0].errors)
	}
	if st.classes[classStatus] != 4 || st.classes[classTimeout] != 1 {
		t.Errorf("classes %v; want 4 status, 1 timeout", st.classes)
	}
	if *st.reasons["capacity"] != 2 || *st.reasons["draining"] != 1 || len(st.reasons) != 2 {
		t.Errorf("reasons %v; want capacity×2 draining×1", st.reasons)
	}
	if st.total().TotalCount() != 6 {
		t.Errorf("latencies recorded %d; want 6 (every response, no transport error)", st.total().TotalCount())
	}
	if st.samples[classTimeout] == "" {
		t.Error("no sample text for the timeout")
	}
}

func TestClassify(t *testing.T) {
	f := func(err error, want errClass) {
		t.Helper()
		if got := classify(err); got != want {
			t.Errorf("classify(%v) = %v; want %v", err, got, want)
		}
	}
	f(fasthttp.ErrTimeout, classTimeout)
	f(fmt.Errorf("wrapped: %w", os.ErrDeadlineExceeded), classTimeout)
	f(context.DeadlineExceeded, classTimeout)
	f(fasthttp.ErrNoFreeConns, classPool)
	f(fasthttp.ErrDialTimeout, classConnect)
	f(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, classConnect)
	f(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x"}}, classConnect)
	f(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, classConnection)
	f(fasthttp.ErrConnectionClosed, classConnection)
	f(io.ErrUnexpectedEOF, classConnection)
	f(&websocket.CloseError{Code: websocket.CloseGoingAway}, classConnection)
	f(fmt.Errorf("handshake: %w", &tls.CertificateVerificationError{Err: errors.New("unknown authority")}), classConnect)
	f(errors.New("something odd"), classOther)
	f(websocket.ErrBadHandshake, classOther)
}

// hdrEncodingRoundTrip guards the Report.Histogram field: the encoded
// histogram decodes to the same counts.
func TestHistogramEncodingRoundTrip(t *testing.T) {
	h := newHist(60_000_000)
	for v := int64(1); v < 100_000; v += 37 {
		_ = h.RecordValue(v)
	}
	enc, err := h.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	if err != nil {
		t.Fatal(err)
	}
	back, err := hdrhistogram.Decode(enc)
	if err != nil {
		t.Fatal(err)
	}
	if back.TotalCount() != h.TotalCount() || back.ValueAtPercentile(99) != h.ValueAtPercentile(99) {
		t.Fatalf("decoded count %d p99 %d; want %d, %d", back.TotalCount(), back.ValueAtPercentile(99), h.TotalCount(), h.ValueAtPercentile(99))
	}
}
