package host

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Handler serves one request on the instance's object obj. It runs inside
// the instance's turn unless its route is concurrent. A nil error keeps the
// response the handler wrote; an *Error answers its status with a JSON body;
// any other error answers 500 (see Ctx for the details).
type Handler[T any] func(obj T, c *Ctx) error

// WebSocketHandler serves one websocket of the instance. It runs without the
// turn (use Instance.Do to touch the object's state) for as long as the
// socket lives; the socket is closed when it returns.
type WebSocketHandler[T any] func(obj T, ws *WebSocket) error

// MaxParams is the largest number of path parameters in one pattern.
const MaxParams = 8

// Routes is the route table of an object type T: patterns on the path
// remainder after the id, each with a handler per method. Build it before
// passing it to New; New compiles a snapshot, later registrations have no
// effect on that host. Registration mistakes (bad pattern, duplicate route)
// are reported by New.
//
// Patterns start with '/' and consist of segments separated by '/':
//
//	literal    matches itself, byte for byte (no percent-decoding)
//	{name}     matches one non-empty segment; c.Param("name")
//	{name...}  (or {name:*}) last segment only: matches the rest of the
//	           path, slashes included, possibly empty
//
// The remainder of a request for "/ns/id" (nothing after the id) is "/".
// Trailing slashes are significant ("/a" and "/a/" differ) and nothing is
// redirected. When several patterns match, the more specific wins, segment
// by segment from the left: literal over {name} over {name...}.
type Routes[T any] struct {
	set        *routeSet[T]
	concurrent bool
}

type routeSet[T any] struct {
	defs []routeDef[T]
	errs []error
}

type routeDef[T any] struct {
	method     int
	pattern    string
	handler    Handler[T]
	ws         WebSocketHandler[T]
	concurrent bool
}

// NewRoutes returns an empty route table for object type T.
func NewRoutes[T any]() *Routes[T] {
	return &Routes[T]{set: &routeSet[T]{}}
}

// Concurrent returns a view of the same table whose registrations are
// concurrent routes: their handlers (and stream steps) run without the
// instance's turn, alongside any other handler of the instance, and must
// synchronise access to the object themselves (for example with
// Instance.Do).
func (r *Routes[T]) Concurrent() *Routes[T] {
	return &Routes[T]{set: r.set, concurrent: true}
}

// GET registers h for GET (and, unless a HEAD route exists, HEAD) requests.
func (r *Routes[T]) GET(pattern string, h Handler[T]) { r.Handle("GET", pattern, h) }

// HEAD registers h for HEAD requests.
func (r *Routes[T]) HEAD(pattern string, h Handler[T]) { r.Handle("HEAD", pattern, h) }

// POST registers h for POST requests.
func (r *Routes[T]) POST(pattern string, h Handler[T]) { r.Handle("POST", pattern, h) }

// PUT registers h for PUT requests.
func (r *Routes[T]) PUT(pattern string, h Handler[T]) { r.Handle("PUT", pattern, h) }

// PATCH registers h for PATCH requests.
func (r *Routes[T]) PATCH(pattern string, h Handler[T]) { r.Handle("PATCH", pattern, h) }

// DELETE registers h for DELETE requests.
func (r *Routes[T]) DELETE(pattern string, h Handler[T]) { r.Handle("DELETE", pattern, h) }

// OPTIONS registers h for OPTIONS requests. Without one, OPTIONS on a
// pattern answers 204 with an Allow header.
func (r *Routes[T]) OPTIONS(pattern string, h Handler[T]) { r.Handle("OPTIONS", pattern, h) }

// Handle registers h for method (GET, HEAD, POST, PUT, PATCH, DELETE or
// OPTIONS) on pattern.
func (r *Routes[T]) Handle(method, pattern string, h Handler[T]) {
	m := methodIndexString(method)
	switch {
	case m < 0:
		r.fail(fmt.Errorf("route %s %q: unsupported method: want one of %s", method, pattern, strings.Join(methodNames[:], ", ")))
	case h == nil:
		r.fail(fmt.Errorf("route %s %q: nil handler", method, pattern))
	default:
		r.set.defs = append(r.set.defs, routeDef[T]{method: m, pattern: pattern, handler: h, concurrent: r.concurrent})
	}
}

