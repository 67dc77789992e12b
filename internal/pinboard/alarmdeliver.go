package pinboard

// This file is the interim alarm delivery path: a plain fasthttp client that
// reaches the worker holding an id the way the proxy would (the placement
// resolver places and caches it and names the session, its secret and
// address). It is meant to be replaced by the proxy's own internal delivery
// call, which shares the proxy's connection pools, retry budget and
// re-resolution; nothing outside this file depends on it but the wiring in
// alarms.go (newAlarmScheduler).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/alarm"
	"github.com/pinned-go/pinned/internal/placement"
	"github.com/pinned-go/pinned/internal/wire"
)

// alarmDeliverer implements alarm.Deliverer on the placement resolver.
type alarmDeliverer struct {
	res    *placement.Resolver
	client *fasthttp.Client
}

// newAlarmDeliverer dials workers through control (the registry's address
// policy), at most conns connections per worker.
func newAlarmDeliverer(res *placement.Resolver, control dialControl, conns int, dialTimeout time.Duration) *alarmDeliverer {
	return &alarmDeliverer{res: res, client: &fasthttp.Client{
		Name: "pinned-alarms",
		Dial: func(addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout, Control: control}
			return d.Dial("tcp", addr)
		},
		MaxConnsPerHost:               conns,
		MaxIdleConnDuration:           5 * time.Second,
		MaxIdemponentCallAttempts:     1,
		DisablePathNormalizing:        true,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		MaxResponseBodySize:           64 << 10,
	}}
}

// close drops the idle connections.
func (d *alarmDeliverer) close() { d.client.CloseIdleConnections() }

// notDelivered wraps err as alarm.ErrNotDelivered.
func notDelivered(format string, args ...any) error {
	return fmt.Errorf("%w: %s", alarm.ErrNotDelivered, fmt.Sprintf(format, args...))
}

// Deliver implements alarm.Deliverer.
func (d *alarmDeliverer) Deliver(ctx context.Context, ns, id string, a wire.AlarmDelivery) (int, error) {
	name := []byte(wire.PlacementName(ns, id))
	rt, err := d.res.Resolve(ctx, name)
	if err != nil {
		return 0, notDelivered("cannot place %s: %v", name, err)
	}
	sess := rt.Session
	u, err := url.Parse(sess.AdvertiseURL)
	if err != nil || u.Host == "" {
		d.res.Refused(name, rt)
		return 0, notDelivered("session %s has a bad advertise URL %q", sess.ID, sess.AdvertiseURL)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("http://" + u.Host + strings.TrimRight(u.EscapedPath(), "/") + string(name) + wire.PathAlarm)
	req.Header.Set(wire.HeaderProxySecret, sess.Secret)
	req.Header.Set(wire.HeaderSession, sess.ID)
	req.Header.Set(wire.HeaderAlarm, a.Header())
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(alarm.DefaultDeliveryTimeout)
	}
	if err := d.client.DoDeadline(req, resp, deadline); err != nil {
		d.res.Refused(name, rt) // the next delivery re-reads the placement
		var op *net.OpError
		if errors.Is(err, fasthttp.ErrDialTimeout) || errors.As(err, &op) && op.Op == "dial" {
			return 0, notDelivered("cannot reach the worker at %s: %v", u.Host, err)
		}
		return 0, fmt.Errorf("delivery to the worker at %s: %w", u.Host, err) // it may have run
	}
	status := resp.StatusCode()
	if status >= 200 && status < 300 {
		return status, nil
	}
	reason := string(resp.Header.Peek(wire.HeaderReason))
	switch {
	case status == fasthttp.StatusServiceUnavailable && (reason == wire.ReasonClosing || reason == wire.ReasonDraining || reason == wire.ReasonLease):
		d.res.Refused(name, rt) // re-read the placement, as the proxy does
	case status == fasthttp.StatusForbidden && reason == wire.ReasonForbidden:
		// Another process answers at the session's address: the worker
		// restarted. Nothing ran; the placement is re-read.
		d.res.Refused(name, rt)
		status = fasthttp.StatusServiceUnavailable
	}
	msg := wire.ErrorText(resp.Body())
	if reason != "" {
		msg = reason + ": " + msg
	}
	return status, errors.New(msg)
}
