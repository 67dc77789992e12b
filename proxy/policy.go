package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// This file is the proxy's decision layer: what happens to a request once
// an attempt to send it to a worker has ended, and what the resolver hears
// of it. Both engines, the event loops (loopexchange.go) and the fasthttp
// path (forward.go), describe how the attempt ended as an outcome and do
// what decide returns; only the mechanics (which connection to release, how
// to wait for a resolve) are theirs. Nothing here allocates, blocks or
// takes a lock: decide takes its outcome by value and returns a small
// action.

// attemptEnd is how an attempt to send a request to a worker ended.
type attemptEnd uint8

const (
	// endNotSent: not a byte of the request reached the kernel (the dial
	// failed, or the connection failed before the first byte left): the
	// worker provably did not see it.
	endNotSent attemptEnd = iota
	// endNoAnswer: the request, or some of it, left, and not a byte of an
	// answer came back (an interim 1xx is an answer): the worker closed or
	// reset the connection.
	endNoAnswer
	// endAnswered: a final response head came back.
	endAnswered
)

// outcome is what decide needs to know of an attempt that ended.
type outcome struct {
	end    attemptEnd
	status int    // endAnswered: the worker's status
	reason string // endAnswered: its X-Pinned-Reason, as knownReason spells it
	// reused: the connection had carried a request before (pooled).
	reused bool
	// idempotent: RFC 9110 §9.2.2, or a request of the pinboard's own
	// (Deliver), whose callers accept repeats.
	idempotent bool
	// replayable: no body, or a body held whole: it can be sent again.
	replayable bool
	// resent: the request was sent once more already after no answer.
	resent  bool
	attempt int      // which send this was, from 1
	holder  *Session // the session it was sent to
}

// verdict is what the engine does next.
type verdict uint8

const (
	// relay: the worker's answer goes to the client.
	relay verdict = iota
	// resend: send again, to the same route, on another connection
	// (pinned_proxy_retries_total).
	resend
	// reresolve: the host refused before any application code ran;
	// discard its answer and route the request again
	// (pinned_proxy_reresolves_total).
	reresolve
	// recheck: the worker is unreachable; resolve the name again and send
	// to the new holder if the placement moved (afterRecheck), otherwise
	// answer 503 unreachable.
	recheck
	// answer: the client gets action.reply, one of the proxy's own.
	answer
)

// action is decide's answer.
type action struct {
	verdict verdict
	// refused, when not "", is the reason to report to the resolver
	// (Resolver.Refused) before anything else: the host's, or
	// wire.ReasonUnreachable.
	refused string
	// reply is the proxy's answer for verdict answer.
	reply *reply
	// resent: mark the request as sent once more after no answer.
	resent bool
	// free: the resend does not count as an attempt (MaxAttempts): the
	// request provably reached no one, on a pooled connection the worker had
	// closed. Pooled connections bound how many such resends there can be
	// (the budget still pays for each); the next fresh dial counts.
	free bool
}

// decide turns how an attempt ended into what happens next. A retry of
// either kind (resend, reresolve) needs an attempt left (MaxAttempts) and
// takes one from the retry budget of ep, the endpoint the attempt went to,
// except a re-resolve after a lease refusal (the refusing session is over:
// the request goes elsewhere); a recheck needs an attempt left but no
// budget (the request provably did not reach anyone, or reached a worker
// that is gone); a resend after a pooled connection the worker had closed
// uses up no attempt (action.free).
//
//   - Not sent: on a pooled connection the worker had closed, a request
//     that can be sent again is (resend); otherwise the worker is
//     unreachable.
//   - No answer: a request that is not idempotent, or whose body is not
//     held, may have been processed: 502. An idempotent one is sent once
//     more (resend, marked resent); no answer again and the worker is taken
//     as unreachable.
//   - 503 with the host's reason closing, draining, lease or stale
//     (hostRefusal): the resolver hears of it, and a request that can be
//     sent again is routed again (reresolve); otherwise the 503 is relayed.
//   - 403 forbidden: another process at the session's address; nothing
//     ran: the worker is unreachable.
//   - Any other answer is relayed.
//
// Unreachable: the resolver hears of it (Refused, unreachable); a request
// that can be sent again with an attempt left is rechecked, any other gets
// 503 unreachable, Retry-After the holder's lease left (unreachableReply).
func (p *Proxy) decide(o outcome, ep *endpoint) action {
	switch o.end {
	case endNotSent:
		if o.reused && o.replayable && p.retry(ep, o.attempt) {
			// When a worker dies, every connection in its pool is dead: each
			// fails at once, and none may use up the request's attempts
			// before the dial that finds the worker unreachable.
			return action{verdict: resend, free: true}
		}
		return p.unreachable(o)
	case endNoAnswer:
		if !o.idempotent || !o.replayable {
			return action{verdict: answer, reply: &p.replies.badGateway}
		}
		if !o.resent && p.retry(ep, o.attempt) {
			return action{verdict: resend, resent: true}
		}
		return p.unreachable(o)
	}
	switch {
	case o.status == fasthttp.StatusServiceUnavailable && hostRefusal(o.reason):
		if o.replayable && (o.reason == wire.ReasonLease && o.attempt < p.cfg.MaxAttempts || p.retry(ep, o.attempt)) {
			// A lease refusal costs the refusing worker no budget: its
			// session is over there, so the request goes elsewhere (a frozen
			// worker that wakes past its lease refuses everything queued to
			// it at once, and every one of those requests must reach the new
			// holder).
			return action{verdict: reresolve, refused: o.reason}
		}
		return action{verdict: relay, refused: o.reason}
	case o.status == fasthttp.StatusForbidden && o.reason == wire.ReasonForbidden:
		return p.unreachable(o)
	}
	return action{verdict: relay}
}

