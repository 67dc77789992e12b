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

// A primary, a replica and three sentinels: the sentinels name the
// primary, and after the primary dies they promote the replica.
func TestSentinels(t *testing.T) {
	if _, err := SentinelBinary(); err != nil {
		t.Fatal(err)
	}
	p := Start(t)
	r := StartReplica(t, p)
	g := StartSentinels(t, p, 3, r)
	if m, err := g.Master(); err != nil || m != p.Addr {
		t.Fatalf("master = %q, %v; want %s", m, err, p.Addr)
	}
	if !strings.Contains(g.URL(), "master_set="+MasterSet) || strings.Count(g.URL(), "&addr=") != 2 {
		t.Fatalf("URL %q: want master_set and two more sentinel addresses", g.URL())
	}
	p.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m, err := g.Master(); err == nil && m == r.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica was not promoted within 30 s of the primary's death")
		}
		time.Sleep(50 * time.Millisecond) // polling the sentinels
	}
	if info, err := Command(r.Addr, "INFO", "replication"); err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("promoted replica: %v %q; want role:master", err, info)
	}
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
	if want := "redis://" + c.Nodes[0].Addr + "?addr=" + c.Nodes[1].Addr + "&addr=" + c.Nodes[2].Addr; c.URL != want {
		t.Fatalf("URL = %q; want %q", c.URL, want)
	}
}
