package wire

import (
	"encoding/json"
	"errors"
	"hash/fnv"
	"strconv"
)

// Alarm delivery: a due alarm reaches its instance as
//
//	POST /<namespace>/<id>/_pinned/alarm
//	X-Pinned-Proxy-Secret: <the worker's secret>
//	X-Pinned-Session: <the session holding the placement>
//	X-Pinned-Alarm: <attempt> <scheduled unix ms> <name>
//
// sent by a pinboard's alarm scheduler to the worker holding the id. The
// host runs the type's Alarm handler inside the instance's turn and answers
// 2xx when it returned nil. Clients cannot send it: the proxy drops every
// client x-pinned-* field, and the host answers the path only to requests
// that carry both the worker's secret and the alarm field.
const (
	// PathAlarm is the path after /<namespace>/<id> of an alarm delivery.
	PathAlarm = "/_pinned/alarm"
	// HeaderAlarm carries the delivered alarm (AlarmDelivery.Header).
	HeaderAlarm = "X-Pinned-Alarm"
)

// Registry calls of alarms (added in protocol version 2). The first three
// are the worker's (bearer token, and the session must hold the id's
// placement); the last is an operator's.
const (
	PathAlarmSet    = "/registry/alarms/set"    // POST AlarmSetRequest -> 200 AlarmSetResponse
	PathAlarmDelete = "/registry/alarms/delete" // POST AlarmDeleteRequest -> 200 AlarmDeleteResponse
	PathAlarmList   = "/registry/alarms/list"   // POST AlarmListRequest -> 200 AlarmListResponse
	PathAlarmsDead  = "/registry/alarms/dead"   // GET ?limit=N -> 200 DeadAlarmsResponse
)

// Limits and defaults of alarms, shared by every end: the host checks them
// before a call leaves the process and the registry checks them again.
const (
	// MaxAlarmNameLen bounds an alarm's name (the id grammar, CheckSegment).
	MaxAlarmNameLen = 64
	// MinAlarmEveryMs is the shortest repeat interval (Alarm.EveryMs).
	MinAlarmEveryMs = 1000
	// MaxAlarmAttempts bounds Alarm.MaxAttempts.
	MaxAlarmAttempts = 100
	// DefaultAlarmAttempts is Alarm.MaxAttempts when the caller sets none:
	// the first delivery and five retries.
	DefaultAlarmAttempts = 6
	// DefaultAlarmBackoffMs is Alarm.BackoffMs when the caller sets none:
	// retries after 2, 4, 8, 16 and 32 s.
	DefaultAlarmBackoffMs = 2000
	// MinAlarmBackoffMs and MaxAlarmBackoffMs bound Alarm.BackoffMs; every
	// wait between two attempts is also capped at MaxAlarmBackoffMs.
	MinAlarmBackoffMs = 10
	MaxAlarmBackoffMs = 3_600_000
	// MaxAlarmTimeMs bounds Alarm.AtMs (year 9999), so that every time is
	// exact in a Redis score (a double) and in JSON.
	MaxAlarmTimeMs = 253_402_300_799_999
	// DefaultMaxAlarmsPerInstance is the default bound on the alarms one
	// instance holds (the registry's and the local host's).
	DefaultMaxAlarmsPerInstance = 100
	// AlarmShards is the number of alarm shards (see the key schema). It is
	// part of the schema: every pinboard on one Redis must agree on it.
	AlarmShards = 16
)

