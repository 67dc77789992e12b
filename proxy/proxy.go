package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/logthrottle"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// Proxy is the pinboard's data plane: a fasthttp.RequestHandler that routes
// "/<namespace>/<id><rest>" to the worker holding (namespace, id). Make it
// with New; serve Handler on a server (NewServer returns one configured for
// it); Close it after the server has shut down.
type Proxy struct {
	cfg      Config
	resolver Resolver
	watcher  TunnelWatcher // the resolver, if it implements it
	log      *slog.Logger
	errLog   logthrottle.Every
	m        proxyMetrics
	replies  replies

	exchanges sync.Pool

	tunnelsOpen atomic.Int64
	stripes     atomic.Uint32 // hands out upstream histogram stripes to new exchanges
	tunnelsMu   sync.Mutex
	tunnels     map[string]map[tunnelEnd]struct{} // registered tunnels by placement name
	tunnelWG    sync.WaitGroup
	closed      atomic.Bool

	// eps is the table of the endpoints the proxy made, with the session
	// each is attached to: for Close, the janitor and metrics. epMu also
	// serialises making an endpoint (endpointFor) with retiring one (the
	// janitor), so a Session never holds a retired endpoint once epMu is
	// released.
	epMu sync.Mutex
	eps  map[*endpoint]*Session

	// front is the Front serving the proxy with event loops (nil without
	// one) and loops its number of loops: every endpoint gets a
	// connection pool per loop. Both are set by NewFront, before any
	// request.
	front *Front
	loops int

	// silent holds the connections the server accepted that have sent
	// no byte yet (ConnState), for ServerError: nothing else of a
	// connection's or a request's is kept outside the request.
	silent sync.Map // net.Conn → struct{}

	// lingering holds the fasthttp path's connections lingering after a
	// refusal (linger.go), for Close.
	lingerMu  sync.Mutex
	lingering map[net.Conn]struct{}
}

// New makes a Proxy. It validates cfg and does no I/O.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	p := &Proxy{
		cfg:      cfg,
		resolver: cfg.Resolver,
		log:      cfg.Logger.With("logger", "pinned.proxy"),
		errLog:   logthrottle.Every{Interval: time.Second},
		tunnels:  make(map[string]map[tunnelEnd]struct{}),
		eps:      make(map[*endpoint]*Session),

		lingering: make(map[net.Conn]struct{}),
	}
	p.watcher, _ = cfg.Resolver.(TunnelWatcher)
	p.replies.build(&p.cfg)
	p.m.register(p)
	p.exchanges.New = func() any {
		x := &exchange{p: p}
		x.awaitFn = x.await // once per exchange: passing it per request does not allocate
		x.stripe = uint8(p.stripes.Add(1) % histStripes)
		x.br = bufio.NewReaderSize(nil, p.cfg.MaxResponseHeaderBytes)
		x.bw = bufio.NewWriterSize(nil, 4096)
		return x
	}
	return p, nil
}

// Metrics returns the metric set the proxy reports on (Config.Metrics, or
// the set New made).
func (p *Proxy) Metrics() *metrics.Set { return p.cfg.Metrics }

// Handler serves one request. It is a fasthttp.RequestHandler; the server
// must be configured as NewServer does (above all StreamRequestBody and
// DisablePreParseMultipartForm).
func (p *Proxy) Handler(ctx *fasthttp.RequestCtx) {
	x := p.exchanges.Get().(*exchange)
	x.ctx = ctx
	handed := p.serve(x)
	if p.cfg.Recorder != nil && x.name != nil {
		// The answer's head is decided; a streamed body has not been
		// written yet, and the server touches x only after this returns.
		p.record(x)
	}
	if ctx.Request.Header.ContentLength() == -1 {
		// A chunked body, forwarded or not: where it ends is decided by
		// fasthttp's decoder, which the raw scan cannot check, and which
		// takes a bare LF as the end of the trailer section where a
		// stricter front end reads on. No request after a chunked one is
		// read from the connection, so no such disagreement can smuggle
		// one. (x may belong to the server now; only ctx is touched.)
		ctx.SetConnectionClose()
	}
	if !handed {
		if ctx.Response.ConnectionClose() && x.bodyUnread() && p.cfg.LingerTimeout > 0 {
			p.lingerClose(ctx)
		}
		p.putExchange(x)
	}
}

