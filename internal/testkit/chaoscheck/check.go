// Package chaoscheck checks the history of a chaos run (internal/testkit/history
// events from every worker process, the client and the nemeses) against
// pinned's guarantees:
//
//  1. At most one live instance per id: no two instances of one id (in
//     different sessions, or the same one) are live at the same time for
//     longer than Config.AllowedOverlap. An instance is live from its
//     activation until its effective end: the earliest of its teardown, the
//     end of its session's lease, and the death of its process.
//  2. No request is served, and no task takes effect, under a session after
//     its lease ended: a request read (Recv) after the end is a violation; a
//     request read before the end and served after it "straddles" (allowed,
//     counted: the worker admitted it in time and a pause held it); a task
//     effect after the end is allowed only right after a pause of its
//     process that covered the end (counted; a timer due during the pause
//     can win the race with the watchdog on resume: an unfenced effect).
//  3. Every instance is aborted when its lease ends: it is torn down (or its
//     process is dead) within Config.AbortGrace of the end, or of the end of
//     a pause of its process across the end.
//  4. With a persisting application (KindStored events: the count the
//     application's store holds per id after the run), no acknowledged
//     increment is lost and nothing is stored that no request explains
//     (see checkStored): the stored count equals the acknowledged
//     increments, up to the task effects and the increments whose outcome
//     the client could not know.
//  5. Every client request is classified: 2xx, 4xx, 503 with Retry-After,
//     502/504 (possibly sent: a request that is not idempotent), 502/504 on
//     an idempotent request (GET, HEAD, OPTIONS: the proxy should have
//     retried it or answered 503; a violation with
//     Config.StrictIdempotent), or a connection error while its pinboard
//     was being killed. Anything else (a client timeout, i.e. a hang; a 5xx
//     without Retry-After other than 502/504; a connection error while the
//     pinboard was up) is a violation. Report.Gateway counts every 502/504
//     by method, status and whether it carried Retry-After.
//
// Checks 5 to 7 are about alarms (alarms.go): alarm runs under a live lease,
// no occurrence run twice outside a fault, no alarm set and never run.
//
//  8. Linearizability (linear.go): the counter history of every id without
//     background effects, as the client saw it (invoke and return times,
//     what each read and increment answered), is linearizable for a model
//     of one counter per id (porcupine); an operation whose outcome the
//     client could not know stays open forever; a check that runs out of
//     Config.LinearTimeout fails.
//
// The end of a session's lease is computed by the checker from raw facts,
// never from what the worker believed: the registration and every heartbeat
// ack report the SEND time of their call and the lease the pinboard granted;
// the lease of session S is valid until max(sent + expires − LeaseBuffer)
// over the acks the worker took in hand before the lease had lapsed (an ack
// handled later renews nothing), and ends earlier when the worker reported
// the loss or its process died. A worker that anchors at receive time, or
// keeps serving past its deadline, serves past this end.
//
// Invariants: Check is a function of its input (its one side effect: the
// visualisations written to Config.VisualizeDir); every violation carries
// enough of the events to find them in the history files; a check that
// cannot decide is a violation, never a pass.
package chaoscheck

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

// Nemesis names the harness writes in history.Event.Nemesis and that the
// checker understands.
const (
	NemesisPause        = "pause"         // Target: worker proc; T..End: stopped
	NemesisKillPinboard = "kill-pinboard" // Target: "pb<N>" (N = Via); T..End: down
)

