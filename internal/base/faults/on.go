//go:build pinned_faults

package faults

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// Enabled reports whether this binary was built with the pinned_faults tag.
const Enabled = true

// lateWatchdog is the lag of the watchdog under LateWatchdog.
const lateWatchdog = 4 * time.Second

// active is set once at start from PINNED_FAULTS and read-only afterwards.
var active = parse(os.Getenv(EnvVar))

func parse(v string) map[Fault]bool {
	m := map[Fault]bool{}
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if !slices.Contains(All(), Fault(name)) {
			fmt.Fprintf(os.Stderr, "%s: unknown fault %q (known: %v)\n", EnvVar, name, All())
			os.Exit(2)
		}
		m[Fault(name)] = true
	}
	if len(m) > 0 {
		fmt.Fprintf(os.Stderr, "PLANTED FAULTS ACTIVE: %v\n", v)
	}
	return m
}

// Has reports whether fault f is switched on by PINNED_FAULTS.
func Has(f Fault) bool { return active[f] }

// LateWatchdogDelay is how late the watchdog notices an expired lease:
// 4 s under LateWatchdog, else 0.
func LateWatchdogDelay() time.Duration {
	if active[LateWatchdog] {
		return lateWatchdog
	}
	return 0
}
