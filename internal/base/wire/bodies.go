package wire

// RegisterRequest is the body of POST /registry/register.
type RegisterRequest struct {
	ClientID       string   `json:"clientId"`
	Secret         string   `json:"secret"`
	Namespaces     []string `json:"namespaces"`
	AdvertiseURL   string   `json:"advertiseUrl"`
	Headroom       int      `json:"headroom"`
	Draining       bool     `json:"draining"`
	Challenge      string   `json:"challenge"`
	ChallengeValue string   `json:"challengeValue"`
	// MaxBodyBytes is the largest request body the worker's hosts accept
	// (the smallest host.Config.MaxRequestBodySize among them); the
	// pinboard refuses a larger body with 413 before forwarding a byte of
	// it. 0 (an older worker): not said; the pinboard applies its own limit
	// only. It is fixed for the session: hosts attach before the worker
	// registers and their limits never change, so heartbeats do not carry it.
	MaxBodyBytes int64 `json:"maxBodyBytes,omitempty"`
}

// RegisterResponse is the 200 answer to a registration.
type RegisterResponse struct {
	SessionID   string `json:"sessionId"`
	ExpiresInMs int64  `json:"expiresInMs"`
}

// HeartbeatRequest is the body of POST /registry/heartbeat. Challenge and
// ChallengeValue are both set or both empty (one without the other is a 400).
type HeartbeatRequest struct {
	SessionID      string `json:"sessionId"`
	Headroom       int    `json:"headroom"`
	Draining       bool   `json:"draining"`
	DrainDeadline  int64  `json:"drainDeadline,omitempty"` // unix ms; 0 = none
	Challenge      string `json:"challenge,omitempty"`
	ChallengeValue string `json:"challengeValue,omitempty"`
}

// HeartbeatResponse is the 200 ack to a heartbeat.
type HeartbeatResponse struct {
	ExpiresInMs int64     `json:"expiresInMs"`
	Messages    []Message `json:"messages,omitempty"`
	// Reregister is true when the heartbeat carried no challenge pair and the
	// session has not been verified.
	Reregister bool `json:"reregister,omitempty"`
}

// Message is a control message queued by POST /registry/push and delivered
// exactly once in a heartbeat ack.
type Message struct {
	Type       string `json:"type"`                 // MessageDrain, MessageWindDown or MessageEvict
	DeadlineMs int64  `json:"deadlineMs,omitempty"` // unix ms; 0 = none
	// Namespace ("/name") and ID name the instance of a MessageEvict.
	Namespace string `json:"namespace,omitempty"`
	ID        string `json:"id,omitempty"`
}

// Nack is the 409 body of a refused heartbeat: NackReregister or NackSuperseded.
type Nack struct {
	Nack string `json:"nack"`
}

// ReleaseRequest is the body of POST /registry/release. SessionID is
// optional: when set, the compare-and-delete is against that session (which
// must belong to ClientID), not the client's current one, so a release that
// arrives after a re-registration can only free the old session's placement.
// Epoch is optional too: when set (the epoch of the instance that closed),
// only a placement of that epoch is deleted, so that a release arriving
// late never deletes a newer placement of the id on the same session.
type ReleaseRequest struct {
	ClientID  string `json:"clientId"`
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	SessionID string `json:"sessionId,omitempty"`
	Epoch     uint64 `json:"epoch,omitempty"`
}

// ReleaseResponse is the 200 answer to a release. Released is false when the
// placement did not exist or belonged to another session (nothing changed).
type ReleaseResponse struct {
	Released bool `json:"released"`
}

// ReleasesRequest is the body of POST /registry/releases: the placements of
// instances that closed, all activated under SessionID (optional, as in
// [ReleaseRequest]) in Namespace, at most [MaxReleaseBatch] of them. Each
// is freed as one [ReleaseRequest] would free it; the call saves a round
// trip per instance when many close at once (a drain, a shutdown).
type ReleasesRequest struct {
	ClientID  string         `json:"clientId"`
	Namespace string         `json:"namespace"`
	SessionID string         `json:"sessionId,omitempty"`
	Releases  []ReleasedItem `json:"releases"`
}