// WebSocket registers h for websocket upgrades (GET with Upgrade: websocket)
// on pattern. A GET route on the same pattern serves plain GETs.
func (r *Routes[T]) WebSocket(pattern string, h WebSocketHandler[T]) {
	if h == nil {
		r.fail(fmt.Errorf("route WEBSOCKET %q: nil handler", pattern))
		return
	}
	r.set.defs = append(r.set.defs, routeDef[T]{method: methodWebSocket, pattern: pattern, ws: h, concurrent: true})
}

func (r *Routes[T]) fail(err error) { r.set.errs = append(r.set.errs, err) }

// Methods, in the order of methodNames. methodWebSocket is a pseudo-method
// for websocket routes.
const (
	methodGET = iota
	methodHEAD
	methodPOST
	methodPUT
	methodPATCH
	methodDELETE
	methodOPTIONS
	numMethods
	methodWebSocket = numMethods
)

var methodNames = [numMethods]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

func methodIndexString(m string) int {
	for i, n := range methodNames {
		if n == m {
			return i
		}
	}
	return -1
}

// methodIndex maps a request method to its index without allocating; -1
// for any other method.
func methodIndex(m []byte) int {
	switch string(m) {
	case "GET":
		return methodGET
	case "HEAD":
		return methodHEAD
	case "POST":
		return methodPOST
	case "PUT":
		return methodPUT
	case "PATCH":
		return methodPATCH
	case "DELETE":
		return methodDELETE
	case "OPTIONS":
		return methodOPTIONS
	}
	return -1
}

// route is one compiled (method, pattern) with its type-erased handler.
type route struct {
	pattern    string
	names      []string // parameter names, in path order
	handler    func(obj any, c *Ctx) error
	ws         func(obj any, ws *WebSocket) error
	concurrent bool
}

// entry is one pattern shape with its routes by method.
type entry struct {
	pattern  string
	segs     []segment
	byMethod [numMethods]*route
	ws       *route
	allow    string // Allow header value
}

type segKind uint8

const (
	segLiteral segKind = iota
	segParam
	segCatchAll
)

type segment struct {
	kind segKind
	lit  string
}

// table is the compiled, immutable route table of a host.
type table struct {
	entries []*entry // most specific first
}

// compileRoutes builds the matcher for a route set.
func compileRoutes[T any](rs *Routes[T]) (*table, error) {
	if rs == nil {
		return nil, errors.New("host: Type.Routes is nil: build one with NewRoutes and register at least one route")
	}
	set := rs.set
	errs := slices.Clone(set.errs)
	if len(set.defs) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("no routes registered"))
	}
	t := &table{}
	for _, d := range set.defs {
		segs, names, err := parsePattern(d.pattern)
		if err != nil {
			errs = append(errs, fmt.Errorf("route %s %q: %w", methodName(d.method), d.pattern, err))
			continue
		}
		e := t.find(segs)
		if e == nil {
			e = &entry{pattern: d.pattern, segs: segs}
			t.entries = append(t.entries, e)
		}
		r := &route{pattern: d.pattern, names: names, concurrent: d.concurrent}
		if d.method == methodWebSocket {
			if e.ws != nil {
				errs = append(errs, fmt.Errorf("route WEBSOCKET %q: duplicate of %q", d.pattern, e.ws.pattern))
				continue
			}
			ws := d.ws
			r.ws = func(obj any, s *WebSocket) error { return ws(obj.(T), s) }
			e.ws = r
			continue
		}
		if old := e.byMethod[d.method]; old != nil {
			errs = append(errs, fmt.Errorf("route %s %q: duplicate of %q", methodName(d.method), d.pattern, old.pattern))
			continue
		}
		h := d.handler
		r.handler = func(obj any, c *Ctx) error { return h(obj.(T), c) }
		e.byMethod[d.method] = r
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("host: invalid routes: %w", errors.Join(errs...))
	}
	for _, e := range t.entries {
		e.allow = allowHeader(e)
	}
	slices.SortStableFunc(t.entries, func(a, b *entry) int { return compareSpecificity(a.segs, b.segs) })
	return t, nil
}

