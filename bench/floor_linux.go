package bench

import (
	"errors"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sleepFloor is what this machine charges any open loop before it does any
// HTTP: one thread that sleeps until absolute times gap apart, as an open
// loop sleeps until its slots. It is the loadgen suite's yardstick for its
// own targets: a generator cannot spend less CPU per request than one
// wake-up costs, nor send later than the machine wakes it.
type sleepFloor struct {
	wakes int
	gap   time.Duration
	// cpuUs is the thread's CPU time (user + system) per wake-up, µs.
	cpuUs float64
	// p99, p999 and max are how late the wake-ups came.
	p99, p999, max time.Duration
}

// measureSleepFloor sleeps n times until absolute CLOCK_MONOTONIC times gap
// apart on a thread of its own (raw clock_nanosleep, timer slack 1 ns:
// what a C program or loadgen's loop would do) and measures the thread's
// CPU per wake-up and the lateness of each. It blocks for about n × gap.
func measureSleepFloor(n int, gap time.Duration) (sleepFloor, error) {
	if n <= 0 || gap <= 0 {
		return sleepFloor{}, errors.New("sleep floor: n and gap must be positive")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	slack, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return sleepFloor{}, err
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0); err != nil {
		return sleepFloor{}, err
	}
	defer func() { _ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack), 0, 0, 0) }()
	base := time.Now()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return sleepFloor{}, err
	}
	mono := ts.Nano() - int64(time.Since(base)) // CLOCK_MONOTONIC at base
	late := make([]time.Duration, n)
	var ru0, ru1 unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru0); err != nil {
		return sleepFloor{}, err
	}
	next := time.Since(base)
	for i := range late {
		next += gap
		at := unix.NsecToTimespec(mono + int64(next))
		for {
			_, _, e := unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME,
				uintptr(unsafe.Pointer(&at)), 0, 0, 0)
			if e != unix.EINTR {
				break
			}
		}
		late[i] = max(0, time.Since(base)-next)
	}
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru1); err != nil {
		return sleepFloor{}, err
	}
	cpu := (ru1.Utime.Nano() + ru1.Stime.Nano()) - (ru0.Utime.Nano() + ru0.Stime.Nano())
	slices.Sort(late)
	return sleepFloor{wakes: n, gap: gap, cpuUs: float64(cpu) / 1e3 / float64(n),
		p99: late[n*99/100], p999: late[n*999/1000], max: late[n-1]}, nil
}
