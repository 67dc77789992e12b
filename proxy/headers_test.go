package proxy

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestScanFields(t *testing.T) {
	scan := func(block string, dropFwd bool) *headScan {
		s := &headScan{}
		s.reset()
		mode := dropPinned
		if dropFwd {
			mode |= dropForwarded
		}
		scanFields([]byte(block), s, mode)
		return s
	}
	names := func(s *headScan) string {
		var b []string
		for _, f := range s.deletes() {
			b = append(b, string(f.name))
		}
		return strings.Join(b, ",")
	}

	s := scan("Host: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", true)
	if s.contentLengths != 1 || s.transferEncodings != 1 || s.teNotChunked || s.hosts != 1 || string(s.host) != "a" {
		t.Errorf("CL+TE scan = %+v", s)
	}
	if s = scan("transfer-encoding: identity\r\n\r\n", true); !s.teNotChunked {
		t.Errorf("TE identity: teNotChunked = false")
	}
	if s = scan("Transfer-Encoding: CHUNKED\r\n\r\n", true); s.teNotChunked {
		t.Errorf("TE CHUNKED: teNotChunked = true")
	}
	if s = scan("Foo Bar: x\r\n\r\n", true); !s.badName {
		t.Errorf("name with a space: badName = false")
	}

	s = scan("Connection: keep-alive, X-Foo, close,Upgrade , x-pinned-proxy-secret, Host, Content-Length\r\n"+
		"Keep-Alive: 5\r\nTE: trailers\r\nUpgrade: websocket\r\nProxy-Connection: x\r\nProxy-Authorization: y\r\n"+
		"Expect: 100-continue\r\nHTTP2-Settings: z\r\nX-Pinned-Session: s\r\nX-Forwarded-For: 1.2.3.4\r\n"+
		"Forwarded: for=x\r\nX-Other: 1\r\n\r\n", true)
	if !s.connClose || !s.connUpgrade || s.upgrades != 1 || string(s.upgrade) != "websocket" {
		t.Errorf("connection options: %+v", s)
	}
	want := "Connection,X-Foo,x-pinned-proxy-secret,Keep-Alive,TE,Upgrade,Proxy-Connection,Proxy-Authorization," +
		"Expect,HTTP2-Settings,X-Pinned-Session,X-Forwarded-For,Forwarded"
	if got := names(s); got != want {
		t.Errorf("deletes = %s\nwant      %s", got, want)
	}

	// Trusted peer: forwarding fields stay.
	if got := names(scan("X-Forwarded-For: 1.2.3.4\r\nForwarded: for=x\r\n\r\n", false)); got != "" {
		t.Errorf("trusted deletes = %q; want none", got)
	}

	// obs-fold: a folded Connection value still lists options.
	if got := names(scan("Connection: a,\r\n b\r\nX: y\r\n\r\n", true)); got != "Connection,a,b" {
		t.Errorf("folded deletes = %q", got)
	}
	// Bare LF line ends.
	if s = scan("Content-Length: 1\nTransfer-Encoding: chunked\n\n", true); s.contentLengths != 1 || s.transferEncodings != 1 {
		t.Errorf("bare LF scan = %+v", s)
	}

	var many strings.Builder
	many.WriteString("Connection: ")
	for i := 0; i < maxDeletes+1; i++ {
		many.WriteString("x-a")
		many.WriteByte(byte('a' + i%26))
		many.WriteByte(byte('a' + i/26))
		many.WriteString(", ")
	}
	many.WriteString("\r\n\r\n")
	if s = scan(many.String(), true); !s.tooMany {
		t.Errorf("%d listed fields: tooMany = false", maxDeletes+1)
	}
}

func TestPeekHead(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
	br := bufio.NewReaderSize(io.MultiReader(strings.NewReader(head[:10]), strings.NewReader(head[10:]+"ok")), 64)
	got, err := peekHead(br)
	if err != nil || string(got) != head {
		t.Fatalf("peekHead = %q, %v; want %q", got, err, head)
	}
	if br.Buffered() < len(head) {
		t.Fatalf("peekHead consumed the head")
	}

	_, err = peekHead(bufio.NewReader(strings.NewReader("")))
	var nr errNothingRead
	if !errors.As(err, &nr) {
		t.Errorf("peekHead(empty) = %v; want errNothingRead", err)
	}
	_, err = peekHead(bufio.NewReaderSize(strings.NewReader("HTTP/1.1 200 OK\r\nX: "+strings.Repeat("a", 100)), 32))
	if !errors.Is(err, errHeadTooLarge) {
		t.Errorf("peekHead(oversize) = %v; want errHeadTooLarge", err)
	}
	_, err = peekHead(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n")))
	if err == nil || errors.As(err, &nr) {
		t.Errorf("peekHead(truncated) = %v; want a plain error", err)
	}
}
