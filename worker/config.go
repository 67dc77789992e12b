package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// Defaults of the Config fields. Each applies when its field is zero.
const (
	// DefaultHeartbeatInterval is Config.HeartbeatInterval: the cadence of
	// heartbeats while every heartbeat is acknowledged.
	DefaultHeartbeatInterval = 3 * time.Second
	// DefaultLeaseBuffer is Config.LeaseBuffer: the worker stops serving this
	// long before the pinboard may re-place its instances.
	DefaultLeaseBuffer = 5 * time.Second
	// DefaultRetryInterval is Config.RetryInterval: a heartbeat that is not
	// acknowledged within this time (failed, lost or slow) is followed by
	// another one, until an ack arrives or the lease is lost.
	DefaultRetryInterval = 500 * time.Millisecond
	// DefaultRequestTimeout is Config.RequestTimeout: the bound on one call
	// to the pinboard, dial and body included. A registration or heartbeat
	// includes the pinboard's own fetch of the challenge endpoint.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultBackoffBase is Config.BackoffBase: the ceiling of the first
	// registration retry delay, doubled per failure.
	DefaultBackoffBase = 500 * time.Millisecond
	// DefaultBackoffMax is Config.BackoffMax: the cap of the registration
	// retry delay ceiling.
	DefaultBackoffMax = 30 * time.Second
	// DefaultReleaseAttempts is Config.ReleaseAttempts: calls made by one
	// Release before it gives up.
	DefaultReleaseAttempts = 3
	// DefaultReleaseBackoff is Config.ReleaseBackoff: the wait after the
	// first failed release call, doubled after each further failure.
	DefaultReleaseBackoff = 200 * time.Millisecond
	// DefaultReleaseBatch is Config.ReleaseBatch: the most the pinboard
	// takes in one call.
	DefaultReleaseBatch = wire.MaxReleaseBatch
	// DefaultShutdownPollInterval is Config.ShutdownPollInterval: how often
	// Shutdown closes idle instances and checks whether the hosts are empty.
	DefaultShutdownPollInterval = 100 * time.Millisecond
	// DefaultMaxConns is Config.MaxConns: connections to the pinboard.
	DefaultMaxConns = 64
	// DefaultLease is the lease assumed by New when validating the timing
	// configuration, before the pinboard has said what its lease is (the
	// pinboard's default, wire.DefaultLeaseMs).
	DefaultLease = wire.DefaultLeaseMs * time.Millisecond
)

// MinHeartbeatAttempts is the least number of heartbeat attempts that must
// fit between the first heartbeat after an ack and the local deadline (see
// CheckTiming). With fewer, one lost packet and one slow round trip cost the
// lease.
const MinHeartbeatAttempts = 3

// maxInflightHeartbeats bounds the heartbeat calls in flight at once (a slow
// or unreachable pinboard with fast retries would otherwise pile them up).
const maxInflightHeartbeats = 8

