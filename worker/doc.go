// Package worker is one application process's registration with the
// pinboard: it proves its advertise URL, holds a lease through heartbeats,
// fences the hosts attached to it when the lease is lost, relays drain and
// wind_down, and releases placements. *Worker implements host.Worker (and
// host.AlarmStore); several hosts (one per namespace) share one worker.
//
// docs/worker.md is the guide: wiring, the lease's arithmetic, the timing of
// heartbeats and retries, drain and wind_down, evict, release and
// deregistration, alarms. The protocol (calls, bodies, headers, control
// messages) is docs/protocol.md, defined in internal/base/wire. This doc
// states the API of the lease and what the package guarantees.
//
// # The lease
//
// An acknowledged registration or heartbeat extends the lease from the
// SEND time of that call: expires = sent + expiresInMs, local deadline =
// expires − LeaseBuffer (anchorLease), measured with clock.Instant.Sub (a
// machine suspend counts). The lease has one API: a context, plus one
// callback registration.
//
//   - The lease context (as in rueidislock): each session has one; Admit
//     returns it and hosts derive instance contexts from it. It ends when
//     the lease ends, with context.Cause saying why (ErrLeaseExpired,
//     ErrReregister, ErrSuperseded, ErrStopped), and at the latest at the
//     local deadline: its Err checks the clock when called and ends the
//     context itself once the deadline passed, so nobody who asks it ever
//     sees a lease past its end, whatever the loop's timers are doing.
//   - OnLease registers a function called on every registration, renewal
//     and loss (LeaseEvent).
//
// # Fencing: what is guaranteed
//
//   - Admit checks inline, on every request, without locks or allocation:
//     the proxy secret (constant time; otherwise wire.ReasonForbidden), the
//     session header (when present) against the current session, and the
//     lease against the clock right now (leaseValid; otherwise
//     wire.ReasonLease). It does not depend on any timer having fired, so a
//     frozen or suspended process refuses every request the moment it wakes
//     past its deadline.
//   - When the deadline passes without an ack (the loop's watchdog timer, or
//     the loop noticing on any wake-up), or on a 409 reregister or
//     superseded, selfAbort ends the lease context (Admit and Instance.Do
//     refuse from then on), withdraws the lease and calls AbortAll("lease")
//     on every attached host. Only then does the worker register again, with
//     a new session: when the new one starts serving, every instance of the
//     old one has been aborted (its context cancelled; a teardown may still
//     be finishing), and requests routed by the old session's placements are
//     refused (the session header no longer matches).
//   - The worker never re-anchors a lease backwards (acks of older attempts
//     are ignored) and never from a receive time.
//   - Ready is false while unregistered, past the deadline, superseded or
//     stopped; the gauge pinned_registered reads Ready at scrape time.
//   - Drain and wind_down only escalate (none → drain → wind_down, the
//     earliest deadline kept) and are never undone in the life of the
//     process; drain itself aborts nothing.
//   - A release names the worker's current (or last) session, so it never
//     frees a newer session's placement.
//   - Shutdown is bounded by its context's deadline whatever the pinboard
//     does: no call to the pinboard outlasts it.
//   - Shutdown deregisters (the last session, then the sessions a lost
//     lease made it replace) only once every attached host is empty, so no
//     instance of a session it deregisters is still running. Whether or
//     when a release queued during a Shutdown is sent never matters to
//     safety.
//   - HandleChallenge answers a challenge only while its call is in flight
//     and only to a caller presenting the worker's secret, never echoing
//     it; the token and the secret are never logged.
//
// # Concurrency
//
// Admit, Draining, Ready, Session, ExpiresAt, Remaining, Release and
// HandleChallenge are safe for concurrent use at any time. All lease
// transitions happen on the Run goroutine; the lease is an immutable snapshot
// behind an atomic pointer. Registry calls run on goroutines owned by Run,
// which waits for them before returning, and so do wind_down's passes over
// the idle instances (CloseIdle; seconds with a million idle instances):
// the loop never waits for one, so nothing a host walks delays a heartbeat.
// Its other calls into a host are cheap (Headroom, Len, one instance's
// Evict) or fence (AbortAll on a loss or at the wind_down deadline).
// Functions registered with OnLease
// run on the Run goroutine and must return promptly. Attach must happen
// before Run; detach (Host.Close) may happen at any time.
//
// New does no I/O and starts no goroutine. Logs go to Config.Logger tagged
// logger=pinned.worker with the client id and, once registered, the
// session. Metrics (on Config.Metrics) are in docs/metrics.md.
package worker
