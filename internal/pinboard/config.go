package pinboard

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/registry"
	"github.com/pinned-go/pinned/internal/store/redisstore"
	"github.com/pinned-go/pinned/proxy"
)

// Defaults of the pinboard's settings.
const (
	DefaultListen          = ":8080"
	DefaultAdminListen     = "127.0.0.1:9090"
	DefaultRedisURL        = "redis://127.0.0.1:6379/0"
	DefaultLease           = registry.DefaultLease
	DefaultShutdownTimeout = 15 * time.Second
	// MinLease is the shortest PINBOARD_LEASE accepted: workers heartbeat
	// every few seconds and abort 5 s before expiry by default, so a lease
	// much below the default only makes sense for tests.
	MinLease = time.Second
)

// Environment variables, each also settable by the flag in brackets.
const (
	EnvListen            = "PINBOARD_LISTEN"                 // -listen
	EnvAdminListen       = "PINBOARD_ADMIN_LISTEN"           // -admin-listen
	EnvRedisURL          = "PINBOARD_REDIS_URL"              // -redis-url
	EnvToken             = "PINBOARD_TOKEN"                  // (no flag: argv is visible to every user)
	EnvTokenFile         = "PINBOARD_TOKEN_FILE"             // -token-file
	EnvLease             = "PINBOARD_LEASE"                  // -lease
	EnvAdvertiseNetworks = "PINBOARD_ADVERTISE_NETWORKS"     // -advertise-networks
	EnvAdvertisePorts    = "PINBOARD_ADVERTISE_PORTS"        // -advertise-ports
	EnvNonceTTL          = "PINBOARD_NONCE_TTL"              // -nonce-ttl
	EnvRegisterIPRate    = "PINBOARD_REGISTER_IP_RATE"       // -register-ip-rate
	EnvRegisterTokenRate = "PINBOARD_REGISTER_TOKEN_RATE"    // -register-token-rate
	EnvAuthFailureRate   = "PINBOARD_AUTH_FAILURE_RATE"      // -auth-failure-rate
	EnvMaxSessions       = "PINBOARD_MAX_SESSIONS_PER_TOKEN" // -max-sessions-per-token
	EnvMaxTrackedClients = "PINBOARD_MAX_TRACKED_CLIENTS"    // -max-tracked-clients
	EnvShutdownTimeout   = "PINBOARD_SHUTDOWN_TIMEOUT"       // -shutdown-timeout
	EnvShutdownDelay     = "PINBOARD_SHUTDOWN_DELAY"         // -shutdown-delay
	EnvLogLevel          = "PINBOARD_LOG_LEVEL"              // -log-level
	EnvLogFormat         = "PINBOARD_LOG_FORMAT"             // -log-format
	EnvRestartFence      = "PINBOARD_RESTART_FENCE"          // -restart-fence
	EnvStoreProbe        = "PINBOARD_STORE_PROBE"            // -store-probe
	EnvStoreProbeTimeout = "PINBOARD_STORE_PROBE_TIMEOUT"    // -store-probe-timeout
)

