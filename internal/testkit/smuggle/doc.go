// Package smuggle holds pinned's request-smuggling and framing tables and a
// raw-socket client to run them: the data-driven core of the security suite
// (docs/proxy.md states the policy). The same tables run against the proxy's server in
// process (package proxy), and against the pinboard (in process and as a
// real binary).
//
//   - Requests: ambiguous or malformed requests. Each must get its Status
//     (400, or 413/431 where that is the precise code), exactly one
//     response, a closed connection, and the backend must see nothing.
//   - Controls: valid requests that resemble refused ones. Each must reach
//     the backend exactly once, with its body.
//   - Responses: a backend's ambiguous or malformed answers. Each must
//     become a 502 with none of the backend's bytes relayed.
//
// Every case targets Namespace ("/counter"), ids "a" and, for requests
// smuggled behind another, "b". Cases are named; each cites the rule or the
// public corpus it comes from (Http11Probe SMUG-*, HAProxy's
// http_transfer_encoding.vtc, HTTP Garden trophies, PortSwigger's
// http-request-smuggler, fasthttp and Go issues).
//
// The tables are built fresh by each call: nothing here is shared or
// mutable. Send dials 127.0.0.1-style addresses only as given; it holds no
// state between calls.
package smuggle