// Config configures a Worker. PinboardURL, AdvertiseURL and Token are
// required; every other field has a documented default for its zero value.
type Config struct {
	// PinboardURL is the base URL of the pinboard's registry, e.g.
	// "http://pinboard.internal:8080". http or https; a path prefix is kept.
	PinboardURL string
	// AdvertiseURL is where the pinboard reaches THIS process: it fetches
	// AdvertiseURL + "/_pinned/challenge" to verify a registration and proxies
	// data-plane requests to AdvertiseURL + "/<namespace>/<id>...". It must
	// address this process uniquely. http or https, no path, query or userinfo.
	AdvertiseURL string
	// Token is the deployment token shared with the pinboard, sent as
	// "Authorization: Bearer <Token>". It is never logged.
	Token string
	// TokenSource names where this process's operator sets Token, for the
	// errors logged and returned when the pinboard refuses it (401): a
	// binary passes the variable it reads the token from (the counter demo:
	// "PINNED_TOKEN"). Empty means "Config.Token".
	TokenSource string

	// Logger receives the worker's events, tagged logger=pinned.worker.
	// nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives the worker's metrics. nil means a new set, available
	// from Worker.Metrics. The names are fixed, so one set holds at most one
	// worker (a second one panics in New).
	Metrics *metrics.Set
	// Clock measures leases and drives every timer. nil means clock.Real.
	Clock clock.Clock

	// HeartbeatInterval is the heartbeat cadence. Default
	// DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// LeaseBuffer is the local safety margin: the worker stops serving and
	// aborts its instances at (send time of the last acked heartbeat) +
	// lease − LeaseBuffer. It must be shorter than the lease and should cover
	// the clock-rate difference between this machine and Redis. Default
	// DefaultLeaseBuffer.
	LeaseBuffer time.Duration
	// RetryInterval is the quick resend interval of an unacknowledged
	// heartbeat. Default DefaultRetryInterval.
	RetryInterval time.Duration
	// RequestTimeout bounds each call to the pinboard. Default
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// BackoffBase and BackoffMax shape the registration retry delay: after
	// the n-th consecutive failure the worker waits a uniformly random
	// duration in [0, min(BackoffMax, BackoffBase·2^(n−1))] ("full jitter").
	// Defaults DefaultBackoffBase and DefaultBackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// ReleaseAttempts bounds the calls one Release makes. Default
	// DefaultReleaseAttempts.
	ReleaseAttempts int
	// ReleaseBackoff is the wait between release attempts (doubled each
	// time). Default DefaultReleaseBackoff.
	ReleaseBackoff time.Duration
	// ReleaseBatch bounds the releases one POST /registry/releases carries:
	// the releases waiting at the same time (instances closing together in
	// a drain, a shutdown or an idle sweep) go in one call per (namespace,
	// session) instead of one call each. 1 sends every release alone (POST
	// /registry/release). At most wire.MaxReleaseBatch (1024), which the
	// pinboard enforces. Default DefaultReleaseBatch.
	ReleaseBatch int
	// ShutdownPollInterval is the cadence at which Shutdown closes idle
	// instances and checks whether the hosts are empty. Default
	// DefaultShutdownPollInterval.
	ShutdownPollInterval time.Duration
	// MaxConns bounds the connections to the pinboard; calls beyond it wait
	// for a free connection within RequestTimeout. Default DefaultMaxConns.
	MaxConns int
}

// ErrBadTiming is returned (wrapped) by New and Run when the
// lease timing cannot work: the buffer is not shorter than the lease, or fewer
// than MinHeartbeatAttempts heartbeat attempts fit before the local deadline.
// The message names the values; fix it by lowering LeaseBuffer,
// HeartbeatInterval or RetryInterval, or by raising the pinboard's lease.
var ErrBadTiming = errors.New("lease timing cannot work")

// ErrConfig is returned (wrapped) by New for a missing or malformed field;
// the message names the field.
var ErrConfig = errors.New("invalid worker config")

// withDefaults returns c with every zero field replaced by its default.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&c.LeaseBuffer, DefaultLeaseBuffer)
	def(&c.RetryInterval, DefaultRetryInterval)
	def(&c.RequestTimeout, DefaultRequestTimeout)
	def(&c.BackoffBase, DefaultBackoffBase)
	def(&c.BackoffMax, DefaultBackoffMax)
	def(&c.ReleaseBackoff, DefaultReleaseBackoff)
	def(&c.ShutdownPollInterval, DefaultShutdownPollInterval)
	if c.ReleaseAttempts == 0 {
		c.ReleaseAttempts = DefaultReleaseAttempts
	}
	if c.ReleaseBatch == 0 {
		c.ReleaseBatch = DefaultReleaseBatch
	}
	if c.TokenSource == "" {
		c.TokenSource = "Config.Token"
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.NewSet()
	}
	c.Clock = clock.Or(c.Clock)
	return c
}

