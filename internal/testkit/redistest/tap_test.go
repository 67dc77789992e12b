package redistest

import (
	"bufio"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// The tap groups what a client sends into round trips: a pipeline is one,
// a command sent after the previous reply is another; PINGs are left out
// (and trips made only of them); the commands are parsed with their
// arguments, across reads.
func TestTap(t *testing.T) {
	s := Start(t)
	tap := NewTap(t, s.Addr)
	c, err := net.DialTimeout("tcp", tap.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	send := func(raw string, replies int) {
		t.Helper()
		if _, err := c.Write([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		for range replies {
			if _, err := r.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
	}
	send("*1\r\n$4\r\nPING\r\n", 1)
	// One pipeline, written in two pieces that split a bulk string.
	send("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv", 0)
	send("1\r\n*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n", 2)
	send("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n", 2)
	trips := tap.Trips()
	if len(trips) != 2 {
		t.Fatalf("trips = %v; want 2 (the PING left out)", trips)
	}
	if got := trips[0].String(); got != "conn 1: SET k v1; DEL k" {
		t.Errorf("first trip = %q; want the pipeline SET k v1; DEL k", got)
	}
	if !slices.Equal(trips[1].Names(), []string{"GET"}) || !strings.HasPrefix(trips[1].String(), "conn 1: ") {
		t.Errorf("second trip = %v; want GET (its PING left out) on conn 1", trips[1])
	}
	tap.Reset()
	if trips := tap.Trips(); len(trips) != 0 {
		t.Errorf("trips after Reset = %v; want none", trips)
	}
	send("*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$1\r\nx\r\n", 1)
	if trips := tap.Trips(); len(trips) != 1 || !slices.Equal(trips[0].Names(), []string{"CLIENT SETNAME"}) {
		t.Errorf("trips = %v; want one CLIENT SETNAME", trips)
	}
}
