package wire

// MaxIDLen is the default and maximum length of an id in bytes.
const MaxIDLen = 256

// MaxNamespaceLen bounds a namespace name (without its leading slash).
const MaxNamespaceLen = 64

// SegmentError says why a namespace or id segment was refused. The zero value
// means the segment is valid.
type SegmentError uint8

// Segment errors, in the order CheckSegment tests them.
const (
	SegmentOK        SegmentError = iota
	SegmentEmpty                  // zero length
	SegmentTooLong                // longer than the limit
	SegmentDot                    // starts with '.', which also covers "." and ".."
	SegmentPercent                // contains '%' (no percent-escapes are decoded or allowed)
	SegmentSlash                  // contains '/' or '\'
	SegmentBadByte                // a byte outside the allowed set
	SegmentNamespace              // a namespace without its leading '/'
)

var segmentErrorText = [...]string{
	SegmentOK:        "ok",
	SegmentEmpty:     "empty segment",
	SegmentTooLong:   "segment too long",
	SegmentDot:       "segment starts with '.'",
	SegmentPercent:   "percent-escapes are not allowed",
	SegmentSlash:     "segment contains a slash or backslash",
	SegmentBadByte:   "segment contains a byte outside A-Za-z0-9._~@:+=-",
	SegmentNamespace: "namespace must be one path segment with a leading '/'",
}

// Error implements error.
func (e SegmentError) Error() string {
	if int(e) < len(segmentErrorText) {
		return segmentErrorText[e]
	}
	return "invalid segment"
}

// segmentByte marks the bytes allowed in a segment: A-Z a-z 0-9 . _ ~ @ : + = -
var segmentByte = func() (t [256]bool) {
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "._~@:+=-" {
		t[c] = true
	}
	return t
}()

// CheckSegment validates an id (or a namespace name without its slash)
// against pinned's id grammar:
//
//	segment = 1*max( ALPHA / DIGIT / "." / "_" / "~" / "@" / ":" / "+" / "=" / "-" )
//	          and not starting with "."
//
// Bytes are taken as they appear on the wire: nothing is percent-decoded, and
// any '%' is refused, so "%2F", "%2E%2E" and double encodings never reach a
// backend or a Redis key. max ≤ 0 means MaxIDLen. CheckSegment does not
// allocate.
func CheckSegment(b []byte, max int) SegmentError {
	if max <= 0 {
		max = MaxIDLen
	}
	switch {
	case len(b) == 0:
		return SegmentEmpty
	case len(b) > max:
		return SegmentTooLong
	case b[0] == '.':
		return SegmentDot
	}
	for _, c := range b {
		if !segmentByte[c] {
			switch c {
			case '%':
				return SegmentPercent
			case '/', '\\':
				return SegmentSlash
			}
			return SegmentBadByte
		}
	}
	return SegmentOK
}

// CheckNamespace validates a namespace as written on the wire: "/" followed
// by a segment of at most MaxNamespaceLen bytes.
func CheckNamespace(ns string) SegmentError {
	if len(ns) < 2 || ns[0] != '/' {
		return SegmentNamespace
	}
	return CheckSegment([]byte(ns[1:]), MaxNamespaceLen)
}

// ReservedNamespaces are the namespaces a worker may not register: their
// paths are served by the pinboard itself on its public port (/registry/*,
// /healthz) or by every worker (/_pinned/*), so the proxy never routes them.
var ReservedNamespaces = [...]string{"/registry", "/healthz", "/_pinned"}

// IsReservedNamespace reports whether ns is one of ReservedNamespaces.
func IsReservedNamespace(ns string) bool {
	for _, r := range ReservedNamespaces {
		if ns == r {
			return true
		}
	}
	return false
}

// MaxSessionIDLen bounds a session id on the wire. The pinboard mints ids of
// SessionIDLen bytes.
const MaxSessionIDLen = 64

// SessionIDLen is the length of the session ids the pinboard mints: 24
// base64url characters, 144 random bits.
const SessionIDLen = 24

// CheckSessionID validates a session id as received on the wire: a segment
// (see CheckSegment) of at most MaxSessionIDLen bytes.
func CheckSessionID(id string) SegmentError {
	return CheckSegment([]byte(id), MaxSessionIDLen)
}
