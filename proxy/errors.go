package proxy

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// reply is an answer the proxy makes itself. Replies are built once by New;
// sending one copies nothing and allocates nothing.
type reply struct {
	status     int
	reason     string // X-Pinned-Reason; "" for none
	retryAfter bool   // send Retry-After
	retryIn    string // its value when not the configured one ("": replies.retryAfter)
	close      bool   // close the client connection after it
	body       []byte // JSON wire.Error, never modified
	// raw is the whole response as a Front's loops write it (the bytes the
	// fasthttp server writes for reply), never modified.
	raw []byte
}

// replies is the table of every reply the proxy makes.
type replies struct {
	retryAfter string // Config.RetryAfter in whole seconds, at least 1
	retrySecs  int    // the same as a number

	// Request target (400 and close unless noted).
	notObject, notOrigin, fragment, dotSegment, escape, backslash reply // notObject: 404
	namespace, id                                                 [wire.SegmentNamespace + 1]reply
	hostMismatch                                                  reply

	// Framing and fields: 400 and close.
	framing, transferEncoding, contentLength, fieldName, obsFold, bareLF, tooManyFields reply
	tooManyHeaderFields                                                                 reply // 431, close

	// Refused by fasthttp's parser (ServerError); fasthttp closes.
	malformed, headTooLarge, headTimeout reply // 400, 431, 408

	// Version.
	version reply // 505, close: a major version other than 1

	// Body.
	tooLarge    reply // 413, close
	badBody     reply // 400, close: the client's body broke off or was malformed
	bodyTimeout reply // 408, close: the client's body did not come in time

	// Upgrades.
	upgradeToken, upgradeHandshake reply // 400, close

	// Worker side.
	unknownNamespace                                      reply // 404 unknown_namespace, no Retry-After: stop asking
	noWorker, store, unreachable, overloaded, tunnelsFull reply // 503 + Retry-After
	// unreachableIn[n] is unreachable with Retry-After n seconds: the time
	// left of the holder's lease (unreachableReply), n ≥ 1.
	unreachableIn [maxRetryIn + 1]reply
	connsFull     reply // 503 + Retry-After, close: MaxConns client connections
	badGateway    reply // 502
	timeout       reply // 504
}

