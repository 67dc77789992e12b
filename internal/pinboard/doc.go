// Package pinboard wires the pinboard binary: settings from flags and the
// environment (ParseSettings), the store (redisstore, or memstore with
// -dev), the registry, the data plane (the proxy on the placement resolver,
// built here; none with Config.NoProxy), the public and admin fasthttp
// servers, signals and graceful shutdown (Main). cmd/pinboard is a one-line
// main around Main so that tests can start a whole pinboard in-process.
//
// # Ports
//
// The public listener (PINBOARD_LISTEN, default :8080) serves /registry/*,
// /healthz, and hands every other request to the data plane. Which is which
// is decided on the raw request target's first segment (/registry or
// /healthz), as the proxy decides its own routes, never on a normalised
// path. The registry's router never redirects (RedirectTrailingSlash and
// RedirectFixedPath are off) and a wrong method on a registry path is a 405.
// With the data plane, the public server is the proxy's (NewServer:
// streamed request bodies, the proxy's header, body and timeout limits); the
// registry reads its bodies through a limited reader of the body stream, so
// its 64 KiB bound (413) holds there too; a registry call whose head
// announces more (Content-Length) is answered 413 at once, before any body
// byte is read, and its connection closed (the server's head hook and
// ExpectHandler, refuseOversizeRegistryHeads: fasthttp reads a body prefix
// before any handler runs; the proxy's own hooks, which route object paths,
// never see a registry call). The admin listener
// (PINBOARD_ADMIN_LISTEN, default 127.0.0.1:9090) serves /metrics (the
// pinboard's, the registry's and the data plane's sets plus go_* and
// process_*), /debug/pprof/*, and the operator console: the page at /
// (console.go; index.html, console.js and console.css embedded from
// console/, with a Content-Security-Policy that allows only them and calls
// to the admin listener) and every /registry/* call, handed in process to
// the registry's own router, so the token check, limits and metrics are
// those of the public port. None of these is ever reachable on the public
// port.
//
// # Hot ids
//
// New makes one hotids.Sketch (Config.HotIDs sizes it) and hands it to the
// registry (GET /registry/hot, /registry/traffic); the data plane's proxy
// records every routed request in it (Sketch.Record). Its error bound is
// the gauge pinned_hotids_error_bound on the admin /metrics. Each pinboard
// counts only what it routed (see internal/pinboard/hotids).
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
// # The data plane
//
// New builds the data plane itself (dataplane.go) unless Config.NoProxy
// asks for a registry-only pinboard: the proxy (package proxy) on the
// placement resolver (internal/pinboard/placement), with the pinboard's store, lease,
// logger, a metric set of its own (on the admin /metrics) and
// Settings.Proxy (the limits flags, the per-worker pool's in
// Settings.Proxy.Endpoint). Workers are dialled through the registry's
// address policy (registry.Registry.DialControl as the dialer's Control,
// checked on the address actually connected). The wiring is plain calls,
// one way:
//
//   - the store's OnInvalidate is a method of the Pinboard that hands every
//     invalidation to the resolver (OnInvalidate: fast, no store call);
//   - the resolver's OnMoved closes the tunnels of a moved placement
//     (proxy.Proxy.CloseTunnels);
//   - the public server is the proxy's (NewServer); the registry's handler
//     is wrapped in the proxy's Guard (a request to /registry/* or /healthz
//     with ambiguous framing or field syntax is refused like a proxied one,
//     and a chunked one closes its connection, so that no request can hide
//     behind it); every other request goes to the proxy's Handler;
//   - Run runs the resolver's Run (tunnel checks, session sweep) and the
//     proxy's Run (endpoint janitor) and, once the public listener has
//     drained, closes the proxy (tunnels, pooled connections) and the
//     resolver.
//
// With NoProxy the public server is a plain fasthttp.Server and every
// non-registry request gets 404.
//
// # Alarms
//
// When the store keeps alarms (redisstore, memstore with -dev) and the data
// plane has a placement resolver (ProxyPlane), New builds the alarm
// scheduler (package alarm) and the registry serves the alarm calls, its
// OnAlarmSet nudging the scheduler. Run starts the scheduler with the rest
// and, on shutdown, stops it with the janitor; it returns after the
// deliveries in flight finished (each bounded by the delivery timeout).
// Deliveries go through alarmdeliver.go, on the proxy's own path
// (proxy.Proxy.Deliver): POST /<ns>/<id>/_pinned/alarm is placed and
// activated like any request, on the proxy's pools, with the route's
// secret, session and epoch. The
// settings (PINBOARD_ALARM_*, PINBOARD_MAX_ALARMS_PER_INSTANCE) are in
// alarms.go; the scheduler's metrics are on the pinboard's own set.
//
// # Lifecycle
//
// New does no I/O. Run binds both listeners, then serves at once, even
// while Redis is unreachable: the store's Connect retries with capped
// exponential backoff, /healthz answers 503 naming the dial error meanwhile,
// and registry calls answer 503 + Retry-After. On ctx end (the first
// SIGTERM/SIGINT in Main): /healthz turns 503 {"shuttingDown": true}; after
// ShutdownDelay both listeners close and in-flight requests finish; idle
// keep-alive connections close at once (a worker's heartbeat connection,
// handed over by the event loops to the fasthttp server, included); when
// ShutdownTimeout passes first, every connection still open is closed
// (proxy.Front.Shutdown); then the janitor, the connect loop, the data
// plane's background work and the alarm scheduler stop and are joined, no
// longer than the same deadline, and the store closes. So Run returns
// within ShutdownDelay + ShutdownTimeout whatever its peers do; it logs
// what it waits for at most once per ProgressEvery (connections, then
// tasks) and how long it took ("pinboard stopped", took). A second
// SIGTERM/SIGINT makes Main return at once (cmdline.Signals). SIGHUP re-reads
// PINBOARD_TOKEN_FILE (one token per line: the new and the old one during a
// rotation); a bad file keeps the current tokens.
//
// Exit statuses: 0 after a clean shutdown (also one that reached its
// deadline), 1 when a listener fails, 2 for an invalid configuration (the
// message names the variable, e.g. a missing PINBOARD_TOKEN), 143 or 130
// when a second SIGTERM or SIGINT cut the shutdown short.
package pinboard
