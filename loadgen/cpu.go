package loadgen

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time the process has used so far, user and
// system, all threads: the utime+stime of /proc/self/stat, read through
// getrusage(RUSAGE_SELF) at microsecond resolution instead of clock ticks.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
