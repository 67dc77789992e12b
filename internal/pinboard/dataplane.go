package pinboard

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/proxy"
)

// ProxyPlane is the pinboard's data plane: the proxy (package proxy) on the
// placement resolver (package placement). NewProxy builds it; cmd/pinboard
// passes NewProxy as Config.NewDataPlane.
type ProxyPlane struct {
	px  *proxy.Proxy
	res *placement.Resolver
}

var _ DataPlane = (*ProxyPlane)(nil)

// NewProxy builds the proxy and its resolver on the pinboard's store, lease,
// logger and metric set, with the limits of d.Proxy and d.Endpoint (the
// settings' flags; zero fields are the proxy's defaults). It does no I/O.
func NewProxy(d DataPlaneDeps) (DataPlane, error) {
	return NewProxyWith(d, placement.Config{Endpoint: d.Endpoint}, d.Proxy)
}

// NewProxyWith is NewProxy with adjusted settings (tests and embedders): the
// store, lease, logger and metrics always come from d. The resolver gets
// d.Clock only when it is not the real clock: with the real clock, lookups
// use fasthttp's request time instead of reading the clock again. Unless
// rc.Endpoint.Dial is set, workers are dialled through d.DialControl, the
// registry's address policy, checked on the address actually connected.
func NewProxyWith(d DataPlaneDeps, rc placement.Config, pc proxy.Config) (*ProxyPlane, error) {
	rc.Store, rc.Lease, rc.Logger, rc.Metrics = d.Store, d.Lease, d.Logger, d.Metrics
	if rc.Endpoint.Dial == nil && d.DialControl != nil {
		control := d.DialControl
		rc.Endpoint.Dial = func(addr string, timeout time.Duration) (net.Conn, error) {
			dl := net.Dialer{Timeout: timeout, Control: control}
			return dl.Dial("tcp", addr)
		}
	}
	if _, real := d.Clock.(clock.Real); d.Clock != nil && !real && rc.Clock == nil {
		rc.Clock = d.Clock
	}
	res, err := placement.New(rc)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	pc.Resolver, pc.Logger, pc.Metrics = res, d.Logger, d.Metrics
	px, err := proxy.New(pc)
	if err != nil {
		res.Close()
		return nil, err
	}
	return &ProxyPlane{px: px, res: res}, nil
}

// Handle implements DataPlane: the proxy's handler.
func (d *ProxyPlane) Handle(ctx *fasthttp.RequestCtx) { d.px.Handler(ctx) }

// Invalidate implements DataPlane: the resolver's OnInvalidate (fast, no
// store call).
func (d *ProxyPlane) Invalidate(inv store.Invalidation) { d.res.OnInvalidate(inv) }

// NewServer returns the proxy's server (streamed request bodies, no default
// fields, the proxy's limits and timeouts); the pinboard serves its public
// listener with it, routing /registry/* and /healthz to the registry.
func (d *ProxyPlane) NewServer() *fasthttp.Server { return d.px.NewServer() }

// Guard wraps the registry's handler in the proxy's request-head rules
// (proxy.Proxy.Guard).
func (d *ProxyPlane) Guard(h fasthttp.RequestHandler) fasthttp.RequestHandler { return d.px.Guard(h) }

// Run runs the resolver's background work until ctx ends (after the public
// listener drained), then closes the proxy's tunnels and the resolver's
// endpoints.
func (d *ProxyPlane) Run(ctx context.Context) error {
	err := d.res.Run(ctx)
	_ = d.px.Close()
	d.res.Close()
	return err
}

// Resolver returns the placement resolver (tests and tools).
func (d *ProxyPlane) Resolver() *placement.Resolver { return d.res }

// Proxy returns the proxy (tests and tools).
func (d *ProxyPlane) Proxy() *proxy.Proxy { return d.px }
