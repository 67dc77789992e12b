package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// refScan is a plain re-statement of what scanFields must find, written for
// clarity rather than speed: strings, lower-casing, no shortcuts.
type refScan struct {
	contentLengths, transferEncodings, hosts, fields  int
	teNotChunked, badName, obsFold, bareLF, badLength bool
	host                                              string
}

func referenceScan(block string) refScan {
	var r refScan
	for len(block) > 0 {
		line, rest, found := strings.Cut(block, "\n")
		block = rest
		if found && !strings.HasSuffix(line, "\r") {
			r.bareLF = true
		}
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			break
		}
		r.fields++
		if line[0] == ' ' || line[0] == '\t' {
			r.obsFold = true
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if strings.ContainsAny(name, " \t") {
			r.badName = true
		}
		if !ok {
			continue
		}
		value = strings.Trim(value, " \t")
		switch strings.ToLower(name) {
		case "content-length":
			r.contentLengths++
			if len(value) > 1 && value[0] == '0' {
				r.badLength = true
			}
		case "transfer-encoding":
			r.transferEncodings++
			if strings.ToLower(value) != "chunked" {
				r.teNotChunked = true
			}
		case "host":
			if r.hosts == 0 {
				r.host = value
			}
			r.hosts++
		}
	}
	return r
}

// FuzzScanFields checks the raw head scanner against the plain reference
// above, checks what it lists for removal, and checks the property the
// proxy's smuggling defence rests on: when the scan finds nothing wrong with
// a head fasthttp accepts, fasthttp frames the body exactly as the raw
// fields say (chunked iff a Transfer-Encoding; otherwise the one
// Content-Length), and reads the same Host.
func FuzzScanFields(f *testing.F) {
	for _, s := range []string{
		"Host: a\r\nContent-Length: 3\r\n\r\n",
		"Host: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
		"Host: a\r\nTransfer-Encoding: Chunked \r\n\r\n",
		"Host: a\r\nConnection: close, X-Foo, Host, Keep-Alive\r\nX-Foo: 1\r\nUpgrade: websocket\r\n\r\n",
		"Host: a\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n",
		"Host: a\nContent-Length: 1\n\n",
		"Host: a\r\nContent-Length: 007\r\n\r\n",
		"Host: a\r\nX-Pinned-Session: s\r\nForwarded: for=x\r\nX-Forwarded-For: 1\r\nTE: trailers\r\n\r\n",
		"Host: a\r\nTransfer Encoding: chunked\r\n\r\n",
	} {
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, block []byte, untrusted bool) {
		var s headScan
		s.reset()
		mode := dropPinned
		if untrusted {
			mode |= dropForwarded
		}
		scanFields(block, &s, mode)

		ref := referenceScan(string(block))
		got := refScan{
			contentLengths: s.contentLengths, transferEncodings: s.transferEncodings, hosts: s.hosts, fields: s.fields,
			teNotChunked: s.teNotChunked, badName: s.badName, obsFold: s.obsFold, bareLF: s.bareLF,
			badLength: s.badLength, host: string(s.host),
		}
		if got != ref {
			t.Fatalf("scanFields(%q)\n got %+v\nwant %+v", block, got, ref)
		}

		// Removals: sub-slices of the block, never a framing or routing
		// field, each of a kind the proxy removes.
		for _, d := range s.deletes() {
			if len(d.name) == 0 || !within(block, d.name) {
				t.Fatalf("scanFields(%q): delete %q is not a non-empty part of the block", block, d.name)
			}
			switch k := classify(d.name); k {
			case hkHost, hkContentLength, hkTransferEncoding, hkTrailer:
				t.Fatalf("scanFields(%q): would remove framing field %q", block, d.name)
			case hkForwarded:
				if !untrusted && d.kind != hkListed {
					t.Fatalf("scanFields(%q): removes %q from a trusted peer", block, d.name)
				}
			}
		}
		if !s.tooMany && len(s.deletes()) > maxDeletes {
			t.Fatalf("scanFields(%q): %d deletes", block, len(s.deletes()))
		}

		// Agreement with fasthttp on framing.
		if s.responseFault() || s.hosts != 1 {
			return
		}
		var h fasthttp.RequestHeader
		if err := h.Read(bufio.NewReader(strings.NewReader("POST / HTTP/1.1\r\n" + string(block)))); err != nil {
			return
		}
		cl := h.ContentLength()
		switch {
		case s.transferEncodings > 0:
			if cl != -1 {
				t.Fatalf("head %q: scan saw Transfer-Encoding, fasthttp frames ContentLength %d", block, cl)
			}
		case s.contentLengths == 1:
			want, err := strconv.ParseInt(rawField(string(block), "content-length"), 10, 64)
			if err != nil || int64(cl) != want {
				t.Fatalf("head %q: raw Content-Length %d (%v), fasthttp frames %d", block, want, err, cl)
			}
		default:
			if cl != 0 && cl != -2 {
				t.Fatalf("head %q: no framing field in the scan, fasthttp frames %d", block, cl)
			}
		}
		if string(h.Host()) != string(s.host) {
			t.Fatalf("head %q: scan Host %q, fasthttp Host %q", block, s.host, h.Host())
		}
	})
}

// within reports whether sub lies inside b's memory.
func within(b, sub []byte) bool {
	if len(b) == 0 || len(sub) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(sub)))
	return p >= start && p+uintptr(len(sub)) <= start+uintptr(len(b))
}

// rawField returns the trimmed value of the first field called name.
func rawField(block, name string) string {
	for line := range strings.Lines(block) {
		n, v, ok := strings.Cut(strings.TrimRight(line, "\r\n"), ":")
		if ok && strings.EqualFold(n, name) {
			return strings.Trim(v, " \t")
		}
	}
	return ""
}

// FuzzPeekHead feeds peekHead a response arriving one byte per read into a
// buffer of a fuzzed size. It must return exactly the bytes up to and
// including the first CRLFCRLF when they fit, errHeadTooLarge when they do
// not, errNothingRead for an empty stream, and consume nothing.
func FuzzPeekHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\n",
		"HTTP/1.1 200 OK\nX: 1\n\n",
		"",
		"HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 40) + "\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(32))
	}
	f.Fuzz(func(t *testing.T, data []byte, size uint8) {
		br := bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(data)), int(size))
		head, err := peekHead(br)
		end := bytes.Index(data, crlfcrlf)
		switch {
		case err == nil:
			if end < 0 || !bytes.Equal(head, data[:end+4]) {
				t.Fatalf("peekHead(%q, %d) = %q; want the bytes through the first CRLFCRLF", data, br.Size(), head)
			}
			if br.Buffered() < len(head) {
				t.Fatalf("peekHead(%q, %d) consumed the head", data, br.Size())
			}
		case errors.Is(err, errHeadTooLarge):
			if end >= 0 && end+4 <= br.Size() {
				t.Fatalf("peekHead(%q, %d): too large, but the head is %d bytes", data, br.Size(), end+4)
			}
		case errors.As(err, new(errNothingRead)):
			if len(data) != 0 {
				t.Fatalf("peekHead(%q, %d): nothing read from %d bytes", data, br.Size(), len(data))
			}
		default:
			if end >= 0 && end+4 <= br.Size() {
				t.Fatalf("peekHead(%q, %d): %v, but a head of %d bytes is there", data, br.Size(), err, end+4)
			}
		}
	})
}
