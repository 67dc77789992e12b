package chaoscheck

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

// Linearizability (check 8): the counter history of every id, as the
// client saw it, must be linearizable (porcupine, the kind of check
// Jepsen's Knossos makes), partitioned by id.
//
// The model is one counter per id, starting at 0:
//
//   - GET / answered 2xx reads the count: it must equal the state;
//   - POST /incr answered 2xx adds one and returns the new count: it must
//     equal the state + 1;
//   - a POST /incr whose outcome the client cannot know (no answer, a
//     timeout, a connection error, 502/504, any 5xx but a 503 whose
//     x-pinned-reason promises no effect: see noEffect) adds one with an
//     unknown answer, and never returns (its return time is +∞): it may
//     take effect at any point after it was sent, or never (linearized
//     after everything else);
//   - a request refused with no effect (4xx, 503 with a no-effect reason)
//     and a read that was not answered 2xx are dropped: nothing ran;
//   - with Config.Volatile (the application keeps the count in memory
//     only), every activation of the id (KindActivate) resets the count to
//     0, at the time the worker logged it (the new instance serves nothing
//     before; the old one served nothing after its teardown, which precedes
//     the release and so the new placement). Without it (the count
//     persisted, fenced by the epoch) an activation changes nothing: the
//     new instance loads the stored count.
//
// Background effects (POST /incr-later tasks, alarms) change the count at
// times the client does not see; rather than model them, the check keeps
// every id that had one (a request other than GET / and POST /incr, or an
// effect or alarm run in the workers' history) out of the checked set: the
// harness keeps a share of its ids to the two plain operations.
//
// A violation names the id, the instances that answered it (the
// "instance" values of the responses, with their workers and epochs and
// when each answered first and last), the operations leading to the point
// where no linearization goes further, and porcupine's HTML visualisation
// (written to Config.VisualizeDir when set). A check that runs out of
// Config.LinearTimeout is a violation too (VLinearUnknown), never a pass.

// Linearizability violation kinds.
const (
	VNotLinearizable = "counter history not linearizable"
	VLinearUnknown   = "linearizability not decided within the time bound"
)

// DefaultLinearTimeout bounds the linearizability check of a whole history.
const DefaultLinearTimeout = 3 * time.Minute

// LinearReport summarises the linearizability check.
type LinearReport struct {
	// IDs were checked; Excluded had background effects (see above).
	IDs, Excluded int
	// Ops is the number of operations checked, Open those of them with an
	// unknown outcome, Resets the activations modelled as resets
	// (Config.Volatile).
	Ops, Open, Resets int
	// Illegal and Unknown count the ids found not linearizable and those
	// not decided in time.
	Illegal, Unknown int
	// Elapsed is the time the check took.
	Elapsed time.Duration
	// Files are the visualisations written.
	Files []string
}

func (l *LinearReport) String() string {
	s := fmt.Sprintf("linearizability: %d ids checked (%d ops, %d with an unknown outcome, %d resets), %d with background effects not checked; %d not linearizable, %d undecided, in %v",
		l.IDs, l.Ops, l.Open, l.Resets, l.Excluded, l.Illegal, l.Unknown, l.Elapsed.Round(time.Millisecond))
	if len(l.Files) > 0 {
		s += "; visualisations: " + strings.Join(l.Files, ", ")
	}
	return s
}

// linKind is an operation of the counter model.
type linKind byte

const (
	linRead  linKind = 'r'
	linIncr  linKind = 'i'
	linReset linKind = 'z'
)

// linIn is an operation's input and what the visualisation shows of it.
type linIn struct {
	kind linKind
	via  int    // pinboard (1-based), 0 for a reset
	inst string // the instance that answered (the one activated, for a reset)
	proc string // the worker that logged it (a reset)
}

// linOut is an operation's output; known false: no answer.
type linOut struct {
	count int64
	known bool
}

// counterModel is the counter (see the comment at the top).
var counterModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		n, in, out := state.(int64), input.(linIn), output.(linOut)
		switch in.kind {
		case linRead:
			return out.count == n, n
		case linIncr:
			return !out.known || out.count == n+1, n + 1
		default: // linReset
			return true, int64(0)
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linIn), output.(linOut)
		switch in.kind {
		case linReset:
			return fmt.Sprintf("activate %s on %s (count := 0)", in.inst, in.proc)
		case linRead:
			return fmt.Sprintf("pb%d GET → %d (%s)", in.via, out.count, in.inst)
		}
		if !out.known {
			return fmt.Sprintf("pb%d incr → ? (no answer)", in.via)
		}
		return fmt.Sprintf("pb%d incr → %d (%s)", in.via, out.count, in.inst)
	},
	DescribeState: func(state any) string { return fmt.Sprint(state.(int64)) },
}

