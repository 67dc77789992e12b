package registry

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/logthrottle"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/hotids"
	"github.com/pinned-go/pinned/internal/store"
)

// Defaults for Config fields left zero.
const (
	// DefaultLease is the default Config.Lease: the expiresInMs every ack
	// carries and the TTL of every session record.
	DefaultLease = wire.DefaultLeaseMs * time.Millisecond
	// DefaultStoreTimeout is the default Config.StoreTimeout.
	DefaultStoreTimeout = 2 * time.Second
	// DefaultReapInterval is the default Config.ReapInterval.
	DefaultReapInterval = 5 * time.Second
	// DefaultMaxConcurrentChallenges is the default
	// Config.MaxConcurrentChallenges.
	DefaultMaxConcurrentChallenges = 64
	// MinLease is the shortest lease Config accepts.
	MinLease = 100 * time.Millisecond
)

// Config configures a Registry.
type Config struct {
	// Store is the directory. Required. If it also implements store.Reaper,
	// Run collects dead sessions' placements.
	Store store.Store
	// Tokens are the valid deployment tokens: one, or two during a rotation
	// (the new one and the old one). Required; see SetTokens to change them
	// at runtime. Each is MinTokenLen..MaxTokenLen visible ASCII bytes.
	Tokens []string
	// Lease is the pinboard's own lease length: every session's TTL and the
	// expiresInMs of every ack. Whatever a worker asks for is ignored.
	// Zero means DefaultLease.
	Lease time.Duration
	// ChallengeTimeout bounds one challenge fetch (dial to last byte).
	// Zero means DefaultChallengeTimeout.
	ChallengeTimeout time.Duration
	// AdvertiseNetworks, when not empty, is the allow-list of networks an
	// advertise URL may resolve into; the check runs when the URL is parsed
	// (IP literals) and at dial time, after DNS, on every address dialled.
	// Empty means every address the defaults allow: loopback, RFC 1918,
	// IPv6 unique local and public ones, never the special-purpose ranges
	// (link-local, 100.64/10, multicast, ...), the unspecified addresses
	// or cloud metadata endpoints. An entry inside a special-purpose range
	// opts into that range (e.g. 100.64.0.0/10); see advertise.go.
	AdvertiseNetworks []netip.Prefix
	// AdvertisePorts, when not empty, is the allow-list of ports an
	// advertise URL may use (the scheme's default port when it names
	// none). Empty means any port.
	AdvertisePorts []uint16
	// NonceTTL is how long a used challenge is remembered: a registration
	// or heartbeat that presents it again within NonceTTL is refused (422),
	// whatever the advertise URL or session. It must exceed the longest
	// time a worker keeps a challenge live (its call timeout, 5 s by
	// default). Zero means DefaultNonceTTL; at most MaxNonceTTL.
	NonceTTL time.Duration
	// RegisterIPLimit bounds registrations per client IP (an IPv6 client
	// counts by its /64), RegisterTokenLimit per deployment token; beyond
	// them a registration gets 429 + Retry-After. Zero values mean
	// DefaultRegisterIPLimit and DefaultRegisterTokenLimit; Events < 0
	// turns a limit off. Limits are per pinboard process.
	RegisterIPLimit, RegisterTokenLimit Limit
	// AuthFailureLimit bounds failed authentications per client IP; beyond
	// it every registry call from that IP gets 429 + Retry-After, without
	// its token being checked. Zero means DefaultAuthFailureLimit; Events
	// < 0 turns it off.
	AuthFailureLimit Limit
	// MaxTrackedClients bounds the per-IP buckets each limit keeps (least
	// recently used first out). Zero means DefaultMaxTrackedClients.
	MaxTrackedClients int
	// MaxSessionsPerToken caps the live sessions registered with one
	// deployment token; a registration beyond it gets 429 + Retry-After
	// (slots free as sessions deregister or expire). Zero means
	// DefaultMaxSessionsPerToken; negative turns the cap off.
	MaxSessionsPerToken int
	// AllowUnverified accepts registrations without a challenge pair
	// (legacy workers). Such sessions are unverified: their pairless
	// heartbeats get "reregister": true until a heartbeat carries a pair
	// that verifies. Off by default: every registration must prove its
	// advertise URL.
	AllowUnverified bool
	// MaxConcurrentChallenges bounds challenge fetches in flight; a
	// registration beyond it gets 503 + Retry-After. Zero means
	// DefaultMaxConcurrentChallenges.
	MaxConcurrentChallenges int
	// MaxNamespaces bounds the namespaces of one registration. Zero means
	// DefaultMaxNamespaces.
	MaxNamespaces int
	// StoreTimeout bounds the store calls of one request. Zero means
	// DefaultStoreTimeout.
	StoreTimeout time.Duration
	// ReapInterval is how often Run collects dead sessions and refreshes
	// the gauges. Zero means DefaultReapInterval.
	ReapInterval time.Duration
	// ReapGrace is how long after a session's lease ran out Run collects
	// its placements; it covers claims that were in flight when the lease
	// ended. Zero means Lease.
	ReapGrace time.Duration
	// MaxNamespaceSeries bounds the per-namespace placement gauges; the
	// rest are summed under namespace="_other". Zero means
	// DefaultMaxNamespaceSeries.
	MaxNamespaceSeries int
	// Hot is the pinboard's hot-id sketch, which its proxy records every
	// routed request in: GET /registry/hot and GET /registry/traffic read
	// it. Nil answers them with no traffic.
	Hot *hotids.Sketch
	// MaxAlarmsPerInstance bounds the alarms one instance holds (a set
	// beyond it answers 409). Alarm calls are served when Store also
	// implements store.Alarms (501 otherwise). Zero means
	// wire.DefaultMaxAlarmsPerInstance.
	MaxAlarmsPerInstance int
	// OnAlarmSet, when set, is called after every alarm the registry
	// stored, with its shard and due time (the pinboard's alarm scheduler
	// claims that shard by then). It must not block.
	OnAlarmSet func(shard int, dueMs int64)
	// Clock drives Run's timer; nil means clock.Real.
	Clock clock.Clock
	// Logger is tagged logger=pinned.registry; nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives the registry's metrics; nil means a new set, see
	// Registry.Metrics.
	Metrics *metrics.Set
}

