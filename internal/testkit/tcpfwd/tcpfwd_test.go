package tcpfwd

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// server accepts connections and hands each to the test.
func server(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(ch)
		for c := range ch {
			c.Close()
		}
	})
	return ln.Addr().String(), ch
}

func dial(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

func accepted(t *testing.T, conns <-chan net.Conn) net.Conn {
	t.Helper()
	select {
	case c := <-conns:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the forwarder did not dial the target")
		return nil
	}
}

// waitHeld waits until the forwarder holds want bytes in direction d.
func waitHeld(t *testing.T, f *Forwarder, d Direction, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		up, down := f.Held()
		if [2]int64{up, down}[d] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("held = %d up, %d down; want %d in direction %d", up, down, want, d)
		}
		time.Sleep(5 * time.Millisecond) // the forwarder's goroutines read on their own
	}
}

// A stall holds bytes and closes in both directions without closing or
// resetting the connection; healing delivers everything, in order, then
// the close.
func TestStallHoldsBytesAndCloses(t *testing.T) {
	addr, conns := server(t)
	f := Start(t, addr)
	c := dial(t, f.Addr())
	if _, err := c.Write([]byte("hello ")); err != nil {
		t.Fatal(err)
	}
	s := accepted(t, conns)
	r := bufio.NewReader(s)
	if got, err := r.ReadString(' '); err != nil || got != "hello " {
		t.Fatalf("before the stall the server read %q, %v", got, err)
	}

	f.Stall(true, true)
	if _, err := c.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, f, Up, 5)
	if err := c.CloseWrite(); err != nil { // a FIN toward the target
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, f, Down, 5)
	// Nothing passed: the forwarder writes a held chunk only after the
	// gate opens, so the server has nothing to read yet (no bytes, no EOF)
	// and neither has the client.
	for _, end := range []net.Conn{s, c} {
		end.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		var b [1]byte
		if n, err := end.Read(b[:]); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a stalled path delivered %d bytes, %v; want nothing (no data, no close)", n, err)
		}
		end.SetReadDeadline(time.Time{})
	}

	f.Stall(false, false)
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "world" {
		t.Fatalf("after the stall the server read %q, %v; want \"world\" then EOF", rest, err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "reply" {
		t.Fatalf("after the stall the client read %q, %v; want the reply", got, err)
	}
	if up, down := f.Held(); up != 0 || down != 0 {
		t.Fatalf("held after healing = %d, %d; want 0", up, down)
	}
}

// A connection opened during a stall is accepted and dialled through, and
// carries nothing until the stall heals.
func TestStallAcceptsNewConnections(t *testing.T) {
	addr, conns := server(t)
	f := Start(t, addr)
	f.Stall(true, false)
	c := dial(t, f.Addr())
	s := accepted(t, conns)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, f, Up, 4)
	if _, err := s.Write([]byte("pong")); err != nil { // the other direction passes
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "pong" {
		t.Fatalf("down direction (not stalled) read %q, %v", got, err)
	}
	f.Stall(false, false)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "ping" {
		t.Fatalf("after the stall the server read %q, %v", got, err)
	}
}

// A cut closes open connections, also one held by a stall, and refuses
// new ones until it heals.
func TestCut(t *testing.T) {
	addr, conns := server(t)
	f := Start(t, addr)
	c := dial(t, f.Addr())
	accepted(t, conns)
	f.Stall(true, true)
	f.SetCut(true)
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("read after a cut: %v", err)
	}
	c2 := dial(t, f.Addr())
	if n, _ := c2.Read(make([]byte, 1)); n != 0 {
		t.Fatal("a connection during a cut carried data")
	}
	f.SetCut(false)
	f.Stall(false, false)
	c3 := dial(t, f.Addr())
	if _, err := c3.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	s := accepted(t, conns)
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatalf("after the cut healed: %v", err)
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// Retarget sends new connections to the new target; drop closes the old.
func TestRetarget(t *testing.T) {
	addr1, conns1 := server(t)
	addr2, conns2 := server(t)
	f := Start(t, addr1)
	c := dial(t, f.Addr())
	accepted(t, conns1)
	f.Retarget(addr2, true)
	if f.Target() != addr2 {
		t.Fatalf("Target() = %s; want %s", f.Target(), addr2)
	}
	if _, err := io.ReadAll(c); err != nil && !isReset(err) {
		t.Fatalf("the dropped connection: %v", err)
	}
	dial(t, f.Addr())
	accepted(t, conns2)
}

// HoldRequests holds the connections that carry the marker toward the
// target until Deliver; the others pass.
func TestHoldRequests(t *testing.T) {
	addr, conns := server(t)
	f := Start(t, addr)
	f.HoldRequests("POST /registry/release")
	other := dial(t, f.Addr())
	if _, err := other.Write([]byte("POST /registry/heartbeat\n")); err != nil {
		t.Fatal(err)
	}
	s1 := accepted(t, conns)
	if line, err := bufio.NewReader(s1).ReadString('\n'); err != nil || line != "POST /registry/heartbeat\n" {
		t.Fatalf("an unmarked request read %q, %v; want it passed", line, err)
	}
	c := dial(t, f.Addr())
	if _, err := c.Write([]byte("POST /registry/release\n")); err != nil {
		t.Fatal(err)
	}
	s2 := accepted(t, conns)
	waitHeld(t, f, Up, int64(len("POST /registry/release\n")))
	if _, err := c.Write([]byte("next\n")); err != nil { // behind the held request
		t.Fatal(err)
	}
	if _, err := s2.Write([]byte("down\n")); err != nil { // the other direction passes
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "down\n" {
		t.Fatalf("the held connection's replies: %q, %v", line, err)
	}
	s2.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := s2.Read(make([]byte, 1)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a held request passed before Deliver: %d bytes, %v", n, err)
	}
	s2.SetReadDeadline(time.Time{})
	f.Deliver()
	r := bufio.NewReader(s2)
	for _, want := range []string{"POST /registry/release\n", "next\n"} {
		if line, err := r.ReadString('\n'); err != nil || line != want {
			t.Fatalf("after Deliver read %q, %v; want %q", line, err, want)
		}
	}
}
