// Package fence makes an application's writes to Redis safe against stale
// activations: every write carries the writer's activation epoch
// (host.Instance.Epoch) and is refused when the key has already been
// written, or loaded, under a newer one.
//
// # Why
//
// An instance can keep running for a while after its id has moved: a
// process paused (GC, a stopped VM) between checking its lease and writing,
// or a request routed by a stale cache. Leases bound that window but cannot
// close it: the old instance's late write lands after the new instance read
// the state, and one of the two updates is silently lost. The store must
// refuse it, and it can, because every activation of an id has an epoch
// strictly greater than every earlier one (a fencing token).
//
// # Use
//
//	// On activation: load the state and fence out every older activation.
//	v, err := fence.Load(ctx, rdb, "counter:"+inst.ID(), inst.Epoch())
//	// On every change, before answering:
//	n, err := fence.Incr(ctx, rdb, "counter:"+inst.ID(), inst.Epoch(), 1)
//	if errors.Is(err, fence.ErrStale) { return err } // host: abort, 503 stale
//
// Load matters as much as the writes: it raises the key's epoch to the new
// activation's before it reads, so a write of the old activation that
// arrives after the read is refused rather than lost. A refused operation
// returns a *StaleError, which is host.ErrStale: a handler (or the object's
// New) that returns it gets its instance aborted and the request answered
// 503 stale, which the proxy retries on the id's current holder.
//
// # Layout and semantics
//
// A fenced key is a Redis hash with two fields: "e", the epoch of the last
// write or load (decimal), and "v", the value. Set, Incr and Load are one
// Lua script each, on that one key (so they work on Redis Cluster): compare
// the caller's epoch with "e", refuse when it is older, else write (or read)
// and store the caller's epoch. An equal epoch is accepted: one activation
// writes many times. Epochs are compared as decimal strings, so the whole
// uint64 range is exact. Get reads without fencing. A key never written
// reads as ("", 0) and accepts any epoch.
//
// # Other stores
//
// The pattern is the same for any store with a conditional write: keep the
// epoch next to the data and make every write conditional on it. In SQL
// (epochs fit a BIGINT below 2^63; host epochs are microsecond-based, far
// below):
//
//	-- activation: fence out older activations, then read
//	UPDATE counters SET epoch = $1 WHERE id = $2 AND epoch <= $1 RETURNING n;
//	-- no row: stale if one exists (SELECT epoch ... ), else INSERT it
//
//	-- every write
//	UPDATE counters SET n = $2, epoch = $1 WHERE id = $3 AND epoch <= $1;
//	-- 0 rows updated: stale; answer with host.ErrStale
//
//	-- or in one statement (PostgreSQL)
//	INSERT INTO counters (id, n, epoch) VALUES ($3, $2, $1)
//	  ON CONFLICT (id) DO UPDATE SET n = EXCLUDED.n, epoch = EXCLUDED.epoch
//	  WHERE counters.epoch <= EXCLUDED.epoch;
//
// # Invariants
//
//   - A key's epoch never decreases, and no operation with an epoch older
//     than the key's changes the key.
//   - Every operation is one script on one key: atomic on a single node and
//     on Redis Cluster.
//   - The package keeps no state; it is safe for concurrent use as far as
//     the rueidis client is.
package fence

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/host"
)

// Hash fields of a fenced key.
const (
	FieldEpoch = "e"
	FieldValue = "v"
)

// ErrStale is host.ErrStale: every *StaleError matches it with errors.Is.
var ErrStale = host.ErrStale

// StaleError is the error of an operation refused because the key was
// written or loaded under a newer epoch. It matches ErrStale (and so
// host.ErrStale).
type StaleError struct {
	Key     string
	Epoch   uint64 // the caller's epoch
	Current uint64 // the key's epoch, newer
}

// Error implements error.
func (e *StaleError) Error() string {
	return fmt.Sprintf("fence: %s: epoch %d is stale: the key was written under epoch %d", e.Key, e.Epoch, e.Current)
}

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// older is the Lua comparison of two decimal epochs without leading zeros,
// exact for any uint64 (Lua numbers are doubles).
const older = `
local function older(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
`