// putExchange gives x back to the pool, reset: every field of the request
// it served is cleared here, on release, but p, awaitFn and stripe (x's for
// good), br and bw (reset to no connection) and the buffers, which keep
// their capacity and lose their contents (length 0); the scans (reqScan,
// respScan) are reset where they are filled, before they are read.
// TestPooledExchangesComeBackClean holds every field to it.
func (p *Proxy) putExchange(x *exchange) {
	x.endStream() // nothing to do unless a body stream was left open
	x.ctx, x.ep, x.cc, x.conn, x.hijacked = nil, nil, nil, nil, nil
	x.route = Route{}
	x.cw = countingConn{}
	x.name, x.target = nil, nil
	x.tgt, x.uri, x.body = x.tgt[:0], x.uri[:0], x.body[:0]
	x.stable, x.http10, x.bodyKind, x.resentOnce, x.internal, x.bodyRead = false, false, bodyNone, false, false, false
	x.closeAfter, x.awaitWrote, x.awaitErr, x.eof, x.armed = false, false, nil, false, time.Time{}
	x.aux.Reset()
	x.br.Reset(nil)
	x.bw.Reset(nil)
	p.exchanges.Put(x)
}

// screen refuses a request whose head breaks a rule of the smuggling policy
// that does not depend on its target (framing, field syntax, field count),
// as scanned into s. It reports whether the request may proceed.
func (p *Proxy) screen(ctx *fasthttp.RequestCtx, s *headScan) bool {
	if rp := p.screenReply(s); rp != nil {
		p.reject(ctx, rp)
		return false
	}
	return true
}

// screenReply returns the refusal for a head that breaks a rule of the
// smuggling policy that does not depend on its target, or nil.
func (p *Proxy) screenReply(s *headScan) *reply {
	var rp *reply
	switch {
	case s.badVersion:
		// RFC 9112 §2.3: a major version other than 1 is not HTTP/1.x;
		// 1.x minor versions are served as 1.1.
		rp = &p.replies.version
	case s.fields > p.cfg.MaxHeaderFields:
		rp = &p.replies.tooManyHeaderFields
	case s.contentLengths > 0 && s.transferEncodings > 0:
		// RFC 9112 §6.1: a server may reject such a message, and must
		// close after it; an intermediary must not pass it on as is.
		rp = &p.replies.framing
	case s.teNotChunked:
		rp = &p.replies.transferEncoding
	case s.badLength:
		rp = &p.replies.contentLength
	case s.badName:
		rp = &p.replies.fieldName
	case s.obsFold:
		// RFC 9112 §5.2 allows folding it into one value instead; refusing
		// leaves no field that a front end before us may have read as two.
		rp = &p.replies.obsFold
	case s.bareLF:
		// RFC 9112 §2.2 allows reading it as a line end (fasthttp does);
		// refusing leaves no field boundary that others may not see.
		rp = &p.replies.bareLF
	case s.tooMany:
		rp = &p.replies.tooManyFields
	}
	return rp
}

// Guard wraps a handler that serves other paths on the proxy's server (the
// pinboard's registry and /healthz) in the rules of the smuggling policy
// that do not depend on the target: a request whose framing, field syntax
// or field count the proxy would refuse gets the proxy's answer (400 or
// 431, connection closed) and h does not run; after a request with a
// chunked body the connection closes. Without it, a request a front end
// frames differently from fasthttp would let the front end pass another
// request behind it, which the proxy then serves.
func (p *Proxy) Guard(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if rp, _ := p.screenHead(&ctx.Request.Header); rp != nil {
			p.reject(ctx, rp)
		} else {
			h(ctx)
		}
		if ctx.Request.Header.ContentLength() == -1 {
			ctx.SetConnectionClose()
		}
	}
}

// screenHead scans a head as it arrived and returns the refusal of the
// smuggling policy's rules that do not depend on the target (screenReply),
// or nil, and whether the head carries an Expect field of its own.
func (p *Proxy) screenHead(h *fasthttp.RequestHeader) (rp *reply, expect bool) {
	x := p.exchanges.Get().(*exchange)
	s := &x.reqScan
	s.reset()
	scanFields(h.RawHeaders(), s, 0)
	s.badVersion = !http1(h.Protocol())
	rp, expect = p.screenReply(s), s.expect
	p.exchanges.Put(x) // only its scan was used, which is reset before use
	return rp, expect
}

