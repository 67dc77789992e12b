package host

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pinned-go/pinned/clock"
)

// throttleBurst is how many hot-path error logs a host writes per
// throttleWindow; the rest are counted and reported with the next one.
const (
	throttleBurst  = 10
	throttleWindow = time.Second
)

// throttle limits hot-path error logs (handler errors, panics, setup
// failures, release failures) so that a failing dependency cannot flood the
// log.
type throttle struct {
	clock clock.Clock

	mu         sync.Mutex
	start      clock.Instant
	n          int
	suppressed int
}

// allow reports whether a log line may be written now and, if so, how many
// were suppressed since the last one written.
func (t *throttle) allow() (ok bool, suppressed int) {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.start.IsZero() || now.Elapsed(t.start, throttleWindow) {
		t.start, t.n = now, 0
	}
	if t.n >= throttleBurst {
		t.suppressed++
		return false, 0
	}
	t.n++
	suppressed, t.suppressed = t.suppressed, 0
	return true, suppressed
}

// logThrottled writes one throttled log record.
func (h *Host) logThrottled(level slog.Level, msg string, attrs ...any) {
	if !h.log.Enabled(context.Background(), level) {
		return
	}
	ok, suppressed := h.throttle.allow()
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	h.log.Log(context.Background(), level, msg, attrs...)
}

// debug reports whether debug records are written. A caller on a path every
// instance takes checks it before building logDebug's arguments, whose
// boxing allocates even when the record is dropped.
func (h *Host) debug() bool { return h.log.Enabled(context.Background(), slog.LevelDebug) }

// logDebug writes a lifecycle record at debug level when enabled.
func (h *Host) logDebug(msg string, attrs ...any) {
	if h.log.Enabled(context.Background(), slog.LevelDebug) {
		h.log.Debug(msg, attrs...)
	}
}
