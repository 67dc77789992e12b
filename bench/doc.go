// Package bench runs pinned's benchmark suites against real processes on
// 127.0.0.1 and writes markdown reports (bench/results/): proxy (direct vs
// pinboard vs nginx vs HAProxy), activation, streaming, websocket, Redis
// commands per request, memory per idle instance, durable alarms (lateness
// healthy and after an outage of every worker, Redis commands per alarm),
// failover (a worker holding N ids killed under load: each id's recovery,
// the answers meanwhile and the Redis commands, with fast failover and
// lease-only), loadgen itself against wrk (and wrk2 when present), the
// profile capture behind profiles/, and scale (how each cost grows with
// ids, instances, workers, pinboards, a storm, a cluster and a drain:
// docs/scale.md; run only when named, never by "all").
// cmd/bench is its command line; bench/README.md says how
// to run and read it.
//
// Invariants: every process a suite starts (redis-server, pinboard, counter
// workers, simulated workers, nginx, HAProxy, loadgen, wrk, perf) is owned
// by that suite and killed before it returns; every load run is bounded by
// loadgen's duration and request count (the failover suite's own client by
// its slots and its bound after the kill, the scale suite's storm client by
// its ids and a deadline); targets alternate in rounds (A B C … A B C …) and
// reported figures are medians over rounds, ratios medians of per-round
// ratios (the scale suite's points are states reached by growing, each on a
// rig of its own, measured one after another; its probes are medians over
// rounds); a
// full run refuses a loaded machine (Options.MaxBusy) unless forced, and the
// report states the load seen, the pinning and the versions. PINBOARD_*
// variables in the bench's environment reach every pinboard it starts
// (never over the ones the rig sets) and are written into the report's
// command line. Nothing here is imported by the library packages.
package bench