// serve checks and prepares the request and forwards it. It reports whether
// x was handed to the server to stream the response body.
func (p *Proxy) serve(x *exchange) bool {
	ctx := x.ctx
	h := &ctx.Request.Header

	// One pass over the head as it arrived: framing the parse folded away,
	// and the fields to remove.
	trusted := p.trusted(ctx)
	s := &x.reqScan
	s.reset()
	mode := dropPinned
	if !trusted {
		mode |= dropForwarded
	}
	scanFields(h.RawHeaders(), s, mode)
	s.badVersion = !http1(h.Protocol())
	if !p.screen(ctx, s) {
		return false
	}

	// The target, as it arrived.
	target := h.RequestURI()
	if authority, origin, ok := originForm(target); ok {
		// RFC 9112 §3.2.2: the target's authority is the host. fasthttp
		// already replaced Host with it; a different Host field is an
		// attempt to be routed one way and seen another.
		if s.hosts > 0 && !bytes.EqualFold(authority, s.host) {
			p.reject(ctx, &p.replies.hostMismatch)
			return false
		}
		x.tgt = append(x.tgt[:0], origin...)
		target = x.tgt
		x.stable = true
	}
	rt, rerr := parseRoute(target, p.cfg.MaxIDLen)
	if rerr != routeOK {
		p.reject(ctx, p.replies.route(rerr, rt.seg))
		return false
	}
	x.name, x.target = rt.name, target

	if s.upgrades > 0 {
		p.serveUpgrade(x)
		return false
	}

	// The body: refuse what is known to be too large before any byte of it
	// goes anywhere.
	cl := h.ContentLength()
	if max := p.cfg.MaxRequestBodySize; max >= 0 && int64(cl) > max {
		p.reject(ctx, &p.replies.tooLarge)
		return false
	}
	switch {
	case cl == -1:
		x.bodyKind = bodyChunked
	case cl <= 0 || ctx.Request.BodyStream() == nil:
		x.bodyKind = bodyNone
	case cl <= p.cfg.ReplayBodyMax:
		x.bodyKind = bodyReplay
		if err := x.readReplayBody(cl); err != nil {
			if isTimeout(err) {
				p.reject(ctx, &p.replies.bodyTimeout)
			} else {
				p.reply(ctx, &p.replies.badBody)
			}
			return false
		}
	default:
		x.bodyKind = bodyLength
	}

	p.sanitizeRequest(x, trusted)
	return x.forward()
}

