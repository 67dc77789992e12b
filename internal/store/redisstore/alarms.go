package redisstore

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// Alarm scripts. Each names every key it touches; all of them belong to
// one alarm shard and share its hash tag, so each script runs in one
// Cluster slot. The record compared by FinishAlarm is the whole stored
// string (it carries the alarm's Gen).
var (
	// KEYS: due, rec, index. ARGV: member, record, due ms, name, max.
	// Returns 0 when the instance is at its cap and name is new.
	scriptAlarmSet = lua(`
if redis.call('SISMEMBER', KEYS[3], ARGV[4]) == 0 and redis.call('SCARD', KEYS[3]) >= tonumber(ARGV[5]) then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[4])
return 1`)

	// KEYS: due, rec, index. ARGV: member, name. Returns 1 when it existed.
	scriptAlarmDelete = lua(`
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[2])
return redis.call('HDEL', KEYS[2], ARGV[1])`)

	// KEYS: index, rec, due. ARGV: member prefix "<ns>/<id>/". Returns
	// {record, due, record, due, ...}.
	scriptAlarmList = lua(`
local out = {}
for _, n in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local m = ARGV[1] .. n
  local r = redis.call('HGET', KEYS[2], m)
  if r then
    table.insert(out, r)
    table.insert(out, redis.call('ZSCORE', KEYS[3], m) or '0')
  end
end
return out`)

	// KEYS: due, rec. ARGV: now ms, claim end ms, max. Moves up to max due
	// members to the claim end, dropping members without a record.
	// Returns {next due or -1, member, record, member, record, ...}.
	scriptAlarmClaim = lua(`
local ms = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {'-1'}
if #ms > 0 then
  local recs = redis.call('HMGET', KEYS[2], unpack(ms))
  local claim = {}
  for i, m in ipairs(ms) do
    if recs[i] then
      table.insert(claim, ARGV[2])
      table.insert(claim, m)
      table.insert(out, m)
      table.insert(out, recs[i])
    else
      redis.call('ZREM', KEYS[1], m)
    end
  end
  if #claim > 0 then redis.call('ZADD', KEYS[1], unpack(claim)) end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[1] = first[2] end
return out`)

	// KEYS: due, rec, index, dead, dead times. ARGV: member, claimed
	// record, next record ('' = remove), next due ms, name, dead key ('' =
	// none), dead letter, dead at ms, max dead. Compare-and-set on the
	// record: returns 0 and writes nothing when it changed.
	scriptAlarmFinish = lua(`
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('SREM', KEYS[3], ARGV[5])
else
  if ARGV[3] ~= ARGV[2] then redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) end
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[4], ARGV[6], ARGV[7])
  redis.call('ZADD', KEYS[5], ARGV[8], ARGV[6])
  local extra = redis.call('ZCARD', KEYS[5]) - tonumber(ARGV[9])
  if extra > 0 then
    local old = redis.call('ZRANGE', KEYS[5], 0, extra - 1)
    redis.call('ZREMRANGEBYRANK', KEYS[5], 0, extra - 1)
    redis.call('HDEL', KEYS[4], unpack(old))
  end
end
return 1`)

	// KEYS: dead, dead times. ARGV: max. The newest max dead letters.
	scriptAlarmDead = lua(`
local ks = redis.call('ZREVRANGE', KEYS[2], 0, tonumber(ARGV[1]) - 1)
if #ks == 0 then return {} end
return redis.call('HMGET', KEYS[1], unpack(ks))`)
)

// errBadClaim is returned for a claim script answer of the wrong shape.
var errBadClaim = errors.New("redisstore: malformed alarm claim answer")

func (s *Store) alarmKeys(ns, id string) (shard int, due, rec, index string) {
	shard = wire.AlarmShard(wire.PlacementName(ns, id))
	return shard, wire.KeyAlarmDue(shard), wire.KeyAlarmRecords(shard), wire.KeyAlarmIndex(ns, id)
}

// SetAlarm implements store.Alarms: one script on the instance's shard.
func (s *Store) SetAlarm(ctx context.Context, ns, id string, a wire.Alarm, max int) error {
	c, err := s.get(ctx)
	if err != nil {
		return err
	}
	_, due, rec, index := s.alarmKeys(ns, id)
	ok, err := scriptAlarmSet.Exec(ctx, c, []string{due, rec, index},
		[]string{wire.AlarmMember(ns, id, a.Name), store.EncodeAlarm(a), i64(a.AtMs), a.Name, strconv.Itoa(max)}).AsInt64()
	if err != nil {
		return s.wrap(ctx, "set alarm", err)
	}
	if ok == 0 {
		return store.ErrTooManyAlarms
	}
	return nil
}

// DeleteAlarm implements store.Alarms.
func (s *Store) DeleteAlarm(ctx context.Context, ns, id, name string) (bool, error) {
	c, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	_, due, rec, index := s.alarmKeys(ns, id)
	n, err := scriptAlarmDelete.Exec(ctx, c, []string{due, rec, index}, []string{wire.AlarmMember(ns, id, name), name}).AsInt64()
	if err != nil {
		return false, s.wrap(ctx, "delete alarm", err)
	}
	return n == 1, nil
}

