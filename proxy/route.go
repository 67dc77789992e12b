package proxy

import (
	"bytes"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// routeError says why a request target was refused. The zero value means the
// target routes.
type routeError uint8

const (
	routeOK routeError = iota
	// routeNotObject: the path has fewer than two segments ("/", "/ns",
	// "/ns?q"), so it names no object. Answered 404.
	routeNotObject
	// routeNotOrigin: the target is not origin-form (it does not start with
	// '/'): asterisk-form, authority-form, or an absolute-form target that was
	// not reduced to its path first. Answered 400.
	routeNotOrigin
	// routeNamespace: the namespace segment fails wire.CheckSegment.
	routeNamespace
	// routeID: the id segment fails wire.CheckSegment.
	routeID
	// routeFragment: the target contains '#', which no client sends and
	// servers disagree on.
	routeFragment
	// routeDotSegment: the remainder has a "." or ".." segment.
	routeDotSegment
	// routeEscape: the remainder has a percent-escape that a backend could
	// decode into a separator, a dot, NUL or another escape (%2F %5C %2E %00
	// %25, any case).
	routeEscape
	// routeBackslash: the remainder has a raw '\'.
	routeBackslash
)

// route is a parsed origin-form request target "/<ns>/<id><rest>". All three
// parts are sub-slices of the target: parsing copies and allocates nothing.
type route struct {
	// name is "/<ns>/<id>", the placement name (wire.PlacementName).
	name []byte
	// nsLen is the length of the namespace segment: name[1:1+nsLen] is the
	// namespace, name[2+nsLen:] the id.
	nsLen int
	// seg is the SegmentError of the refused segment (routeNamespace, routeID).
	seg wire.SegmentError
}

// namespace returns the namespace segment without its slash.
func (r *route) namespace() []byte { return r.name[1 : 1+r.nsLen] }

// id returns the id segment.
func (r *route) id() []byte { return r.name[2+r.nsLen:] }

// parseRoute splits an origin-form request target (path and query, exactly as
// on the wire) into the placement name "/<ns>/<id>" and validates it.
//
// The namespace and the id are checked with wire.CheckSegment (maxID bounds
// the id, wire.MaxNamespaceLen the namespace). The remainder after the id is
// what the instance's own router sees; because a backend may percent-decode
// and normalise it, it must not be able to climb out of "/<ns>/<id>": dot
// segments, raw backslashes and escapes of '/', '\', '.', NUL and '%' are
// refused in its path part. Empty segments in the remainder are allowed (a
// normaliser collapses them without leaving the object). The query is not
// inspected. Nothing is decoded; on success the backend receives the target
// byte for byte.
//
// parseRoute does not allocate.
func parseRoute(target []byte, maxID int) (route, routeError) {
	var r route
	if len(target) == 0 || target[0] != '/' {
		return r, routeNotOrigin
	}
	if bytes.IndexByte(target, '#') >= 0 {
		return r, routeFragment
	}
	path := target
	if q := bytes.IndexByte(target, '?'); q >= 0 {
		path = target[:q]
	}

	// Namespace: path[1:nsEnd].
	nsEnd := bytes.IndexByte(path[1:], '/') + 1
	if nsEnd <= 0 {
		return r, routeNotObject // "/ns" or "/"
	}
	if e := wire.CheckSegment(path[1:nsEnd], wire.MaxNamespaceLen); e != wire.SegmentOK {
		r.seg = e
		return r, routeNamespace
	}
	// Id: path[nsEnd+1:idEnd].
	idEnd := len(path)
	if i := bytes.IndexByte(path[nsEnd+1:], '/'); i >= 0 {
		idEnd = nsEnd + 1 + i
	}
	if e := wire.CheckSegment(path[nsEnd+1:idEnd], maxID); e != wire.SegmentOK {
		r.seg = e
		return r, routeID
	}
	r.name = path[:idEnd]
	r.nsLen = nsEnd - 1
	if e := checkRest(path[idEnd:]); e != routeOK {
		return r, e
	}
	return r, routeOK
}

// checkRest validates the path remainder after the id: empty or starting with
// '/'. It refuses dot segments, raw backslashes and dangerous escapes. Each
// check is a vectorised byte search, so a clean path costs three of them.
func checkRest(rest []byte) routeError {
	if len(rest) == 0 {
		return routeOK
	}
	if bytes.IndexByte(rest, '\\') >= 0 {
		return routeBackslash
	}
	for b := rest; ; {
		i := bytes.IndexByte(b, '%')
		if i < 0 {
			break
		}
		if i+2 >= len(b) || dangerousEscape(b[i+1], b[i+2]) {
			// A truncated escape: backends disagree on it; refuse.
			return routeEscape
		}
		b = b[i+3:]
	}
	// Dot segments: a "/." that starts a segment of "." or "..".
	for b := rest; ; {
		i := bytes.Index(b, slashDot)
		if i < 0 {
			return routeOK
		}
		seg := b[i+1:]
		if j := bytes.IndexByte(seg, '/'); j >= 0 {
			seg = seg[:j]
		}
		if isDotSegment(seg) {
			return routeDotSegment
		}
		b = b[i+2:]
	}
}

var slashDot = []byte("/.")

func isDotSegment(seg []byte) bool {
	return (len(seg) == 1 && seg[0] == '.') || (len(seg) == 2 && seg[0] == '.' && seg[1] == '.')
}

// dangerousEscape reports whether %<hi><lo> decodes to '/', '\', '.', NUL or
// '%' (double encoding), in either case.
func dangerousEscape(hi, lo byte) bool {
	lo |= 0x20 // fold hex letters to lower case; digits are unaffected
	switch hi {
	case '2':
		return lo == 'f' || lo == 'e' || lo == '5'
	case '5':
		return lo == 'c'
	case '0':
		return lo == '0'
	}
	return false
}

// originForm reduces an absolute-form target "scheme://authority/path?q" to
// its authority and origin-form part "/path?q". ok is false when target is
// not absolute-form. A target without a path yields an empty origin, which
// parseRoute refuses.
func originForm(target []byte) (authority, origin []byte, ok bool) {
	if len(target) == 0 || target[0] == '/' {
		return nil, target, false
	}
	// scheme "://"
	i := 0
	for i < len(target) && target[i] != ':' {
		i++
	}
	if i+3 > len(target) || target[i+1] != '/' || target[i+2] != '/' {
		return nil, target, false
	}
	rest := target[i+3:]
	j := 0
	for j < len(rest) && rest[j] != '/' && rest[j] != '?' && rest[j] != '#' {
		j++
	}
	return rest[:j], rest[j:], true
}