// validate checks a defaulted config and returns the parsed URLs.
func (c Config) validate() (pinboard, advertise *url.URL, err error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, a...))
	}
	if pinboard, err = parseBaseURL(c.PinboardURL, true); err != nil {
		return nil, nil, bad("PinboardURL: %v", err)
	}
	if advertise, err = parseBaseURL(c.AdvertiseURL, false); err != nil {
		return nil, nil, bad("AdvertiseURL: %v", err)
	}
	if c.Token == "" {
		return nil, nil, bad("Token is empty: set it to the pinboard's deployment token")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"HeartbeatInterval", c.HeartbeatInterval},
		{"LeaseBuffer", c.LeaseBuffer},
		{"RetryInterval", c.RetryInterval},
		{"RequestTimeout", c.RequestTimeout},
		{"BackoffBase", c.BackoffBase},
		{"BackoffMax", c.BackoffMax},
		{"ReleaseBackoff", c.ReleaseBackoff},
		{"ShutdownPollInterval", c.ShutdownPollInterval},
	} {
		if d.v < 0 {
			return nil, nil, bad("%s is negative (%v): use a positive duration or 0 for the default", d.name, d.v)
		}
	}
	if c.BackoffMax < c.BackoffBase {
		return nil, nil, bad("BackoffMax (%v) is below BackoffBase (%v): raise BackoffMax", c.BackoffMax, c.BackoffBase)
	}
	if c.ReleaseAttempts < 0 {
		return nil, nil, bad("ReleaseAttempts is negative (%d): use at least 1, or 0 for the default", c.ReleaseAttempts)
	}
	if c.ReleaseBatch < 0 || c.ReleaseBatch > wire.MaxReleaseBatch {
		return nil, nil, bad("ReleaseBatch is %d: use 1 to %d (the pinboard's limit per call), or 0 for the default", c.ReleaseBatch, wire.MaxReleaseBatch)
	}
	if c.MaxConns < 0 {
		return nil, nil, bad("MaxConns is negative (%d): use at least 1, or 0 for the default", c.MaxConns)
	}
	if err := CheckTiming(DefaultLease, c.LeaseBuffer, c.HeartbeatInterval, c.RetryInterval); err != nil {
		return nil, nil, err
	}
	return pinboard, advertise, nil
}

// parseBaseURL accepts an absolute http(s) URL without query, fragment or
// userinfo. A path is allowed only when allowPath is set; a trailing slash is
// dropped either way.
func parseBaseURL(s string, allowPath bool) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("empty: set an absolute http:// or https:// URL")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("cannot parse %q: %w", s, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("scheme of %q must be http or https", s)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("%q has no host", s)
	case u.User != nil:
		return nil, fmt.Errorf("%q must not carry userinfo", s)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("%q must not carry a query or fragment", s)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	if u.Path != "" && !allowPath {
		return nil, fmt.Errorf("%q must not carry a path: the pinboard appends /<namespace>/<id> itself", s)
	}
	return u, nil
}

// CheckTiming validates a lease timing configuration: lease is the
// pinboard's lease (expiresInMs), buffer the local safety margin, heartbeat
// the heartbeat interval and retry the quick resend interval. It refuses a
// buffer that is not shorter than the lease, and a configuration where fewer
// than MinHeartbeatAttempts heartbeat attempts start inside the local window:
// counting from an acked heartbeat's send time, attempts start at heartbeat,
// heartbeat+retry, heartbeat+2·retry, ... and must start before
// lease − buffer. With the defaults (10 s, 5 s, 3 s, 0.5 s) four attempts fit.
// Errors wrap ErrBadTiming and say what to change.
func CheckTiming(lease, buffer, heartbeat, retry time.Duration) error {
	switch {
	case lease <= 0:
		return fmt.Errorf("%w: the lease %v is not positive: the pinboard must supply expiresInMs > 0", ErrBadTiming, lease)
	case buffer <= 0 || heartbeat <= 0 || retry <= 0:
		return fmt.Errorf("%w: LeaseBuffer (%v), HeartbeatInterval (%v) and RetryInterval (%v) must be positive", ErrBadTiming, buffer, heartbeat, retry)
	case buffer >= lease:
		return fmt.Errorf("%w: LeaseBuffer (%v) must be shorter than the lease (%v): lower LeaseBuffer or raise the pinboard's lease",
			ErrBadTiming, buffer, lease)
	}
	if n := heartbeatAttempts(lease-buffer, heartbeat, retry); n < MinHeartbeatAttempts {
		return fmt.Errorf("%w: only %d heartbeat attempts start inside lease − LeaseBuffer (%v − %v = %v) with HeartbeatInterval %v and RetryInterval %v; need at least %d: lower HeartbeatInterval or RetryInterval, lower LeaseBuffer, or raise the pinboard's lease",
			ErrBadTiming, n, lease, buffer, lease-buffer, heartbeat, retry, MinHeartbeatAttempts)
	}
	return nil
}

// heartbeatAttempts counts the attempts k ≥ 0 with heartbeat + k·retry < window.
func heartbeatAttempts(window, heartbeat, retry time.Duration) int {
	if heartbeat >= window {
		return 0
	}
	span := window - heartbeat // attempts at offsets 0, retry, 2·retry, ... < span
	return int((span + retry - 1) / retry)
}

// tokenRefused is what the worker says when the pinboard refuses its token
// (401): the refusal and where to set the token (TokenSource).
func (c Config) tokenRefused() string {
	return "the pinboard refused the deployment token (401); set " + c.TokenSource + " to the pinboard's token"
}
