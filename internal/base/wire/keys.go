package wire

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
)

// Redis key schema. Every key is read and written only by single-key atomic
// commands or Lua scripts whose keys share one Redis Cluster slot, so the
// schema works unchanged on Redis Cluster. The one script that touches two
// keys (claim, replace and release of a placement, which also move its
// epoch counter) names a placement key and its epoch key, both hash-tagged
// with the placement name ("{<namespace>/<id>}"), so they always live in the
// same slot. On a single Redis node (never on a cluster) the claim script
// also adds the placement to the claiming session's index
// (pinned:o:<sessionId>, another slot), so that claim and index are one
// atomic step; on a cluster the index has its own script. Ids, namespaces,
// client ids and session ids pass CheckSegment,
// so they contain no '{' or '}' that could form an accidental hash tag (an
// advertise URL could, which only moves that one key to another slot: it is
// still touched alone), and a placement name starts with '/', so its hash tag
// is never empty.
// The keys of one alarm shard carry the hash tag {<shard>} and are touched
// together by multi-key scripts, all in that one slot.
//
//	pinned:s:<sessionId>      HASH   one worker session (fields below); PEXPIRE = the
//	                                 pinboard's lease, refreshed only by an owner-checked
//	                                 heartbeat script that never re-creates it
//	pinned:c:<clientId>       STRING current sessionId of a client; PEXPIRE = lease,
//	                                 refreshed by a heartbeat only while it still names
//	                                 that heartbeat's session
//	pinned:a:<advertiseUrl>   STRING current sessionId at an advertise URL; as pinned:c:
//	pinned:q:<clientId>       LIST   queued control messages (JSON wire.Message), taken
//	                                 all at once by a script (LRANGE + DEL); capped in
//	                                 length, PEXPIRE refreshed by every push
//	pinned:n:<namespace>      SET    sessionIds registered for the namespace (membership
//	                                 only: liveness is the session hash); emptied by the janitor
//	pinned:w                  ZSET   sessionId -> lease expiry (unix ms) of every session
//	                                 (ZADD XX GT on heartbeat); the janitor scans it by score
//	pinned:p:{<namespace>/<id>}
//	                          STRING the placement: "<epoch> <since> <sessionId>"
//	                                 (FormatPlacement): the activation epoch, when it was
//	                                 placed (unix ms) and the session holding it; no TTL
//	                                 (SET NX to claim, compare-and-set to replace,
//	                                 compare-and-delete to release or reap)
//	pinned:e:{<namespace>/<id>}
//	                          STRING the last epoch allocated to the placement (decimal);
//	                                 written by the claim and replace scripts and raised
//	                                 to the released epoch by release; PEXPIRE = the epoch
//	                                 retention (a guard against the Redis host's clock
//	                                 stepping back: see NextEpoch)
//	pinned:o:<sessionId>      HASH   the session's placement index: field "<namespace>/<id>"
//	                                 -> "1" for every placement it may hold, and field
//	                                 "#<namespace>" -> how many of those are in namespace
//	                                 (written at registration for every namespace served);
//	                                 the janitor reads it to reap the session's placements
//	pinned:x:<nonceId>        STRING a used challenge: "<kind>:<tokenId>:<url or session>";
//	                                 SET NX PX (first use wins, refused afterwards); expires
//	                                 after the nonce TTL. nonceId is a digest of the
//	                                 challenge (NonceID), never the challenge itself
//	pinned:t:<tokenId>        ZSET   sessionId -> lease expiry (unix ms) of the sessions
//	                                 registered with one deployment token: the live-session
//	                                 cap per token; a reservation script drops expired
//	                                 members, counts and adds in one step
//	pinned:i:<iterationId>    SET    the placement names one GET /registry/instances
//	                                 listing has returned so far (and "" marking it
//	                                 started), so no page repeats what SCAN returns twice;
//	                                 PEXPIRE refreshed by every page, deleted by the last
//
// Alarms (protocol version 4), in AlarmShards shards; <s> is AlarmShard of
// the instance's placement name and <m> its AlarmMember "<ns>/<id>/<name>".
// Every script names all the keys it touches, all of one shard:
//
//	pinned:al:{<s>}:due       ZSET   <m> -> when it is due (unix ms); while a pinboard
//	                                 delivers it, the end of that pinboard's claim
//	pinned:al:{<s>}:rec       HASH   <m> -> the alarm (JSON wire.Alarm, without dueMs)
//	pinned:al:{<s>}:i:<ns>/<id> SET  names of the instance's alarms (listing, the
//	                                 per-instance cap)
//	pinned:al:{<s>}:dead      HASH   "<m>@<atMs>" -> a dead letter (JSON wire.DeadAlarm)
//	pinned:al:{<s>}:deadt     ZSET   "<m>@<atMs>" -> when it died; the oldest beyond
//	                                 the cap are dropped with their letters
const (
	KeyPrefix          = "pinned:"
	KeyPrefixSession   = "pinned:s:"
	KeyPrefixClient    = "pinned:c:"
	KeyPrefixAdvertise = "pinned:a:"
	KeyPrefixQueue     = "pinned:q:"
	KeyPrefixNamespace = "pinned:n:"
	KeyWorkers         = "pinned:w"
	KeyPrefixPlacement = "pinned:p:"
	KeyPrefixEpoch     = "pinned:e:"
	KeyPrefixOwned     = "pinned:o:"
	KeyPrefixNonce     = "pinned:x:"
	KeyPrefixToken     = "pinned:t:"
	KeyPrefixListing   = "pinned:i:"
)

