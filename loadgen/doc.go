// Package loadgen is the engine of cmd/loadgen, pinned's HTTP and WebSocket
// load generator built on fasthttp. A Runner runs one bounded load test
// against one target and returns a Report (human table, JSON, percentile
// plot). Benchmarks in bench/ drive it through the command.
//
// # Loops
//
// Open loop (Config.Rate > 0), coordinated-omission free like wrk2: slot i
// is intended to be sent at t0 + i/rate. A scheduler goroutine sleeps on the
// injected clock until the next slot is due and then releases every due slot
// into a FIFO queue; at high rates timer slop makes it release several slots
// per wake-up. Workers take slots from the queue; when slots wait and no
// worker is idle the pool grows, up to MaxWorkers; beyond that slots queue.
// Latency is done − intended, so a stalled target inflates the latency of
// every slot that fell due during the stall, not only of the requests in
// flight. Guarantees:
//
//   - no slot is skipped: the number of measured slots is ⌈Rate·Duration⌉
//     (capped at Requests) whatever the target does; a slot that cannot be
//     sent by DrainTimeout after the schedule ends is reported as unsent and
//     counts as failed in ErrorRate, never silently dropped;
//   - schedule lag (actual send − intended) and service time (done − actual
//     send) are reported separately from latency, so generator slop and
//     queueing can be told from the target's own time.
//
// Timer resolution: Go's timers wake up to about 1ms late on Linux when the
// process is otherwise idle (netpoll waits in whole milliseconds), so the
// scheduler releases slots in batches and every open-loop latency includes
// the schedule lag of its slot. The lag is generator slop that applies
// equally to every target at a given rate; the report's mean lag bounds it
// and the service time excludes it. Spinning instead would cost a core.
//
// Closed loop (Rate = 0): Connections workers each send their next request
// when the previous completes, and latency is done − actual send. This
// measures throughput; its latencies suffer coordinated omission by
// construction (a stall delays the requests that would have measured it).
//
// # Bounds
//
// Every run is bounded by Duration and by Requests, whichever comes first
// (New refuses a config with both unbounded), plus the per-request Timeout,
// ConnWaitTimeout and DrainTimeout. Warmup requests run before the measured
// phase and are excluded from every statistic.
//
// # Statistics
//
// Each worker owns its HdrHistograms (µs, 1µs..MaxLatency): one of every
// latency at 3 significant digits (the headline numbers), and at 2 digits
// one per scenario of a mix and one of open-loop service times; plus its
// counters. Nothing is shared on the hot path except three atomic counters
// feeding the progress line.
// Histograms are not goroutine-safe and are only read after every worker
// has exited, when Run merges them. Values above MaxLatency are clamped to it
// and counted (RecordValue would otherwise drop them with an error).
// hdrhistogram's ValueAtQuantile takes a percentile in 0..100, not a
// quantile; this package only calls ValueAtPercentiles.
//
// Errors are classified once per request: a non-2xx status (with its
// X-Pinned-Reason, if any) or a transport class (timeout, connect,
// connection, pool, other). Requests are never retried (HostClient
// MaxIdemponentCallAttempts = 1): a retry would hide an error and its
// latency. Transport errors carry no latency; every response, whatever its
// status, does.
//
// # Ids
//
// "{id}" in a path template is replaced per request by an id drawn from a
// uniform or Zipf distribution over Keys fixed ids ("<prefix><k>"), or by a
// new id for every request ("<prefix><runID>-<n>", an activation storm).
// The Zipf sampler is rejection inversion (Hörmann–Derflinger) for any
// exponent s > 0; math/rand/v2's Zipf only allows s > 1. Each worker has
// its own PCG generator seeded from (Seed, worker index).
//
// # Ownership
//
// New does no I/O and starts no goroutines. Run may be called once; it
// starts the scheduler's helpers, the workers and the progress goroutine,
// and returns only after all of them have exited. Each worker owns its
// fasthttp Request/Response (reused, not pooled), its websocket connection
// and its stats. The HostClient is shared by the workers (it is safe for
// concurrent use); its idle connections are closed when Run returns, but
// fasthttp's connection-cleaner goroutine may outlive Run by up to
// IdleConnTimeout.
package loadgen
