// Package countercmd is the counter demo's process, behind the command
// examples/counter (whose doc says what it serves and how to run it): its
// settings (Settings, each a flag and a PINNED_* variable), the host of
// counterapp's object type under /counter, the worker in fleet mode, the
// main and admin listeners, and the bounded shutdown (Run, Main). The demo
// adds nothing to it; the test fixture test/app/counter runs the same
// process with the parts only tests use added through Extras (observers of
// the counters and the lease for its chaos history, GET /blob).
//
// Invariants:
//   - Every setting the process cannot run with, alone or together (a
//     partial fleet configuration), is a usage error before anything starts
//     (exit 2).
//   - In fleet mode /metrics and /debug/pprof are served only on the
//     loopback admin listener, never on the listener the pinboard is told
//     to reach; the admin listener refuses a non-loopback address.
//   - Run owns every goroutine it starts (the servers, the worker's Run) and
//     returns only after each has ended or the shutdown deadline passed
//     (connections still open then are left to the process's exit); the
//     whole shutdown (worker wind-down, host close, servers) is bounded by
//     Settings.ShutdownTimeout.
//   - The deployment token is never logged.
package countercmd
