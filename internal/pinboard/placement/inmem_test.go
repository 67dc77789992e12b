package placement_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// inmem is the proxy hot path without the kernel: a worker and a proxy on
// in-memory listeners, the proxy resolving through a real Resolver on the
// memory store (or a static resolver, for comparison).
type inmem struct {
	worker, front *fasthttputil.InmemoryListener
	workerSrv     *fasthttp.Server
	frontSrv      *fasthttp.Server
	res           *placement.Resolver
	px            *proxy.Proxy
	via           *fasthttp.HostClient
	st            *memstore.Store
	done          chan struct{} // the front server's Serve returned
	workerDone    chan struct{}
}

func newInmem(tb testing.TB, static bool) *inmem {
	tb.Helper()
	m := &inmem{
		worker: fasthttputil.NewInmemoryListener(),
		front:  fasthttputil.NewInmemoryListener(),
		done:   make(chan struct{}),
	}
	body := []byte("0123456789abcdef")
	m.workerSrv = &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { ctx.SetBody(body) },
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		StreamRequestBody:     true,
	}
	epCfg := proxy.EndpointConfig{Dial: func(string, time.Duration) (net.Conn, error) { return m.worker.Dial() }}
	st, err := memstore.New(memstore.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	m.st = st
	if _, err := st.Register(context.Background(), store.Session{
		ID: "sess", ClientID: "c", Secret: "secret", AdvertiseURL: "http://worker:1",
		Namespaces: []string{ns}, Headroom: 1 << 20, Verified: true,
	}, time.Hour); err != nil {
		tb.Fatal(err)
	}
	var r proxy.Resolver
	if static {
		s := proxytest.NewStatic()
		s.PlaceNamespace(ns, &proxy.Session{ID: "sess", Secret: "secret", AdvertiseURL: "http://worker:1"})
		r = s
	} else {
		m.res, err = placement.New(placement.Config{Store: st, Lease: time.Hour, Logger: discard()})
		if err != nil {
			tb.Fatal(err)
		}
		r = m.res
	}
	m.px, err = proxy.New(proxy.Config{Resolver: r, Logger: discard(), Endpoint: epCfg})
	if err != nil {
		tb.Fatal(err)
	}
	m.frontSrv = m.px.NewServer()
	m.workerDone = make(chan struct{})
	go func() { _ = m.workerSrv.Serve(m.worker); close(m.workerDone) }()
	go func() { _ = m.frontSrv.Serve(m.front); close(m.done) }()
	m.via = &fasthttp.HostClient{Addr: "front", Dial: func(string) (net.Conn, error) { return m.front.Dial() }, MaxConns: 1024}
	return m
}

func (m *inmem) close() {
	m.via.CloseIdleConnections()
	// Close the listeners too: a Shutdown that runs before Serve registered
	// its listener would leave Serve accepting forever.
	_ = m.front.Close()
	_ = m.frontSrv.Shutdown()
	<-m.done
	_ = m.worker.Close()
	_ = m.workerSrv.Shutdown()
	<-m.workerDone
	_ = m.px.Close()
	if m.res != nil {
		m.res.Close()
	}
	m.st.Close()
}

func get(tb testing.TB, c *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) {
	if err := c.Do(req, resp); err != nil {
		tb.Fatal(err)
	}
	if resp.StatusCode() != 200 || len(resp.Body()) != 16 {
		tb.Fatalf("status %d, body %q", resp.StatusCode(), resp.Body())
	}
}
