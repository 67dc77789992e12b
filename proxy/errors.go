package proxy

import (
	"encoding/json"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/wire"
)

// reply is an answer the proxy makes itself. Replies are built once by New;
// sending one copies nothing and allocates nothing.
type reply struct {
	status     int
	reason     string // X-Pinned-Reason; "" for none
	retryAfter bool   // send Retry-After
	close      bool   // close the client connection after it
	body       []byte // JSON wire.Error, never modified
}

// replies is the table of every reply the proxy makes.
type replies struct {
	retryAfter string

	// Request target (400 unless noted).
	notObject, notOrigin, fragment, dotSegment, escape, backslash reply // notObject: 404
	namespace, id                                                 [wire.SegmentNamespace + 1]reply
	hostMismatch                                                  reply

	// Framing and fields: 400 and close.
	framing, transferEncoding, fieldName, tooManyFields reply

	// Body.
	tooLarge reply // 413, close
	badBody  reply // 400, close: the client's body broke off or was malformed

	// Upgrades.
	upgradeToken, upgradeHandshake reply // 400

	// Worker side.
	noWorker, store, unreachable, overloaded, tunnelsFull reply // 503 + Retry-After
	badGateway                                            reply // 502
	timeout                                               reply // 504
}

func (r *replies) build(cfg *Config) {
	secs := int64((cfg.RetryAfter + 999_999_999) / 1_000_000_000)
	if secs < 1 {
		secs = 1
	}
	r.retryAfter = strconv.FormatInt(secs, 10)

	mk := func(status int, field, msg string) reply {
		b, _ := json.Marshal(wire.Error{Error: msg, Field: field})
		return reply{status: status, body: b}
	}
	unavailable := func(reason, msg string) reply {
		rp := mk(fasthttp.StatusServiceUnavailable, "", msg)
		rp.reason, rp.retryAfter = reason, true
		return rp
	}
	closing := func(rp reply) reply { rp.close = true; return rp }

	r.notObject = mk(fasthttp.StatusNotFound, "path", "not an object path: want /<namespace>/<id>[/...]")
	r.notOrigin = mk(fasthttp.StatusBadRequest, "path", "request target must be a path")
	r.fragment = mk(fasthttp.StatusBadRequest, "path", "request target must not contain '#'")
	r.dotSegment = mk(fasthttp.StatusBadRequest, "path", "path must not contain '.' or '..' segments")
	r.escape = mk(fasthttp.StatusBadRequest, "path", "path must not contain escaped '/', '\\', '.', NUL or '%'")
	r.backslash = mk(fasthttp.StatusBadRequest, "path", "path must not contain '\\'")
	for e := wire.SegmentEmpty; e <= wire.SegmentNamespace; e++ {
		r.namespace[e] = mk(fasthttp.StatusBadRequest, "namespace", "namespace: "+e.Error())
		r.id[e] = mk(fasthttp.StatusBadRequest, "id", "id: "+e.Error())
	}
	r.hostMismatch = closing(mk(fasthttp.StatusBadRequest, "host", "absolute-form target and Host disagree"))

	r.framing = closing(mk(fasthttp.StatusBadRequest, "transfer-encoding", "both Content-Length and Transfer-Encoding"))
	r.transferEncoding = closing(mk(fasthttp.StatusBadRequest, "transfer-encoding", "transfer coding other than chunked"))
	r.fieldName = closing(mk(fasthttp.StatusBadRequest, "header", "invalid field name"))
	r.tooManyFields = closing(mk(fasthttp.StatusBadRequest, "header", "too many hop-by-hop fields"))

	r.tooLarge = closing(mk(fasthttp.StatusRequestEntityTooLarge, "body",
		"request body larger than "+strconv.FormatInt(cfg.MaxRequestBodySize, 10)+" bytes"))
	r.badBody = closing(mk(fasthttp.StatusBadRequest, "body", "request body incomplete or malformed"))

	r.upgradeToken = mk(fasthttp.StatusBadRequest, "upgrade", "only Upgrade: websocket is supported")
	r.upgradeHandshake = mk(fasthttp.StatusBadRequest, "upgrade",
		"a WebSocket handshake is an HTTP/1.1 GET with Connection: Upgrade and no body")

	r.noWorker = unavailable(wire.ReasonNoWorker, "no worker serves the namespace")
	r.store = unavailable(wire.ReasonStore, "placement directory unavailable")
	r.unreachable = unavailable(wire.ReasonUnreachable, "worker unreachable")
	r.overloaded = unavailable(wire.ReasonOverloaded, "worker overloaded")
	r.tunnelsFull = unavailable(wire.ReasonOverloaded, "too many open WebSocket tunnels")
	r.badGateway = mk(fasthttp.StatusBadGateway, "", "bad gateway")
	r.timeout = mk(fasthttp.StatusGatewayTimeout, "", "worker did not answer in time")
}

// route returns the reply for a refused target.
func (r *replies) route(e routeError, seg wire.SegmentError) *reply {
	switch e {
	case routeNotObject:
		return &r.notObject
	case routeNamespace:
		if int(seg) < len(r.namespace) {
			return &r.namespace[seg]
		}
	case routeID:
		if int(seg) < len(r.id) {
			return &r.id[seg]
		}
	case routeFragment:
		return &r.fragment
	case routeDotSegment:
		return &r.dotSegment
	case routeEscape:
		return &r.escape
	case routeBackslash:
		return &r.backslash
	}
	return &r.notOrigin
}

// reply sends rp, replacing whatever response was being built.
func (p *Proxy) reply(ctx *fasthttp.RequestCtx, rp *reply) {
	resp := &ctx.Response
	resp.Reset()
	resp.Header.SetNoDefaultContentType(true)
	resp.SetStatusCode(rp.status)
	resp.Header.SetContentType("application/json")
	if rp.reason != "" {
		resp.Header.Set(wire.HeaderReason, rp.reason)
	}
	if rp.retryAfter {
		resp.Header.Set(wire.HeaderRetryAfter, p.replies.retryAfter)
	}
	if rp.close {
		ctx.SetConnectionClose()
	}
	resp.SetBodyRaw(rp.body)
	p.countResponse(rp.status)
}

// reject sends a reply to a request the proxy refused to forward.
func (p *Proxy) reject(ctx *fasthttp.RequestCtx, rp *reply) {
	p.m.rejected.Inc()
	p.reply(ctx, rp)
}
