// Package sim is a deterministic simulation of the placement protocol, in
// the tradition of FoundationDB's simulation tests and TigerBeetle's VOPR:
// pinboards, workers and Redis run in one goroutine, on a fake clock, under
// a scheduler driven by one seed, while faults are injected; the
// single-activation invariant is checked after every step. Any failure
// replays exactly from its seed.
//
// # What runs for real, what is simulated
//
// Real code: the placement resolver (internal/pinboard/placement: its cache, misses,
// claims, replaces, renewals after a stale refusal, Refused), the store's
// semantics (internal/store/memstore, which one conformance suite holds to
// the Redis scripts' behaviour), the worker's lease arithmetic
// (internal/base/leaseterm: anchored at the send time, checked inline) and the
// host's activation rule with its memory of released epochs
// (internal/base/activation). Simulated around them: each pinboard's link to
// Redis (delays, a stall that keeps connections open and passes no byte,
// the client-side cache and its invalidations arriving late or being
// flushed when the client gives a silent connection up, writes sent into a
// stall that take effect when it resumes, the restart fence), the proxy's
// per-request decisions (a host's 503 closing/draining/lease/stale and an
// unreachable worker are reported with Refused and retried within the
// attempt budget; no answer within the forward timeout is a 504), and each
// worker process (registration, heartbeats every 3 s, the watchdog,
// releases with bounded retries, idle close, evict, abort on lease loss;
// 503 closing while a release is in flight).
//
// Faults (each seed allows a random subset, swarm testing): message delays
// with a slow tail (so messages overtake each other), a pinboard's Redis
// link stalling for up to 15 s, late invalidations, deferred writes, worker
// freezes (up to 25 s: past the lease), worker crashes and restarts at the
// same address, Redis restarting without persistence, console evictions,
// pinboard crashes, a worker cut off from the pinboards, a pinboard cut off
// from a worker. The cluster (2–3 pinboards, 2–4 workers, 2–6 ids), the
// idle timeout (0.3–5 s, so that placements move all the time) and the
// request rate are drawn from the seed too.
//
// # Invariants checked
//
//   - Safety, after every step: for every id, at most one live instance in
//     the fleet, where live means its process runs, it is active (not
//     closing), and its session is its worker's current one with a lease
//     the worker would still serve under (the instances that could serve a
//     request now, or as soon as their frozen worker thaws).
//   - Liveness, after the faults heal (the quiet phase): every id was served
//     through every running pinboard during the phase's second half.
//
// # Using it
//
//	go test ./test/sim                                    # 300 seeds (CI runs more, without -race)
//	go test ./test/sim -run 'TestSimulation$' -sim.seeds 100000 -sim.duration 10m
//	go test ./test/sim -run TestSimulationReplay -sim.seed 1891 -v   # every step of one seed
//
// A failing seed prints the violation and the steps before it; the same
// seed on the same commit replays it exactly (TestSimulationIsDeterministic
// checks it). TestSimulationCatchesPlantedBugs builds the package with the
// pinned_faults tag and shows that the simulation finds each planted twin
// of the stale-route fence (internal/base/faults: no_tombstone, short_tombstone,
// release_any_epoch).
//
// Determinism rests on: one goroutine, the fake clock, one PCG source
// feeding the workload, the faults and the resolver's own choices
// (placement.Config.Rand), no iteration over a map where order matters
// (sessions are sorted, ids walked in order), and a placement cache of one
// shard (which names share a shard would otherwise depend on a hash seed).
package sim
