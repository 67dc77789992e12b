// Package deps holds the layering test of the module: TestLayers lists
// every package with `go list` and fails when an import breaks one of the
// rules in its table (which package may not depend on which). Each rule
// names why it exists; a rule whose packages no longer exist fails too, so a
// move or rename cannot silently retire it.
//
// Invariant: the rules are checked on the transitive dependencies of each
// package's non-test build, in the default build and in the pinned_faults
// build; test files may import anything.
package deps
