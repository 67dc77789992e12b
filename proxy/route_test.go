package proxy

import (
	"bytes"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

func TestParseRoute(t *testing.T) {
	ok := func(target, name, ns, id string) {
		t.Helper()
		r, e := parseRoute([]byte(target), 0)
		if e != routeOK {
			t.Errorf("parseRoute(%q) = error %d; want ok", target, e)
			return
		}
		if string(r.name) != name || string(r.namespace()) != ns || string(r.id()) != id {
			t.Errorf("parseRoute(%q) = name %q ns %q id %q; want %q %q %q",
				target, r.name, r.namespace(), r.id(), name, ns, id)
		}
	}
	ok("/counter/alice", "/counter/alice", "counter", "alice")
	ok("/counter/alice/", "/counter/alice", "counter", "alice")
	ok("/counter/alice/incr", "/counter/alice", "counter", "alice")
	ok("/counter/alice?x=1", "/counter/alice", "counter", "alice")
	ok("/counter/alice/incr?x=/../%2F", "/counter/alice", "counter", "alice") // the query is not inspected
	ok("/c/a.b~c_d@e:f+g=h-i", "/c/a.b~c_d@e:f+g=h-i", "c", "a.b~c_d@e:f+g=h-i")
	ok("/counter/alice//x", "/counter/alice", "counter", "alice") // empty segments in the rest collapse harmlessly
	ok("/counter/alice/a%20b/%3F", "/counter/alice", "counter", "alice")
	ok("/counter/alice/.well-known/x", "/counter/alice", "counter", "alice")
	ok("/counter/alice/...", "/counter/alice", "counter", "alice")
	ok("/counter/"+strings.Repeat("a", wire.MaxIDLen), "/counter/"+strings.Repeat("a", wire.MaxIDLen), "counter", strings.Repeat("a", wire.MaxIDLen))

	bad := func(target string, want routeError) {
		t.Helper()
		if _, e := parseRoute([]byte(target), 0); e != want {
			t.Errorf("parseRoute(%q) = %d; want %d", target, e, want)
		}
	}
	bad("", routeNotOrigin)
	bad("*", routeNotOrigin)
	bad("http://x/counter/alice", routeNotOrigin)
	bad("/", routeNotObject)
	bad("/counter", routeNotObject)
	bad("/counter?x=/a/b", routeNotObject)
	bad("/counter/", routeID)
	bad("/counter/?x", routeID)
	bad("//alice", routeNamespace)
	bad("//alice/x", routeNamespace)
	bad("/../alice", routeNamespace)
	bad("/counter/..", routeID)
	bad("/counter/.", routeID)
	bad("/counter/.hidden", routeID)
	bad("/counter/a%2Fb", routeID)
	bad("/counter/a%2fb/x", routeID)
	bad("/counter/%2E%2E/x", routeID)
	bad("/count%65r/alice", routeNamespace)
	bad("/counter/a\\b", routeID)
	bad("/counter/a;b", routeID)
	bad("/counter/a b", routeID)
	bad("/counter/\xc3\xa9", routeID)
	bad("/counter/"+strings.Repeat("a", wire.MaxIDLen+1), routeID)
	bad("/"+strings.Repeat("n", wire.MaxNamespaceLen+1)+"/a", routeNamespace)
	bad("/counter/alice/..", routeDotSegment)
	bad("/counter/alice/../bob", routeDotSegment)
	bad("/counter/alice/./x", routeDotSegment)
	bad("/counter/alice/x/..?q", routeDotSegment)
	bad("/counter/alice/..%2F..%2Fother/bob", routeEscape)
	bad("/counter/alice/%2e%2e/x", routeEscape)
	bad("/counter/alice/a%5Cb", routeEscape)
	bad("/counter/alice/a%00", routeEscape)
	bad("/counter/alice/%252e%252e", routeEscape) // double encoding
	bad("/counter/alice/a%2", routeEscape)        // truncated escape
	bad("/counter/alice/a\\..\\b", routeBackslash)
	bad("/counter/alice#frag", routeFragment)
	bad("/counter/alice?q#frag", routeFragment)
}

func TestParseRouteMaxID(t *testing.T) {
	if _, e := parseRoute([]byte("/c/abcd"), 3); e != routeID {
		t.Errorf("parseRoute(/c/abcd, 3) = %d; want routeID", e)
	}
	if _, e := parseRoute([]byte("/c/abc"), 3); e != routeOK {
		t.Errorf("parseRoute(/c/abc, 3) = %d; want ok", e)
	}
}

func TestOriginForm(t *testing.T) {
	f := func(target, authority, origin string, isAbs bool) {
		t.Helper()
		a, o, ok := originForm([]byte(target))
		if ok != isAbs || string(a) != authority || string(o) != origin {
			t.Errorf("originForm(%q) = %q, %q, %v; want %q, %q, %v", target, a, o, ok, authority, origin, isAbs)
		}
	}
	f("/a/b", "", "/a/b", false)
	f("http://h:1/a/b?q", "h:1", "/a/b?q", true)
	f("https://h/a", "h", "/a", true)
	f("http://h", "h", "", true)
	f("http://h?q", "h", "?q", true)
	f("*", "", "*", false)
}

// FuzzParseRoute checks the route parser's promises on any target: an
// accepted namespace and id are valid segments without '/', the parts
// round-trip to the target, and a backend that decodes and normalises the
// path (fasthttp's URI does both) still sees it inside "/<ns>/<id>".
func FuzzParseRoute(f *testing.F) {
	for _, s := range []string{
		"/counter/alice", "/counter/alice/incr?x=1", "/c/a/../b", "/c/a/..%2F..%2Fd/e", "//a/b",
		"/c/a%2fb", "/c/a/%2e%2e/x", "/c/a/b%252e", "/c/a\\b", "/c/a/./b", "/c/a#f", "/c/a//b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		r, e := parseRoute([]byte(target), 0)
		if e != routeOK {
			return
		}
		ns, id := r.namespace(), r.id()
		if bytes.IndexByte(ns, '/') >= 0 || bytes.IndexByte(id, '/') >= 0 {
			t.Fatalf("parseRoute(%q): namespace %q or id %q contains '/'", target, ns, id)
		}
		if wire.CheckSegment(ns, wire.MaxNamespaceLen) != wire.SegmentOK || wire.CheckSegment(id, 0) != wire.SegmentOK {
			t.Fatalf("parseRoute(%q): accepted invalid segment %q/%q", target, ns, id)
		}
		if got := "/" + string(ns) + "/" + string(id); got != string(r.name) {
			t.Fatalf("parseRoute(%q): name %q != /ns/id %q", target, r.name, got)
		}
		if !strings.HasPrefix(target, string(r.name)) {
			t.Fatalf("parseRoute(%q): name %q is not a prefix", target, r.name)
		}
		rest := target[len(r.name):]
		if rest != "" && rest[0] != '/' && rest[0] != '?' {
			t.Fatalf("parseRoute(%q): rest %q does not start a segment or query", target, rest)
		}
		// What a fasthttp backend routes on: the decoded, normalised path.
		var u fasthttp.URI
		if err := u.Parse([]byte("w:1"), []byte(target)); err != nil {
			return
		}
		p := string(u.Path())
		if p != string(r.name) && !strings.HasPrefix(p, string(r.name)+"/") {
			t.Fatalf("parseRoute(%q): name %q, but a backend routes on %q", target, r.name, p)
		}
	})
}
