package pinboard

import (
	"cmp"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/proxy"
)

// The data plane's limits, each a flag and a variable (PINBOARD_ + the flag
// name in upper case with '_' for '-'). Their defaults are the proxy
// package's; Settings.Proxy (with its Endpoint) holds what was set.
var proxyIntLimits = []struct {
	flag, usage string
	def         int64
	proxy       func(*proxy.Config) *int
	proxy64     func(*proxy.Config) *int64
	endpoint    func(*proxy.EndpointConfig) *int
}{
	{flag: "max-body-bytes", usage: "largest request body the proxy accepts (413 beyond); -1: no limit", def: proxy.DefaultMaxRequestBodySize,
		proxy64: func(c *proxy.Config) *int64 { return &c.MaxRequestBodySize }},
	{flag: "max-header-bytes", usage: "largest request head (431 beyond)", def: proxy.DefaultMaxHeaderBytes,
		proxy: func(c *proxy.Config) *int { return &c.MaxHeaderBytes }},
	{flag: "max-header-fields", usage: "most request header fields (431 beyond)", def: proxy.DefaultMaxHeaderFields,
		proxy: func(c *proxy.Config) *int { return &c.MaxHeaderFields }},
	{flag: "max-response-header-bytes", usage: "largest worker response head (502 beyond)", def: proxy.DefaultMaxResponseHeaderBytes,
		proxy: func(c *proxy.Config) *int { return &c.MaxResponseHeaderBytes }},
	{flag: "replay-body-max", usage: "request bodies up to this size are held so the request can be re-resolved; -1: never", def: proxy.DefaultReplayBodyMax,
		proxy: func(c *proxy.Config) *int { return &c.ReplayBodyMax }},
	{flag: "max-client-conns", usage: "client connections served at once", def: proxy.DefaultMaxConns,
		proxy: func(c *proxy.Config) *int { return &c.MaxConns }},
	{flag: "splice-min", usage: "bodies with a Content-Length of at least this, responses and requests, go from socket to socket with splice(2), not through the proxy's memory; -1: never", def: proxy.DefaultSpliceMin,
		proxy64: func(c *proxy.Config) *int64 { return &c.SpliceMin }},
	{flag: "splice-pipe-size", usage: "the pipe a spliced body goes through: the most of it held at a time", def: proxy.DefaultSplicePipeSize,
		proxy: func(c *proxy.Config) *int { return &c.SplicePipeSize }},
	{flag: "max-tunnels", usage: "open WebSocket tunnels (503 beyond)", def: proxy.DefaultMaxTunnels,
		proxy: func(c *proxy.Config) *int { return &c.MaxTunnels }},
	{flag: "max-attempts", usage: "sends of one request (the first plus re-resolves and retries)", def: proxy.DefaultMaxAttempts,
		proxy: func(c *proxy.Config) *int { return &c.MaxAttempts }},
	{flag: "worker-max-conns", usage: "requests in flight to one worker", def: proxy.DefaultMaxConnsPerWorker,
		endpoint: func(c *proxy.EndpointConfig) *int { return &c.MaxConns }},
	{flag: "worker-max-queue", usage: "requests waiting for one worker beyond worker-max-conns (503 beyond); -1: none", def: proxy.DefaultMaxQueuePerWorker,
		endpoint: func(c *proxy.EndpointConfig) *int { return &c.MaxQueue }},
}

