package host

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/websocket"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// Defaults for the zero values of Config fields.
const (
	// DefaultMaxInstances bounds the live instances of one host.
	DefaultMaxInstances = 10_000
	// DefaultIdleTimeout is how long an instance may stay idle (no request,
	// stream, websocket or task) before the sweep closes it. Five minutes
	// sits between Cloudflare's ~1–2 min eviction and Orleans' 15 min
	// collection age: long enough to survive a user's think time, short
	// enough that abandoned ids do not pin memory for long.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultSweepInterval is the idle sweep period when it is not set and
	// IdleTimeout/4 is longer. An instance is closed between IdleTimeout and
	// IdleTimeout+SweepInterval after it became idle.
	DefaultSweepInterval = 5 * time.Second
	// MinSweepInterval is the smallest sweep period accepted.
	MinSweepInterval = 10 * time.Millisecond
	// DefaultRetryAfter is the Retry-After of every 503 the host makes.
	DefaultRetryAfter = time.Second
	// DefaultCloseWait bounds how long a request in local mode waits for a
	// closing instance of its id to finish before it answers 503 closing.
	DefaultCloseWait = 5 * time.Second
	// DefaultReleaseTimeout bounds one Worker.Release call (fleet mode).
	DefaultReleaseTimeout = 10 * time.Second
	// DefaultStaleRouteWindow is how long, at least, a host in fleet mode
	// refuses routes naming the epoch of an instance that closed (see
	// Config.StaleRouteWindow): six of the pinboard's default 10 s leases.
	DefaultStaleRouteWindow = time.Minute
	// DefaultWebSocketWriteTimeout bounds one WebSocket.WriteMessage.
	DefaultWebSocketWriteTimeout = 10 * time.Second
	// DefaultShards is the number of directory shards.
	DefaultShards = 64
	// MaxShards is the largest shard count accepted.
	MaxShards = 4096
	// DefaultMaxRequestBodySize bounds a request body: fasthttp's own
	// default (fasthttp.DefaultMaxRequestBodySize, 4 MiB), so a host on a
	// default fasthttp.Server agrees with it.
	DefaultMaxRequestBodySize = 4 << 20
	// DefaultMaxBodyDrain bounds how much of a refused body is read and
	// discarded so that its client gets the 413 (see Config.MaxBodyDrain):
	// the pinboard's default body limit, so that whatever a pinboard
	// forwards can be drained.
	DefaultMaxBodyDrain = 64 << 20
	// DefaultAlarmTimeout bounds each call SetAlarm, DeleteAlarm and Alarms
	// make to the worker (fleet mode).
	DefaultAlarmTimeout = 5 * time.Second
	// DefaultAlarmConcurrency bounds the alarms a local-mode host delivers
	// at once.
	DefaultAlarmConcurrency = 16
	// DefaultMaxDeadAlarms is how many dead letters a local-mode host keeps.
	DefaultMaxDeadAlarms = 1000
)

