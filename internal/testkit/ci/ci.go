// Package ci tells a test whether it runs in CI and turns a missing
// prerequisite into a failure there.
//
// .ci/run exports PINNED_CI=1 and installs every program the tests use
// (redis-server, redis-sentinel, promtool, chromium, nginx, HAProxy, wrk).
// A test that cannot run without one of them, or without something every
// Linux CI machine has (a second loopback address), calls Missing: on a
// developer's machine the test is skipped with the reason, in CI it fails,
// so a test the docs rely on never passes there by skipping.
//
// Invariant: under CI (Enabled), Missing never skips and never returns.
// The package reads the environment only; it keeps no state.
package ci

import (
	"os"
	"testing"
)

// EnvVar is the variable .ci/run sets (to 1) for every test it runs.
const EnvVar = "PINNED_CI"

// Enabled reports whether the tests run in CI: PINNED_CI is set (by
// .ci/run), or CI is (as CI services set it).
func Enabled() bool { return os.Getenv(EnvVar) != "" || os.Getenv("CI") != "" }

// Missing reports a prerequisite tb cannot run without; why says what is
// missing and how to get it. In CI, which installs every prerequisite, it
// fails tb; elsewhere it skips tb. Either way it does not return.
func Missing(tb testing.TB, why string) {
	tb.Helper()
	if Enabled() {
		tb.Fatalf("%s (%s is set: .ci/run installs every prerequisite, so a missing one is a failure)", why, EnvVar)
	}
	tb.Skip(why)
}
