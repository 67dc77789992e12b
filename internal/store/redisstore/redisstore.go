package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// Defaults for Config fields left zero.
const (
	// DefaultCacheTTL is the default Config.CacheTTL: the default lease.
	DefaultCacheTTL = 10 * time.Second
	// DefaultCacheBytesPerConn is the default Config.CacheBytesPerConn.
	DefaultCacheBytesPerConn = 32 << 20
	// DefaultMaxQueuedMessages is the default Config.MaxQueuedMessages.
	DefaultMaxQueuedMessages = 16
	// DefaultQueueTTL is the default Config.QueueTTL.
	DefaultQueueTTL = 10 * time.Minute
	// DefaultReapBatch is the default Config.ReapBatch.
	DefaultReapBatch = 256
	// DefaultSentinelRefresh is the default Config.SentinelRefresh.
	DefaultSentinelRefresh = 2 * time.Second
	// DefaultConnectBackoffMin and DefaultConnectBackoffMax bound the wait
	// between two attempts of Connect.
	DefaultConnectBackoffMin = 100 * time.Millisecond
	DefaultConnectBackoffMax = 5 * time.Second
)

// Config configures a Store.
type Config struct {
	// Options carries OnInvalidate.
	store.Options
	// URL is the Redis URL, as rueidis.ParseURL reads it:
	// redis://[user:password@]host:port/db, rediss:// for TLS, and
	// ?addr=host2:port2 for more cluster seed nodes. With
	// ?master_set=<name> the host and the addr values are Redis Sentinels
	// and the store follows the primary they name for that master set
	// (redis://s1:26379/0?master_set=pinned&addr=s2:26379&addr=s3:26379;
	// the user and password are the Redis servers', the sentinels take
	// none). Required.
	URL string
	// Clock stamps RegisteredAt, LastHeartbeat and ExpiresAt and picks Reap
	// candidates; nil means clock.Real. Redis expires keys by its own clock.
	Clock clock.Clock
	// Logger receives connection events; nil means slog.Default(). It is
	// tagged logger=pinned.store.
	Logger *slog.Logger
	// CacheTTL bounds how long a client-side cached Placement or Session
	// read may be served without Redis (session entries are also bounded by
	// the key's remaining TTL). Zero means DefaultCacheTTL; set it to the
	// pinboard's lease.
	CacheTTL time.Duration
	// CacheBytesPerConn bounds the client-side cache of each Redis
	// connection. Zero means DefaultCacheBytesPerConn.
	CacheBytesPerConn int
	// MaxQueuedMessages bounds a client's message queue; a push beyond it
	// drops the oldest message. Zero means DefaultMaxQueuedMessages.
	MaxQueuedMessages int
	// QueueTTL is how long a queue survives its last push when no
	// heartbeat takes it. Zero means DefaultQueueTTL.
	QueueTTL time.Duration
	// ReapBatch bounds how many dead sessions one Reap call collects.
	// Zero means DefaultReapBatch.
	ReapBatch int
	// ConnectBackoffMin and ConnectBackoffMax bound Connect's retry wait.
	// Zero means the defaults.
	ConnectBackoffMin, ConnectBackoffMax time.Duration
	// RestartFence, when positive, refuses Claim and Replace (an error
	// wrapping store.ErrUnavailable and ErrRestartFence) while the Redis
	// server holding the placement has been up for less than it. Set it to
	// the lease: a Redis that restarted without persistence lost every
	// session and placement, while workers may still serve under leases
	// granted before the restart until those run out (at most one lease
	// after the restart); no id may be placed anew before. Zero: no fence
	// (a fresh Redis places at once). It is rounded up to whole seconds.
	RestartFence time.Duration
	// CircuitProbeInterval is how often the circuit's prober pings Redis
	// while Redis is known to be down (see the package doc: calls then fail
	// at once with store.ErrUnavailable). Zero means
	// DefaultCircuitProbeInterval; negative turns the circuit off (every
	// call then waits for Redis, up to its own deadline).
	CircuitProbeInterval time.Duration
	// CircuitProbeTimeout bounds one probe: a Redis that does not answer a
	// PING within it counts as down. Zero means DefaultCircuitProbeTimeout.
	CircuitProbeTimeout time.Duration
	// Metrics receives the store's metrics (the circuit's); nil means a new
	// set, see Store.Metrics.
	Metrics *metrics.Set
	// SentinelRefresh, with a Sentinel URL (?master_set=), is how often the
	// client re-reads the primary's address from the sentinels besides
	// following their +switch-master events (a missed event would otherwise
	// keep it on a demoted primary). Zero means DefaultSentinelRefresh.
	SentinelRefresh time.Duration
	// EpochTTL is how long an id's last epoch is kept after the placement it
	// belongs to was written or released (the pinned:e: key's PEXPIRE).
	// Epochs of one id increase as long as it is kept, whatever the clocks
	// do; past it they rest on Redis's clock only (wire.NextEpoch). Zero
	// means store.DefaultEpochTTL.
	EpochTTL time.Duration
}

