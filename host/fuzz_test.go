package host

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// FuzzMatch checks the route matcher on arbitrary remainders: a match
// rebuilds exactly the input from the pattern and the captured values, a
// {param} value is a non-empty segment without '/', and matching never
// panics. Seeds: testdata/fuzz/FuzzMatch.
func FuzzMatch(f *testing.F) {
	for _, s := range []string{"/", "/items/42", "/items/", "/files/a/b/c", "/items/4/tags/x", "//", "/items//tags/", "/raw/"} {
		f.Add([]byte(s))
	}
	tbl, err := compileRoutes(itemRoutes())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, path []byte) {
		if len(path) == 0 || path[0] != '/' {
			return // the host always passes a remainder starting with '/'
		}
		var vals [MaxParams][]byte
		e := tbl.match(path, &vals)
		if e == nil {
			return
		}
		var b bytes.Buffer
		n := 0
		for _, s := range e.segs {
			b.WriteByte('/')
			switch s.kind {
			case segLiteral:
				b.WriteString(s.lit)
			case segParam:
				if len(vals[n]) == 0 || bytes.IndexByte(vals[n], '/') >= 0 {
					t.Fatalf("match(%q) on %s: param %d = %q; want a non-empty segment", path, e.pattern, n, vals[n])
				}
				b.Write(vals[n])
				n++
			case segCatchAll:
				b.Write(vals[n])
			}
		}
		if !bytes.Equal(b.Bytes(), path) {
			t.Fatalf("match(%q) = %s with values rebuilding %q", path, e.pattern, b.Bytes())
		}
	})
}

// FuzzDispatch sends arbitrary request targets through a host: it never
// panics, answers one of the statuses the host documents, and serves
// (200) only ids that pass the id grammar. Seeds: testdata/fuzz/FuzzDispatch.
func FuzzDispatch(f *testing.F) {
	for _, s := range []string{"/ns/a/", "/ns/a/items/1", "/ns/%2F/", "/ns/../x", "/ns//", "/ns/a?x=1", "/ns/a%00/", "/ns/" + strings.Repeat("a", 300)} {
		f.Add(s)
	}
	h, err := New(Config{Namespace: "/ns", MaxInstances: 1 << 20, Logger: slog.New(slog.DiscardHandler)}, Type[*item]{
		New:    func(*Instance) (*item, error) { return &item{}, nil },
		Routes: itemRoutes(),
	})
	if err != nil {
		f.Fatal(err)
	}
	defer h.Close(f.Context())
	var rc fasthttp.RequestCtx
	f.Fuzz(func(t *testing.T, target string) {
		rc.Request.Reset()
		rc.Response.Reset()
		rc.Request.SetRequestURI(target)
		rc.Request.Header.SetMethod("GET")
		h.Handler(&rc)
		status := rc.Response.StatusCode()
		switch status {
		case 200, 400, 404, 405, 426:
		default:
			t.Fatalf("GET %q = %d; want 200, 400, 404, 405 or 426", target, status)
		}
		if status != 200 {
			return
		}
		path := rc.Request.URI().PathOriginal()
		rest, ok := bytes.CutPrefix(path, []byte("/ns/"))
		if !ok {
			t.Fatalf("GET %q served with path %q outside the namespace", target, path)
		}
		id, _, _ := bytes.Cut(rest, []byte("/"))
		if e := wire.CheckSegment(id, 0); e != wire.SegmentOK {
			t.Fatalf("GET %q served id %q: %v", target, id, e)
		}
	})
}
