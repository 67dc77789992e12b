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
//     fleet mode, Worker.Release runs (unless a newer epoch superseded
//     it, see Epochs). The instance leaves the directory
//     only after that.
//   - Abort (Instance.Abort, a handler panic, AbortAll, Evict, Close past
//     its deadline): the instance's context is cancelled (handlers, tasks,
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
// # Alarms
//
// An instance schedules its own future wake-ups: inst.SetAlarm(name, at,
// opts...) sets (or replaces) a named alarm, inst.DeleteAlarm(name) removes
// it, inst.Alarms() lists them (several per instance, at most
// Config.MaxAlarmsPerInstance locally, the pinboard's cap in fleet mode).
// When one is due the type's Alarm handler runs with an *AlarmCtx (name,
// scheduled time, attempt) inside the instance's turn, after the id was
// activated if it was not live, exactly like a request: an evicted instance
// wakes. A handler error (or panic) fails the attempt: it is retried after
// the alarm's backoff (RetryBackoff, doubled each time) up to MaxAttempts,
// then dead-lettered (logged, counted, listed). Every(d) repeats an alarm;
// the missed-tick policy fires once for occurrences that passed undelivered,
// or skips them (SkipMissed). Delivery is at least once: (name, scheduled
// time) identifies an occurrence, so handlers can be idempotent.
//
//   - Fleet mode: the Worker (AlarmStore) stores alarms at the pinboard,
//     which delivers each due one as POST /<ns>/<id>/_pinned/alarm with
//     the worker's secret, the session and the x-pinned-alarm field; the
//     host answers that path only to such admitted requests: 204 when the
//     handler returned nil, 500 when it failed (also when the instance was
//     aborted under it: the outcome is unknown), 404 without an Alarm
//     handler, and its usual 503s when no handler ran (the pinboard retries
//     those without counting an attempt), among them 503 lease when the
//     lease ended while the delivery waited for the turn (checked inline
//     once the turn is held, as Instance.Do does). Alarms survive worker crashes and
//     restarts; see the pinboard's scheduler (internal/pinboard/alarm).
//   - Local mode: the host keeps alarms in memory and delivers them itself
//     through the same path (one loop goroutine started by Start, at most
//     Config.AlarmConcurrency deliveries at once), with the same
//     semantics; they are lost when the process exits. Dead letters:
//     Host.DeadAlarms.
//
// # Statuses the host makes
//
// Every body is a JSON wire.Error. Every 503 carries Retry-After
// (Config.RetryAfter), the application's own (*Error with Status 503)
// included, and the host's carry X-Pinned-Reason:
//
//	400                 invalid id (field "id"); invalid x-pinned-epoch (fleet
//	                    mode, field "X-Pinned-Epoch")
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
//	503 stale           the request's epoch is older than the live instance's,
//	                    or no instance is live and one closed here under that
//	                    epoch or a newer one (fleet mode), or the application
//	                    returned ErrStale; the request had no effect
//	503 aborted         the instance was aborted under the handler: the
//	                    request may have had effects; not retried by the proxy
//	503 lease, store    a handler returned ErrAlarmNotHolder (the directory no
//	                    longer places the id here) or ErrAlarmUnavailable
//
// # Fleet mode
//
// With Config.Worker set, New calls Worker.Attach (Close detaches), and
// every request first passes Worker.Admit (secret and session headers),
// which returns the current lease's context. The host relies on that
// context alone for the lease: an instance remembers the lease it was
// activated under and its context derives from it, so the lease's end
// cancels every instance's context; Instance.Do asks the lease context's
// Err inline before every effect. A request whose lease differs from its
// instance's, or whose instance's lease has ended, is not served by it: the
// instance is aborted and the request answers 503 closing. New activations
// are refused while Worker.Draining.
//
// # Epochs
//
// Every instance has an activation epoch (Instance.Epoch), strictly greater
// than that of every earlier activation of its (namespace, id): the fencing
// token an application passes to its own store, so that a write from an
// instance that has lost its id is refused once a newer activation has
// written (package fence, for Redis). In fleet mode the epoch is the
// placement's, carried by the proxy in x-pinned-epoch (wire.HeaderEpoch) and
// checked on every request, after Admit and without allocating:
//
//   - absent, or equal to the live instance's: served as usual (an instance
//     activated by a request without the header has epoch 0);
//   - older than the live instance's (or than the activation it joined):
//     503 stale, the instance untouched; the proxy re-resolves;
//   - newer: the live instance is stale (the id was placed again, on this
//     worker, since it was activated): it is aborted (eviction reason
//     stale) and, as its placement has already been replaced by the one
//     the request names, closes without Worker.Release (which would delete
//     the new one); the request waits for it to close (bounded by
//     Config.CloseWait) and activates a new instance under its epoch;
//   - no live instance, and an instance of the id closed here under the
//     request's epoch or a newer one within the stale-route window (the
//     larger of Config.StaleRouteWindow and three of the worker's leases):
//     503 stale, nothing activated. That instance released its placement
//     (or was superseded), so the request comes from a pinboard still
//     routing from a cached placement that no longer exists (its Redis
//     link slow or silent, its invalidation on the way), and the id may
//     live on another worker already; activating would run a second
//     instance. A route above every closed epoch activates (the id was
//     placed here again). The rule is internal/base/activation's; the window
//     bounds its memory (about 100 bytes per id closed within it), and a
//     pinboard routes from a cached placement for at most its lease after
//     Redis last confirmed it, so the window outlasts every such route;
//   - malformed: 400.
//
// The stale-route check and the insertion of a new instance happen under
// one shard lock, and so do the removal of a closed instance and the record
// of its epoch: no request sees neither. A request without an epoch is
// unfenced (served, or activating, whatever closed before); the pinboard
// always sends one. Worker.Release names the closed instance's epoch, so a
// release arriving late never deletes a newer placement of the id.
//
// In local mode the header is ignored (no proxy vouches for it) and the
// host allocates epochs itself: wire.NextEpoch of its last one and its
// clock, increasing across its ids and, through the clock floor, across
// restarts of the process. An application that finds itself stale in its
// own store returns ErrStale (see there).
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
//   - Every goroutine the host starts (sweeper, closers, tasks, the local
//     alarm loop and its deliveries) is waited for by Close; the alarm loop
//     stops first, so no local alarm runs once Close has begun. Stream steps run on fasthttp's connection goroutines and
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
