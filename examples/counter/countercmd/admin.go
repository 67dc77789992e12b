package countercmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/metricshttp"
)

// adminServer is the loopback admin listener (PINNED_ADMIN_LISTEN; always
// there in fleet mode):
// /metrics (the host's and worker's metrics plus go_* and process_*) and
// /debug/pprof/*, so profiles of a worker can be captured under load (see
// profiles/README.md). It never serves the data plane.
type adminServer struct {
	srv    *fasthttp.Server
	ln     net.Listener
	served chan error
}

// startAdmin listens on addr, a loopback address (Load's -admin-listen
// refuses any other: adminAddr): profiles and metrics are not for the
// network.
func startAdmin(addr string, set *metrics.Set, logger *slog.Logger) (*adminServer, error) {
	rt := router.New()
	rt.RedirectTrailingSlash, rt.RedirectFixedPath = false, false
	rt.GET("/metrics", metricshttp.Handler(metricshttp.Config{Sets: []*metrics.Set{set}, Process: true, Metadata: true}))
	rt.GET("/debug/pprof/", pprofhandler.PprofHandler)
	rt.GET("/debug/pprof/{profile:*}", pprofhandler.PprofHandler)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("counter: cannot listen on PINNED_ADMIN_LISTEN=%s: %w", addr, err)
	}
	a := &adminServer{
		srv: &fasthttp.Server{Handler: rt.Handler, Name: "pinned-counter-admin", ReadTimeout: 10 * time.Second,
			WriteTimeout: 2 * time.Minute, Logger: counterapp.ServerLogger(logger), CloseOnShutdown: true},
		ln:     ln,
		served: make(chan error, 1),
	}
	go func() { a.served <- a.srv.Serve(ln) }() // owned by a: stop waits for it
	logger.Info("counter admin listening", "addr", ln.Addr().String())
	return a, nil
}

// stop closes the admin listener and waits for its requests in progress
// (a profile being captured) until ctx ends; a nil server (no admin
// listener) does nothing.
func (a *adminServer) stop(ctx context.Context) error {
	if a == nil {
		return nil
	}
	a.ln.Close() // in case Shutdown runs before Serve registered it
	err := a.srv.ShutdownWithContext(ctx)
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	if serr := <-a.served; serr != nil && err == nil {
		err = serr
	}
	return err
}
