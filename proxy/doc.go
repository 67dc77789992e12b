// Package proxy is the pinboard's data plane: a fasthttp request handler that
// routes every request "/<namespace>/<id><rest>" to the worker process that
// holds the instance (namespace, id), and relays the answer.
//
// # Using it
//
//	p, err := proxy.New(proxy.Config{Resolver: placements}) // no I/O
//	srv := p.NewServer()                                     // configured for the proxy
//	go srv.Serve(ln)
//	go p.Run(ctx)                                            // the endpoint janitor
//	...
//	srv.Shutdown(); p.Close()
//
// A Resolver maps the placement name "/<ns>/<id>" to a Route: the *Session
// holding it (session id, secret, advertise URL) and the placement's epoch.
// The placement resolver (internal/placement) implements it; package
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
//     are cut off (413, connection closed) past the limit.
//  5. Field hygiene (RFC 9110 §7.6.1): Connection and every field it names,
//     Keep-Alive, Proxy-Connection, Proxy-Authorization, Proxy-Authenticate,
//     TE, Upgrade, Expect and HTTP2-Settings are removed; so are the client's
//     X-Pinned-*, Forwarded and X-Forwarded-* (unless the peer is in
//     TrustedProxies). Then the proxy adds X-Forwarded-For/-Proto/-Host,
//     X-Pinned-Proxy-Secret and X-Pinned-Session: after the removals, so no
//     Connection option can strip them (golang/go#50580). Framing is
//     regenerated on each leg; the client's Connection: close does not close
//     the worker connection, nor the worker's the client's (P3). No
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
//     HTTP/1.0 client never gets chunked framing (P9): a body of unknown
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
//   - 413 + close: a Content-Length over MaxRequestBodySize (at once with
//     Expect: 100-continue, otherwise after fasthttp's prefetch of
//     min(Content-Length, 8 KiB)), or a chunked body growing past it.
//   - 408 + close: a head not received within HeaderTimeout (slowloris).
//   - 501 and 505 are not used: "gzip, chunked" (RFC 9112 §6.1 suggests
//     501) and unknown versions (505) are refused by fasthttp's parser
//     before the handler, and one status per class keeps the table simple.
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
//   - Resolve fails: 503 no_worker (ErrNoWorker) or 503 store.
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
//     unreachable. The request provably did not leave, so nothing is
//     ambiguous.
//   - The request may have reached the worker but no usable answer came
//     back: 502; no response head within ResponseHeaderTimeout: 504. Nothing
//     waits without a deadline.
//   - A worker 503 with X-Pinned-Reason closing, draining or lease (the host
//     made it, not the application) is reported (Refused); the request is
//     re-resolved and sent again when its body is held (or absent). Otherwise
//     the 503 and its Retry-After reach the client.
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
// No deadline bounds a whole stream (P5). The server's ReadTimeout
// (HeaderTimeout) bounds a request head and small bodies; long request
// bodies and streamed responses move their deadlines with progress and fail
// only after StreamIdleTimeout without any. WriteTimeout bounds writing a
// buffered response. Tunnels close after TunnelIdleTimeout without a byte in
// either direction.
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
//   - A Session carries at most one live endpoint; the janitor retires one
//     only by a compare-and-swap of its in-flight count from zero, so no
//     request is ever admitted on a retired endpoint: a request that finds
//     its session's endpoint retired makes a fresh one (the janitor never
//     fails a request). Making and retiring endpoints share one mutex, taken
//     only off the hot path.
//   - A Resolver and its Sessions serve one Proxy (the proxy attaches its
//     endpoints to the Sessions).
//
// # Callers must not assume
//
//   - that a request refused by fasthttp's parser is counted or answered in
//     JSON unless the server's ErrorHandler is ServerError (NewServer sets
//     it);
//   - that a chunked request body failing after its first chunk is withheld
//     from the worker: the worker sees a truncated body and its read fails;
//   - that Close waits for requests: it only ends tunnels and closes idle
//     worker connections. Shut the server down first.
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