// Scripts: KEYS[1] the fenced hash; ARGV[1] the caller's epoch (decimal).
// Each answers {0, current epoch} when refused, {1, result} otherwise.
var (
	// ARGV[2] the value.
	scriptSet = rueidis.NewLuaScript(older + `
local cur = redis.call('HGET', KEYS[1], 'e')
if cur and older(ARGV[1], cur) then return {0, cur} end
redis.call('HSET', KEYS[1], 'e', ARGV[1], 'v', ARGV[2])
return {1, ARGV[1]}`)

	// ARGV[2] the increment.
	scriptIncr = rueidis.NewLuaScript(older + `
local cur = redis.call('HGET', KEYS[1], 'e')
if cur and older(ARGV[1], cur) then return {0, cur} end
local n = redis.call('HINCRBY', KEYS[1], 'v', ARGV[2])
redis.call('HSET', KEYS[1], 'e', ARGV[1])
return {1, n}`)

	scriptLoad = rueidis.NewLuaScript(older + `
local cur = redis.call('HGET', KEYS[1], 'e')
if cur and older(ARGV[1], cur) then return {0, cur} end
redis.call('HSET', KEYS[1], 'e', ARGV[1])
return {1, redis.call('HGET', KEYS[1], 'v')}`)
)

// run executes a fenced script and returns its result message, or a
// *StaleError when the key's epoch is newer than epoch.
func run(ctx context.Context, c rueidis.Client, s *rueidis.Lua, key string, epoch uint64, arg ...string) (rueidis.RedisMessage, error) {
	e := strconv.FormatUint(epoch, 10)
	res, err := s.Exec(ctx, c, []string{key}, append([]string{e}, arg...)).ToArray()
	if err != nil {
		return rueidis.RedisMessage{}, fmt.Errorf("fence: %s: %w", key, err)
	}
	if len(res) != 2 {
		return rueidis.RedisMessage{}, fmt.Errorf("fence: %s: script answered %d values; want 2", key, len(res))
	}
	ok, err := res[0].AsInt64()
	if err != nil {
		return rueidis.RedisMessage{}, fmt.Errorf("fence: %s: script status: %w", key, err)
	}
	if ok == 1 {
		return res[1], nil
	}
	cur, err := res[1].ToString()
	if err != nil {
		return rueidis.RedisMessage{}, fmt.Errorf("fence: %s: key epoch: %w", key, err)
	}
	current, err := strconv.ParseUint(cur, 10, 64)
	if err != nil {
		return rueidis.RedisMessage{}, fmt.Errorf("fence: %s: key epoch %q: %w", key, cur, err)
	}
	return rueidis.RedisMessage{}, &StaleError{Key: key, Epoch: epoch, Current: current}
}

// Set writes value to key under epoch, unless the key's epoch is newer: then
// it returns a *StaleError and leaves the key untouched.
func Set(ctx context.Context, c rueidis.Client, key string, epoch uint64, value string) error {
	_, err := run(ctx, c, scriptSet, key, epoch, value)
	return err
}

// Incr adds delta to the integer value of key (a missing value counts as 0)
// under epoch and returns the new value, unless the key's epoch is newer:
// then it returns a *StaleError and leaves the key untouched. A value that
// is not an integer is an error.
func Incr(ctx context.Context, c rueidis.Client, key string, epoch uint64, delta int64) (int64, error) {
	m, err := run(ctx, c, scriptIncr, key, epoch, strconv.FormatInt(delta, 10))
	if err != nil {
		return 0, err
	}
	return m.AsInt64()
}

// Load is the fenced read an activation starts with: it raises the key's
// epoch to epoch (recording it even on a key never written) and returns the
// value ("" when none), so that no operation of an older epoch changes the
// key afterwards. When the key's epoch is newer it returns a *StaleError.
func Load(ctx context.Context, c rueidis.Client, key string, epoch uint64) (string, error) {
	m, err := run(ctx, c, scriptLoad, key, epoch)
	if err != nil {
		return "", err
	}
	if m.IsNil() {
		return "", nil
	}
	return m.ToString()
}

// Get reads key's value and epoch without fencing (an operator's or a
// test's view); a key never written reads as ("", 0).
func Get(ctx context.Context, c rueidis.Client, key string) (value string, epoch uint64, err error) {
	vals, err := c.Do(ctx, c.B().Hmget().Key(key).Field(FieldValue, FieldEpoch).Build()).ToArray()
	if err != nil {
		return "", 0, fmt.Errorf("fence: %s: %w", key, err)
	}
	if len(vals) != 2 {
		return "", 0, fmt.Errorf("fence: %s: HMGET answered %d values; want 2", key, len(vals))
	}
	if !vals[0].IsNil() {
		if value, err = vals[0].ToString(); err != nil {
			return "", 0, fmt.Errorf("fence: %s: %w", key, err)
		}
	}
	if !vals[1].IsNil() {
		s, err := vals[1].ToString()
		if err == nil {
			epoch, err = strconv.ParseUint(s, 10, 64)
		}
		if err != nil {
			return "", 0, fmt.Errorf("fence: %s: epoch field: %w", key, err)
		}
	}
	return value, epoch, nil
}