// Config are the parameters of a check.
type Config struct {
	// LeaseBuffer is the workers' local safety margin (worker.LeaseBuffer).
	LeaseBuffer time.Duration
	// AllowedOverlap is the documented window during which two instances
	// of one id may both be live. 0: none.
	AllowedOverlap time.Duration
	// Tolerance absorbs the conversion of Go's clock to the shared clock
	// (microseconds in practice). Default 2 ms.
	Tolerance time.Duration
	// EffectGrace is how soon after a pause's end a task effect past its
	// lease is counted as the pause race (see the package doc). Default 1 s.
	EffectGrace time.Duration
	// AbortGrace bounds how long after its session's lease ended an
	// instance may still exist (the worker's selfAbort must abort it) before it is a
	// violation, counted from the end of a pause across the lease end.
	// Default 5 s.
	AbortGrace time.Duration
	// ClientTimeout is the client's bound on one request (reported only).
	ClientTimeout time.Duration
	// StrictIdempotent makes a 502 or 504 answer to an idempotent request
	// (GET, HEAD, OPTIONS) a violation: a request that failed before any
	// response byte and is safe to repeat must be retried by the proxy or
	// answered 503 + Retry-After. Off: such answers are counted in their
	// own class.
	StrictIdempotent bool
	// MaxExamples bounds the violations kept per kind. Default 10.
	MaxExamples int
	// DuplicateWindow and PendingWindow tune the alarm checks (alarms.go).
	// Defaults DefaultDuplicateWindow and DefaultPendingWindow.
	DuplicateWindow, PendingWindow time.Duration
	// Volatile says the application keeps its count in memory only, so
	// that the linearizability model (linear.go) resets the count at every
	// activation; false: the count is persisted and survives activations.
	Volatile bool
	// LinearTimeout bounds the linearizability check (linear.go); an id
	// not decided by then is a violation. Default DefaultLinearTimeout.
	LinearTimeout time.Duration
	// VisualizeDir, when set, receives porcupine's HTML visualisation of
	// every id found not linearizable (linear-<id>.html).
	VisualizeDir string
}

// Request classes.
const (
	Class2xx          = "2xx"
	Class4xx          = "4xx"
	Class503RA        = "503+Retry-After"
	ClassPossiblySent = "502/504 (possibly sent)"
	// ClassGatewayIdempotent: a 502/504 to a GET, HEAD or OPTIONS (a
	// violation, ClassGatewayIdempotentV, with Config.StrictIdempotent).
	ClassGatewayIdempotent  = "502/504 on an idempotent request"
	ClassGatewayIdempotentV = "VIOLATION: 502/504 on an idempotent request"
	ClassPinboardDown       = "connection error, pinboard killed"
	ClassHang               = "VIOLATION: no answer within the client timeout"
	Class5xxNoRA            = "VIOLATION: 5xx without Retry-After"
	ClassConnError          = "VIOLATION: connection error, pinboard up"
)

// Violation kinds.
const (
	VOverlap        = "overlap"
	VServedAfter    = "served after the lease ended"
	VEffectAfter    = "task effect after the lease ended"
	VNotAborted     = "instance not aborted after its lease ended"
	VRequest        = "request not answered as required"
	VUnknownSession = "instance of an unknown session"
	VEmpty          = "history too thin to check"
)

// Violation is one broken guarantee.
type Violation struct {
	Kind   string
	Detail string
}

// Report is the result of Check.
type Report struct {
	Workers, Sessions, Instances int
	Served, Straddling           int
	Effects, EffectsAfterPause   int
	Requests                     map[string]int // by class
	// Answers counts the non-2xx answers by "status x-pinned-reason".
	Answers map[string]int
	// Gateway counts the 502 and 504 answers by "METHOD status" and
	// whether they carried Retry-After ("GET 502 Retry-After", "POST 504
	// no Retry-After"): the goal is none for an idempotent method.
	Gateway map[string]int
	// Nemeses counts the faults by kind; one the harness skipped (its
	// Cause starts with "skipped") counts as "<kind> (skipped)".
	Nemeses map[string]int
	// MaxOverlap is the longest time two instances of one id were both
	// live (0 when never), and OverlapID the id.
	MaxOverlap time.Duration
	OverlapID  string
	// Stored compares the stored counts with the acknowledged increments.
	Stored Stored
	// Violations counts every violation by kind; Examples keeps the first
	// MaxExamples of each.
	Violations map[string]int
	Examples   []Violation
	// Alarms is the alarm checks' summary (alarms.go).
	Alarms *AlarmReport
	// Linear is the linearizability check's summary (linear.go).
	Linear *LinearReport
}

