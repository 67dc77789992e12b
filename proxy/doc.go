// Package proxy is the pinboard's data plane: it routes every request
// "/<namespace>/<id><rest>" to the worker process that holds the instance
// (namespace, id), and relays the answer. docs/proxy.md follows a request
// through it (the steps, what happens after each attempt, the smuggling
// policy, deadlines, tunnels, shutdown); this comment holds what must stay
// true.
//
// # Using it
//
//	p, err := proxy.New(proxy.Config{Resolver: placements}) // no I/O
//	srv := p.NewServer()                                     // the fasthttp engine, configured for the proxy
//	f, err := p.NewFront(proxy.FrontConfig{Fallback: srv})   // event loops in front of it
//	go f.Serve(ln)
//	go p.Run(ctx)                                            // the endpoint janitor
//	...
//	f.Shutdown(ctx); p.Close()                               // bounded by ctx; then tunnels and idle pools
//
// # Two engines, one set of rules
//
// The event-loop engine, a Front, serves the listener with event loops
// (internal/base/netloop): front.go accepts and hands over, loop.go reads
// client connections and writes answers, loopexchange.go is the exchange
// with a worker, looppool.go a loop's worker connections, loopstream.go
// relayed bodies (loopsplice.go those it splices, either way: a
// Content-Length body of at least SpliceMin never enters the proxy's
// memory, but for what of a request body came with its head),
// looptunnel.go WebSocket tunnels. A loop takes the common case (HTTP/1.1,
// origin-form, no body, a Content-Length body of at most ReplayBodyMax or
// of at least SpliceMin, WebSocket handshakes) and hands any other
// connection, with the bytes it read, to the fasthttp engine for the rest
// of its life.
//
// The fasthttp engine is Handler on the fasthttp.Server NewServer makes:
// proxy.go checks and prepares a request, forward.go is the exchange and
// its streamed body, upgrade.go WebSocket tunnels. It serves what the loops
// hand over, Deliver (the pinboard's own requests, deliver.go), and
// everything without a Front.
//
// Both share everything but the I/O: the head screen and field hygiene
// (headers.go), the route (route.go), the replies (errors.go), the
// endpoints (endpoint.go, one per Session: connection pool, in-flight cap,
// retry budget) and, after every attempt to send a request to a worker, the
// decision of what happens next (policy.go): each engine describes how the
// attempt ended as an outcome, and Proxy.decide returns the action (relay,
// resend, re-resolve, recheck the placement, or one of the proxy's
// answers) and what the Resolver hears; the engine only carries it out.
// The package's tests run on both engines.
//
// # Invariants
//
//   - The backend path is byte-identical to the client's (with the advertise
//     URL's path, if any, in front); nothing is decoded or normalised.
//   - A worker never sees a request the proxy refused, and never sees a
//     client's X-Pinned-* field, in the head or in a trailer (trailers the
//     proxy manages in the head are dropped).
//   - Both engines answer a request alike: what happens after an attempt is
//     decide's (policy.go), never an engine's own; the reasons the proxy
//     knows and those that make a host's 503 a refusal are listed there once.
//   - A request that may have been processed (it left, and no answer came)
//     is sent again only when it is idempotent (or Deliver's) and its body
//     is held: once more to the same worker, then only to a new holder if
//     the placement moved. Sends are bounded by MaxAttempts, retries by the
//     worker's retry budget. A body that streams (on the fasthttp engine) or
//     is spliced (on a loop) is not held: both engines tell decide so.
//   - Per request, the proxy's own code allocates nothing, starts no
//     goroutine, and takes no lock shared by all requests: exchanges come
//     from a pool (a sync.Pool; a loop's free list), replies are prebuilt,
//     counters are atomics on the endpoint (one cache line per worker), the
//     upstream histogram is atomic adds on one of 8 stripes (metrics.go).
//     The only lock it takes is the fasthttp engine's HostClient pool lock
//     (per worker). (fasthttp's Server allocates once per request that has a
//     body, when it discards what the handler left of it; see
//     alloc_external_test.go.)
//   - Ownership. A loop's connections, exchanges and pools are touched only
//     on its goroutine; while a resolve or a dial runs on a goroutine of the
//     Front, that goroutine owns the exchange until it posts it back
//     (RunTask). The Front owns every goroutine it starts (loops, resolves,
//     dials, one per handed-over connection) and Shutdown ends them. On the
//     fasthttp engine an exchange belongs to the client connection's
//     goroutine; once handed to the server as a body stream, the server
//     owns it until CloseWithError; a tunnel's hijack handler owns its
//     second pump and returns only when both have ended. Run's janitor is
//     the caller's, until its context ends.
//   - A worker connection goes back to the pool only after its request went
//     out whole and its response was read to the end with nothing left over
//     and without Connection: close (a spliced body, or a body the fasthttp
//     engine streamed: a peek at the socket after its last byte found
//     nothing). A request whose spliced body did
//     not go out whole closes it, and the client's connection too after the
//     answer: the rest of that body is unread, and nothing after it can be
//     taken for a request.
//   - A spliced stream (a response body, or a request body) holds at most
//     one pipe of SplicePipeSize bytes: it splices from its source only into
//     an empty pipe, so a slow receiver stalls only its own stream; a pipe
//     that may hold bytes is closed, never pooled.
//   - Nothing of one request or connection reaches another: every pooled
//     object is fully reset when it goes back to its pool, and what is
//     filled anew for each use (a parsed head, a scan) is reset where it
//     is filled, before it is read. Where: the loops' exchanges
//     (loopExchange) in loop.putExchange, the fasthttp engine's (exchange) in
//     Proxy.putExchange, both checked field by field by
//     TestPooledExchangesComeBackClean; a loop's connection, answer and
//     worker-answer buffers carry no length of their own (their owner's
//     does: clientConn.n, loopExchange.rn, the pending answer) and go back
//     only when their owner is done with them; its scratch buffer is read
//     into only for the moment a read is looked at, never more than a
//     connection buffer holds, and what a request leaves over moves to a
//     connection buffer before the request starts; its head reader and Date
//     buffer are overwritten on each use; the prebuilt replies are never
//     written.
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
//     fasthttp engine: a head HeaderReceived handed to ExpectHandler because
//     its holder's limit refused it, whose placement moved to a holder that
//     takes the body in the microseconds between the two, is invited to
//     send it (RFC 9110 §15.2: an HTTP/1.1 client reads any 1xx).
//
// # Observability
//
// The logger is tagged logger=pinned.proxy; errors on the request path are
// throttled to one per second. The metrics, pinned_proxy_* on Config.Metrics
// (Proxy.Metrics), are listed in docs/metrics.md.
package proxy
