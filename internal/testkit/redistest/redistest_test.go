package redistest

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// ping sends a raw RESP PING and returns the reply line.
func ping(t *testing.T, addr string) (string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestStartRestartKill(t *testing.T) {
	s := Start(t)
	if got, err := ping(t, s.Addr); err != nil || got != "+PONG" {
		t.Fatalf("PING = %q, %v; want +PONG", got, err)
	}
	s.Restart(t)
	if got, err := ping(t, s.Addr); err != nil || got != "+PONG" {
		t.Fatalf("PING after restart = %q, %v; want +PONG", got, err)
	}
	s.Kill()
	if _, err := ping(t, s.Addr); err == nil {
		t.Fatal("PING succeeded after Kill")
	}
	s.Kill() // idempotent
}

func TestCluster(t *testing.T) {
	start := time.Now()
	c := StartCluster(t)
	t.Logf("3-node cluster ready in %v", time.Since(start))
	// A key lands on the node owning its slot; the others redirect.
	moved := 0
	for _, s := range c.Nodes {
		if _, err := s.Command("SET", "{tag}a", "1"); err != nil {
			if !strings.Contains(err.Error(), "MOVED") {
				t.Fatalf("SET on %s: %v; want OK or MOVED", s.Addr, err)
			}
			moved++
		}
	}
	if moved != len(c.Nodes)-1 {
		t.Fatalf("%d of %d nodes redirected a single-slot SET; want all but its owner", moved, len(c.Nodes))
	}
	c.Each(t, "FLUSHALL")
	for _, s := range c.Nodes {
		if n, err := s.Command("DBSIZE"); err != nil || n != "0" {
			t.Fatalf("DBSIZE on %s after FLUSHALL = %q, %v", s.Addr, n, err)
		}
	}
	if !strings.HasPrefix(c.URL, "redis://"+c.Nodes[0].Addr+"?addr=") {
		t.Fatalf("URL = %q", c.URL)
	}
}