// opRead is the client's read.
const opRead = "GET /"

// linearOps builds each checkable id's operations from the history
// (sorted by T); it returns them and the number of ids excluded.
func linearOps(ev []history.Event, volatile bool) (map[string][]porcupine.Operation, int) {
	excluded := map[string]bool{}
	ops := map[string][]porcupine.Operation{}
	for _, e := range ev {
		switch e.Kind {
		case history.KindEffect, history.KindAlarm:
			excluded[e.ID] = true
		case history.KindActivate:
			if volatile {
				ops[e.ID] = append(ops[e.ID], porcupine.Operation{Input: linIn{kind: linReset, inst: e.Inst, proc: e.Proc}, Call: e.T, Return: e.T, Output: linOut{known: true}})
			}
		case history.KindRequest:
			ok := e.Err == "" && e.Status/100 == 2
			switch {
			case e.Op == opRead && ok:
				ops[e.ID] = append(ops[e.ID], porcupine.Operation{Input: linIn{kind: linRead, via: e.Via, inst: e.Inst}, Call: e.T, Return: e.End, Output: linOut{count: e.Count, known: true}})
			case e.Op == opRead:
			case e.Op != opIncr:
				excluded[e.ID] = true
			case ok:
				ops[e.ID] = append(ops[e.ID], porcupine.Operation{Input: linIn{kind: linIncr, via: e.Via, inst: e.Inst}, Call: e.T, Return: e.End, Output: linOut{count: e.Count, known: true}})
			case e.Err != "" || e.Status >= 500 && !(e.Status == 503 && noEffect[e.Reason]):
				ops[e.ID] = append(ops[e.ID], porcupine.Operation{Input: linIn{kind: linIncr, via: e.Via}, Call: e.T, Return: math.MaxInt64, Output: linOut{}})
			}
		}
	}
	for id := range excluded {
		delete(ops, id)
	}
	for id, list := range ops {
		if !slices.ContainsFunc(list, func(o porcupine.Operation) bool { return o.Input.(linIn).kind != linReset }) {
			delete(ops, id) // activations alone: nothing the client saw
		}
	}
	return ops, len(excluded)
}

// lanes gives every operation a client lane for the visualisation: the
// lowest lane free at its call (porcupine draws one row per ClientId).
func lanes(ops []porcupine.Operation) {
	var busy []int64 // per lane, the return of its last operation
	for i := range ops {
		lane := slices.IndexFunc(busy, func(ret int64) bool { return ret < ops[i].Call })
		if lane < 0 {
			lane = len(busy)
			busy = append(busy, 0)
		}
		busy[lane] = ops[i].Return
		ops[i].ClientId = lane
	}
}

// instanceInfo is what the history says of one instance.
type instanceInfo struct {
	proc        string
	epoch       uint64
	first, last int64 // first call and last return of the operations it answered
	answers     int
}

