package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
)

type settings struct {
	listen  string
	lease   time.Duration
	n       int
	dev     bool
	token   string
	verbose bool
	ratio   float64
	port    uint16
}

func newSet(s *settings) *Set {
	set := New("demo", "DEMO_", "The demo command.")
	set.String(&s.listen, "listen", "DEMO_LISTEN", "host:port", ":8080", "address to listen on")
	set.Duration(&s.lease, "lease", "DEMO_LEASE", 10*time.Second, "lease granted")
	set.Int(&s.n, "n", "DEMO_N", 3, "how many\nsecond line")
	set.Bool(&s.dev, "dev", "", "development mode")
	set.Bool(&s.verbose, "verbose", "DEMO_VERBOSE", "log more")
	set.String(&s.token, "", "DEMO_TOKEN", "string", "", "the token (no flag: argv is visible)")
	set.Float(&s.ratio, "ratio", "DEMO_RATIO", 0.5, "a ratio")
	s.port = 80
	set.Var(Parsed[uint16]{P: &s.port, Parse: func(v string) (uint16, error) {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n == 0 {
			return 0, errors.New("want a port (1-65535)")
		}
		return uint16(n), nil
	}, Format: func(p uint16) string { return strconv.Itoa(int(p)) }}, "port", "DEMO_PORT", "port", "a port")
	set.Known("DEMO_FAULTS")
	return set
}

func TestPrecedence(t *testing.T) {
	var s settings
	set := newSet(&s)
	err := set.Parse([]string{"-lease", "4s", "-dev", "-port", "443"},
		[]string{"DEMO_LISTEN=127.0.0.1:1", "DEMO_LEASE=7s", "DEMO_N=", "DEMO_TOKEN=t0k", "DEMO_VERBOSE=true", "DEMO_PORT=8443"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := settings{listen: "127.0.0.1:1", lease: 4 * time.Second, n: 3, dev: true, token: "t0k", verbose: true, ratio: 0.5, port: 443}
	if s != want {
		t.Fatalf("settings %+v; want %+v (flag over variable over default; an empty variable is unset)", s, want)
	}
}

func TestErrorsNameTheSetting(t *testing.T) {
	for _, c := range []struct {
		args, env []string
		want      string
	}{
		{nil, []string{"DEMO_LEASE=10"}, `DEMO_LEASE="10": want a duration such as 500ms, 10s or 1m`},
		{[]string{"-lease", "soon"}, nil, `-lease (DEMO_LEASE)="soon"`},
		{[]string{"-port", "0"}, nil, `-port (DEMO_PORT)="0": want a port (1-65535)`},
		{nil, []string{"DEMO_PORT=99999"}, `DEMO_PORT="99999": want a port`},
		{[]string{"-dev=maybe"}, nil, `-dev="maybe"`},
		{[]string{"-nope"}, nil, "flag provided but not defined: -nope (see demo -h)"},
		{[]string{"extra"}, nil, `unexpected argument "extra" (see demo -h)`},
	} {
		var s settings
		err := newSet(&s).Parse(c.args, c.env, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q, %q) = %v; want an error containing %q", c.args, c.env, err, c.want)
		}
	}
}

func TestHelp(t *testing.T) {
	var s settings
	var out strings.Builder
	if err := newSet(&s).Parse([]string{"-h"}, nil, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Parse(-h) = %v; want flag.ErrHelp", err)
	}
	got := out.String()
	for _, line := range []string{
		"Usage: demo [flags]",
		"The demo command.",
		"  -listen host:port (env DEMO_LISTEN, default :8080)",
		"  -lease duration (env DEMO_LEASE, default 10s)",
		"  -n int (env DEMO_N, default 3)",
		"      how many\n      second line",
		"  -dev bool (no variable, default false)",
		`  DEMO_TOKEN string (environment only, default "")`,
		"  -ratio float (env DEMO_RATIO, default 0.5)",
		"  -port port (env DEMO_PORT, default 80)",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("-h output lacks %q:\n%s", line, got)
		}
	}
	if n := strings.Count(got, "\n  -") + strings.Count(got, "\n  DEMO_"); n != 9 {
		t.Errorf("-h lists %d settings; want 9:\n%s", n, got)
	}
	if !strings.HasSuffix(got, "  -version bool (no variable, default false)\n      print the module version and VCS revision, then exit\n") {
		t.Errorf("-h does not end with -version:\n%s", got)
	}
}

