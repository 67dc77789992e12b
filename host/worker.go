package host

import "context"

// Worker is the fleet registration a host serves under; *worker.Worker
// implements it. A host whose Config.Worker is nil runs in local mode.
//
// The dependency points one way: package worker imports host (for
// Attached), host never imports worker.
type Worker interface {
	// Attach is called once by New with the host being created. The worker
	// reports the host's headroom in its heartbeats and calls AbortAll and
	// CloseIdle on lease loss, reregistration and wind-down.
	Attach(h Attached) error
	// Admit checks one data-plane request inline, before it activates or
	// reaches an instance (a watchdog alone is not enough to fence). secret
	// is the value of wire.HeaderProxySecret and session the value of
	// wire.HeaderSession (nil when absent: the request is served under the
	// current session). On success it returns the current lease's context,
	// which is cancelled when the lease is lost or runs out locally, and "".
	// Otherwise it returns nil and wire.ReasonForbidden (answer 403) or
	// wire.ReasonLease (answer 503). Admit must not allocate.
	//
	// Every call under one lease must return the same context value: the
	// host compares it with == to the lease an instance was activated under
	// and refuses (503 closing, and aborts the instance) on a mismatch.
	// Instance contexts derive from it, so cancelling it on lease loss
	// cancels them all.
	Admit(secret, session []byte) (lease context.Context, reason string)
	// Draining reports whether new activations are refused (drain or
	// wind_down in progress). The host calls it, with no lock held, before
	// each activation; it must be cheap.
	Draining() bool
	// Release tells the pinboard that the instance (namespace, id) has
	// closed. It returns when the pinboard acknowledged it, when its bounded
	// retries are exhausted, or when ctx ends. ctx carries the values of the
	// lease context the instance was activated under (not its cancellation),
	// so the worker can name the session that held the placement.
	//
	// The host calls it exactly once per closed instance (never for an
	// activation whose setup failed), after the teardown, from a goroutine
	// of its own with no lock held, bounded by Config.ReleaseTimeout. Until
	// it returns, requests for the id answer 503 closing, so it should
	// return promptly when there is nothing to release (for example after
	// the session that held the placement is gone).
	Release(ctx context.Context, namespace, id string) error
}

// LeaseChecker is implemented by a Worker that can check a lease inline
// outside the request path; *worker.Worker implements it. When the host's
// Worker implements it, Instance.Do (the way tasks, websockets and concurrent
// handlers touch an object's state) checks the lease its instance was
// activated under before running fn and refuses with ErrInstanceClosed when
// it is no longer valid: an effect never depends on the worker's watchdog
// having run (a task timer firing after a lease ran out, whether the
// watchdog is late or the process was paused, takes no effect).
type LeaseChecker interface {
	// LeaseValid reports whether lease (a context Admit returned) is the
	// current lease and still valid on the clock right now. It must be
	// cheap, safe for concurrent use, and must not allocate.
	LeaseValid(lease context.Context) bool
}

// Attached is the view of a host that its Worker drives; *Host implements it.
type Attached interface {
	// Namespace is the host's namespace, "/name".
	Namespace() string
	// Headroom is how many more instances the host can activate now: its
	// MaxInstances minus live instances, never negative.
	Headroom() int
	// Len is the number of live instances (activating and closing included).
	Len() int
	// MaxRequestBodySize is the largest request body the host accepts
	// (Config.MaxRequestBodySize), fixed when the host is created. The
	// worker tells the pinboard the smallest of its hosts' limits when it
	// registers, so the pinboard refuses a larger body before forwarding it.
	MaxRequestBodySize() int
	// AbortAll force-ends every instance (abort semantics: contexts
	// cancelled, teardown once) with the given eviction reason, without
	// waiting for teardowns to finish. It never calls back into the Worker
	// synchronously, so the worker may hold its own lock while calling it.
	AbortAll(reason string)
	// CloseIdle closes every instance that has no in-flight request, open
	// stream or websocket, or running task, with the given eviction reason.
	CloseIdle(reason string)
}
