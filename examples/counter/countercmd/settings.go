package countercmd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/cmdline"
)

// Settings are the counter's settings, each a flag and a PINNED_* variable
// (the flag wins); Load declares them with their defaults.
type Settings struct {
	Listen          string        // -listen: the main listener (in fleet mode, what the advertise URL reaches)
	AdminListen     string        // -admin-listen: loopback /metrics and /debug/pprof (admin.go); empty = none (local mode) or FleetAdminListen (fleet mode)
	IdleTimeout     time.Duration // -idle-timeout: host.Config.IdleTimeout
	MaxInstances    int           // -max-instances: host.Config.MaxInstances
	MaxBodyBytes    int           // -max-body-bytes: host.Config.MaxRequestBodySize, the server's limit too
	ShutdownTimeout time.Duration // -shutdown-timeout: bound on the whole graceful shutdown
	Fleet           Fleet
	Persist         string // -persist: Redis URL of the counts; empty = memory only
}

// Fleet configures fleet mode; all empty means local mode.
type Fleet struct {
	PinboardURL  string // PINNED_PINBOARD_URL
	Token        string // PINNED_TOKEN (never logged)
	AdvertiseURL string // PINNED_ADVERTISE_URL
}

// enabled reports whether any fleet setting is set (fleet mode; check
// requires all three).
func (f Fleet) enabled() bool {
	return f.PinboardURL != "" || f.Token != "" || f.AdvertiseURL != ""
}

// check says which fleet variable is missing when only some are set (a
// usage error).
func (f Fleet) check() error {
	var missing []string
	for _, v := range []struct{ name, val string }{
		{"PINNED_PINBOARD_URL", f.PinboardURL}, {"PINNED_TOKEN", f.Token}, {"PINNED_ADVERTISE_URL", f.AdvertiseURL},
	} {
		if v.val == "" {
			missing = append(missing, v.name)
		}
	}
	if len(missing) > 0 {
		return cmdline.Usagef("fleet mode needs PINNED_PINBOARD_URL, PINNED_TOKEN and PINNED_ADVERTISE_URL; missing %v (unset all three for local mode)", missing)
	}
	return nil
}

// EnvPersist names the variable -persist defaults to.
const EnvPersist = "PINNED_PERSIST"

// DefaultListen is the counter's address when neither -listen nor
// PINNED_LISTEN is set.
const DefaultListen = "127.0.0.1:8080"

// FleetAdminListen is the admin listener of fleet mode when none is set: a
// free loopback port, logged ("counter admin listening").
const FleetAdminListen = "127.0.0.1:0"

// DefaultShutdownTimeout is -shutdown-timeout's default.
const DefaultShutdownTimeout = 10 * time.Second

// declare declares every setting on set (a Set of the "PINNED_" prefix),
// each stored in s by set.Parse. A value the counter cannot run with is a
// usage error of Parse; settings that only fail together (a partial fleet
// configuration) are check's.
func (s *Settings) declare(set *cmdline.Set) {
	set.ListenAddr(&s.Listen, "listen", "PINNED_LISTEN", DefaultListen,
		"address of the demo's server (fleet mode: the advertise URL must reach it)")
	set.Var(cmdline.Parsed[string]{P: &s.AdminListen, Parse: adminAddr, Format: func(v string) string { return v }},
		"admin-listen", "PINNED_ADMIN_LISTEN", "host:port",
		"loopback admin listener: /metrics and /debug/pprof/*. Empty: none in local mode (/metrics is on -listen),\n"+
			FleetAdminListen+" (a free port, logged) in fleet mode (/metrics is never on the advertised listener)")
	set.Duration(&s.IdleTimeout, "idle-timeout", "PINNED_IDLE_TIMEOUT", host.DefaultIdleTimeout,
		"close an instance after this long without activity (negative: never)")
	s.MaxInstances = host.DefaultMaxInstances
	set.Var(positive(&s.MaxInstances, "a positive number of instances"), "max-instances", "PINNED_MAX_INSTANCES", "int",
		"live instances at most; more answer 503 capacity")
	s.MaxBodyBytes = host.DefaultMaxRequestBodySize
	set.Var(positive(&s.MaxBodyBytes, "a positive number of bytes"), "max-body-bytes", "PINNED_MAX_BODY_BYTES", "bytes",
		"largest request body accepted; larger ones answer 413 (the server agrees; the worker tells the pinboard)")
	s.ShutdownTimeout = DefaultShutdownTimeout
	set.Var(cmdline.Parsed[time.Duration]{P: &s.ShutdownTimeout, Parse: func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, errors.New("want a positive duration such as 10s")
		}
		return d, nil
	}, Format: time.Duration.String}, "shutdown-timeout", "PINNED_SHUTDOWN_TIMEOUT", "duration",
		"bound on the whole graceful shutdown; then the remaining instances are aborted (a second signal exits at once)")
	set.String(&s.Fleet.PinboardURL, "pinboard-url", "PINNED_PINBOARD_URL", "url", "",
		"fleet mode: the pinboard's base URL, e.g. http://127.0.0.1:8080")
	set.String(&s.Fleet.AdvertiseURL, "advertise-url", "PINNED_ADVERTISE_URL", "url", "",
		"fleet mode: where the pinboard reaches this process (-listen), e.g. http://127.0.0.1:8081")
	set.String(&s.Fleet.Token, "", "PINNED_TOKEN", "token", "",
		"fleet mode: the pinboard's deployment token (no flag: argv is visible to every user)")
	set.Var(cmdline.Parsed[string]{P: &s.Persist, Parse: redisURL, Format: func(v string) string { return v }}, "persist", EnvPersist, "url",
		"keep every count in this Redis (redis://host:port/db), fenced by its instance's activation epoch; empty: memory only")
}

// Load declares the counter's settings on set (after those the caller
// declared there), parses args and environ (as os.Environ; a flag beats
// its variable) and checks the settings together. It returns them with
// the unknown PINNED_* variables. For -h it writes every setting to stdout
// and returns flag.ErrHelp (-version: the version, cmdline.ErrVersion);
// every setting the counter cannot run with, alone or together (a partial
// fleet configuration), is a usage error, before anything starts.
func Load(set *cmdline.Set, args, environ []string, stdout io.Writer) (Settings, []cmdline.UnknownVar, error) {
	var s Settings
	s.declare(set)
	if err := set.Parse(args, environ, stdout); err != nil {
		return s, nil, err
	}
	return s, set.Unknown(environ), s.check()
}

// check checks the settings together, after set.Parse: a partial fleet
// configuration is a usage error.
func (s Settings) check() error {
	if s.Fleet.enabled() {
		return s.Fleet.check()
	}
	return nil
}

// positive is an int setting refusing values below 1; want says what a
// valid value is.
func positive(p *int, want string) cmdline.Parsed[int] {
	return cmdline.Parsed[int]{P: p, Parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, errors.New("want " + want)
		}
		return n, nil
	}, Format: strconv.Itoa}
}

// adminAddr reads -admin-listen: empty (the mode's default), or a
// host:port whose port is in range and whose host is loopback (profiles
// and metrics are not for the network).
func adminAddr(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if _, err := cmdline.HostPort(v); err != nil {
		return "", err
	}
	host, _, _ := net.SplitHostPort(v)
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", errors.New("the admin listener must be on a loopback address, such as 127.0.0.1:9091")
	}
	return v, nil
}

// redisURL checks a -persist value ("" is none).
func redisURL(v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if _, err := rueidis.ParseURL(v); err != nil {
		return "", fmt.Errorf("%v (want redis://host:port/db)", err)
	}
	return v, nil
}