// readReplayBody reads a body of known, small length whole. It fails when
// the body ends early or breaks (HeaderTimeout, the deadline of the head
// it came with, still bounds the read: a timeout error).
func (x *exchange) readReplayBody(n int) error {
	if cap(x.body) < n {
		x.body = make([]byte, n, x.p.cfg.ReplayBodyMax)
	}
	x.body = x.body[:n]
	rs := x.ctx.Request.BodyStream()
	for got := 0; got < n; {
		m, err := rs.Read(x.body[got:])
		got += m
		if err != nil && (got < n || err != io.EOF) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	x.bodyRead = true
	return nil
}

// sanitizeRequest removes hop-by-hop, pinned and forwarding fields, stops the
// client's Connection: close from closing the worker connection, and adds the
// forwarding fields (sanitizeHeader).
func (p *Proxy) sanitizeRequest(x *exchange, trusted bool) {
	ctx := x.ctx
	h := &ctx.Request.Header
	x.http10 = !h.IsHTTP11()
	peer, _ := netip.AddrFromSlice(ctx.RemoteIP())
	p.sanitizeHeader(h, &x.reqScan, peer, ctx.IsTLS(), trusted, x.scratch[:0])
}

// sanitizeHeader is the field hygiene of RFC 9110 §7.6.1 on a request head
// scanned into s: it removes the hop-by-hop fields (Connection and what it
// names, Keep-Alive, TE, ...), the client's X-Pinned-* and, unless the peer
// is trusted, Forwarded and X-Forwarded-*; it keeps the worker connection
// open whatever the client's Connection says (an HTTP/1.0 request goes on
// as HTTP/1.1), and adds X-Forwarded-For (peer appended), -Proto and -Host.
// The proxy's own fields are added after the removals, so no Connection
// option of the client's can strip them. scratch is a buffer for
// X-Forwarded-For.
func (p *Proxy) sanitizeHeader(h *fasthttp.RequestHeader, s *headScan, peer netip.Addr, tls, trusted bool, scratch []byte) {
	for _, f := range s.deletes() {
		h.DelBytes(f.name)
	}
	h.ResetConnectionClose()
	h.SetNoDefaultContentType(true)
	if !h.IsHTTP11() {
		// Keep-alive toward the worker regardless of the client.
		h.SetProtocol("HTTP/1.1")
	}

	xff := scratch
	if trusted {
		for _, v := range h.PeekAll(fasthttp.HeaderXForwardedFor) {
			xff = append(xff, v...)
			xff = append(xff, ',', ' ')
		}
		h.Del(fasthttp.HeaderXForwardedFor)
	}
	if peer.IsValid() {
		xff = peer.Unmap().AppendTo(xff)
	}
	h.AddBytesV(fasthttp.HeaderXForwardedFor, xff)
	if !trusted || len(h.Peek(fasthttp.HeaderXForwardedProto)) == 0 {
		if tls {
			h.Add(fasthttp.HeaderXForwardedProto, "https")
		} else {
			h.Add(fasthttp.HeaderXForwardedProto, "http")
		}
	}
	if host := h.Host(); len(host) > 0 && (!trusted || len(h.Peek(fasthttp.HeaderXForwardedHost)) == 0) {
		h.AddBytesV(fasthttp.HeaderXForwardedHost, host)
	}
}

// trusted reports whether the peer is a configured trusted proxy.
func (p *Proxy) trusted(ctx *fasthttp.RequestCtx) bool {
	if len(p.cfg.TrustedProxies) == 0 {
		return false
	}
	ip, ok := netip.AddrFromSlice(ctx.RemoteIP())
	if !ok {
		return false
	}
	return p.trustedAddr(ip)
}

// trustedAddr reports whether ip is in a configured trusted proxy's range.
func (p *Proxy) trustedAddr(ip netip.Addr) bool {
	if len(p.cfg.TrustedProxies) == 0 {
		return false
	}
	ip = ip.Unmap()
	for _, pfx := range p.cfg.TrustedProxies {
		if pfx.Contains(ip) {
			return true
		}
	}
	return false
}

// record tells the Recorder about a routed request of the fasthttp path.
func (p *Proxy) record(x *exchange) {
	ctx := x.ctx
	resp := &ctx.Response
	holder := ""
	if x.ep != nil {
		holder = x.ep.id
	}
	bytes := max(int64(ctx.Request.Header.ContentLength()), 0) + max(int64(resp.Header.ContentLength()), 0)
	p.cfg.Recorder.Record(x.name, holder, resp.StatusCode(), knownReason(resp.Header.Peek(wire.HeaderReason)), bytes,
		time.Since(ctx.Time()), ctx.Time())
}

// http1 reports whether a request's protocol is HTTP/1.x: "HTTP/1." and one
// digit (fasthttp takes the version as it stands).
func http1(v []byte) bool {
	return len(v) == 8 && string(v[:7]) == "HTTP/1." && v[7] >= '0' && v[7] <= '9'
}

// countResponse counts a response the client gets by its status class.
func (p *Proxy) countResponse(code int) {
	c := code / 100
	if c < 1 || c > 5 {
		c = 0
	}
	p.m.responses[c].Inc()
}

// ExpectHandler answers "Expect: 100-continue": a request the proxy would
// refuse before reading its body gets that refusal instead of an invitation
// to send the body (no 100 Continue comes first): a head the smuggling
// policy refuses whatever its target, a body over MaxRequestBodySize, and,
// for an object path, no holder to be found (503 no_worker or store) or a
// body over the holder's limit (Session.MaxBodyBytes, 413): the name is
// routed here (Lookup, else Resolve), as the handler would route it. The
// connection closes after a refusal, lingering (LingerTimeout) in case the
// client sends its body anyway. Set it as the server's ExpectHandler
// (NewServer does). It routes object paths, so a server that serves other
// paths too calls it only for the proxy's requests (the pinboard answers
// its registry's Expect itself).
func (p *Proxy) ExpectHandler(ctx *fasthttp.RequestCtx) int {
	h := &ctx.Request.Header
	rp, own := p.screenHead(h)
	if rp == nil {
		rp = p.refusalBeforeBody(ctx, h, true)
	}
	if rp == nil {
		if !own {
			// Marked by HeaderReceived, and the refusal it saw is gone
			// (the name moved since, microseconds ago): the body is
			// wanted after all. The client gets a 100 Continue it did not
			// ask for (RFC 9110 §15.2: an HTTP/1.1 client parses any 1xx),
			// and the worker no Expect.
			h.Del(fasthttp.HeaderExpect)
		}
		return fasthttp.StatusContinue
	}
	if rp.status < 500 {
		p.m.rejected.Inc()
	}
	p.reply(ctx, rp)
	ctx.SetConnectionClose() // fasthttp closes after a refused Expect
	if p.cfg.LingerTimeout > 0 {
		p.lingerClose(ctx)
	}
	return rp.status
}

// refusalBeforeBody returns the refusal of a request whose head h announces
// a body, when the head alone decides it: a Content-Length over
// MaxRequestBodySize or, for an object path whose holder is known, over the
// holder's limit (Session.MaxBodyBytes). The holder is the resolver's
// cached route; with resolve, a name the cache misses is resolved (in ctx),
// and a name that cannot be is refused with 503 (no_worker or store). nil:
// the body is wanted, or the head alone does not tell.
func (p *Proxy) refusalBeforeBody(ctx context.Context, h *fasthttp.RequestHeader, resolve bool) *reply {
	cl := int64(h.ContentLength())
	if max := p.cfg.MaxRequestBodySize; max >= 0 && cl > max {
		return &p.replies.tooLarge
	}
	if cl <= 0 {
		return nil
	}
	target := h.RequestURI()
	if _, origin, ok := originForm(target); ok {
		target = origin
	}
	rt, rerr := parseRoute(target, p.cfg.MaxIDLen)
	if rerr != routeOK {
		return nil // refused for its target by the handler, or not the proxy's
	}
	r, ok := p.cachedRoute(rt.name, time.Now())
	if !ok {
		if !resolve {
			return nil
		}
		var err error
		if r, err = p.resolver.Resolve(ctx, rt.name); err == nil && r.Session == nil {
			err = ErrNoWorker
		}
		if err != nil {
			return p.resolveReply(rt.name, err)
		}
	}
	if overWorker(r.Session, cl) {
		return p.bodyOverWorker(r.Session)
	}
	return nil
}

// resolveReply is the answer to a request whose name could not be resolved
// (err), the same on both engines: 404 unknown_namespace for
// ErrUnknownNamespace, 503 no_worker for ErrNoWorker, 503 store for
// anything else (logged: throttled, or at DEBUG for ErrNotReady while the
// resolver is starting).
func (p *Proxy) resolveReply(name []byte, err error) *reply {
	switch {
	case errors.Is(err, ErrUnknownNamespace):
		return &p.replies.unknownNamespace
	case errors.Is(err, ErrNoWorker):
		return &p.replies.noWorker
	case errors.Is(err, ErrNotReady):
		p.log.Debug("cannot resolve placement yet: the resolver is starting", "name", string(name), "err", err)
	case p.errLog.Allow():
		p.log.Warn("cannot resolve placement", "name", string(name), "err", err)
	}
	return &p.replies.store
}

// ServerError answers a request that fasthttp refused before any handler
// ran; set it as the server's ErrorHandler (NewServer does). A head larger
// than MaxHeaderBytes gets 431; a head that did not arrive within
// HeaderTimeout 408 naming the head, a body whose first bytes did not
// (fasthttp reads up to 8 KiB of a body before the handler runs) 408
// naming the body; anything else 400. Each carries a JSON wire.Error like
// the proxy's own refusals, and fasthttp closes the connection after it.
// What it answers is decided from err and the connection (ConnState):
// nothing of an earlier request on the same (pooled) RequestCtx reaches it.
func (p *Proxy) ServerError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small):
		p.reject(ctx, &p.replies.headTooLarge)
	case isTimeout(err) && p.bodyAwaited(ctx, err):
		p.reject(ctx, &p.replies.bodyTimeout)
	case isTimeout(err):
		p.reject(ctx, &p.replies.headTimeout)
	default:
		p.reject(ctx, &p.replies.malformed)
	}
}