// Settings is the parsed command line and environment: everything Main
// needs besides the data plane. ParseSettings fills it.
type Settings struct {
	Listen      string
	AdminListen string
	RedisURL    string
	Tokens      []string
	TokenFile   string // re-read by Pinboard.ReloadTokens (SIGHUP)
	DevToken    bool   // the token was generated for -dev
	Lease       time.Duration
	// RestartFence is redisstore.Config.RestartFence: no placement is
	// written while Redis has been up for less (0: off). ParseSettings
	// defaults it to the lease: a Redis that restarted without persistence
	// has forgotten every placement while workers may still serve under
	// leases granted before, so no id is placed anew until those leases
	// have run out. Turn it off only when Redis persists every write.
	RestartFence time.Duration
	// StoreProbe and StoreProbeTimeout are redisstore's circuit
	// (Config.CircuitProbeInterval, CircuitProbeTimeout): while Redis is
	// known to be down every store call fails at once (503 store +
	// Retry-After) and a probe pings Redis every StoreProbe. Zero values
	// mean redisstore's defaults; a negative StoreProbe turns it off.
	StoreProbe, StoreProbeTimeout time.Duration
	AdvertiseNetworks             []netip.Prefix
	// The registry's hardening options (registry.Config fields of the same
	// names); zero values mean the registry's defaults.
	AdvertisePorts      []uint16
	NonceTTL            time.Duration
	RegisterIPLimit     registry.Limit
	RegisterTokenLimit  registry.Limit
	AuthFailureLimit    registry.Limit
	MaxSessionsPerToken int // negative: no cap
	MaxTrackedClients   int
	ShutdownTimeout     time.Duration
	ShutdownDelay       time.Duration
	Dev                 bool
	LogLevel            slog.Level
	LogJSON             bool
	// Proxy and Endpoint hold the data plane's limits set by flags or
	// variables (limits.go); zero fields mean the proxy package's defaults.
	Proxy    proxy.Config
	Endpoint proxy.EndpointConfig
}

