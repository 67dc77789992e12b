package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Defaults for Config. A zero field means its default.
const (
	// DefaultMaxRequestBodySize bounds a request body the proxy streams to a
	// worker: 413 before any byte reaches the worker when Content-Length says
	// more, the stream aborted when a chunked body grows past it.
	DefaultMaxRequestBodySize = 64 << 20
	// DefaultMaxHeaderBytes bounds a request head (the server's
	// ReadBufferSize): larger heads get 431.
	DefaultMaxHeaderBytes = 16 << 10
	// DefaultMaxHeaderFields bounds the field lines of a request head: more
	// get 431 (Envoy's bound; browsers send about 20).
	DefaultMaxHeaderFields = 100
	// DefaultMaxResponseHeaderBytes bounds a worker's response head; larger
	// heads get 502.
	DefaultMaxResponseHeaderBytes = 16 << 10
	// DefaultReplayBodyMax: request bodies with a Content-Length up to this
	// are read whole before they are sent, so that a re-resolve can send them
	// again. Longer and chunked bodies are streamed and never resent.
	DefaultReplayBodyMax = 16 << 10
	// DefaultBufferedResponseMax: response bodies with a Content-Length up to
	// this are read whole before the client is written to, which frees the
	// worker connection at once; longer and chunked bodies are streamed.
	// fasthttp keeps a connection's largest response buffer for the life of
	// the connection, so this also bounds that retention.
	DefaultBufferedResponseMax = 16 << 10
	// DefaultStreamBufferSize is the copy buffer of a streamed body.
	DefaultStreamBufferSize = 32 << 10
	// DefaultSpliceMin: an event loop moves a Content-Length body of at
	// least this many bytes, a worker's response body or a client's request
	// body (but what of it came with the head), with splice(2), never
	// through its memory.
	DefaultSpliceMin = 64 << 10
	// DefaultSplicePipeSize is the pipe a spliced body goes through: the
	// most of one such body the proxy holds (in the kernel) at a time.
	DefaultSplicePipeSize = 256 << 10

	// DefaultHeaderTimeout bounds reading a request head (slowloris) and
	// the start of its body (a body up to ReplayBodyMax whole, the first
	// 8 KiB of a longer one), from the head's first byte: the server's
	// ReadTimeout. 408 beyond, naming the head or the body.
	DefaultHeaderTimeout = 5 * time.Second
	// DefaultIdleTimeout bounds a client keep-alive connection's wait for
	// its next request.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultWriteTimeout bounds writing a buffered response to a client.
	DefaultWriteTimeout = 60 * time.Second
	// DefaultResponseHeaderTimeout bounds the wait for a worker's response
	// head once the request is sent (504 after it).
	DefaultResponseHeaderTimeout = 60 * time.Second
	// DefaultStreamIdleTimeout bounds the time a streamed body (either way)
	// makes no progress; streams that keep moving are never cut.
	DefaultStreamIdleTimeout = 60 * time.Second
	// DefaultLingerTimeout bounds how long a connection the proxy closes
	// after refusing a request keeps reading, and throwing away, what the
	// client still sends (the body it refused), so that the client reads the
	// refusal instead of a connection reset.
	DefaultLingerTimeout = 5 * time.Second

	// DefaultMaxTunnels caps open WebSocket tunnels (503 beyond).
	DefaultMaxTunnels = 10_000
	// DefaultTunnelIdleTimeout closes a tunnel that carried no byte either
	// way for this long (detected within twice this).
	DefaultTunnelIdleTimeout = 5 * time.Minute
	// DefaultTunnelHandshakeTimeout bounds dialing a worker and reading its
	// answer to a WebSocket handshake.
	DefaultTunnelHandshakeTimeout = 10 * time.Second

	// DefaultMaxAttempts bounds the sends of one request (the first and its
	// re-resolves or retries).
	DefaultMaxAttempts = 3
	// DefaultRetryAfter is the Retry-After of the 503s the proxy makes.
	DefaultRetryAfter = time.Second

	// DefaultMaxConns caps client connections (the server's Concurrency).
	DefaultMaxConns = 64 << 10

	// DefaultEndpointSweepInterval is how often Run's janitor looks for
	// worker endpoints (connection pools) to close: one unused for a whole
	// interval, with nothing in flight and no tunnel, is closed, so an
	// endpoint lives between one and two intervals after its last request.
	DefaultEndpointSweepInterval = time.Minute
)

