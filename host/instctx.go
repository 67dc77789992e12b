package host

import (
	"context"
	"time"
)

// instanceContext is an Instance seen as its context (Instance.Context):
// the same memory, so an instance's context costs no allocation of its own.
// Most instances are idle most of the time and their context is never
// waited on; a context.WithCancel per instance would cost each of them a
// cancelCtx, its cancel function and an entry in the lease's children map
// (≈ 140 B of heap per idle instance, docs/scale.md). Instead the
// instance keeps a cancelled flag, and the standard context (a
// context.WithCancel of the lease) is made on the first call that needs a
// channel or a value: Done, Value, or a context derived from it (which
// calls Done). Err needs neither: it reads the flag and whether the lease's
// Done is closed.
//
// Invariants: once cancel has run, Err is non-nil, and Done (made before or
// after) is closed; Err is non-nil only when cancel has run or the lease
// has ended, and then Done is closed by the time it returns (made after:
// WithCancel of an ended parent, or cancelled on creation).
type instanceContext Instance

var _ context.Context = (*instanceContext)(nil)

// stdContext is the standard context an instance's context is made into.
type stdContext struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// parent is the lease the instance was activated under, or Background.
func (c *instanceContext) parent() context.Context {
	if c.lease != nil {
		return c.lease
	}
	return context.Background()
}

// std returns the standard context, making it on first use.
func (c *instanceContext) std() context.Context {
	if s := c.stdCtx.Load(); s != nil {
		return s.ctx
	}
	ctx, cancel := context.WithCancel(c.parent())
	s := &stdContext{ctx: ctx, cancel: cancel}
	if !c.stdCtx.CompareAndSwap(nil, s) {
		cancel()
		return c.stdCtx.Load().ctx
	}
	// A cancel that ran before the swap did not see s: apply it. (cancel
	// sets the flag before it loads stdCtx, so one of the two sees the
	// other.)
	if c.cancelled.Load() {
		cancel()
	}
	return ctx
}

// cancel cancels the context (Instance.cancel).
func (c *instanceContext) cancel() {
	c.cancelled.Store(true)
	if s := c.stdCtx.Load(); s != nil {
		s.cancel()
	}
}

// Deadline implements context.Context: the lease's (none).
func (c *instanceContext) Deadline() (time.Time, bool) { return c.parent().Deadline() }

// Done implements context.Context.
func (c *instanceContext) Done() <-chan struct{} { return c.std().Done() }

// Err implements context.Context without making the standard context.
func (c *instanceContext) Err() error {
	if s := c.stdCtx.Load(); s != nil {
		return s.ctx.Err()
	}
	if c.cancelled.Load() {
		// Done, if called now, returns a closed channel: std cancels on
		// creation.
		return context.Canceled
	}
	// The lease's end reaches the instance as a child's cancellation
	// would: once the lease's Done is closed. (Its Err is the lease's
	// inline check, which reads the clock: the request path checks the
	// lease itself where it must.)
	if c.lease != nil {
		select {
		case <-c.lease.Done():
			return c.lease.Err()
		default:
		}
	}
	return nil
}

// Value implements context.Context. It makes the standard context, whose
// values are the lease's plus the one context.Cause reads.
func (c *instanceContext) Value(key any) any { return c.std().Value(key) }

// String names the context in logs and panics.
func (c *instanceContext) String() string { return "pinned instance context " + c.id }
