//go:build !linux

package loadgen

import (
	"context"
	"errors"
	"time"

	"github.com/pinned-go/pinned/clock"
)

// loopEngineSupported reports whether EngineLoop can run on this platform:
// it needs epoll.
const loopEngineSupported = false

func (r *Runner) runLoops(context.Context, time.Time, *schedule, *series, clock.Instant) (engineResult, error) {
	return engineResult{}, errors.New("loadgen: the loop engine needs Linux")
}
