package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Limits on registry body fields. Each has a name and a reason; bodies as a
// whole are bounded by wire.MaxBodyBytes.
const (
	// MaxClientIDLen bounds clientId (it becomes part of Redis keys).
	MaxClientIDLen = 128
	// MaxSecretLen bounds the worker secret (it travels in a header).
	MaxSecretLen = 256
	// MaxChallengeLen bounds the challenge (it travels in a query string).
	MaxChallengeLen = 256
	// MaxChallengeValueLen bounds challengeValue.
	MaxChallengeValueLen = 1024
	// MaxAdvertiseURLLen bounds advertiseUrl.
	MaxAdvertiseURLLen = 512
	// DefaultMaxNamespaces is the default Config.MaxNamespaces.
	DefaultMaxNamespaces = 64
)

// badRequest is a 400 (or 413) with the offending field.
type badRequest struct {
	status int
	field  string
	msg    string
}

func (e *badRequest) Error() string {
	if e.field == "" {
		return e.msg
	}
	return e.field + ": " + e.msg
}

func bad(field, format string, args ...any) *badRequest {
	return &badRequest{status: fasthttp.StatusBadRequest, field: field, msg: fmt.Sprintf(format, args...)}
}

var errTooLarge = &badRequest{status: fasthttp.StatusRequestEntityTooLarge, msg: fmt.Sprintf("body larger than %d bytes", wire.MaxBodyBytes)}

// readBody returns the request body, refusing more than max bytes with a
// 413 before reading them when Content-Length says so. With the server's
// StreamRequestBody on (the proxy wants it), a large body arrives as a
// stream and is read through a limit.
func readBody(ctx *fasthttp.RequestCtx, max int) ([]byte, *badRequest) {
	if cl := ctx.Request.Header.ContentLength(); cl > max {
		return nil, errTooLarge
	}
	if ctx.Request.IsBodyStream() {
		b, err := io.ReadAll(io.LimitReader(ctx.RequestBodyStream(), int64(max)+1))
		if err != nil {
			return nil, bad("", "cannot read body: %v", err)
		}
		if len(b) > max {
			return nil, errTooLarge
		}
		return b, nil
	}
	b := ctx.PostBody()
	if len(b) > max {
		return nil, errTooLarge
	}
	return b, nil
}

// decode unmarshals a JSON object, naming the field in type errors. Unknown
// fields are ignored (the protocol's forward-compatibility rule).
func decode(body []byte, v any) *badRequest {
	if len(body) == 0 {
		return bad("", "empty body; want a JSON object")
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		if te.Field == "" {
			return bad("", "body must be a JSON object, not %s", te.Value)
		}
		return bad(te.Field, "must be %s, not %s", jsonKind(te.Type.Kind().String()), te.Value)
	case errors.As(err, &se):
		return bad("", "malformed JSON at byte %d: %v", se.Offset, se)
	}
	return bad("", "malformed JSON: %v", err)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	case "int", "int64":
		return "an integer"
	}
	return "a " + goKind
}

func checkClientID(field, v string) *badRequest {
	if v == "" {
		return bad(field, "is required")
	}
	if e := wire.CheckSegment([]byte(v), MaxClientIDLen); e != wire.SegmentOK {
		return bad(field, "%v", e)
	}
	return nil
}

// checkSessionID validates a required sessionId field.
func checkSessionID(v string) *badRequest {
	if v == "" {
		return bad("sessionId", "is required")
	}
	if e := wire.CheckSessionID(v); e != wire.SegmentOK {
		return bad("sessionId", "%v", e)
	}
	return nil
}

// headerSafe reports whether v can travel as an HTTP header value as is:
// visible ASCII only.
func headerSafe(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return false
		}
	}
	return true
}

// checkPair enforces the both-or-neither rule for a challenge pair.
func checkPair(challenge, value string) *badRequest {
	switch {
	case challenge == "" && value == "":
		return nil
	case challenge == "":
		return bad("challenge", "is required with challengeValue (both or neither)")
	case value == "":
		return bad("challengeValue", "is required with challenge (both or neither)")
	case len(challenge) < wire.MinChallengeLen:
		return bad("challenge", "shorter than %d bytes: send at least 128 random bits (e.g. crypto/rand.Text())", wire.MinChallengeLen)
	case len(challenge) > MaxChallengeLen:
		return bad("challenge", "longer than %d bytes", MaxChallengeLen)
	case len(value) > MaxChallengeValueLen:
		return bad("challengeValue", "longer than %d bytes", MaxChallengeValueLen)
	}
	return nil
}

