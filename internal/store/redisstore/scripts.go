package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// script is a single-key Lua script that can run alone (Exec: EVALSHA,
// falling back to EVAL) or as one command of a pipeline (call).
type script struct {
	*rueidis.Lua
	sha string
	src string
}

// call is one pipelined invocation of a script.
type call struct {
	s    *script
	keys []string
	args []string
}

func (s *script) with(keys []string, args ...string) call { return call{s, keys, args} }

// pipeline runs calls in one round trip, in order on a single node. A call
// that finds the script missing (NOSCRIPT, after a Redis restart) is re-run
// with Exec, which loads it.
func pipeline(ctx context.Context, c rueidis.Client, calls ...call) []rueidis.RedisResult {
	cmds := make(rueidis.Commands, len(calls))
	for i, x := range calls {
		cmds[i] = c.B().Evalsha().Sha1(x.s.sha).Numkeys(int64(len(x.keys))).Key(x.keys...).Arg(x.args...).Build()
	}
	res := c.DoMulti(ctx, cmds...)
	for i, r := range res {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
			res[i] = calls[i].s.Exec(ctx, c, calls[i].keys, calls[i].args)
		}
	}
	return res
}

// trackedAfter runs one script and then reads key with CLIENT CACHING YES
// and GET, all three in one round trip on one connection: Redis tracks key
// for this connection from the GET on (OPTIN: the flag applies to the next
// command only), so the caller is told of every later change and not of
// the script's own writes, and no other key the script touched is
// tracked. The GET's reply, not the script's, is what the caller may cache:
// it is the value tracking started from. A script that finds itself
// missing (NOSCRIPT) is sent again by EVAL in the same shape, never
// untracked. It returns the script's reply and the GET's.
func trackedAfter(ctx context.Context, c rueidis.Client, x call, key string) (script, get rueidis.RedisResult) {
	res := c.DoMulti(ctx,
		c.B().Evalsha().Sha1(x.s.sha).Numkeys(int64(len(x.keys))).Key(x.keys...).Arg(x.args...).Build(),
		c.B().ClientCaching().Yes().Build(),
		c.B().Get().Key(key).Build())
	if e, ok := rueidis.IsRedisErr(res[0].Error()); ok && e.IsNoScript() {
		res = c.DoMulti(ctx,
			c.B().Eval().Script(x.s.src).Numkeys(int64(len(x.keys))).Key(x.keys...).Arg(x.args...).Build(),
			c.B().ClientCaching().Yes().Build(),
			c.B().Get().Key(key).Build())
	}
	if err := res[1].Error(); err != nil {
		// Not tracked: the GET's answer must not be cached.
		return res[0], res[1]
	}
	return res[0], res[2]
}

// lua builds a script, substituting the session hash field names from wire
// (written {cid}, {sup}, ... in the source) so the key schema has one source
// of truth. Every script touches exactly KEYS[1], except the placement
// scripts, which also touch KEYS[2], the placement's epoch counter (same
// hash tag, same cluster slot), and scriptPlace on a single node, which
// also indexes the placement in the claiming session's index (KEYS[3]: a
// different slot, so never on a cluster).
func lua(src string) *script {
	r := strings.NewReplacer(
		"{cid}", wire.FieldClientID,
		"{url}", wire.FieldAdvertiseURL,
		"{tok}", wire.FieldTokenID,
		"{headroom}", wire.FieldHeadroom,
		"{draining}", wire.FieldDraining,
		"{deadline}", wire.FieldDrainDeadline,
		"{verified}", wire.FieldVerified,
		"{sup}", wire.FieldSuperseded,
		"{hb}", wire.FieldLastHeartbeat,
		"{exp}", wire.FieldExpiresAt,
		"{reg}", wire.FieldRegisteredAt,
	)
	src = r.Replace(src)
	sum := sha1.Sum([]byte(src))
	return &script{Lua: rueidis.NewLuaScript(src), sha: hex.EncodeToString(sum[:]), src: src}
}

// restartFence is the Lua prelude of the placement writes: the server's
// uptime (INFO server, whole seconds, rounded down) and whether it is below
// a fence given in seconds. The uptime is read by the script that writes, on
// the node that holds the key, so no restart can fall between the check and
// the write.
const restartFence = `
local function uptime()
  return tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
end
local function fenced(s)
  local f = tonumber(s)
  return f > 0 and uptime() < f
end
`

