// Package deps holds the module's structure tests:
//
//   - TestLayers lists every package with `go list` and fails when an
//     import breaks one of the rules in its table (which package may not
//     depend on which, and that only test support imports internal/testkit).
//     Each rule says why it exists; a rule whose packages no longer exist
//     fails too, so a move or rename cannot silently retire it.
//   - TestPublicAPI type-checks every public package (not internal/, not
//     test support, not examples/, not a command) from its export data and
//     fails when an exported name exposes a type of an internal package: an
//     application must be able to use every part of the public API.
//   - TestRaceFreeTestsRunInCI finds every test that runs only without the
//     race detector (its file built !race, or it skips when raceEnabled)
//     and fails unless the -run pattern of .ci/run's step without -race
//     (race_free_tests) selects it, so CI checks the zero-allocation paths.
//
// Invariants: the layering rules are checked on the transitive
// dependencies of each package's non-test build, in the default build and
// in the pinned_faults build; test files may import anything. Both tests
// stat every source file so that go test's cache reruns them after any
// change.
package deps
