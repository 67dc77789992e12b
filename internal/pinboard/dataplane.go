package pinboard

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/proxy"
)

// dataPlane is the pinboard's data plane: the proxy (package proxy) on the
// placement resolver (package placement). The proxy asks the resolver where
// a name lives; the resolver never calls the proxy: what it learns about
// moved placements of open tunnels reaches the proxy through the OnMoved
// hook wired here.
type dataPlane struct {
	px  *proxy.Proxy
	res *placement.Resolver
}

// dialControl is a net.Dialer.Control hook.
type dialControl = func(network, address string, c syscall.RawConn) error

// newDataPlane builds the proxy and its resolver on the pinboard's store,
// the resolver's settings in rc (Lease, RefreshAhead, NamespaceMemory; the
// rest is filled here), logger and metric set, with the limits of pc (the
// settings' flags; zero fields are the proxy's defaults). The resolver gets clk only when it
// is not the real clock: with the real clock, lookups use fasthttp's request
// time instead of reading the clock again. Unless pc.Endpoint.Dial is set,
// workers are dialled through control, the registry's address policy,
// checked on the address actually connected. It does no I/O.
func newDataPlane(st store.Store, rc placement.Config, fastFailover bool, log *slog.Logger, set *metrics.Set, clk clock.Clock,
	control dialControl, pc proxy.Config) (*dataPlane, error) {
	d := &dataPlane{}
	rc.Store, rc.Logger, rc.Metrics = st, log, set
	// d.px is set below, before Run (the only caller) starts.
	rc.OnMoved = func(name, holder string) { d.px.CloseTunnels(name, holder) }
	if _, real := clk.(clock.Real); clk != nil && !real {
		rc.Clock = clk
	}
	if pc.Endpoint.Dial == nil && control != nil {
		pc.Endpoint.Dial = func(addr string, timeout time.Duration) (net.Conn, error) {
			dl := net.Dialer{Timeout: timeout, Control: control}
			return dl.Dial("tcp", addr)
		}
	}
	if fastFailover {
		dial := pc.Endpoint.Dial
		if dial == nil {
			dial = func(addr string, timeout time.Duration) (net.Conn, error) {
				return net.DialTimeout("tcp", addr, timeout)
			}
		}
		rc.ConfirmDeath = deathProbe{dial: dial}.confirm
	}
	res, err := placement.New(rc)
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	pc.Resolver, pc.Logger, pc.Metrics = res, log, set
	px, err := proxy.New(pc)
	if err != nil {
		res.Close()
		return nil, err
	}
	d.px, d.res = px, res
	return d, nil
}

// run runs the resolver's background work (tunnel checks, the session
// sweep) and the proxy's endpoint janitor until ctx ends (after the public
// listener drained), then closes the proxy's tunnels and pools and the
// resolver.
func (d *dataPlane) run(ctx context.Context) error {
	done := make(chan struct{})
	go func() { // owned by run: joined below
		defer close(done)
		_ = d.px.Run(ctx)
	}()
	err := d.res.Run(ctx)
	<-done
	_ = d.px.Close()
	d.res.Close()
	return err
}