// Every error Parse returns is a usage error, and Status maps it to exit
// status 2 like any error a command marks with Usage; other errors are 1;
// -h and -version are 0.
func TestStatus(t *testing.T) {
	for _, c := range []struct {
		args, env []string
	}{
		{nil, []string{"DEMO_LEASE=10"}},
		{[]string{"-port", "0"}, nil},
		{[]string{"-nope"}, nil},
		{[]string{"extra"}, nil},
	} {
		var s settings
		err := newSet(&s).Parse(c.args, c.env, io.Discard)
		var u *UsageError
		if !errors.As(err, &u) || Status(err) != ExitUsage {
			t.Errorf("Parse(%q, %q) = %v (status %d); want a UsageError, status 2", c.args, c.env, err, Status(err))
		}
	}
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{flag.ErrHelp, ExitOK},
		{ErrVersion, ExitOK},
		{Usagef("-n %d: want 1 to 16", 0), ExitUsage},
		{fmt.Errorf("counter: %w", Usage(errors.New("bad"))), ExitUsage},
		{Usage(Usage(errors.New("bad"))), ExitUsage},
		{errors.New("listener failed"), ExitFailed},
	} {
		if got := Status(c.err); got != c.want {
			t.Errorf("Status(%v) = %d; want %d", c.err, got, c.want)
		}
	}
	if Usage(nil) != nil {
		t.Error("Usage(nil) is not nil")
	}
	if err := Usage(errors.New("x")); err.Error() != "x" {
		t.Errorf("Usage changes the message: %q", err)
	}
}

func TestVersion(t *testing.T) {
	var s settings
	var out strings.Builder
	if err := newSet(&s).Parse([]string{"-version"}, nil, &out); !errors.Is(err, ErrVersion) {
		t.Fatalf("Parse(-version) = %v; want ErrVersion", err)
	}
	if got := out.String(); !strings.HasPrefix(got, "demo ") || !strings.HasSuffix(got, "\n") || !strings.Contains(got, runtime.Version()) {
		t.Errorf("-version printed %q; want the command, its module and the Go version on one line", got)
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/pinned-go/pinned", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ac845be"}, {Key: "vcs.time", Value: "2026-12-05T00:18:34Z"}, {Key: "vcs.modified", Value: "true"}}}
	for _, c := range []struct {
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{bi, true, "demo github.com/pinned-go/pinned v0.3.0, revision ac845be (2026-12-05T00:18:34Z, modified), go1.26.8"},
		{&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/pinned-go/pinned", Version: "(devel)"}}, true,
			"demo github.com/pinned-go/pinned (devel), revision unknown (built without VCS stamping: go build in a git checkout stamps it), go1.26.8"},
		{nil, false, "demo (no build information: a binary built without module support)"},
	} {
		if got := formatVersion("demo", c.bi, c.ok); got != c.want {
			t.Errorf("formatVersion = %q; want %q", got, c.want)
		}
	}
}

func TestListenAddr(t *testing.T) {
	for v, ok := range map[string]bool{":8080": true, "127.0.0.1:0": true, "[::1]:65535": true, ":99999": false, "127.0.0.1:65536": false, "8080": false, "host:http": false} {
		var addr string
		set := New("demo", "", "")
		set.ListenAddr(&addr, "listen", "", ":1", "address")
		err := set.Parse([]string{"-listen", v}, nil, io.Discard)
		if (err == nil) != ok || (err == nil && addr != v) {
			t.Errorf("-listen %s: %q, %v; want accepted %v", v, addr, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "port from 0 to 65535") {
			t.Errorf("-listen %s: %v; want the port range named", v, err)
		}
	}
}

func TestUnknown(t *testing.T) {
	var s settings
	got := newSet(&s).Unknown([]string{"DEMO_LISTEN=x", "DEMO_LEAES=5s", "DEMO_FAULTS=a", "OTHER_X=1", "DEMO_WHATEVER=1", "DEMO_LEAES=6s"})
	want := []UnknownVar{{"DEMO_LEAES", "DEMO_LEASE"}, {"DEMO_WHATEVER", ""}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Unknown = %q; want %q", got, want)
	}
	var logs strings.Builder
	Warn(slog.New(slog.NewTextHandler(&logs, nil)), newSet(&s).Unknown([]string{"DEMO_LEAES=5s", "DEMO_X=1"}))
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "name=DEMO_LEAES didYouMean=DEMO_LEASE") || !strings.Contains(lines[1], "name=DEMO_X") ||
		!strings.Contains(lines[0], "level=WARN") {
		t.Fatalf("Warn logged %q; want one WARN line per unknown variable", lines)
	}
}
