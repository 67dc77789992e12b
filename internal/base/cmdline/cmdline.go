// Package cmdline is the command line of pinned's commands (pinboard,
// counter, fleet, bench, loadgen): each setting is declared once with its
// flag, its environment variable (either may be absent), its type, its
// default and its usage. -h prints every setting in one format to stdout
// and Parse returns flag.ErrHelp; -version prints the module version and
// VCS revision (runtime/debug.ReadBuildInfo) and Parse returns ErrVersion
// (either way the command exits 0). Unknown lists the variables with the
// command's prefix that no setting declares, so a typo in a variable name
// is reported instead of silently ignored.
//
// Exit statuses are the same for every command and decided in one place,
// Status: 0 for success, -h and -version; 2 (ExitUsage) for a UsageError,
// which every error of Parse is and which a command returns (Usage,
// Usagef) for any other setting or combination of settings it cannot run
// with, found before it starts anything; 1 for a failure while running.
//
// Why not peterbourgon/ff (v4): it fills declared flags from prefixed
// variables and prints help, but settings that must not be flags (tokens:
// argv is visible to every user) and the warning about unknown prefixed
// variables would still be written here, its help does not name each
// setting's variable, and its own flag set is getopt-style (--flag) where
// every command and script here uses -flag. What ff would replace is the
// environment loop of Parse.
//
// The commands' stop is here too (shutdown.go): Signals turns the first
// SIGTERM or SIGINT into a cancelled context (the graceful shutdown) and a
// second one into an immediate exit with ExitForced (128 + the signal's
// number); ShutdownLog logs what a shutdown still waits for, at most once
// per interval, and how long it took.
//
// Invariants: a flag wins over its variable, a variable over the default;
// every error names the flag or variable to fix and the value given, and is
// a UsageError; a Set keeps no global state (each command builds its own);
// the goroutine of a Signals ends with Stop, that of a ShutdownLog with
// Done; only commands (package main and the pinboard's Main) create a
// Signals, the one process-wide registration (os/signal).
package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Exit statuses shared by every command (Status).
const (
	ExitOK     = 0 // done; also -h and -version
	ExitFailed = 1 // the command ran and failed
	ExitUsage  = 2 // a usage or configuration error (UsageError), before anything started
)

// UsageError is a usage or configuration error: a flag, a variable or a
// combination of settings the command cannot run with. Its message names
// what to change. Every command exits ExitUsage for one (Status).
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the error Usage wrapped.
func (e *UsageError) Unwrap() error { return e.Err }

// Usage marks err as a usage or configuration error; nil stays nil, and an
// error that already is one is returned as it is.
func Usage(err error) error {
	var u *UsageError
	if err == nil || errors.As(err, &u) {
		return err
	}
	return &UsageError{Err: err}
}

// Usagef is Usage(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error { return Usage(fmt.Errorf(format, args...)) }

// Exit writes "name: err" to stderr unless err's status is ExitOK, and
// returns the status (Status) for the command to exit with.
func Exit(stderr io.Writer, name string, err error) int {
	code := Status(err)
	if code != ExitOK {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
	}
	return code
}

// ErrVersion is what Parse returns for -version, once it has printed the
// version: the command exits ExitOK.
var ErrVersion = errors.New("cmdline: -version printed")

// Status is the exit status for err, the same for every command: ExitOK for
// nil, flag.ErrHelp and ErrVersion; ExitUsage for a UsageError; ExitFailed
// for anything else.
func Status(err error) int {
	var u *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp), errors.Is(err, ErrVersion):
		return ExitOK
	case errors.As(err, &u):
		return ExitUsage
	}
	return ExitFailed
}

// Set is one command's settings.
type Set struct {
	name, prefix string
	fs           *flag.FlagSet // the flags
	opts         []*option
	known        []string
	intro        string
	failed       error // the first error a Value reported during Parse
	version      bool  // -version
}

type option struct {
	flag, env, typ, usage, def string
	value                      flag.Value
}

// New returns a Set for the command name holding one setting, -version.
// prefix (e.g. "PINBOARD_") is the prefix of the command's variables that
// Unknown checks; intro, if not empty, is printed by -h above the settings.
func New(name, prefix, intro string) *Set {
	s := &Set{name: name, prefix: prefix, intro: intro, fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	s.fs.SetOutput(io.Discard)
	s.fs.Usage = func() {}
	s.Bool(&s.version, "version", "", "print the module version and VCS revision, then exit")
	return s
}

// Var declares a setting held by v, whose current value is the default.
// flagName (without '-') or env may be empty for a setting that is only a
// variable or only a flag. typ names the kind of value in -h ("duration",
// "host:port", ...). A setting whose flagName is empty must have an env.
func (s *Set) Var(v flag.Value, flagName, env, typ, usage string) {
	if flagName == "" && env == "" {
		panic("cmdline: a setting needs a flag or a variable")
	}
	o := &option{flag: flagName, env: env, typ: typ, usage: usage, def: v.String(), value: v}
	o.value = &checked{Value: v, s: s, o: o}
	if flagName != "" {
		s.fs.Var(o.value, flagName, usage)
	}
	s.opts = append(s.opts, o)
}

// String declares a string setting with default def.
func (s *Set) String(p *string, flagName, env, typ, def, usage string) {
	*p = def
	s.Var(Parsed[string]{P: p, Parse: func(v string) (string, error) { return v, nil }, Format: func(v string) string { return v }},
		flagName, env, typ, usage)
}

// Duration declares a duration setting (time.ParseDuration) with default def.
func (s *Set) Duration(p *time.Duration, flagName, env string, def time.Duration, usage string) {
	*p = def
	s.Var(Parsed[time.Duration]{P: p, Parse: func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, errors.New("want a duration such as 500ms, 10s or 1m")
		}
		return d, nil
	}, Format: time.Duration.String}, flagName, env, "duration", usage)
}