// Alarm is one named alarm of one instance: the worker's request to set it
// (AlarmSetRequest), its record in the store, and an entry of a listing.
// Times are unix milliseconds.
type Alarm struct {
	Name string `json:"name"`
	// AtMs is the scheduled time of the current occurrence: the handler
	// receives it, and the alarm is due then (or, after a failed attempt,
	// at DueMs).
	AtMs int64 `json:"atMs"`
	// EveryMs > 0 repeats the alarm: occurrences at AtMs + k·EveryMs.
	EveryMs int64 `json:"everyMs,omitempty"`
	// SkipMissed chooses the missed-tick policy of a repeating alarm:
	// false fires once for all the occurrences that passed while it was not
	// delivered (the latest of them), true skips them and waits for the
	// next one in the future.
	SkipMissed bool `json:"skipMissed,omitempty"`
	// MaxAttempts bounds the attempts of one occurrence; after the last
	// failed one the occurrence is dead-lettered. 0 means
	// DefaultAlarmAttempts.
	MaxAttempts int `json:"maxAttempts,omitempty"`
	// BackoffMs is the wait after the first failed attempt, doubled after
	// each further one. 0 means DefaultAlarmBackoffMs.
	BackoffMs int64 `json:"backoffMs,omitempty"`
	// Failures counts the failed attempts of the current occurrence; the
	// next delivery is attempt Failures+1.
	Failures int `json:"failures,omitempty"`
	// Waits counts the deliveries of the current occurrence that found no
	// worker to take it (503, unreachable): they are not attempts, they
	// only lengthen the wait before the next try.
	Waits int `json:"waits,omitempty"`
	// Gen is minted by the pinboard each time the alarm is set: a record
	// set again while a delivery was in flight differs from the delivered
	// one, so that delivery's outcome does not touch it.
	Gen string `json:"gen,omitempty"`
	// DueMs is when the alarm is delivered next (listings only; the store
	// keeps it as the sorted-set score).
	DueMs int64 `json:"dueMs,omitempty"`
}

// AlarmSetRequest is the body of POST /registry/alarms/set: set (or
// replace) the alarm named Alarm.Name of (Namespace, ID). Only the fields
// Name, AtMs, EveryMs, SkipMissed, MaxAttempts and BackoffMs are read.
type AlarmSetRequest struct {
	SessionID string `json:"sessionId"`
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	Alarm     Alarm  `json:"alarm"`
}

// AlarmSetResponse is the 200 answer to an alarm set.
type AlarmSetResponse struct {
	Gen string `json:"gen"`
}

// AlarmDeleteRequest is the body of POST /registry/alarms/delete.
type AlarmDeleteRequest struct {
	SessionID string `json:"sessionId"`
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	Name      string `json:"name"`
}

// AlarmDeleteResponse is the 200 answer to an alarm delete. Deleted is
// false when the alarm did not exist.
type AlarmDeleteResponse struct {
	Deleted bool `json:"deleted"`
}

// AlarmListRequest is the body of POST /registry/alarms/list.
type AlarmListRequest struct {
	SessionID string `json:"sessionId"`
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
}

// AlarmListResponse is the 200 answer to an alarm listing, sorted by name.
type AlarmListResponse struct {
	Alarms []Alarm `json:"alarms"`
}

// DeadAlarm is an occurrence whose last attempt failed.
type DeadAlarm struct {
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	Alarm     Alarm  `json:"alarm"`
	DeadAtMs  int64  `json:"deadAtMs"`
	// Error says how the last attempt failed (status and the host's
	// message, or the transport error).
	Error string `json:"error"`
}

// DeadAlarmsResponse is the 200 answer to GET /registry/alarms/dead: the
// most recent dead letters first.
type DeadAlarmsResponse struct {
	DeadAlarms []DeadAlarm `json:"deadAlarms"`
}

// AlarmDelivery is what an alarm delivery carries in HeaderAlarm.
type AlarmDelivery struct {
	Name        string
	ScheduledMs int64
	Attempt     int // 1 for the first attempt of an occurrence
}

// Delivery is the AlarmDelivery of the alarm's next attempt.
func (a Alarm) Delivery() AlarmDelivery {
	return AlarmDelivery{Name: a.Name, ScheduledMs: a.AtMs, Attempt: a.Failures + 1}
}

// Header encodes d as the value of HeaderAlarm:
// "<attempt> <scheduled unix ms> <name>".
func (d AlarmDelivery) Header() string {
	b := strconv.AppendInt(nil, int64(d.Attempt), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, d.ScheduledMs, 10)
	b = append(b, ' ')
	return string(append(b, d.Name...))
}

