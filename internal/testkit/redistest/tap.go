package redistest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Tap is a TCP proxy on 127.0.0.1 in front of a Redis server that records
// what its clients send, as round trips: on each client connection, a round
// trip is the commands the client sent between two moments the server sent
// it something (a reply, or a push such as an invalidation). A client that
// pipelines N commands and waits for their replies makes one round trip of
// N commands; a client that waits for each reply before sending the next
// command makes N round trips. Point the client under test at Tap.URL.
//
// The count is exact for a client that waits for its replies (what a
// request's path through a store does); a client writing concurrently on
// one connection while replies arrive may see one burst split in two.
type Tap struct {
	// Addr is the tap's host:port; URL is redis://Addr/0.
	Addr, URL string

	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	trips  []Trip
	conns  map[*tapConn]struct{}
	nconn  int
	closed bool
}

// Trip is one round trip: the commands one client connection sent before
// hearing from the server again.
type Trip struct {
	// Conn numbers the client connection (from 1, in accept order).
	Conn int
	// Commands are the commands sent, each as its arguments.
	Commands [][]string
}

// String renders the trip as "conn N: CMD arg ...; CMD ...".
func (t Trip) String() string {
	parts := make([]string, len(t.Commands))
	for i, c := range t.Commands {
		parts[i] = strings.Join(c, " ")
	}
	return fmt.Sprintf("conn %d: %s", t.Conn, strings.Join(parts, "; "))
}

// Names returns the commands' names, upper case ("CLIENT CACHING" for a
// subcommand of CLIENT).
func (t Trip) Names() []string {
	out := make([]string, len(t.Commands))
	for i, c := range t.Commands {
		if len(c) == 0 {
			continue
		}
		out[i] = strings.ToUpper(c[0])
		if out[i] == "CLIENT" && len(c) > 1 {
			out[i] += " " + strings.ToUpper(c[1])
		}
	}
	return out
}

// tapConn is one proxied client connection.
type tapConn struct {
	id             int
	client, server net.Conn
	// spoke: the server sent something since the client's last bytes.
	spoke bool
	// cur is the index in Tap.trips of the connection's current round
	// trip, -1 for none (a new one starts with the client's next bytes).
	cur int
	buf []byte // client bytes not yet parsed into whole commands
}

// NewTap starts a tap in front of the Redis at addr (host:port); it closes
// when the test ends.
func NewTap(tb testing.TB, addr string) *Tap {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	t := &Tap{Addr: ln.Addr().String(), target: addr, ln: ln, conns: map[*tapConn]struct{}{}}
	t.URL = "redis://" + t.Addr + "/0"
	t.wg.Go(t.accept)
	tb.Cleanup(t.Close)
	return t
}

func (t *Tap) accept() {
	for {
		c, err := t.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", t.target)
		if err != nil {
			c.Close()
			continue
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		t.nconn++
		tc := &tapConn{id: t.nconn, client: c, server: s, cur: -1}
		t.conns[tc] = struct{}{}
		t.mu.Unlock()
		t.wg.Go(func() { t.clientToServer(tc) })
		t.wg.Go(func() { t.serverToClient(tc) })
	}
}

// clientToServer records the client's bytes (before forwarding them: the
// reply cannot come first) and forwards them.
func (t *Tap) clientToServer(tc *tapConn) {
	defer tc.server.Close()
	pump(tc.client, tc.server, func(b []byte) {
		t.mu.Lock()
		defer t.mu.Unlock()
		if tc.cur < 0 || tc.spoke {
			t.trips = append(t.trips, Trip{Conn: tc.id})
			tc.cur, tc.spoke = len(t.trips)-1, false
		}
		tc.buf = append(tc.buf, b...)
		var cmds [][]string
		cmds, tc.buf = parseCommands(tc.buf)
		t.trips[tc.cur].Commands = append(t.trips[tc.cur].Commands, cmds...)
	})
}

// serverToClient notes that the server spoke and forwards its bytes.
func (t *Tap) serverToClient(tc *tapConn) {
	defer tc.client.Close()
	pump(tc.server, tc.client, func([]byte) {
		t.mu.Lock()
		tc.spoke = true
		t.mu.Unlock()
	})
}

// pump copies src to dst until either fails, calling seen with each chunk
// read before it is written.
func pump(src, dst net.Conn, seen func([]byte)) {
	b := make([]byte, 64<<10)
	for {
		n, err := src.Read(b)
		if n > 0 {
			seen(b[:n])
			if _, werr := dst.Write(b[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// parseCommands splits the whole RESP commands (arrays of bulk strings, or
// inline commands) at the start of b from the rest.
func parseCommands(b []byte) (cmds [][]string, rest []byte) {
	for len(b) > 0 {
		cmd, n, err := parseCommand(b)
		if err != nil {
			break
		}
		cmds = append(cmds, cmd)
		b = b[n:]
	}
	return cmds, append([]byte(nil), b...)
}

var errIncomplete = errors.New("incomplete command")

// parseCommand parses one command at the start of b and returns its length.
func parseCommand(b []byte) ([]string, int, error) {
	line := func(at int) (string, int, error) {
		i := bytes.Index(b[at:], []byte("\r\n"))
		if i < 0 {
			return "", 0, errIncomplete
		}
		return string(b[at : at+i]), at + i + 2, nil
	}
	head, at, err := line(0)
	if err != nil {
		return nil, 0, err
	}
	if !strings.HasPrefix(head, "*") {
		return strings.Fields(head), at, nil
	}
	n, err := strconv.Atoi(head[1:])
	if err != nil {
		return nil, 0, fmt.Errorf("bad array header %q", head)
	}
	args := make([]string, 0, n)
	for range n {
		h, next, err := line(at)
		if err != nil {
			return nil, 0, err
		}
		l, err := strconv.Atoi(strings.TrimPrefix(h, "$"))
		if err != nil || !strings.HasPrefix(h, "$") {
			return nil, 0, fmt.Errorf("bad bulk header %q", h)
		}
		if next+l+2 > len(b) {
			return nil, 0, errIncomplete
		}
		args = append(args, string(b[next:next+l]))
		at = next + l + 2
	}
	return args, at, nil
}

// Reset forgets the round trips recorded so far; the next bytes of every
// connection start a new one.
func (t *Tap) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trips = nil
	for tc := range t.conns {
		tc.cur = -1
	}
}

// Trips returns the round trips recorded since the tap started or the last
// Reset, in the order they started, without PINGs (the client library's
// keep-alive, which it may send in the middle of other traffic): a trip
// made only of PINGs is left out.
func (t *Tap) Trips() []Trip {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Trip
	for _, tr := range t.trips {
		cp := Trip{Conn: tr.Conn}
		for _, c := range tr.Commands {
			if len(c) == 0 || !strings.EqualFold(c[0], "PING") {
				cp.Commands = append(cp.Commands, c)
			}
		}
		if len(cp.Commands) > 0 {
			out = append(out, cp)
		}
	}
	return out
}

// Close stops the tap: the listener and every proxied connection close. It
// is idempotent.
func (t *Tap) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	for tc := range t.conns {
		tc.client.Close()
		tc.server.Close()
	}
	t.mu.Unlock()
	t.ln.Close()
	t.wg.Wait()
}