// Config configures a Host. The zero value of every field except Namespace
// selects the default documented on it.
type Config struct {
	// Namespace is the path prefix the host serves, "/name" where name passes
	// the id grammar (wire.CheckNamespace), e.g. "/counter". Required.
	Namespace string

	// Worker is the fleet registration the host serves under. nil means local
	// mode: an in-memory directory, no pinboard, no fencing.
	Worker Worker

	// MaxInstances bounds the live instances (activating and closing ones
	// included); an activation beyond it answers 503 capacity. Zero means
	// DefaultMaxInstances.
	MaxInstances int

	// IdleTimeout is how long an instance may be idle before the sweep closes
	// it. Zero means DefaultIdleTimeout; negative disables idle eviction.
	IdleTimeout time.Duration

	// SweepInterval is the idle sweep period. Zero means
	// min(DefaultSweepInterval, IdleTimeout/4), at least MinSweepInterval.
	SweepInterval time.Duration

	// RetryAfter is sent, rounded up to whole seconds (at least 1), in the
	// Retry-After header of every 503 the host makes. Zero means
	// DefaultRetryAfter.
	RetryAfter time.Duration

	// MaxIDLen bounds ids in bytes, 1..wire.MaxIDLen. Zero means
	// wire.MaxIDLen (256).
	MaxIDLen int

	// CloseWait bounds how long a request in local mode waits for a closing
	// instance of its id before answering 503 closing. Zero means
	// DefaultCloseWait; negative means do not wait. In fleet mode requests
	// never wait (they get 503 closing so the proxy re-resolves), except one
	// whose epoch superseded the closing instance (see Epochs in the package
	// doc), which waits as long to activate its own.
	CloseWait time.Duration

	// ReleaseTimeout bounds each Worker.Release call. Zero means
	// DefaultReleaseTimeout.
	ReleaseTimeout time.Duration

	// StaleRouteWindow is how long, after an instance closed (fleet mode),
	// the host refuses requests routed by its placement or an older one of
	// its id (503 stale: the pinboard re-resolves) instead of activating a
	// new instance for them. Such a request comes from a pinboard still
	// routing from a cached placement that no longer exists (its Redis
	// link is slow or silent, or its invalidation is on the way); activating
	// it would run a second instance beside the one the current placement
	// may have activated elsewhere. A pinboard routes from a cached placement
	// for at most its lease after Redis last confirmed it, so the window
	// must exceed the lease plus the longest a request may travel: the host
	// uses the larger of this and three times the lease its worker was
	// granted (Worker.LeaseLength). It costs about 100 bytes per id closed
	// within the window. Zero means DefaultStaleRouteWindow; negative is
	// refused.
	StaleRouteWindow time.Duration

	// WebSocketWriteTimeout bounds each WebSocket.WriteMessage. Zero means
	// DefaultWebSocketWriteTimeout.
	WebSocketWriteTimeout time.Duration

	// MaxRequestBodySize bounds a request body in bytes: a request for the
	// namespace whose body is larger (by Content-Length, or a chunked body
	// the server read whole) gets 413 with a JSON wire.Error. The fasthttp
	// server the host is mounted on must accept at least this much, or it
	// refuses larger bodies itself before the host sees them (fasthttp's
	// default answer is a bare 400 and a closed connection): call
	// ConfigureServer, which sets and checks the server's limit. In fleet
	// mode the worker tells the pinboard this limit at registration, so the
	// pinboard refuses a larger body with 413 before forwarding a byte of
	// it. Zero means DefaultMaxRequestBodySize.
	MaxRequestBodySize int

	// MaxBodyDrain bounds how much of a body over the server's limit the
	// server ConfigureServer set up reads and discards before it answers
	// 413: a client that sends its whole body before reading the answer (as
	// most do) then gets the 413 instead of a connection reset. A larger
	// body is refused without draining (the client may see a reset). Zero
	// means DefaultMaxBodyDrain; negative means never drain.
	MaxBodyDrain int64

	// Upgrader upgrades websocket routes. Its zero value is usable (and
	// refuses cross-origin upgrades); when Error is nil the host answers
	// handshake failures with a JSON wire.Error.
	Upgrader websocket.FastHTTPUpgrader

	// Shards is the number of directory shards, a power of two up to
	// MaxShards. Zero means DefaultShards.
	Shards int

	// AlarmTimeout bounds each call Instance.SetAlarm, DeleteAlarm and
	// Alarms make to the worker in fleet mode. Zero means
	// DefaultAlarmTimeout.
	AlarmTimeout time.Duration

	// MaxAlarmsPerInstance bounds the alarms one id holds in local mode
	// (the pinboard's registry bounds them in fleet mode). Zero means
	// wire.DefaultMaxAlarmsPerInstance.
	MaxAlarmsPerInstance int

	// AlarmConcurrency bounds the alarms delivered at once in local mode.
	// Zero means DefaultAlarmConcurrency.
	AlarmConcurrency int

	// MaxDeadAlarms is how many dead letters a local-mode host keeps (the
	// newest; Host.DeadAlarms). Zero means DefaultMaxDeadAlarms.
	MaxDeadAlarms int

	// Clock drives idle eviction and timeouts. nil means the real clock.
	Clock clock.Clock

	// Logger receives the host's logs, tagged logger=pinned.host. nil means
	// slog.Default().
	Logger *slog.Logger

	// Metrics receives the host's metrics. nil means a new set, available
	// from Host.Metrics.
	Metrics *metrics.Set
}

