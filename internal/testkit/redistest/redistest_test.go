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