// OK reports whether no guarantee was broken.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// String is a human-readable summary.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "workers %d, sessions %d, instances %d, served %d (straddling a lease end: %d), task effects %d (after a pause: %d)\n",
		r.Workers, r.Sessions, r.Instances, r.Served, r.Straddling, r.Effects, r.EffectsAfterPause)
	fmt.Fprintf(&b, "max overlap of two live instances of one id: %v", r.MaxOverlap)
	if r.OverlapID != "" {
		fmt.Fprintf(&b, " (id %s)", r.OverlapID)
	}
	fmt.Fprintf(&b, "\n%s", r.Stored)
	b.WriteString("\nrequests:")
	for _, k := range slices.Sorted(maps.Keys(r.Requests)) {
		fmt.Fprintf(&b, " %s=%d", k, r.Requests[k])
	}
	b.WriteString("\nnon-2xx answers:")
	for _, k := range slices.Sorted(maps.Keys(r.Answers)) {
		fmt.Fprintf(&b, " %q=%d", k, r.Answers[k])
	}
	b.WriteString("\n502/504 by method:")
	for _, k := range slices.Sorted(maps.Keys(r.Gateway)) {
		fmt.Fprintf(&b, " %q=%d", k, r.Gateway[k])
	}
	if r.Alarms != nil {
		b.WriteString("\n" + r.Alarms.String())
	}
	if r.Linear != nil {
		b.WriteString("\n" + r.Linear.String())
	}
	b.WriteString("\nnemeses:")
	for _, k := range slices.Sorted(maps.Keys(r.Nemeses)) {
		fmt.Fprintf(&b, " %s=%d", k, r.Nemeses[k])
	}
	if r.OK() {
		b.WriteString("\nPASS: no violation\n")
		return b.String()
	}
	b.WriteString("\nFAIL:")
	for _, k := range slices.Sorted(maps.Keys(r.Violations)) {
		fmt.Fprintf(&b, " %s=%d", k, r.Violations[k])
	}
	b.WriteByte('\n')
	for _, v := range r.Examples {
		fmt.Fprintf(&b, "  %s: %s\n", v.Kind, v.Detail)
	}
	return b.String()
}

type ack struct{ handled, sent, expiresMs int64 }

type session struct {
	id, proc string
	acks     []ack
	lost     int64 // 0: never reported
	end      int64 // computed
}

type instance struct {
	nonce, id, sess, proc string
	start, teardown, end  int64
}

type interval struct{ from, to int64 }

const forever = int64(1<<63 - 1)