// placementFns is the Lua prelude of the placement scripts: the parts of a
// placement value (wire.FormatPlacement: "<epoch> <since> <session>") and
// the epoch allocation of wire.NextEpoch on Redis's clock: max(counter + 1,
// last + 1, TIME in microseconds), stored back in the counter with the
// epoch TTL. Lua numbers are doubles, exact for epochs below 2^53 (the
// microsecond clock reaches that in the year 2255).
const placementFns = `
local function holder(v)
  return string.match(v, '^%d+ %-?%d+ (.+)$')
end
local function epochOf(v)
  return tonumber(string.match(v, '^(%d+) '))
end
local function nextEpoch(counter, last, ttl)
  local c = tonumber(redis.call('GET', counter) or '0')
  local t = redis.call('TIME')
  local e = string.format('%.0f', math.max(c + 1, last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
  redis.call('SET', counter, e, 'PX', ttl)
  return e
end
`

// Status codes returned by scripts.
const (
	statusOK         = 0
	statusUnknown    = 1
	statusSuperseded = 2
)

var (
	// KEYS[1] session hash; ARGV[1] lease ms; ARGV[2..] field, value pairs.
	// Refuses (0) an existing hash: session ids are never reused.
	scriptRegister = lua(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)

	// KEYS[1] session hash; ARGV: lease ms, now ms, expiry ms, headroom,
	// draining, drain deadline, verified. Never creates the hash.
	// Returns {status} or {0, field, value, ...}.
	scriptHeartbeat = lua(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {1} end
if redis.call('HGET', KEYS[1], '{sup}') == '1' then return {2} end
redis.call('HSET', KEYS[1], '{headroom}', ARGV[4], '{draining}', ARGV[5], '{deadline}', ARGV[6], '{hb}', ARGV[2], '{exp}', ARGV[3])
if ARGV[7] == '1' then redis.call('HSET', KEYS[1], '{verified}', '1') end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
local r = redis.call('HGETALL', KEYS[1])
table.insert(r, 1, 0)
return r`)

	// The planted bug faults.BlindRenew (pinned_faults builds only): the
	// heartbeat as a blind write that re-creates a missing session.
	scriptHeartbeatBlind = lua(`
redis.call('HSET', KEYS[1], '{headroom}', ARGV[4], '{draining}', ARGV[5], '{deadline}', ARGV[6], '{hb}', ARGV[2], '{exp}', ARGV[3], '{verified}', '1')
redis.call('HSETNX', KEYS[1], '{reg}', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
local r = redis.call('HGETALL', KEYS[1])
table.insert(r, 1, 0)
return r`)

	// KEYS[1] session hash. Marks it superseded if it exists and is not yet;
	// returns 1 when it did. Keeps its TTL (HSET does not touch it).
	scriptSupersede = lua(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], '{sup}') == '1' then return 0 end
redis.call('HSET', KEYS[1], '{sup}', '1')
return 1`)

	// KEYS[1] client or URL pointer; ARGV[1] session id, ARGV[2] lease ms.
	// Extends the pointer only while it names the session.
	scriptRefreshPointer = lua(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0`)

	// KEYS[1] session hash. Deletes it and returns {cid, url, tok}, or {}
	// when it does not exist.
	scriptDeregister = lua(`
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local r = redis.call('HMGET', KEYS[1], '{cid}', '{url}', '{tok}')
redis.call('DEL', KEYS[1])
return r`)

	// KEYS[1] client or URL pointer; ARGV[1] session id. Deletes the
	// pointer only while it names the session.
	scriptDeletePointer = lua(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

	// KEYS[1] token set (ZSET session -> expiry ms); ARGV: now ms, expiry
	// ms, session id, max, lease ms. Drops expired members, then admits the
	// session if it is a member already or fewer than max are. Returns
	// {held, 1|0}.
	scriptReserveSlot = lua(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local n = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return {n, 1} end
if n >= tonumber(ARGV[4]) then return {n, 0} end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {n + 1, 1}`)

	// KEYS[1] queue. Takes every message at once.
	scriptTakeAll = lua(`
local m = redis.call('LRANGE', KEYS[1], 0, -1)
if #m > 0 then redis.call('DEL', KEYS[1]) end
return m`)

	// KEYS[1] queue; ARGV: message, max length, ttl ms.
	scriptPush = lua(`
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

	// KEYS[1] placement, KEYS[2] its epoch counter, KEYS[3] (on a single
	// node only) the claiming session's index; ARGV[1] session id, ARGV[2]
	// restart fence in seconds (0: none), ARGV[3] now (unix ms), ARGV[4]
	// epoch TTL ms, ARGV[5] placement name and ARGV[6] namespace count
	// field (the index entry). Lookup, or SET NX under a new epoch: returns
	// {1, placement} when it wrote the placement ("<epoch> <since>
	// <session>", and indexed it when given KEYS[3]), {0, placement} when
	// one existed (nothing written); refused with a PINNEDFENCE error while
	// the server is younger than the fence.
	scriptPlace = lua(restartFence + placementFns + `
local v = redis.call('GET', KEYS[1])
if v then return {0, v} end
if fenced(ARGV[2]) then return redis.error_reply('PINNEDFENCE ' .. uptime()) end
v = nextEpoch(KEYS[2], 0, ARGV[4]) .. ' ' .. ARGV[3] .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], v)
if KEYS[3] and redis.call('HSETNX', KEYS[3], ARGV[5], '1') == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[6], 1)
end
return {1, v}`)

	// KEYS[1] placement, KEYS[2] its epoch counter; ARGV[1] old, ARGV[2]
	// new, ARGV[3] restart fence in seconds, ARGV[4] now (unix ms), ARGV[5]
	// epoch TTL ms. Compare-and-set under a new epoch that returns the
	// placement afterwards ("" for none); refused like scriptPlace while the
	// server is too young.
	scriptReplace = lua(restartFence + placementFns + `