// bodyAwaited reports whether the read that failed with err was of a
// request's body rather than of its head. fasthttp wraps the errors of
// reading a head ("error when reading request headers: ..."); those of a
// body come bare from the connection, and so does the one that ends the
// wait for the first byte of a connection that never sent any, which
// ConnState tells apart.
func (p *Proxy) bodyAwaited(ctx *fasthttp.RequestCtx, err error) bool {
	if _, bare := err.(net.Error); !bare {
		return false
	}
	_, silent := p.silent.Load(ctx.Conn())
	return !silent
}

// ConnState keeps track of the connections that have not sent a byte yet,
// for ServerError; set it as the server's ConnState (NewServer does).
func (p *Proxy) ConnState(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		p.silent.Store(c, struct{}{})
	case fasthttp.StateActive, fasthttp.StateHijacked, fasthttp.StateClosed:
		p.silent.Delete(c)
	}
}

// HeaderReceived refuses, without waiting for the body, a request whose
// head alone says it will be refused: a Content-Length over
// MaxRequestBodySize, or over the holder's limit when the resolver's cache
// knows the holder (nothing is resolved here); set it as the server's
// HeaderReceived (NewServer does). With StreamRequestBody, fasthttp reads
// the first bytes of a body (up to 8 KiB) before any handler runs, so a
// client that announces a body and sends none would wait for HeaderTimeout;
// only a head with "Expect: 100-continue" is decided before that, by
// ExpectHandler. So such an HTTP/1.1 head is given that expectation, and
// ExpectHandler, finding the same refusal, answers it (no 100 Continue is
// sent, the connection closes). An HTTP/1.0 head cannot take part in
// 100-continue: its refusal comes once the first bytes of its body arrived
// (or 408 when none does). The mark lives in the request's own head, which
// fasthttp resets for the next request.
func (p *Proxy) HeaderReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if h.ContentLength() > 0 && h.IsHTTP11() && p.refusalBeforeBody(context.Background(), h, false) != nil {
		h.Set(fasthttp.HeaderExpect, "100-continue")
	}
	return fasthttp.RequestConfig{}
}

