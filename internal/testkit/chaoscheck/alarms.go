package chaoscheck

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/history"
)

// Alarm checks (the client's alarm requests and the workers' alarm runs):
//
//  5. Every alarm run happens under a live lease, like a task effect (a run
//     after its session's lease ended is allowed only right after a pause
//     of its process across the end).
//  6. An occurrence (id, alarm name, scheduled time) runs more than once
//     only across a fault: some nemesis overlapped the window from
//     DuplicateWindow before its first run to its last run. Delivery is at
//     least once; a duplicate while nothing failed means two pinboards
//     delivered it at once.
//  7. Every alarm the client set (a 2xx to POST .../alarm?...&name=N, names
//     unique per request) runs, unless a Redis restart (which loses every
//     alarm: they are as durable as Redis) happened after it was set, or it
//     was due within PendingWindow of the end of the history.

// Alarm violation kinds.
const (
	VAlarmAfter     = "alarm run after the lease ended"
	VAlarmDuplicate = "alarm occurrence run twice outside any fault"
	VAlarmLost      = "alarm set but never run"
)

// Defaults of the alarm windows.
const (
	// DefaultDuplicateWindow covers the longest a delivery's outcome can
	// stay unknown before a redelivery: the scheduler's claim (30 s).
	DefaultDuplicateWindow = 30 * time.Second
	// DefaultPendingWindow is how long before the end of the history an
	// alarm must have been due to be required to have run.
	DefaultPendingWindow = 60 * time.Second
)

// NemesisRedisRestart is the nemesis that loses every alarm.
const NemesisRedisRestart = "redis-restart"

// AlarmReport summarises the alarm checks.
type AlarmReport struct {
	Set        int // alarms the client set (2xx)
	Occurrence int // distinct occurrences that ran
	Runs       int // alarm handler runs
	// Duplicates counts occurrences that ran more than once, Explained
	// those of them a fault overlapped.
	Duplicates, Explained int
	// Lost counts set alarms that never ran; LostToRedis those a Redis
	// restart excuses; Pending those due too close to the end to tell.
	Lost, LostToRedis, Pending int
	// MaxLateness is the longest time from an occurrence's scheduled time
	// to its first run.
	MaxLateness time.Duration
}

func (a *AlarmReport) String() string {
	return fmt.Sprintf("alarms: set %d, runs %d of %d occurrences, duplicates %d (across a fault: %d), never run %d (lost to a Redis restart: %d), pending at the end %d, max lateness %v",
		a.Set, a.Runs, a.Occurrence, a.Duplicates, a.Explained, a.Lost, a.LostToRedis, a.Pending, a.MaxLateness)
}

// alarmName returns the name=N parameter of an alarm request's Op
// ("POST /alarm?delay=1s&name=N"), or "" for other requests.
func alarmName(op string) string {
	path, query, ok := strings.Cut(op, "?")
	if !ok || !strings.HasSuffix(path, "/alarm") {
		return ""
	}
	for _, kv := range strings.Split(query, "&") {
		if v, ok := strings.CutPrefix(kv, "name="); ok {
			return v
		}
	}
	return ""
}

// checkAlarms runs the alarm checks on the sorted events.
func checkAlarms(cfg Config, ev []history.Event, violate func(kind, format string, args ...any),
	endOf func(sid string) (int64, bool), sessionOf func(history.Event) string, pauses map[string][]interval) *AlarmReport {
	dupWindow := int64(cmp.Or(cfg.DuplicateWindow, DefaultDuplicateWindow))
	pending := int64(cmp.Or(cfg.PendingWindow, DefaultPendingWindow))
	tol := int64(cfg.Tolerance)
	a := &AlarmReport{}
	type key struct {
		id, name string
		sched    int64
	}
	runs := map[key][]history.Event{}
	ranByName := map[[2]string]bool{}
	var sets []history.Event
	var faults []interval
	var redis []int64
	last := int64(0)
	for _, e := range ev {
		last = max(last, e.T, e.End)
		switch e.Kind {
		case history.KindAlarm:
			a.Runs++
			k := key{e.ID, e.Alarm, e.Sched}
			runs[k] = append(runs[k], e)
			ranByName[[2]string{e.ID, e.Alarm}] = true
			if end, ok := endOf(sessionOf(e)); ok && e.T > end+tol {
				if pausedAcross(pauses[e.Proc], end, e.T, int64(cfg.EffectGrace)) {
					continue
				}
				violate(VAlarmAfter, "id %s: alarm %s ran on instance %s (session %s, %s) %v after the lease ended",
					e.ID, e.Alarm, e.Inst, sessionOf(e), e.Proc, time.Duration(e.T-end))
			}
		case history.KindRequest:
			if alarmName(e.Op) != "" && e.Err == "" && e.Status >= 200 && e.Status < 300 {
				sets = append(sets, e)
			}
		case history.KindNemesis:
			faults = append(faults, interval{e.T, cmp.Or(e.End, forever)})
			if e.Nemesis == NemesisRedisRestart {
				redis = append(redis, e.T)
			}
		}
	}
	a.Occurrence = len(runs)
	for k, rs := range runs {
		if l := time.Duration((rs[0].Wall - k.sched) * int64(time.Millisecond)); l > a.MaxLateness {
			a.MaxLateness = l
		}
		if len(rs) < 2 {
			continue
		}
		a.Duplicates++
		first, lastRun := rs[0].T, rs[len(rs)-1].T
		explained := false
		for _, f := range faults {
			if f.from <= lastRun && f.to >= first-dupWindow {
				explained = true
				break
			}
		}
		if explained {
			a.Explained++
			continue
		}
		var where []string
		for _, r := range rs {
			where = append(where, fmt.Sprintf("%s/%s at %d", r.Proc, r.Inst, r.T))
		}
		violate(VAlarmDuplicate, "id %s: alarm %s scheduled %d ran %d times with no fault near: %s", k.id, k.name, k.sched, len(rs), strings.Join(where, ", "))
	}
	for _, s := range sets {
		a.Set++
		name := alarmName(s.Op)
		if ranByName[[2]string{s.ID, name}] {
			continue
		}
		if s.End > last-pending {
			a.Pending++
			continue
		}
		a.Lost++
		lostToRedis := false
		for _, t := range redis {
			if t >= s.T {
				lostToRedis = true
				break
			}
		}
		if lostToRedis {
			a.LostToRedis++
			continue
		}
		violate(VAlarmLost, "id %s: alarm %s set at %d (answered %d) never ran", s.ID, name, s.T, s.Status)
	}
	return a
}

// UnrunAlarms counts the alarms the client set (2xx) that have not run in
// events and that no later Redis restart excuses: a harness waits for it to
// reach 0 before it stops the cluster, so that Check can require every
// alarm to have run (Config.PendingWindow small).
func UnrunAlarms(events []history.Event) int {
	ran := map[[2]string]bool{}
	var sets []history.Event
	var redis []int64
	for _, e := range events {
		switch {
		case e.Kind == history.KindAlarm:
			ran[[2]string{e.ID, e.Alarm}] = true
		case e.Kind == history.KindRequest && alarmName(e.Op) != "" && e.Err == "" && e.Status >= 200 && e.Status < 300:
			sets = append(sets, e)
		case e.Kind == history.KindNemesis && e.Nemesis == NemesisRedisRestart:
			redis = append(redis, e.T)
		}
	}
	n := 0
	for _, s := range sets {
		if ran[[2]string{s.ID, alarmName(s.Op)}] || slices.ContainsFunc(redis, func(t int64) bool { return t >= s.T }) {
			continue
		}
		n++
	}
	return n
}
