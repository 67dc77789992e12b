package smuggle

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// The tables are what the issue asks for, named uniquely, each case
// explained and classified.
func TestTables(t *testing.T) {
	names := map[string]bool{}
	reqs := Requests()
	if len(reqs) < 60 {
		t.Errorf("%d request cases; want ≥ 60", len(reqs))
	}
	for _, c := range reqs {
		if names[c.Name] {
			t.Errorf("duplicate case name %q", c.Name)
		}
		names[c.Name] = true
		if c.Why == "" || c.Class == "" || !strings.Contains(c.Raw, "\n") {
			t.Errorf("case %q: Why %q, Class %q", c.Name, c.Why, c.Class)
		}
		switch c.Status {
		case 400, 413, 431:
		default:
			t.Errorf("case %q: status %d", c.Name, c.Status)
		}
		if c.AnyPath() && !strings.Contains(c.WithTarget("/elsewhere").Raw, " /elsewhere") {
			t.Errorf("case %q: WithTarget does not replace the target", c.Name)
		}
	}
	if n := len(Responses()); n < 10 {
		t.Errorf("%d response cases; want ≥ 10", n)
	}
	for _, c := range append(append(Controls(), Tolerated()...), LateChunkErrors()...) {
		if names[c.Name] {
			t.Errorf("duplicate case name %q", c.Name)
		}
		names[c.Name] = true
	}
}

// Send reads every response until the peer closes, and Check tells one
// refusal and a close from the rest.
func TestSendAndCheck(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	answers := make(chan string, 3)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for a := range answers {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 4096)
			_, _ = c.Read(buf)
			_, _ = io.WriteString(c, a)
			if !strings.Contains(a, "keep") {
				_ = c.Close()
			} else {
				time.Sleep(300 * time.Millisecond) // stay open past the client's deadline
				_ = c.Close()
			}
		}
	}()
	defer func() { close(answers); _ = ln.Close(); <-done }()
	c := Request{Name: "x", Raw: "GET / HTTP/1.1\r\nHost: h\r\n\r\n", Status: 400}

	answers <- "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n{\"error\":\"x\"}"
	r, err := Send(ln.Addr().String(), c.Raw, 2*time.Second)
	if err != nil || c.Check(r) != nil || !r.Closed {
		t.Errorf("refusal and close: %+v %v %v", r, err, c.Check(r))
	}
	if _, err := r.JSONError(); err != nil {
		t.Errorf("JSONError: %v", err)
	}

	answers <- "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	if r, err = Send(ln.Addr().String(), c.Raw, 2*time.Second); err != nil || c.Check(r) == nil || len(r.Statuses) != 2 {
		t.Errorf("two responses passed the check: %v %v", r.Statuses, err)
	}

	answers <- "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nX: keep\r\n\r\n"
	if r, err = Send(ln.Addr().String(), c.Raw, 100*time.Millisecond); err != nil || r.Closed || c.Check(r) == nil {
		t.Errorf("an open connection passed the check: closed=%v %v", r.Closed, err)
	}
}