func (r *replies) build(cfg *Config) {
	r.retrySecs = max(int((cfg.RetryAfter+time.Second-1)/time.Second), 1)
	r.retryAfter = strconv.Itoa(r.retrySecs)

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

	// Every 400 closes the connection: a client that sent one malformed
	// request is not trusted to frame the next, and a refused request's
	// unread body never has to be skipped. A 404 keeps it.
	r.notObject = mk(fasthttp.StatusNotFound, "path", "not an object path: want /<namespace>/<id>[/...]")
	r.notOrigin = closing(mk(fasthttp.StatusBadRequest, "path", "request target must be a path"))
	r.fragment = closing(mk(fasthttp.StatusBadRequest, "path", "request target must not contain '#'"))
	r.dotSegment = closing(mk(fasthttp.StatusBadRequest, "path", "path must not contain '.' or '..' segments"))
	r.escape = closing(mk(fasthttp.StatusBadRequest, "path", "path must not contain escaped '/', '\\', '.', NUL or '%'"))
	r.backslash = closing(mk(fasthttp.StatusBadRequest, "path", "path must not contain '\\'"))
	for e := wire.SegmentEmpty; e <= wire.SegmentNamespace; e++ {
		r.namespace[e] = closing(mk(fasthttp.StatusBadRequest, "namespace", "namespace: "+e.Error()))
		r.id[e] = closing(mk(fasthttp.StatusBadRequest, "id", "id: "+e.Error()))
	}
	r.hostMismatch = closing(mk(fasthttp.StatusBadRequest, "host", "absolute-form target and Host disagree"))

	r.framing = closing(mk(fasthttp.StatusBadRequest, "transfer-encoding", "both Content-Length and Transfer-Encoding"))
	r.transferEncoding = closing(mk(fasthttp.StatusBadRequest, "transfer-encoding", "transfer coding other than chunked"))
	r.contentLength = closing(mk(fasthttp.StatusBadRequest, "content-length", "Content-Length must be decimal digits without a leading zero"))
	r.fieldName = closing(mk(fasthttp.StatusBadRequest, "header", "invalid field name"))
	r.obsFold = closing(mk(fasthttp.StatusBadRequest, "header", "obsolete line folding"))
	r.bareLF = closing(mk(fasthttp.StatusBadRequest, "header", "line ends in LF without CR"))
	r.tooManyFields = closing(mk(fasthttp.StatusBadRequest, "header", "too many hop-by-hop fields"))
	r.tooManyHeaderFields = closing(mk(fasthttp.StatusRequestHeaderFieldsTooLarge, "header",
		"more than "+strconv.Itoa(cfg.MaxHeaderFields)+" header fields"))

	r.malformed = closing(mk(fasthttp.StatusBadRequest, "", "malformed request"))
	r.headTooLarge = closing(mk(fasthttp.StatusRequestHeaderFieldsTooLarge, "header",
		"request head larger than "+strconv.Itoa(cfg.MaxHeaderBytes)+" bytes"))
	r.headTimeout = closing(mk(fasthttp.StatusRequestTimeout, "", "request head not received in time"))

	r.version = closing(mk(fasthttp.StatusHTTPVersionNotSupported, "version", "HTTP version not supported: only HTTP/1.x"))
	r.tooLarge = closing(mk(fasthttp.StatusRequestEntityTooLarge, "body",
		"request body larger than "+strconv.FormatInt(cfg.MaxRequestBodySize, 10)+" bytes"))
	r.badBody = closing(mk(fasthttp.StatusBadRequest, "body", "request body incomplete or malformed"))
	r.bodyTimeout = closing(mk(fasthttp.StatusRequestTimeout, "body", "request body not received in time"))

	r.upgradeToken = closing(mk(fasthttp.StatusBadRequest, "upgrade", "only Upgrade: websocket is supported"))
	r.upgradeHandshake = closing(mk(fasthttp.StatusBadRequest, "upgrade",
		"a WebSocket handshake is an HTTP/1.1 GET with Connection: Upgrade and no body"))

	r.unknownNamespace = mk(fasthttp.StatusNotFound, "namespace", "unknown namespace: no worker has served it recently")
	r.unknownNamespace.reason = wire.ReasonUnknownNamespace
	r.noWorker = unavailable(wire.ReasonNoWorker, "no worker serves the namespace")
	r.store = unavailable(wire.ReasonStore, "placement directory unavailable")
	r.unreachable = unavailable(wire.ReasonUnreachable, "worker unreachable")
	r.overloaded = unavailable(wire.ReasonOverloaded, "worker overloaded")
	r.tunnelsFull = unavailable(wire.ReasonOverloaded, "too many open WebSocket tunnels")
	r.connsFull = closing(unavailable(wire.ReasonOverloaded, "too many client connections"))
	// A 502 may come after the worker processed the request: the client
	// decides whether to try again, after Retry-After.
	r.badGateway = mk(fasthttp.StatusBadGateway, "", "bad gateway")
	r.badGateway.retryAfter = true
	r.timeout = mk(fasthttp.StatusGatewayTimeout, "", "worker did not answer in time")

	for _, rp := range []*reply{&r.notObject, &r.notOrigin, &r.fragment, &r.dotSegment, &r.escape, &r.backslash,
		&r.hostMismatch, &r.framing, &r.transferEncoding, &r.contentLength, &r.fieldName, &r.obsFold, &r.bareLF,
		&r.tooManyFields, &r.tooManyHeaderFields, &r.malformed, &r.headTooLarge, &r.headTimeout, &r.version, &r.tooLarge,
		&r.badBody, &r.bodyTimeout, &r.upgradeToken, &r.upgradeHandshake, &r.unknownNamespace, &r.noWorker, &r.store, &r.unreachable, &r.overloaded,
		&r.tunnelsFull, &r.connsFull, &r.badGateway, &r.timeout} {
		rp.raw = r.render(rp)
	}
	for n := 1; n <= maxRetryIn; n++ {
		rp := r.unreachable
		rp.retryIn = strconv.Itoa(n)
		rp.raw = r.render(&rp)
		r.unreachableIn[n] = rp
	}
	for i := range r.namespace {
		r.namespace[i].raw = r.render(&r.namespace[i])
		r.id[i].raw = r.render(&r.id[i])
	}
}

