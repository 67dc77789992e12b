// Command counter is pinned's demo application: a durable counter object per
// id under /counter, in local mode (one process, in-memory directory).
//
//	go run ./examples/counter                 # listens on 127.0.0.1:8080
//	curl -X POST localhost:8080/counter/alice/incr
//	curl localhost:8080/counter/alice/
//	curl 'localhost:8080/counter/alice/stream?n=5'
//	curl -X POST 'localhost:8080/counter/alice/incr-later?delay=2s'
//
// WebSocket /counter/{id}/ws echoes messages and pushes {"count":N} on every
// change. GET /healthz is the readiness probe (503 while shutting down).
// GET /metrics serves the host's and the worker's metrics with the go_* and
// process_* ones (metricshttp): on the main listener in local mode, on the
// loopback admin listener (with /debug/pprof/*) in fleet mode, where the
// main listener is the advertise URL the pinboard proxies to.
//
// `counter -h` lists every setting (flag and PINNED_* variable, type,
// default). Unknown PINNED_* variables are reported at start, one warning
// line each.
// -persist (PINNED_PERSIST) names a Redis (redis://host:port/db) where
// every count is kept, fenced by its instance's activation epoch
// (counterapp, package fence), so a count survives its instance and no
// acknowledged increment is lost when an id moves.
// -max-body-bytes (PINNED_MAX_BODY_BYTES) is the host's request body limit:
// the server is configured to agree with it (413 with a JSON error beyond
// it, the body drained first) and the worker tells the pinboard.
//
// Fleet mode: when PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL
// are all set, the counter runs a worker that registers with that pinboard
// (advertising PINNED_ADVERTISE_URL, which must reach this process's
// listener) and serves /counter only under the worker's lease; GET /healthz
// then answers 200 only while the worker is registered (worker.Ready). On
// SIGTERM the worker winds down first (new ids 503 draining, idle instances
// closed and released), then the host and the server stop.
//
// Shutdown (SIGTERM or SIGINT) is bounded by -shutdown-timeout
// (PINNED_SHUTDOWN_TIMEOUT) as a whole, whatever the pinboard does (gone or
// frozen: the releases give up): what is left at the deadline is aborted.
// It logs what it waits for once a second and how long it took ("counter
// stopped"). A second signal exits at once with 128 + its number.
//
// The process (settings, host, worker, listeners, shutdown) is package
// countercmd; the object type is package counterapp.
package main

import (
	"io"
	"os"

	"github.com/pinned-go/pinned/examples/counter/countercmd"
	"github.com/pinned-go/pinned/internal/base/cmdline"
)

// about is what `counter -h` prints above the settings.
const about = `pinned's demo: a durable counter per id under /counter/{id}/.
Local mode by default; fleet mode (a worker registered with a pinboard) when
PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL are all set.`

// options is everything the demo reads from flags and the environment.
type options struct {
	counter countercmd.Settings
	unknown []cmdline.UnknownVar
}

// loadOptions parses args and environ (as os.Environ): the demo's
// settings, countercmd.Load.
func loadOptions(args, environ []string, stdout io.Writer) (options, error) {
	var o options
	var err error
	o.counter, o.unknown, err = countercmd.Load(cmdline.New("counter", "PINNED_", about), args, environ, stdout)
	return o, err
}

func main() {
	os.Exit(mainStatus(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// mainStatus is the whole command; it returns the exit status
// (cmdline.Status: 2 for a usage or configuration error).
func mainStatus(args, environ []string, stdout, stderr io.Writer) int {
	opts, err := loadOptions(args, environ, stdout)
	if err != nil {
		return cmdline.Exit(stderr, "counter", err)
	}
	return countercmd.Main(opts.counter, opts.unknown, countercmd.Extras{}, stderr)
}