// Int declares an integer setting with default def.
func (s *Set) Int(p *int, flagName, env string, def int, usage string) {
	*p = def
	s.Var(Parsed[int]{P: p, Parse: func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, errors.New("want an integer")
		}
		return n, nil
	}, Format: strconv.Itoa}, flagName, env, "int", usage)
}

// Float declares a floating-point setting with default def.
func (s *Set) Float(p *float64, flagName, env string, def float64, usage string) {
	*p = def
	s.Var(Parsed[float64]{P: p, Parse: func(v string) (float64, error) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, errors.New("want a number")
		}
		return f, nil
	}, Format: func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }}, flagName, env, "float", usage)
}

// Bool declares a boolean setting with default false: "-name" sets it, as
// does a variable set to a value strconv.ParseBool reads as true.
func (s *Set) Bool(p *bool, flagName, env, usage string) {
	*p = false
	s.Var(boolValue{Parsed[bool]{P: p, Parse: func(v string) (bool, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return false, errors.New("want true or false")
		}
		return b, nil
	}, Format: strconv.FormatBool}}, flagName, env, "bool", usage)
}

// boolValue is a bool setting: the flag needs no value.
type boolValue struct{ Parsed[bool] }

func (boolValue) IsBoolFlag() bool { return true }

// Parsed is a flag.Value of any type: Parse reads a value (its error says
// what is wanted), Format shows one (the default in -h).
type Parsed[T any] struct {
	P      *T
	Parse  func(string) (T, error)
	Format func(T) string
}

// Set implements flag.Value.
func (v Parsed[T]) Set(s string) error {
	x, err := v.Parse(s)
	if err != nil {
		return err
	}
	*v.P = x
	return nil
}

// String implements flag.Value.
func (v Parsed[T]) String() string {
	if v.P == nil || v.Format == nil {
		return ""
	}
	return v.Format(*v.P)
}

// Known declares variables with the prefix that the command reads outside
// this Set (so Unknown does not report them).
func (s *Set) Known(env ...string) { s.known = append(s.known, env...) }

// checked wraps a setting's Value so that a bad value's error names the
// flag or variable and the value.
type checked struct {
	flag.Value
	s      *Set
	o      *option
	viaEnv bool
}

func (c *checked) Set(v string) error {
	err := c.Value.Set(v)
	if err == nil {
		return nil
	}
	var name string
	switch {
	case c.viaEnv:
		name = c.o.env
	case c.o.env != "":
		name = "-" + c.o.flag + " (" + c.o.env + ")"
	default:
		name = "-" + c.o.flag
	}
	err = fmt.Errorf("%s=%q: %w", name, v, err)
	if c.s.failed == nil {
		c.s.failed = err
	}
	return err
}

// IsBoolFlag lets a bool setting be given as "-name" alone.
func (c *checked) IsBoolFlag() bool {
	b, ok := c.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Parse sets every setting from environ (KEY=VALUE entries, as os.Environ;
// an empty value counts as unset), then from args (the flags, without the
// program name). For -h or -help it writes the usage to stdout and returns
// flag.ErrHelp; for -version it writes the version (Version) to stdout and
// returns ErrVersion. Arguments that are not flags are an error. Every
// other error is a UsageError.
func (s *Set) Parse(args, environ []string, stdout io.Writer) error {
	s.failed = nil
	for _, o := range s.opts {
		if o.env == "" {
			continue
		}
		if v := Lookup(environ, o.env); v != "" {
			c := o.value.(*checked)
			c.viaEnv = true
			err := c.Set(v)
			c.viaEnv = false
			if err != nil {
				return Usage(err)
			}
		}
	}
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			s.PrintUsage(stdout)
			return err
		}
		if s.failed != nil {
			return Usage(s.failed)
		}
		return Usagef("%v (see %s -h)", err, s.name)
	}
	if s.version {
		fmt.Fprintln(stdout, Version(s.name))
		return ErrVersion
	}
	if s.fs.NArg() > 0 {
		return Usagef("unexpected argument %q (see %s -h)", s.fs.Arg(0), s.name)
	}
	return nil
}

