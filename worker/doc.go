// Package worker is one application process's registration with the
// pinboard: it proves its advertise URL, holds a lease through heartbeats,
// fences the hosts attached to it when the lease is lost, relays drain and
// wind_down, and releases placements. *Worker implements host.Worker; several
// hosts (one per namespace) share one worker. The protocol (calls, bodies,
// headers, control messages) is docs/protocol.md, defined in internal/base/wire.
//
// # Wiring
//
//	w, err := worker.New(worker.Config{PinboardURL: ..., AdvertiseURL: ..., Token: ...})
//	h, err := host.New(host.Config{..., Worker: w})   // calls w.Attach(h); h.Close detaches
//	w.Mount(r)                                         // GET /_pinned/challenge next to the hosts
//	go w.Run(ctx)                                      // register, heartbeat, fence
//	... readiness probe: w.Ready(); SIGTERM: w.Shutdown(ctx)
//
// Run's context is the hard stop (everything is aborted when it ends); on
// SIGTERM call Shutdown, which drains first and then makes Run return.
//
// # The lease
//
// Every registration and every heartbeat is a call sent at a known instant
// on Config.Clock. When the pinboard acknowledges it with expiresInMs, the
// lease becomes
//
//	expires  = send time + expiresInMs    (ExpiresAt: when the pinboard may re-place our ids)
//	deadline = expires − LeaseBuffer      (when this worker stops serving)
//
// anchored at the SEND time of the acknowledged call (anchorLease), never at
// the time the answer arrived. Elapsed time is measured with
// clock.Instant.Sub, the larger of monotonic and wall elapsed time, so a
// machine suspend counts. Acks of older attempts never move the anchor back.
//
// The lease has one API: a context, plus one callback registration.
//
//   - The lease context (as in rueidislock): each session has one; Admit
//     returns it and hosts derive instance contexts from it. It ends when
//     the lease ends, with context.Cause saying why (ErrLeaseExpired,
//     ErrReregister, ErrSuperseded, ErrStopped), and at the latest at the
//     local deadline: its Err checks the clock when called and ends the
//     context itself once the deadline passed, so nobody who asks it ever
//     sees a lease past its end, whatever the loop's timers are doing. It
//     reports no Deadline (the local deadline moves with every renewal;
//     Remaining and ExpiresAt report it).
//   - OnLease registers a function called on every registration, renewal
//     and loss (LeaseEvent: the session, its lease context, the send time
//     of the acknowledged call, the granted lease, the cause).
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
//     on every attached host. Only then does the worker register again, with a new
//     session: when the new one starts serving, every instance of the old one
//     has been aborted (its context cancelled; a teardown may still be
//     finishing), and requests routed by the old session's placements are
//     refused (the session header no longer matches).
//   - Ready is false while unregistered, past the deadline, superseded or
//     stopped; the gauge pinned_registered reads Ready at scrape time.
//   - What is not guaranteed: mutual exclusion against a process paused
//     between Admit and its write to storage (Kleppmann): the window is
//     bounded by the lease, and the session id is the fencing token a
//     storage layer can check.
//
// # Timing
//
// Heartbeats go every HeartbeatInterval (3 s) after the last acked send. A
// heartbeat that is not acknowledged within RetryInterval (0.5 s) — it failed,
// was lost, or is slow — is followed by another one (the first stays in flight
// and still counts when its ack arrives), every RetryInterval until an ack
// arrives or the deadline passes, with at most 8 calls in flight. With the
// defaults (lease 10 s, buffer 5 s) four attempts fit before the deadline,
// so one lost heartbeat never costs the lease. New and every ack with a new
// lease length validate this with CheckTiming (buffer < lease, at least
// MinHeartbeatAttempts attempts); an unworkable lease from the pinboard ends
// Run with an ErrBadTiming error.
//
// Registration failures are retried after a "full jitter" delay, uniform in
// [0, min(BackoffMax, BackoffBase·2^(n−1))] after the n-th consecutive
// failure (BackoffMax 30 s). A 401 is logged as an error (the token is wrong)
// and retried like any failure. Only a superseded NACK stops the loop: Run
// returns ErrSuperseded.
//
// Every registration and heartbeat carries a fresh challenge pair (128-bit
// values from crypto/rand). HandleChallenge answers a challenge only while
// its call is in flight and only to a caller presenting the worker's secret.
//
// # Drain and wind_down
//
// Control messages arrive in heartbeat acks (queued by POST /registry/push)
// and Shutdown starts the same states locally. The state only escalates:
// none → drain → wind_down; a deadline (unix ms) is kept when it is the
// earliest seen. Neither is ever undone in the life of the process; a
// re-registration reports it too.
//
//   - drain: Draining() is true, so hosts answer new activations 503 +
//     x-pinned-reason: draining; existing instances and requests keep serving
//     and go away by idle eviction; heartbeats and registrations report
//     draining, the deadline as drainDeadline, and headroom 0. Nothing is
//     aborted by drain itself, at its deadline or ever.
//   - wind_down: drain, plus CloseIdle("wind_down") on every host at once and
//     again on every heartbeat tick (instances close as they go idle), plus
//     AbortAll("wind_down") when the deadline passes (none without deadline).
//
// "drain complete" is logged once every host is empty.
//
// # Evict
//
// An evict message (DELETE /registry/placements/{namespace}/{id} on the
// pinboard) names one instance: the host of its namespace aborts it
// (Attached.Evict, reason "evict": context and tasks cancelled, teardown
// once, then the usual release), so the next request for the id activates
// a fresh instance. It takes effect when the ack carrying it arrives, so
// within a heartbeat interval of the call plus the instance's close. An id
// with no live instance here needs nothing; the worker does not drain.
//
// # Release and deregistration
//
// Release names the session the pinboard must compare against: the current
// one, or the last one held while the worker is between sessions. The
// pinboard frees a placement only while that session holds it, so a late
// release (a slow teardown, retries) can never delete the placement of a
// newer session. (The host does not say which session an instance ran
// under; an instance of an older session released after a newer one
// registered compares against the newer one and frees nothing: its
// placement goes when the old session expires.)
//
// Shutdown ends with POST /registry/deregister for the last session, once
// Run has sent its final heartbeat and every host is empty, so the pinboard
// drops the session at once instead of a lease later. It is skipped (and
// counted) while aborted instances are still tearing down, and once
// Shutdown's deadline has passed.
//
// Shutdown is bounded by its context's deadline whatever the pinboard does:
// from the moment it is called no call to the pinboard (heartbeat, the final
// one included, release, deregistration) outlasts that deadline, and when
// the context ends the connections to the pinboard are closed, failing the
// calls in flight, and the releases still retrying give up. A pinboard that
// is gone or frozen thus costs the releases (the ids stay placed until the
// session expires), never the bound.
//
// # Alarms
//
// *Worker implements host.AlarmStore: in fleet mode a host's
// Instance.SetAlarm, DeleteAlarm and Alarms become POST
// /registry/alarms/{set,delete,list} naming the session of the instance's
// lease (SessionOf), and the pinboard accepts them only while that session
// holds the id's placement (409 otherwise: host.ErrAlarmNotHolder, which a
// handler turns into 503 lease). Transport errors, 5xx and 429 are retried
// within the caller's context (host.Config AlarmTimeout) after 100 ms
// doubling to 1 s, then host.ErrAlarmUnavailable (503 store); other refusals
// return at once (ErrAlarmRefused, host.ErrTooManyAlarms). The pinboard delivers due
// alarms to the worker holding the id like any proxied request; Admit
// checks them the same way.
//
// # Concurrency
//
// Admit, Draining, Ready, Session, ExpiresAt, Remaining, Release and
// HandleChallenge are safe for concurrent use at any time. All lease
// transitions happen on the Run goroutine; the lease is an immutable snapshot
// behind an atomic pointer. Registry calls run on goroutines owned by Run,
// which waits for them before returning. Functions registered with OnLease
// run on the Run goroutine and must return promptly. Attach must happen
// before Run; detach (Host.Close) may happen at any time.
//
// New does no I/O and starts no goroutine. Logs go to Config.Logger tagged
// logger=pinned.worker with the client id and, once registered, the
// session; the token and the secret are never logged.
//
// # Metrics (on Config.Metrics)
//
//	pinned_registered                          1 while Ready
//	pinned_lease_remaining_seconds             Remaining
//	pinned_draining                            1 while Draining
//	pinned_heartbeats_total{result}            ok, late, failed, unauthorized, reregister, superseded
//	pinned_registrations_total{result}         ok, failed, unauthorized
//	pinned_releases_total{result}              ok, failed, unauthorized, gave_up
//	pinned_deregistrations_total{result}       ok, failed, unauthorized, skipped
//	pinned_lease_lost_total{reason}            expired, reregister, superseded, stopped, bad_timing
//	pinned_alarm_calls_total{result}           ok, refused, failed, unauthorized
package worker
