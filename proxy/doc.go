// Package proxy is the pinboard's data plane: it routes every request
// "/<namespace>/<id><rest>" to the worker process that holds the instance
// (namespace, id), and relays the answer.
//
// # Using it
//
//	p, err := proxy.New(proxy.Config{Resolver: placements}) // no I/O
//	srv := p.NewServer()                                     // the fasthttp path, configured for the proxy
//	f, err := p.NewFront(proxy.FrontConfig{Fallback: srv})   // event loops in front of it
//	go f.Serve(ln)
//	go p.Run(ctx)                                            // the endpoint janitor
//	...
//	f.Shutdown(ctx); p.Close()                               // see "Shutdown"
//
// # Two ways in
//
// A Front (front.go, loop.go, loopexchange.go, looppool.go, loopstream.go,
// looptunnel.go) serves the listener with event loops (internal/base/netloop),
// one per CPU by default: each client connection belongs to one loop, which reads its
// requests, forwards them on worker connections the same loop owns, and
// writes the answers, with no goroutine, channel or lock per request and no
// read that finds nothing (a short read means drained until the next
// epoll edge). The loops take the common case: HTTP/1.1, origin-form, no
// body or a Content-Length body of at most ReplayBodyMax, WebSocket
// handshakes and their tunnels, answers of any length (buffered up to
// BufferedResponseMax, streamed with backpressure beyond). A request they
// do not take (HTTP/1.0, a chunked or longer body, Expect, absolute-form, a
// target the embedder serves itself, a head with anything fasthttp's
// parser or the rules below would refuse) makes its loop hand the
// connection, with the bytes it read, to the fasthttp path for the rest of
// its life (pinned_proxy_handovers_total): Handler on the fasthttp.Server
// NewServer makes, a goroutine per connection. Both paths apply the same
// rules with the same code (screen, route, field hygiene, replies, the
// decisions after each attempt in policy.go, the Resolver, the endpoints),
// so a client cannot tell them apart except by speed. Without a Front the
// fasthttp path serves everything.
//
// A loop's worker connections are its own: each endpoint keeps a pool per
// loop (MaxConns shared out among the loops, at least one each, so the
// loops together may hold a few more than MaxConns; the in-flight cap,
// MaxConns + MaxQueue, is shared exactly); a request waiting for a
// connection queues on its loop, bounded by QueueTimeout. A worker
// connection the worker closed while pooled is seen closing and dropped
// before any request is sent on it.
//
// Deliver sends a request of the pinboard's own (an alarm delivery) on the
// fasthttp path's code without a client: routed, placed and retried like
// any, keeping its own X-Pinned-* fields, which the proxy strips from every
// client request.
//
// A Resolver maps the placement name "/<ns>/<id>" to a Route: the *Session
// holding it (session id, secret, advertise URL) and the placement's epoch.
// The placement resolver (internal/pinboard/placement) implements it; package
// proxytest has a static one for tests. Lookup answers from the resolver's
// cache without blocking or allocating (the hot path); Resolve reads the
// store and places the instance on a miss; Refused reports a session that
// refused or failed a request. Dependencies point one way: the resolver
// never calls the proxy.
//
// The proxy owns the connections to workers: one endpoint per Session
// (connection pool, in-flight cap, retry budget; Config.Endpoint), made on
// first use and attached to the Session, so that a request reaches its pool
// with one atomic load. Run's janitor closes endpoints that stayed unused
// for a whole EndpointSweepInterval with nothing in flight and no tunnel
// (those of dead or idle workers); a later request for such a session gets a
// fresh one.
//
// # What a request goes through
//
//  1. One pass over the request head as it arrived (RequestHeader.RawHeaders):
//     framing that fasthttp's parse folds away (Content-Length with
//     Transfer-Encoding, which fasthttp lets chunked win; a coding other than
//     chunked; a Content-Length with a leading zero) and field syntax it
//     tolerates (blanks in a name, obs-fold, a bare LF line end) are refused
//     with 400 and a closed connection (RFC 9112 §2.2, §5, §6.1, §6.3), more
//     than MaxHeaderFields fields with 431; the same pass lists the fields to
//     remove. fasthttp itself refuses duplicate Content-Length, duplicate
//     Host, a missing Host, bad values and the like before the handler runs;
//     ServerError answers those with the same JSON errors. See "Smuggling
//     policy" below.
//  2. The target, from the raw request URI, nothing decoded (route.go): the
//     namespace and id must pass wire.CheckSegment; the rest must not be able
//     to climb out of "/<ns>/<id>" once a backend decodes and normalises it
//     (no dot segments, no raw '\', no %2F %5C %2E %00 %25). An absolute-form
//     target must agree with Host and is sent in origin-form. Refusals are
//     400 (404 for a path that names no object) with a JSON wire.Error, and
//     the worker sees nothing.
//  3. "Upgrade: websocket" goes to upgrade.go; any other Upgrade is 400.
//  4. A body whose Content-Length exceeds MaxRequestBodySize is 413 before
//     any byte is sent. Bodies up to ReplayBodyMax are read whole, so the
//     request can be sent again; longer ones stream with their
//     Content-Length, chunked ones stream re-chunked with their trailers and
//     are cut off (413, connection closed) past the limit. The worker's own
//     limit (Session.MaxBodyBytes, which it registered) is applied the same
//     way once the route is known: 413 naming it, nothing sent. Both are
//     decided on the head, without waiting for the body, when the head
//     tells: a Content-Length over the proxy's limit always, over the
//     holder's when the resolver's cache knows the holder (the loops in
//     parse; the fasthttp path in HeaderReceived, which hands such a head
//     to ExpectHandler, see there), and for a head with "Expect:
//     100-continue", which ExpectHandler routes (Lookup, else Resolve)
//     before it invites the body: no 100 Continue precedes a refusal the
//     head decides.
//  5. Field hygiene (RFC 9110 §7.6.1): Connection and every field it names,
//     Keep-Alive, Proxy-Connection, Proxy-Authorization, Proxy-Authenticate,
//     TE, Upgrade, Expect and HTTP2-Settings are removed; so are the client's
//     X-Pinned-*, Forwarded and X-Forwarded-* (unless the peer is in
//     TrustedProxies). Then the proxy adds X-Forwarded-For/-Proto/-Host,
//     X-Pinned-Proxy-Secret and X-Pinned-Session: after the removals, so no
//     Connection option can strip them (golang/go#50580). Framing is
//     regenerated on each leg; the client's Connection: close does not close
//     the worker connection, nor the worker's the client's (RFC 9112 §9.6:
//     it is about its own connection). X-Pinned-Epoch carries the route's
//     epoch, which the worker's host checks (503 stale for an older one). No
//     User-Agent, Content-Type, Server or Date is invented.
//  6. The route: Resolver.Lookup at the request's time (RequestCtx.Time),
//     else Resolve; then the session's endpoint. The request goes out on a
//     pooled connection
//     (forward.go). The proxy writes and reads the messages itself and uses
//     the endpoint's fasthttp.HostClient only for its pool, which gives it
//     what HostClient.Do hides: whether any byte left (a counting writer),
//     whether the connection was reused, the raw response head. A request
//     held whole (no body, or a replayable one) is written and then awaited
//     through the connection's RawConn (writeThenAwait): the first read of
//     the response finds bytes, saving the read that would return EAGAIN,
//     one syscall per request (profiles/README.md has the numbers).
//  7. The response head is scanned raw like the request's (a worker's
//     Content-Length with Transfer-Encoding, a bad coding, a blank in a name
//     or an unparsable head: 502, nothing relayed), interim 1xx are dropped,
//     hop-by-hop fields removed. A body with a Content-Length up to
//     BufferedResponseMax is read at once and the worker connection released
//     before the client is written to; any other body streams: the exchange
//     becomes the response's body stream and gives the connection back when
//     the server has written it. Trailers follow the last chunk. An
//     HTTP/1.0 client never gets chunked framing (RFC 9112 §7.1: a 1.0
//     recipient cannot read it): a body of unknown
//     length is delimited by closing the connection.
//
// # Smuggling policy
//
// The rule: a request whose framing or syntax two parsers could read
// differently is refused and its connection closed; the worker receives not
// one byte of it. The status says which limit or rule was hit; every
// refusal is a JSON wire.Error. The table in internal/testkit/smuggle (run by
// TestSmugglingTable, 130 cases) holds an example of every row.
//
//   - 400 + close: Content-Length with Transfer-Encoding; a coding other
//     than exactly chunked (identity, gzip, "chunked, chunked", parameters,
//     two Transfer-Encoding fields, any case game that is not "chunked");
//     Transfer-Encoding on HTTP/1.0; a duplicate, listed, signed, hex,
//     empty, leading-zero or non-digit Content-Length; a blank before the
//     colon or in a name, an empty name, a line without a colon, obs-fold,
//     a bare CR, LF, NUL or other control byte in the head; a malformed
//     request line or version (HTTP/2 prior knowledge included); a missing
//     (HTTP/1.1), repeated or invalid Host, or an absolute-form target
//     whose authority differs from Host; a bad chunk size or chunk line
//     (0x, _, +, -, empty, overflow, bare LF, data longer or shorter than
//     its size); a target that is not origin- or absolute-form, has '#',
//     an id or namespace outside wire.CheckSegment, an escaped '/', '\',
//     '.', NUL or '%', a dot segment or a raw '\'; an Upgrade other than
//     a WebSocket handshake (h2c with or without HTTP2-Settings, TLS, two
//     Upgrade fields, websocket without Connection: Upgrade, on a POST or
//     on HTTP/1.0). Every other 400 closes too.
//   - 431 + close: a head over MaxHeaderBytes or over MaxHeaderFields.
//   - 413 + close: a Content-Length over MaxRequestBodySize, at once, before
//     any byte of the body is read (the loops refuse it on the head; the
//     fasthttp path answers it from ExpectHandler, to which HeaderReceived
//     hands the head: no body prefetch waits; an HTTP/1.0 head, outside
//     100-continue, is refused once its body's first bytes are in), or a
//     chunked body growing past it; likewise past the holder's
//     Session.MaxBodyBytes (on the head when the holder is known: step 4).
//   - Lingering close: a connection that closes after one of these refusals
//     while the request's body may be unread writes the refusal, shuts its
//     sending side down and discards input until the client closes or
//     LingerTimeout passes (linger.go, clientConn.startLinger). Closing at once
//     would reset the connection, and the reset makes the client's kernel
//     drop the refusal before a client that sends its whole body first
//     reads it. ExpectHandler's refusals linger too. (A refusal of
//     fasthttp's own parser, ServerError's, on a proxy served by NewServer
//     alone cannot linger: fasthttp writes it and closes.)
//   - 408 + close: a head not received within HeaderTimeout (slowloris):
//     "request head not received in time"; a body whose start (a body up
//     to ReplayBodyMax whole, the first 8 KiB of a longer one) did not
//     follow its head within that time, or a streamed body that stalled
//     for StreamIdleTimeout: "request body not received in time" (field
//     "body").
//   - 505 + close: a version other than HTTP/1.x (RFC 9112 §2.3; HTTP/1.x
//     minor versions are served as 1.1).
//   - 501 is not used: "gzip, chunked" (RFC 9112 §6.1 suggests 501) is
//     refused with 400 like every other coding than chunked, and one status
//     per class keeps the table simple.
//   - A request with a chunked body closes its connection after the
//     answer, whatever the answer: fasthttp decodes where the body ends
//     (it takes a bare LF as the end of the trailer section) and the proxy
//     cannot see those bytes, so nothing pipelined behind one is read.
//
// Other handlers on the proxy's server (the pinboard's registry and
// /healthz) get the target-independent rows, framing, field syntax, field
// count and the close after a chunked body, through Guard: a request that
// hides another behind ambiguous framing is refused whatever its path.
//
// Tolerated, because fasthttp consumes the bytes where the raw scan cannot
// see them, and forwarded regenerated (the worker receives a clean
// request): a bare LF ending the request line, empty lines before it, and
// chunk extensions (dropped, whatever they contain). A chunked body whose
// framing breaks after its first chunk has already streamed: the client
// gets 400 and close, the worker a truncated body whose read fails.
//
// From a worker, the same faults (ambiguous framing, a bad Content-Length,
// obs-fold, bare LF, CR/LF/NUL in a value, a blank in a name, an
// unparsable status line, a head over MaxResponseHeaderBytes or cut off, a
// 101 to a plain request) become the proxy's own 502 with nothing of the
// worker's answer relayed.
//
// # Failures and retries
//
// Every answer the proxy makes itself is a wire.Error JSON body; every 503
// carries Retry-After and X-Pinned-Reason.
//
//   - Resolve fails: 404 unknown_namespace without Retry-After
//     (ErrUnknownNamespace: nobody served the namespace recently), 503
//     no_worker (ErrNoWorker) or 503 store (logged as a throttled warning,
//     or at DEBUG when the error wraps ErrNotReady: the resolver is still
//     starting).
//   - The session's advertise URL is unusable (wire.ParseAdvertiseURL):
//     Refused, and 503 unreachable.
//   - The endpoint is over its cap (MaxConns in flight plus MaxQueue
//     waiting), or no connection frees within QueueTimeout: 503 overloaded.
//   - The worker cannot be reached (dial failed, or the connection failed
//     before the kernel took a byte): the resolver hears of it (Refused) and
//     the placement is resolved again; when it moved (the worker's session
//     had expired and
//     the resolver placed the instance elsewhere) and the body is held, the
//     request goes to the new holder, otherwise the answer is 503
//     unreachable, whose Retry-After is the time left of the holder's lease
//     (Session.LeaseEnd, as the resolver last read it; at most two minutes):
//     the earliest its ids can move. The request provably did not leave, so
//     nothing is ambiguous.
//   - The request reached the worker (or may have) and not one byte of an
//     answer came back (the worker closed or reset the connection): an
//     idempotent request (RFC 9110 §9.2.2) whose body is held is sent once
//     more (a pooled connection the worker had closed counts as that one
//     resend), and when that gets no answer either the worker is taken as
//     unreachable (above: Refused, and the new holder when the placement
//     moved, else 503 unreachable + Retry-After); any other request may
//     have been processed: 502 + Retry-After, never sent again. A broken
//     or unparsable answer is 502; no response head within
//     ResponseHeaderTimeout: 504. Nothing waits without a deadline.
//   - A worker 503 with X-Pinned-Reason closing, draining, lease or stale
//     (the host made it, not the application) is reported (Refused); the
//     request is re-resolved and sent again when its body is held (or
//     absent). Otherwise the 503 and its Retry-After reach the client.
//   - A worker 403 with X-Pinned-Reason forbidden means the process at the
//     session's address does not know the session's secret: the worker was
//     restarted there (or another process took its port). The host refused
//     it before any application code ran, so it is handled like an
//     unreachable worker (re-resolve, else 503 unreachable); the client never
//     sees the 403.
//   - A request that met a pooled connection the worker had closed is sent
//     again on another when nothing of it left the proxy, or when it is
//     idempotent (RFC 9110 §9.2.2) and its body is held. A request that may
//     have been processed is never silently sent again otherwise.
//
// Sends per request are bounded by MaxAttempts; retries and re-resolves are
// also bounded per worker by a retry budget (EndpointConfig.RetryBudgetRatio,
// 20 % by default, plus a small burst), so that a failing worker sees at most
// 1.2 × its requests.
//
// # Deadlines
//
// No deadline bounds a whole stream: a long download or upload that keeps
// moving is never cut. HeaderTimeout (the server's ReadTimeout; a loop's
// timer from a head's first byte) bounds a request head and the start of
// its body: a body up to ReplayBodyMax whole, the first 8 KiB of a longer
// one; the 408 says which did not come (no separate body timeout: a body
// that follows its head at once starts well within it, and one that
// trickles is the same slowloris). Long request bodies and streamed
// responses move their deadlines with progress and fail only after
// StreamIdleTimeout without any (a request body: 408 naming the body).
// WriteTimeout bounds writing a buffered response. Tunnels close after
// TunnelIdleTimeout without a byte in either direction.
//
// # WebSocket tunnels
//
// A WebSocket handshake goes to the worker on a connection of its own. An
// answer other than 101 is relayed as a plain response and the connection
// stays HTTP (no tunnel on a refused upgrade). A 101 hijacks the client
// connection: the 101 head and any bytes the worker sent after it are
// written, then two pumps copy bytes both ways, no framing. Worker → client
// uses splice(2) when both sides are TCP (writes go to the raw connection
// under fasthttp's wrapper, which flushed everything before the hijack);
// client → worker reads through fasthttp's wrapper, which may hold bytes the
// client sent right behind its handshake. A half-close is passed on with
// CloseWrite. The hijack handler returns only when both pumps have ended.
// Tunnels are capped by MaxTunnels (503 overloaded beyond); CloseTunnels
// ends those of one placement on every session but the one it moved to,
// Proxy.Close all of them. A Resolver that also implements TunnelWatcher
// hears of every tunnel (Watch) once CloseTunnels reaches it, and of its end
// (Unwatch), so that it can watch the placement and report when it moves:
// the pinboard then calls CloseTunnels.
//
// # Invariants
//
//   - The backend path is byte-identical to the client's (with the advertise
//     URL's path, if any, in front); nothing is decoded or normalised.
//   - A worker never sees a request the proxy refused, and never sees a
//     client's X-Pinned-* field, in the head or in a trailer (trailers the
//     proxy manages in the head are dropped).
//   - Per request, the proxy's own code allocates nothing, starts no
//     goroutine, and takes no lock shared by all requests: exchanges come
//     from a sync.Pool, replies are prebuilt, counters are atomics on the
//     endpoint (one cache line per worker), the upstream histogram is
//     atomic adds on one of 8 stripes (metrics.go). The only shared lock is
//     the endpoint HostClient's pool lock (per worker).
//     (fasthttp's Server allocates once per request that has a body, when it
//     discards what the handler left of it; see alloc_external_test.go.)
//   - An exchange belongs to the client connection's goroutine; once handed
//     to the server as a body stream, the server owns it until
//     CloseWithError.
//   - A worker connection goes back to the pool only after its response was
//     read to the end with nothing left over and without Connection: close.
//   - Nothing of one request or connection reaches another: every pooled
//     object is fully reset when it goes back to its pool, and what is
//     filled anew for each use (a parsed head, a scan) is reset where it
//     is filled, before it is read. Where: the loops' exchanges
//     (loopExchange) in loop.putExchange, the fasthttp path's (exchange) in
//     Proxy.putExchange, both checked field by field by
//     TestPooledExchangesComeBackClean; a loop's connection, answer and
//     worker-answer buffers carry no length of their own (their owner's
//     does: clientConn.n, loopExchange.rn, the pending answer) and go back
//     only when their owner is done with them; its scratch buffer is read into only
//     for the moment a read is looked at, never more than a connection
//     buffer holds, and what a request leaves over moves to a connection
//     buffer before the request starts; its head reader and Date buffer
//     are overwritten on each use; the prebuilt replies are never written.
//     A loop takes a request's bytes off the connection's buffer before it
//     starts the request, whose answer may come (and end, and look for the
//     next request) before start returns: a nested readRequests returns at
//     once. fasthttp pools its RequestCtx across connections: the proxy
//     keeps nothing keyed by one. What its hooks tell each other about a
//     request travels in the request's own head (HeaderReceived's Expect),
//     which fasthttp resets for the next, and ServerError decides from
//     the error and the connection (ConnState: whether it ever sent a
//     byte).
//   - A Session carries at most one live endpoint; the janitor retires one
//     only by a compare-and-swap of its in-flight count from zero, so no
//     request is ever admitted on a retired endpoint: a request that finds
//     its session's endpoint retired makes a fresh one (the janitor never
//     fails a request). Making and retiring endpoints share one mutex, taken
//     only off the hot path.
//   - A Resolver and its Sessions serve one Proxy (the proxy attaches its
//     endpoints to the Sessions).
//
// # Shutdown
//
// Front.Shutdown is bounded by its context, whatever clients and workers
// do. In order: the listener closes (stop accepting); every connection
// finishes the exchange in progress, whose answer says Connection: close,
// and closes; idle keep-alive connections close at once; tunnels on the
// loops end. The connections a loop handed over to the fasthttp path
// (pinned_proxy_handovers_total: a worker's registry calls are among
// them, and its heartbeats keep one of them alive for good) get the same
// treatment from the fasthttp server's ShutdownWithContext, which the
// Front makes effective by serving that server on a listener of its own
// (fasthttp's Shutdown does nothing on a server without a listener, and
// ServeConn gives it none). When the context ends first, every connection
// still open is closed, on the loops and handed over alike, and Shutdown
// returns the context's error; a request of the fasthttp path still
// waiting for a worker then ends on its own, by ResponseHeaderTimeout or
// StreamIdleTimeout, without holding Shutdown (a dial in flight, bounded by
// EndpointConfig.DialTimeout, may). Front.Conns counts the client
// connections still open, for progress logs. Then Proxy.Close ends the
// fasthttp path's tunnels and closes the idle worker connections.
//
// Without a Front, the fasthttp server's own ShutdownWithContext does the
// draining; connections still busy at its deadline are left to the process's
// exit.
//
// # Callers must not assume
//
//   - that a request refused by fasthttp's parser is counted or answered in
//     JSON unless the server's ErrorHandler is ServerError (NewServer sets
//     it);
//   - that a chunked request body failing after its first chunk is withheld
//     from the worker: the worker sees a truncated body and its read fails;
//   - that Close waits for requests: it only ends tunnels and closes idle
//     worker connections. Shut the server down first;
//   - that a client which sent no Expect never gets a 100 Continue on the
//     fasthttp path: a head HeaderReceived handed to ExpectHandler because
//     its holder's limit refused it, whose placement moved to a holder that
//     takes the body in the microseconds between the two, is invited to
//     send it (RFC 9110 §15.2: an HTTP/1.1 client reads any 1xx).
//
// # Observability
//
// The logger is tagged logger=pinned.proxy; errors on the request path are
// throttled to one per second. Metrics (Config.Metrics, or Proxy.Metrics):
// pinned_proxy_responses_total{class}, pinned_proxy_upstream_duration_seconds
// (classic buckets: taking a worker connection to its response head),
// pinned_proxy_reresolves_total, pinned_proxy_retries_total,
// pinned_proxy_unreachable_total, pinned_proxy_overloaded_total,
// pinned_proxy_bad_gateway_total, pinned_proxy_upstream_timeouts_total,
// pinned_proxy_rejected_total, pinned_proxy_retry_budget_exhausted_total,
// pinned_proxy_tunnels_open, pinned_proxy_tunnels_total,
// pinned_proxy_tunnels_rejected_total, pinned_proxy_endpoints and
// pinned_proxy_endpoints_closed_total.
package proxy