// Config configures a Proxy. A zero field means its documented default.
type Config struct {
	// Resolver maps placement names to worker sessions. Required. A
	// Resolver (and the Sessions it returns) serves one Proxy: the proxy
	// attaches its endpoints to the Sessions.
	Resolver Resolver

	// Recorder, when set, hears of every request the proxy routed (once
	// its answer's head is decided): the pinboard's hot-id sketch.
	Recorder Recorder

	// Endpoint configures the connection pool, in-flight cap and retry
	// budget the proxy keeps per worker session.
	Endpoint EndpointConfig
	// EndpointSweepInterval: DefaultEndpointSweepInterval (Run's janitor).
	EndpointSweepInterval time.Duration

	// Logger receives the proxy's logs, tagged logger=pinned.proxy. Nil
	// means slog.Default().
	Logger *slog.Logger
	// Metrics receives the proxy's metrics. Nil means a new set, exposed by
	// Proxy.Metrics.
	Metrics *metrics.Set

	// MaxRequestBodySize: DefaultMaxRequestBodySize; negative means no limit.
	MaxRequestBodySize int64
	// MaxHeaderBytes: DefaultMaxHeaderBytes. Used by NewServer.
	MaxHeaderBytes int
	// MaxHeaderFields: DefaultMaxHeaderFields.
	MaxHeaderFields int
	// MaxResponseHeaderBytes: DefaultMaxResponseHeaderBytes.
	MaxResponseHeaderBytes int
	// MaxIDLen bounds the id segment: wire.MaxIDLen, which is also its
	// maximum.
	MaxIDLen int
	// ReplayBodyMax: DefaultReplayBodyMax; negative means never buffer (no
	// request with a body is re-resolved).
	ReplayBodyMax int
	// BufferedResponseMax: DefaultBufferedResponseMax; negative means always
	// stream.
	BufferedResponseMax int
	// StreamBufferSize: DefaultStreamBufferSize.
	StreamBufferSize int
	// SpliceMin: DefaultSpliceMin; negative means never splice (the event
	// loops copy every response body, and hand a request body over
	// ReplayBodyMax to the fasthttp engine). The fasthttp engine always
	// copies.
	SpliceMin int64
	// SplicePipeSize: DefaultSplicePipeSize, or as close as the system
	// allows (/proc/sys/fs/pipe-max-size, the user's pipe pages).
	SplicePipeSize int

	// HeaderTimeout: DefaultHeaderTimeout. Used by NewServer.
	HeaderTimeout time.Duration
	// IdleTimeout: DefaultIdleTimeout. Used by NewServer.
	IdleTimeout time.Duration
	// WriteTimeout: DefaultWriteTimeout. Used by NewServer; streamed
	// responses use StreamIdleTimeout instead.
	WriteTimeout time.Duration
	// ResponseHeaderTimeout: DefaultResponseHeaderTimeout.
	ResponseHeaderTimeout time.Duration
	// StreamIdleTimeout: DefaultStreamIdleTimeout.
	StreamIdleTimeout time.Duration
	// LingerTimeout: DefaultLingerTimeout. A client connection that closes
	// after one of the proxy's refusals (413, 400, ...) while the request's
	// body may be unread sends the refusal, shuts its side down and
	// discards input until the client closes or this much time passed;
	// closing at once would reset the connection, and a reset makes the
	// client's kernel drop the refusal unread. Negative: close at once.
	LingerTimeout time.Duration

	// MaxTunnels: DefaultMaxTunnels.
	MaxTunnels int
	// TunnelIdleTimeout: DefaultTunnelIdleTimeout.
	TunnelIdleTimeout time.Duration
	// TunnelHandshakeTimeout: DefaultTunnelHandshakeTimeout.
	TunnelHandshakeTimeout time.Duration

	// MaxAttempts: DefaultMaxAttempts; 1 disables re-resolving and retries.
	MaxAttempts int
	// RetryAfter: DefaultRetryAfter, rounded up to whole seconds.
	RetryAfter time.Duration

	// MaxConns: DefaultMaxConns. Used by NewServer.
	MaxConns int

	// TrustedProxies lists the peers whose X-Forwarded-For, -Proto and -Host
	// the proxy keeps (appending the peer to X-Forwarded-For). From every
	// other peer, and by default from all, these fields and Forwarded are
	// replaced: the pinboard is assumed to be the edge.
	TrustedProxies []netip.Prefix
}