var proxyDurationLimits = []struct {
	flag, usage string
	def         time.Duration
	proxy       func(*proxy.Config) *time.Duration
	endpoint    func(*proxy.EndpointConfig) *time.Duration
}{
	{flag: "header-timeout", usage: "time to receive a request head and the start of its body (slowloris; 408 naming which, and close)", def: proxy.DefaultHeaderTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.HeaderTimeout }},
	{flag: "idle-timeout", usage: "keep-alive wait for a client's next request", def: proxy.DefaultIdleTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.IdleTimeout }},
	{flag: "write-timeout", usage: "time to write a buffered response to a client", def: proxy.DefaultWriteTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.WriteTimeout }},
	{flag: "response-header-timeout", usage: "wait for a worker's response head (504 beyond)", def: proxy.DefaultResponseHeaderTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.ResponseHeaderTimeout }},
	{flag: "stream-idle-timeout", usage: "a streamed body that moves no byte for this long is cut", def: proxy.DefaultStreamIdleTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.StreamIdleTimeout }},
	{flag: "linger-timeout", usage: "after refusing a request, how long the connection discards the client's unread body before closing (so the client reads the refusal, not a reset)", def: proxy.DefaultLingerTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.LingerTimeout }},
	{flag: "tunnel-idle-timeout", usage: "a WebSocket tunnel that carries no byte for this long is closed", def: proxy.DefaultTunnelIdleTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.TunnelIdleTimeout }},
	{flag: "retry-after", usage: "Retry-After of the proxy's 503s (whole seconds)", def: proxy.DefaultRetryAfter,
		proxy: func(c *proxy.Config) *time.Duration { return &c.RetryAfter }},
	{flag: "worker-dial-timeout", usage: "time to connect to a worker", def: proxy.DefaultDialTimeout,
		endpoint: func(c *proxy.EndpointConfig) *time.Duration { return &c.DialTimeout }},
	{flag: "worker-queue-timeout", usage: "longest wait for a connection to a busy worker (503 overloaded beyond)", def: proxy.DefaultQueueTimeout,
		endpoint: func(c *proxy.EndpointConfig) *time.Duration { return &c.QueueTimeout }},
	{flag: "worker-idle-conn-timeout", usage: "an idle pooled connection to a worker is closed after this", def: proxy.DefaultIdleConnTimeout,
		endpoint: func(c *proxy.EndpointConfig) *time.Duration { return &c.IdleConnTimeout }},
}

// EnvTrustedProxies lists the peers whose X-Forwarded-* fields are kept
// (flag -trusted-proxies).
const EnvTrustedProxies = "PINBOARD_TRUSTED_PROXIES"

// limitEnv is the variable of a data-plane limit's flag.
func limitEnv(flagName string) string {
	return "PINBOARD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// declareProxyLimits puts the data plane's limits on set, writing into
// s.Proxy and s.Proxy.Endpoint. A limit that is not set stays zero there (the
// proxy's default, which -h shows).
func declareProxyLimits(set *cmdline.Set, s *Settings) {
	for _, l := range proxyIntLimits {
		neg := l.proxy64 != nil || l.flag == "replay-body-max" || l.flag == "worker-max-queue"
		write := func(n int64) {
			switch {
			case l.proxy64 != nil:
				*l.proxy64(&s.Proxy) = n
			case l.proxy != nil:
				*l.proxy(&s.Proxy) = int(n)
			default:
				*l.endpoint(&s.Proxy.Endpoint) = int(n)
			}
		}
		def := l.def
		set.Var(cmdline.Parsed[int64]{P: new(int64), Parse: func(v string) (int64, error) {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n == 0 || (n < 0 && !(neg && n == -1)) || n > 1<<40 {
				if neg {
					return 0, errors.New("want a positive number or -1")
				}
				return 0, errors.New("want a positive number")
			}
			write(n)
			return n, nil
		}, Format: func(n int64) string { return strconv.FormatInt(cmp.Or(n, def), 10) }}, l.flag, limitEnv(l.flag), "int", l.usage)
	}
	for _, l := range proxyDurationLimits {
		var p *time.Duration
		if l.proxy != nil {
			p = l.proxy(&s.Proxy)
		} else {
			p = l.endpoint(&s.Proxy.Endpoint)
		}
		def := l.def
		set.Var(cmdline.Parsed[time.Duration]{P: p, Parse: func(v string) (time.Duration, error) {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				return 0, errors.New("want a positive duration such as 5s")
			}
			return d, nil
		}, Format: func(d time.Duration) string { return cmp.Or(d, def).String() }}, l.flag, limitEnv(l.flag), "duration", l.usage)
	}
	set.Var(cmdline.Parsed[[]netip.Prefix]{P: &s.Proxy.TrustedProxies, Parse: cidrs, Format: prefixesString}, "trusted-proxies", EnvTrustedProxies, "cidr-list",
		"comma-separated CIDRs of proxies in front of the pinboard whose X-Forwarded-* fields are kept\n(appended to); empty: the pinboard is the edge and replaces them")
}