// Store is a store.Store and store.Reaper on Redis.
type Store struct {
	opt       rueidis.ClientOption
	clock     clock.Clock
	log       *slog.Logger
	onInv     func(store.Invalidation)
	cacheTTL  time.Duration
	maxQueue  int
	queueTTL  time.Duration
	reapBatch int
	// fenceSeconds is Config.RestartFence in whole seconds (rounded up), as
	// the placement scripts' argument.
	fenceSeconds string
	// epochTTL is Config.EpochTTL in milliseconds, as the placement
	// scripts' argument.
	epochTTL   string
	backoffMin time.Duration
	backoffMax time.Duration

	// indexApart makes a single node index placements as a cluster does
	// (apart from the claim script): set by tests only, to count the
	// cluster path's round trips through a tap.
	indexApart bool

	client  atomic.Pointer[conn] // nil until connected
	circuit *circuit
	set     *metrics.Set

	mu      sync.Mutex
	lastErr error // last dial error, while not connected
	closed  bool
	closing chan struct{}
}

type conn struct{ rueidis.Client }

var _ interface {
	store.Store
	store.Reaper
	store.Alarms
	store.CachedLookups
	store.FreshLookups
} = (*Store)(nil)

// New validates cfg and returns a Store that is not connected yet. It does
// no I/O; call Connect.
func New(cfg Config) (*Store, error) {
	if cfg.URL == "" {
		return nil, errors.New("redisstore: Config.URL is empty; set it to redis://host:port/db")
	}
	opt, err := rueidis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("redisstore: cannot parse Config.URL: %w (want redis://[user:password@]host:port/db)", err)
	}
	for name, v := range map[string]int64{
		"CacheTTL": int64(cfg.CacheTTL), "CacheBytesPerConn": int64(cfg.CacheBytesPerConn),
		"MaxQueuedMessages": int64(cfg.MaxQueuedMessages), "QueueTTL": int64(cfg.QueueTTL),
		"ReapBatch": int64(cfg.ReapBatch), "ConnectBackoffMin": int64(cfg.ConnectBackoffMin),
		"ConnectBackoffMax": int64(cfg.ConnectBackoffMax), "RestartFence": int64(cfg.RestartFence),
		"CircuitProbeTimeout": int64(cfg.CircuitProbeTimeout), "SentinelRefresh": int64(cfg.SentinelRefresh), "EpochTTL": int64(cfg.EpochTTL),
	} {
		if v < 0 {
			return nil, fmt.Errorf("redisstore: Config.%s is negative; use 0 for the default", name)
		}
	}
	s := &Store{
		clock:      clock.Or(cfg.Clock),
		log:        cmp.Or(cfg.Logger, slog.Default()).With("logger", "pinned.store"),
		onInv:      cfg.OnInvalidate,
		cacheTTL:   cmp.Or(cfg.CacheTTL, DefaultCacheTTL),
		maxQueue:   cmp.Or(cfg.MaxQueuedMessages, DefaultMaxQueuedMessages),
		queueTTL:   cmp.Or(cfg.QueueTTL, DefaultQueueTTL),
		reapBatch:  cmp.Or(cfg.ReapBatch, DefaultReapBatch),
		backoffMin: cmp.Or(cfg.ConnectBackoffMin, DefaultConnectBackoffMin),
		backoffMax: cmp.Or(cfg.ConnectBackoffMax, DefaultConnectBackoffMax),
		closing:    make(chan struct{}),
		lastErr:    fmt.Errorf("%w: the first attempt is in flight", store.ErrConnecting),
		// Whole seconds, rounded up: the script compares with Redis's
		// uptime_in_seconds, which is rounded down.
		fenceSeconds: strconv.FormatInt(int64((cfg.RestartFence+time.Second-1)/time.Second), 10),
		epochTTL:     ms(max(cmp.Or(cfg.EpochTTL, store.DefaultEpochTTL), time.Millisecond)),
	}
	s.set = cfg.Metrics
	if s.set == nil {
		s.set = metrics.NewSet()
	}
	s.circuit = newCircuit(cmp.Or(cfg.CircuitProbeInterval, DefaultCircuitProbeInterval), cmp.Or(cfg.CircuitProbeTimeout, DefaultCircuitProbeTimeout), s.set)
	if s.backoffMax < s.backoffMin {
		return nil, fmt.Errorf("redisstore: ConnectBackoffMax %v is below ConnectBackoffMin %v", s.backoffMax, s.backoffMin)
	}
	opt.CacheSizeEachConn = cmp.Or(cfg.CacheBytesPerConn, DefaultCacheBytesPerConn)
	opt.ClientName = cmp.Or(opt.ClientName, "pinned")
	// OPTIN is rueidis's default; spelled out because the package doc's
	// reasoning depends on it.
	opt.ClientTrackingOptions = []string{"OPTIN"}
	opt.DisableCache = false
	opt.OnInvalidations = s.onInvalidations
	if opt.Sentinel.MasterSet != "" {
		opt.Sentinel.TopologyRefreshInterval = cmp.Or(cfg.SentinelRefresh, DefaultSentinelRefresh)
	}
	s.opt = opt
	return s, nil
}