// NewServer returns a fasthttp.Server that serves the proxy, configured as
// the proxy needs it:
//
//   - StreamRequestBody: bodies stream to the worker as they arrive;
//   - DisablePreParseMultipartForm: a multipart body is not parsed (into
//     memory or temporary files) before the handler runs;
//   - NoDefaultServerHeader, NoDefaultDate, NoDefaultContentType: the
//     worker's fields pass through and none are invented;
//   - ReadBufferSize = MaxHeaderBytes (431 beyond; it is also the read buffer
//     every client connection holds), ReadTimeout =
//     HeaderTimeout (slowloris), IdleTimeout, WriteTimeout for buffered
//     responses (streams move their own deadline), Concurrency = MaxConns;
//   - ExpectHandler = p.ExpectHandler, ErrorHandler = p.ServerError,
//     HeaderReceived = p.HeaderReceived (413 at once for an announced
//     oversize body), ConnState = p.ConnState (a connection that never
//     sent a byte is told from a body that never came).
//
// Header names are normalised (fasthttp's default), so that fields the proxy
// manages are found whatever their case.
func (p *Proxy) NewServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      p.Handler,
		ExpectHandler:                p.ExpectHandler,
		ErrorHandler:                 p.ServerError,
		HeaderReceived:               p.HeaderReceived,
		ConnState:                    p.ConnState,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultDate:                true,
		NoDefaultContentType:         true,
		ReadBufferSize:               p.cfg.MaxHeaderBytes,
		ReadTimeout:                  p.cfg.HeaderTimeout,
		IdleTimeout:                  p.cfg.IdleTimeout,
		WriteTimeout:                 p.cfg.WriteTimeout,
		Concurrency:                  p.cfg.MaxConns,
		MaxRequestBodySize:           8 << 10, // under streaming: the prefetch size
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true,
		Logger:                       slogLogger{p.log},
	}
}

// Close closes every open tunnel and waits for them to end, then closes the
// idle connections of every worker endpoint. The server must have stopped
// first (fasthttp's Shutdown does not wait for hijacked connections). Close
// is idempotent.
func (p *Proxy) Close() error {
	p.closed.Store(true)
	p.tunnelsMu.Lock()
	var ts []tunnelEnd
	for _, byName := range p.tunnels {
		for t := range byName {
			ts = append(ts, t)
		}
	}
	p.tunnelsMu.Unlock()
	for _, t := range ts {
		t.close()
	}
	p.tunnelWG.Wait()
	p.endLingering()
	p.epMu.Lock()
	eps := make([]*endpoint, 0, len(p.eps))
	for e := range p.eps {
		eps = append(eps, e)
	}
	p.epMu.Unlock()
	for _, e := range eps {
		e.client.CloseIdleConnections()
	}
	return nil
}

