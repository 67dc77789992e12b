package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/history"
)

// alarmPlan is the size of the alarms suite.
type alarmPlan struct {
	alarms, ids    int           // healthy phase: alarms over ids
	window         time.Duration // every healthy alarm is due within it
	lead           time.Duration // from the start of setting to the window
	outageAlarms   int           // outage phase: alarms due while every worker is dead
	outage         time.Duration // how long every worker stays dead
	drain          time.Duration // bound on waiting for the fires after a phase
	setConcurrency int
}

func (s *session) alarmPlan() alarmPlan {
	if s.o.Smoke {
		s.note("smoke: 2 000 alarms over 200 ids due within 5 s, 200 during a 2 s outage; not the 100 000 / 10 000 / 1 min / 30 s of the full run")
		return alarmPlan{alarms: 2000, ids: 200, window: 5 * time.Second, lead: 5 * time.Second, outageAlarms: 200, outage: 2 * time.Second,
			drain: time.Minute, setConcurrency: 32}
	}
	return alarmPlan{alarms: 100_000, ids: 10_000, window: time.Minute, lead: 2 * time.Minute, outageAlarms: 10_000, outage: 30 * time.Second,
		drain: 3 * time.Minute, setConcurrency: 64}
}

// alarmFire is one alarm run read from a worker's history.
type alarmFire struct {
	late time.Duration // wall time of the run − scheduled time
}

