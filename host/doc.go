// Package host runs durable objects on a fasthttp server: for every id of a
// namespace at most one live instance of the application's object type
// exists in this process, activated by the first request for the id and
// ended by idleness, abort, the worker (drain, wind-down, lease loss) or
// Close.
//
// # Using it
//
//	type Counter struct {
//		inst *host.Instance
//		n    int
//	}
//
//	func (c *Counter) get(x *host.Ctx) error { return x.JSON(200, c.n) }
//
//	routes := host.NewRoutes[*Counter]()
//	routes.GET("/", (*Counter).get)         // func(obj *Counter, c *host.Ctx) error
//	routes.POST("/incr", (*Counter).incr)
//	routes.GET("/items/{item}", (*Counter).item) // c.Param("item")
//	routes.WebSocket("/ws", (*Counter).ws)  // func(obj *Counter, ws *host.WebSocket) error
//	routes.Concurrent().GET("/peek", (*Counter).peek)
//
//	h, err := host.New(host.Config{Namespace: "/counter"}, host.Type[*Counter]{
//		New:      func(inst *host.Instance) (*Counter, error) { return &Counter{inst: inst}, nil },
//		Teardown: func(c *Counter) { ... },
//		Routes:   routes,
//	})
//	h.Start()                                    // the idle sweeper
//	server := &fasthttp.Server{Handler: h.Wrap(appRouter.Handler)}
//	err = h.ConfigureServer(server)              // the server's body limit agrees with the host's
//	...
//	h.Close(ctx)                                 // on shutdown
//
// A request for /<namespace>/<id><rest> is served by the instance for id;
// routes match <rest> ("/" when empty). Mount the host with Wrap (zero
// allocations), Register (a fasthttp/router catch-all route) or Handler.
//
// # Ids
//
// The id is the path segment after the namespace, taken raw from the request
// line (URI().PathOriginal()): 1 to Config.MaxIDLen (default 256) bytes of
// A-Za-z0-9._~@:+=- not starting with '.' (wire.CheckSegment). Nothing is
// percent-decoded and any '%' is refused, so "a%2Fb" is a 400, not the id
// "a/b". An invalid id answers 400 with a JSON wire.Error whose field is
// "id". The remainder and parameters are also raw bytes; a handler that
// wants decoded values decodes them itself.
//
// # Concurrency model: turns
//
// Each instance has one turn, a cancellable semaphore. The guarantee:
//
//   - A handler of a non-concurrent route runs only while holding the turn,
//     so at most one such handler of an instance runs at a time, and every
//     write it made to the object happens-before the next turn holder runs.
//     Handlers may therefore use the object's fields without locks.
//   - Each step of a stream generator of a non-concurrent route (the code
//     between two yields, and the code after the last one) also runs inside
//     the turn; between steps, while fasthttp writes to the client, no turn
//     is held. A slow reader therefore delays only its own stream.
//   - Instance.Do runs a function inside the turn: websocket handlers, tasks
//     and concurrent routes use it to touch the object.
//   - Teardown runs inside the turn, after every handler, stream, websocket
//     and task of the instance has returned.
//   - Handlers of concurrent routes (Routes.Concurrent), websocket handlers
//     and tasks hold no turn and run alongside everything else; they must
//     synchronise access to the object themselves (Do, or their own locks).
//   - New (setup) runs before any handler and happens-before all of them.
//
// Turns are not reentrant: calling Do while holding the turn deadlocks.
// Waiters are woken in arrival order; a waiter whose instance is aborted
// gives up and its request answers 503 closing.
//
// # Lifecycle
//
//   - Activation: the first request for an id inserts an "activating"
//     placeholder under the shard lock and runs New outside it; concurrent
//     requests for the id wait for that one setup and share its result. A
//     setup error answers every waiter (500, or the status of an *Error)
//     and leaves no instance.
//   - Activity: in-flight requests, open streams, open websockets and
//     running tasks (Instance.Go) count as activity. An instance with
//     activity is never closed for idleness.
//   - Idle eviction: the sweeper started by Start closes instances idle for
//     Config.IdleTimeout. Each shard keeps its idle instances (activity 0)
//     in a list ordered by idle time; activity 0→1 unlinks, 1→0 appends, and
//     a sweep pops only from the front, so its cost does not depend on the
//     number of busy instances.
//   - Closing: a closing instance takes no new requests, tasks or sockets.
//     Its in-flight requests, streams and tasks may finish; its websockets,
//     which have no natural end, are asked to go away at once (their reads
//     fail and the client gets a 1001 close frame). Once its activity
//     drains, Teardown runs once, inside the turn; then the
//     instance's context is cancelled (if abort did not already) and, in
//     fleet mode, Worker.Release runs. The instance leaves the directory
//     only after that.
//   - Abort (Instance.Abort, a handler panic, AbortAll, Close past its
//     deadline): the instance's context is cancelled (handlers, tasks,
//     stream generators, turn waiters see it), open streams get a write
//     deadline in the past so fasthttp ends them even when the client stopped
//     reading, websocket connections are closed under their handlers; then
//     the close proceeds as above.
//   - A request for a closing id answers 503 closing in fleet mode (the
//     proxy re-resolves; the id is never re-activated here while its release
//     is in flight). In local mode it waits up to Config.CloseWait for the
//     close to finish and then activates a fresh instance.
//   - Capacity: an activation beyond Config.MaxInstances (activating and
//     closing instances count) answers 503 capacity; existing instances keep
//     serving.
//   - Close(ctx): new activations answer 503 closing, every instance closes
//     once idle, and at ctx's deadline the rest are aborted. Every teardown
//     has run when Close returns.
//
// # Statuses the host makes
//
// Every body is a JSON wire.Error. Every 503 carries Retry-After
// (Config.RetryAfter) and X-Pinned-Reason:
//
//	400                 invalid id (field "id")
//	413                 body over Config.MaxRequestBodySize (the host's
//	                    check, or the server ConfigureServer set up, which
//	                    drains the body first so its client reads the 413)
//	403 forbidden       wrong or missing proxy secret (fleet mode)
//	404, 405, 426       no route; route without this method; websocket route without upgrade
//	500                 setup failed, handler error, handler panic
//	503 capacity        MaxInstances reached
//	503 draining        the worker is draining: no new activations
//	503 closing         the instance or the host is closing, or the
//	                    instance belongs to another lease; re-resolve
//	503 lease           no valid lease, or a stale session header (fleet mode)
//	503 aborted         the instance was aborted under the handler: the
//	                    request may have had effects; not retried by the proxy
//
// # Fleet mode
//
// With Config.Worker set, New calls Worker.Attach, and every request first
// passes Worker.Admit (secret and session headers), which returns the
// current lease's context. An instance remembers the lease it was activated
// under and its context derives from it, so lease loss cancels every
// instance's context. A request whose lease differs from its instance's, or
// whose instance's lease has ended, is not served by it: the instance is
// aborted and the request answers 503 closing. New activations are refused
// while Worker.Draining.
//
// # Request bodies
//
// Config.MaxRequestBodySize (default 4 MiB, fasthttp's default) is the
// largest body the host accepts; it is what the worker tells the pinboard
// at registration (Attached.MaxRequestBodySize), so that the pinboard
// refuses a larger body before forwarding it. The fasthttp server must
// agree: ConfigureServer sets its MaxRequestBodySize (or refuses a server
// whose limit is smaller, or that streams bodies, which fasthttp then does
// not bound) and an ErrorHandler that answers a body over the limit with
// 413 and a JSON error after reading and discarding it (at most
// Config.MaxBodyDrain), instead of fasthttp's bare 400 on a connection it
// closes with the body unread (which a client still sending sees as a
// reset).
//
// # Invariants
//
//   - The directory is sharded by a hash of the id; every state change of
//     an instance (state, activity, idle list, streams and sockets) happens
//     under its shard's mutex, and no lock is shared by all requests.
//   - The shard lock is never held while calling application code, the
//     Worker, or anything that blocks; Worker methods are called with no
//     host lock held.
//   - A GET to an active instance allocates nothing in this package (a
//     test enforces it); only Register's router adds allocations.
//   - Every goroutine the host starts (sweeper, closers, tasks) is waited
//     for by Close. Stream steps run on fasthttp's connection goroutines and
//     websocket handlers on its hijack goroutines, which the host never
//     outlives: their activity keeps Close waiting.
//   - Metrics live on the host's metrics.Set; the namespace label is
//     escaped.
//
// What callers must not assume: that an instance survives (memory is
// ephemeral; anything that must survive goes to the application's own
// store before the response that claims it); that Ctx, Param strings or
// request buffers outlive the handler (or the stream); that Do is
// reentrant; that teardown runs for an instance whose setup failed.
package host