// parseRegister decodes and validates a registration. advertiseUrl is
// returned in canonical form; namespaces are deduplicated in order.
func parseRegister(body []byte, maxNamespaces int, requirePair bool) (wire.RegisterRequest, *badRequest) {
	var r wire.RegisterRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	if e := checkClientID("clientId", r.ClientID); e != nil {
		return r, e
	}
	switch {
	case r.Secret == "":
		return r, bad("secret", "is required")
	case len(r.Secret) > MaxSecretLen:
		return r, bad("secret", "longer than %d bytes", MaxSecretLen)
	case !headerSafe(r.Secret):
		return r, bad("secret", "must be visible ASCII (it is sent as a header)")
	}
	if len(r.Namespaces) == 0 {
		return r, bad("namespaces", "is required (at least one \"/name\")")
	}
	if len(r.Namespaces) > maxNamespaces {
		return r, bad("namespaces", "more than %d namespaces", maxNamespaces)
	}
	seen := make(map[string]bool, len(r.Namespaces))
	nss := r.Namespaces[:0]
	for _, ns := range r.Namespaces {
		if e := wire.CheckNamespace(ns); e != wire.SegmentOK {
			return r, bad("namespaces", "%q: %v", ns, e)
		}
		if wire.IsReservedNamespace(ns) {
			return r, bad("namespaces", "%q is reserved by the pinboard", ns)
		}
		if !seen[ns] {
			seen[ns] = true
			nss = append(nss, ns)
		}
	}
	r.Namespaces = nss
	canon, err := canonicalAdvertiseURL(r.AdvertiseURL)
	if err != nil {
		return r, bad("advertiseUrl", "%v", err)
	}
	r.AdvertiseURL = canon
	if r.Headroom < 0 {
		return r, bad("headroom", "must not be negative")
	}
	if r.MaxBodyBytes < 0 {
		return r, bad("maxBodyBytes", "must not be negative (bytes; 0 or absent: not said)")
	}
	if e := checkPair(r.Challenge, r.ChallengeValue); e != nil {
		return r, e
	}
	if requirePair && r.Challenge == "" {
		return r, bad("challenge", "is required: the pinboard verifies every registration")
	}
	return r, nil
}

func parseHeartbeat(body []byte) (wire.HeartbeatRequest, *badRequest) {
	var r wire.HeartbeatRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	if e := checkSessionID(r.SessionID); e != nil {
		return r, e
	}
	if r.Headroom < 0 {
		return r, bad("headroom", "must not be negative")
	}
	if r.DrainDeadline < 0 {
		return r, bad("drainDeadline", "must not be negative (unix milliseconds)")
	}
	return r, checkPair(r.Challenge, r.ChallengeValue)
}

func parseRelease(body []byte) (wire.ReleaseRequest, *badRequest) {
	var r wire.ReleaseRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	if e := checkReleaseOf(r.ClientID, r.Namespace, r.SessionID); e != nil {
		return r, e
	}
	return r, checkReleasedID(r.ID)
}

// checkReleaseOf checks the fields a release and a batch of releases share:
// the client, the namespace and the optional session (without it, the
// client's current session).
func checkReleaseOf(clientID, namespace, sessionID string) *badRequest {
	if e := checkClientID("clientId", clientID); e != nil {
		return e
	}
	if e := wire.CheckNamespace(namespace); e != wire.SegmentOK {
		return bad("namespace", "%v", e)
	}
	if sessionID != "" {
		return checkSessionID(sessionID)
	}
	return nil
}

func parseDeregister(body []byte) (wire.DeregisterRequest, *badRequest) {
	var r wire.DeregisterRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	return r, checkSessionID(r.SessionID)
}

func parsePush(body []byte) (wire.PushRequest, *badRequest) {
	var r wire.PushRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	if e := checkClientID("clientId", r.ClientID); e != nil {
		return r, e
	}
	if r.Type != wire.MessageDrain && r.Type != wire.MessageWindDown {
		return r, bad("type", "must be %q or %q", wire.MessageDrain, wire.MessageWindDown)
	}
	if r.DeadlineMs < 0 {
		return r, bad("deadlineMs", "must not be negative (unix milliseconds)")
	}
	return r, nil
}

// canonicalAdvertiseURL accepts scheme://host[:port] (http or https, an
// optional trailing slash, nothing else; the host a DNS name or an IP
// literal in canonical form, see checkHost) and returns it with the scheme
// and host lower-cased, IP literals in their canonical spelling, no default
// port, no trailing dot or slash, so that one worker address always maps to
// one Redis key.
func canonicalAdvertiseURL(s string) (string, error) {
	switch {
	case s == "":
		return "", errors.New("is required")
	case len(s) > MaxAdvertiseURLLen:
		return "", fmt.Errorf("longer than %d bytes", MaxAdvertiseURLLen)
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", errors.New("is not a URL")
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme != "http" && scheme != "https":
		return "", errors.New("scheme must be http or https")
	case u.User != nil:
		return "", errors.New("must not carry userinfo")
	case u.Opaque != "" || u.Host == "":
		return "", errors.New("must be scheme://host[:port]")
	case u.Path != "" && u.Path != "/":
		return "", errors.New("must not have a path (the pinboard appends /<namespace>/<id>)")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(s, "?#"):
		return "", errors.New("must not have a query or fragment")
	}
	if strings.ContainsAny(u.Host, "{}%") {
		return "", errors.New("has an invalid host")
	}
	bracketed := strings.HasPrefix(u.Host, "[")
	host := strings.ToLower(u.Hostname())
	if !bracketed {
		host = strings.TrimSuffix(host, ".") // one FQDN, one key
	}
	if host == "" {
		return "", errors.New("has an empty host")
	}
	host, err = checkHost(host)
	if err != nil {
		return "", err
	}
	if ip, e := netip.ParseAddr(host); e == nil && ip.Is6() {
		if !bracketed {
			return "", errors.New("IPv6 hosts must be in brackets")
		}
		host = "[" + host + "]"
	} else if bracketed {
		return "", errors.New("brackets must hold an IPv6 address")
	}
	port := ""
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return "", errors.New("has an invalid port")
		}
		if !(scheme == "http" && n == 80 || scheme == "https" && n == 443) {
			port = ":" + strconv.Itoa(n)
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "", errors.New("has an empty port")
	}
	return scheme + "://" + host + port, nil
}

// hostPort returns the dial address and whether TLS is used for a
// canonical advertise URL.
func hostPort(canon string) (addr string, tls bool) {
	u, _ := url.Parse(canon)
	tls = u.Scheme == "https"
	port := u.Port()
	if port == "" {
		port = "80"
		if tls {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port), tls
}
