// Package redistest starts a real redis-server for tests: a fresh process on
// a free 127.0.0.1 port with persistence off, stopped when the test ends;
// or a local three-master Redis Cluster of such processes (StartCluster;
// FormCluster joins cluster-enabled servers that bench started itself).
// Tests never use a Redis they did not start. A Tap (NewTap) is a TCP proxy
// in front of one that records what a client sends as round trips, for
// tests that pin how many a path costs.
//
// The binary is looked up as $PINNED_REDIS_SERVER, then redis-server on
// $PATH; .ci/run installs it. Readiness is awaited by reading the server's
// log line "Ready to accept connections", never by sleeping.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a redis-server may take to become ready.
const startTimeout = 15 * time.Second

// readyLine is what redis-server logs once it serves.
const readyLine = "Ready to accept connections"

// Server is a redis-server process owned by a test.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// URL is redis://Addr/0.
	URL string

	bin   string
	args  []string
	ready string // the log line that says it serves

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Binary returns the redis-server path, or an error saying how to install it.
func Binary() (string, error) {
	if p := os.Getenv("PINNED_REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server not found: install it (apt-get install redis-server) or set PINNED_REDIS_SERVER")
	}
	return p, nil
}

// Start starts a redis-server on a free port and registers its shutdown with
// tb.Cleanup. extra are additional server arguments ("--maxmemory", "1mb").
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	bin, err := Binary()
	if err != nil {
		tb.Fatal(err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s := &Server{
			Addr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			bin:   bin,
			ready: readyLine,
		}
		s.URL = "redis://" + s.Addr + "/0"
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--logfile", "",
			"--dir", tb.TempDir(),
		}, extra...)
		if lastErr = s.start(); lastErr == nil {
			tb.Cleanup(s.Kill)
			return s
		}
	}
	tb.Fatalf("cannot start redis-server: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start launches the process and waits for its ready line.
func (s *Server) start() error {
	cmd := exec.Command(s.bin, s.args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	ready := make(chan error, 1)
	go func() { // owned by the process: ends when redis-server closes stdout
		sc := bufio.NewScanner(out)
		var tail []string
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			if !signalled {
				tail = append(tail, line)
				if strings.Contains(line, s.ready) {
					signalled = true
					ready <- nil
				}
			}
		}
		if !signalled {
			ready <- fmt.Errorf("redis-server exited before it was ready: %s", strings.Join(tail, " | "))
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case err := <-ready:
		if err != nil {
			<-done
			return err
		}
	case <-time.After(startTimeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("redis-server not ready after %v", startTimeout)
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// Pid returns the server's process id (0 when it is not running).
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Kill stops the server with SIGKILL and waits for it to exit. It is
// idempotent.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

// Stop stops the server with SIGTERM (a clean shutdown, nothing saved) and
// waits for it to exit.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	<-done
}

// Freeze stops the server with SIGSTOP: it keeps its connections and its
// port but answers nothing (a hung Redis, or one behind a dead network)
// until Thaw.
func (s *Server) Freeze() { s.pause(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (s *Server) Thaw() { s.pause(syscall.SIGCONT) }

func (s *Server) pause(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}

// Restart kills the server and starts a fresh, empty one on the same port:
// a Redis restart without persistence.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Kill()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = s.start(); err == nil {
			return
		}
		// The port can stay in use for a moment after the old process died;
		// wait for it to be bindable again rather than for a fixed time.
		waitBindable(s.Addr, time.Second)
	}
	tb.Fatalf("cannot restart redis-server on %s: %v", s.Addr, err)
}

func waitBindable(addr string, within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			l.Close()
			return
		}
		time.Sleep(10 * time.Millisecond) // polling a port: no event to wait on
	}
}
