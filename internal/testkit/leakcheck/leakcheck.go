// Package leakcheck holds the goleak options for goroutines that libraries
// pinned depends on start by design and that pinned cannot stop. Each entry
// says who owns the goroutine and when it ends; anything else that outlives
// a test is a leak.
package leakcheck

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// VerifyTestMain runs m's tests, checks that they leaked no goroutine (but
// those of Options), runs cleanup (removing what the tests built; nil:
// nothing) and exits with the tests' status: goleak.VerifyTestMain for a
// TestMain with something to clean up.
func VerifyTestMain(m *testing.M, cleanup func()) {
	goleak.VerifyTestMain(m, append(Options(), goleak.Cleanup(func(code int) {
		if cleanup != nil {
			cleanup()
		}
		os.Exit(code)
	}))...)
}

// Options returns the goleak options for every known library goroutine.
func Options() []goleak.Option {
	return []goleak.Option{
		// fasthttp: process-wide Date header ticker, started once by the
		// first Server; never ends.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// fasthttp: the default TCPDialer's DNS cache cleaner, started by
		// the first client dial that uses it; never ends.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		// fasthttp: a Server's worker-pool cleaner notices Stop only after
		// sleeping MaxIdleWorkerDuration (10 s by default).
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		// fasthttp: a HostClient's idle-connection cleaner ends after its
		// last connection closes, checking every MaxIdleConnDuration.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		// fasthttp: a Client's host-map cleaner ends once no host client
		// has a connection left, checking every second or so.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*Client).mCleaner"),
		// rueidis: when NewClient probes a standalone server for cluster
		// mode, or a dial fails, the abandoned cluster client schedules a
		// delayed slot refresh that sleeps up to a second, then ends.
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
		// rueidis: a cluster client's slot refresh closes the connections
		// it replaced (after a node dropped them) from a goroutine that
		// sleeps 5 s first, then ends.
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
	}
}
