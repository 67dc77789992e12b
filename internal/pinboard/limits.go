package pinboard

import (
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

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
	{flag: "header-timeout", usage: "time to receive a request head (slowloris; 408 and close)", def: proxy.DefaultHeaderTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.HeaderTimeout }},
	{flag: "idle-timeout", usage: "keep-alive wait for a client's next request", def: proxy.DefaultIdleTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.IdleTimeout }},
	{flag: "write-timeout", usage: "time to write a buffered response to a client", def: proxy.DefaultWriteTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.WriteTimeout }},
	{flag: "response-header-timeout", usage: "wait for a worker's response head (504 beyond)", def: proxy.DefaultResponseHeaderTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.ResponseHeaderTimeout }},
	{flag: "stream-idle-timeout", usage: "a streamed body that moves no byte for this long is cut", def: proxy.DefaultStreamIdleTimeout,
		proxy: func(c *proxy.Config) *time.Duration { return &c.StreamIdleTimeout }},
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

// addProxyFlags registers the data plane's limits on fs; the returned
// function parses them into s.Proxy and s.Proxy.Endpoint after fs.Parse. Only
// limits that were set (flag or variable) are written, so every other one
// keeps the proxy's default.
func addProxyFlags(fs *flag.FlagSet, getenv func(string) string, s *Settings) func() error {
	ints := make([]*string, len(proxyIntLimits))
	for i, l := range proxyIntLimits {
		name := limitEnv(l.flag)
		ints[i] = fs.String(l.flag, getenv(name), fmt.Sprintf("%s (default %d) (%s)", l.usage, l.def, name))
	}
	durs := make([]*string, len(proxyDurationLimits))
	for i, l := range proxyDurationLimits {
		name := limitEnv(l.flag)
		durs[i] = fs.String(l.flag, getenv(name), fmt.Sprintf("%s (default %v) (%s)", l.usage, l.def, name))
	}
	trusted := fs.String("trusted-proxies", getenv(EnvTrustedProxies),
		"comma-separated CIDRs of proxies in front of the pinboard whose X-Forwarded-* fields are kept; empty: the pinboard is the edge ("+EnvTrustedProxies+")")
	return func() error {
		for i, l := range proxyIntLimits {
			v := *ints[i]
			if v == "" {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			neg := l.proxy64 != nil || l.flag == "replay-body-max" || l.flag == "worker-max-queue"
			if err != nil || n == 0 || (n < 0 && !(neg && n == -1)) || n > 1<<40 {
				want := "a positive number"
				if neg {
					want += " or -1"
				}
				return fmt.Errorf("%s=%q: want %s", limitEnv(l.flag), v, want)
			}
			switch {
			case l.proxy64 != nil:
				*l.proxy64(&s.Proxy) = n
			case l.proxy != nil:
				*l.proxy(&s.Proxy) = int(n)
			default:
				*l.endpoint(&s.Proxy.Endpoint) = int(n)
			}
		}
		for i, l := range proxyDurationLimits {
			v := *durs[i]
			if v == "" {
				continue
			}
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				return fmt.Errorf("%s=%q: want a positive duration such as 5s", limitEnv(l.flag), v)
			}
			if l.proxy != nil {
				*l.proxy(&s.Proxy) = d
			} else {
				*l.endpoint(&s.Proxy.Endpoint) = d
			}
		}
		if *trusted != "" {
			for _, c := range strings.Split(*trusted, ",") {
				p, err := netip.ParsePrefix(strings.TrimSpace(c))
				if err != nil {
					return fmt.Errorf("%s: %q is not a CIDR (e.g. 10.0.0.0/8)", EnvTrustedProxies, c)
				}
				s.Proxy.TrustedProxies = append(s.Proxy.TrustedProxies, p.Masked())
			}
		}
		return nil
	}
}