// unreachable is decide's answer for a worker that could not be reached.
func (p *Proxy) unreachable(o outcome) action {
	if o.replayable && o.attempt < p.cfg.MaxAttempts {
		return action{verdict: recheck, refused: wire.ReasonUnreachable}
	}
	return action{verdict: answer, refused: wire.ReasonUnreachable, reply: p.unreachableReply(o.holder)}
}

// retry takes one retry from the budget of ep if the request has attempts
// left (pinned_proxy_retry_budget_exhausted_total when the budget is
// spent).
func (p *Proxy) retry(ep *endpoint, attempt int) bool {
	if attempt >= p.cfg.MaxAttempts {
		return false
	}
	if !ep.spend() {
		p.m.budgetExhausted.Inc()
		return false
	}
	return true
}

// enact does what every engine does with a: it reports the refusal to the
// resolver (for name, sent on route) and counts the verdict. The engine
// then does the verdict's mechanics.
func (p *Proxy) enact(a action, name []byte, route Route) {
	if a.refused != "" {
		p.resolver.Refused(name, route, a.refused)
	}
	switch a.verdict {
	case resend:
		p.m.retries.Inc()
	case reresolve:
		p.m.reresolves.Inc()
	case answer:
		p.countFailure(a.reply)
	}
}

// countFailure counts one of the proxy's own answers to a request that was
// routed, by what went wrong.
func (p *Proxy) countFailure(rp *reply) {
	switch {
	case rp == &p.replies.badGateway:
		p.m.badGateway.Inc()
	case rp == &p.replies.timeout:
		p.m.timeouts.Inc()
	case rp == &p.replies.overloaded:
		p.m.overloaded.Inc()
	case rp.reason == wire.ReasonUnreachable:
		p.m.unreachable.Inc()
	}
}

// afterRecheck settles a recheck: the resolver, told that the worker of
// from was unreachable, resolved the name again (r, err). The request goes
// to r when the placement moved to another session (true: a re-resolve);
// otherwise the client gets the returned 503 unreachable, whose Retry-After
// is what is left of from's lease.
func (p *Proxy) afterRecheck(from, r Route, err error) (Route, *reply) {
	if err != nil || r.Session == nil || r.Session.ID == from.Session.ID {
		rp := p.unreachableReply(from.Session)
		p.countFailure(rp)
		return Route{}, rp
	}
	p.m.reresolves.Inc()
	return r, nil
}

// cachedRoute returns the resolver's cached route of name at now: a route
// without a session is a miss.
func (p *Proxy) cachedRoute(name []byte, now time.Time) (Route, bool) {
	r, ok := p.resolver.Lookup(name, now)
	return r, ok && r.Session != nil
}

// unusable is the answer to a request routed to a session whose advertise
// URL the proxy cannot use (err, from the endpoint): the resolver hears of
// it like of an unreachable worker, and the client gets 503 unreachable.
func (p *Proxy) unusable(name []byte, r Route, err error) *reply {
	p.resolver.Refused(name, r, wire.ReasonUnreachable)
	p.m.unreachable.Inc()
	if p.errLog.Allow() {
		p.log.Warn("cannot reach worker", "session", r.Session.ID, "err", err)
	}
	return &p.replies.unreachable
}

// handshakeUnreachable is the answer to a WebSocket handshake whose
// connection to the worker of ep (routed by r) could not be made (err): the
// resolver re-checks the placement on the next request, and the client gets
// 503 unreachable. A handshake is never sent again.
func (p *Proxy) handshakeUnreachable(name []byte, r Route, ep *endpoint, err error) *reply {
	p.resolver.Refused(name, r, wire.ReasonUnreachable)
	p.m.unreachable.Inc()
	if p.errLog.Allow() {
		p.log.Warn("cannot reach worker", "session", ep.id, "addr", ep.addr, "err", err)
	}
	return &p.replies.unreachable
}

// hostRefusal reports whether a worker's 503 with reason was made by the
// host before any application code ran, for a placement that is no longer
// (or not yet) its to serve: the placement is dropped and the request may
// go to the holder a new resolve names.
func hostRefusal(reason string) bool {
	switch reason {
	case wire.ReasonClosing, wire.ReasonDraining, wire.ReasonLease, wire.ReasonStale:
		return true
	}
	return false
}

// knownReason returns the wire constant an X-Pinned-Reason value spells, or
// "" (without allocating).
func knownReason(b []byte) string {
	switch string(b) {
	case wire.ReasonCapacity:
		return wire.ReasonCapacity
	case wire.ReasonDraining:
		return wire.ReasonDraining
	case wire.ReasonClosing:
		return wire.ReasonClosing
	case wire.ReasonLease:
		return wire.ReasonLease
	case wire.ReasonForbidden:
		return wire.ReasonForbidden
	case wire.ReasonAborted:
		return wire.ReasonAborted
	case wire.ReasonStale:
		return wire.ReasonStale
	case wire.ReasonNoWorker:
		return wire.ReasonNoWorker
	case wire.ReasonUnknownNamespace:
		return wire.ReasonUnknownNamespace
	case wire.ReasonUnreachable:
		return wire.ReasonUnreachable
	case wire.ReasonOverloaded:
		return wire.ReasonOverloaded
	case wire.ReasonStore:
		return wire.ReasonStore
	}
	return ""
}

// isIdempotent reports whether a method is idempotent (RFC 9110 §9.2.2).
func isIdempotent(m []byte) bool {
	switch string(m) {
	case fasthttp.MethodGet, fasthttp.MethodHead, fasthttp.MethodOptions, fasthttp.MethodTrace,
		fasthttp.MethodPut, fasthttp.MethodDelete:
		return true
	}
	return false
}
