package host_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
)

// Counter is an object type: one counter per id. Its handlers take turns
// on an instance, so they use its fields without locks.
type Counter struct {
	n int
}

func (c *Counter) get(x *host.Ctx) error  { return x.JSON(200, map[string]any{"id": x.ID(), "n": c.n}) }
func (c *Counter) incr(x *host.Ctx) error { c.n++; return x.JSON(200, c.n) }

// serve runs handler on a fasthttp server on a free 127.0.0.1 port and
// returns its base URL and a function that stops it.
func serve(handler fasthttp.RequestHandler) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := &fasthttp.Server{Handler: handler}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Shutdown(); ln.Close(); <-done }
}

// call sends one request to base+path and prints the status and body.
func call(base, method, path string) {
	req, _ := http.NewRequest(method, base+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%s %s: %d %s\n", method, path, resp.StatusCode, strings.TrimSpace(string(body)))
}

// An object type in local mode: one process keeps the directory of
// instances, one per id, activated by the first request for the id.
func Example() {
	routes := host.NewRoutes[*Counter]()
	routes.GET("/", (*Counter).get)
	routes.POST("/incr", (*Counter).incr)
	h, err := host.New(host.Config{Namespace: "/counter"}, host.Type[*Counter]{
		New:      func(inst *host.Instance) (*Counter, error) { return &Counter{}, nil },
		Teardown: func(c *Counter) { fmt.Println("teardown at", c.n) },
		Routes:   routes,
	})
	if err != nil {
		panic(err)
	}
	h.Start() // the idle sweeper
	base, stop := serve(h.Wrap(func(ctx *fasthttp.RequestCtx) { ctx.Error("not here", 404) }))
	defer stop()

	call(base, "POST", "/counter/alice/incr")
	call(base, "POST", "/counter/alice/incr")
	call(base, "GET", "/counter/alice/")
	call(base, "GET", "/counter/bob/")
	call(base, "GET", "/counter/%2e%2e/") // ids are raw bytes: no decoding, no dot segments
	_ = h.Close(context.Background())     // every instance ends; each teardown runs once

	// Unordered output:
	// POST /counter/alice/incr: 200 1
	// POST /counter/alice/incr: 200 2
	// GET /counter/alice/: 200 {"id":"alice","n":2}
	// GET /counter/bob/: 200 {"id":"bob","n":0}
	// GET /counter/%2e%2e/: 400 {"error":"invalid id: percent-escapes are not allowed","field":"id"}
	// teardown at 2
	// teardown at 0
}

// A stream route: the handler returns at once and the generator runs step
// by step while the client reads, each step inside the instance's turn.
func ExampleCtx_Stream() {
	routes := host.NewRoutes[*Counter]()
	routes.GET("/count", func(c *Counter, x *host.Ctx) error {
		to, err := strconv.Atoi(string(x.RequestCtx().QueryArgs().Peek("to")))
		if err != nil {
			return &host.Error{Status: 400, Message: "to must be a number", Field: "to"}
		}
		x.RequestCtx().SetContentType("text/plain")
		return x.Stream(func(yield func([]byte, error) bool) {
			for i := 1; i <= to; i++ {
				c.n = i // inside the turn: the object is ours
				if !yield([]byte(strconv.Itoa(i)+"\n"), nil) {
					return // the client went away, or the instance was aborted
				}
			}
		})
	})
	h, err := host.New(host.Config{Namespace: "/counter"}, host.Type[*Counter]{
		New:    func(*host.Instance) (*Counter, error) { return &Counter{}, nil },
		Routes: routes,
	})
	if err != nil {
		panic(err)
	}
	base, stop := serve(h.Handler)
	defer stop()
	defer h.Close(context.Background())

	resp, err := http.Get(base + "/counter/alice/count?to=3")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.TransferEncoding)
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		fmt.Println(lines.Text())
	}
	// Output:
	// 200 [chunked]
	// 1
	// 2
	// 3
}

// A websocket route: the handler owns the connection until it returns;
// Instance.Do runs code inside the turn, so it may touch the object.
func ExampleRoutes_WebSocket() {
	routes := host.NewRoutes[*Counter]()
	routes.WebSocket("/ws", func(c *Counter, ws *host.WebSocket) error {
		for {
			_, msg, err := ws.ReadMessage()
			if err != nil {
				return nil // the client closed, or the instance is closing
			}
			var n int
			if err := ws.Instance().Do(func() { c.n++; n = c.n }); err != nil {
				return err
			}
			if err := ws.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, "%s #%d", msg, n)); err != nil {
				return err
			}
		}
	})
	h, err := host.New(host.Config{Namespace: "/counter"}, host.Type[*Counter]{
		New:    func(*host.Instance) (*Counter, error) { return &Counter{}, nil },
		Routes: routes,
	})
	if err != nil {
		panic(err)
	}
	base, stop := serve(h.Handler)
	defer stop()
	defer h.Close(context.Background())

	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(base, "http")+"/counter/alice/ws", nil)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	for _, m := range []string{"hello", "again"} {
		_ = conn.WriteMessage(websocket.TextMessage, []byte(m))
		_, reply, _ := conn.ReadMessage()
		fmt.Println(string(reply))
	}
	// Output:
	// hello #1
	// again #2
}