// ReleasedItem is one instance of a [ReleasesRequest]: its id and the
// epoch it was activated under (0: any).
type ReleasedItem struct {
	ID    string `json:"id"`
	Epoch uint64 `json:"epoch,omitempty"`
}

// ReleasesResponse is the 200 answer to POST /registry/releases: one
// result per release, in the request's order.
type ReleasesResponse struct {
	Results []ReleaseResult `json:"results"`
}

// ReleaseResult is the outcome of one release of a batch. Status is 0 when
// it was done (Released as in [ReleaseResponse]); otherwise the status a
// [ReleaseRequest] of that item alone would have been answered (400 for a
// malformed id, 503 when the store failed: retry), with Error and Field as
// in [Error].
type ReleaseResult struct {
	Released bool   `json:"released,omitempty"`
	Status   int    `json:"status,omitempty"`
	Error    string `json:"error,omitempty"`
	Field    string `json:"field,omitempty"`
}

// DeregisterRequest is the body of POST /registry/deregister: the worker
// ends its own session at once (the last step of a graceful shutdown).
type DeregisterRequest struct {
	SessionID string `json:"sessionId"`
}

// DeregisterResponse is the 200 answer to a deregistration. Deregistered is
// false when the session had already ended (nothing changed).
type DeregisterResponse struct {
	Deregistered bool `json:"deregistered"`
}

// PushRequest is the body of POST /registry/push (answered 202).
type PushRequest struct {
	ClientID   string `json:"clientId"`
	Type       string `json:"type"`
	DeadlineMs int64  `json:"deadlineMs,omitempty"`
}

// ChallengeResponse is the worker's answer to GET /_pinned/challenge.
type ChallengeResponse struct {
	Value string `json:"value"`
}

// Error is the JSON body of every 4xx/5xx that pinned itself produces.
// Field names the offending request field when there is one.
type Error struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// WorkerInfo describes one live worker session in GET /registry/workers and
// GET /registry/overview. Times are unix milliseconds.
type WorkerInfo struct {
	SessionID       string         `json:"sessionId"`
	ClientID        string         `json:"clientId"`
	AdvertiseURL    string         `json:"advertiseUrl"`
	Namespaces      []string       `json:"namespaces"`
	Headroom        int            `json:"headroom"`
	Draining        bool           `json:"draining"`
	DrainDeadline   int64          `json:"drainDeadline,omitempty"`
	Verified        bool           `json:"verified"`
	Superseded      bool           `json:"superseded,omitempty"`
	RegisteredAtMs  int64          `json:"registeredAtMs"`
	LastHeartbeatMs int64          `json:"lastHeartbeatMs"`
	ExpiresAtMs     int64          `json:"expiresAtMs"`
	Placements      map[string]int `json:"placements"` // per namespace
	// MaxBodyBytes is the request body limit the worker registered with
	// (RegisterRequest.MaxBodyBytes); omitted when it said none.
	MaxBodyBytes int64 `json:"maxBodyBytes,omitempty"`
}

// WorkersResponse is the body of GET /registry/workers.
type WorkersResponse struct {
	Workers []WorkerInfo `json:"workers"`
}

// NamespaceOverview summarises one namespace in GET /registry/overview.
type NamespaceOverview struct {
	Workers         int `json:"workers"`         // live sessions serving it
	AvailableWorker int `json:"availableWorker"` // live, undrained, verified, headroom > 0
	Headroom        int `json:"headroom"`        // sum over live undrained sessions
	Placements      int `json:"placements"`
}

// OverviewResponse is the body of GET /registry/overview.
type OverviewResponse struct {
	ProtocolVersion int                          `json:"protocolVersion"`
	LeaseMs         int64                        `json:"leaseMs"`
	Sessions        int                          `json:"sessions"`
	Namespaces      map[string]NamespaceOverview `json:"namespaces"`
	Workers         []WorkerInfo                 `json:"workers"`
}