// render returns the bytes of rp as fasthttp's server writes them for
// Proxy.reply.
func (r *replies) render(rp *reply) []byte {
	var resp fasthttp.Response
	resp.Header.SetNoDefaultContentType(true)
	resp.SetStatusCode(rp.status)
	resp.Header.SetContentType("application/json")
	if rp.reason != "" {
		resp.Header.Set(wire.HeaderReason, rp.reason)
	}
	if rp.retryAfter {
		resp.Header.Set(wire.HeaderRetryAfter, cmp.Or(rp.retryIn, r.retryAfter))
	}
	if rp.close {
		resp.SetConnectionClose()
	}
	resp.SetBodyRaw(rp.body)
	var b bytes.Buffer
	bw := bufio.NewWriter(&b)
	_ = resp.Write(bw)
	_ = bw.Flush()
	// The server the replies are written by sends no Date (NoDefaultDate);
	// a Response outside a server adds one, frozen here: drop it.
	out := b.Bytes()
	if i := bytes.Index(out, []byte("\r\nDate: ")); i >= 0 {
		j := bytes.Index(out[i+2:], []byte("\r\n"))
		out = append(out[:i+2], out[i+2+j+2:]...)
	}
	return out
}

// bodyOverWorker returns the 413 for a body longer than the worker of s
// accepts (s.MaxBodyBytes > 0), built once per session. It closes the
// connection: the refused body is never read to its end.
func (p *Proxy) bodyOverWorker(s *Session) *reply {
	if rp := s.tooLarge.Load(); rp != nil {
		return rp
	}
	b, _ := json.Marshal(wire.Error{Error: "request body larger than the worker accepts (" +
		strconv.FormatInt(s.MaxBodyBytes, 10) + " bytes)", Field: "body"})
	rp := &reply{status: fasthttp.StatusRequestEntityTooLarge, body: b, close: true}
	rp.raw = p.replies.render(rp)
	s.tooLarge.CompareAndSwap(nil, rp)
	return s.tooLarge.Load()
}

// overWorker reports whether a body of n bytes is longer than the worker
// of s accepts.
func overWorker(s *Session, n int64) bool {
	return s.MaxBodyBytes > 0 && n > s.MaxBodyBytes
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
		resp.Header.Set(wire.HeaderRetryAfter, cmp.Or(rp.retryIn, p.replies.retryAfter))
	}
	if rp.close {
		ctx.SetConnectionClose()
	}
	resp.SetBodyRaw(rp.body)
	p.countResponse(rp.status)
}

// maxRetryIn bounds the Retry-After of unreachableReply, in seconds.
const maxRetryIn = 120

// unreachableReply is the 503 unreachable for a request that could not
// reach the worker of session s (which the resolver still names as the
// holder): Retry-After is the time until the id is expected to be served
// again: the expected recovery (Session.SetRecovery, while the resolver
// checks whether the process is gone) or else the time left of s's lease as
// the resolver last read it (Session.LeaseEnd), the earliest the id can
// move; rounded up and at most maxRetryIn seconds; the configured
// RetryAfter when neither is known, or when it is shorter.
func (p *Proxy) unreachableReply(s *Session) *reply {
	if s != nil {
		end := s.leaseEnd.Load()
		if r := s.recovery.Load(); r != 0 && (end == 0 || r < end) {
			end = r
		}
		if end != 0 {
			left := time.Duration(end - time.Now().UnixNano())
			n := int((left + time.Second - 1) / time.Second)
			if n > p.replies.retrySecs {
				return &p.replies.unreachableIn[min(n, maxRetryIn)]
			}
		}
	}
	return &p.replies.unreachable
}

// reject sends a reply to a request the proxy refused to forward.
func (p *Proxy) reject(ctx *fasthttp.RequestCtx, rp *reply) {
	p.m.rejected.Inc()
	p.reply(ctx, rp)
}
