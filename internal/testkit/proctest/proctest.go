// Package proctest builds pinned's binaries and runs them as real processes
// for end-to-end, chaos and benchmark tests: each process gets its own
// captured log, a readiness line to wait for, and signals (TERM, KILL,
// STOP/CONT) the test can send. Every process is killed when the test ends.
//
// It is a thin testing.TB wrapper around internal/testkit/procrun, which does the
// work outside tests too (cmd/bench). Binaries are built once per test binary
// and package (go build into a temporary directory removed by Cleanup), with
// optional build tags. Readiness is awaited by matching a log line, never by
// sleeping.
package proctest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/procrun"
)

// Builder builds binaries once and removes them with Cleanup.
type Builder struct {
	b     procrun.Builder
	stats sync.Once
}

// Build compiles the main package at pkg (an import path such as
// "github.com/pinned-go/pinned/cmd/pinboard") with the given build tags, once
// per Builder, and returns the binary's path.
//
// The first Build stats every Go source file of the module: go test caches
// a test's result by the packages it imports and the files it reads, and a
// binary built here depends on sources the test never imports, so without
// it a changed pinboard or worker would leave a stale cached pass.
func (b *Builder) Build(tb testing.TB, pkg string, tags ...string) string {
	tb.Helper()
	b.stats.Do(statSources)
	p, err := b.b.Build(pkg, tags...)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// statSources stats go.mod, go.sum and every .go file of the module around
// the working directory, so that go test's cache sees them (see Build).
func statSources() {
	dir, err := os.Getwd()
	if err != nil {
		return
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return
		}
		dir = parent
	}
	_, _ = os.Stat(filepath.Join(dir, "go.sum"))
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && p != dir {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.HasSuffix(p, ".go") {
			_, _ = os.Stat(p)
		}
		return nil
	})
}

// Cleanup removes every binary built. Call it from TestMain after m.Run.
func (b *Builder) Cleanup() { b.b.Cleanup() }

// Spec describes a process to start (see procrun.Spec).
type Spec = procrun.Spec

// Proc is a running process (see procrun.Proc).
type Proc = procrun.Proc

// Start runs s and waits for its Ready line (if any). The process is killed
// at the end of the test.
func Start(tb testing.TB, s Spec) *Proc {
	tb.Helper()
	p, err := procrun.StartNoWait(s)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Kill)
	if s.Ready == nil {
		return p
	}
	if err := p.AwaitReady(); err != nil {
		tb.Fatalf("%v\n%s", err, p.Log())
	}
	return p
}

// FromModuleRoot resolves a relative path against the module root (the
// directory of the go.mod above the working directory): go test runs in
// the package's directory, and a documented command names files like
// docs/chaos.md from the root. An absolute path is returned as is.
func FromModuleRoot(path string) (string, error) {
	if filepath.IsAbs(path) {
		return path, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, path), nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", fmt.Errorf("%s: no go.mod above the working directory", path)
		}
		dir = up
	}
}

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago,
// for a process that must be told its address before it starts (an
// advertise URL names it).
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Result is how a command run to its end ended.
type Result struct {
	Code           int // the exit status
	Stdout, Stderr string
}

// Run runs bin with args to its end and returns its exit status and output.
// env holds KEY=value entries; PATH and HOME are inherited, nothing else.
// The run is bounded by 30 s: past that the process is killed and the test
// fails.
func Run(tb testing.TB, bin string, args []string, env ...string) Result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		tb.Fatalf("%s %q did not end within 30 s:\n%s", filepath.Base(bin), args, stderr.String())
	case err != nil && !errors.As(err, &exit):
		tb.Fatalf("%s %q: %v", filepath.Base(bin), args, err)
	}
	return Result{Code: cmd.ProcessState.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String()}
}

// Case is one run of a command in CheckCommandLine's table.
type Case struct {
	Args, Env []string
	Code      int    // the exit status wanted
	Stderr    string // what stderr must hold; "": nothing at all
	Not       string // what stderr must not hold ("": no such check)
}

// CheckCommandLine runs the command name (its binary bin) once per case,
// with env added to each case's, and fails tb for every run whose exit
// status or stderr is not the case's, or that exits 2 (a usage error)
// having written to stdout; then checks that -h prints the usage on
// stdout and -version the version (CheckVersion), both exiting 0 with
// nothing on stderr.
func CheckCommandLine(tb testing.TB, bin, name string, cases []Case, env ...string) {
	tb.Helper()
	cases = append(cases, Case{Args: []string{"-h"}}, Case{Args: []string{"-version"}})
	for _, c := range cases {
		r := Run(tb, bin, c.Args, append(c.Env, env...)...)
		if r.Code != c.Code || !strings.Contains(r.Stderr, c.Stderr) || (c.Stderr == "") != (r.Stderr == "") ||
			(c.Not != "" && strings.Contains(r.Stderr, c.Not)) || (r.Code == 2 && r.Stdout != "") {
			tb.Errorf("%s %q %q: exit %d, stderr %q, stdout %q; want %d and stderr %q", name, c.Args, c.Env, r.Code, r.Stderr, r.Stdout, c.Code, c.Stderr)
		}
	}
	if r := Run(tb, bin, []string{"-h"}, env...); !strings.HasPrefix(r.Stdout, "Usage: "+name+" [flags]") || !strings.Contains(r.Stdout, "-version bool") {
		tb.Errorf("%s -h printed %q on stdout; want the usage, -version included", name, r.Stdout)
	}
	CheckVersion(tb, name, Run(tb, bin, []string{"-version"}, env...).Stdout)
}

// versionLine is what -version prints (cmdline.Version).
var versionLine = regexp.MustCompile(`^(\S+) github\.com/pinned-go/pinned \S+, revision (?:([0-9a-f]{40})(?: \([^)]*\))?|unknown \(built without VCS stamping[^)]*\)), go1\.\d+\S*\n$`)

// CheckVersion fails tb unless out is the -version output of the command
// name: its name, pinned's module and version, the VCS revision (the
// checkout's HEAD, when the binary was stamped with it and git can tell)
// and the Go version, on one line.
func CheckVersion(tb testing.TB, name, out string) {
	tb.Helper()
	m := versionLine.FindStringSubmatch(out)
	if m == nil || m[1] != name {
		tb.Fatalf("-version printed %q; want %q, the module, its revision and the Go version on one line", out, name)
	}
	if m[2] == "" {
		return // built without VCS stamping (a git worktree, or -buildvcs=false)
	}
	if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil && strings.TrimSpace(string(head)) != m[2] {
		tb.Errorf("-version names revision %s; the checkout is at %s", m[2], strings.TrimSpace(string(head)))
	}
}