// Registry serves the registry protocol. Create it with New.
type Registry struct {
	st        store.Store
	lease     time.Duration
	leaseMs   int64
	verifier  *verifier
	policy    *addrPolicy
	nonceTTL  time.Duration
	maxPerTok int                       // 0: no cap
	regIP     *limiterTable[netip.Addr] // nil: off
	regTok    *limiterTable[string]     // by token id
	authFails *limiterTable[netip.Addr]
	allowPair bool // AllowUnverified
	sem       chan struct{}
	maxNS     int
	storeTO   time.Duration
	interval  time.Duration
	grace     time.Duration
	clock     clock.Clock
	log       *slog.Logger
	m         *registryMetrics
	hotids    *hotids.Sketch

	alarms     store.Alarms // Store, when it keeps alarms; else nil
	maxAlarms  int
	onAlarmSet func(shard int, dueMs int64)

	tokens   atomic.Pointer[tokenSet]
	shutdown atomic.Bool

	authLog  logthrottle.Every
	storeLog logthrottle.Every
	limitLog logthrottle.Every

	runMu   sync.Mutex
	running bool
}

// logEvery is how often a repeated error (failed auth, store failure, rate
// limit) is logged.
const logEvery = 10 * time.Second

// New validates cfg and returns a Registry. It does no I/O and starts no
// goroutine; mount it with Routes and run its janitor with Run.
func New(cfg Config) (*Registry, error) {
	if cfg.Store == nil {
		return nil, errors.New("registry: Config.Store is nil")
	}
	ts, err := newTokenSet(cfg.Tokens)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	lease := cmp.Or(cfg.Lease, DefaultLease)
	if lease < MinLease {
		return nil, fmt.Errorf("registry: Lease %v is below the minimum %v", lease, MinLease)
	}
	for name, v := range map[string]int64{
		"ChallengeTimeout": int64(cfg.ChallengeTimeout), "MaxConcurrentChallenges": int64(cfg.MaxConcurrentChallenges),
		"MaxNamespaces": int64(cfg.MaxNamespaces), "StoreTimeout": int64(cfg.StoreTimeout),
		"ReapInterval": int64(cfg.ReapInterval), "ReapGrace": int64(cfg.ReapGrace),
		"MaxNamespaceSeries": int64(cfg.MaxNamespaceSeries), "NonceTTL": int64(cfg.NonceTTL),
		"MaxTrackedClients": int64(cfg.MaxTrackedClients), "MaxAlarmsPerInstance": int64(cfg.MaxAlarmsPerInstance),
	} {
		if v < 0 {
			return nil, fmt.Errorf("registry: Config.%s is negative; use 0 for the default", name)
		}
	}
	policy, err := newAddrPolicy(cfg.AdvertiseNetworks, cfg.AdvertisePorts)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	nonceTTL := cmp.Or(cfg.NonceTTL, DefaultNonceTTL)
	if nonceTTL > MaxNonceTTL || nonceTTL < time.Second {
		return nil, fmt.Errorf("registry: Config.NonceTTL %v is outside [1s, %v]", nonceTTL, MaxNonceTTL)
	}
	regIP := cfg.RegisterIPLimit.withDefaults(DefaultRegisterIPLimit)
	regTok := cfg.RegisterTokenLimit.withDefaults(DefaultRegisterTokenLimit)
	authFail := cfg.AuthFailureLimit.withDefaults(DefaultAuthFailureLimit)
	for name, l := range map[string]Limit{"RegisterIPLimit": regIP, "RegisterTokenLimit": regTok, "AuthFailureLimit": authFail} {
		if err := l.validate(name); err != nil {
			return nil, fmt.Errorf("registry: %w", err)
		}
	}
	maxPerTok := cmp.Or(cfg.MaxSessionsPerToken, DefaultMaxSessionsPerToken)
	if maxPerTok < 0 {
		maxPerTok = 0
	}
	clk := clock.Or(cfg.Clock)
	tracked := cmp.Or(cfg.MaxTrackedClients, DefaultMaxTrackedClients)
	set := cfg.Metrics
	if set == nil {
		set = metrics.NewSet()
	}
	r := &Registry{
		st:        cfg.Store,
		lease:     lease,
		leaseMs:   lease.Milliseconds(),
		verifier:  &verifier{timeout: cmp.Or(cfg.ChallengeTimeout, DefaultChallengeTimeout), policy: policy, resolve: defaultResolve},
		policy:    policy,
		nonceTTL:  nonceTTL,
		maxPerTok: maxPerTok,
		regIP:     newLimiterTable[netip.Addr](regIP, tracked, clk),
		regTok:    newLimiterTable[string](regTok, tracked, clk),
		authFails: newLimiterTable[netip.Addr](authFail, tracked, clk),
		allowPair: cfg.AllowUnverified,
		sem:       make(chan struct{}, cmp.Or(cfg.MaxConcurrentChallenges, DefaultMaxConcurrentChallenges)),
		maxNS:     cmp.Or(cfg.MaxNamespaces, DefaultMaxNamespaces),
		storeTO:   cmp.Or(cfg.StoreTimeout, DefaultStoreTimeout),
		interval:  cmp.Or(cfg.ReapInterval, DefaultReapInterval),
		grace:     cmp.Or(cfg.ReapGrace, lease),
		clock:     clk,
		log:       cmp.Or(cfg.Logger, slog.Default()).With("logger", "pinned.registry"),
		m:         newRegistryMetrics(set, cmp.Or(cfg.MaxNamespaceSeries, DefaultMaxNamespaceSeries)),
		hotids:    cfg.Hot,
		authLog:   logthrottle.Every{Interval: logEvery},
		storeLog:  logthrottle.Every{Interval: logEvery},
		limitLog:  logthrottle.Every{Interval: logEvery},
	}
	r.alarms, _ = cfg.Store.(store.Alarms)
	r.maxAlarms = cmp.Or(cfg.MaxAlarmsPerInstance, wire.DefaultMaxAlarmsPerInstance)
	r.onAlarmSet = cfg.OnAlarmSet
	r.tokens.Store(ts)
	return r, nil
}

