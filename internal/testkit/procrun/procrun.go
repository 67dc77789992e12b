// Package procrun builds pinned's binaries and runs them as real processes,
// outside of tests as well as inside them (internal/testkit/proctest wraps it for
// tests; cmd/bench uses it directly): each process gets its own captured log,
// a readiness line to wait for, and signals (TERM, KILL, STOP/CONT).
//
// Invariants: binaries are built once per Builder and key (go build into a
// temporary directory removed by Cleanup); readiness is awaited by matching a
// log line, never by sleeping; every started process has one goroutine that
// reads its output and reaps it, ending when the process exits; the caller
// owns each Proc and must Kill it (Kill is idempotent).
package procrun

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Builder builds binaries once and removes them with Cleanup.
type Builder struct {
	// Dir is the directory go build runs in (a module directory); empty
	// means the current directory.
	Dir string

	mu    sync.Mutex
	dir   string
	cache map[string]string
}

// Build compiles the main package at pkg (an import path such as
// "github.com/pinned-go/pinned/cmd/pinboard") with the given build tags, once
// per Builder, and returns the binary's path.
func (b *Builder) Build(pkg string, tags ...string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := pkg + " " + strings.Join(tags, ",")
	if p, ok := b.cache[key]; ok {
		return p, nil
	}
	if b.dir == "" {
		dir, err := os.MkdirTemp("", "pinned-procrun-")
		if err != nil {
			return "", err
		}
		b.dir, b.cache = dir, map[string]string{}
	}
	out := filepath.Join(b.dir, fmt.Sprintf("%s-%d", filepath.Base(pkg), len(b.cache)))
	args := []string{"build", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = b.Dir
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, msg)
	}
	b.cache[key] = out
	return out, nil
}

// Cleanup removes every binary built. Call it from TestMain after m.Run.
func (b *Builder) Cleanup() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir != "" {
		os.RemoveAll(b.dir)
		b.dir, b.cache = "", nil
	}
}

// Spec describes a process to start.
type Spec struct {
	Name string   // for messages and logs
	Bin  string   // path to the binary
	Args []string // command-line arguments
	Env  []string // KEY=value; PATH and HOME are inherited, nothing else
	// Ready, if set, is a log line pattern (stdout or stderr) that Start
	// waits for; its submatches are returned by Proc.Ready.
	Ready *regexp.Regexp
	// ReadyTimeout bounds the wait for Ready. Default 30 s.
	ReadyTimeout time.Duration
}

// Proc is a running process.
type Proc struct {
	Spec Spec
	cmd  *exec.Cmd

	readyWait func() error

	mu     sync.Mutex
	log    bytes.Buffer
	ready  []string
	exited chan struct{}
}

// AwaitReady waits for the Ready line of the process's Spec (bounded by
// ReadyTimeout) and records its submatches.
func (p *Proc) AwaitReady() error { return p.readyWait() }

// Start runs s and waits for its Ready line (if any). On a readiness
// failure the process is killed and the error carries its log. The caller
// must Kill the returned process.
func Start(s Spec) (*Proc, error) {
	p, err := StartNoWait(s)
	if err != nil || s.Ready == nil {
		return p, err
	}
	if err := p.AwaitReady(); err != nil {
		p.Kill()
		return nil, fmt.Errorf("%v\n%s", err, p.Log())
	}
	return p, nil
}

// StartNoWait runs s without waiting for its Ready line; AwaitReady waits
// for it. The caller must Kill the returned process.
func StartNoWait(s Spec) (*Proc, error) {
	if s.ReadyTimeout == 0 {
		s.ReadyTimeout = 30 * time.Second
	}
	cmd := exec.Command(s.Bin, s.Args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, s.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	w.Close()
	p := &Proc{Spec: s, cmd: cmd, exited: make(chan struct{})}
	readyCh := make(chan []string, 1)
	go func() { // owned by the process: ends when it closes its output
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line)
			p.log.WriteByte('\n')
			p.mu.Unlock()
			if s.Ready != nil {
				if m := s.Ready.FindStringSubmatch(line); m != nil {
					select {
					case readyCh <- m:
					default:
					}
				}
			}
		}
		r.Close()
		_ = cmd.Wait()
		close(p.exited)
	}()
	p.readyWait = func() error {
		select {
		case m := <-readyCh:
			p.mu.Lock()
			p.ready = m
			p.mu.Unlock()
			return nil
		case <-p.exited:
			return fmt.Errorf("%s exited before it was ready: %v", s.Name, cmd.ProcessState)
		case <-time.After(s.ReadyTimeout):
			return fmt.Errorf("%s not ready within %v", s.Name, s.ReadyTimeout)
		}
	}
	return p, nil
}

// Ready returns the submatches of the Ready line (index 0 is the whole match).
func (p *Proc) Ready() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

// Log returns everything the process wrote so far.
func (p *Proc) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// ExitCode is the exit status after Exited is closed (-1 if killed by a signal).
func (p *Proc) ExitCode() int { return p.cmd.ProcessState.ExitCode() }

// Signal sends sig to the process (not waiting).
func (p *Proc) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s already exited", p.Spec.Name)
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// Kill sends SIGKILL (and SIGCONT, in case it is stopped) and waits for the
// exit. It is idempotent.
func (p *Proc) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	<-p.exited
}

// Terminate sends SIGTERM and waits up to within for the exit; it reports
// whether the process exited in time.
func (p *Proc) Terminate(within time.Duration) bool {
	if p.Signal(syscall.SIGTERM) != nil {
		return true
	}
	select {
	case <-p.exited:
		return true
	case <-time.After(within):
		return false
	}
}

// WaitLog waits up to within for a log line matching re and returns its
// submatches, or nil on timeout. Lines already written count.
func (p *Proc) WaitLog(re *regexp.Regexp, within time.Duration) []string {
	deadline := time.Now().Add(within)
	for {
		for _, line := range strings.Split(p.Log(), "\n") {
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		}
		if time.Now().After(deadline) {
			return nil
		}
		select {
		case <-p.exited:
			deadline = time.Now() // one last scan
		case <-time.After(20 * time.Millisecond): // polling an external process's log
		}
	}
}
