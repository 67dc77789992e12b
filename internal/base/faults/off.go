//go:build !pinned_faults

package faults

import "time"

// Enabled reports whether this binary was built with the pinned_faults tag.
const Enabled = false

// Has reports whether fault f is switched on. Without the pinned_faults
// build tag it is always false.
func Has(Fault) bool { return false }

// LateWatchdogDelay is how late the watchdog notices an expired lease under
// LateWatchdog: 0 in a release build.
func LateWatchdogDelay() time.Duration { return 0 }
