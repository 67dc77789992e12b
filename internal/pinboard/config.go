package pinboard

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/base/cmdline"

	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/redisstore"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/registry"
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

// Environment variables, each also settable by the flag in the comment.
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
	EnvLoops             = "PINBOARD_LOOPS"                  // -loops
	EnvNoHotIDs          = "PINBOARD_NO_HOT_IDS"             // -no-hot-ids
	EnvRefreshAhead      = "PINBOARD_CACHE_REFRESH_AHEAD"    // -cache-refresh-ahead
	EnvNamespaceMemory   = "PINBOARD_NAMESPACE_MEMORY"       // -namespace-memory
	EnvSessionsReuse     = "PINBOARD_SESSIONS_REUSE"         // -sessions-reuse
	EnvFastFailover      = "PINBOARD_FAST_FAILOVER"          // -fast-failover
	EnvEpochTTL          = "PINBOARD_EPOCH_TTL"              // -epoch-ttl
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
	// EpochTTL is the stores' EpochTTL: how long an id's last activation
	// epoch is kept after its placement was written or released. Past it,
	// epochs rest on the clock alone (wire.NextEpoch).
	EpochTTL time.Duration
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
	// NoHotIDs turns the hot-id sketch's recording off: the proxy records
	// no request (the console's hot ids and traffic stay empty), which
	// costs nothing on the request path.
	NoHotIDs bool
	// RefreshAhead is placement.Config.RefreshAhead: how long before a
	// cached placement expires a request for it has it re-read in the
	// background. Zero: a quarter of the lease; negative: off.
	RefreshAhead time.Duration
	// NoFastFailover turns fast failover off (PINBOARD_FAST_FAILOVER=off):
	// a dead worker's ids then move only when its lease runs out in Redis,
	// as for a frozen or partitioned one.
	NoFastFailover bool
	// NamespaceMemory is placement.Config.NamespaceMemory: how long after
	// the pinboard last saw a live worker of a namespace a request for it,
	// with none live, is 503 no_worker rather than 404 unknown_namespace.
	// Zero: placement's default; negative: off (Redis's memory only).
	NamespaceMemory time.Duration
	// SessionsReuse is placement.Config.SessionsReuse: how long a
	// namespace's live sessions, decoded once, serve every cold placement.
	// Zero: off (every cold placement decodes them: cost linear in the
	// workers); the command's default is placement.DefaultSessionsReuse.
	SessionsReuse time.Duration
	// Loops is the number of event loops serving the public port
	// (proxy.Front); 0 serves it with fasthttp's goroutine per connection
	// alone. ParseSettings defaults it to the number of CPUs.
	Loops int
	// Proxy holds the data plane's limits set by flags or variables
	// (limits.go), those of each worker's pool in Proxy.Endpoint; zero
	// fields mean the proxy package's defaults.
	Proxy proxy.Config
	// Alarms holds the alarm scheduler's settings and the per-instance
	// alarm cap (alarms.go); zero fields mean the defaults.
	Alarms AlarmSettings
	// Unknown lists the PINBOARD_* variables no setting declares (likely
	// typos); Main logs a warning for each.
	Unknown []cmdline.UnknownVar
}

// ParseSettings reads flags (args, without the program name) and the
// environment (environ, KEY=VALUE entries as os.Environ). A flag wins over
// its variable, a variable over the default. Errors are usage errors
// (cmdline.UsageError) naming the variable or flag to fix; for -h it writes
// every setting to stdout and returns flag.ErrHelp, for -version the
// version and cmdline.ErrVersion.
func ParseSettings(args, environ []string, stdout io.Writer) (Settings, error) {
	var s Settings
	set, finish := declare(&s)
	if err := set.Parse(args, environ, stdout); err != nil {
		return s, err
	}
	s.Unknown = set.Unknown(environ)
	return s, cmdline.Usage(finish(environ))
}

