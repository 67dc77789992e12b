package chaos

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/proctest"
)

// reportMethod is the method section of a -chaos-report (docs/chaos.md):
// what the harness does and checks, and its nemeses. Keep it true with the
// package doc.
const reportMethod = `## Method

Written by ` + "`TestChaos`" + ` in ` + "`test/chaos`" + ` (its package doc and ` + "`internal/testkit/chaoscheck`" + `'s say more). Real processes on 127.0.0.1: a redis-server (no persistence) that each pinboard reaches through a TCP forwarder of the harness's (` + "`internal/testkit/tcpfwd`" + `: delay, cut, stall), 2 pinboards (lease 10 s, restart fence 10 s), 3 counter workers (the test fixture ` + "`test/app/counter`" + `; heartbeat 3 s, buffer 5 s, idle timeout 3 s, each worker's control path through a forwarder too) persisting their counts through fence to a second redis-server, and a closed-loop client (%d loops over %d ids through both pinboards; every %dth id gets only GET / and POST /incr, the others also background increments and durable alarms). One nemesis per round, then a settle time. Every process writes a history; the checker requires: no two live instances of one id, with lease ends recomputed from heartbeat send times; nothing served and no task effect under an ended lease; every instance aborted when its lease ends; no acknowledged increment lost from the counters' own store, nothing stored that no request explains; every request answered 2xx, 4xx, 503 + Retry-After or 502/504, no hang; every alarm set run under a live lease, no occurrence twice outside a fault; and every plain id's counter history linearizable (porcupine: reads and increments with their invoke and return times, an increment with an unknown outcome open forever; an undecided check fails). A skipped round fails the run unless its nemesis may be skipped (a drain refused for want of a live session), and at most one round in ten may be.

## Nemeses

| nemesis | fault |
|---|---|
| kill-worker | kill -9 of a worker, restarted on its address (a new process and clientId) |
| pause | SIGSTOP of a worker for 2, 4, 6, 9, 12 or 30 s |
| redis-restart | Redis restarted without persistence (the restart fence keeps every id unplaced for a lease) |
| kill-pinboard | kill -9 of a pinboard, restarted on its port |
| drain-worker | a drain pushed through /registry/push, then SIGTERM and a restart (may be skipped: no live session) |
| control-latency+cut | 1.5 s round trip on one worker's control path, then a 9 s cut: its lease runs out |
| redis-latency | Redis replies 50–500 ms late for one pinboard or both, 8 s |
| redis-partition | one pinboard cut off from Redis for 8 s, the other working |
| redis-latency+kill-2-workers | replies 100–300 ms late on both pinboards while two workers die, with request bursts for every id through both (the replace race) |
| redis-latency+drain-worker | the same while a worker drains (the claim race; may be skipped like drain-worker) |
| redis-freeze+move | one pinboard's Redis link goes silent (connections open, no byte, no RST or FIN) for 12 s or more while placements move through the other: 8 plain ids left to go idle, 8 evicted through the registry, one worker drained; each is asked through both pinboards in both orders as soon as it has moved; the workers' control paths avoid the frozen pinboard; a round in which nothing moved fails |
| redis-slow-invalidations+move | one pinboard's bytes from Redis (replies and invalidation pushes) 1–2.5 s late for 12 s or more while 8 plain ids go idle and 8 are evicted, asked the same way |
| late-releases+move | every worker's release calls held in the network (heartbeats pass) while 8 plain ids go idle and 8 are evicted: the holders give up releasing, stale routes renew the placements on them, then the releases arrive late and must leave the renewed placements alone; each id asked through both pinboards before and after |

`

