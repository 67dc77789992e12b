package bench

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/pinned-go/pinned/internal/pinboard"
)

// The failover suite's report: medians over rounds per size and
// configuration, the same-round ratios, Redis commands by command.

// failoverPick returns the runs of one size and configuration by round.
func (s *session) failoverPick(n int, cfg string) map[int]FailoverRun {
	return byRound(s.res.Failover, func(r FailoverRun) (int, bool) { return r.Round, r.IDs == n && r.Config == cfg })
}

// known reads f with -1 (no value: a percentile on ids never served
// again) as NaN, which medianOf, maxOf and ratio skip.
func known(f func(FailoverRun) float64) func(FailoverRun) float64 {
	return func(r FailoverRun) float64 {
		if v := f(r); v >= 0 {
			return v
		}
		return math.NaN()
	}
}

// medianRuns returns the median over rounds of f, skipping -1 (none).
func medianRuns(m map[int]FailoverRun, f func(FailoverRun) float64) float64 {
	return medianOf(m, known(f))
}

// statusClass sums the answers of NotOK whose status is (503) or is not
// (other) 503.
func statusClass(r FailoverRun, is503 bool) float64 {
	var t int64
	for k, v := range r.NotOK {
		if strings.HasPrefix(k, "503 ") == is503 {
			t += v
		}
	}
	return float64(t)
}

// failoverReport writes the suite's section and values.
func (s *session) failoverReport(fleets []*failoverFleet) {
	fo := &s.o.Failover
	b := &s.md
	v := s.res.Values
	b.WriteString("## failover\n\n")
	fmt.Fprintf(b, "A worker holding N ids is killed (SIGKILL) while every one of them is asked through the pinboard, open loop: id k mod N at "+
		"k·interval ÷ N from the start, each id every max(%v, N ÷ %d req/s), whatever came back. Two fleets, each with its own redis-server, "+
		"pinboard and surviving worker, take turns in every round (%s): fast failover (the default) and lease-only (`%s=off`); the lease is %v. "+
		"Each turn starts a fresh victim process (a counter in fleet mode on a new port), asks the pinboard for new ids in batches until exactly "+
		"N are placed on the victim (`GET /registry/instances`; the survivor takes the others), runs the load for max(1 s, interval) (every id "+
		"answered 200 first), kills the victim, and runs on until every id was answered 200 to a request sent after the kill, at most %v. "+
		"No background load on other ids. Rounds: %d.\n\n",
		fo.Interval, fo.Rate, strings.Join(failoverNames(fleets), " → "), pinboard.EnvFastFailover, fleets[0].lease, fo.Within, s.o.Rounds)
	b.WriteString("**Recovery** of an id: from the kill (taken just before the signal) to the end of its first 200 answer to a request sent after it; " +
		"percentiles over the ids by nearest rank, medians over rounds (max: the largest of the rounds). An id is asked only at its slot, so its " +
		"recovery includes the wait for its next request: *first ask* is when each id's first request after the kill left, the floor under its " +
		"recovery. Answers are those of the requests that ended after the kill (in flight at the kill, or sent after it): 503s by `X-Pinned-Reason`, other non-2xx, and requests " +
		"without an HTTP answer (medians over rounds). Redis commands are the `INFO commandstats` delta (INFO excluded) from just before the kill " +
		"to the end of the load (heartbeats, the janitor and the alarm scheduler included; net: minus each fleet's idle rate, measured over one lease " +
		"before the rounds, × the window). The measuring client runs in the bench process (fasthttp, one goroutine per request in flight, at most " +
		fmt.Sprint(fo.InFlight) + "): its schedule lag is how late each request left, its CPU the process's rusage over the load.\n\n")
	for _, n := range fo.IDs {
		interval := fo.interval(n)
		fmt.Fprintf(b, "#### %d ids — each asked every %v (%.0f req/s)\n\n", n, interval, float64(n)/interval.Seconds())
		var rec, cost [][]string
		for _, f := range fleets {
			m := s.failoverPick(n, f.cfg.name)
			if len(m) == 0 {
				continue
			}
			key := fmt.Sprintf("%d ids %s ", n, f.cfg.name)
			fewest := n
			reasons := map[string]int64{}
			for _, r := range m {
				fewest = min(fewest, r.Recovered)
				for k, c := range r.NotOK {
					reasons[k] += c
				}
				for k, c := range r.NoAnswerBy {
					reasons["no answer: "+k] += c
				}
			}
			maxRec := maxOf(m, known(func(r FailoverRun) float64 { return r.RecoveryMaxMs }))
			maxAsk := maxOf(m, known(func(r FailoverRun) float64 { return r.FirstAskMaxMs }))
			maxLag := maxOf(m, known(func(r FailoverRun) float64 { return r.LagMaxMs }))
			if fewest < n {
				s.note("%d ids %s: only %d ids were served again within %v in some round", n, f.cfg.name, fewest, fo.Within)
			}
			if pre := medianRuns(m, func(r FailoverRun) float64 { return float64(r.PreKillNotOK) }); pre > 0 {
				s.note("%d ids %s: %.0f requests that ended before the kill were not answered 200 (median of rounds)", n, f.cfg.name, pre)
			}
			p50 := medianRuns(m, func(r FailoverRun) float64 { return r.RecoveryP50Ms })
			p99 := medianRuns(m, func(r FailoverRun) float64 { return r.RecoveryP99Ms })
			n503 := medianRuns(m, func(r FailoverRun) float64 { return statusClass(r, true) })
			other := medianRuns(m, func(r FailoverRun) float64 { return statusClass(r, false) })
			noAns := medianRuns(m, func(r FailoverRun) float64 { return float64(r.NoAnswer) })
			cmds := medianRuns(m, func(r FailoverRun) float64 { return float64(r.RedisCommands) })
			net := medianRuns(m, func(r FailoverRun) float64 {
				return math.Max(0, float64(r.RedisCommands)-f.idleRate*r.WindowSeconds)
			})
			v[key+"recovered"] = float64(fewest)
			v[key+"recovery p50 ms"], v[key+"recovery p99 ms"], v[key+"recovery max ms"] = p50, p99, maxRec
			v[key+"503s"], v[key+"other non-2xx"], v[key+"no answer"] = n503, other, noAns
			v[key+"redis commands"], v[key+"redis commands net of idle"] = cmds, net
			v[key+"redis commands/id"] = net / float64(n)
			v[key+"client lag p99 ms"] = medianRuns(m, func(r FailoverRun) float64 { return r.LagP99Ms })
			v[key+"client cpu us/req"] = medianRuns(m, func(r FailoverRun) float64 { return r.ClientCPUUsPerReq })
			rec = append(rec, []string{f.cfg.name, fmt.Sprintf("%d of %d", fewest, n), fmtNum(p50, 0), fmtNum(p99, 0), fmtNum(maxRec, 0),
				fmtNum(medianRuns(m, func(r FailoverRun) float64 { return r.FirstAskP50Ms }), 0) + " / " + fmtNum(maxAsk, 0),
				fmtNum(medianRuns(m, func(r FailoverRun) float64 { return float64(r.Requests) }), 0),
				fmtNum(n503, 0), fmtNum(other, 0), fmtNum(noAns, 0), reasonList(reasons)})
			cost = append(cost, []string{f.cfg.name, fmtNum(cmds, 0), fmtNum(net, 0), fmtNum(net/float64(n), 2),
				fmtNum(medianRuns(m, func(r FailoverRun) float64 { return r.WindowSeconds }), 1),
				fmtNum(medianRuns(m, func(r FailoverRun) float64 { return r.DeathsProven }), 0),
				fmtNum(medianRuns(m, func(r FailoverRun) float64 { return r.FastFailovers }), 0),
				fmtNum(medianRuns(m, func(r FailoverRun) float64 { return r.PinboardCPUMs }), 0),
				fmtNum(medianRuns(m, func(r FailoverRun) float64 { return r.LagP50Ms }), 2) + " / " + fmtNum(v[key+"client lag p99 ms"], 2) + " / " + fmtNum(maxLag, 1),
				fmtNum(v[key+"client cpu us/req"], 1), fmtNum(medianRuns(m, func(r FailoverRun) float64 { return r.ClientCores }), 2)})
		}
		table(b, []string{"pinboard", "ids served again (fewest)", "recovery p50 ms", "p99 ms", "max ms (largest)", "first ask p50 / max ms",
			"requests ended after the kill", "503s", "other non-2xx", "no answer", "answers by reason (all rounds)"}, rec)
		table(b, []string{"pinboard", "Redis commands", "net of idle", "net per id", "window s", "deaths proven", "fast failovers",
			"pinboard CPU ms", "client lag p50 / p99 / max ms", "client CPU µs/req", "client cores"}, cost)
		fast, lease := s.failoverPick(n, "fast"), s.failoverPick(n, "lease-only")
		r50 := ratio(lease, fast, known(func(r FailoverRun) float64 { return r.RecoveryP50Ms }))
		r99 := ratio(lease, fast, known(func(r FailoverRun) float64 { return r.RecoveryP99Ms }))
		v[fmt.Sprintf("%d ids lease-only/fast recovery p50", n)] = r50
		v[fmt.Sprintf("%d ids lease-only/fast recovery p99", n)] = r99
		fmt.Fprintf(b, "Recovery lease-only ÷ fast (median of per-round ratios): p50 **%s**, p99 **%s**.\n\n", fmtNum(r50, 1), fmtNum(r99, 1))
	}
	s.failoverCommandTable(fleets)
	s.res.Markdown = b.String()
}

