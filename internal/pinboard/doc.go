// Package pinboard wires the pinboard binary: settings from flags and the
// environment (ParseSettings), the store (redisstore, or memstore with
// -dev), the registry, the data plane (the proxy, plugged in through
// Config.NewDataPlane), the public and admin fasthttp servers, signals and
// graceful shutdown (Main). cmd/pinboard is a one-line main around Main so
// that tests can start a whole pinboard in-process.
//
// # Ports
//
// The public listener (PINBOARD_LISTEN, default :8080) serves /registry/*,
// /healthz, and hands every other request to the data plane. Which is which
// is decided on the raw request target's first segment (/registry or
// /healthz), as the proxy decides its own routes, never on a normalised
// path. The registry's router never redirects (RedirectTrailingSlash and
// RedirectFixedPath are off) and a wrong method on a registry path is a 405.
// With the proxy plugged in, the public server is the proxy's (NewServer:
// streamed request bodies, the proxy's header, body and timeout limits); the
// registry reads its bodies through a limited reader of the body stream, so
// its 64 KiB bound (413) holds there too; a registry call whose head
// announces more (Content-Length) is answered 413 at once, before any body
// byte is read, and its connection closed (the server's head hook and
// ExpectHandler, refuseOversizeRegistryHeads: fasthttp reads a body prefix
// before any handler runs). The admin listener
// (PINBOARD_ADMIN_LISTEN, default 127.0.0.1:9090) serves /metrics (the
// pinboard's, the registry's and the data plane's sets plus go_* and
// process_*) and /debug/pprof/*; neither is ever reachable on the public
// port.
//
// # Registry hardening settings
//
// PINBOARD_ADVERTISE_NETWORKS, PINBOARD_ADVERTISE_PORTS, PINBOARD_NONCE_TTL,
// PINBOARD_REGISTER_IP_RATE, PINBOARD_REGISTER_TOKEN_RATE,
// PINBOARD_AUTH_FAILURE_RATE, PINBOARD_MAX_SESSIONS_PER_TOKEN and
// PINBOARD_MAX_TRACKED_CLIENTS map one-to-one onto the registry.Config
// fields of the same meaning (rates are written "N/PERIOD [burst B]" or
// "off", see registry.ParseLimit); zero Settings fields mean the registry's
// defaults, so a Settings built in code gets the same protection as one
// parsed from the environment.
//
// # Plugging in the proxy
//
// Config.NewDataPlane receives DataPlaneDeps{Store, Lease, Logger, Metrics,
// Clock, DialControl} and returns a DataPlane: Handle serves every non-registry request;
// Invalidate receives every store invalidation (wired as the store's
// OnInvalidate before anything connects). Optional methods: Run(ctx) for
// background work that lives as long as the pinboard, NewServer to supply
// the public fasthttp.Server (its Handler is replaced by the dispatch
// above), ConfigureServer to adjust it, Guard to wrap the registry's
// handler in the data plane's request-head rules (the proxy's Guard: a
// request to /registry/* or /healthz with ambiguous framing or field syntax
// is refused like a proxied one, and a chunked one closes its connection,
// so that no request can hide behind it). NewProxy is the real data plane
// (package proxy on package placement) and what cmd/pinboard passes; with
// -dev its resolver gets its invalidations from the memory store directly.
// ProxyPlane.Run closes the proxy's tunnels and the resolver's endpoints
// once the public listener has drained.
//
// # Lifecycle
//
// New does no I/O. Run binds both listeners, then serves at once, even
// while Redis is unreachable: the store's Connect retries with capped
// exponential backoff, /healthz answers 503 naming the dial error meanwhile,
// and registry calls answer 503 + Retry-After. On ctx end (SIGTERM/SIGINT
// in Main): /healthz turns 503 {"shuttingDown": true}; after ShutdownDelay
// the public listener closes and in-flight requests finish, all bounded by
// ShutdownTimeout; then the janitor, the connect loop and the data plane's
// Run stop and are joined, and the store closes. SIGHUP re-reads
// PINBOARD_TOKEN_FILE (one token per line: the new and the old one during a
// rotation); a bad file keeps the current tokens.
//
// Exit statuses: 0 after a clean shutdown, 1 when a listener fails, 2 for an
// invalid configuration (the message names the variable, e.g. a missing
// PINBOARD_TOKEN).
package pinboard
