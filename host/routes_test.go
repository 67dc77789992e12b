package host

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"
)

type item struct{}

// echoRoute answers "<method> <pattern> <params>" so that tests see which
// route matched and with which parameters.
func echoRoute(method, pattern string, names ...string) Handler[*item] {
	return func(_ *item, c *Ctx) error {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s", method, pattern)
		for _, n := range names {
			fmt.Fprintf(&b, " %s=%s", n, c.Param(n))
		}
		c.RequestCtx().SetBodyString(b.String())
		return nil
	}
}

func itemRoutes() *Routes[*item] {
	r := NewRoutes[*item]()
	add := func(method, pattern string, names ...string) {
		r.Handle(method, pattern, echoRoute(method, pattern, names...))
	}
	add("GET", "/")
	add("GET", "/items")
	add("GET", "/items/")
	add("GET", "/items/new")
	add("GET", "/items/{item}", "item")
	add("PUT", "/items/{item}", "item")
	add("PATCH", "/items/{item}", "item")
	add("DELETE", "/items/{item}", "item")
	add("POST", "/items/{item}/tags/{tag}", "item", "tag")
	add("GET", "/files/{path...}", "path")
	add("GET", "/raw/{path:*}", "path")
	add("HEAD", "/head-only")
	add("OPTIONS", "/custom-options")
	r.WebSocket("/ws", func(*item, *WebSocket) error { return nil })
	return r
}