// withDefaults validates c and returns it with every default filled in.
func (c Config) withDefaults() (Config, error) {
	if e := wire.CheckNamespace(c.Namespace); e != wire.SegmentOK {
		return c, fmt.Errorf("host: Namespace %q is invalid (%v): want \"/name\" with name of 1-%d bytes of A-Za-z0-9._~@:+=- not starting with '.'",
			c.Namespace, e, wire.MaxNamespaceLen)
	}
	switch {
	case c.MaxInstances == 0:
		c.MaxInstances = DefaultMaxInstances
	case c.MaxInstances < 0:
		return c, fmt.Errorf("host: MaxInstances is %d: want a positive number, or 0 for %d", c.MaxInstances, DefaultMaxInstances)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	switch {
	case c.SweepInterval == 0:
		c.SweepInterval = DefaultSweepInterval
		if c.IdleTimeout > 0 {
			c.SweepInterval = min(c.SweepInterval, c.IdleTimeout/4)
		}
		c.SweepInterval = max(c.SweepInterval, MinSweepInterval)
	case c.SweepInterval < MinSweepInterval:
		return c, fmt.Errorf("host: SweepInterval is %v: want at least %v, or 0 for the default", c.SweepInterval, MinSweepInterval)
	}
	switch {
	case c.RetryAfter == 0:
		c.RetryAfter = DefaultRetryAfter
	case c.RetryAfter < 0:
		return c, fmt.Errorf("host: RetryAfter is %v: want a positive duration, or 0 for %v", c.RetryAfter, DefaultRetryAfter)
	}
	switch {
	case c.MaxIDLen == 0:
		c.MaxIDLen = wire.MaxIDLen
	case c.MaxIDLen < 0 || c.MaxIDLen > wire.MaxIDLen:
		return c, fmt.Errorf("host: MaxIDLen is %d: want 1..%d, or 0 for %d", c.MaxIDLen, wire.MaxIDLen, wire.MaxIDLen)
	}
	if c.CloseWait == 0 {
		c.CloseWait = DefaultCloseWait
	}
	switch {
	case c.ReleaseTimeout == 0:
		c.ReleaseTimeout = DefaultReleaseTimeout
	case c.ReleaseTimeout < 0:
		return c, fmt.Errorf("host: ReleaseTimeout is %v: want a positive duration, or 0 for %v", c.ReleaseTimeout, DefaultReleaseTimeout)
	}
	switch {
	case c.StaleRouteWindow == 0:
		c.StaleRouteWindow = DefaultStaleRouteWindow
	case c.StaleRouteWindow < 0:
		return c, fmt.Errorf("host: StaleRouteWindow is %v: want a positive duration, or 0 for %v", c.StaleRouteWindow, DefaultStaleRouteWindow)
	}
	switch {
	case c.WebSocketWriteTimeout == 0:
		c.WebSocketWriteTimeout = DefaultWebSocketWriteTimeout
	case c.WebSocketWriteTimeout < 0:
		return c, fmt.Errorf("host: WebSocketWriteTimeout is %v: want a positive duration, or 0 for %v", c.WebSocketWriteTimeout, DefaultWebSocketWriteTimeout)
	}
	switch {
	case c.Shards == 0:
		c.Shards = DefaultShards
	case c.Shards < 0 || c.Shards > MaxShards || c.Shards&(c.Shards-1) != 0:
		return c, fmt.Errorf("host: Shards is %d: want a power of two up to %d, or 0 for %d", c.Shards, MaxShards, DefaultShards)
	}
	switch {
	case c.MaxBodyDrain == 0:
		c.MaxBodyDrain = DefaultMaxBodyDrain
	case c.MaxBodyDrain < 0:
		c.MaxBodyDrain = 0
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxRequestBodySize", &c.MaxRequestBodySize, DefaultMaxRequestBodySize},
		{"MaxAlarmsPerInstance", &c.MaxAlarmsPerInstance, wire.DefaultMaxAlarmsPerInstance},
		{"AlarmConcurrency", &c.AlarmConcurrency, DefaultAlarmConcurrency},
		{"MaxDeadAlarms", &c.MaxDeadAlarms, DefaultMaxDeadAlarms},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			return c, fmt.Errorf("host: %s is %d: want a positive number, or 0 for %d", f.name, *f.v, f.def)
		}
	}
	switch {
	case c.AlarmTimeout == 0:
		c.AlarmTimeout = DefaultAlarmTimeout
	case c.AlarmTimeout < 0:
		return c, fmt.Errorf("host: AlarmTimeout is %v: want a positive duration, or 0 for %v", c.AlarmTimeout, DefaultAlarmTimeout)
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.NewSet()
	}
	return c, nil
}