// ParseSettings reads flags (args, without the program name) and the
// environment (getenv). A flag wins over its variable, a variable over the
// default. Errors name the variable or flag to fix; flag.ErrHelp is
// returned for -h.
func ParseSettings(args []string, getenv func(string) string, usage io.Writer) (Settings, error) {
	s := Settings{}
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	fs := flag.NewFlagSet("pinboard", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.StringVar(&s.Listen, "listen", env(EnvListen, DefaultListen), "public address: the registry, /healthz and the proxy ("+EnvListen+")")
	fs.StringVar(&s.AdminListen, "admin-listen", env(EnvAdminListen, DefaultAdminListen), "admin address: /metrics and /debug/pprof ("+EnvAdminListen+")")
	fs.StringVar(&s.RedisURL, "redis-url", env(EnvRedisURL, DefaultRedisURL), "Redis URL ("+EnvRedisURL+")")
	fs.StringVar(&s.TokenFile, "token-file", getenv(EnvTokenFile), "file with the deployment token(s), one per line, reloaded on SIGHUP ("+EnvTokenFile+")")
	lease := fs.String("lease", env(EnvLease, DefaultLease.String()), "lease granted to workers ("+EnvLease+")")
	fence := fs.String("restart-fence", env(EnvRestartFence, "lease"), "refuse new placements (503 + Retry-After) while Redis has been up for less than this, so that a Redis restarted without persistence cannot get an id placed twice; \"lease\" = the lease, 0 = off (only when Redis persists every write) ("+EnvRestartFence+")")
	probe := fs.String("store-probe", env(EnvStoreProbe, redisstore.DefaultCircuitProbeInterval.String()), "while Redis is known to be down, store calls fail at once and Redis is pinged this often; off = always wait for Redis ("+EnvStoreProbe+")")
	probeTimeout := fs.String("store-probe-timeout", env(EnvStoreProbeTimeout, redisstore.DefaultCircuitProbeTimeout.String()), "a Redis that does not answer a probe's PING within this counts as down ("+EnvStoreProbeTimeout+")")
	nets := fs.String("advertise-networks", getenv(EnvAdvertiseNetworks), "comma-separated CIDRs advertise URLs must resolve into; empty = loopback, private and public addresses, no special-purpose ranges ("+EnvAdvertiseNetworks+")")
	ports := fs.String("advertise-ports", getenv(EnvAdvertisePorts), "comma-separated ports advertise URLs may use; empty = any ("+EnvAdvertisePorts+")")
	nonceTTL := fs.String("nonce-ttl", env(EnvNonceTTL, registry.DefaultNonceTTL.String()), "how long a used challenge is remembered, at most 30s ("+EnvNonceTTL+")")
	regIP := fs.String("register-ip-rate", env(EnvRegisterIPRate, limitString(registry.DefaultRegisterIPLimit)), "registrations per client IP: N/PERIOD [burst B], or off ("+EnvRegisterIPRate+")")
	regTok := fs.String("register-token-rate", env(EnvRegisterTokenRate, limitString(registry.DefaultRegisterTokenLimit)), "registrations per deployment token: N/PERIOD [burst B], or off ("+EnvRegisterTokenRate+")")
	authFail := fs.String("auth-failure-rate", env(EnvAuthFailureRate, limitString(registry.DefaultAuthFailureLimit)), "failed authentications per client IP: N/PERIOD [burst B], or off ("+EnvAuthFailureRate+")")
	maxSess := fs.String("max-sessions-per-token", env(EnvMaxSessions, strconv.Itoa(registry.DefaultMaxSessionsPerToken)), "live sessions per deployment token, or off ("+EnvMaxSessions+")")
	tracked := fs.String("max-tracked-clients", env(EnvMaxTrackedClients, strconv.Itoa(registry.DefaultMaxTrackedClients)), "client IPs each rate limit remembers (LRU) ("+EnvMaxTrackedClients+")")
	shutdown := fs.String("shutdown-timeout", env(EnvShutdownTimeout, DefaultShutdownTimeout.String()), "bound on graceful shutdown ("+EnvShutdownTimeout+")")
	delay := fs.String("shutdown-delay", env(EnvShutdownDelay, "0s"), "time /healthz reports shutting down before the listener closes ("+EnvShutdownDelay+")")
	level := fs.String("log-level", env(EnvLogLevel, "info"), "debug, info, warn or error ("+EnvLogLevel+")")
	format := fs.String("log-format", env(EnvLogFormat, "text"), "text or json ("+EnvLogFormat+")")
	fs.BoolVar(&s.Dev, "dev", false, "development mode: in-memory store, generated token printed at start")
	proxyLimits := addProxyFlags(fs, getenv, &s)
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if err := proxyLimits(); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	dur := func(name, v string, min time.Duration) time.Duration {
		d, e := time.ParseDuration(v)
		if e == nil && d < min {
			e = fmt.Errorf("must be at least %v", min)
		}
		if e != nil && err == nil {
			err = fmt.Errorf("%s=%q: %v", name, v, e)
		}
		return d
	}
	s.Lease = dur(EnvLease, *lease, MinLease)
	if *fence == "lease" {
		s.RestartFence = s.Lease
	} else {
		s.RestartFence = dur(EnvRestartFence, *fence, 0)
	}
	if *probe == "off" {
		s.StoreProbe = -1
	} else {
		s.StoreProbe = dur(EnvStoreProbe, *probe, time.Millisecond)
	}
	s.StoreProbeTimeout = dur(EnvStoreProbeTimeout, *probeTimeout, time.Millisecond)
	s.ShutdownTimeout = dur(EnvShutdownTimeout, *shutdown, time.Millisecond)
	s.ShutdownDelay = dur(EnvShutdownDelay, *delay, 0)
	s.NonceTTL = dur(EnvNonceTTL, *nonceTTL, time.Second)
	if err != nil {
		return s, err
	}
	if s.NonceTTL > registry.MaxNonceTTL {
		return s, fmt.Errorf("%s=%q: must be at most %v", EnvNonceTTL, *nonceTTL, registry.MaxNonceTTL)
	}
	for _, l := range []struct {
		name, v string
		dst     *registry.Limit
	}{{EnvRegisterIPRate, *regIP, &s.RegisterIPLimit}, {EnvRegisterTokenRate, *regTok, &s.RegisterTokenLimit}, {EnvAuthFailureRate, *authFail, &s.AuthFailureLimit}} {
		lim, e := registry.ParseLimit(l.v)
		if e != nil {
			return s, fmt.Errorf("%s: %v", l.name, e)
		}
		*l.dst = lim
	}
	s.MaxSessionsPerToken = -1
	if *maxSess != "off" {
		n, e := strconv.Atoi(*maxSess)
		if e != nil || n <= 0 {
			return s, fmt.Errorf("%s=%q: want a positive number or off", EnvMaxSessions, *maxSess)
		}
		s.MaxSessionsPerToken = n
	}
	n, e := strconv.Atoi(*tracked)
	if e != nil || n <= 0 {
		return s, fmt.Errorf("%s=%q: want a positive number", EnvMaxTrackedClients, *tracked)
	}
	s.MaxTrackedClients = n
	if *ports != "" {
		for _, p := range strings.Split(*ports, ",") {
			n, e := strconv.ParseUint(strings.TrimSpace(p), 10, 16)
			if e != nil || n == 0 {
				return s, fmt.Errorf("%s: %q is not a port (1-65535)", EnvAdvertisePorts, p)
			}
			s.AdvertisePorts = append(s.AdvertisePorts, uint16(n))
		}
	}
	for _, a := range []struct{ name, v string }{{EnvListen, s.Listen}, {EnvAdminListen, s.AdminListen}} {
		if _, _, e := net.SplitHostPort(a.v); e != nil {
			return s, fmt.Errorf("%s=%q: want host:port (%v)", a.name, a.v, e)
		}
	}
	if *nets != "" {
		for _, c := range strings.Split(*nets, ",") {
			p, e := netip.ParsePrefix(strings.TrimSpace(c))
			if e != nil {
				return s, fmt.Errorf("%s: %q is not a CIDR (e.g. 10.0.0.0/8)", EnvAdvertiseNetworks, c)
			}
			s.AdvertiseNetworks = append(s.AdvertiseNetworks, p.Masked())
		}
	}
	if e := s.LogLevel.UnmarshalText([]byte(*level)); e != nil {
		return s, fmt.Errorf("%s=%q: want debug, info, warn or error", EnvLogLevel, *level)
	}
	switch *format {
	case "text":
	case "json":
		s.LogJSON = true
	default:
		return s, fmt.Errorf("%s=%q: want text or json", EnvLogFormat, *format)
	}
	tok, file := getenv(EnvToken), s.TokenFile
	switch {
	case tok != "" && file != "":
		return s, fmt.Errorf("both %s and %s are set: set one", EnvToken, EnvTokenFile)
	case tok != "":
		s.Tokens = splitTokens(strings.Split(tok, ","))
		s.TokenFile = ""
	case file != "":
		if s.Tokens, err = ReadTokenFile(file); err != nil {
			return s, err
		}
	case s.Dev:
		s.Tokens, s.DevToken = []string{newDevToken()}, true
	default:
		return s, fmt.Errorf("%s (or %s) is required: the deployment token workers and operators present (run with -dev for a local pinboard)", EnvToken, EnvTokenFile)
	}
	if len(s.Tokens) == 0 {
		return s, fmt.Errorf("%s holds no token", cmp.Or(file, EnvToken))
	}
	return s, nil
}

// limitString writes a limit the way registry.ParseLimit reads it.
func limitString(l registry.Limit) string {
	per := l.Per.String()
	switch l.Per {
	case time.Second:
		per = "s"
	case time.Minute:
		per = "m"
	case time.Hour:
		per = "h"
	}
	return fmt.Sprintf("%d/%s burst %d", l.Events, per, l.Burst)
}

func splitTokens(parts []string) []string {
	var out []string
	for _, p := range parts {
		if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(p, "#") {
			out = append(out, p)
		}
	}
	return out
}

// ReadTokenFile reads deployment tokens from path: one per line (the
// current one and, during a rotation, the previous one); blank lines and
// lines starting with '#' are ignored.
func ReadTokenFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvTokenFile, err)
	}
	toks := splitTokens(strings.Split(string(b), "\n"))
	if len(toks) == 0 {
		return nil, fmt.Errorf("%s: %s holds no token", EnvTokenFile, path)
	}
	return toks, nil
}

func newDevToken() string {
	var b [24]byte
	rand.Read(b[:])
	return "dev-" + hex.EncodeToString(b[:])
}
