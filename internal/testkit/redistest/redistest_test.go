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