// ParseAlarmDelivery decodes a HeaderAlarm value written by Header.
func ParseAlarmDelivery(v []byte) (AlarmDelivery, error) {
	var d AlarmDelivery
	field := func() ([]byte, bool) {
		for i, c := range v {
			if c == ' ' {
				f := v[:i]
				v = v[i+1:]
				return f, true
			}
		}
		return nil, false
	}
	a, ok1 := field()
	s, ok2 := field()
	if !ok1 || !ok2 {
		return d, errors.New("alarm field must be \"<attempt> <scheduled ms> <name>\"")
	}
	attempt, err := strconv.Atoi(string(a))
	if err != nil || attempt < 1 || attempt > MaxAlarmAttempts {
		return d, errors.New("alarm attempt must be an integer from 1 to " + strconv.Itoa(MaxAlarmAttempts))
	}
	at, err := strconv.ParseInt(string(s), 10, 64)
	if err != nil || at < 0 || at > MaxAlarmTimeMs {
		return d, errors.New("alarm scheduled time must be unix milliseconds")
	}
	if e := CheckSegment(v, MaxAlarmNameLen); e != SegmentOK {
		return d, errors.New("alarm name: " + e.Error())
	}
	return AlarmDelivery{Name: string(v), ScheduledMs: at, Attempt: attempt}, nil
}

// Check validates the fields a caller sets (name, times, repeat, retry
// policy) and returns the name of the offending field ("" when valid) and
// why.
func (a Alarm) Check() (field string, err error) {
	switch {
	case CheckSegment([]byte(a.Name), MaxAlarmNameLen) != SegmentOK:
		return "name", errors.New("must be 1 to " + strconv.Itoa(MaxAlarmNameLen) + " bytes of A-Za-z0-9._~@:+=-, not starting with '.': " + CheckSegment([]byte(a.Name), MaxAlarmNameLen).Error())
	case a.AtMs < 0 || a.AtMs > MaxAlarmTimeMs:
		return "atMs", errors.New("must be unix milliseconds from 0 to " + strconv.FormatInt(MaxAlarmTimeMs, 10))
	case a.EveryMs != 0 && (a.EveryMs < MinAlarmEveryMs || a.EveryMs > MaxAlarmTimeMs):
		return "everyMs", errors.New("must be 0 (no repeat) or at least " + strconv.Itoa(MinAlarmEveryMs) + " ms")
	case a.MaxAttempts < 0 || a.MaxAttempts > MaxAlarmAttempts:
		return "maxAttempts", errors.New("must be 0 (the default, " + strconv.Itoa(DefaultAlarmAttempts) + ") to " + strconv.Itoa(MaxAlarmAttempts))
	case a.BackoffMs != 0 && (a.BackoffMs < MinAlarmBackoffMs || a.BackoffMs > MaxAlarmBackoffMs):
		return "backoffMs", errors.New("must be 0 (the default, " + strconv.Itoa(DefaultAlarmBackoffMs) + " ms) or " +
			strconv.Itoa(MinAlarmBackoffMs) + " to " + strconv.Itoa(MaxAlarmBackoffMs) + " ms")
	}
	return "", nil
}

// Normalized returns the alarm as it is stored when set: the retry policy
// with its defaults filled in, no failures, waits or due time, and gen.
func (a Alarm) Normalized(gen string) Alarm {
	return Alarm{
		Name: a.Name, AtMs: a.AtMs, EveryMs: a.EveryMs, SkipMissed: a.SkipMissed,
		MaxAttempts: orInt(a.MaxAttempts, DefaultAlarmAttempts),
		BackoffMs:   orInt64(a.BackoffMs, DefaultAlarmBackoffMs),
		Gen:         gen,
	}
}

func orInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func orInt64(v, def int64) int64 {
	if v == 0 {
		return def
	}
	return v
}

// The alarm state machine. Every scheduler (each pinboard's, and a local
// host's) applies exactly these transitions to the record it delivered.