// CloseTunnels closes the open WebSocket tunnels of the placement name
// ("/<ns>/<id>") whose worker session is not keep; keep "" closes every
// tunnel of name. Call it when the placement moved to keep (or to nobody),
// so that no client keeps talking to an instance that is no longer the
// placed one. It does not wait for the tunnels to end.
func (p *Proxy) CloseTunnels(name, keep string) {
	p.tunnelsMu.Lock()
	var ts []tunnelEnd
	for t := range p.tunnels[name] {
		if keep == "" || t.sessionID() != keep {
			ts = append(ts, t)
		}
	}
	p.tunnelsMu.Unlock()
	for _, t := range ts {
		t.close()
	}
}

// OpenTunnels returns the number of open WebSocket tunnels (with the
// handshakes in progress, which count toward MaxTunnels).
func (p *Proxy) OpenTunnels() int { return int(p.tunnelsOpen.Load()) }

// Run runs the endpoint janitor until ctx ends, then returns nil. Every
// EndpointSweepInterval it closes the endpoints (worker connection pools)
// that had no request in flight, no open tunnel and no request since the
// sweep before: those of worker sessions that are gone or no longer hold
// anything this proxy serves. A later request for such a session simply
// makes a fresh endpoint. Without Run, endpoints live until Close. Run owns
// no other goroutine; call it once.
func (p *Proxy) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.EndpointSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			p.sweepEndpoints()
		}
	}
}

// sweepEndpoints is one pass of the janitor: an endpoint used since the
// last pass is only marked unused; one that stayed unused, with nothing in
// flight and no tunnel, is retired, detached from its session and dropped
// from the table, and its idle connections closed.
func (p *Proxy) sweepEndpoints() {
	var idle []*endpoint
	p.epMu.Lock()
	for e, s := range p.eps {
		if e.used.Swap(false) || !e.retire() {
			continue
		}
		s.ep.CompareAndSwap(e, nil)
		delete(p.eps, e)
		idle = append(idle, e)
	}
	p.epMu.Unlock()
	for _, e := range idle {
		e.client.CloseIdleConnections()
		if p.front != nil {
			p.front.closePools(e)
		}
		p.m.endpointsClosed.Inc()
	}
}

// endpointFor returns the session's endpoint, making it (and attaching it to
// s) when s has none or only a retired one. It fails only when the session's
// advertise URL is unusable (wire.ParseAdvertiseURL).
func (p *Proxy) endpointFor(s *Session) (*endpoint, error) {
	p.epMu.Lock()
	defer p.epMu.Unlock()
	if e := s.ep.Load(); e != nil && !e.isRetired() {
		return e, nil
	}
	e, err := newEndpoint(&p.cfg.Endpoint, s, p.loops)
	if err != nil {
		return nil, err
	}
	s.ep.Store(e)
	p.eps[e] = s
	return e, nil
}

// endpointOf returns the session's endpoint: one atomic load once it exists.
func (p *Proxy) endpointOf(s *Session) (*endpoint, error) {
	if e := s.ep.Load(); e != nil {
		return e, nil
	}
	return p.endpointFor(s)
}

// admit takes a place in the in-flight cap of the session's endpoint. It
// returns the endpoint and whether the request was admitted (false: the
// endpoint is full). An endpoint the janitor has just retired is replaced by
// a fresh one: the janitor never fails a request.
func (p *Proxy) admit(s *Session) (*endpoint, bool, error) {
	e, err := p.endpointOf(s)
	for err == nil {
		switch e.admit() {
		case admitted:
			return e, true, nil
		case full:
			return e, false, nil
		}
		e, err = p.endpointFor(s)
	}
	return nil, false, err
}

// endpoints returns the number of endpoints in the table.
func (p *Proxy) endpoints() int {
	p.epMu.Lock()
	defer p.epMu.Unlock()
	return len(p.eps)
}

// slogLogger adapts the proxy's logger to fasthttp.Logger for the server's
// own errors (parse failures answered 400 and the like), at debug level.
type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Printf(format string, args ...any) {
	if s.l.Enabled(context.Background(), slog.LevelDebug) {
		s.l.Debug("server: " + fmt.Sprintf(format, args...))
	}
}