// declare puts every setting of the pinboard on a cmdline.Set writing into
// s; finish derives what depends on several settings (the restart fence's
// default, the tokens) once the Set was parsed.
func declare(s *Settings) (set *cmdline.Set, finish func(environ []string) error) {
	set = cmdline.New("pinboard", "PINBOARD_", `The pinned pinboard: the worker registry and the proxy that routes
/<namespace>/<id>/... to the worker holding the instance.
Exit status: 0 after a clean shutdown, 1 when a listener fails,
2 for a bad configuration. See docs/operations.md.`)
	set.ListenAddr(&s.Listen, "listen", EnvListen, DefaultListen, "public address: the registry, /healthz and the proxy")
	set.ListenAddr(&s.AdminListen, "admin-listen", EnvAdminListen, DefaultAdminListen,
		"admin address: /metrics and /debug/pprof (never on the public port)")
	set.String(&s.RedisURL, "redis-url", EnvRedisURL, "url", DefaultRedisURL,
		"Redis: redis://[user:pass@]host:port/db, rediss:// for TLS, ?addr=h2:p2 for more cluster seeds,\n"+
			"?master_set=<name> for Redis Sentinel (then the host and addr values are sentinels; docs/redis.md)")
	var token string
	set.String(&token, "", EnvToken, "tokens", "",
		"deployment token(s), comma-separated (new,old during a rotation); no flag: argv is visible to every user.\nRequired unless -dev or "+EnvTokenFile)
	set.String(&s.TokenFile, "token-file", EnvTokenFile, "path", "",
		"file with the deployment token(s), one per line (# comments), re-read on SIGHUP")
	s.Lease = DefaultLease
	set.Var(minDuration(&s.Lease, MinLease), "lease", EnvLease, "duration",
		"lease granted to every worker (what a worker asks for is ignored)")
	fence := restartFence{lease: true}
	set.Var(cmdline.Parsed[restartFence]{P: &fence, Parse: parseFence, Format: restartFence.String}, "restart-fence", EnvRestartFence, "duration|lease",
		"refuse new placements (503 + Retry-After) while Redis has been up for less than this, so that a Redis\n"+
			"restarted without persistence cannot get an id placed twice; lease = the lease, 0 = off (only when\n"+
			"Redis persists every write)")
	s.EpochTTL = store.DefaultEpochTTL
	set.Var(minDuration(&s.EpochTTL, time.Second), "epoch-ttl", EnvEpochTTL, "duration",
		"how long an id's last activation epoch is kept after its placement was written or released; past it,\n"+
			"new epochs rest on Redis's clock alone (they still increase unless that clock steps back)")
	s.StoreProbe, s.StoreProbeTimeout = redisstore.DefaultCircuitProbeInterval, redisstore.DefaultCircuitProbeTimeout
	set.Var(cmdline.Parsed[time.Duration]{P: &s.StoreProbe, Parse: func(v string) (time.Duration, error) {
		if v == "off" {
			return -1, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Millisecond {
			return 0, errors.New("want a duration of at least 1ms, such as 250ms, or off")
		}
		return d, nil
	}, Format: func(d time.Duration) string {
		if d < 0 {
			return "off"
		}
		return d.String()
	}}, "store-probe", EnvStoreProbe, "duration|off",
		"while Redis is known to be down, store calls fail at once (503 store + Retry-After) and Redis is pinged\n"+
			"this often until it answers; off = every call waits for Redis up to its own deadline (docs/redis.md)")
	set.Var(minDuration(&s.StoreProbeTimeout, time.Millisecond), "store-probe-timeout", EnvStoreProbeTimeout, "duration",
		"a Redis that does not answer a probe's PING within this counts as down")
	set.Var(cmdline.Parsed[[]netip.Prefix]{P: &s.AdvertiseNetworks, Parse: cidrs, Format: prefixesString}, "advertise-networks", EnvAdvertiseNetworks, "cidr-list",
		"comma-separated CIDRs advertise URLs must resolve into; empty = loopback, private and public addresses,\nno special-purpose ranges")
	set.Var(cmdline.Parsed[[]uint16]{P: &s.AdvertisePorts, Parse: ports, Format: portsString}, "advertise-ports", EnvAdvertisePorts, "port-list",
		"comma-separated ports advertise URLs may use; empty = any")
	s.NonceTTL = registry.DefaultNonceTTL
	set.Var(cmdline.Parsed[time.Duration]{P: &s.NonceTTL, Parse: func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > registry.MaxNonceTTL {
			return 0, fmt.Errorf("want a duration from 1s to %v", registry.MaxNonceTTL)
		}
		return d, nil
	}, Format: time.Duration.String}, "nonce-ttl", EnvNonceTTL, "duration", "how long a used challenge is remembered (a reuse is refused), 1s to 30s")
	for _, l := range []struct {
		flag, env, usage string
		p                *registry.Limit
		def              registry.Limit
	}{
		{"register-ip-rate", EnvRegisterIPRate, "registrations per client IP (IPv6 per /64)", &s.RegisterIPLimit, registry.DefaultRegisterIPLimit},
		{"register-token-rate", EnvRegisterTokenRate, "registrations per deployment token", &s.RegisterTokenLimit, registry.DefaultRegisterTokenLimit},
		{"auth-failure-rate", EnvAuthFailureRate, "failed authentications per client IP", &s.AuthFailureLimit, registry.DefaultAuthFailureLimit},
	} {
		*l.p = l.def
		set.Var(cmdline.Parsed[registry.Limit]{P: l.p, Parse: registry.ParseLimit, Format: limitString}, l.flag, l.env, "rate",
			l.usage+": N/PERIOD [burst B], or off; beyond: 429 + Retry-After")
	}
	s.MaxSessionsPerToken = registry.DefaultMaxSessionsPerToken
	set.Var(cmdline.Parsed[int]{P: &s.MaxSessionsPerToken, Parse: func(v string) (int, error) {
		if v == "off" {
			return -1, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, errors.New("want a positive number or off")
		}
		return n, nil
	}, Format: func(n int) string {
		if n < 0 {
			return "off"
		}
		return strconv.Itoa(n)
	}}, "max-sessions-per-token", EnvMaxSessions, "int|off", "live sessions per deployment token; beyond: 429 + Retry-After")
	s.MaxTrackedClients = registry.DefaultMaxTrackedClients
	set.Var(positive(&s.MaxTrackedClients), "max-tracked-clients", EnvMaxTrackedClients, "int",
		"client IPs each per-IP limit remembers (least recently used dropped first)")
	s.ShutdownTimeout = DefaultShutdownTimeout
	set.Var(minDuration(&s.ShutdownTimeout, time.Millisecond), "shutdown-timeout", EnvShutdownTimeout, "duration",
		"bound on graceful shutdown after SIGTERM or SIGINT")
	set.Var(minDuration(&s.ShutdownDelay, 0), "shutdown-delay", EnvShutdownDelay, "duration",
		"how long /healthz reports shutting down before the listener closes")
	set.Var(cmdline.Parsed[slog.Level]{P: &s.LogLevel, Parse: func(v string) (slog.Level, error) {
		var l slog.Level
		if err := l.UnmarshalText([]byte(v)); err != nil {
			return 0, errors.New("want debug, info, warn or error")
		}
		return l, nil
	}, Format: func(l slog.Level) string { return strings.ToLower(l.String()) }}, "log-level", EnvLogLevel, "level", "debug, info, warn or error")
	set.Var(cmdline.Parsed[bool]{P: &s.LogJSON, Parse: func(v string) (bool, error) {
		switch v {
		case "text":
			return false, nil
		case "json":
			return true, nil
		}
		return false, errors.New("want text or json")
	}, Format: func(j bool) string { return map[bool]string{false: "text", true: "json"}[j] }}, "log-format", EnvLogFormat, "format", "log records on stderr as text or json")
	set.Bool(&s.Dev, "dev", "", "development mode: in-memory store (nothing survives a restart), a generated token printed on stdout")
	set.Bool(&s.NoHotIDs, "no-hot-ids", EnvNoHotIDs, "record no request in the console's hot-id sketch (GET /registry/hot and /registry/traffic stay empty)")
	set.Var(cmdline.Parsed[time.Duration]{P: &s.RefreshAhead, Parse: func(v string) (time.Duration, error) {
		switch v {
		case "off":
			return -1, nil
		case "lease/4":
			return 0, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, errors.New("want a positive duration up to the lease, lease/4, or off")
		}
		return d, nil
	}, Format: func(d time.Duration) string {
		switch {
		case d < 0:
			return "off"
		case d == 0:
			return "lease/4"
		}
		return d.String()
	}}, "cache-refresh-ahead", EnvRefreshAhead, "duration|lease/4|off",
		"a request for a cached placement this close to its expiry (the lease after Redis last confirmed it) has it\n"+
			"re-read in the background, so that hot ids never wait for Redis; off = the first request after each expiry waits")
	set.Var(cmdline.Parsed[bool]{P: &s.NoFastFailover, Parse: func(v string) (bool, error) {
		switch v {
		case "on":
			return false, nil
		case "off":
			return true, nil
		}
		return false, errors.New("want on or off")
	}, Format: func(off bool) string { return map[bool]string{false: "on", true: "off"}[off] }}, "fast-failover", EnvFastFailover, "on|off",
		"on: a worker whose process is gone (connections to its address refused) loses its ids at once;\n"+
			"off: only when its lease runs out, as a frozen or partitioned one")
	s.NamespaceMemory = placement.DefaultNamespaceMemory
	set.Var(cmdline.Parsed[time.Duration]{P: &s.NamespaceMemory, Parse: func(v string) (time.Duration, error) {
		if v == "off" {
			return -1, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, errors.New("want a positive duration, or off")
		}
		return d, nil
	}, Format: func(d time.Duration) string {
		if d < 0 {
			return "off"
		}
		return d.String()
	}}, "namespace-memory", EnvNamespaceMemory, "duration|off",
		"a namespace with no live worker is answered 503 no_worker (retry) for this long after the pinboard last saw\n"+
			"one live, else 404 unknown_namespace; Redis also remembers it until its last session is collected")
	s.SessionsReuse = placement.DefaultSessionsReuse
	set.Var(cmdline.Parsed[time.Duration]{P: &s.SessionsReuse, Parse: func(v string) (time.Duration, error) {
		if v == "off" {
			return 0, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > time.Second {
			return 0, errors.New("want a duration up to 1s, or off")
		}
		return d, nil
	}, Format: func(d time.Duration) string {
		if d <= 0 {
			return "off"
		}
		return d.String()
	}}, "sessions-reuse", EnvSessionsReuse, "duration|off",
		"how long a namespace's live workers, listed once, serve every new placement (off: listed per placement,\n"+
			"a cost linear in the workers); a registration, drain or headroom change shows that much later")
	s.Loops = proxy.DefaultLoops()
	set.Var(cmdline.Parsed[int]{P: &s.Loops, Parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 256 {
			return 0, errors.New("want 0 to 256")
		}
		return n, nil
	}, Format: strconv.Itoa}, "loops", EnvLoops, "int",
		"event loops serving the public port (default: one per CPU); 0: fasthttp's goroutine per connection only")
	declareProxyLimits(set, s)
	declareAlarmSettings(set, s)
	return set, func(environ []string) error {
		s.RestartFence = fence.d
		if fence.lease {
			s.RestartFence = s.Lease
		}
		if s.RefreshAhead > s.Lease {
			return fmt.Errorf("%s %v exceeds the lease %v: a placement is re-read at the latest one lease after Redis confirmed it", EnvRefreshAhead, s.RefreshAhead, s.Lease)
		}
		if err := s.Alarms.check(); err != nil {
			return err
		}
		return s.readTokens(token)
	}
}