// ListAlarms implements store.Alarms.
func (s *Store) ListAlarms(ctx context.Context, ns, id string) ([]wire.Alarm, error) {
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	_, due, rec, index := s.alarmKeys(ns, id)
	vs, err := scriptAlarmList.Exec(ctx, c, []string{index, rec, due}, []string{wire.AlarmMember(ns, id, "")}).AsStrSlice()
	if err != nil {
		return nil, s.wrap(ctx, "list alarms", err)
	}
	out := make([]wire.Alarm, 0, len(vs)/2)
	for i := 0; i+1 < len(vs); i += 2 {
		a, err := store.DecodeAlarm(vs[i])
		if err != nil {
			return nil, err
		}
		if a.DueMs, err = strconv.ParseInt(vs[i+1], 10, 64); err != nil {
			return nil, errors.New("redisstore: malformed alarm due time " + strconv.Quote(vs[i+1]))
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b wire.Alarm) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// ClaimAlarms implements store.Alarms: one script per call, whatever max.
func (s *Store) ClaimAlarms(ctx context.Context, shard int, nowMs int64, claim time.Duration, max int) ([]store.ClaimedAlarm, int64, error) {
	c, err := s.get(ctx)
	if err != nil {
		return nil, 0, err
	}
	vs, err := scriptAlarmClaim.Exec(ctx, c, []string{wire.KeyAlarmDue(shard), wire.KeyAlarmRecords(shard)},
		[]string{i64(nowMs), i64(nowMs + claim.Milliseconds()), strconv.Itoa(max)}).AsStrSlice()
	if err != nil {
		return nil, 0, s.wrap(ctx, "claim alarms", err)
	}
	if len(vs)%2 != 1 {
		return nil, 0, errBadClaim
	}
	next, err := strconv.ParseFloat(vs[0], 64) // a score, as Redis prints it
	if err != nil {
		return nil, 0, errBadClaim
	}
	out := make([]store.ClaimedAlarm, 0, len(vs)/2)
	for i := 1; i+1 < len(vs); i += 2 {
		ns, id, _, ok := wire.SplitAlarmMember(vs[i])
		a, err := store.DecodeAlarm(vs[i+1])
		if !ok || err != nil {
			// Never written by pinned: leave it claimed, log nothing per
			// alarm (it comes back once per claim period).
			continue
		}
		out = append(out, store.ClaimedAlarm{Namespace: ns, ID: id, Alarm: a, Record: vs[i+1]})
	}
	return out, int64(next), nil
}

// FinishAlarm implements store.Alarms: one compare-and-set script.
func (s *Store) FinishAlarm(ctx context.Context, ca store.ClaimedAlarm, next *wire.Alarm, nextDueMs int64, dead *wire.DeadAlarm, maxDead int) (bool, error) {
	c, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	shard, due, rec, index := s.alarmKeys(ca.Namespace, ca.ID)
	m := wire.AlarmMember(ca.Namespace, ca.ID, ca.Alarm.Name)
	nextRec := ""
	if next != nil {
		nextRec = store.EncodeAlarm(*next)
	}
	deadKey, deadRec, deadAt := "", "", "0"
	if dead != nil {
		deadKey, deadRec, deadAt = wire.DeadAlarmKey(m, dead.Alarm.AtMs), store.EncodeDeadAlarm(*dead), i64(dead.DeadAtMs)
	}
	n, err := scriptAlarmFinish.Exec(ctx, c,
		[]string{due, rec, index, wire.KeyAlarmDead(shard), wire.KeyAlarmDeadTimes(shard)},
		[]string{m, ca.Record, nextRec, i64(nextDueMs), ca.Alarm.Name, deadKey, deadRec, deadAt, strconv.Itoa(max(maxDead, 0))}).AsInt64()
	if err != nil {
		return false, s.wrap(ctx, "finish alarm", err)
	}
	return n == 1, nil
}

// DeadAlarms implements store.Alarms: one script per shard, pipelined.
func (s *Store) DeadAlarms(ctx context.Context, max int) ([]wire.DeadAlarm, error) {
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	calls := make([]call, wire.AlarmShards)
	for i := range calls {
		calls[i] = scriptAlarmDead.with([]string{wire.KeyAlarmDead(i), wire.KeyAlarmDeadTimes(i)}, strconv.Itoa(max))
	}
	var out []wire.DeadAlarm
	for _, r := range pipeline(ctx, c, calls...) {
		vs, err := r.ToArray()
		if err != nil {
			return nil, s.wrap(ctx, "dead alarms", err)
		}
		for _, v := range vs {
			str, err := v.ToString()
			if rueidis.IsRedisNil(err) {
				continue // a time without its letter: only a hand-edited shard has one
			}
			if err != nil {
				return nil, s.wrap(ctx, "dead alarms", err)
			}
			d, err := store.DecodeDeadAlarm(str)
			if err != nil {
				return nil, err
			}
			out = append(out, d)
		}
	}
	return store.NewestDeadAlarms(out, max), nil
}
