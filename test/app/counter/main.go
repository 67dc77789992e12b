// Command counter is the test fixture: the counter demo's process
// (examples/counter, package countercmd: every setting, route and log line
// of the demo) with the parts only the harnesses use added around it:
//
//   - PINNED_HISTORY=<file> appends the chaos history (history.go,
//     internal/testkit/history): instance activations and teardowns, every
//     request served, task effects, alarm runs, the worker's lease events.
//     test/chaos checks it; test/e2e and bench's alarms suite read the alarm
//     runs.
//   - GET /counter/{id}/blob?size=N (blob.go): N bytes of a fixed pattern,
//     Content-Length framed, generated while written: the large-body
//     workload of bench's streaming suite.
//   - PINNED_FAULTS is a known variable: binaries built with the
//     pinned_faults tag read it (internal/base/faults; test/chaos
//     TestPlantedBugs); release builds ignore it.
//
// test/chaos, test/e2e's alarm tests and bench build it (procrun,
// proctest); the other harnesses run the demo itself. `counter -h` lists
// every setting.
//
// Invariants: without PINNED_HISTORY and GET /blob the fixture serves
// exactly what the demo serves (the same countercmd.Run); every history
// event is written before the call that reported it returns (one write(2)
// each), so a worker killed with SIGKILL loses none.
package main

import (
	"io"
	"os"

	"github.com/pinned-go/pinned/examples/counter/countercmd"
	"github.com/pinned-go/pinned/internal/base/cmdline"
)

// about is what `counter -h` prints above the settings.
const about = `pinned's test fixture: the counter demo (examples/counter) with a chaos
history (PINNED_HISTORY), GET /counter/{id}/blob for the streaming
benchmarks, and PINNED_FAULTS for binaries built with -tags pinned_faults.`

// options is everything the fixture reads from flags and the environment:
// the demo's settings and its own.
type options struct {
	counter countercmd.Settings
	history string // PINNED_HISTORY (history.go)
	unknown []cmdline.UnknownVar
}

// loadOptions parses args and environ (as os.Environ) like the demo, with
// PINNED_HISTORY and PINNED_FAULTS besides.
func loadOptions(args, environ []string, stdout io.Writer) (options, error) {
	var o options
	set := cmdline.New("counter", "PINNED_", about)
	set.String(&o.history, "", EnvHistory, "path", "",
		"append the chaos history (instances, requests, effects, alarm runs, lease events) to this file")
	set.Known("PINNED_FAULTS") // read by internal/base/faults in binaries built with the pinned_faults tag
	var err error
	o.counter, o.unknown, err = countercmd.Load(set, args, environ, stdout)
	return o, err
}

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// mainStatus is the whole command; it returns the exit status
// (cmdline.Status: 2 for a usage or configuration error, 1 for a history
// file it cannot open or a failure while running).
func mainStatus(args, environ []string, stdout, stderr io.Writer) int {
	opts, err := loadOptions(args, environ, stdout)
	if err != nil {
		return cmdline.Exit(stderr, "counter", err)
	}
	rec, err := openRecorder(opts.history)
	if err != nil {
		return cmdline.Exit(stderr, "counter", err)
	}
	defer rec.close()
	return countercmd.Main(opts.counter, opts.unknown, extras(rec), stderr)
}

// extras are the fixture's additions to the counter process: the hooks
// and the lease observer that record into rec's history (none without a
// history) and GET /blob.
func extras(rec *recorder) countercmd.Extras {
	return countercmd.Extras{Hooks: rec.hooks(), OnLease: rec.onLease(), Routes: addBlob}
}
