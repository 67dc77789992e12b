// Package loadgen is pinned's HTTP and WebSocket load generator as a
// library: cmd/loadgen is its command line, bench/ drives that command, and
// any Go program can run a load test in a few lines (see the example):
//
//	r, err := loadgen.New(loadgen.Config{URL: "http://127.0.0.1:8080", Path: "/counter/{id}/", Rate: 12000, Duration: 30 * time.Second})
//	rep, err := r.Run(ctx) // rep.Latency.P99, rep.WriteText, rep.WriteJSON, rep.WriteHgrm, WritePlotHTML
//
// A Runner runs one bounded load test against one target and returns a
// Report: HdrHistogram percentiles, a per-second series, errors by class,
// and the generator's own accuracy (schedule lag, CPU per request).
//
// # Engines
//
// EngineLoop (the default wherever it can run: Linux, plain http, no
// websocket) is built like wrk and wrk2: Config.Loops event loops, each a
// goroutine that owns a share of the connections, of the schedule and of
// the statistics, over non-blocking sockets and epoll. No request costs a goroutine, a channel operation or an
// allocation (alloc_linux_test.go), and no two loops share anything on the
// hot path but the per-loop progress counters. Requests are rendered from
// templates into each connection's buffer; responses are framed by an
// incremental HTTP/1.1 parser (status line, Content-Length, chunked,
// Connection: close, 1xx skipped) that never buffers a body. Framing is
// strict: a malformed or truncated response, data after a response, or a
// connection closed before the end of the response is an error, never a
// success.
//
// EngineFastHTTP runs worker goroutines on fasthttp's HostClient and its
// websocket dialer: https (Config.TLS), websocket scenarios, a custom Dial
// and an injected Clock (the synctest tests). Both engines feed the same
// statistics and the same Report; Report.Generator.Engine says which ran.
//
// # Loops
//
// Open loop (Config.Rate or Config.Stages), coordinated-omission free like
// wrk2: slot i is intended to be sent at t0 + offset(i), where the rate
// schedule may hold, ramp linearly and step (schedule.go). Latency is done −
// intended, so a stalled target inflates the latency of every slot that
// fell due during the stall, not only of the requests in flight. In the
// loop engine, loop k of n owns the slots k, k+n, k+2n, …: it sleeps until
// its next slot is due (epoll_pwait2's nanosecond timeout, clock_nanosleep
// for short sleeps, a timer slack of 1ns on its thread), sends every due
// slot on an idle connection, dials when none is idle (up to its share of
// Connections), and keeps due slots waiting, in order, when all are busy.
// Guarantees:
//
//   - no slot is skipped: the number of measured slots is fixed by the
//     schedule (capped at Requests) whatever the target does; a slot that
//     cannot be sent by DrainTimeout after the schedule ends is reported as
//     unsent and counts as failed in ErrorRate, never silently dropped;
//   - schedule lag (actual send − intended) and service time (done − actual
//     send) are reported separately from latency, with percentiles, so that
//     generator slop and queueing can be told from the target's own time.
//
// Completion times in the loop engine are the kernel's receive timestamps
// of the response's last bytes (SO_TIMESTAMPNS), not the time the loop got
// round to reading them. That lets a loop whose next slot is at most 2ms
// away sleep on its timer alone and collect ready responses when it wakes:
// one wake-up per slot instead of two, without making responses look
// slower (a wake-up is the largest cost of an open-loop request). A loop
// stops doing so once a response outgrows its read buffer (a large body
// would wait for it in the socket buffer).
//
// Closed loop (no rate): every connection sends its next request when the
// previous one completes, and latency is done − actual send. This measures
// throughput; its latencies suffer coordinated omission by construction (a
// stall delays the requests that would have measured it).
//
// Config.Coalesce trades precision for CPU: a loop may send a slot up to
// Coalesce late so that one wake-up sends the slots due meanwhile; the lag
// it adds is measured and reported like any other.
//
// A loop lives in blocking system calls, and the Go runtime is built for
// goroutines that block elsewhere. Two rules keep it from charging the
// loops for that. Config.Loops defaults to GOMAXPROCS−1 (at least 1):
// while a loop waits, the runtime leaves it its P only when another P is
// idle; without one, its monitor takes the P back and hands it around on
// every wait, which costs more than the request. The spare P also runs the
// rest of the process (the caller's goroutines, an in-process target, the
// garbage collector). cmd/loadgen raises GOMAXPROCS to one more than the
// CPUs, so it runs one loop per CPU. And every loop yields to the scheduler
// every 2ms: the runtime takes the P of a goroutine that has not been
// rescheduled for 10ms at each of its system calls, until it is. A loop is
// therefore not locked to its thread (a locked goroutine cannot be
// rescheduled without handing its thread off and back); it sets its
// thread's timer slack to 1ns again after each yield.
//
// # Bounds
//
// Every run is bounded by Duration and by Requests, whichever comes first
// (New refuses a config with both unbounded), plus the per-request Timeout
// and DrainTimeout; Report.StoppedBy says which bound ended it, and the
// text report names the other one too. Warmup requests run before the
// measured phase and are excluded from every statistic.
//
// Run does not check that the target exists: against a host that does not
// resolve or a port nobody listens on, every request fails at once with a
// connect error. Probe, called first, resolves the host and opens one
// connection (ErrUnresolvable, ErrUnreachable), as cmd/loadgen does.
//
// # Statistics
//
// Each recorder (event loop, or worker) owns its HdrHistograms (µs,
// 1µs..MaxLatency): one of every latency at 3 significant digits (the
// headline numbers), and at 2 digits one per scenario of a mix, one of
// open-loop service times, one of schedule lags, and this second's share
// of the series; plus its counters. Histograms are read only after every
// recorder has exited, when Run merges them, except the per-second shares,
// which a recorder flushes into the shared series (one lock per recorder
// and second, never per request) when a request completes in a later
// second, before it waits, and at the end. A second of the series settles
// once no recorder can still hold data for it (Timeout plus a margin), so
// its memory is a few seconds of histograms whatever the run's length.
// Values above MaxLatency are clamped to it and counted (RecordValue would
// otherwise drop them with an error). hdrhistogram's ValueAtQuantile takes
// a percentile in 0..100, not a quantile; this package only calls
// ValueAtPercentile(s).
//
// Report.Generator states the instrument's own cost: process CPU time
// (utime+stime of all threads, getrusage) per request completed during
// Run, warmup included.
//
// Report.AchievedRate counts successful responses (2xx, or a websocket
// echo) per second of the measured phase, never failed requests: a target
// that refuses connections achieves 0 however fast they fail.
//
// Errors are classified once per request: a non-2xx status (with its
// X-Pinned-Reason, if any) or a transport class (timeout, connect,
// connection, pool, other; "other" includes malformed responses). Requests
// are never retried: a retry would hide an error and its latency.
// Transport errors carry no latency; every response, whatever its status,
// does.
//
// # Ids
//
// "{id}" in a method, path or body template is replaced per request by an
// id drawn from a uniform or Zipf distribution over Keys fixed ids
// ("<prefix><k>"), or by a new id for every request ("<prefix><runID>-<n>",
// an activation storm). The Zipf sampler is rejection inversion
// (Hörmann–Derflinger) for any exponent s > 0; math/rand/v2's Zipf only
// allows s > 1. Each recorder has its own PCG generator seeded from (Seed,
// recorder index).
//
// # Ownership
//
// New does no I/O and starts no goroutines. Run may be called once; it
// starts the engine's goroutines (the loops and a stopper that wakes them
// on cancellation, or the scheduler's workers) and the progress goroutine,
// and returns only after all of them have exited. Each loop owns its
// sockets, closed before Run returns; the threads whose timer slack the
// loops set go back to the runtime as they are. In the
// fasthttp engine each worker owns its Request/Response and websocket; the
// HostClient is shared (it is safe for concurrent use), its idle
// connections are closed when Run returns, but fasthttp's
// connection-cleaner goroutine may outlive Run by up to IdleConnTimeout.
//
// loadgen imports nothing of pinned but internal/base/wire (the id grammar and
// the X-Pinned-Reason header name) and clock.
package loadgen