// Fields of the session hash (pinned:s:<sessionId>).
const (
	FieldClientID      = "cid"
	FieldSecret        = "secret"
	FieldAdvertiseURL  = "url"
	FieldNamespaces    = "ns" // namespaces joined by ","
	FieldHeadroom      = "headroom"
	FieldDraining      = "draining" // "0" or "1"
	FieldDrainDeadline = "deadline" // unix ms, "0" = none
	FieldVerified      = "verified" // "0" or "1"
	FieldSuperseded    = "sup"      // "0" or "1"
	FieldRegisteredAt  = "reg"      // unix ms
	FieldLastHeartbeat = "hb"       // unix ms
	FieldExpiresAt     = "exp"      // unix ms
	FieldTokenID       = "tok"      // id of the deployment token it registered with ("" = none)
	FieldMaxBodyBytes  = "mb"       // the worker's request body limit in bytes ("0" or absent = not said)
)

// OwnedCountPrefix starts the count fields of the placement index
// (pinned:o:<sessionId>): "#/counter" -> number of indexed placements in
// "/counter". Placement fields start with '/', so the two never collide.
const OwnedCountPrefix = "#"

// KeySession is the session hash key.
func KeySession(sessionID string) string { return KeyPrefixSession + sessionID }

// KeyClient is the key holding the client's current session id.
func KeyClient(clientID string) string { return KeyPrefixClient + clientID }

// KeyAdvertise is the key holding the current session id at an advertise URL.
func KeyAdvertise(url string) string { return KeyPrefixAdvertise + url }

// KeyQueue is the client's control-message queue.
func KeyQueue(clientID string) string { return KeyPrefixQueue + clientID }

// KeyNamespace is the set of sessions registered for a namespace ("/name").
func KeyNamespace(ns string) string { return KeyPrefixNamespace + ns }

// KeyNonce is the key recording one used challenge; nonceID comes from
// NonceID.
func KeyNonce(nonceID string) string { return KeyPrefixNonce + nonceID }

// KeyToken is the set of sessions registered with one deployment token.
func KeyToken(tokenID string) string { return KeyPrefixToken + tokenID }

// KeyListing is the set of placement names a paged listing has returned.
func KeyListing(iterationID string) string { return KeyPrefixListing + iterationID }

// KeyOwned is the per-session placement index.
func KeyOwned(sessionID string) string { return KeyPrefixOwned + sessionID }

// PlacementName is the in-process name of a placement: "<namespace>/<id>",
// e.g. "/counter/abc". It is exactly the first two segments of the request
// path, so the proxy can look placements up by a sub-slice of the raw path.
func PlacementName(ns, id string) string { return ns + "/" + id }

