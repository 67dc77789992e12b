// Package soak is pinned's soak test: the real binaries on 127.0.0.1 (a
// redis-server, one pinboard, three counter workers) under an open-loop
// load through the pinboard at half of its measured capacity for a long
// time, with id churn (a Zipf mix over a large key space: cold ids are
// activated, go idle and are evicted, 20 s idle timeout) and a worker
// killed with SIGKILL (and restarted) every few minutes. Every few seconds
// it samples, for every process, its resident memory (VmRSS), its open
// file descriptors (/proc/<pid>/fd) and, for the Go processes, its
// goroutines (go_goroutines from /metrics), and at the end it requires
// them flat and no request lost without a clean answer.
//
// It runs only when asked for a duration:
//
//	go test ./test/soak -run TestSoak -v -timeout 40m -soak-duration 30m -soak-report docs/soak.md
//	go test ./test/soak -run TestSoak -v -soak-duration 3m -soak-kill-every 1m     # a short check
//	go test ./test/soak -run TestSoak -soak-duration 1m -soak-kill-every 20s -soak-sample 5s   # CI's
//
// Choices:
//
//   - Capacity is measured first: a closed loop with 64 connections for
//     5 s against the same pinboard and ids, after 20 s of the same load (the
//     id mix's steady state); the soak's rate is half of it.
//     The load is open loop: one request per slot at the rate, sent by a
//     pool of 512 goroutines; a slot that finds them busy and their queue
//     full is counted late, never dropped.
//   - A clean answer is 2xx, 4xx, 503 with Retry-After, or 502/504 with
//     Retry-After (a request the proxy may have forwarded). Anything else
//     (a timeout, a connection error, a 5xx without Retry-After) is a lost
//     request; the test requires none.
//   - Flat: after the first fifth of the samples (warm-up), and leaving
//     out the minute after each kill, the median of the last third of the
//     samples is at most the median of the first third × 1.25 + 32 MiB
//     (RSS), × 1.2 + 20 (goroutines), × 1.2 + 10 (fds): for redis-server
//     and the pinboard, and for the workers' sum over their live
//     incarnations (a kill moves the dead worker's ids to the others, so
//     one worker's share grows while the total stays). Each worker
//     incarnation is listed in the report too. A series needs 30 samples
//     after those exclusions to be judged (about 10 minutes at the default
//     10 s): a shorter run reports the numbers and judges only the answers.
//   - The report (-soak-report, relative to the module root) has the
//     parameters, the answers by class, and per process the first, last
//     and largest sample of each resource.
package soak