// ErrNoResolver is returned by New when Config.Resolver is nil: set it to the
// placement resolver (internal/pinboard/placement), or a static one in tests
// (proxytest.Static).
var ErrNoResolver = errors.New("proxy: Config.Resolver is required")

func (c *Config) setDefaults() error {
	if c.Resolver == nil {
		return ErrNoResolver
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = metrics.NewSet()
	}
	def64(&c.MaxRequestBodySize, DefaultMaxRequestBodySize)
	def(&c.MaxHeaderBytes, DefaultMaxHeaderBytes)
	def(&c.MaxHeaderFields, DefaultMaxHeaderFields)
	def(&c.MaxResponseHeaderBytes, DefaultMaxResponseHeaderBytes)
	def(&c.MaxIDLen, wire.MaxIDLen)
	def(&c.ReplayBodyMax, DefaultReplayBodyMax)
	def(&c.BufferedResponseMax, DefaultBufferedResponseMax)
	def(&c.StreamBufferSize, DefaultStreamBufferSize)
	def64(&c.SpliceMin, DefaultSpliceMin)
	def(&c.SplicePipeSize, DefaultSplicePipeSize)
	defD(&c.HeaderTimeout, DefaultHeaderTimeout)
	defD(&c.IdleTimeout, DefaultIdleTimeout)
	defD(&c.WriteTimeout, DefaultWriteTimeout)
	defD(&c.ResponseHeaderTimeout, DefaultResponseHeaderTimeout)
	defD(&c.StreamIdleTimeout, DefaultStreamIdleTimeout)
	defD(&c.LingerTimeout, DefaultLingerTimeout)
	def(&c.MaxTunnels, DefaultMaxTunnels)
	defD(&c.TunnelIdleTimeout, DefaultTunnelIdleTimeout)
	defD(&c.TunnelHandshakeTimeout, DefaultTunnelHandshakeTimeout)
	def(&c.MaxAttempts, DefaultMaxAttempts)
	defD(&c.RetryAfter, DefaultRetryAfter)
	def(&c.MaxConns, DefaultMaxConns)
	defD(&c.EndpointSweepInterval, DefaultEndpointSweepInterval)
	if err := c.Endpoint.setDefaults(); err != nil {
		return err
	}

	switch {
	case c.MaxIDLen < 0 || c.MaxIDLen > wire.MaxIDLen:
		return fmt.Errorf("proxy: MaxIDLen %d outside 1..%d", c.MaxIDLen, wire.MaxIDLen)
	case c.MaxHeaderBytes < 1024:
		return fmt.Errorf("proxy: MaxHeaderBytes %d is below 1024", c.MaxHeaderBytes)
	case c.MaxHeaderFields < 0:
		return fmt.Errorf("proxy: MaxHeaderFields %d is negative", c.MaxHeaderFields)
	case c.MaxResponseHeaderBytes < 1024:
		return fmt.Errorf("proxy: MaxResponseHeaderBytes %d is below 1024", c.MaxResponseHeaderBytes)
	case c.StreamBufferSize < 512:
		return fmt.Errorf("proxy: StreamBufferSize %d is below 512", c.StreamBufferSize)
	case c.MaxAttempts < 0 || c.MaxTunnels < 0 || c.MaxConns < 0:
		return errors.New("proxy: MaxAttempts, MaxTunnels and MaxConns must not be negative")
	case c.HeaderTimeout < 0 || c.IdleTimeout < 0 || c.WriteTimeout < 0 || c.ResponseHeaderTimeout < 0 ||
		c.StreamIdleTimeout < 0 || c.TunnelIdleTimeout < 0 || c.TunnelHandshakeTimeout < 0 || c.RetryAfter < 0 ||
		c.EndpointSweepInterval < 0:
		return errors.New("proxy: timeouts must not be negative")
	}
	return nil
}

func def(v *int, d int) {
	if *v == 0 {
		*v = d
	}
}

func def64(v *int64, d int64) {
	if *v == 0 {
		*v = d
	}
}

func defD(v *time.Duration, d time.Duration) {
	if *v == 0 {
		*v = d
	}
}