// Check checks the events of a run (worker, client and harness events, in
// any order) and returns the report.
func Check(cfg Config, events []history.Event) *Report {
	cfg.Tolerance = cmp.Or(cfg.Tolerance, 2*time.Millisecond)
	cfg.EffectGrace = cmp.Or(cfg.EffectGrace, time.Second)
	cfg.AbortGrace = cmp.Or(cfg.AbortGrace, 5*time.Second)
	cfg.MaxExamples = cmp.Or(cfg.MaxExamples, 10)
	cfg.LinearTimeout = cmp.Or(cfg.LinearTimeout, DefaultLinearTimeout)
	tol := int64(cfg.Tolerance)
	r := &Report{Requests: map[string]int{}, Answers: map[string]int{}, Gateway: map[string]int{}, Nemeses: map[string]int{}, Violations: map[string]int{}}
	kept := map[string]int{}
	violate := func(kind, format string, args ...any) {
		r.Violations[kind]++
		if kept[kind] < cfg.MaxExamples {
			kept[kind]++
			r.Examples = append(r.Examples, Violation{kind, fmt.Sprintf(format, args...)})
		}
	}
	ev := slices.Clone(events)
	slices.SortStableFunc(ev, func(a, b history.Event) int { return cmp.Compare(a.T, b.T) })

	sessions := map[string]*session{}
	sess := func(id, proc string) *session {
		s := sessions[id]
		if s == nil {
			s = &session{id: id, proc: proc}
			sessions[id] = s
		}
		return s
	}
	procEnd := map[string]int64{}
	procs := map[string]bool{}
	pauses := map[string][]interval{}
	pbDown := map[int][]interval{}
	instances := map[string]*instance{}
	var serves, effects, requests, alarmRuns []history.Event
	stored := map[string]int64{}

	for _, e := range ev {
		switch e.Kind {
		case history.KindStart:
			procs[e.Proc] = true
		case history.KindLease:
			s := sess(e.Session, e.Proc)
			s.acks = append(s.acks, ack{handled: e.T, sent: e.Sent, expiresMs: e.ExpiresMs})
		case history.KindLost:
			if s := sess(e.Session, e.Proc); s.lost == 0 {
				s.lost = e.T
			}
		case history.KindExit:
			if _, ok := procEnd[e.Proc]; !ok {
				procEnd[e.Proc] = e.T
			}
		case history.KindActivate:
			instances[e.Inst] = &instance{nonce: e.Inst, id: e.ID, sess: e.Session, proc: e.Proc, start: e.T, teardown: forever}
		case history.KindTeardown:
			if in := instances[e.Inst]; in != nil {
				in.teardown = e.T
			}
		case history.KindServe:
			serves = append(serves, e)
		case history.KindEffect:
			effects = append(effects, e)
		case history.KindAlarm:
			alarmRuns = append(alarmRuns, e)
		case history.KindRequest:
			requests = append(requests, e)
		case history.KindStored:
			stored[e.ID] = e.Count
		case history.KindNemesis:
			if strings.HasPrefix(e.Cause, "skipped") {
				r.Nemeses[e.Nemesis+" (skipped)"]++
				continue // nothing was done
			}
			r.Nemeses[e.Nemesis]++
			switch e.Nemesis {
			case NemesisPause:
				pauses[e.Target] = append(pauses[e.Target], interval{e.T, cmp.Or(e.End, forever)})
			case NemesisKillPinboard:
				var n int
				if _, err := fmt.Sscanf(e.Target, "pb%d", &n); err == nil {
					pbDown[n] = append(pbDown[n], interval{e.T, cmp.Or(e.End, forever)})
				}
			}
		}
	}
	r.Workers, r.Sessions, r.Instances = len(procs), len(sessions), len(instances)

	// 1. The end of every session's lease, from raw facts.
	buffer := int64(cfg.LeaseBuffer)
	for _, s := range sessions {
		valid := int64(-1 << 62)
		started := false
		for _, a := range s.acks { // in handling order
			if started && a.handled > valid+tol {
				continue // handled after the lease lapsed: renews nothing
			}
			started = true
			valid = max(valid, a.sent+a.expiresMs*int64(time.Millisecond)-buffer)
		}
		s.end = valid
		if !started {
			s.end = forever // no ack seen: an instance under it is reported below
		}
		if s.lost != 0 {
			s.end = min(s.end, s.lost)
		}
		if pe, ok := procEnd[s.proc]; ok {
			s.end = min(s.end, pe)
		}
	}
	endOf := func(sid string) (int64, bool) {
		s := sessions[sid]
		if s == nil || len(s.acks) == 0 {
			return 0, false
		}
		return s.end, true
	}

	// 2. Instances and their overlap per id.
	byID := map[string][]*instance{}
	for _, in := range instances {
		in.end = in.teardown
		if se, ok := endOf(in.sess); ok {
			in.end = min(in.end, se)
		} else {
			violate(VUnknownSession, "instance %s of id %s activated under session %q, which no lease event names", in.nonce, in.id, in.sess)
		}
		if pe, ok := procEnd[in.proc]; ok {
			in.end = min(in.end, pe)
		}
		byID[in.id] = append(byID[in.id], in)
	}
	// Every instance is gone (torn down, or its process dead) within
	// AbortGrace of its session's end, or of the end of a pause across it.
	last := int64(0)
	if len(ev) > 0 {
		last = ev[len(ev)-1].T
	}
	for _, in := range instances {
		se, ok := endOf(in.sess)
		if !ok || se == forever || in.start > se {
			continue
		}
		bound := se + int64(cfg.AbortGrace)
		for _, p := range pauses[in.proc] {
			if p.from <= se && p.to >= se-tol {
				bound = max(bound, p.to+int64(cfg.AbortGrace))
			}
		}
		gone := in.teardown
		if pe, ok := procEnd[in.proc]; ok {
			gone = min(gone, pe)
		}
		if gone > bound && bound < last {
			violate(VNotAborted, "id %s: instance %s (session %s, %s) still existed %v after its lease ended",
				in.id, in.nonce, in.sess, in.proc, time.Duration(min(gone, last)-se))
		}
	}

	allowed := int64(cfg.AllowedOverlap) + tol
	for id, list := range byID {
		slices.SortFunc(list, func(a, b *instance) int { return cmp.Compare(a.start, b.start) })
		for i, a := range list {
			for _, b := range list[i+1:] {
				if b.start >= a.end {
					continue
				}
				ov := min(a.end, b.end) - b.start
				if ov <= 0 {
					continue
				}
				if d := time.Duration(ov); d > r.MaxOverlap {
					r.MaxOverlap, r.OverlapID = d, id
				}
				if ov > allowed {
					violate(VOverlap, "id %s: instance %s (session %s, %s) and %s (session %s, %s) both live for %v",
						id, a.nonce, a.sess, a.proc, b.nonce, b.sess, b.proc, time.Duration(ov))
				}
			}
		}
	}

	// 3. Requests served and effects under ended leases.
	sessionOf := func(e history.Event) string {
		if in := instances[e.Inst]; in != nil && in.sess != "" {
			return in.sess
		}
		return e.Session
	}
	for _, e := range serves {
		r.Served++
		end, ok := endOf(sessionOf(e))
		if !ok {
			violate(VUnknownSession, "request for id %s served by instance %s under session %q, which no lease event names", e.ID, e.Inst, e.Session)
			continue
		}
		recv := cmp.Or(e.Recv, e.T)
		switch {
		case recv > end+tol:
			violate(VServedAfter, "id %s: instance %s (session %s, %s) served a request read %v after the lease ended",
				e.ID, e.Inst, sessionOf(e), e.Proc, time.Duration(recv-end))
		case e.T > end+tol:
			r.Straddling++
		}
	}
	for _, e := range effects {
		r.Effects++
		end, ok := endOf(sessionOf(e))
		if !ok || e.T <= end+tol {
			continue
		}
		if pausedAcross(pauses[e.Proc], end, e.T, int64(cfg.EffectGrace)) {
			r.EffectsAfterPause++
			continue
		}
		violate(VEffectAfter, "id %s: instance %s (session %s, %s) took a task effect %v after the lease ended",
			e.ID, e.Inst, sessionOf(e), e.Proc, time.Duration(e.T-end))
	}

	// 4. Stored counts.
	// An alarm run adds one to the stored count too (the counter's Alarm
	// handler stores like an increment), logged before its write.
	checkStored(r, stored, requests, slices.Concat(effects, alarmRuns), violate)

	// 5. Client requests.
	for _, e := range requests {
		c := classify(e, pbDown[e.Via], cfg.StrictIdempotent)
		r.Requests[c]++
		if e.Err == "" && (e.Status < 200 || e.Status >= 300) {
			r.Answers[strings.TrimSpace(fmt.Sprintf("%d %s", e.Status, e.Reason))]++
		}
		if e.Err == "" && (e.Status == 502 || e.Status == 504) {
			ra := "no Retry-After"
			if e.RetryAfter {
				ra = "Retry-After"
			}
			r.Gateway[fmt.Sprintf("%s %d %s", method(e.Op), e.Status, ra)]++
		}
		if strings.HasPrefix(c, "VIOLATION") {
			violate(VRequest, "%s %s via pb%d at %d: status %d, reason %q, Retry-After %v, error %q, after %v: %s",
				e.Op, e.ID, e.Via, e.T, e.Status, e.Reason, e.RetryAfter, e.Err, time.Duration(e.End-e.T), c)
		}
	}

	// 5-7. Alarms.
	r.Alarms = checkAlarms(cfg, ev, violate, endOf, sessionOf, pauses)

	// 8. Linearizability of every id's counter.
	r.Linear = checkLinear(cfg, ev, violate)

	if r.Served == 0 || len(sessions) == 0 {
		violate(VEmpty, "%d requests served, %d sessions: the run did not exercise the system", r.Served, len(sessions))
	}
	return r
}