// alarmsSuite measures durable alarms end to end: the pinboard's scheduler
// on Redis delivering through the proxy path to fleet workers (the counter's
// POST /counter/{id}/alarm?at=&name=, whose Alarm handler increments).
func (s *session) alarmsSuite(ctx context.Context) error {
	plan := s.alarmPlan()
	f, err := s.startFleet(0, false)
	if err != nil {
		return err
	}
	defer f.close()
	histDir := filepath.Join(f.dir, "history")
	incarnation := 0
	startWorkers := func() error {
		f.workers = nil
		for i := range s.o.Workers {
			incarnation++
			path := filepath.Join(histDir, fmt.Sprintf("w%d.%d.jsonl", i+1, incarnation))
			w, err := f.startCounterEnv(fmt.Sprintf("worker-%d.%d", i+1, incarnation), f.pinboard.addr, "PINNED_HISTORY="+path)
			if err != nil {
				return err
			}
			f.workers = append(f.workers, w)
		}
		return nil
	}
	if err := os.MkdirAll(histDir, 0o755); err != nil {
		return err
	}
	if err := startWorkers(); err != nil {
		return err
	}
	client := &fasthttp.Client{MaxConnsPerHost: plan.setConcurrency, MaxIdleConnDuration: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 10 * time.Second, NoDefaultUserAgentHeader: true}
	defer client.CloseIdleConnections()
	base := "http://" + f.pinboard.addr

	// Phase 1: healthy. Alarms are set in due order; each is due at
	// t0 + lead + i·window/n.
	before, err := redisCommandStats(f.redis.addr)
	if err != nil {
		return err
	}
	t0 := time.Now()
	dueAt := func(i int) time.Time {
		return t0.Add(plan.lead + time.Duration(i)*plan.window/time.Duration(plan.alarms))
	}
	setLate, err := setAlarms(ctx, client, base, plan.alarms, plan.ids, plan.setConcurrency, "h", dueAt)
	if err != nil {
		return err
	}
	setSecs := time.Since(t0).Seconds()
	afterSet, err := redisCommandStats(f.redis.addr)
	if err != nil {
		return err
	}
	s.logf("  alarms: %d set in %.1f s (%d after their time)", plan.alarms, setSecs, setLate)
	// The gap until the window is the idle background (heartbeats, the
	// janitor, the scheduler's polls).
	windowStart := t0.Add(plan.lead)
	idleSecs := time.Until(windowStart).Seconds()
	if err := sleepCtx(ctx, time.Until(windowStart)); err != nil {
		return err
	}
	afterIdle, err := redisCommandStats(f.redis.addr)
	if err != nil {
		return err
	}
	if err := waitFired(ctx, f.pinboard.admin, plan.alarms, t0.Add(plan.lead+plan.window+plan.drain)); err != nil {
		return err
	}
	fireSecs := time.Since(windowStart).Seconds()
	afterFire, err := redisCommandStats(f.redis.addr)
	if err != nil {
		return err
	}
	healthy, dupH, err := readFires(histDir, "h")
	if err != nil {
		return err
	}

	// Phase 2: every worker killed for plan.outage, then restarted; the
	// alarms were due during the outage.
	t1 := time.Now()
	killAt := t1.Add(plan.lead / 4)
	dueOut := func(i int) time.Time {
		return killAt.Add(time.Duration(i) * plan.outage / time.Duration(plan.outageAlarms))
	}
	outLate, err := setAlarms(ctx, client, base, plan.outageAlarms, plan.ids, plan.setConcurrency, "o", dueOut)
	if err != nil {
		return err
	}
	if outLate > 0 {
		s.note("%d outage alarms were set after their time (the set phase ran past the kill)", outLate)
	}
	if err := sleepCtx(ctx, time.Until(killAt)); err != nil {
		return err
	}
	for _, w := range f.workers {
		w.Kill()
	}
	killed := time.Now()
	if err := sleepCtx(ctx, plan.outage); err != nil {
		return err
	}
	if err := startWorkers(); err != nil {
		return err
	}
	restarted := time.Now()
	s.logf("  alarms: workers killed for %v, restarted (ready %v after the kill)", plan.outage, restarted.Sub(killed).Round(time.Millisecond))
	if err := waitFired(ctx, f.pinboard.admin, plan.alarms+plan.outageAlarms, restarted.Add(plan.drain)); err != nil {
		return err
	}
	outage, dupO, err := readFires(histDir, "o")
	if err != nil {
		return err
	}
	dead := deadLetters(f.pinboard.addr)

	// Report.
	v := s.res.Values
	pct := func(fs []alarmFire, q float64) float64 {
		if len(fs) == 0 {
			return 0
		}
		return float64(fs[min(len(fs)-1, int(q*float64(len(fs))))].late.Microseconds()) / 1000
	}
	v["alarms fired"] = float64(len(healthy))
	v["alarms duplicates"] = float64(dupH)
	v["alarms healthy p50 ms"], v["alarms healthy p99 ms"], v["alarms healthy max ms"] = pct(healthy, 0.5), pct(healthy, 0.99), pct(healthy, 1)
	v["alarms set/s"] = float64(plan.alarms) / setSecs
	v["alarms set late"] = float64(setLate)
	setCmds := float64(sumDelta(before, afterSet)) / float64(plan.alarms)
	idleRate := float64(sumDelta(afterSet, afterIdle)) / max(idleSecs, 1e-9)
	fireCmds := float64(sumDelta(afterIdle, afterFire)) / float64(max(len(healthy), 1))
	netFire := max(0, float64(sumDelta(afterIdle, afterFire))-idleRate*fireSecs) / float64(max(len(healthy), 1))
	v["redis commands/set alarm"], v["redis commands/fired alarm"], v["redis commands/fired alarm net of idle"] = setCmds, fireCmds, netFire
	v["alarms outage fired"] = float64(len(outage))
	v["alarms outage duplicates"] = float64(dupO)
	v["alarms outage p50 ms"], v["alarms outage p99 ms"], v["alarms outage max ms"] = pct(outage, 0.5), pct(outage, 0.99), pct(outage, 1)
	v["alarms dead letters"] = float64(dead)

	b := &s.md
	b.WriteString("## alarms\n\n")
	fmt.Fprintf(b, "Durable alarms end to end: redis-server, one pinboard (its alarm scheduler on Redis, deliveries through the placement resolver), "+
		"%d counter workers. Alarms are set through the pinboard with `POST /counter/{id}/alarm?at=<ms>&name=<n>` (%d at a time, in due order); "+
		"when one fires the counter's Alarm handler increments and the worker records the run in its history (scheduled time and wall time, "+
		"one clock: the machine's). Lateness is the run's wall time minus the scheduled time, for the first run of each occurrence.\n\n",
		s.o.Workers, plan.setConcurrency)
	table(b, []string{"phase", "alarms", "ids", "due within", "fired", "duplicates", "p50 ms", "p99 ms", "max ms"}, [][]string{
		{"healthy", fmt.Sprint(plan.alarms), fmt.Sprint(plan.ids), plan.window.String(), fmt.Sprint(len(healthy)), fmt.Sprint(dupH),
			fmtNum(v["alarms healthy p50 ms"], 1), fmtNum(v["alarms healthy p99 ms"], 1), fmtNum(v["alarms healthy max ms"], 1)},
		{fmt.Sprintf("all workers killed -9 for %v, then restarted", plan.outage), fmt.Sprint(plan.outageAlarms), fmt.Sprint(plan.ids), plan.outage.String() + " (the outage)",
			fmt.Sprint(len(outage)), fmt.Sprint(dupO), fmtNum(v["alarms outage p50 ms"], 0), fmtNum(v["alarms outage p99 ms"], 0), fmtNum(v["alarms outage max ms"], 0)},
	})
	fmt.Fprintf(b, "Setting: %.0f alarms/s (%d answered after their scheduled time). Redis commands (INFO commandstats deltas): **%s per alarm set** "+
		"(the registry's session and placement checks and the set script); **%s per fired alarm** over the due window (claim, the delivery's placement "+
		"and session reads, the outcome script; heartbeats and the scheduler's polls included), %s net of the idle background measured between the set "+
		"phase and the window (%.0f commands/s).\n\n",
		v["alarms set/s"], setLate, fmtNum(setCmds, 2), fmtNum(fireCmds, 2), fmtNum(netFire, 2), idleRate)
	fmt.Fprintf(b, "Outage: every worker was killed -9 at the first outage alarm's time, so each of them was due while no worker lived; new workers "+
		"started %v after the kill. The alarms fire once the new workers have registered and the dead sessions' leases (10 s) have run out in "+
		"Redis, after the scheduler's next probe (claims pause while no worker answers); lateness counts from each alarm's own time, so the "+
		"earliest carry the whole outage. Dead letters after both phases: %d.\n\n",
		restarted.Sub(killed).Round(time.Millisecond), dead)
	s.res.Markdown = b.String()
	if len(healthy) != plan.alarms || len(outage) != plan.outageAlarms {
		s.note("not every alarm fired: healthy %d of %d, outage %d of %d", len(healthy), plan.alarms, len(outage), plan.outageAlarms)
	}
	return nil
}

