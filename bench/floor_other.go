//go:build !linux

package bench

import (
	"errors"
	"time"
)

// sleepFloor: see floor_linux.go.
type sleepFloor struct {
	wakes          int
	gap            time.Duration
	cpuUs          float64
	p99, p999, max time.Duration
}

// measureSleepFloor is measured on Linux only.
func measureSleepFloor(n int, gap time.Duration) (sleepFloor, error) {
	return sleepFloor{}, errors.New("sleep floor: measured on Linux only")
}
