package host

import (
	"context"
	"time"
)

// Worker is the fleet registration a host serves under; *worker.Worker
// implements it. A host whose Config.Worker is nil runs in local mode.
//
// The dependency points one way: package worker imports host (for
// Attached), host never imports worker.
type Worker interface {
	// Attach is called once by New with the host being created. The worker
	// reports the host's headroom in its heartbeats and calls AbortAll and
	// CloseIdle on lease loss, reregistration and wind-down. detach lets go
	// of the host: Close calls it once, after every instance has closed, and
	// the worker stops driving the host.
	Attach(h Attached) (detach func(), err error)
	// Admit checks one data-plane request inline, before it activates or
	// reaches an instance (a watchdog alone is not enough to fence). secret
	// is the value of wire.HeaderProxySecret and session the value of
	// wire.HeaderSession (nil when absent: the request is served under the
	// current session). On success it returns the current lease's context
	// and "". Otherwise it returns nil and wire.ReasonForbidden (answer 403)
	// or wire.ReasonLease (answer 503). Admit must not allocate.
	//
	// The lease context is the lease; the host relies on it alone:
	//   - every call under one lease returns the same context value: the host
	//     compares it with == to the lease an instance was activated under
	//     and refuses (503 closing, and aborts the instance) on a mismatch;
	//   - it is cancelled when the lease ends (lost, or its local deadline
	//     passed), and instance contexts derive from it, so that ends them
	//     all;
	//   - its Err is the inline check: from the lease's local deadline on,
	//     Err is non-nil when called (Done closed by then), whether or not
	//     a timer of the worker has fired. Instance.Do calls it before every
	//     effect, so a task timer firing after the lease ran out (a late
	//     watchdog, a paused process) takes no effect. Err must be cheap,
	//     safe for concurrent use, and must not allocate.
	Admit(secret, session []byte) (lease context.Context, reason string)
	// Draining reports whether new activations are refused (drain or
	// wind_down in progress). The host calls it, with no lock held, before
	// each activation; it must be cheap.
	Draining() bool
	// Release tells the pinboard that the instance (namespace, id),
	// activated under epoch (0: its request carried none), has closed, so
	// that the pinboard deletes the placement of that epoch (and no newer
	// one). It returns when the pinboard acknowledged it, when its bounded
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
	Release(ctx context.Context, namespace, id string, epoch uint64) error
	// LeaseLength is the length of the lease the pinboard grants the
	// worker's sessions (0 before the first registration). A pinboard routes
	// from a cached placement for at most that long after Redis last
	// confirmed it, so the host remembers released epochs for at least
	// three times as long (Config.StaleRouteWindow is the floor). It must be
	// cheap.
	LeaseLength() time.Duration
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
	// Evict force-ends the instance of id, if there is one (abort
	// semantics: its context and tasks are cancelled, teardown runs once,
	// then the placement is released as for any closed instance), with
	// the given eviction reason, without waiting for its teardown. It
	// reports whether there was one. Like AbortAll it never calls back
	// into the Worker synchronously.
	Evict(id, reason string) bool
}