// Version describes the running binary for -version: the command's name,
// the main module's path and version, its VCS revision, the revision's time
// and whether the tree was modified, and the Go version, all from
// runtime/debug.ReadBuildInfo. The revision is there when the binary was
// built in a git checkout with VCS stamping (go build's default,
// -buildvcs=auto; not go run, nor a git worktree, whose .git is a file).
func Version(name string) string {
	bi, ok := debug.ReadBuildInfo()
	return formatVersion(name, bi, ok)
}

func formatVersion(name string, bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return name + " (no build information: a binary built without module support)"
	}
	var rev, at string
	modified := false
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.time":
			at = kv.Value
		case "vcs.modified":
			modified = kv.Value == "true"
		}
	}
	v := fmt.Sprintf("%s %s %s", name, bi.Main.Path, bi.Main.Version)
	if rev == "" {
		v += ", revision unknown (built without VCS stamping: go build in a git checkout stamps it)"
	} else {
		v += ", revision " + rev
		var notes []string
		if at != "" {
			notes = append(notes, at)
		}
		if modified {
			notes = append(notes, "modified")
		}
		if len(notes) > 0 {
			v += " (" + strings.Join(notes, ", ") + ")"
		}
	}
	return v + ", " + bi.GoVersion
}

// HostPort reads a listen address: host:port with a numeric port from 0 to
// 65535 (0: any free port); the host may be empty (every interface). For
// Parsed.Parse.
func HostPort(v string) (string, error) {
	_, port, err := net.SplitHostPort(v)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return "", errors.New("want host:port with a port from 0 to 65535, such as :8080 or 127.0.0.1:9090")
	}
	return v, nil
}

// ListenAddr declares a listen address setting (HostPort) with default def.
func (s *Set) ListenAddr(p *string, flagName, env, def, usage string) {
	*p = def
	s.Var(Parsed[string]{P: p, Parse: HostPort, Format: func(v string) string { return v }}, flagName, env, "host:port", usage)
}

// Lookup returns the value of the variable name in environ ("" when unset).
func Lookup(environ []string, name string) string {
	v := ""
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val // the last one wins, as with getenv
		}
	}
	return v
}

// UnknownVar is a variable with the command's prefix that no setting
// declares; Near is the closest declared name when one is within two edits
// (a likely typo), else "".
type UnknownVar struct{ Name, Near string }

// Unknown returns the variables in environ that start with the Set's
// prefix but that no setting (nor Known) declares, in environ order.
func (s *Set) Unknown(environ []string) []UnknownVar {
	if s.prefix == "" {
		return nil
	}
	var declared []string
	for _, o := range s.opts {
		if o.env != "" {
			declared = append(declared, o.env)
		}
	}
	declared = append(declared, s.known...)
	var out []UnknownVar
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, s.prefix) || slices.Contains(declared, k) ||
			slices.ContainsFunc(out, func(u UnknownVar) bool { return u.Name == k }) {
			continue
		}
		out = append(out, UnknownVar{Name: k, Near: nearest(k, declared)})
	}
	return out
}

// Warn logs one warning line per unknown variable.
func Warn(logger *slog.Logger, unknown []UnknownVar) {
	for _, u := range unknown {
		if u.Near != "" {
			logger.Warn("unknown environment variable ignored; a typo?", "name", u.Name, "didYouMean", u.Near)
		} else {
			logger.Warn("unknown environment variable ignored", "name", u.Name)
		}
	}
}

// nearest returns the name in names within edit distance 2 of k, or "".
func nearest(k string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := distance(k, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// PrintUsage writes every setting in declaration order (-version last),
// one format for all:
//
//	-name type (env VARIABLE, default value)
//	    usage
//
// with "no variable" for a flag-only setting and "VARIABLE type
// (environment only, ...)" for a variable-only one; a default that is
// empty or holds a blank is quoted.
func (s *Set) PrintUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s [flags]\n", s.name)
	if s.intro != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(s.intro))
	}
	if slices.ContainsFunc(s.opts, func(o *option) bool { return o.env != "" }) {
		fmt.Fprintf(w, "\nA flag wins over its environment variable, a variable over the default.\n")
	}
	fmt.Fprintln(w)
	for _, o := range append(s.opts[1:len(s.opts):len(s.opts)], s.opts[0]) { // opts[0] is New's -version
		def := o.def
		if def == "" || strings.ContainsAny(def, " \t\"") {
			def = fmt.Sprintf("%q", def)
		}
		switch {
		case o.flag == "":
			fmt.Fprintf(w, "  %s %s (environment only, default %s)\n", o.env, o.typ, def)
		case o.env == "":
			fmt.Fprintf(w, "  -%s %s (no variable, default %s)\n", o.flag, o.typ, def)
		default:
			fmt.Fprintf(w, "  -%s %s (env %s, default %s)\n", o.flag, o.typ, o.env, def)
		}
		for _, line := range strings.Split(o.usage, "\n") {
			fmt.Fprintf(w, "      %s\n", line)
		}
	}
}