// Healthz is the body of GET /healthz (200 when OK, else 503).
type Healthz struct {
	OK    bool   `json:"ok"`
	Store string `json:"store"` // "ok" or the error reaching Redis
	// ShuttingDown is true once the pinboard has begun a graceful shutdown:
	// load balancers should stop sending it traffic.
	ShuttingDown bool `json:"shuttingDown,omitempty"`
}

// PushResponse is the 202 answer to a push.
type PushResponse struct {
	Queued bool `json:"queued"`
}

// PlacementInfo is the 200 answer to GET /registry/placements/{ns}/{id}:
// who holds the placement. ClientID and AdvertiseURL are empty, and Live
// false, when the holding session has ended (the proxy re-places the id on
// its next request). Epoch and Since (unix ms) are zero when the store does
// not record them.
type PlacementInfo struct {
	Namespace    string `json:"namespace"`
	ID           string `json:"id"`
	SessionID    string `json:"sessionId"`
	ClientID     string `json:"clientId"`
	AdvertiseURL string `json:"advertiseUrl"`
	Live         bool   `json:"live"`
	Epoch        uint64 `json:"epoch"`
	Since        int64  `json:"since"`
}

// EvictResponse is the 202 answer to DELETE /registry/placements/{ns}/{id}.
// Queued: an evict message waits for the holder's next heartbeat ack.
// Released: the holder's session had ended, so the placement was deleted
// at once (compare-and-delete on that session).
type EvictResponse struct {
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	SessionID string `json:"sessionId"`
	ClientID  string `json:"clientId,omitempty"`
	Queued    bool   `json:"queued"`
	Released  bool   `json:"released"`
}

// InstanceInfo is one placement in GET /registry/instances.
type InstanceInfo struct {
	ID        string `json:"id"`
	SessionID string `json:"sessionId"`
	ClientID  string `json:"clientId"` // "" when the holding session has ended
}

// InstancesResponse is one page of GET /registry/instances. Cursor is
// empty on the last page; otherwise pass it back for the next one (a page
// may be shorter than the limit, even empty, before the last).
type InstancesResponse struct {
	Namespace string         `json:"namespace"`
	Worker    string         `json:"worker,omitempty"`
	Instances []InstanceInfo `json:"instances"`
	Cursor    string         `json:"cursor"`
}

// HotID is one row of GET /registry/hot. Requests is an estimate that
// exceeds the true count by at most HotResponse.ErrorBound; PerSecond is
// Requests over the time the window covers; P99Ms is the upper bound of a
// histogram bucket a quarter of an octave wide (at most 25 % above the true
// p99); Holder is the session id that served the latest request.
type HotID struct {
	ID        string  `json:"id"`
	Requests  uint64  `json:"requests"`
	PerSecond float64 `json:"perSecond"`
	P99Ms     float64 `json:"p99Ms"`
	Bytes     uint64  `json:"bytes"`
	Holder    string  `json:"holder"`
}

// HotResponse is the body of GET /registry/hot: what this pinboard routed
// (each pinboard sees only its own traffic).
type HotResponse struct {
	Namespace     string  `json:"namespace"`
	WindowSeconds int     `json:"windowSeconds"`
	ErrorBound    uint64  `json:"errorBound"`
	IDs           []HotID `json:"ids"`
}

// HolderTraffic is one worker session's share of GET /registry/traffic.
type HolderTraffic struct {
	SessionID string  `json:"sessionId"`
	Requests  uint64  `json:"requests"`
	PerSecond float64 `json:"perSecond"`
}

// AnswerCount is one (status, reason) row of GET /registry/traffic.
// Reason is the X-Pinned-Reason (a Reason* value, "other" for one pinned
// does not define), or "" when neither pinned nor the worker named one.
type AnswerCount struct {
	Status int    `json:"status"`
	Reason string `json:"reason"`
	Count  uint64 `json:"count"`
}

// TrafficResponse is the body of GET /registry/traffic: this pinboard's
// last WindowSeconds of routed requests.
type TrafficResponse struct {
	WindowSeconds int             `json:"windowSeconds"`
	Requests      uint64          `json:"requests"`
	Holders       []HolderTraffic `json:"holders"`
	NotOK         []AnswerCount   `json:"notOk"`
}