// SplitPlacementName splits "<namespace>/<id>" into its namespace ("/name")
// and id. ok is false when name is not of that shape.
func SplitPlacementName(name string) (ns, id string, ok bool) {
	if len(name) < 4 || name[0] != '/' {
		return "", "", false
	}
	for i := 1; i < len(name); i++ {
		if name[i] == '/' {
			if i == 1 || i == len(name)-1 {
				return "", "", false
			}
			return name[:i], name[i+1:], true
		}
	}
	return "", "", false
}

// KeyPlacement is the placement key of (namespace, id):
// "pinned:p:{<namespace>/<id>}".
func KeyPlacement(ns, id string) string { return KeyPlacementName(PlacementName(ns, id)) }

// KeyPlacementName is the placement key of a placement name ("/ns/id").
func KeyPlacementName(name string) string { return KeyPrefixPlacement + "{" + name + "}" }

// KeyEpoch is the epoch counter of (namespace, id), in the same Redis
// Cluster slot as its placement key: "pinned:e:{<namespace>/<id>}".
func KeyEpoch(ns, id string) string { return KeyEpochName(PlacementName(ns, id)) }

// KeyEpochName is the epoch counter key of a placement name ("/ns/id").
func KeyEpochName(name string) string { return KeyPrefixEpoch + "{" + name + "}" }

// PlacementOfKey returns the placement name of a placement key (the inverse
// of KeyPlacementName), and false for any other key.
func PlacementOfKey(key string) (name string, ok bool) {
	if len(key) < len(KeyPrefixPlacement)+3 || key[:len(KeyPrefixPlacement)] != KeyPrefixPlacement ||
		key[len(KeyPrefixPlacement)] != '{' || key[len(key)-1] != '}' {
		return "", false
	}
	return key[len(KeyPrefixPlacement)+1 : len(key)-1], true
}

// AppendKeyPlacement appends the placement key for a placement name
// ("/ns/id") to dst without allocating when dst has room.
func AppendKeyPlacement(dst []byte, name []byte) []byte {
	dst = append(dst, KeyPrefixPlacement...)
	dst = append(dst, '{')
	dst = append(dst, name...)
	return append(dst, '}')
}

// NonceIDLen is the length of a NonceID: 22 base64url characters, 128 bits.
const NonceIDLen = 22

// NonceID is the id under which a used challenge is recorded
// (KeyNonce): the first 128 bits of its SHA-256, base64url. Hashing bounds
// the key length whatever the challenge holds and keeps its bytes (which
// could contain '{') out of the key, so the key never forms a hash tag.
func NonceID(challenge string) string {
	sum := sha256.Sum256([]byte(challenge))
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// KeyPrefixAlarms starts every alarm key.
const KeyPrefixAlarms = "pinned:al:"

// alarmShardPrefix is "pinned:al:{<shard>}:".
func alarmShardPrefix(shard int) string {
	return KeyPrefixAlarms + "{" + strconv.Itoa(shard) + "}:"
}

// KeyAlarmDue is the shard's sorted set of alarms by due time.
func KeyAlarmDue(shard int) string { return alarmShardPrefix(shard) + "due" }

// KeyAlarmRecords is the shard's hash of alarm records.
func KeyAlarmRecords(shard int) string { return alarmShardPrefix(shard) + "rec" }

// KeyAlarmIndex is the set of alarm names of one instance; it lives in the
// instance's shard, AlarmShard(PlacementName(ns, id)).
func KeyAlarmIndex(ns, id string) string {
	name := PlacementName(ns, id)
	return alarmShardPrefix(AlarmShard(name)) + "i:" + name
}

// KeyAlarmDead is the shard's hash of dead letters.
func KeyAlarmDead(shard int) string { return alarmShardPrefix(shard) + "dead" }

// KeyAlarmDeadTimes is the shard's sorted set of dead letters by time.
func KeyAlarmDeadTimes(shard int) string { return alarmShardPrefix(shard) + "deadt" }

// DeadAlarmKey is a dead letter's field in KeyAlarmDead: "<member>@<atMs>",
// so each dead occurrence of a repeating alarm keeps its own letter.
func DeadAlarmKey(member string, atMs int64) string {
	return member + "@" + strconv.FormatInt(atMs, 10)
}
