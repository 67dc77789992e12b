package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/proxy"
)

// Defaults for Config's zero values.
const (
	// DefaultLease is Config.Lease: the pinboard's default lease.
	DefaultLease = wire.DefaultLeaseMs * time.Millisecond
	// DefaultResolveTimeout bounds one miss: every store call of one
	// placement decision together (the request's own context ends only when
	// the server shuts down). A miss that runs out answers 503 store.
	DefaultResolveTimeout = 2 * time.Second
	// DefaultAvoidFor is how long a worker session that just refused or
	// failed a request (Refused) is passed over for new placements while
	// another eligible session has room.
	DefaultAvoidFor = 2 * time.Second
	// DefaultSweepInterval is how often Run checks that every session it
	// knows is still live, forgetting those gone from the store.
	DefaultSweepInterval = time.Minute
	// DefaultMaxTunnelChecks bounds the placement names waiting for Run to
	// check whether their WebSocket tunnels must close (above the proxy's
	// default tunnel cap, so that a reconnect can re-check every one).
	DefaultMaxTunnelChecks = 16 << 10
	// DefaultMaxRefusedNames bounds the names whose route the proxy
	// refused (Refused) that wait for their next miss, which re-reads the
	// placement through the store's client-side cache.
	DefaultMaxRefusedNames = 16 << 10
	// DefaultMaxRefreshes bounds the refreshes waiting for Run's
	// refreshers (see Config.RefreshAhead); a refresh due beyond it is
	// dropped (and counted): that entry expires, and its next request
	// misses, as without refreshing.
	DefaultMaxRefreshes = 4 << 10
	// DefaultSessionsReuse is the pinboard's Config.SessionsReuse: ten
	// decodes of a namespace's sessions a second at most, whatever the rate
	// of cold placements.
	DefaultSessionsReuse = 100 * time.Millisecond
	// DefaultNamespaceMemory is how long after the resolver last saw a live
	// session serving a namespace it answers a request for it, when none is
	// live, with ErrNoWorker (503) rather than ErrUnknownNamespace (404).
	DefaultNamespaceMemory = 10 * time.Minute
	// maxNamespaces bounds the namespaces remembered for NamespaceMemory.
	maxNamespaces = 4096
	// DefaultDeathProbeInterval is Config.DeathProbeInterval.
	DefaultDeathProbeInterval = 200 * time.Millisecond
	// DefaultDeathProbers is Config.DeathProbers.
	DefaultDeathProbers = 2
	// maxProbesQueued bounds the sessions waiting for a death probe.
	maxProbesQueued = 256
	// DefaultRefreshBatch is Config.RefreshBatch: ten wake-ups of the
	// refreshers a second at most, whatever the rate of refreshes.
	DefaultRefreshBatch = 100 * time.Millisecond
	// DefaultRefreshers is how many refreshes run at once (each one or two
	// store round trips; Redis pipelines them).
	DefaultRefreshers = 4
)

// maxRounds bounds the claim/replace rounds of one miss: each lost round
// means another pinboard changed the placement in between, which it does at
// most once per claim or replace of its own.
const maxRounds = 4