// AfterSuccess is the alarm after a successful delivery at nowMs: the next
// occurrence of a repeating alarm, or ok false for a one-shot one (delete
// it). The next occurrence follows the missed-tick policy: when
// occurrences after AtMs have already passed by nowMs, SkipMissed waits for
// the first one after nowMs, otherwise the latest passed one is due at once
// (it fires once for all of them).
func (a Alarm) AfterSuccess(nowMs int64) (next Alarm, ok bool) {
	if a.EveryMs <= 0 {
		return Alarm{}, false
	}
	next = a
	next.Failures, next.Waits, next.DueMs = 0, 0, 0
	next.AtMs = a.AtMs + a.EveryMs
	if next.AtMs <= nowMs {
		last := a.AtMs + (nowMs-a.AtMs)/a.EveryMs*a.EveryMs // the latest occurrence ≤ now
		next.AtMs = last
		if a.SkipMissed {
			next.AtMs = last + a.EveryMs
		}
	}
	return next, true
}

// AfterFailure is the alarm after a failed attempt at nowMs. While attempts
// remain, next is the same occurrence with one more failure, due after the
// backoff (BackoffMs·2^(failures−1), at most MaxAlarmBackoffMs). After the
// last attempt the occurrence is dead (dead is true): a repeating alarm
// goes on with its next occurrence (ok true), a one-shot one ends (ok
// false). dueMs is when next is due.
func (a Alarm) AfterFailure(nowMs int64) (next Alarm, dueMs int64, dead, ok bool) {
	failures := a.Failures + 1
	if failures < orInt(a.MaxAttempts, DefaultAlarmAttempts) {
		next = a
		next.Failures, next.Waits, next.DueMs = failures, 0, 0
		return next, nowMs + a.backoff(failures), false, true
	}
	if next, ok = a.AfterSuccess(nowMs); ok {
		return next, next.AtMs, true, true
	}
	return Alarm{}, 0, true, false
}

// backoff is the wait after the n-th failed attempt.
func (a Alarm) backoff(n int) int64 {
	d := orInt64(a.BackoffMs, DefaultAlarmBackoffMs)
	for i := 1; i < n && d < MaxAlarmBackoffMs; i++ {
		d *= 2
	}
	return min(d, MaxAlarmBackoffMs)
}

// AfterUnavailable is the alarm after a delivery that found no worker to
// take it (no attempt was made): the same occurrence with one more wait,
// due after baseMs·2^waits, at most maxMs, and never before minMs from now
// (a Retry-After).
func (a Alarm) AfterUnavailable(nowMs, baseMs, maxMs, minMs int64) (next Alarm, dueMs int64) {
	next = a
	next.DueMs = 0
	d := max(baseMs, 1)
	for i := 0; i < a.Waits && d < maxMs; i++ {
		d *= 2
	}
	next.Waits = min(a.Waits+1, 62)
	return next, nowMs + max(min(d, maxMs), minMs)
}

// AlarmShard is the shard holding the alarms of the placement name
// "<namespace>/<id>": FNV-1a of the name modulo AlarmShards. Every alarm
// of one instance lives in one shard.
func AlarmShard(placementName string) int {
	h := fnv.New32a()
	h.Write([]byte(placementName))
	return int(h.Sum32() % AlarmShards)
}

// AlarmMember is an alarm's member in its shard's sorted set and record
// hash: "<namespace>/<id>/<name>". Namespaces hold one slash, ids and
// names none, so SplitAlarmMember recovers the three.
func AlarmMember(ns, id, name string) string { return ns + "/" + id + "/" + name }

// SplitAlarmMember splits an AlarmMember; ok is false for any other shape.
func SplitAlarmMember(m string) (ns, id, name string, ok bool) {
	last := -1
	for i := len(m) - 1; i >= 0; i-- {
		if m[i] == '/' {
			last = i
			break
		}
	}
	if last <= 0 || last == len(m)-1 {
		return "", "", "", false
	}
	ns, id, ok = SplitPlacementName(m[:last])
	if !ok {
		return "", "", "", false
	}
	return ns, id, m[last+1:], true
}

// ErrorText is the "error" member of a JSON Error body, or the body itself
// (at most 200 bytes) when it is not one: what a dead letter records of a
// failed delivery's answer.
func ErrorText(body []byte) string {
	var e Error
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return e.Error
	}
	if len(body) > 200 {
		body = body[:200]
	}
	return string(body)
}
