package worker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/pinboard"
	"github.com/pinned-go/pinned/worker"
)

// Counter is the example's object type.
type Counter struct{ n int }

// devPinboard runs `pinboard -dev` (in-memory directory, generated token)
// in this process on free 127.0.0.1 ports, for the example to join. In
// production the pinboard is its own process (cmd/pinboard) on Redis.
func devPinboard() (url, token string, stop func()) {
	s, err := pinboard.ParseSettings([]string{"-dev"}, nil, io.Discard)
	if err != nil {
		panic(err)
	}
	pub, _ := net.Listen("tcp", "127.0.0.1:0")
	adm, _ := net.Listen("tcp", "127.0.0.1:0")
	p, err := pinboard.New(pinboard.Config{Settings: s, Logger: slog.New(slog.DiscardHandler),
		PublicListener: pub, AdminListener: adm})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return "http://" + pub.Addr().String(), s.Tokens[0], func() { cancel(); <-done }
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

// Joining a fleet: one worker per process, shared by its hosts, registers
// with the pinboard and holds the lease the hosts' instances live under;
// clients talk to the pinboard, which routes every id to the worker holding
// it.
func Example() {
	pinboardURL, token, stopPinboard := devPinboard()
	defer stopPinboard()

	// The application process: its listener, its worker, its hosts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	w, err := worker.New(worker.Config{
		PinboardURL:  pinboardURL,
		AdvertiseURL: "http://" + ln.Addr().String(), // must reach this process, and only it
		Token:        token,
	})
	if err != nil {
		panic(err)
	}
	routes := host.NewRoutes[*Counter]()
	routes.POST("/incr", func(c *Counter, x *host.Ctx) error { c.n++; return x.JSON(200, c.n) })
	h, err := host.New(host.Config{Namespace: "/counter", Worker: w}, host.Type[*Counter]{
		New:    func(*host.Instance) (*Counter, error) { return &Counter{}, nil },
		Routes: routes,
	})
	if err != nil {
		panic(err)
	}
	r := router.New()
	w.Mount(r) // GET /_pinned/challenge: the pinboard's proof that the URL is ours
	srv := &fasthttp.Server{Handler: h.Wrap(r.Handler)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	// The lease: one event per registration, renewal and loss.
	registered := make(chan worker.LeaseEvent, 1)
	w.OnLease(func(e worker.LeaseEvent) {
		if e.Kind == worker.LeaseRegistered {
			registered <- e
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	select {
	case e := <-registered:
		fmt.Println("registered; lease", e.ExpiresIn, "ready", w.Ready())
	case <-time.After(10 * time.Second):
		panic("not registered within 10s")
	}

	call(pinboardURL, "POST", "/counter/alice/incr") // placed on this worker, activated here
	call(pinboardURL, "POST", "/counter/alice/incr")
	call("http://"+ln.Addr().String(), "POST", "/counter/alice/incr") // not through the pinboard: refused

	// Graceful stop: wind down (instances close and release their ids),
	// deregister, then close the host (which detaches it) and the server.
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	fmt.Println("shutdown:", w.Shutdown(sctx), <-ran)
	_ = h.Close(sctx)
	_ = srv.Shutdown()
	<-served
	// Output:
	// registered; lease 10s ready true
	// POST /counter/alice/incr: 200 1
	// POST /counter/alice/incr: 200 2
	// POST /counter/alice/incr: 403 {"error":"forbidden"}
	// shutdown: <nil> <nil>
}
