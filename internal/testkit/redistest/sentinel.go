package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// MasterSet is the name the sentinels of StartSentinels monitor the
// primary under.
const MasterSet = "pinned"

// SentinelBinary returns the redis-sentinel path ($PINNED_REDIS_SENTINEL,
// then redis-sentinel on $PATH), or an error saying how to install it.
func SentinelBinary() (string, error) {
	if p := os.Getenv("PINNED_REDIS_SENTINEL"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-sentinel")
	if err != nil {
		return "", fmt.Errorf("redis-sentinel not found: install it (apt-get install redis-sentinel) or set PINNED_REDIS_SENTINEL")
	}
	return p, nil
}

// StartReplica starts a redis-server replicating primary and waits until
// its link to the primary is up (the initial sync is done).
func StartReplica(tb testing.TB, primary *Server) *Server {
	tb.Helper()
	host, port, _ := net.SplitHostPort(primary.Addr)
	r := Start(tb, "--replicaof", host, port)
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := Command(r.Addr, "INFO", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("replica %s: link to %s not up within %v: %v %s", r.Addr, primary.Addr, startTimeout, err, info)
		}
		time.Sleep(20 * time.Millisecond) // polling another process's replication state
	}
}

// Sentinels is a group of redis-sentinel processes monitoring one primary
// as MasterSet, each on a free 127.0.0.1 port.
type Sentinels struct {
	Addrs []string
	procs []*Server
}

// StartSentinels starts n sentinels (quorum n/2+1) monitoring primary,
// with a 1 s down-after and a 10 s failover timeout, and waits until each
// knows every replica given and every other sentinel, so that a failover
// can be authorised the moment the primary fails.
func StartSentinels(tb testing.TB, primary *Server, n int, replicas ...*Server) *Sentinels {
	tb.Helper()
	bin, err := SentinelBinary()
	if err != nil {
		tb.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(primary.Addr)
	g := &Sentinels{}
	for i := range n {
		var s *Server
		var lastErr error
		for attempt := 0; attempt < 5 && s == nil; attempt++ {
			p, err := freePort()
			if err != nil {
				tb.Fatal(err)
			}
			dir := tb.TempDir()
			conf := filepath.Join(dir, "sentinel.conf")
			body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s %d\n"+
				"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 10000\nsentinel parallel-syncs %s 1\n",
				p, dir, MasterSet, host, port, n/2+1, MasterSet, MasterSet, MasterSet)
			if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
				tb.Fatal(err)
			}
			c := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), bin: bin, args: []string{conf, "--logfile", ""}, ready: "+monitor master"}
			if lastErr = c.start(); lastErr == nil {
				s = c
			}
		}
		if s == nil {
			tb.Fatalf("cannot start sentinel %d: %v", i+1, lastErr)
		}
		tb.Cleanup(s.Kill)
		g.procs = append(g.procs, s)
		g.Addrs = append(g.Addrs, s.Addr)
	}
	deadline := time.Now().Add(30 * time.Second) // sentinels find each other by 2 s hellos
	for _, a := range g.Addrs {
		for {
			sentinels, err1 := Command(a, "SENTINEL", "SENTINELS", MasterSet)
			reps, err2 := Command(a, "SENTINEL", "REPLICAS", MasterSet)
			if err1 == nil && err2 == nil && countEntries(sentinels) == n-1 && countEntries(reps) >= len(replicas) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("sentinel %s does not know %d other sentinels and %d replicas within 30 s: %q %q %v %v", a, n-1, len(replicas), sentinels, reps, err1, err2)
			}
			time.Sleep(100 * time.Millisecond) // polling the sentinels' discovery
		}
	}
	return g
}

// URL is the Redis URL of the group for rueidis's sentinel mode:
// redis://<first sentinel>/0?master_set=<MasterSet>&addr=<other sentinels>...
func (g *Sentinels) URL() string {
	u := "redis://" + g.Addrs[0] + "/0?master_set=" + MasterSet
	for _, a := range g.Addrs[1:] {
		u += "&addr=" + a
	}
	return u
}

// Master asks a sentinel for the current primary's address.
func (g *Sentinels) Master() (string, error) {
	out, err := Command(g.Addrs[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MasterSet)
	if err != nil {
		return "", err
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		return "", fmt.Errorf("unexpected reply %q", out)
	}
	return net.JoinHostPort(f[0], f[1]), nil
}

// countEntries counts the top-level entries of a Command reply of an array
// of arrays (one line per entry, see Command).
func countEntries(reply string) int {
	if reply == "" {
		return 0
	}
	return len(strings.Split(strings.TrimRight(reply, "\n"), "\n"))
}

// Command sends one command to addr over a fresh connection (RESP2) and
// returns its reply as text: a bulk or simple string as is; an array's
// elements joined by spaces, an array of arrays one inner array a line.
// An error reply is an error.
func Command(addr string, args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, commandTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(commandTimeout))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	v, err := readRESP(r)
	if err != nil {
		return "", err
	}
	return format(v, 0), nil
}

// readRESP reads one RESP2 value: string, error, int (as string) or []any.
func readRESP(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, fmt.Errorf("empty RESP line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		out := make([]any, 0, max(n, 0))
		for range n {
			v, err := readRESP(r)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown RESP type in %q", line)
}

func format(v any, depth int) string {
	switch x := v.(type) {
	case string:
		return x
	case []any:
		parts := make([]string, len(x))
		nested := false
		for i, e := range x {
			if _, ok := e.([]any); ok {
				nested = true
			}
			parts[i] = format(e, depth+1)
		}
		if nested && depth == 0 {
			if len(parts) == 0 {
				return ""
			}
			return strings.Join(parts, "\n") + "\n"
		}
		return strings.Join(parts, " ")
	}
	return ""
}