// failoverCommandTable writes the Redis commands per kill by command, for
// every size and configuration (medians over rounds).
func (s *session) failoverCommandTable(fleets []*failoverFleet) {
	names := map[string]bool{}
	for _, r := range s.res.Failover {
		for k := range r.RedisByCommand {
			names[k] = true
		}
	}
	head := []string{"command"}
	type col struct {
		n   int
		cfg string
	}
	var cols []col
	for _, n := range s.o.Failover.IDs {
		for _, f := range fleets {
			head = append(head, fmt.Sprintf("%s, %d ids", f.cfg.name, n))
			cols = append(cols, col{n, f.cfg.name})
		}
	}
	var rows [][]string
	for _, k := range slices.Sorted(maps.Keys(names)) {
		row := []string{"`" + strings.ReplaceAll(k, "|", "\\|") + "`"}
		for _, c := range cols {
			row = append(row, fmtNum(medianRuns(s.failoverPick(c.n, c.cfg), func(r FailoverRun) float64 { return float64(r.RedisByCommand[k]) }), 0))
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return
	}
	s.md.WriteString("Redis commands from the kill to the end of the load, by command (median of rounds):\n\n")
	table(&s.md, head, rows)
}

// reasonList formats counts by reason, largest first.
func reasonList(m map[string]int64) string {
	if len(m) == 0 {
		return "–"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s ×%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func failoverNames(fleets []*failoverFleet) []string {
	var out []string
	for _, f := range fleets {
		out = append(out, f.cfg.name)
	}
	return out
}
