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
	Type       string `json:"type"`                 // MessageDrain or MessageWindDown
	DeadlineMs int64  `json:"deadlineMs,omitempty"` // unix ms; 0 = none
}

// Nack is the 409 body of a refused heartbeat: NackReregister or NackSuperseded.
type Nack struct {
	Nack string `json:"nack"`
}

// ReleaseRequest is the body of POST /registry/release. SessionID is
// optional: when set, the compare-and-delete is against that session (which
// must belong to ClientID), not the client's current one, so a release that
// arrives after a re-registration can only free the old session's placement.
type ReleaseRequest struct {
	ClientID  string `json:"clientId"`
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	SessionID string `json:"sessionId,omitempty"`
}

// ReleaseResponse is the 200 answer to a release. Released is false when the
// placement did not exist or belonged to another session (nothing changed).
type ReleaseResponse struct {
	Released bool `json:"released"`
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
