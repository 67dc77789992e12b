// Package host runs durable objects on a fasthttp server: for every id of a
// namespace at most one live instance of the application's object type
// exists in this process, activated by the first request for the id and
// ended by idleness, abort, the worker (drain, wind-down, lease loss) or
// Close.
//
// docs/objects.md is the guide: mounting (Wrap, Register, Handler), ids,
// the lifecycle of an instance, the statuses the host makes, fleet mode,
// epochs and request bodies; docs/alarms.md covers alarms (SetAlarm,
// DeleteAlarm, Alarms, Type.Alarm). This doc states what the package
// guarantees.
//
// # Turns
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
//     and concurrent routes use it to touch the object. An alarm handler
//     runs inside the turn like a non-concurrent handler.
//   - Teardown runs inside the turn, after every handler, stream, websocket
//     and task of the instance has returned.
//   - Handlers of concurrent routes (Routes.Concurrent), websocket handlers
//     and tasks hold no turn and run alongside everything else; they must
//     synchronise access to the object themselves (Do, or their own locks).
//   - New (setup) runs before any handler and happens-before all of them.
//
// Turns are not reentrant: calling Do while holding the turn deadlocks.
//
// # Invariants
//
//   - The directory is sharded by a hash of the id; every state change of
//     an instance (state, activity, idle list, streams and sockets) happens
//     under its shard's mutex, and no lock is shared by all requests.
//   - The shard lock is never held while calling application code, the
//     Worker, or anything that blocks; Worker methods are called with no
//     host lock held.
//   - An instance with activity (in-flight requests, open streams and
//     websockets, running tasks) is never closed for idleness. Teardown
//     runs exactly once, after the instance's last handler, stream,
//     websocket and task; then its context is cancelled and, in fleet mode,
//     Worker.Release runs (naming its epoch), unless a newer epoch
//     superseded it; it leaves the directory only after that. In fleet mode
//     a closing id is never re-activated here while its release is in
//     flight (503 closing).
//   - Fleet mode: every request passes Worker.Admit, and the host relies on
//     the lease context Admit returns alone: instance contexts derive from
//     it, Instance.Do checks its Err inline before every effect, and a
//     request whose lease is not its instance's aborts that instance.
//   - Epochs (fleet mode, the x-pinned-epoch of the request): no request is
//     served by a live instance with a newer epoch than its own (503 stale,
//     the instance untouched); a newer one aborts the live instance, which
//     closes without Worker.Release, and activates under its epoch; no
//     instance is activated for an epoch at or below that of an instance of
//     the id that closed here within the stale-route window. The
//     stale-route check and the insertion of a new instance happen under one
//     shard lock, and so do the removal of a closed instance and the record
//     of its epoch. In local mode the host allocates epochs
//     (wire.NextEpoch), increasing across its ids and restarts.
//   - A GET to an active instance allocates nothing in this package (a
//     test enforces it, without -race); only Register's router adds
//     allocations.
//   - Every goroutine the host starts (sweeper, closers, tasks, the local
//     alarm loop and its deliveries) is waited for by Close; the alarm loop
//     stops first, so no local alarm runs once Close has begun. Stream steps
//     run on fasthttp's connection goroutines and websocket handlers on its
//     hijack goroutines, which the host never outlives: their activity
//     keeps Close waiting. Every teardown has run when Close returns.
//   - Every 503 the host makes carries Retry-After and X-Pinned-Reason;
//     every error body is a JSON wire.Error.
//   - Metrics live on the host's metrics.Set; the namespace label is
//     escaped.
//   - Without the pinned_spans build tag the host adds no field to an
//     answer; with it (spans_on.go, for bench -trace-slow) a request that
//     carries Trace-Seq is answered with Trace-Worker as well.
//
// What callers must not assume: that an instance survives (memory is
// ephemeral; anything that must survive goes to the application's own
// store before the response that claims it); that Ctx, Param strings or
// request buffers outlive the handler (or the stream); that Do is
// reentrant; that teardown runs for an instance whose setup failed.
package host