func newItemHost(t *testing.T) *testServer {
	t.Helper()
	h, err := New(Config{Namespace: "/ns", Logger: quietLogger()}, Type[*item]{
		New:    func(*Instance) (*item, error) { return &item{}, nil },
		Routes: itemRoutes(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, h, h.Handler)
}

func TestRoutesMethodsAndParams(t *testing.T) {
	ts := newItemHost(t)
	f := func(method, path string, status int, body string) {
		t.Helper()
		r := ts.do(method, path)
		if r.status != status || (body != "" && r.body != body) {
			t.Errorf("%s %s = %d %q; want %d %q", method, path, r.status, r.body, status, body)
		}
	}
	f("GET", "/ns/a", 200, "GET /")
	f("GET", "/ns/a/", 200, "GET /")
	f("GET", "/ns/a/?q=1", 200, "GET /")
	f("GET", "/ns/a/items", 200, "GET /items")
	f("GET", "/ns/a/items/", 200, "GET /items/")
	f("GET", "/ns/a/items/new", 200, "GET /items/new") // literal beats {item}
	f("GET", "/ns/a/items/42", 200, "GET /items/{item} item=42")
	f("GET", "/ns/a/items/4%2F2", 200, "GET /items/{item} item=4%2F2") // raw, not decoded
	f("PUT", "/ns/a/items/42", 200, "PUT /items/{item} item=42")
	f("PATCH", "/ns/a/items/42", 200, "PATCH /items/{item} item=42")
	f("DELETE", "/ns/a/items/42", 200, "DELETE /items/{item} item=42")
	f("POST", "/ns/a/items/42/tags/red", 200, "POST /items/{item}/tags/{tag} item=42 tag=red")
	f("GET", "/ns/a/files/x/y/z.txt", 200, "GET /files/{path...} path=x/y/z.txt")
	f("GET", "/ns/a/files/", 200, "GET /files/{path...} path=")
	f("GET", "/ns/a/raw/q", 200, "GET /raw/{path:*} path=q")
	f("HEAD", "/ns/a/items/42", 200, "")      // falls back to GET (no body)
	f("HEAD", "/ns/a/head-only", 200, "")     // its own route
	f("GET", "/ns/a/head-only", 405, "")      // only HEAD
	f("GET", "/ns/a/nope", 404, "")           // no pattern
	f("GET", "/ns/a/items/42/extra", 404, "") // too long
	f("GET", "/ns/a/files", 404, "")          // catch-all needs the slash
	f("GET", "/ns//", 400, "")                // empty id
	f("GET", "/ns/a//", 404, "")              // an empty segment matches no route
	f("POST", "/ns/a/items/42", 405, "")
	f("TRACE", "/ns/a/items/42", 405, "")
	f("GET", "/ns/a/ws", 426, "")
	f("OPTIONS", "/ns/a/custom-options", 200, "OPTIONS /custom-options")
	f("GET", "/other/a/", 404, "")
	f("GET", "/ns", 404, "")
	f("GET", "/nsx/a/", 404, "")

	r := ts.do("POST", "/ns/a/items/42")
	if got, want := r.header.Get("Allow"), "GET, HEAD, PUT, PATCH, DELETE, OPTIONS"; got != want {
		t.Errorf("405 Allow = %q; want %q", got, want)
	}
	r = ts.do("OPTIONS", "/ns/a/items/42")
	if r.status != 204 || r.header.Get("Allow") != "GET, HEAD, PUT, PATCH, DELETE, OPTIONS" {
		t.Errorf("OPTIONS = %d Allow %q; want 204 with the route's methods", r.status, r.header.Get("Allow"))
	}
	r = ts.do("GET", "/ns/a/nope")
	if msg := r.json(t)["error"]; msg != "not found" {
		t.Errorf("404 body error = %q; want %q", msg, "not found")
	}
	// A 404 or 405 activates nothing.
	ts.do("GET", "/ns/unused/nope")
	ts.do("POST", "/ns/unused2/items/1")
	if ts.h.instance("unused") != nil || ts.h.instance("unused2") != nil {
		t.Error("an unmatched request activated an instance")
	}
}

func TestRouteCompileErrors(t *testing.T) {
	f := func(name string, build func(r *Routes[*item]), want string) {
		t.Helper()
		r := NewRoutes[*item]()
		build(r)
		_, err := compileRoutes(r)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: compileRoutes error = %v; want it to mention %q", name, err, want)
		}
	}
	h := echoRoute("GET", "x")
	f("no slash", func(r *Routes[*item]) { r.GET("items", h) }, "must start with '/'")
	f("partial param", func(r *Routes[*item]) { r.GET("/a{b}", h) }, "whole segment")
	f("bad name", func(r *Routes[*item]) { r.GET("/{a-b}", h) }, "parameter name")
	f("catch-all not last", func(r *Routes[*item]) { r.GET("/{a...}/b", h) }, "last segment")
	f("duplicate name", func(r *Routes[*item]) { r.GET("/{a}/{a}", h) }, "appears twice")
	f("duplicate route", func(r *Routes[*item]) { r.GET("/{a}", h); r.GET("/{b}", h) }, "duplicate")
	f("bad method", func(r *Routes[*item]) { r.Handle("TRACE", "/", h) }, "unsupported method")
	f("nil handler", func(r *Routes[*item]) { r.GET("/", nil) }, "nil handler")
	f("empty", func(r *Routes[*item]) {}, "no routes")
	f("too many params", func(r *Routes[*item]) { r.GET("/{a}/{b}/{c}/{d}/{e}/{f}/{g}/{h}/{i}", h) }, "more than 8")
	if _, err := compileRoutes[*item](nil); err == nil {
		t.Error("compileRoutes(nil) succeeded")
	}
}

func TestMatchSpecificity(t *testing.T) {
	r := NewRoutes[*item]()
	h := echoRoute("GET", "")
	for _, p := range []string{"/{x...}", "/{a}/{b}", "/{a}/b", "/a/{b}", "/a/b"} {
		r.GET(p, h)
	}
	tbl, err := compileRoutes(r)
	if err != nil {
		t.Fatal(err)
	}
	f := func(path, want string) {
		t.Helper()
		var vals [MaxParams][]byte
		e := tbl.match([]byte(path), &vals)
		got := "<nil>"
		if e != nil {
			got = e.pattern
		}
		if got != want {
			t.Errorf("match(%q) = %s; want %s", path, got, want)
		}
	}
	f("/a/b", "/a/b")
	f("/a/c", "/a/{b}")
	f("/c/b", "/{a}/b")
	f("/c/d", "/{a}/{b}")
	f("/c/d/e", "/{x...}")
	f("/", "/{x...}")
}

// TestMountComposesWithRouter: Register and Wrap leave the application's
// own routes alone.
func TestMountComposesWithRouter(t *testing.T) {
	newHost := func() *Host {
		h, err := New(Config{Namespace: "/ns", Logger: quietLogger()}, Type[*item]{
			New:    func(*Instance) (*item, error) { return &item{}, nil },
			Routes: itemRoutes(),
		})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	app := func() *router.Router {
		r := router.New()
		r.GET("/healthz", func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("app ok") })
		r.GET("/ns-info", func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("app ns-info") })
		return r
	}
	check := func(name string, ts *testServer) {
		t.Helper()
		for _, c := range []struct{ path, body string }{
			{"/healthz", "app ok"},
			{"/ns-info", "app ns-info"},
			{"/ns/a/items/7", "GET /items/{item} item=7"},
		} {
			if r := ts.do("GET", c.path); r.status != 200 || r.body != c.body {
				t.Errorf("%s: GET %s = %d %q; want 200 %q", name, c.path, r.status, r.body, c.body)
			}
		}
	}
	t.Run("Register", func(t *testing.T) {
		h := newHost()
		r := app()
		h.Register(r)
		check("Register", serve(t, h, r.Handler))
	})
	t.Run("Wrap", func(t *testing.T) {
		h := newHost()
		check("Wrap", serve(t, h, h.Wrap(app().Handler)))
	})
}
