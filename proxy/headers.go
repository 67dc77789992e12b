package proxy

import (
	"bufio"
	"bytes"
	"errors"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// This file scans header blocks as they were on the wire. fasthttp parses
// headers into special fields (Host, Content-Length, Transfer-Encoding,
// Connection: close, ...) and forgets what it folded together: a request
// with both Content-Length and Transfer-Encoding, or a Transfer-Encoding of
// "identity", is accepted without a trace in the parsed header. The raw
// block (RequestHeader.RawHeaders on the client side, the bytes still in the
// backend connection's read buffer on the other) keeps them, so one pass
// over it finds both the framing anomalies and every hop-by-hop field the
// proxy must remove (RFC 9110 §7.6.1), without touching the parsed header
// until something needs to change.

// headKind classifies a field name the proxy treats specially.
type headKind uint8

const (
	hkOther headKind = iota
	hkHost
	hkContentLength
	hkTransferEncoding
	hkConnection
	hkUpgrade
	hkTrailer
	// hkHop: removed on every hop: Keep-Alive, Proxy-Connection, TE,
	// Proxy-Authenticate, Proxy-Authorization, Expect, HTTP2-Settings.
	hkHop
	// hkPinned: x-pinned-*, only the proxy sets these toward a worker.
	hkPinned
	// hkForwarded: Forwarded and X-Forwarded-*, replaced by the proxy's own.
	hkForwarded
	// hkListed: named in a Connection field.
	hkListed
)

// maxDeletes bounds the fields one head may ask the proxy to remove.
const maxDeletes = 32

// fieldRef names one field to remove.
type fieldRef struct {
	name []byte // a sub-slice of the scanned block
	kind headKind
}

// headScan is what one pass over a header block found.
type headScan struct {
	contentLengths    int
	transferEncodings int
	// teNotChunked: a Transfer-Encoding value other than exactly "chunked".
	teNotChunked bool
	hosts        int
	host         []byte // the first Host value
	upgrades     int
	upgrade      []byte // the first Upgrade value
	// connUpgrade: Connection lists the "upgrade" option.
	connUpgrade bool
	// connClose: Connection lists the "close" option.
	connClose bool
	// badName: a field name contains a space, which fasthttp tolerates
	// but RFC 9110 §5.1 does not.
	badName bool
	// obsFold: a continuation line (RFC 9112 §5.2), which fasthttp folds
	// into the previous value.
	obsFold bool
	// bareLF: a line ends in LF without CR (RFC 9112 §2.2), which fasthttp
	// accepts as a line end.
	bareLF bool
	// badLength: a Content-Length with a leading zero ("03"), which
	// fasthttp reads as decimal and parsers elsewhere need not.
	badLength bool
	// expect: an Expect field (removed as hop-by-hop; the server answered
	// it before the handler ran).
	expect bool
	// badVersion: the request line's version is not HTTP/1.x (set by the
	// caller, which has the parsed protocol).
	badVersion bool
	// fields counts the field lines.
	fields int
	// tooMany: more than maxDeletes fields to remove.
	tooMany bool
	del     [maxDeletes]fieldRef
	ndel    int
}

// reset clears s for the next block. The deletion array is not zeroed: only
// its first ndel entries are ever read.
func (s *headScan) reset() {
	s.contentLengths, s.transferEncodings, s.hosts, s.upgrades, s.ndel, s.fields = 0, 0, 0, 0, 0, 0
	s.teNotChunked, s.connUpgrade, s.connClose, s.badName, s.tooMany = false, false, false, false, false
	s.obsFold, s.bareLF, s.badLength, s.expect, s.badVersion = false, false, false, false, false
	s.host, s.upgrade = nil, nil
}

// responseFault reports whether a response head must not be relayed:
// ambiguous framing (RFC 9112 §6.1, §6.3) or a field syntax fasthttp
// tolerates and RFC 9112 does not.
func (s *headScan) responseFault() bool {
	return s.contentLengths > 0 && s.transferEncodings > 0 || s.teNotChunked || s.badLength ||
		s.badName || s.obsFold || s.bareLF || s.tooMany
}

// deletes returns the fields to remove.
func (s *headScan) deletes() []fieldRef { return s.del[:s.ndel] }

func (s *headScan) addDelete(name []byte, k headKind) {
	if s.ndel == len(s.del) {
		s.tooMany = true
		return
	}
	s.del[s.ndel] = fieldRef{name: name, kind: k}
	s.ndel++
}

// scanMode says which fields, besides hop-by-hop ones, a scan reports for
// removal.
type scanMode uint8

const (
	// dropPinned: x-pinned-* (a client's; a worker's X-Pinned-Reason is
	// relayed).
	dropPinned scanMode = 1 << iota
	// dropForwarded: Forwarded and X-Forwarded-* (from an untrusted peer).
	dropForwarded
)

// scanFields scans the field lines of a header block (no start line), up to
// and including the empty line that ends it, or to the end of block. Like
// fasthttp it takes a bare LF as a line end, so that both see the same
// fields; it flags the bare LF, and continuation lines (obs-fold), for the
// caller to refuse.
func scanFields(block []byte, s *headScan, mode scanMode) {
	for len(block) > 0 {
		i := bytes.IndexByte(block, '\n')
		var line []byte
		if i < 0 {
			line, block = block, nil
		} else {
			line, block = block[:i], block[i+1:]
			if n := len(line); n == 0 || line[n-1] != '\r' {
				s.bareLF = true
			}
		}
		if n := len(line); n > 0 && line[n-1] == '\r' {
			line = line[:n-1]
		}
		if len(line) == 0 {
			return
		}
		s.fields++
		if line[0] == ' ' || line[0] == '\t' {
			s.obsFold = true
			continue
		}
		// Names are short: one loop finds the colon and any blank in the
		// name (RFC 9110 §5.1: a token; fasthttp tolerates inner spaces).
		colon := -1
		for i, c := range line {
			if c == ':' {
				colon = i
				break
			}
			if c == ' ' || c == '\t' {
				s.badName = true
			}
		}
		if colon < 0 {
			// fasthttp refuses such a line before a handler runs; a response
			// head with one fails to parse. Nothing to classify.
			continue
		}
		name := line[:colon]
		k := classify(name)
		if k == hkOther {
			continue
		}
		value := trimOWS(line[colon+1:])
		switch k {
		case hkHost:
			if s.hosts == 0 {
				s.host = value
			}
			s.hosts++
		case hkContentLength:
			s.contentLengths++
			if len(value) > 1 && value[0] == '0' {
				s.badLength = true
			}
		case hkTransferEncoding:
			s.transferEncodings++
			if !lowerEq(value, "chunked") {
				s.teNotChunked = true
			}
		case hkConnection:
			s.addDelete(name, k)
			s.connectionTokens(value)
		case hkUpgrade:
			if s.upgrades == 0 {
				s.upgrade = value
			}
			s.upgrades++
			s.addDelete(name, k)
		case hkHop:
			if name[0]|0x20 == 'e' {
				s.expect = true
			}
			s.addDelete(name, k)
		case hkPinned:
			if mode&dropPinned != 0 {
				s.addDelete(name, k)
			}
		case hkForwarded:
			if mode&dropForwarded != 0 {
				s.addDelete(name, k)
			}
		}
	}
}

// connectionTokens records the options of a Connection value: "close" and
// "upgrade" as flags, every other token as a field to remove. Fields that
// frame or route the message (Host, Content-Length, Transfer-Encoding,
// Trailer) are never removed on a client's say-so; fasthttp regenerates the
// framing on each leg anyway. The proxy's own fields are added after the
// removals, so listing them strips only the client's copies (golang/go#50580).
func (s *headScan) connectionTokens(v []byte) {
	for len(v) > 0 {
		i := bytes.IndexByte(v, ',')
		var tok []byte
		if i < 0 {
			tok, v = v, nil
		} else {
			tok, v = v[:i], v[i+1:]
		}
		tok = trimOWS(tok)
		switch {
		case len(tok) == 0:
		case lowerEq(tok, "close"):
			s.connClose = true
		case lowerEq(tok, "keep-alive"):
			// Keep-Alive is removed as hop-by-hop regardless.
		case lowerEq(tok, "upgrade"):
			s.connUpgrade = true
		default:
			switch classify(tok) {
			case hkHost, hkContentLength, hkTransferEncoding, hkTrailer:
			default:
				s.addDelete(tok, hkListed)
			}
		}
	}
}

// classify returns the kind of a field name, case-insensitively.
func classify(name []byte) headKind {
	if len(name) < 2 {
		return hkOther
	}
	switch name[0] | 0x20 {
	case 'c':
		switch {
		case lowerEq(name, "content-length"):
			return hkContentLength
		case lowerEq(name, "connection"):
			return hkConnection
		}
	case 't':
		switch {
		case lowerEq(name, "transfer-encoding"):
			return hkTransferEncoding
		case lowerEq(name, "te"):
			return hkHop
		case lowerEq(name, "trailer"):
			return hkTrailer
		}
	case 'h':
		switch {
		case lowerEq(name, "host"):
			return hkHost
		case lowerEq(name, "http2-settings"):
			return hkHop
		}
	case 'k':
		if lowerEq(name, "keep-alive") {
			return hkHop
		}
	case 'p':
		if lowerEq(name, "proxy-connection") || lowerEq(name, "proxy-authenticate") ||
			lowerEq(name, "proxy-authorization") {
			return hkHop
		}
	case 'u':
		if lowerEq(name, "upgrade") {
			return hkUpgrade
		}
	case 'e':
		if lowerEq(name, "expect") {
			return hkHop
		}
	case 'f':
		if lowerEq(name, "forwarded") {
			return hkForwarded
		}
	case 'x':
		switch {
		case lowerHasPrefix(name, wire.HeaderPrefix):
			return hkPinned
		case lowerHasPrefix(name, "x-forwarded-"):
			return hkForwarded
		}
	}
	return hkOther
}

// lowerEq reports whether b equals the lower-case ASCII string s, ignoring
// the case of letters in b.
func lowerEq(b []byte, s string) bool {
	return len(b) == len(s) && lowerHasPrefix(b, s)
}

// lowerHasPrefix reports whether b starts with the lower-case ASCII string s,
// ignoring the case of letters in b.
func lowerHasPrefix(b []byte, s string) bool {
	if len(b) < len(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// trimOWS trims optional whitespace (SP, HTAB) on both ends.
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// errHeadTooLarge: a backend response head does not fit the read buffer.
var errHeadTooLarge = errors.New("response head larger than the read buffer")

// errNothingRead wraps the error of a connection that delivered no byte of a
// response: the backend closed or reset it before answering.
type errNothingRead struct{ err error }

func (e errNothingRead) Error() string { return "no response: " + e.err.Error() }
func (e errNothingRead) Unwrap() error { return e.err }

// peekHead waits until br holds a complete response head (status line and
// fields up to CRLFCRLF, the terminator fasthttp requires too) and returns it
// without consuming it, so that it can be scanned raw before
// ResponseHeader.Read parses the same bytes without further I/O. An error
// before the first byte is wrapped in errNothingRead.
func peekHead(br *bufio.Reader) ([]byte, error) {
	n := 1
	for {
		if _, err := br.Peek(n); err != nil {
			if n == 1 {
				return nil, errNothingRead{err}
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				return nil, errHeadTooLarge
			}
			return nil, err
		}
		b, _ := br.Peek(br.Buffered())
		if i := bytes.Index(b, crlfcrlf); i >= 0 {
			return b[:i+len(crlfcrlf)], nil
		}
		if br.Buffered() >= br.Size() {
			return nil, errHeadTooLarge
		}
		n = br.Buffered() + 1
	}
}

var crlfcrlf = []byte("\r\n\r\n")

// skipLine returns b after its first line.
func skipLine(b []byte) []byte {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return nil
}