// readTokens sets s.Tokens from PINBOARD_TOKEN (tok), the token file, or
// -dev's generated token, in that order; exactly one source may be given.
func (s *Settings) readTokens(tok string) error {
	file := s.TokenFile
	var err error
	switch {
	case tok != "" && file != "":
		return fmt.Errorf("both %s and %s are set: set one", EnvToken, EnvTokenFile)
	case tok != "":
		s.Tokens = splitTokens(strings.Split(tok, ","))
		s.TokenFile = ""
	case file != "":
		if s.Tokens, err = ReadTokenFile(file); err != nil {
			return err
		}
	case s.Dev:
		s.Tokens, s.DevToken = []string{newDevToken()}, true
	default:
		return fmt.Errorf("%s (or %s) is required: the deployment token workers and operators present (run with -dev for a local pinboard)", EnvToken, EnvTokenFile)
	}
	if len(s.Tokens) == 0 {
		return fmt.Errorf("%s holds no token", cmp.Or(file, EnvToken))
	}
	return nil
}

// restartFence is the -restart-fence setting: the lease, or a duration.
type restartFence struct {
	lease bool
	d     time.Duration
}

func parseFence(v string) (restartFence, error) {
	if v == "lease" {
		return restartFence{lease: true}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return restartFence{}, errors.New("want lease, 0 or a duration such as 30s")
	}
	return restartFence{d: d}, nil
}

func (f restartFence) String() string {
	if f.lease {
		return "lease"
	}
	return f.d.String()
}

// minDuration is a duration setting refusing values below least.
func minDuration(p *time.Duration, least time.Duration) cmdline.Parsed[time.Duration] {
	return cmdline.Parsed[time.Duration]{P: p, Parse: func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d < least {
			return 0, fmt.Errorf("want a duration of at least %v, such as 10s", least)
		}
		return d, nil
	}, Format: time.Duration.String}
}

// positive is an int setting refusing values below 1.
func positive(p *int) cmdline.Parsed[int] {
	return cmdline.Parsed[int]{P: p, Parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, errors.New("want a positive number")
		}
		return n, nil
	}, Format: strconv.Itoa}
}

// cidrs reads a comma-separated list of CIDRs ("" = none), masked.
func cidrs(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for c := range strings.SplitSeq(v, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR (e.g. 10.0.0.0/8)", c)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func prefixesString(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// ports reads a comma-separated list of ports ("" = any).
func ports(v string) ([]uint16, error) {
	var out []uint16
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not a port (1-65535)", p)
		}
		out = append(out, uint16(n))
	}
	return out, nil
}

func portsString(ps []uint16) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
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