func methodName(m int) string {
	if m == methodWebSocket {
		return "WEBSOCKET"
	}
	return methodNames[m]
}

func allowHeader(e *entry) string {
	has := func(m int) bool { return e.byMethod[m] != nil }
	var ms []string
	for m := range numMethods {
		switch {
		case has(m):
		case m == methodGET && e.ws != nil: // the upgrade request
		case m == methodHEAD && has(methodGET): // HEAD falls back to GET
		case m == methodOPTIONS: // answered automatically
		default:
			continue
		}
		ms = append(ms, methodNames[m])
	}
	return strings.Join(ms, ", ")
}

// find returns the entry with exactly this shape (same kinds and literals).
func (t *table) find(segs []segment) *entry {
	for _, e := range t.entries {
		if slices.Equal(e.segs, segs) {
			return e
		}
	}
	return nil
}

// compareSpecificity orders patterns so that the first match is the most
// specific: segment by segment, literal < param < catch-all.
func compareSpecificity(a, b []segment) int {
	for i := range min(len(a), len(b)) {
		if c := cmp.Compare(a[i].kind, b[i].kind); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(a), len(b))
}

// parsePattern splits a pattern into segments and parameter names.
func parsePattern(p string) ([]segment, []string, error) {
	if p == "" || p[0] != '/' {
		return nil, nil, errors.New("pattern must start with '/'")
	}
	parts := strings.Split(p[1:], "/")
	segs := make([]segment, 0, len(parts))
	var names []string
	for i, part := range parts {
		if !strings.ContainsAny(part, "{}") {
			segs = append(segs, segment{kind: segLiteral, lit: part})
			continue
		}
		if len(part) < 3 || part[0] != '{' || part[len(part)-1] != '}' {
			return nil, nil, fmt.Errorf("segment %q: a parameter must be a whole segment {name}, {name...} or {name:*}", part)
		}
		name := part[1 : len(part)-1]
		kind := segParam
		if n, ok := strings.CutSuffix(name, "..."); ok {
			name, kind = n, segCatchAll
		} else if n, ok := strings.CutSuffix(name, ":*"); ok {
			name, kind = n, segCatchAll
		}
		if !validParamName(name) {
			return nil, nil, fmt.Errorf("segment %q: parameter name must be letters, digits and '_'", part)
		}
		if kind == segCatchAll && i != len(parts)-1 {
			return nil, nil, fmt.Errorf("segment %q: a catch-all parameter must be the last segment", part)
		}
		if slices.Contains(names, name) {
			return nil, nil, fmt.Errorf("parameter %q appears twice", name)
		}
		if len(names) == MaxParams {
			return nil, nil, fmt.Errorf("more than %d parameters", MaxParams)
		}
		names = append(names, name)
		segs = append(segs, segment{kind: kind})
	}
	return segs, names, nil
}

func validParamName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// match finds the most specific entry matching path (the remainder after
// the id, starting with '/') and stores its parameter values in vals. It
// does not allocate; the values alias path.
func (t *table) match(path []byte, vals *[MaxParams][]byte) *entry {
	for _, e := range t.entries {
		if matchSegments(e.segs, path, vals) {
			return e
		}
	}
	return nil
}

func matchSegments(segs []segment, path []byte, vals *[MaxParams][]byte) bool {
	p := path[1:] // the path always starts with '/'
	more := true  // p holds at least one more segment (possibly empty)
	n := 0
	for i := range segs {
		s := &segs[i]
		if !more {
			return false
		}
		if s.kind == segCatchAll {
			vals[n] = p
			return true
		}
		var seg []byte
		seg, p, more = cutSegment(p)
		switch s.kind {
		case segLiteral:
			if string(seg) != s.lit {
				return false
			}
		case segParam:
			if len(seg) == 0 {
				return false
			}
			vals[n] = seg
			n++
		}
	}
	return !more
}

// cutSegment splits p at its first '/'; more reports whether a segment
// follows (an empty one when p ends with '/').
func cutSegment(p []byte) (seg, rest []byte, more bool) {
	for i, c := range p {
		if c == '/' {
			return p[:i], p[i+1:], true
		}
	}
	return p, nil, false
}
