package loadgen

import (
	"bytes"
	"errors"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// The event-loop engine reads HTTP/1.1 responses with respParser: an
// incremental, allocation-free parser that only frames responses (status,
// body length, connection reuse) and never buffers a body. Framing is
// strict: anything it cannot frame with certainty is an error, so a
// malformed or truncated response is never counted as a success.

// Limits of the response parser.
const (
	// maxResponseHead bounds a response head (status line and header
	// fields); it is also the size of an event-loop connection's read
	// buffer, so 10 000 connections hold 160 MiB of them.
	maxResponseHead = 16 << 10
	// maxTrailer bounds the trailer section of a chunked body.
	maxTrailer = 16 << 10
	// maxReasonLen bounds the X-Pinned-Reason value kept per response.
	maxReasonLen = 64
)

// Parser errors. They are values, not formatted per response: a target that
// fails every request must not make the generator allocate per request.
var (
	errHeadTooLarge   = errors.New("response head larger than 16 KiB")
	errStatusLine     = errors.New("malformed response status line")
	errHeaderLine     = errors.New("malformed response header field")
	errContentLength  = errors.New("invalid Content-Length")
	errCLAndTE        = errors.New("response has both Content-Length and Transfer-Encoding")
	errTransferCoding = errors.New("chunked is not the last transfer coding")
	errTE10           = errors.New("Transfer-Encoding in an HTTP/1.0 response")
	errChunkSize      = errors.New("malformed chunk size line")
	errChunkData      = errors.New("chunk data not followed by CRLF")
	errTrailer        = errors.New("malformed or oversized chunked trailer")
	errSwitching      = errors.New("unexpected 101 Switching Protocols")
	errTruncated      = errors.New("connection closed before the end of the response")
	errNoResponse     = errors.New("connection closed before any response byte")
	errExtraData      = errors.New("data after the end of the response")
)

// Parser states.
const (
	psHead        uint8 = iota // waiting for a complete head
	psLength                   // Content-Length body: remain bytes left
	psUntilClose               // body delimited by the connection's close
	psChunkSize                // chunk size digits
	psChunkExt                 // chunk extension, up to CR
	psChunkSizeWS              // whitespace after the size digits, up to CR
	psChunkSizeLF              // LF after the size line
	psChunkData                // remain bytes of chunk data left
	psChunkDataCR              // CR after chunk data
	psChunkDataLF              // LF after chunk data
	psTrailer                  // start of a trailer line (or the final CRLF)
	psTrailerName              // a trailer field's name
	psTrailerLine              // a trailer field's value
	psTrailerLF                // LF ending a trailer field line
	psEndLF                    // LF of the final CRLF
	psDone                     // the response is complete
)

// respParser frames one HTTP/1.x response at a time. Reset it before each
// request; feed it the bytes read with parse, and call eof when the
// connection reports end of stream.
type respParser struct {
	state   uint8
	noBody  bool  // the request was HEAD: no body whatever the head says
	status  int   // status code of the final response
	close   bool  // the connection cannot carry another request
	remain  int64 // body or chunk bytes left
	body    int64 // body bytes seen (chunk data only, for chunked bodies)
	trailer int   // trailer bytes seen
	digits  int   // hex digits of the current chunk size
	scanned int   // head bytes already searched for the end of the head
	seen    bool  // any byte of the response arrived
	reason  [maxReasonLen]byte
	nreason int
}

// reset prepares p for the response to a new request; head says whether
// that request is a HEAD.
func (p *respParser) reset(head bool) {
	*p = respParser{noBody: head}
}

// reasonBytes returns the X-Pinned-Reason value of the response (at most
// maxReasonLen bytes), valid until the next reset.
func (p *respParser) reasonBytes() []byte { return p.reason[:p.nreason] }

// done reports whether a whole response has been parsed.
func (p *respParser) done() bool { return p.state == psDone }

// parse consumes bytes of the response from buf and returns how many it
// consumed. In the head state it consumes nothing until buf holds the
// whole head; the caller keeps the unconsumed bytes and appends to them.
// Body bytes are always consumed (counted and dropped) up to the end of the
// response. When the response is complete, done() is true and any byte
// after it in buf is the caller's to judge (errExtraData: responses are
// never pipelined).
func (p *respParser) parse(buf []byte) (int, error) {
	if len(buf) > 0 {
		p.seen = true
	}
	off := 0
	for off < len(buf) {
		switch p.state {
		case psDone:
			return off, nil
		case psHead:
			n, err := p.parseHead(buf[off:])
			if err != nil || n == 0 {
				return off, err
			}
			off += n
		case psLength:
			off += p.bodyBytes(len(buf)-off, psDone)
		case psUntilClose:
			p.body += int64(len(buf) - off)
			return len(buf), nil
		case psChunkData:
			off += p.bodyBytes(len(buf)-off, psChunkDataCR)
		default:
			if err := p.chunkByte(buf[off]); err != nil {
				return off, err
			}
			off++
		}
	}
	return off, nil
}

// bodyBytes counts up to avail bytes of the remain body (or chunk) bytes
// left, moves to state next when none are left, and returns the count.
func (p *respParser) bodyBytes(avail int, next uint8) int {
	n := int(min(int64(avail), p.remain))
	p.remain -= int64(n)
	p.body += int64(n)
	if p.remain == 0 {
		p.state = next
	}
	return n
}

// eof handles the end of the stream: it completes a body delimited by the
// close and is an error anywhere else before the end of the response.
func (p *respParser) eof() error {
	switch {
	case p.state == psUntilClose:
		p.state = psDone
		return nil
	case p.state == psDone:
		return nil
	case !p.seen:
		return errNoResponse
	}
	return errTruncated
}

// chunkByte advances the chunked-body framing by one byte.
func (p *respParser) chunkByte(c byte) error {
	switch p.state {
	case psChunkSize:
		d := wire.Unhex(c)
		switch {
		case d >= 0:
			if p.remain >= 1<<58 {
				return errChunkSize
			}
			p.remain = p.remain<<4 | int64(d)
			p.digits++
			return nil
		case p.digits == 0:
			return errChunkSize
		case c == ';':
			p.state = psChunkExt
		case c == ' ' || c == '\t':
			// Whitespace may only trail the size: "0 0" or "5 ;x" is
			// malformed (Go's net/http refuses both as well).
			p.state = psChunkSizeWS
		case c == '\r':
			p.state = psChunkSizeLF
		default:
			return errChunkSize
		}
	case psChunkSizeWS:
		switch c {
		case ' ', '\t':
		case '\r':
			p.state = psChunkSizeLF
		default:
			return errChunkSize
		}
	case psChunkExt:
		switch c {
		case '\r':
			p.state = psChunkSizeLF
		case '\n', 0:
			return errChunkSize
		}
	case psChunkSizeLF:
		if c != '\n' {
			return errChunkSize
		}
		if p.remain == 0 {
			p.state = psTrailer
		} else {
			p.state = psChunkData
		}
	case psChunkDataCR:
		return p.expect(c, '\r', psChunkDataLF, errChunkData)
	case psChunkDataLF:
		p.remain, p.digits = 0, 0
		return p.expect(c, '\n', psChunkSize, errChunkData)
	case psTrailer:
		if c == '\r' {
			p.state = psEndLF
			return nil
		}
		if !tokenByte[c] {
			return errTrailer
		}
		p.state = psTrailerName
		return p.countTrailer()
	case psTrailerName:
		switch {
		case c == ':':
			p.state = psTrailerLine
		case !tokenByte[c]:
			return errTrailer
		}
		return p.countTrailer()
	case psTrailerLine:
		switch {
		case c == '\r':
			p.state = psTrailerLF
		case !fieldValueByte[c]:
			return errTrailer
		}
		return p.countTrailer()
	case psTrailerLF:
		return p.expect(c, '\n', psTrailer, errTrailer)
	case psEndLF:
		return p.expect(c, '\n', psDone, errTrailer)
	}
	return nil
}

// expect moves to state next if c is want, and fails with err otherwise.
func (p *respParser) expect(c, want byte, next uint8, err error) error {
	if c != want {
		return err
	}
	p.state = next
	return nil
}

func (p *respParser) countTrailer() error {
	p.trailer++
	if p.trailer > maxTrailer {
		return errTrailer
	}
	return nil
}

// parseHead parses a complete head at the start of buf and returns its
// length, or 0 if buf does not hold a complete head yet. An interim 1xx
// response is consumed and the parser waits for the next head.
func (p *respParser) parseHead(buf []byte) (int, error) {
	from := max(0, p.scanned-3)
	i := bytes.Index(buf[from:], crlfcrlf)
	if i < 0 {
		p.scanned = len(buf)
		if len(buf) >= maxResponseHead {
			return 0, errHeadTooLarge
		}
		return 0, nil
	}
	end := from + i + 4
	p.scanned = 0
	if end > maxResponseHead {
		return 0, errHeadTooLarge
	}
	head := buf[:end-2] // every line, each ending in CRLF
	line, rest := cutLine(head)
	status, http10, err := parseStatusLine(line)
	if err != nil {
		return 0, err
	}
	var (
		cl         int64 = -1
		te         bool  // Transfer-Encoding present
		chunked    bool  // ... and chunked is its last coding
		closeConn  = http10
		nreason    int
		reasonSeen bool
	)
	for len(rest) > 0 {
		line, rest = cutLine(rest)
		name, value, ok := splitField(line)
		if !ok {
			return 0, errHeaderLine
		}
		switch {
		case equalFold(name, "content-length"):
			n, ok := parseContentLength(value)
			if !ok || (cl >= 0 && n != cl) {
				return 0, errContentLength
			}
			cl = n
		case equalFold(name, "transfer-encoding"):
			te = true
			c, ok := lastCodingChunked(value, chunked)
			if !ok {
				return 0, errTransferCoding
			}
			chunked = c
		case equalFold(name, "connection"):
			if hasToken(value, "close") {
				closeConn = true
			} else if http10 && hasToken(value, "keep-alive") {
				closeConn = false
			}
		case equalFold(name, "x-pinned-reason") && !reasonSeen:
			reasonSeen = true
			nreason = copy(p.reason[:], value)
		}
	}
	if status < 200 {
		if status == 101 {
			return 0, errSwitching
		}
		return end, nil // interim response: the final one follows
	}
	if cl >= 0 && te {
		return 0, errCLAndTE
	}
	if te && http10 {
		return 0, errTE10 // RFC 9112 §6.1: the framing is faulty
	}
	p.status, p.close, p.nreason = status, closeConn, nreason
	switch {
	case p.noBody || status == 204 || status == 304:
		p.state = psDone
	case te && chunked:
		p.state = psChunkSize
	case te:
		p.state, p.close = psUntilClose, true
	case cl == 0:
		p.state = psDone
	case cl > 0:
		p.state, p.remain = psLength, cl
	default:
		p.state, p.close = psUntilClose, true
	}
	return end, nil
}

var crlfcrlf = []byte("\r\n\r\n")

// cutLine splits b at its first CRLF.
func cutLine(b []byte) (line, rest []byte) {
	i := bytes.Index(b, crlf)
	if i < 0 {
		return b, nil
	}
	return b[:i], b[i+2:]
}

var crlf = []byte("\r\n")

// parseStatusLine parses "HTTP/1.x SP 3DIGIT [SP reason]".
func parseStatusLine(line []byte) (status int, http10 bool, err error) {
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || (line[7] != '1' && line[7] != '0') || line[8] != ' ' {
		return 0, false, errStatusLine
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, false, errStatusLine
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 || (len(line) > 12 && line[12] != ' ') || bytes.IndexAny(line, "\r\n\x00") >= 0 {
		return 0, false, errStatusLine
	}
	return status, line[7] == '0', nil
}

// splitField splits "name: value" with the value's optional whitespace
// trimmed; the name must be a token and the value may hold no control
// byte but HTAB (as net/http: CR, LF and NUL would make the framing
// uncertain, and the other controls are invalid in a field value).
func splitField(line []byte) (name, value []byte, ok bool) {
	i := bytes.IndexByte(line, ':')
	if i <= 0 {
		return nil, nil, false
	}
	name = line[:i]
	for _, c := range name {
		if !tokenByte[c] {
			return nil, nil, false
		}
	}
	for _, c := range line[i+1:] {
		if !fieldValueByte[c] {
			return nil, nil, false
		}
	}
	value = bytes.Trim(line[i+1:], " \t")
	return name, value, true
}

// parseContentLength accepts 1*DIGIT (at most 18 digits).
func parseContentLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// lastCodingChunked walks a Transfer-Encoding list; chunked so far is the
// state carried over from earlier fields. It fails when chunked is followed
// by another coding (chunked must be last, and applied once).
func lastCodingChunked(v []byte, chunked bool) (bool, bool) {
	for len(v) > 0 {
		var c []byte
		c, v, _ = bytes.Cut(v, []byte{','})
		c = bytes.Trim(c, " \t")
		if len(c) == 0 {
			continue
		}
		if chunked {
			return false, false
		}
		chunked = equalFold(c, "chunked")
	}
	return chunked, true
}

// hasToken reports whether the comma-separated list v contains tok
// (ASCII case-insensitive).
func hasToken(v []byte, tok string) bool {
	for len(v) > 0 {
		var c []byte
		c, v, _ = bytes.Cut(v, []byte{','})
		if equalFold(bytes.Trim(c, " \t"), tok) {
			return true
		}
	}
	return false
}

// equalFold compares b with the lower-case ASCII string s, ignoring case.
func equalFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
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

// fieldValueByte marks the bytes a field value (or a trailer's) may hold:
// HTAB, SP, VCHAR and obs-text (RFC 9110 section 5.5); every other control
// byte is refused, as net/http refuses it.
var fieldValueByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c == '\t' || (c >= 0x20 && c != 0x7f)
	}
	return t
}()

// tokenByte marks the RFC 9110 tchar bytes.
var tokenByte = func() (t [256]bool) {
	for c := range 256 {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
			t[c] = true
		}
	}
	for _, c := range []byte("!#$%&'*+-.^_`|~") {
		t[c] = true
	}
	return t
}()
