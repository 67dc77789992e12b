package loadgen

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkTimedWake measures what one timed sleep and wake-up costs on
// this machine: an epoll wait with nothing to report that ends on its
// timeout, as the open loop's wait for its next slot does (83 µs is the
// slot spacing at 12 000 req/s), through the runtime's system-call path
// (raw=false, as the loops wait) and as a raw system call the scheduler
// does not see (raw=true). cpu-µs/wake is the process's CPU time (user +
// system, getrusage) per wake-up: the floor of an open loop that wakes
// once per request, whatever it does once awake. It explains the open
// loop's CPU per request in the loadgen suite; it is not a target.
func BenchmarkTimedWake(b *testing.B) {
	for _, raw := range []bool{false, true} {
		for _, d := range []time.Duration{83 * time.Microsecond, time.Millisecond} {
			b.Run(fmt.Sprintf("raw=%v/%v", raw, d), func(b *testing.B) {
				epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
				if err != nil {
					b.Fatal(err)
				}
				defer unix.Close(epfd)
				events := make([]unix.EpollEvent, 1)
				b.ReportAllocs()
				before := cpuTime(b)
				b.ResetTimer()
				for range b.N {
					epollWait(epfd, events, int64(d), raw)
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuTime(b)-before)/float64(b.N)/1e3, "cpu-µs/wake")
			})
		}
	}
}

// cpuTime returns the process's user + system CPU time in nanoseconds.
func cpuTime(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
