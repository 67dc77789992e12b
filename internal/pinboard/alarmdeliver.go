package pinboard

import (
	"context"
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/alarm"
	"github.com/pinned-go/pinned/proxy"
)

// alarmDeliverer implements alarm.Deliverer on the proxy's internal delivery
// (proxy.Proxy.Deliver): an alarm is a request of the pinboard's own on the
// proxy's path, placed and activated like any, on the proxy's pools, with
// its retries, re-resolves and the route's secret, session and epoch.
type alarmDeliverer struct {
	px *proxy.Proxy
}

// notDelivered wraps err as alarm.ErrNotDelivered: nothing ran.
func notDelivered(format string, args ...any) error {
	return fmt.Errorf("%w: %s", alarm.ErrNotDelivered, fmt.Sprintf(format, args...))
}

// Deliver implements alarm.Deliverer: POST /<ns>/<id>/_pinned/alarm with the
// alarm field. The answer's status is the outcome; a 503 the proxy or the
// host made (no worker, store, unreachable, overloaded; capacity, closing,
// draining, lease, stale), and the proxy's 404 unknown_namespace, mean
// nothing ran (alarm.ErrNotDelivered), a 502 or 504 that it may have.
func (d alarmDeliverer) Deliver(ctx context.Context, ns, id string, a wire.AlarmDelivery) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, notDelivered("%v", err)
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(wire.PlacementName(ns, id) + wire.PathAlarm)
	req.Header.Set(wire.HeaderAlarm, a.Header())
	if err := d.px.Deliver(req, resp); err != nil {
		return 0, notDelivered("%v", err)
	}
	status := resp.StatusCode()
	if status >= 200 && status < 300 {
		return status, nil
	}
	reason := string(resp.Header.Peek(wire.HeaderReason))
	msg := wire.ErrorText(resp.Body())
	if reason != "" {
		msg = reason + ": " + msg
	}
	if status == fasthttp.StatusServiceUnavailable && reason != "" && reason != wire.ReasonStore ||
		reason == wire.ReasonUnknownNamespace {
		// No worker ran it (the proxy's or the host's own refusal; a
		// namespace nobody served recently keeps its alarms for when its
		// workers come back).
		return status, notDelivered("%s", msg)
	}
	return status, errors.New(msg)
}
