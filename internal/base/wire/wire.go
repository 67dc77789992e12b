package wire

// Version is the registry protocol version (see the package doc for its history).
const Version = 6

// Registry endpoints served by the pinboard.
const (
	PathRegister  = "/registry/register"
	PathHeartbeat = "/registry/heartbeat"
	PathRelease   = "/registry/release"
	// PathReleases frees many placements of one session in one call
	// (added 2026-12-05, a revision of version 6; see the protocol history
	// in the package doc).
	PathReleases = "/registry/releases"
	// PathDeregister ends a session at once (added 2026-12-02, second revision; see the
	// protocol history in the package doc).
	PathDeregister = "/registry/deregister"
	PathPush       = "/registry/push"
	PathWorkers    = "/registry/workers"
	PathOverview   = "/registry/overview"
	// PathPlacements is the prefix of GET and DELETE
	// /registry/placements/{namespace}/{id} (the namespace without its
	// leading slash): look a placement up, evict its instance.
	PathPlacements = "/registry/placements"
	// PathInstances pages through the placements of a namespace.
	PathInstances = "/registry/instances"
	// PathHot lists the ids this pinboard routed most in the last minute.
	PathHot = "/registry/hot"
	// PathTraffic summarises this pinboard's last minute of routed traffic:
	// requests per worker session, non-2xx answers by status and reason.
	PathTraffic = "/registry/traffic"
	PathHealthz = "/healthz"
)

// PathChallenge is served by every worker on its advertise URL; the pinboard
// fetches PathChallenge?challenge=<challenge> with HeaderProxySecret set.
const (
	PathChallenge  = "/_pinned/challenge"
	QueryChallenge = "challenge"
)

// Data-plane and registry header names. HTTP header names are
// case-insensitive; these are the spellings pinned sends.
const (
	// HeaderProxySecret carries the worker's secret on every proxied request
	// and on the challenge fetch.
	HeaderProxySecret = "X-Pinned-Proxy-Secret"
	// HeaderSession carries the session id of the placement a proxied request
	// was routed by: a fencing token the host checks against its current session.
	HeaderSession = "X-Pinned-Session"
	// HeaderEpoch carries the activation epoch of the placement a proxied
	// request was routed by, in decimal (ParseEpoch): a fencing token the host
	// compares with its live instance's epoch (see Epochs in the package doc).
	HeaderEpoch = "X-Pinned-Epoch"
	// HeaderReason says why pinned itself (not the application) answered a
	// 503 or 403; its values are the Reason* constants.
	HeaderReason = "X-Pinned-Reason"
	// HeaderRetryAfter is the standard Retry-After header (RFC 9110 §10.2.3),
	// carried by every 503 pinned produces.
	HeaderRetryAfter = "Retry-After"
)

// HeaderPrefix is the prefix of every pinned header; the proxy drops
// client-supplied headers with this prefix (case-insensitively).
const HeaderPrefix = "x-pinned-"

// Values of HeaderReason. The host produces the first seven; the proxy adds
// its own for answers it makes without reaching a host.
const (
	ReasonCapacity  = "capacity"  // host: max instances reached
	ReasonDraining  = "draining"  // host: draining, no new activations
	ReasonClosing   = "closing"   // host: instance closing or release in flight; re-resolve
	ReasonLease     = "lease"     // host: no valid lease, or not the current session
	ReasonForbidden = "forbidden" // host: wrong or missing proxy secret (403)
	// ReasonAborted: the instance was aborted while this request's handler
	// ran, so the request may have had effects. Unlike the reasons above it
	// does not say "the request never reached an instance": the proxy passes
	// it to the client and never retries it.
	ReasonAborted = "aborted"
	// ReasonStale: the request's HeaderEpoch is older than the epoch of the
	// instance live for its id, or no instance is live and one of the id
	// closed on this worker under that epoch or a newer one (either way it
	// was routed by a placement that has since moved or been released), or
	// the application found its own activation stale; the request had no
	// effect. The proxy re-resolves the placement and may send it again.
	ReasonStale = "stale"

	ReasonNoWorker = "no_worker" // proxy: no live, undrained worker serves the namespace
	// ReasonUnknownNamespace (proxy, 404): no worker has served the
	// namespace recently; unlike no_worker it is not worth retrying.
	ReasonUnknownNamespace = "unknown_namespace"
	ReasonUnreachable      = "unreachable" // proxy: worker could not be reached; request provably not sent
	ReasonOverloaded       = "overloaded"  // proxy: per-worker queue full or queue timeout
	ReasonStore            = "store"       // proxy: the directory (Redis) could not be read; host: an alarm call found it unavailable
)

// Registry NACK values, sent as 409 {"nack": ...}.
const (
	NackReregister = "reregister" // unknown session: abort local instances, register fresh
	NackSuperseded = "superseded" // another session took over: stop for good
)

// Control message types delivered in heartbeat acks.
const (
	MessageDrain    = "drain"
	MessageWindDown = "wind_down"
	// MessageEvict asks the worker to close the instance (Message.Namespace,
	// Message.ID): abort semantics (its context and tasks are cancelled,
	// teardown runs once), then the placement is released, so the next
	// request activates a fresh instance.
	MessageEvict = "evict"
)

// Limits shared by both ends of the registry protocol.
const (
	// MaxBodyBytes bounds every registry request body (413 beyond).
	MaxBodyBytes = 64 << 10
	// MaxChallengeResponseBytes bounds the challenge response the pinboard reads.
	MaxChallengeResponseBytes = 4 << 10
	// DefaultLeaseMs is the pinboard's default lease (expiresInMs).
	DefaultLeaseMs = 10_000
	// MaxReleaseBatch bounds the releases of one POST /registry/releases
	// (400 beyond); the body's MaxBodyBytes bounds it too.
	MaxReleaseBatch = 1024
	// MinChallengeLen is the shortest challenge the pinboard accepts: 22
	// bytes, which is what 128 random bits take in base64url (the worker
	// sends 26 base32 characters, 130 bits). It cannot prove entropy; it
	// refuses challenges too short to carry it.
	MinChallengeLen = 22
)