// setAlarms sets n alarms through the pinboard at base, alarm i on id
// i mod ids named <prefix><i / ids>, due at due(i), conc at a time, in
// order. It returns how many were answered after their due time.
func setAlarms(ctx context.Context, client *fasthttp.Client, base string, n, ids, conc int, prefix string, due func(int) time.Time) (int, error) {
	var late atomic.Int64
	err := parallel(ctx, n, conc, func(i int) error {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		at := due(i)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(fmt.Sprintf("%s/counter/id%d/alarm?at=%d&name=%s%d", base, i%ids, at.UnixMilli(), prefix, i/ids))
		if err := doExpect(ctx, client, req, resp, fasthttp.StatusAccepted); err != nil { // a 503 + Retry-After (a placement in progress) is retried
			return err
		}
		if time.Now().After(at) {
			late.Add(1)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return int(late.Load()), nil
}

// waitFired polls the pinboard's /metrics (another process) until its
// scheduler counted n successful deliveries, or until.
func waitFired(ctx context.Context, admin string, n int, until time.Time) error {
	for {
		code, body := httpGet("http://"+admin+"/metrics", 5*time.Second)
		if code == 200 {
			if ok := metricValue(body, `pinned_alarm_deliveries_total{result="ok"}`); ok >= float64(n) {
				return nil
			}
		}
		if time.Now().After(until) {
			return fmt.Errorf("the pinboard delivered fewer than %d alarms by the deadline (last /metrics: %d)", n, code)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// metricValue returns the value of one series in a Prometheus text body.
func metricValue(body []byte, series string) float64 {
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return -1
}

// readFires reads every worker history in dir and returns the first run of
// each occurrence whose name starts with prefix, sorted by lateness, and
// how many occurrences ran more than once.
func readFires(dir, prefix string) ([]alarmFire, int, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, 0, err
	}
	type key struct {
		id, name string
		sched    int64
	}
	first := map[key]history.Event{}
	runs := map[key]int{}
	for _, f := range files {
		evs, err := history.Read(f)
		if err != nil {
			return nil, 0, err
		}
		for _, e := range evs {
			if e.Kind != history.KindAlarm || !strings.HasPrefix(e.Alarm, prefix) {
				continue
			}
			k := key{e.ID, e.Alarm, e.Sched}
			runs[k]++
			if old, ok := first[k]; !ok || e.Wall < old.Wall {
				first[k] = e
			}
		}
	}
	dups := 0
	out := make([]alarmFire, 0, len(first))
	for k, e := range first {
		if runs[k] > 1 {
			dups++
		}
		out = append(out, alarmFire{late: time.Duration(e.Wall-e.Sched) * time.Millisecond})
	}
	slices.SortFunc(out, func(a, b alarmFire) int { return int(a.late - b.late) })
	return out, dups, nil
}

// deadLetters counts the pinboard's dead letters (GET /registry/alarms/dead).
func deadLetters(pinboard string) int {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + pinboard + wire.PathAlarmsDead + "?limit=1000")
	req.Header.Set("Authorization", "Bearer "+token)
	if err := httpClient.DoTimeout(req, resp, 10*time.Second); err != nil || resp.StatusCode() != 200 {
		return -1
	}
	return strings.Count(string(resp.Body()), `"deadAtMs"`)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
