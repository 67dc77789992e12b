package wire

import (
	"strconv"
	"strings"
	"time"
)

// NextEpoch is the epoch allocated to a new activation of an id whose last
// allocated epoch is last, at wall time now: max(last + 1, now in unix
// microseconds). The redisstore claim script computes the same on Redis's
// clock (TIME), memstore and the host's local mode on theirs.
//
// The counter makes epochs of one id strictly increasing while it is
// remembered; the time floor keeps them increasing when it is forgotten (a
// Redis restarted without persistence, an expired counter, a restarted
// process): every earlier epoch was at most the time it was allocated (plus
// one per activation of that id faster than one per microsecond), so a new
// one allocated later is larger, unless the clock stepped back by more than
// the time in between. Epochs are opaque: compare them, do not read them as
// times.
func NextEpoch(last uint64, now time.Time) uint64 {
	return max(last+1, uint64(max(now.UnixMicro(), 0)))
}

// MaxEpochLen is the longest decimal epoch: 20 digits (a uint64).
const MaxEpochLen = 20

// ParseEpoch parses a HeaderEpoch value: 1 to MaxEpochLen decimal digits
// that fit a uint64. It does not allocate. ok is false for anything else
// (empty, a sign, a space, an overflow).
func ParseEpoch(b []byte) (epoch uint64, ok bool) {
	if len(b) == 0 || len(b) > MaxEpochLen {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if epoch > (1<<64-1-d)/10 {
			return 0, false
		}
		epoch = epoch*10 + d
	}
	return epoch, true
}

// AppendEpoch appends epoch in decimal, the form HeaderEpoch carries.
func AppendEpoch(dst []byte, epoch uint64) []byte { return strconv.AppendUint(dst, epoch, 10) }

// FormatPlacement is the value of a placement key: "<epoch> <since> <session>",
// since in unix milliseconds. The session id comes last, so it may hold any
// byte.
func FormatPlacement(epoch uint64, sinceMs int64, session string) string {
	return strconv.FormatUint(epoch, 10) + " " + strconv.FormatInt(sinceMs, 10) + " " + session
}

// ParsePlacement splits a placement key's value (FormatPlacement). ok is
// false when v is not of that shape or names an empty session.
func ParsePlacement(v string) (epoch uint64, sinceMs int64, session string, ok bool) {
	e, rest, ok1 := strings.Cut(v, " ")
	t, session, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || session == "" {
		return 0, 0, "", false
	}
	epoch, err1 := strconv.ParseUint(e, 10, 64)
	sinceMs, err2 := strconv.ParseInt(t, 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	return epoch, sinceMs, session, true
}
