package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// parseAll feeds a response to a fresh parser in pieces of at most step
// bytes, as reads would deliver it (the unconsumed head is kept and grown,
// like the event loops' read buffer), then reports the end of the stream
// if eof. It returns the parser and the first error.
func parseAll(resp string, head bool, step int, eof bool) (*respParser, int, error) {
	var p respParser
	p.reset(head)
	var buf []byte
	extra := 0
	for off := 0; off < len(resp); {
		n := min(step, len(resp)-off)
		buf = append(buf, resp[off:off+n]...)
		off += n
		used, err := p.parse(buf)
		if err != nil {
			return &p, 0, err
		}
		if p.done() {
			extra = len(buf) - used + len(resp) - off
			return &p, extra, nil
		}
		buf = append(buf[:0], buf[used:]...)
	}
	if eof {
		return &p, 0, p.eof()
	}
	return &p, 0, nil
}

// TestRespParser frames each response identically whatever the read sizes:
// status, body bytes, connection reuse, or the error.
func TestRespParser(t *testing.T) {
	type want struct {
		status int
		body   int64
		close  bool
		done   bool
		extra  int
		err    error
		reason string
	}
	cases := []struct {
		name string
		resp string
		head bool // a HEAD request
		eof  bool // the connection closes after resp
		want want
	}{
		{"content-length", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false, false, want{status: 200, body: 5, done: true}},
		{"zero length", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false, false, want{status: 200, done: true}},
		{"no reason phrase", "HTTP/1.1 204\r\n\r\n", false, false, want{status: 204, done: true}},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n", false, false, want{status: 200, body: 31, done: true}},
		{"chunked with trailer", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\nX-U: 2\r\n\r\n", false, false, want{status: 200, body: 3, done: true}},
		{"connection close", "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nX-Pinned-Reason: capacity\r\nContent-Length: 2\r\n\r\nno", false, false, want{status: 503, body: 2, close: true, done: true, reason: "capacity"}},
		{"http/1.0 closes", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", false, false, want{status: 200, body: 2, close: true, done: true}},
		{"http/1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok", false, false, want{status: 200, body: 2, done: true}},
		{"until close", "HTTP/1.1 200 OK\r\n\r\nabcdef", false, true, want{status: 200, body: 6, close: true, done: true}},
		{"head ignores length", "HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n", true, false, want{status: 200, done: true}},
		{"304 has no body", "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", false, false, want{status: 304, done: true}},
		{"interim 100 skipped", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 1\r\n\r\nx", false, false, want{status: 201, body: 1, done: true}},
		{"same length twice", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", false, false, want{status: 200, body: 1, done: true}},
		{"data after response", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n", false, false, want{status: 200, body: 1, done: true, extra: 17}},

		{"truncated body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello", false, true, want{status: 200, body: 5, err: errTruncated}},
		{"truncated head", "HTTP/1.1 200 OK\r\nContent-Len", false, true, want{err: errTruncated}},
		{"nothing at all", "", false, true, want{err: errNoResponse}},
		{"truncated chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", false, true, want{status: 200, body: 3, err: errTruncated}},
		{"no last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", false, true, want{status: 200, body: 5, err: errTruncated}},
		{"bad status line", "HTTP/1.1 2x0 OK\r\n\r\n", false, false, want{err: errStatusLine}},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", false, false, want{err: errStatusLine}},
		{"http/2 line", "HTTP/2 200\r\n\r\n", false, false, want{err: errStatusLine}},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx", false, false, want{err: errContentLength}},
		{"signed length", "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx", false, false, want{err: errContentLength}},
		{"length list", "HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\nx", false, false, want{err: errContentLength}},
		{"length and chunked", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", false, false, want{err: errCLAndTE}},
		{"chunked in http/1.0", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false, false, want{err: errTE10}},
		{"chunked not last", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", false, false, want{err: errTransferCoding}},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false, false, want{status: 200, err: errChunkSize}},
		{"empty chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n", false, false, want{status: 200, err: errChunkSize}},
		{"digits after whitespace in a chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0 0\r\n\r\n", false, false, want{status: 200, err: errChunkSize}},
		{"whitespace before a chunk extension", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3 ;x\r\nabc\r\n0\r\n\r\n", false, false, want{status: 200, err: errChunkSize}},
		{"whitespace trailing a chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3 \t\r\nabc\r\n0 \r\n\r\n", false, false, want{status: 200, body: 3, done: true}},
		{"control byte in a trailer value", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT:\x19\r\n\r\n", false, false, want{status: 200, err: errTrailer}},
		{"DEL in a header value", "HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\nContent-Length: 0\r\n\r\n", false, false, want{err: errHeaderLine}},
		{"tab and obs-text in values", "HTTP/1.1 200 OK\r\nX-A: a\tb\xe9\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: x\ty\xff\r\n\r\n", false, false, want{status: 200, done: true}},
		{"trailer without colon", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n0\r\n\r\n", false, false, want{status: 200, err: errTrailer}},
		{"chunk without CRLF", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n", false, false, want{status: 200, body: 1, err: errChunkData}},
		{"folded header", "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 0\r\n\r\n", false, false, want{err: errHeaderLine}},
		{"space in name", "HTTP/1.1 200 OK\r\nContent Length: 0\r\n\r\n", false, false, want{err: errHeaderLine}},
		{"bare LF inside", "HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 0\r\n\r\n", false, false, want{err: errHeaderLine}},
		{"101 to a plain request", "HTTP/1.1 101 Switching Protocols\r\n\r\n", false, false, want{err: errSwitching}},
		{"huge head", "HTTP/1.1 200 OK\r\nX-A: " + strings.Repeat("a", maxResponseHead) + "\r\n\r\n", false, false, want{err: errHeadTooLarge}},
	}
	for _, tc := range cases {
		for _, step := range []int{1, 2, 3, 7, 64, 1 << 20} {
			p, extra, err := parseAll(tc.resp, tc.head, step, tc.eof)
			w := tc.want
			if !errors.Is(err, w.err) {
				t.Errorf("%s (reads of %d): err %v; want %v", tc.name, step, err, w.err)
				continue
			}
			if p.status != w.status || p.body != w.body || p.close != w.close || p.done() != w.done || extra != w.extra || string(p.reasonBytes()) != w.reason {
				t.Errorf("%s (reads of %d): status %d body %d close %v done %v extra %d reason %q; want %+v",
					tc.name, step, p.status, p.body, p.close, p.done(), extra, p.reasonBytes(), w)
			}
		}
	}
}

// FuzzRespParser: the parser never panics, frames a response the same way
// whatever the read sizes, and what it accepts as complete net/http reads
// with the same status and body length.
func FuzzRespParser(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), uint8(3), false)
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nT: 1\r\n\r\n"), uint8(1), false)
	f.Add([]byte("HTTP/1.0 404 Nope\r\nConnection: keep-alive\r\n\r\nbody until close"), uint8(5), false)
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"), uint8(9), false)
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"), uint8(2), true)
	f.Fuzz(func(t *testing.T, resp []byte, step uint8, head bool) {
		whole, extraW, errW := parseAll(string(resp), head, len(resp)+1, true)
		split, extraS, errS := parseAll(string(resp), head, int(step%16)+1, true)
		if errW != errS || whole.status != split.status || whole.body != split.body || whole.done() != split.done() || extraW != extraS || whole.close != split.close {
			t.Fatalf("whole: %v status %d body %d done %v extra %d close %v; in reads of %d: %v status %d body %d done %v extra %d close %v",
				errW, whole.status, whole.body, whole.done(), extraW, whole.close, step%16+1, errS, split.status, split.body, split.done(), extraS, split.close)
		}
		if errW != nil || !whole.done() || extraW != 0 {
			return
		}
		method := "GET"
		if head {
			method = "HEAD"
		}
		req, _ := http.NewRequest(method, "http://x/", nil)
		r, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(resp)), req)
		if err != nil || r.StatusCode < 200 {
			// net/http is stricter about some fields, and returns interim
			// responses; ours must only never accept a wrong frame.
			return
		}
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			t.Fatalf("we framed %q as complete (status %d, %d body bytes); net/http's body read fails: %v", resp, whole.status, whole.body, err)
		}
		if r.StatusCode != whole.status || n != whole.body {
			t.Fatalf("%q: we read status %d with %d body bytes; net/http %d with %d", resp, whole.status, whole.body, r.StatusCode, n)
		}
	})
}

// BenchmarkRespParser frames one response as the counter sends it (a head
// of five fields and a short body, in one read): the parser's cost per
// response on the event-loop engine.
func BenchmarkRespParser(b *testing.B) {
	resp := []byte("HTTP/1.1 200 OK\r\nServer: fasthttp\r\nDate: Thu, 03 Dec 2026 19:40:00 GMT\r\n" +
		"Content-Type: application/json\r\nX-Pinned-Epoch: 12\r\nContent-Length: 13\r\n\r\n{\"count\":123}")
	var p respParser
	b.ReportAllocs()
	for range b.N {
		p.reset(false)
		if _, err := p.parse(resp); err != nil || !p.done() {
			b.Fatal(err, p.done())
		}
	}
}
