//go:build !linux

package loadgen

import "runtime"

// probeCPUs: without CPU affinity, one probe per CPU, unpinned.
func probeCPUs() []int {
	cpus := make([]int, runtime.NumCPU())
	for i := range cpus {
		cpus[i] = -1
	}
	return cpus
}

// pinThread locks the calling goroutine to its thread; pinning to a CPU
// needs Linux.
func pinThread(int) { runtime.LockOSThread() }