// Connect dials Redis, retrying with capped exponential backoff with jitter
// until it succeeds (nil), ctx ends (ctx.Err()), or Close is called
// (store.ErrClosed). Each failure is remembered for Ping. Calling Connect on
// a connected store returns nil at once. Only one Connect may run at a time.
func (s *Store) Connect(ctx context.Context) error {
	wait := s.backoffMin
	for attempt := 1; ; attempt++ {
		if s.client.Load() != nil {
			return nil
		}
		c, err := rueidis.NewClient(s.opt)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			if c != nil {
				c.Close()
			}
			return store.ErrClosed
		}
		if err == nil {
			s.client.Store(&conn{c})
			s.lastErr = nil
			s.mu.Unlock()
			s.startProber()
			if attempt > 1 {
				s.log.Info("connected to redis", "attempts", attempt)
			}
			return nil
		}
		s.lastErr = err
		s.mu.Unlock()
		if attempt == 1 || attempt%10 == 0 { // throttled: once, then every tenth attempt
			s.log.Warn("cannot reach redis; retrying", "attempt", attempt, "err", err)
		}
		// Full jitter over [wait/2, wait].
		d := wait/2 + rand.N(wait/2+1)
		t := s.clock.NewTimer(d)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-s.closing:
			t.Stop()
			return store.ErrClosed
		}
		wait = min(wait*2, s.backoffMax)
	}
}

// Close closes the Redis client (if connected) and makes every later call
// fail with store.ErrClosed. It is idempotent.
func (s *Store) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.closing)
	c := s.client.Swap(nil)
	s.mu.Unlock()
	if c != nil {
		c.Close()
	}
	s.stopProber()
}

// Metrics returns the set holding the store's metrics (Config.Metrics, or
// the one New created).
func (s *Store) Metrics() *metrics.Set { return s.set }

// get returns the client or the reason there is none.
func (s *Store) get(ctx context.Context) (rueidis.Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c := s.client.Load(); c != nil {
		if err := s.circuit.refuse(); err != nil {
			return nil, err
		}
		return c.Client, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	return nil, fmt.Errorf("%w: redis not connected: %w", store.ErrUnavailable, s.lastErr)
}

// wrap classifies an error from rueidis: context errors pass through, Redis
// error replies (a bug or a misconfigured server) are wrapped as they are,
// and everything else (I/O, closed client) becomes store.ErrUnavailable.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			s.circuit.suspect() // Redis may be hanging: let the prober look
		}
		return ctxErr
	}
	if e, ok := rueidis.IsRedisErr(err); ok {
		if unavailableReply(e) {
			s.circuit.suspect()
			return fmt.Errorf("%w: redis %s: %v", store.ErrUnavailable, op, err)
		}
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	if errors.Is(err, rueidis.ErrClosing) {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return store.ErrClosed
		}
	}
	s.circuit.suspect()
	return fmt.Errorf("%w: redis %s: %v", store.ErrUnavailable, op, err)
}

// onInvalidations maps tracked key names to store invalidations. It runs on
// a rueidis reader goroutine and must stay fast.
func (s *Store) onInvalidations(msgs []rueidis.RedisMessage) {
	if s.onInv == nil {
		return
	}
	if len(msgs) == 0 { // FLUSHALL/FLUSHDB or a closed connection
		s.onInv(store.Invalidation{All: true})
		return
	}
	for i := range msgs {
		key, err := msgs[i].ToString()
		if err != nil {
			continue
		}
		if inv, ok := invalidationFor(key); ok {
			s.onInv(inv)
		}
	}
}

// invalidationFor maps one invalidated key to what a reader may have cached.
func invalidationFor(key string) (store.Invalidation, bool) {
	if name, ok := wire.PlacementOfKey(key); ok {
		return store.Invalidation{Placement: name}, true
	}
	if sid, ok := strings.CutPrefix(key, keyPrefixSession); ok {
		return store.Invalidation{Session: sid}, true
	}
	return store.Invalidation{}, false
}

// Ping implements store.Store: it reports why Redis cannot be used.
func (s *Store) Ping(ctx context.Context) error {
	c, err := s.get(ctx)
	if err != nil {
		return err
	}
	return s.wrap(ctx, "ping", c.Do(ctx, c.B().Ping().Build()).Error())
}
