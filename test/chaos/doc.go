// Package chaos is pinned's chaos harness: real processes on 127.0.0.1
// (a redis-server, two pinboards sharing it, each through a TCP forwarder
// of the harness's, internal/testkit/tcpfwd, three counter workers in
// fleet mode, the test fixture test/app/counter, that keep their counts in
// a second redis-server through package fence, -persist; their idle
// timeout is 3 s under TestChaos and the planted stale-route faults, the
// counter's default, 5 min, for the other planted bugs, whose old
// instances must outlive a restart fence) under a closed-loop client over
// 200 ids sent through both pinboards, while one nemesis at a time breaks
// something. Every worker writes its history (internal/testkit/history:
// activations, teardowns, requests served, task effects, alarm runs, lease
// acks with their send times, lease losses), the client logs every request
// with its invoke and return times and its outcome (the count and the
// instance of each answer of GET / and POST /incr), the harness logs every
// nemesis and process death and, after the run, the count the counters'
// store holds for every id; internal/testkit/chaoscheck checks the whole
// history: no two live instances of one id, nothing served or done under
// an ended lease, no acknowledged increment lost from the store and
// nothing stored that no request explains, every request answered as the
// proxy promises, and every plain id's counter history linearizable.
//
// Runs:
//
//	go test ./test/chaos                                   # short mode (CI): 13 rounds, one of each nemesis, + the planted bugs + the failover
//	go test ./test/chaos -run TestChaos -rounds 50 -timeout 60m -chaos-report docs/chaos.md   (relative to the module root)
//	go test ./test/chaos -run 'TestChaos$' -chaos-nemeses redis-freeze+move -chaos-keep /tmp/chaos   # chosen nemeses; histories, logs, visualisations kept
//
// Choices:
//
//   - Nemeses: kill -9 of a worker (restarted on the same address, a new
//     process and clientId); SIGSTOP of a worker for a duration drawn from
//     {2, 4, 6, 9, 12, 30} s (short mode ≤ 9 s); restart of Redis without
//     persistence; kill -9 of a pinboard (restarted on the same port); a
//     drain pushed through /registry/push followed by a graceful SIGTERM and
//     a restart; latency (1.5 s round trip) then a 9 s cut of one worker's
//     control path (worker → registry), through a TCP forwarder
//     (internal/testkit/tcpfwd). On the store path (pinboard → redis-server,
//     through the same kind of proxy): replies delayed by 50–500 ms for one
//     pinboard or both for 8 s; one pinboard cut off from Redis for 8 s
//     while the other keeps working; and the two store races, replies
//     delayed by 100–300 ms on both pinboards while two workers are killed
//     (restarted at once: their ids move as soon as a death probe finds the
//     new process at the address, which does not know the old session's
//     secret, else when their sessions expire) or one is drained (it releases its ids and deregisters), with bursts of
//     requests for every id and for new ids through both pinboards at once
//     (storm), so that both pinboards re-place and place the same ids at
//     the same moment. And the stale routes (stale_test.go): one
//     pinboard's Redis link frozen (a stall: connections open, no byte
//     passing, no RST or FIN, at least 12 s), or the bytes from Redis to it
//     (replies and invalidation pushes) 1–2.5 s late, while placements move
//     through the other pinboard: 8 plain ids left alone go idle and are
//     released, 8 are evicted through its registry, and with the freeze one
//     worker is drained; then each of them is asked through both pinboards
//     in both orders while the client's loops go on through both. The old
//     holder must refuse the stale pinboard's route (old epoch) instead of
//     activating a second instance. The workers that heartbeat through the
//     faulted pinboard turn to the other for the duration (their control
//     forwarders retargeted, as behind a load balancer checking health),
//     so the old holders keep their leases. Their counterpart on the
//     control path: every worker's release calls held in the network
//     (heartbeats pass) while ids go idle and are evicted, so that the
//     holders give up releasing, stale routes renew the placements on
//     them, and the releases arrive late (they must leave the renewed
//     placements alone). One nemesis per round, then a settle time.
//   - Skips: the drain nemeses retry a push the registry refuses (no live
//     session right after a Redis restart, a store error) for a lease and
//     5 s, then skip the fault and record it ("skipped: ..."; the checker
//     counts it apart). A stale-route round in which no placement moved is
//     recorded as skipped too (it proved nothing). TestChaos fails when a
//     nemesis other than a drain was skipped, or more than one round in
//     ten (at least one allowed), and the report lists the skipped rounds.
//   - Recovery (recovery_test.go): for every round that killed workers, the
//     test's log and the report give the time from each kill to the first
//     2xx from another instance of each id the killed process held and the
//     client asked for again (p50, p99, max over those ids, and how many
//     were never served again; the ids never asked for again, a storm's
//     fresh ones, counted apart), from the histories: the instances live on
//     the process at the kill, and the client's requests with the instance
//     that answered them.
//   - Linearizability: a quarter of the ids (id000, id004, ...) get only
//     GET / and POST /incr, no background effect, so that the checker can
//     check their histories for linearizability against one counter per
//     id (the count persists: activations do not reset it); the checker
//     leaves the other ids out. With -chaos-keep, porcupine's visualisation
//     of every id found not linearizable is written beside the histories.
//   - Redis restarts are made safe, not tolerated: the pinboards run with
//     PINBOARD_RESTART_FENCE = the lease, so no id is placed anew until every
//     lease granted before the restart has run out; the checker allows no
//     overlap at all (AllowedOverlap 0).
//   - The client mixes POST /incr, GET /, POST /incr-later?delay=2s
//     (background tasks, whose effects are logged and must not happen after
//     the lease: Instance.Do checks the lease context's Err inline, see
//     host.Worker) and POST /alarm?delay=1s&name=c<N> (a durable alarm,
//     one name per request: the checker requires every alarm answered 2xx
//     to run, under a live lease, and an occurrence to run twice only
//     across a fault; a Redis restart loses the alarms set before it, by
//     design). Its timeout (45 s) exceeds the longest pause, so a request
//     held by a paused worker is answered, not abandoned; a timeout is a
//     hang.
//   - Planted bugs (TestPlantedBugs): the binaries are built with the
//     pinned_faults tag and each run switches one fault on through
//     PINNED_FAULTS (internal/base/faults), with the one nemesis that exposes
//     it; the checker must fail, in one of two runs on fresh clusters (a
//     bug shows only when the nemesis lands in its window). A release
//     build cannot be switched. The
//     store's placement writes without their checks (replace_no_compare,
//     claim_no_nx) show as two live instances of one id, and so do the
//     stale-route fence's (no_tombstone and short_tombstone: a host that
//     forgets the epochs it released, or remembers them 50 ms, under the
//     freeze and the slow invalidations; release_any_epoch: a late release
//     that deletes a renewed placement, under the late releases), with
//     non-linearizable reads. TestEveryFaultIsPlanted requires a case for
//     every fault internal/base/faults offers.
//   - Failover (TestSentinelFailover): Redis as a primary, a replica and
//     three sentinels, the pinboards connecting through the sentinels; the
//     primary is killed under load; the downtime seen by the client must
//     not exceed the failover time (kill to the sentinels' promotion) by
//     more than 1 s, the workers keep their sessions, the placements
//     survive on the replica, and the checker passes with no overlap.
package chaos