// checkLinear runs check 8 and returns its report.
func checkLinear(cfg Config, ev []history.Event, violate func(kind, format string, args ...any)) *LinearReport {
	start := time.Now()
	deadline := start.Add(cfg.LinearTimeout)
	byID, excluded := linearOps(ev, cfg.Volatile)
	rep := &LinearReport{IDs: len(byID), Excluded: excluded}
	activations := map[string]history.Event{}
	for _, e := range ev {
		if e.Kind == history.KindActivate {
			activations[e.Inst] = e
		}
	}
	t0 := int64(math.MaxInt64) // times are shown from the history's first event
	for _, e := range ev {
		t0 = min(t0, e.T)
	}
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		ops := byID[id]
		slices.SortStableFunc(ops, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		lanes(ops)
		rep.Ops += len(ops)
		for _, o := range ops {
			switch {
			case o.Input.(linIn).kind == linReset:
				rep.Resets++
			case !o.Output.(linOut).known:
				rep.Open++
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			rep.Unknown++
			violate(VLinearUnknown, "id %s: not checked: the check's time bound (%v) ran out", id, cfg.LinearTimeout)
			continue
		}
		// The plain check first (the verbose one keeps partial
		// linearizations, costly on long histories), then the verbose one
		// on an illegal id, for its explanation.
		switch porcupine.CheckOperationsTimeout(counterModel, ops, left) {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			rep.Unknown++
			violate(VLinearUnknown, "id %s: %d operations, not decided within %v", id, len(ops), left.Round(time.Millisecond))
			continue
		}
		rep.Illegal++
		_, info := porcupine.CheckOperationsVerbose(counterModel, ops, max(time.Until(deadline), cfg.LinearTimeout/10))
		file := ""
		if cfg.VisualizeDir != "" {
			file = filepath.Join(cfg.VisualizeDir, "linear-"+safeName(id)+".html")
			if err := os.MkdirAll(cfg.VisualizeDir, 0o755); err == nil {
				err = porcupine.VisualizePath(counterModel, info, file)
				if err != nil {
					file = "(visualisation failed: " + err.Error() + ")"
				} else {
					rep.Files = append(rep.Files, file)
				}
			}
		}
		violate(VNotLinearizable, "%s", describeIllegal(id, ops, info, activations, t0, file))
	}
	rep.Elapsed = time.Since(start)
	return rep
}

// safeName maps an id to a file name.
func safeName(id string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == os.PathSeparator || r == 0 {
			return '_'
		}
		return r
	}, id)
}

// timelineBefore and timelineAfter bound the operations a violation lists
// before and after the one no linearization reaches (by call time).
const timelineBefore, timelineAfter = 12, 6

// describeIllegal explains a non-linearizable id: the instances that
// answered it and the operations up to the first one no linearization
// reaches.
func describeIllegal(id string, ops []porcupine.Operation, info porcupine.LinearizationInfo, activations map[string]history.Event, t0 int64, file string) string {
	rel := func(t int64) string {
		if t == math.MaxInt64 {
			return "∞"
		}
		return fmt.Sprintf("%.3fs", float64(t-t0)/1e9)
	}
	// The longest partial linearization, and the first operation (by
	// return) outside it: where every linearization got stuck.
	var longest []int
	for _, part := range info.PartialLinearizations() {
		for _, l := range part {
			if len(l) > len(longest) {
				longest = l
			}
		}
	}
	in := map[int]bool{}
	for _, i := range longest {
		in[i] = true
	}
	stuck := -1
	for i, o := range ops {
		if !in[i] && (stuck < 0 || o.Return < ops[stuck].Return) {
			stuck = i
		}
	}
	insts := map[string]*instanceInfo{}
	for _, o := range ops {
		li := o.Input.(linIn)
		if li.inst == "" || li.kind == linReset {
			continue
		}
		ii := insts[li.inst]
		if ii == nil {
			a := activations[li.inst]
			ii = &instanceInfo{proc: a.Proc, epoch: a.Epoch, first: o.Call}
			insts[li.inst] = ii
		}
		ii.answers++
		ii.first = min(ii.first, o.Call)
		ii.last = max(ii.last, o.Return)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "id %s: %d operations not linearizable; answered by %d instance(s):", id, len(ops), len(insts))
	names := slices.SortedFunc(maps.Keys(insts), func(a, b string) int { return cmp.Compare(insts[a].first, insts[b].first) })
	for _, n := range names {
		ii := insts[n]
		fmt.Fprintf(&b, " %s (%s, epoch %d, %d answers %s–%s);", n, cmp.Or(ii.proc, "?"), ii.epoch, ii.answers, rel(ii.first), rel(ii.last))
	}
	for i, a := range names {
		for _, c := range names[i+1:] {
			if insts[c].first < insts[a].last {
				fmt.Fprintf(&b, " %s and %s answered at the same time (%s–%s);", a, c, rel(insts[c].first), rel(min(insts[a].last, insts[c].last)))
			}
		}
	}
	if stuck >= 0 {
		b.WriteString(" timeline up to the first operation no linearization reaches:")
		from := max(0, stuck-timelineBefore)
		for i := from; i < len(ops) && i <= stuck+timelineAfter && ops[i].Call <= ops[stuck].Return; i++ {
			mark := ""
			if i == stuck {
				mark = " ◀"
			}
			fmt.Fprintf(&b, "\n      [%s, %s] %s%s", rel(ops[i].Call), rel(ops[i].Return), counterModel.DescribeOperation(ops[i].Input, ops[i].Output), mark)
		}
	}
	if file != "" {
		fmt.Fprintf(&b, "\n      visualisation: %s", file)
	}
	return b.String()
}