// Config configures a Resolver. Store is required; every other field has a
// documented default for its zero value.
type Config struct {
	// Store is the directory: sessions and placements. Its OnInvalidate must
	// be wired to Resolver.OnInvalidate (internal/pinboard does it).
	Store store.Store
	// Lease is the lease the registry grants; the cache TTL may not exceed
	// it. Default DefaultLease.
	Lease time.Duration
	// CacheTTL is how long a cached placement is served without consulting
	// the store: the safety net when an invalidation is lost. Each hot
	// placement is re-read once per CacheTTL. At most Lease; default Lease.
	CacheTTL time.Duration
	// RefreshAhead is how long before a cached placement expires a request
	// for it has Run re-read it in the background (one store read; the
	// entry keeps being served meanwhile), so that a name asked for at
	// least once per RefreshAhead never waits for the store. Default
	// CacheTTL/4; negative turns refreshing off (every entry then expires
	// and its next request misses).
	RefreshAhead time.Duration
	// MaxRefreshes: DefaultMaxRefreshes. Refreshers: DefaultRefreshers.
	MaxRefreshes, Refreshers int
	// RefreshBatch is how long names found due for a refresh gather before
	// Run's refreshers are woken for all of them: a request that finds its
	// entry due wakes no goroutine unless it is the first of a batch (see
	// refresh.go). Default DefaultRefreshBatch, at most RefreshAhead/4.
	// Measured in real time, not Config.Clock's: it only groups wake-ups.
	RefreshBatch time.Duration
	// CacheShards and CacheMaxEntries size the placement cache (placecache
	// defaults when zero).
	CacheShards, CacheMaxEntries int
	// ResolveTimeout bounds one miss. Default DefaultResolveTimeout.
	ResolveTimeout time.Duration
	// AvoidFor: DefaultAvoidFor; negative disables avoiding.
	AvoidFor time.Duration
	// SweepInterval: DefaultSweepInterval.
	SweepInterval time.Duration
	// MaxTunnelChecks: DefaultMaxTunnelChecks.
	MaxTunnelChecks int
	// MaxRefusedNames: DefaultMaxRefusedNames. Beyond it (names refused
	// within CacheTTL and not asked for since), a refused name's next miss
	// is an ordinary one: a LookupOrClaim round trip.
	MaxRefusedNames int
	// NamespaceMemory is how long after the resolver last saw a live session
	// serving a namespace a request for it, with no live session, is
	// answered ErrNoWorker (503 no_worker: its workers may be coming back)
	// rather than ErrUnknownNamespace (404). The store also remembers a
	// namespace until its last session is collected (store.NamespaceKnown),
	// which covers a resolver that just started. Default
	// DefaultNamespaceMemory; negative: only the store's memory.
	NamespaceMemory time.Duration
	// SessionsReuse is how long the resolver decodes a namespace's live
	// sessions once and reuses the list for every miss (0: every miss reads
	// them). The list comes from the store's client-side cache, but turning
	// it into sessions costs one decode per worker, on every miss: with a
	// thousand workers that, not Redis, bounds cold placements. Reusing it
	// lags registrations, drains and headroom by at most this much; a
	// holder missing from the list is still read on its own, a death probe's
	// verdict still applies at once, a miss that finds no candidate in a
	// reused list reads the sessions again, and a recheck (the proxy could
	// not reach the holder, or it refused the route) reads the holder's
	// session itself (a reused list may still hold a session that
	// deregistered). The pinboard sets
	// DefaultSessionsReuse.
	SessionsReuse time.Duration
	// OnMoved, when set, is called by Run after it read the holder of a
	// watched placement name (Watch) that was invalidated or just watched:
	// holder is the session holding name now ("" for nobody), and the
	// name's WebSocket tunnels to any other session should close
	// (internal/pinboard wires it to proxy.Proxy.CloseTunnels). It runs on
	// Run's goroutine and may block Run's next check while it runs.
	OnMoved func(name, holder string)
	// Clock, when set, times cache entries and every lookup (tests use
	// clock.Fake). Nil means the real clock, and a lookup made for a fasthttp
	// request uses the request's time (RequestCtx.Time) instead of reading
	// the clock again.
	Clock clock.Clock
	// ConfirmDeath, when set, turns fast failover on: after the proxy found
	// a worker unreachable (Refused with wire.ReasonUnreachable), Run's
	// probers ask it whether the session's process is gone, and a death it
	// confirms ends the session in the store at once, so that every
	// pinboard re-places its ids without waiting for its lease (failover.go).
	// It must answer true only on evidence the kernel gives for a dead
	// process (connections to the session's advertise address refused, or
	// answered only by a process that does not know the session's secret),
	// never on a timeout. The pinboard sets it unless fast failover is off.
	ConfirmDeath func(ctx context.Context, s *proxy.Session) (dead bool, err error)
	// DeathProbeInterval: one session is probed at most once per interval.
	// Default DefaultDeathProbeInterval.
	DeathProbeInterval time.Duration
	// DeathProbers: probes run at once. Default DefaultDeathProbers.
	DeathProbers int
	// Rand, when set, returns a uniform number in [0, n) for the resolver's
	// random choices (the two candidates of a placement, the spread of cache
	// lifetimes), so that a run can be replayed from a seed (the protocol's
	// simulation, test/sim, drives a resolver from one goroutine). It may
	// be called concurrently from every request's goroutine. Nil means
	// math/rand/v2's generator.
	Rand func(n int64) int64
	// Logger receives the resolver's events, tagged logger=pinned.placement.
	// Nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives the resolver's and its cache's metrics. Nil means a
	// new set, exposed by Resolver.Metrics.
	Metrics *metrics.Set
}

// ErrNoStore is returned by New when Config.Store is nil.
var ErrNoStore = errors.New("placement: Config.Store is required")

func (c *Config) setDefaults() error {
	if c.Store == nil {
		return ErrNoStore
	}
	if c.Lease < 0 || c.CacheTTL < 0 || c.ResolveTimeout < 0 || c.SweepInterval < 0 || c.MaxTunnelChecks < 0 || c.MaxRefusedNames < 0 ||
		c.MaxRefreshes < 0 || c.Refreshers < 0 || c.RefreshBatch < 0 {
		return errors.New("placement: Config durations and limits must not be negative (zero means the default)")
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = c.Lease
	}
	if c.CacheTTL > c.Lease {
		return fmt.Errorf("placement: CacheTTL %v exceeds the lease %v; lower CacheTTL", c.CacheTTL, c.Lease)
	}
	if c.ResolveTimeout == 0 {
		c.ResolveTimeout = DefaultResolveTimeout
	}
	switch {
	case c.RefreshAhead == 0:
		c.RefreshAhead = c.CacheTTL / 4
	case c.RefreshAhead > c.CacheTTL:
		return fmt.Errorf("placement: RefreshAhead %v exceeds CacheTTL %v", c.RefreshAhead, c.CacheTTL)
	}
	if c.MaxRefreshes == 0 {
		c.MaxRefreshes = DefaultMaxRefreshes
	}
	if c.Refreshers == 0 {
		c.Refreshers = DefaultRefreshers
	}
	if c.RefreshBatch == 0 {
		c.RefreshBatch = DefaultRefreshBatch
	}
	if c.RefreshAhead > 0 {
		c.RefreshBatch = min(c.RefreshBatch, c.RefreshAhead/4)
	}
	if c.AvoidFor == 0 {
		c.AvoidFor = DefaultAvoidFor
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.NamespaceMemory == 0 {
		c.NamespaceMemory = DefaultNamespaceMemory
	}
	if c.MaxTunnelChecks == 0 {
		c.MaxTunnelChecks = DefaultMaxTunnelChecks
	}
	if c.MaxRefusedNames == 0 {
		c.MaxRefusedNames = DefaultMaxRefusedNames
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Rand == nil {
		c.Rand = rand.Int64N
	}
	if c.DeathProbeInterval <= 0 {
		c.DeathProbeInterval = DefaultDeathProbeInterval
	}
	if c.DeathProbers <= 0 {
		c.DeathProbers = DefaultDeathProbers
	}
	if c.Metrics == nil {
		c.Metrics = metrics.NewSet()
	}
	return nil
}
