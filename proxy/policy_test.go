package proxy

import (
	"errors"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// policyProxy is a proxy for the decision layer's tests: MaxAttempts 3, a
// holder whose lease has 30 s left.
func policyProxy(t *testing.T) (*Proxy, *Session) {
	t.Helper()
	p, err := New(Config{Resolver: noResolver{}, MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	holder := &Session{ID: "s", AdvertiseURL: "http://127.0.0.1:1"}
	holder.SetLeaseEnd(time.Now().Add(30 * time.Second))
	return p, holder
}

// budgetEndpoint is an endpoint whose retry budget holds one retry (full)
// or none.
func budgetEndpoint(t *testing.T, p *Proxy, s *Session, full bool) *endpoint {
	t.Helper()
	cfg := p.cfg.Endpoint
	cfg.RetryBudgetBurst = -1 // none
	if full {
		cfg.RetryBudgetBurst = 1
	}
	ep, err := newEndpoint(&cfg, s, 0)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// Every outcome an engine can report, turned into what happens next: the
// rules both engines follow, in one table.
func TestDecide(t *testing.T) {
	p, holder := policyProxy(t)
	lease := p.unreachableReply(holder) // 503 unreachable, Retry-After 30
	if lease == &p.replies.unreachable {
		t.Fatal("the holder's lease does not show in its 503 unreachable")
	}
	// A GET with no body, first sent on a fresh connection.
	get := outcome{idempotent: true, replayable: true, attempt: 1, holder: holder}
	with := func(o outcome, f func(*outcome)) outcome { f(&o); return o }
	answered := func(o outcome, status int, reason string) outcome {
		o.end, o.status, o.reason = endAnswered, status, reason
		return o
	}
	for _, tc := range []struct {
		name    string
		o       outcome
		budget  bool
		verdict verdict
		refused string
		reply   *reply
		resent  bool
	}{
		// Not sent: the worker provably did not see it.
		{"not sent, pooled connection", with(get, func(o *outcome) { o.reused = true }), true, resend, "", nil, false},
		{"not sent, pooled, a POST", with(get, func(o *outcome) { o.reused, o.idempotent = true, false }), true, resend, "", nil, false},
		{"not sent, pooled, budget spent", with(get, func(o *outcome) { o.reused = true }), false, recheck, wire.ReasonUnreachable, nil, false},
		{"not sent, pooled, body streamed", with(get, func(o *outcome) { o.reused, o.replayable = true, false }), true, answer, wire.ReasonUnreachable, lease, false},
		{"not sent, fresh connection", get, true, recheck, wire.ReasonUnreachable, nil, false},
		{"not sent, last attempt", with(get, func(o *outcome) { o.attempt = 3 }), true, answer, wire.ReasonUnreachable, lease, false},
		{"not sent, pooled, last attempt", with(get, func(o *outcome) { o.reused, o.attempt = true, 3 }), true, answer, wire.ReasonUnreachable, lease, false},

		// No answer: the worker may have processed it.
		{"no answer, GET", with(get, func(o *outcome) { o.end = endNoAnswer }), true, resend, "", nil, true},
		{"no answer, pooled GET", with(get, func(o *outcome) { o.end, o.reused = endNoAnswer, true }), true, resend, "", nil, true},
		{"no answer, GET resent already", with(get, func(o *outcome) { o.end, o.resent = endNoAnswer, true }), true, recheck, wire.ReasonUnreachable, nil, false},
		{"no answer, GET, budget spent", with(get, func(o *outcome) { o.end = endNoAnswer }), false, recheck, wire.ReasonUnreachable, nil, false},
		{"no answer, GET resent, last attempt", with(get, func(o *outcome) { o.end, o.resent, o.attempt = endNoAnswer, true, 3 }), true, answer, wire.ReasonUnreachable, lease, false},
		{"no answer, POST", with(get, func(o *outcome) { o.end, o.idempotent = endNoAnswer, false }), true, answer, "", &p.replies.badGateway, false},
		{"no answer, pooled POST", with(get, func(o *outcome) { o.end, o.idempotent, o.reused = endNoAnswer, false, true }), true, answer, "", &p.replies.badGateway, false},
		{"no answer, PUT with a streamed body", with(get, func(o *outcome) { o.end, o.replayable = endNoAnswer, false }), true, answer, "", &p.replies.badGateway, false},

		// Answers.
		{"200", answered(get, 200, ""), true, relay, "", nil, false},
		{"503 of the application", answered(get, 503, ""), true, relay, "", nil, false},
		{"503 capacity", answered(get, 503, wire.ReasonCapacity), true, relay, "", nil, false},
		{"503 closing", answered(get, 503, wire.ReasonClosing), true, reresolve, wire.ReasonClosing, nil, false},
		{"503 draining", answered(get, 503, wire.ReasonDraining), true, reresolve, wire.ReasonDraining, nil, false},
		{"503 lease", answered(get, 503, wire.ReasonLease), true, reresolve, wire.ReasonLease, nil, false},
		{"503 stale", answered(get, 503, wire.ReasonStale), true, reresolve, wire.ReasonStale, nil, false},
		{"503 closing, a POST", with(answered(get, 503, wire.ReasonClosing), func(o *outcome) { o.idempotent = false }), true, reresolve, wire.ReasonClosing, nil, false},
		{"503 closing, budget spent", answered(get, 503, wire.ReasonClosing), false, relay, wire.ReasonClosing, nil, false},
		// A lease refusal: the refusing session is over there, the request
		// goes elsewhere; the refusing worker's budget is not asked.
		{"503 lease, budget spent", answered(get, 503, wire.ReasonLease), false, reresolve, wire.ReasonLease, nil, false},
		{"503 lease, last attempt", with(answered(get, 503, wire.ReasonLease), func(o *outcome) { o.attempt = 3 }), false, relay, wire.ReasonLease, nil, false},
		{"503 closing, last attempt", with(answered(get, 503, wire.ReasonClosing), func(o *outcome) { o.attempt = 3 }), true, relay, wire.ReasonClosing, nil, false},
		{"503 closing, body streamed", with(answered(get, 503, wire.ReasonClosing), func(o *outcome) { o.replayable = false }), true, relay, wire.ReasonClosing, nil, false},
		{"500 closing", answered(get, 500, wire.ReasonClosing), true, relay, "", nil, false},
		{"403 forbidden", answered(get, 403, wire.ReasonForbidden), true, recheck, wire.ReasonUnreachable, nil, false},
		{"403 forbidden, budget spent", answered(get, 403, wire.ReasonForbidden), false, recheck, wire.ReasonUnreachable, nil, false},
		{"403 forbidden, last attempt", with(answered(get, 403, wire.ReasonForbidden), func(o *outcome) { o.attempt = 3 }), true, answer, wire.ReasonUnreachable, lease, false},
		{"403 forbidden, body streamed", with(answered(get, 403, wire.ReasonForbidden), func(o *outcome) { o.replayable = false }), true, answer, wire.ReasonUnreachable, lease, false},
		{"403 of the application", answered(get, 403, ""), true, relay, "", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := budgetEndpoint(t, p, holder, tc.budget)
			a := p.decide(tc.o, ep)
			if a.verdict != tc.verdict || a.refused != tc.refused || a.reply != tc.reply || a.resent != tc.resent {
				t.Errorf("decide = %+v; want verdict %d, refused %q, reply %p, resent %v", a, tc.verdict, tc.refused, tc.reply, tc.resent)
			}
			// A resend uses up an attempt, but the one after a pooled
			// connection the worker had closed: when a worker dies, every
			// connection of its pool fails at once.
			if wantFree := a.verdict == resend && tc.o.end == endNotSent; a.free != wantFree {
				t.Errorf("decide = %+v: free %v; want %v", a, a.free, wantFree)
			}
		})
	}
}

// A retry takes one from the endpoint's budget; a spent budget is counted.
func TestDecideSpendsTheBudget(t *testing.T) {
	p, holder := policyProxy(t)
	ep := budgetEndpoint(t, p, holder, true)
	o := outcome{end: endAnswered, status: 503, reason: wire.ReasonClosing, idempotent: true, replayable: true, attempt: 1, holder: holder}
	if a := p.decide(o, ep); a.verdict != reresolve {
		t.Fatalf("first 503 closing: %+v; want a re-resolve", a)
	}
	if a := p.decide(o, ep); a.verdict != relay {
		t.Fatalf("second 503 closing: %+v; want the 503 relayed, the budget spent", a)
	}
	if n := p.m.budgetExhausted.Get(); n != 1 {
		t.Errorf("retry_budget_exhausted = %d; want 1", n)
	}
	// No attempt left: the budget is not even asked.
	o.attempt = 3
	if a := p.decide(o, ep); a.verdict != relay || p.m.budgetExhausted.Get() != 1 {
		t.Errorf("last attempt: %+v, exhausted %d; want relay, still 1", a, p.m.budgetExhausted.Get())
	}
}

// enact tells the resolver and counts what decide said.
func TestEnact(t *testing.T) {
	res := &refusals{}
	p, err := New(Config{Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	r := Route{Session: &Session{ID: "s"}}
	p.enact(action{verdict: resend}, []byte("/n/a"), r)
	p.enact(action{verdict: reresolve, refused: wire.ReasonLease}, []byte("/n/a"), r)
	p.enact(action{verdict: answer, reply: &p.replies.badGateway}, []byte("/n/a"), r)
	p.enact(action{verdict: answer, refused: wire.ReasonUnreachable, reply: &p.replies.unreachableIn[7]}, []byte("/n/a"), r)
	p.enact(action{verdict: recheck, refused: wire.ReasonUnreachable}, []byte("/n/a"), r)
	if want := []string{wire.ReasonLease, wire.ReasonUnreachable, wire.ReasonUnreachable}; len(res.reasons) != len(want) ||
		res.reasons[0] != want[0] || res.reasons[1] != want[1] || res.reasons[2] != want[2] {
		t.Errorf("resolver heard %q; want %q", res.reasons, want)
	}
	for name, c := range map[string]uint64{
		"retries": p.m.retries.Get(), "reresolves": p.m.reresolves.Get(),
		"bad_gateway": p.m.badGateway.Get(), "unreachable": p.m.unreachable.Get(),
	} {
		if c != 1 {
			t.Errorf("%s = %d; want 1", name, c)
		}
	}
}

// refusals is a resolver that records the reasons it is told.
type refusals struct {
	noResolver
	reasons []string
}

func (r *refusals) Refused(_ []byte, _ Route, reason string) { r.reasons = append(r.reasons, reason) }

// After a recheck, the request goes to a holder of another session; the
// same session (by id, whatever the pointer), none or an error is 503
// unreachable with the old holder's lease left.
func TestAfterRecheck(t *testing.T) {
	p, holder := policyProxy(t)
	from := Route{Session: holder, Epoch: 3}
	other := Route{Session: &Session{ID: "t"}, Epoch: 4}
	lease := p.unreachableReply(holder)
	for _, tc := range []struct {
		name string
		r    Route
		err  error
		next Route
		rp   *reply
	}{
		{"moved", other, nil, other, nil},
		{"same session", Route{Session: holder, Epoch: 5}, nil, Route{}, lease},
		{"same session id", Route{Session: &Session{ID: "s"}, Epoch: 5}, nil, Route{}, lease},
		{"no session", Route{}, nil, Route{}, lease},
		{"resolve failed", other, errors.New("store down"), Route{}, lease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, rp := p.afterRecheck(from, tc.r, tc.err)
			if next != tc.next || rp != tc.rp {
				t.Errorf("afterRecheck = %+v, %p; want %+v, %p", next, rp, tc.next, tc.rp)
			}
		})
	}
	if r, u := p.m.reresolves.Get(), p.m.unreachable.Get(); r != 1 || u != 4 {
		t.Errorf("reresolves %d, unreachable %d; want 1 and 4", r, u)
	}
}

// Every reason pinned defines is known (and only those), and exactly the
// host's closing, draining, lease and stale make a 503 a refusal to route
// again.
func TestReasons(t *testing.T) {
	refusal := map[string]bool{wire.ReasonClosing: true, wire.ReasonDraining: true, wire.ReasonLease: true, wire.ReasonStale: true}
	for _, r := range []string{wire.ReasonCapacity, wire.ReasonDraining, wire.ReasonClosing, wire.ReasonLease,
		wire.ReasonForbidden, wire.ReasonAborted, wire.ReasonStale, wire.ReasonNoWorker, wire.ReasonUnknownNamespace,
		wire.ReasonUnreachable, wire.ReasonOverloaded, wire.ReasonStore} {
		if got := knownReason([]byte(r)); got != r {
			t.Errorf("knownReason(%q) = %q", r, got)
		}
		if hostRefusal(r) != refusal[r] {
			t.Errorf("hostRefusal(%q) = %v; want %v", r, hostRefusal(r), refusal[r])
		}
	}
	for _, b := range []string{"", "Closing", "closing ", "other"} {
		if got := knownReason([]byte(b)); got != "" {
			t.Errorf("knownReason(%q) = %q; want none", b, got)
		}
	}
}