// Metrics returns the set holding the registry's metrics (Config.Metrics,
// or the one New created).
func (r *Registry) Metrics() *metrics.Set { return r.m.set }

// Lease returns the lease the registry grants.
func (r *Registry) Lease() time.Duration { return r.lease }

// SetTokens replaces the valid deployment tokens (one, or two during a
// rotation) atomically; requests in flight finish under the old set. On an
// error the old tokens stay.
func (r *Registry) SetTokens(tokens []string) error {
	ts, err := newTokenSet(tokens)
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	r.tokens.Store(ts)
	return nil
}

// MarkShuttingDown makes /healthz answer 503 {"shuttingDown": true} from
// now on, so load balancers stop sending traffic before the listener
// closes. Registry calls keep being served.
func (r *Registry) MarkShuttingDown() { r.shutdown.Store(true) }

// Routes mounts the registry endpoints and /healthz on rt. Everything
// else on rt (the proxy, for the pinboard) is untouched.
func (r *Registry) Routes(rt *router.Router) {
	rt.POST(wire.PathRegister, r.endpoint(epRegister, true, r.register))
	rt.POST(wire.PathHeartbeat, r.endpoint(epHeartbeat, true, r.heartbeat))
	rt.POST(wire.PathRelease, r.endpoint(epRelease, true, r.release))
	rt.POST(wire.PathReleases, r.endpoint(epReleases, true, r.releases))
	rt.POST(wire.PathDeregister, r.endpoint(epDeregister, true, r.deregister))
	rt.POST(wire.PathPush, r.endpoint(epPush, true, r.push))
	rt.GET(wire.PathWorkers, r.endpoint(epWorkers, true, r.workers))
	rt.GET(wire.PathOverview, r.endpoint(epOverview, true, r.overview))
	rt.GET(wire.PathPlacements+"/{namespace}/{id}", r.endpoint(epPlacement, true, r.placement))
	rt.DELETE(wire.PathPlacements+"/{namespace}/{id}", r.endpoint(epEvict, true, r.evict))
	rt.GET(wire.PathInstances, r.endpoint(epInstances, true, r.instances))
	rt.GET(wire.PathHot, r.endpoint(epHot, true, r.hot))
	rt.GET(wire.PathTraffic, r.endpoint(epTraffic, true, r.traffic))
	rt.GET(wire.PathHealthz, r.endpoint(epHealthz, false, r.healthz))
	r.alarmRoutes(func(method, path, ep string, h handler) { rt.Handle(method, path, r.endpoint(ep, true, h)) })
}

// NewRouter returns a router configured for the pinboard's public port:
// RedirectTrailingSlash and RedirectFixedPath off (the router must never
// answer a proxied path with its own redirect), HandleMethodNotAllowed on
// (a GET of /registry/register is a 405, not a proxied request), with the
// registry routes mounted and notFound as the handler of every other
// request (nil: 404).
func (r *Registry) NewRouter(notFound fasthttp.RequestHandler) *router.Router {
	rt := router.New()
	rt.RedirectTrailingSlash = false
	rt.RedirectFixedPath = false
	rt.HandleMethodNotAllowed = true
	rt.HandleOPTIONS = false
	rt.NotFound = notFound
	r.Routes(rt)
	return rt
}

// mintSessionID returns a new session id: 144 random bits, base64url.
func mintSessionID() string {
	var b [wire.SessionIDLen * 3 / 4]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go ≥ 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// storeContext bounds the store calls of one request.
func (r *Registry) storeContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.storeTO)
}