// pausedAcross reports whether one of the pauses began by end and ended
// no more than grace before t. t may precede the pause's recorded end: the
// harness stamps the end after SIGCONT returns, when the resumed process
// may already have acted.
func pausedAcross(pauses []interval, end, t, grace int64) bool {
	for _, p := range pauses {
		if p.from <= end && p.from <= t && t-p.to <= grace {
			return true
		}
	}
	return false
}

// method is the HTTP method of a request event's Op ("GET /").
func method(op string) string {
	m, _, _ := strings.Cut(op, " ")
	return m
}

// idempotent reports whether a method is safe to repeat for the proxy:
// GET, HEAD and OPTIONS.
func idempotent(m string) bool { return m == "GET" || m == "HEAD" || m == "OPTIONS" }

// classify puts one client request in its class.
func classify(e history.Event, down []interval, strict bool) string {
	if e.Err != "" {
		if e.Err == "timeout" {
			return ClassHang
		}
		for _, d := range down {
			if e.T <= d.to && e.End >= d.from {
				return ClassPinboardDown
			}
		}
		return ClassConnError
	}
	switch s := e.Status; {
	case s >= 200 && s < 300:
		return Class2xx
	case s >= 400 && s < 500:
		return Class4xx
	case s == 503 && e.RetryAfter:
		return Class503RA
	case (s == 502 || s == 504) && idempotent(method(e.Op)):
		if strict {
			return ClassGatewayIdempotentV
		}
		return ClassGatewayIdempotent
	case s == 502 || s == 504:
		return ClassPossiblySent
	default:
		return Class5xxNoRA
	}
}