local v = redis.call('GET', KEYS[1])
if not v then return '' end
if holder(v) ~= ARGV[1] then return v end
if fenced(ARGV[3]) then return redis.error_reply('PINNEDFENCE ' .. uptime()) end
v = nextEpoch(KEYS[2], epochOf(v), ARGV[5]) .. ' ' .. ARGV[4] .. ' ' .. ARGV[2]
redis.call('SET', KEYS[1], v)
return v`)

	// The planted bugs faults.ClaimNoNX and faults.ReplaceNoCompare
	// (pinned_faults builds only): the placement writes of scriptPlace (as
	// claimApart runs it: no index key) and scriptReplace, same keys,
	// arguments, fence and epochs, without their check (claim without NX,
	// replace without the compare).
	scriptPlaceBlind = lua(restartFence + placementFns + `
if fenced(ARGV[2]) then return redis.error_reply('PINNEDFENCE ' .. uptime()) end
local v = redis.call('GET', KEYS[1])
local e = 0
if v then e = epochOf(v) end
v = nextEpoch(KEYS[2], e, ARGV[4]) .. ' ' .. ARGV[3] .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], v)
return {1, v}`)
	scriptReplaceBlind = lua(restartFence + placementFns + `
if fenced(ARGV[3]) then return redis.error_reply('PINNEDFENCE ' .. uptime()) end
local v = redis.call('GET', KEYS[1])
local e = 0
if v then e = epochOf(v) end
v = nextEpoch(KEYS[2], e, ARGV[5]) .. ' ' .. ARGV[4] .. ' ' .. ARGV[2]
redis.call('SET', KEYS[1], v)
return v`)

	// KEYS[1] placement, KEYS[2] its epoch counter; ARGV[1] old session,
	// ARGV[2] old epoch (decimal, as stored), ARGV[3] now (unix ms), ARGV[4]
	// epoch TTL ms. Compare-and-set from (session, epoch) to the same
	// session under a new epoch; returns the placement afterwards ("" for
	// none). Not fenced by the restart fence: the holder stays the same.
	scriptRenew = lua(placementFns + `
local v = redis.call('GET', KEYS[1])
if not v then return '' end
if holder(v) ~= ARGV[1] or string.match(v, '^(%d+) ') ~= ARGV[2] then return v end
v = nextEpoch(KEYS[2], epochOf(v), ARGV[4]) .. ' ' .. ARGV[3] .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], v)
return v`)

	// KEYS[1] placement, KEYS[2] its epoch counter; ARGV[1] session id,
	// ARGV[2] epoch TTL ms, ARGV[3] epoch (decimal; "0": any).
	// Compare-and-delete; the counter keeps (at least) the released epoch
	// for another TTL.
	scriptRelease = lua(placementFns + `
local v = redis.call('GET', KEYS[1])
if not v or holder(v) ~= ARGV[1] then return 0 end
if ARGV[3] ~= '0' and string.match(v, '^(%d+) ') ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[2], string.format('%.0f', math.max(c, epochOf(v))), 'PX', ARGV[2])
return 1`)

	// KEYS[1] index hash; ARGV[1] placement name, ARGV[2] count field.
	scriptIndexAdd = lua(`
if redis.call('HSETNX', KEYS[1], ARGV[1], '1') == 1 then redis.call('HINCRBY', KEYS[1], ARGV[2], 1) end
return 1`)

	// KEYS[1] index hash; ARGV[1] placement name, ARGV[2] count field.
	scriptIndexDel = lua(`
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then redis.call('HINCRBY', KEYS[1], ARGV[2], -1) end
return 1`)
)