func writeReport(t *testing.T, path string, res result) {
	t.Helper()
	r := res.report
	var b strings.Builder
	fmt.Fprintf(&b, "# Chaos run %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	pick := ""
	if *nemesesArg != "" {
		pick = " -chaos-nemeses " + *nemesesArg
	}
	fmt.Fprintf(&b, "Command: `go test ./test/chaos -run TestChaos -rounds %d%s -chaos-seed %d -timeout 60m -chaos-report <file>`\n\n", len(res.rounds), pick, res.seed)
	fmt.Fprintf(&b, reportMethod, clients, nIDs, plainEvery)
	b.WriteString("## Result\n\n")
	verdict := "PASS"
	skipErr := skipVerdict(res.rounds)
	if !r.OK() || skipErr != nil {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "| | |\n|---|---|\n| verdict | **%s** |\n| rounds | %d |\n| duration | %v |\n| seed | %d |\n", verdict, len(res.rounds), res.elapsed.Round(time.Second), res.seed)
	fmt.Fprintf(&b, "| skipped rounds (at most %d allowed, of drains only) | %d |\n", maxSkipped(len(res.rounds)), len(res.skipped()))
	fmt.Fprintf(&b, "| max overlap of two live instances of one id | %v |\n", r.MaxOverlap)
	fmt.Fprintf(&b, "| worker processes / sessions / instances | %d / %d / %d |\n", r.Workers, r.Sessions, r.Instances)
	fmt.Fprintf(&b, "| requests served by workers (straddling a lease end) | %d (%d) |\n", r.Served, r.Straddling)
	fmt.Fprintf(&b, "| task effects (right after a pause across the lease end) | %d (%d) |\n", r.Effects, r.EffectsAfterPause)
	fmt.Fprintf(&b, "| %s |\n", strings.Replace(r.Stored.String(), ": ", " | ", 1))
	if r.Linear != nil {
		fmt.Fprintf(&b, "| %s |\n", strings.Replace(r.Linear.String(), ": ", " | ", 1))
	}
	if r.Alarms != nil {
		fmt.Fprintf(&b, "| %s |\n", strings.Replace(r.Alarms.String(), ": ", " | ", 1))
	}
	b.WriteString("\nFaults by kind:\n\n| nemesis | count |\n|---|---|\n")
	for _, k := range slices.Sorted(maps.Keys(r.Nemeses)) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.Nemeses[k])
	}
	if sk := res.skipped(); len(sk) > 0 {
		fmt.Fprintf(&b, "\nSkipped rounds: %s.\n", strings.Join(sk, "; "))
	}
	b.WriteString("\nClient requests by class:\n\n| class | count |\n|---|---|\n")
	total := 0
	for _, k := range slices.Sorted(maps.Keys(r.Requests)) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.Requests[k])
		total += r.Requests[k]
	}
	fmt.Fprintf(&b, "| total | %d |\n\nNon-2xx answers by status and `x-pinned-reason`:\n\n| answer | count |\n|---|---|\n", total)
	for _, k := range slices.Sorted(maps.Keys(r.Answers)) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.Answers[k])
	}
	b.WriteString("\n502/504 by method (the goal: none for GET, HEAD and OPTIONS, which the proxy may repeat):\n\n| method, status, Retry-After | count |\n|---|---|\n")
	if len(r.Gateway) == 0 {
		b.WriteString("| none | 0 |\n")
	}
	for _, k := range slices.Sorted(maps.Keys(r.Gateway)) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, r.Gateway[k])
	}
	b.WriteString("\nViolations:")
	if r.OK() && skipErr == nil {
		b.WriteString(" none.\n")
	} else {
		b.WriteString("\n\n")
		for _, k := range slices.Sorted(maps.Keys(r.Violations)) {
			fmt.Fprintf(&b, "- %s: %d\n", k, r.Violations[k])
		}
		if skipErr != nil {
			fmt.Fprintf(&b, "- %s\n", skipErr)
		}
		for _, v := range r.Examples {
			fmt.Fprintf(&b, "  - %s: %s\n", v.Kind, v.Detail)
		}
	}
	b.WriteString(recoveryTable(res.recoveries))
	fmt.Fprintf(&b, "\nNemesis schedule: %s\n", strings.Join(res.labels(), ", "))
	path, err := proctest.FromModuleRoot(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// recoveryTable is the report's section on the rounds that killed workers:
// for each, how long after the kill the killed workers' ids were served
// again (recovery_test.go).
func recoveryTable(rs []recovery) string {
	var b strings.Builder
	b.WriteString("\nRecovery after kill -9: for each round that killed workers, the time from each kill to the first 2xx from another instance of each id the killed process held and the client asked for again, as the client saw it (so it includes the time until the client next asked the id), over those ids; the ids held but never asked for again (a storm's fresh ids) are left out and counted:\n\n")
	b.WriteString("| round | nemesis | killed | ids | p50 | p99 | max | never served again | held, not asked again |\n|---|---|---|---|---|---|---|---|---|\n")
	if len(rs) == 0 {
		b.WriteString("| none | | | | | | | | |\n")
	}
	for _, r := range rs {
		ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %v | %v | %v | %d | %d |\n", r.round, r.kind, r.workers, r.ids, ms(r.p50), ms(r.p99), ms(r.max), r.left, r.unasked)
	}
	return b.String()
}
