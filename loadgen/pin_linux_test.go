package loadgen

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// probeCPUs lists the CPUs the hiccup probes pin themselves to: every CPU
// this process may run on.
func probeCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return []int{-1}
	}
	var cpus []int
	for c := 0; c < runtime.NumCPU()*4 && len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// pinThread locks the calling goroutine to its thread and the thread to
// cpu (-1: no pinning). The caller's goroutine must exit without unlocking,
// so the runtime retires the pinned thread with it.
func pinThread(cpu int) {
	runtime.LockOSThread()
	if cpu < 0 {
		return
	}
	var set unix.CPUSet
	set.Set(cpu)
	_ = unix.SchedSetaffinity(0, &set) // unpinned, the probe still measures its own CPU
}
