package wire

// Redis key schema. Every key is read and written only by single-key atomic
// commands or single-key Lua scripts, so no two keys ever need to share a
// Redis Cluster slot and no key carries a hash tag. Ids and namespaces pass
// CheckSegment, so they contain no '{' or '}' that could form an accidental
// hash tag.
//
//	pinned:s:<sessionId>      HASH   one worker session (fields below); PEXPIRE = the
//	                                 pinboard's lease, refreshed only by an owner-checked
//	                                 heartbeat script that never re-creates it
//	pinned:c:<clientId>       STRING current sessionId of a client; PEXPIRE = lease
//	pinned:a:<advertiseUrl>   STRING current sessionId at an advertise URL; PEXPIRE = lease
//	pinned:q:<clientId>       LIST   queued control messages (JSON wire.Message), taken
//	                                 all at once by a script (LRANGE + DEL)
//	pinned:n:<namespace>      ZSET   sessionId -> expiry (unix ms) of sessions serving it
//	pinned:w                  ZSET   sessionId -> expiry (unix ms) of every session
//	pinned:p:<namespace>/<id> STRING sessionId holding the placement (SET NX to claim,
//	                                 compare-and-set to replace, compare-and-delete to release)
//	pinned:o:<sessionId>      HASH   namespace -> number of placements claimed by the session
const (
	KeyPrefix          = "pinned:"
	KeyPrefixSession   = "pinned:s:"
	KeyPrefixClient    = "pinned:c:"
	KeyPrefixAdvertise = "pinned:a:"
	KeyPrefixQueue     = "pinned:q:"
	KeyPrefixNamespace = "pinned:n:"
	KeyWorkers         = "pinned:w"
	KeyPrefixPlacement = "pinned:p:"
	KeyPrefixOwned     = "pinned:o:"
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
)

// KeySession is the session hash key.
func KeySession(sessionID string) string { return KeyPrefixSession + sessionID }

// KeyClient is the key holding the client's current session id.
func KeyClient(clientID string) string { return KeyPrefixClient + clientID }

// KeyAdvertise is the key holding the current session id at an advertise URL.
func KeyAdvertise(url string) string { return KeyPrefixAdvertise + url }

// KeyQueue is the client's control-message queue.
func KeyQueue(clientID string) string { return KeyPrefixQueue + clientID }

// KeyNamespace is the sorted set of sessions serving a namespace ("/name").
func KeyNamespace(ns string) string { return KeyPrefixNamespace + ns }

// KeyOwned is the per-session placement count hash.
func KeyOwned(sessionID string) string { return KeyPrefixOwned + sessionID }

// PlacementName is the in-process name of a placement: "<namespace>/<id>",
// e.g. "/counter/abc". It is exactly the first two segments of the request
// path, so the proxy can look placements up by a sub-slice of the raw path.
func PlacementName(ns, id string) string { return ns + "/" + id }

// KeyPlacement is the placement key of (namespace, id).
func KeyPlacement(ns, id string) string { return KeyPrefixPlacement + ns + "/" + id }

// AppendKeyPlacement appends the placement key for a placement name
// ("/ns/id") to dst without allocating when dst has room.
func AppendKeyPlacement(dst []byte, name []byte) []byte {
	dst = append(dst, KeyPrefixPlacement...)
	return append(dst, name...)
}
