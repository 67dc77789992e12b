package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pinned-go/pinned/internal/pinboard"
)

// fleetRig starts redis-server, the pinboard (and pinboard B when set),
// fleet workers registered with the pinboard, and, when local, one counter
// in local mode for the direct and peer targets.
type fleetRig struct {
	*rig
	redis, pinboard, pinboardB *proc
	workers                    []*proc
	local                      *proc
}

func (s *session) startFleet(workers int, local bool) (*fleetRig, error) {
	r, err := newRig(s.o, s.bins)
	if err != nil {
		return nil, err
	}
	f := &fleetRig{rig: r}
	fail := func(err error) (*fleetRig, error) {
		r.close()
		return nil, err
	}
	if f.redis, err = r.startRedis(); err != nil {
		return fail(err)
	}
	if f.pinboard, err = r.startPinboard("pinboard", s.bins.pinboard, f.redis.addr); err != nil {
		return fail(err)
	}
	if s.bins.pinboardB != "" {
		if f.pinboardB, err = r.startPinboard("pinboard-b", s.bins.pinboardB, f.redis.addr); err != nil {
			return fail(err)
		}
	}
	for i := range workers {
		w, err := r.startCounter(fmt.Sprintf("worker-%d", i+1), f.pinboard.addr)
		if err != nil {
			return fail(err)
		}
		f.workers = append(f.workers, w)
	}
	if local {
		if f.local, err = r.startCounter("counter-local", ""); err != nil {
			return fail(err)
		}
	}
	return f, nil
}

// targets returns direct (the local counter), pinboard (the fleet worker),
// pinboard-b, and the peers in front of the local counter.
func (s *session) targets(f *fleetRig, peers bool) []target {
	ts := []target{{name: "direct", url: "http://" + f.local.addr, backend: f.local}}
	ts = append(ts, target{name: "pinboard", url: "http://" + f.pinboard.addr, proxy: f.pinboard, backend: f.workers[0], redis: f.redis})
	if f.pinboardB != nil {
		ts = append(ts, target{name: "pinboard-b", url: "http://" + f.pinboardB.addr, proxy: f.pinboardB, backend: f.workers[0], redis: f.redis})
	}
	if !peers {
		return ts
	}
	if s.o.NoPeers {
		s.note("nginx and HAProxy skipped (-no-peers)")
		return ts
	}
	for _, peer := range []struct {
		name  string
		start func(string) (*proc, error)
	}{{"nginx", f.startNginx}, {"haproxy", f.startHAProxy}} {
		p, err := peer.start(f.local.addr)
		if errors.Is(err, errPeerMissing) {
			s.note("%s rows skipped: %s is not installed (cmd/bench -install installs it from the distribution's packages)", peer.name, peer.name)
			continue
		}
		if err != nil {
			s.note("%s rows skipped: %v", peer.name, strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", " / "))
			continue
		}
		ts = append(ts, target{name: peer.name, url: "http://" + p.addr, proxy: p, backend: f.local})
	}
	return ts
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

func has(ts []target, name string) bool {
	for _, t := range ts {
		if t.name == name {
			return true
		}
	}
	return false
}

// ---- proxy ----

func (s *session) proxySuite(ctx context.Context) error {
	f, err := s.startFleet(1, true)
	if err != nil {
		return err
	}
	defer f.close()
	ts := s.targets(f, true)
	get := []string{"-path", "/counter/{id}/", "-dist", "uniform", "-keys", "1000"}
	ws := []workload{
		{name: "closed-64", desc: "closed loop, 64 connections, GET /counter/{id}/ over 1000 uniform ids", args: append([]string{"-c", "64"}, get...)},
		{name: "closed-256", desc: "closed loop, 256 connections", args: append([]string{"-c", "256"}, get...)},
		{name: "open-12k", desc: "open loop at 12 000 req/s, 64 connections, latency from the intended send time", args: append([]string{"-rate", "12000", "-c", "64", "-max-workers", "512"}, get...), open: true},
		{name: "cpu-5k", desc: "open loop at 5 000 req/s, 64 connections: CPU per request without perf attached", args: append([]string{"-rate", "5000", "-c", "64", "-max-workers", "512"}, get...), open: true},
		{name: "cost-5k", desc: "open loop at 5 000 req/s, 64 connections, with perf stat on the proxy and the backend: syscalls and context switches per request (counting tracepoints adds CPU: read CPU per request in cpu-5k)", args: append([]string{"-rate", "5000", "-c", "64", "-max-workers", "512"}, get...), open: true, perf: true},
		{name: "overload", desc: "closed loop, 3 000 connections: past the 512 requests a worker takes at a time (the pinboard queues the rest up to 1 s per worker, HAProxy's server maxconn 512 with timeout queue 1s likewise, nginx opens what upstream connections it needs); goodput is 2xx per second", args: append([]string{"-c", "3000", "-timeout", "10s"}, get...), overload: true},
	}
	if s.o.Smoke {
		ws = []workload{
			{name: "closed-64", desc: "closed loop, 64 connections (smoke)", args: append([]string{"-c", "64"}, get...)},
			{name: "cost-1k", desc: "open loop at 1 000 req/s with perf stat (smoke)", args: append([]string{"-rate", "1000", "-c", "16"}, get...), open: true, perf: true},
		}
	}
	if len(s.o.Workloads) > 0 {
		var keep []workload
		for _, w := range ws {
			if slices.Contains(s.o.Workloads, w.name) {
				keep = append(keep, w)
			}
		}
		if len(keep) == 0 {
			return fmt.Errorf("-workloads %v selects none of the proxy workloads", s.o.Workloads)
		}
		ws = keep
	}
	if err := s.rounds(ctx, f.rig, ws, ts); err != nil {
		return err
	}
	b := &s.md
	b.WriteString("## proxy\n\n")
	if f.pinboardB != nil {
		fmt.Fprintf(b, "**pinboard-b** is the binary `%s`, run next to pinboard (built from this tree) on the same Redis and the same worker, and alternated with it in every round: a before/after comparison.\n\n", s.bins.pinboardB)
	}
	fmt.Fprintf(b, "The same small GET (`/counter/{id}/`, a JSON body of ~70 bytes) direct to a counter process, through pinboard (to a fleet-mode counter "+
		"registered with it; placements cached, Redis on the side), through nginx and through HAProxy (static upstream to the direct counter, keep-alive). "+
		"Targets alternate in every round (%s), %d rounds; every figure is the median over rounds, every ratio the median of the per-round ratios. "+
		"CPU per request is utime+stime from /proc/<pid>/stat over the run ÷ requests (10 ms ticks; nginx: master and workers); syscalls and context "+
		"switches are `perf stat -e %s -p <pids>` ÷ requests.\n\n", targetNames(ts), s.o.Rounds, perfEvents)
	for _, w := range ws {
		s.workloadTable(w, ts)
	}
	s.ratioTable(ws, ts)
	if !s.o.Smoke {
		s.targetTable(ts)
	}
	s.res.Markdown = b.String()
	return nil
}

func targetNames(ts []target) string {
	var n []string
	for _, t := range ts {
		n = append(n, t.name)
	}
	return strings.Join(n, " → ")
}

func rateOf(x Sample) float64 { return x.Rate }
func p99Of(x Sample) float64  { return x.P99 }
func mbpsOf(x Sample) float64 { return x.MBps }

// ratioTable writes pinboard ÷ others per workload (rate for closed loops,
// p99 for open loops) and records them as values.
func (s *session) ratioTable(ws []workload, ts []target) {
	pairs := [][2]string{{"pinboard", "direct"}, {"pinboard", "nginx"}, {"pinboard", "haproxy"}, {"nginx", "direct"}, {"haproxy", "direct"}, {"pinboard", "pinboard-b"}, {"pinboard-b", "direct"}}
	fmt.Fprintf(&s.md, "#### ratios (median of per-round ratios; closed loop: throughput, open loop: p99 latency)\n\n")
	head := []string{"workload", "metric"}
	var used [][2]string
	for _, p := range pairs {
		if has(ts, p[0]) && has(ts, p[1]) {
			head = append(head, p[0]+" ÷ "+p[1])
			used = append(used, p)
		}
	}
	var rows [][]string
	for _, w := range ws {
		metric, f, name := "req/s", rateOf, "rate"
		switch {
		case w.open:
			metric, f, name = "p99", p99Of, "p99"
		case w.overload:
			metric, f, name = "goodput", func(x Sample) float64 { return x.Goodput }, "goodput"
		}
		row := []string{w.name, metric}
		for _, p := range used {
			v := ratio(s.pick(w.name, p[0]), s.pick(w.name, p[1]), f)
			s.res.Values[fmt.Sprintf("%s %s/%s %s", w.name, p[0], p[1], name)] = v
			row = append(row, fmtNum(v, 2))
		}
		rows = append(rows, row)
		for _, t := range ts {
			m := s.pick(w.name, t.name)
			s.res.Values[fmt.Sprintf("%s %s rate", w.name, t.name)] = medianOf(m, rateOf)
			s.res.Values[fmt.Sprintf("%s %s p99 ms", w.name, t.name)] = medianOf(m, p99Of)
			s.res.Values[fmt.Sprintf("%s %s errors", w.name, t.name)] = medianOf(m, func(x Sample) float64 { return float64(x.Errors + x.Unsent) })
			if t.proxy != nil {
				s.res.Values[fmt.Sprintf("%s %s proxy cpu us/req", w.name, t.name)] = medianOf(m, func(x Sample) float64 { return x.CPUus["proxy"] })
				if w.perf {
					s.res.Values[fmt.Sprintf("%s %s proxy syscalls/req", w.name, t.name)] = medianOf(m, func(x Sample) float64 { return nanIfMissing(x.Syscalls, "proxy") })
					s.res.Values[fmt.Sprintf("%s %s proxy cs/req", w.name, t.name)] = medianOf(m, func(x Sample) float64 { return nanIfMissing(x.CSwitches, "proxy") })
				}
			}
		}
	}
	table(&s.md, head, rows)
}

func nanIfMissing(m map[string]float64, k string) float64 {
	if v, ok := m[k]; ok {
		return v
	}
	return math.NaN()
}

// targetTable compares the run with the proxy's performance targets, all
// from this run: ratios are medians of same-round ratios, so the machine's
// drift between rounds cancels out. A row whose workload or peer did not
// run says so.
func (s *session) targetTable(ts []target) {
	v := s.res.Values
	cpu := func(role string) func(Sample) float64 {
		return func(x Sample) float64 { return nanIfMissing(x.CPUus, role) }
	}
	var rows [][]string
	add := func(what, target string, got float64, ok func(float64) bool, prec int, note string) {
		verdict := "–"
		shown := "–"
		if !math.IsNaN(got) {
			shown = fmtNum(got, prec)
			verdict = "missed"
			if ok(got) {
				verdict = "holds"
			}
		}
		rows = append(rows, []string{what, target, shown, verdict, note})
	}
	atLeast := func(t float64) func(float64) bool { return func(x float64) bool { return x >= t } }
	atMost := func(t float64) func(float64) bool { return func(x float64) bool { return x <= t } }
	r := func(w, a, b string, f func(Sample) float64) float64 {
		if !has(ts, a) || !has(ts, b) || len(s.pick(w, a)) == 0 {
			return math.NaN()
		}
		return ratio(s.pick(w, a), s.pick(w, b), f)
	}
	for _, w := range []string{"closed-64", "closed-256"} {
		for _, peer := range []string{"nginx", "haproxy"} {
			add(w+" throughput, pinboard ÷ "+peer, "≥ 1.00", r(w, "pinboard", peer, rateOf), atLeast(1), 3, "")
		}
	}
	for _, w := range []string{"closed-64", "cpu-5k"} {
		got := r(w, "pinboard", "nginx", cpu("proxy"))
		v[w+" pinboard/nginx proxy cpu"] = got
		add(w+" proxy CPU per request, pinboard ÷ nginx", "≤ 1.00", got, atMost(1), 3,
			fmt.Sprintf("%s µs vs %s µs", fmtNum(medianOf(s.pick(w, "pinboard"), cpu("proxy")), 1), fmtNum(medianOf(s.pick(w, "nginx"), cpu("proxy")), 1)))
	}
	nan := func(k string) float64 {
		if x, ok := v[k]; ok {
			return x
		}
		return math.NaN()
	}
	add("cost-5k proxy syscalls per request", "≤ 6.0", nan("cost-5k pinboard proxy syscalls/req"), atMost(6), 2,
		"nginx "+fmtNum(nan("cost-5k nginx proxy syscalls/req"), 2)+", HAProxy "+fmtNum(nan("cost-5k haproxy proxy syscalls/req"), 2))
	add("cost-5k proxy context switches per request", "≤ 1.5", nan("cost-5k pinboard proxy cs/req"), atMost(1.5), 2,
		"nginx "+fmtNum(nan("cost-5k nginx proxy cs/req"), 2)+", HAProxy "+fmtNum(nan("cost-5k haproxy proxy cs/req"), 2))
	add("cpu-5k open-loop p99, pinboard ÷ nginx", "≤ 1.10", r("cpu-5k", "pinboard", "nginx", p99Of), atMost(1.1), 3,
		fmt.Sprintf("%s ms vs %s ms", fmtNum(nan("cpu-5k pinboard p99 ms"), 2), fmtNum(nan("cpu-5k nginx p99 ms"), 2)))
	// The worker behind the pinboard is a fleet-mode counter; behind nginx,
	// the local-mode one (nginx cannot place ids): the same application,
	// with the fleet's per-request admission on one side only.
	wk := r("closed-64", "pinboard", "nginx", cpu("backend"))
	v["closed-64 pinboard/nginx backend cpu"] = wk
	add("closed-64 worker CPU per request, fed by pinboard ÷ by nginx", "≤ 1.00", wk, atMost(1), 3,
		fmt.Sprintf("%s µs (fleet worker) vs %s µs (local counter)", fmtNum(medianOf(s.pick("closed-64", "pinboard"), cpu("backend")), 1),
			fmtNum(medianOf(s.pick("closed-64", "nginx"), cpu("backend")), 1)))
	// Overload: goodput at 3 000 connections ÷ the closed-64 throughput of
	// the same target in the same round, with no request left without an
	// HTTP answer.
	// direct is the reference: what the generator, the kernel and the
	// counter themselves lose at 3 000 connections, no proxy in between.
	for _, t := range []string{"pinboard", "direct", "nginx", "haproxy"} {
		over, base := s.pick("overload", t), s.pick("closed-64", t)
		if len(over) == 0 || len(base) == 0 {
			continue
		}
		var xs []float64
		var shed, broken int64
		for round, o := range over {
			shed += o.Shed
			broken += o.Broken
			if b, ok := base[round]; ok && b.Rate > 0 {
				xs = append(xs, o.Goodput/b.Rate)
			}
		}
		got := median(xs)
		v["overload "+t+" goodput/closed-64"] = got
		if t == "pinboard" {
			add("overload goodput ÷ closed-64 throughput, pinboard", "≥ 0.80, no request unanswered", got,
				func(x float64) bool { return x >= 0.8 && broken == 0 }, 3, fmt.Sprintf("%d shed with 503, %d without an answer", shed, broken))
		} else {
			rows = append(rows, []string{"overload goodput ÷ closed-64 throughput, " + t, "(reference)", fmtNum(got, 3), "",
				fmt.Sprintf("%d shed with 503, %d without an answer", shed, broken)})
		}
	}
	lag := ""
	if m := s.pick("open-12k", "direct"); len(m) > 0 {
		lag = fmt.Sprintf("generator lag p99 %s ms, max %s ms", fmtNum(medianOf(m, func(x Sample) float64 { return x.ScheduleLagP99Ms }), 2),
			fmtNum(maxOf(m, func(x Sample) float64 { return x.ScheduleLagMaxMs }), 2))
	}
	add("open-12k direct p99 ms (the generator's own accuracy)", "≤ 5", nan("open-12k direct p99 ms"), atMost(5), 2, lag)
	if s.o.PinProxy != "" {
		add("proxy pinned to "+s.o.PinProxy+": closed-64 pinboard ÷ HAProxy", "≥ 1.00", r("closed-64", "pinboard", "haproxy", rateOf), atLeast(1), 3, "one-core run")
	}
	fmt.Fprintf(&s.md, "#### against the performance targets (this run only)\n\n")
	table(&s.md, []string{"figure", "target", "measured", "verdict", "detail"}, rows)
}

// ---- activation ----

func (s *session) activationSuite(ctx context.Context) error {
	f, err := s.startFleet(s.o.Workers, true)
	if err != nil {
		return err
	}
	defer f.close()
	ts := []target{
		{name: "pinboard", url: "http://" + f.pinboard.addr, proxy: f.pinboard, backend: f.workers[0], redis: f.redis},
		{name: "direct", url: "http://" + f.local.addr, backend: f.local},
	}
	w := workload{name: "activate", desc: "closed loop, 64 connections, GET /counter/{id}/ with a new id every request (-dist new): every request activates an instance",
		args: []string{"-c", "64", "-path", "/counter/{id}/", "-dist", "new"}}
	// Redis commands per activation, from the pinboard runs.
	var cmdsPer []float64
	for round := 1; round <= s.o.Rounds; round++ {
		for _, t := range ts {
			var before map[string]int64
			if t.name == "pinboard" {
				if before, err = redisCommandStats(f.redis.addr); err != nil {
					return err
				}
			}
			smp, err := s.measure(ctx, f.rig, w, t, round)
			if err != nil {
				return err
			}
			s.res.Samples = append(s.res.Samples, smp)
			if t.name == "pinboard" {
				after, err := redisCommandStats(f.redis.addr)
				if err != nil {
					return err
				}
				if ok := smp.Sent - smp.Errors; ok > 0 {
					cmdsPer = append(cmdsPer, float64(sumDelta(before, after))/float64(ok))
				}
			}
		}
	}
	b := &s.md
	b.WriteString("## activation\n\n")
	fmt.Fprintf(b, "Cold activations: every request names an id never seen before, so the pinboard places it (Redis claim, power of two choices over %d fleet workers) "+
		"and the worker activates a new counter instance. `direct` is the same load on one local-mode counter (activation without placement), for reference. "+
		"Rates are activations per second; latency is per activation request.\n\n", s.o.Workers)
	s.workloadTable(w, ts)
	s.res.Values["activations/s pinboard"] = medianOf(s.pick(w.name, "pinboard"), rateOf)
	s.res.Values["activation p50 ms pinboard"] = medianOf(s.pick(w.name, "pinboard"), func(x Sample) float64 { return x.P50 })
	s.res.Values["activation p99 ms pinboard"] = medianOf(s.pick(w.name, "pinboard"), p99Of)
	s.res.Values["activations/s direct"] = medianOf(s.pick(w.name, "direct"), rateOf)
	s.res.Values["redis commands/activation"] = median(cmdsPer)
	fmt.Fprintf(b, "Redis commands per activation through pinboard (INFO commandstats delta ÷ successful activations, heartbeats included): **%s** (median of %d runs).\n\n",
		fmtNum(median(cmdsPer), 2), len(cmdsPer))
	s.res.Markdown = b.String()
	return nil
}

// ---- streaming ----

func (s *session) streamingSuite(ctx context.Context) error {
	f, err := s.startFleet(1, true)
	if err != nil {
		return err
	}
	defer f.close()
	ts := s.targets(f, true)
	big, bigName := int64(100<<20), "100MiB"
	if s.o.Smoke {
		big, bigName = 8<<20, "8MiB"
		s.note("smoke: the large body is 8 MiB, not 100 MiB")
	}
	ws := []workload{
		{name: "1MiB", desc: "GET /counter/{id}/blob?size=1048576, closed loop, 16 connections, body read and discarded",
			args: []string{"-scenario", "download", "-path", "/counter/{id}/blob?size=1048576", "-c", "16", "-keys", "100"}},
		{name: bigName, desc: fmt.Sprintf("GET /counter/{id}/blob?size=%d, closed loop, 2 connections", big),
			args: []string{"-scenario", "download", "-path", fmt.Sprintf("/counter/{id}/blob?size=%d", big), "-c", "2", "-keys", "100", "-timeout", "120s"}},
		{name: "up1MiB", desc: "POST /counter/{id}/incr with a 1 MiB body (Content-Length, generated while sent), closed loop, 16 connections",
			args: []string{"-scenario", "upload", "-path", "/counter/{id}/incr", "-c", "16", "-keys", "100"}},
	}
	if err := s.rounds(ctx, f.rig, ws, ts); err != nil {
		return err
	}
	b := &s.md
	b.WriteString("## streaming\n\n")
	fmt.Fprintf(b, "Large responses streamed by the counter (`GET /blob`, Content-Length framed, generated while written), and large "+
		"request bodies streamed to it (`POST /incr`, which the counter reads whole and ignores). nginx and HAProxy have response buffering "+
		"off for /blob, and nginx request buffering off. MB/s is body bytes (10^6) per second, responses' for the downloads and requests' "+
		"for the upload; the proxy's resident memory after the run shows that bodies are not buffered whole. Targets alternate in rounds (%s).\n\n",
		targetNames(ts))
	for _, w := range ws {
		fmt.Fprintf(b, "#### %s — %s\n\n", w.name, w.desc)
		var rows [][]string
		for _, t := range ts {
			m := s.pick(w.name, t.name)
			var errs int64
			var rss int64
			for _, x := range m {
				errs += x.Errors + x.Unsent
				rss = max(rss, x.ProxyPeakRSSKiB)
			}
			rssText := "–"
			if t.proxy != nil {
				rssText = fmt.Sprintf("%.1f", float64(rss)/1024)
			}
			rows = append(rows, []string{t.name, fmtNum(medianOf(m, mbpsOf), 0), spread(m, mbpsOf), fmtNum(medianOf(m, rateOf), 1),
				fmtNum(medianOf(m, func(x Sample) float64 { return x.P50 }), 1), fmtNum(medianOf(m, p99Of), 1), fmt.Sprint(errs),
				fmtNum(medianOf(m, func(x Sample) float64 { return nanIfMissing(x.CPUus, "proxy") / 1000 }), 2), rssText})
			s.res.Values[w.name+" "+t.name+" MB/s"] = medianOf(m, mbpsOf)
			s.res.Values[w.name+" "+t.name+" errors"] = float64(errs)
		}
		table(b, []string{"target", "MB/s (median)", "MB/s min–max", "responses/s", "p50 ms", "p99 ms", "errors", "proxy CPU ms/response", "proxy peak RSS MiB"}, rows)
		var rrows [][]string
		for _, p := range [][2]string{{"pinboard", "direct"}, {"pinboard", "nginx"}, {"pinboard", "haproxy"}, {"nginx", "direct"}, {"haproxy", "direct"}} {
			if has(ts, p[0]) && has(ts, p[1]) {
				v := ratio(s.pick(w.name, p[0]), s.pick(w.name, p[1]), mbpsOf)
				s.res.Values[fmt.Sprintf("%s %s/%s MB/s", w.name, p[0], p[1])] = v
				rrows = append(rrows, []string{p[0] + " ÷ " + p[1], fmtNum(v, 2)})
			}
		}
		table(b, []string{"ratio (MB/s, median of per-round ratios)", w.name}, rrows)
		if w.name == "1MiB" {
			fmt.Fprintf(b, "Performance target for 1 MiB responses: pinboard ÷ direct ≥ 0.60 (anchor: nginx 0.57); measured %s.\n\n",
				fmtNum(s.res.Values["1MiB pinboard/direct MB/s"], 2))
		}
	}
	s.res.Markdown = b.String()
	return nil
}

// ---- websocket ----

func (s *session) websocketSuite(ctx context.Context) error {
	f, err := s.startFleet(1, true)
	if err != nil {
		return err
	}
	defer f.close()
	ts := s.targets(f, true)
	w := workload{name: "ws-echo", desc: "16 websockets (/counter/{id}/ws), closed loop: send a 32-byte message, wait for its echo",
		args: []string{"-scenario", "ws", "-c", "16", "-path", "/counter/{id}/ws", "-keys", "16"}}
	if err := s.rounds(ctx, f.rig, []workload{w}, ts); err != nil {
		return err
	}
	b := &s.md
	b.WriteString("## websocket\n\n")
	fmt.Fprintf(b, "Echo round trips over websockets held open for the whole run; through pinboard the upgraded connection is a raw byte tunnel; "+
		"nginx (Upgrade/Connection passed on for /ws) and HAProxy (native in HTTP mode) tunnel the same way to the direct counter. "+
		"Rates are round trips per second, latencies are RTTs. Targets alternate in rounds (%s).\n\n", targetNames(ts))
	s.workloadTable(w, ts)
	for _, t := range ts {
		m := s.pick(w.name, t.name)
		s.res.Values["ws "+t.name+" round trips/s"] = medianOf(m, rateOf)
		s.res.Values["ws "+t.name+" p50 ms"] = medianOf(m, func(x Sample) float64 { return x.P50 })
		s.res.Values["ws "+t.name+" p99 ms"] = medianOf(m, p99Of)
		s.res.Values["ws "+t.name+" errors"] = medianOf(m, func(x Sample) float64 { return float64(x.Errors) })
	}
	v := ratio(s.pick(w.name, "pinboard"), s.pick(w.name, "direct"), rateOf)
	s.res.Values["ws pinboard/direct rate"] = v
	fmt.Fprintf(b, "pinboard ÷ direct round trips/s: **%s**; p99 RTT ratio: %s.", fmtNum(v, 2), fmtNum(ratio(s.pick(w.name, "pinboard"), s.pick(w.name, "direct"), p99Of), 2))
	for _, peer := range []string{"nginx", "haproxy"} {
		if !has(ts, peer) {
			continue
		}
		r := ratio(s.pick(w.name, "pinboard"), s.pick(w.name, peer), rateOf)
		s.res.Values["ws pinboard/"+peer+" rate"] = r
		fmt.Fprintf(b, " pinboard ÷ %s round trips/s: **%s**.", peer, fmtNum(r, 2))
	}
	b.WriteString("\n\n")
	s.res.Markdown = b.String()
	return nil
}

// ---- redis ----

func (s *session) redisSuite(ctx context.Context) error {
	f, err := s.startFleet(1, false)
	if err != nil {
		return err
	}
	defer f.close()
	keys, warmReq := 1000, 20000
	if s.o.Smoke {
		keys, warmReq = 100, 2000
	}
	url := "http://" + f.pinboard.addr
	common := []string{"-url", url, "-path", "/counter/{id}/", "-dist", "uniform", "-keys", strconv.Itoa(keys), "-c", "64"}
	// Place every id first: warmReq requests over keys ids miss one with
	// probability about keys·e^(-warmReq/keys).
	if _, _, err := f.runLoadgen(ctx, "redis-warm", append(common, "-requests", strconv.Itoa(warmReq), "-duration", "60s")...); err != nil {
		return err
	}
	type window struct {
		calls map[string]int64
		secs  float64
		reqs  int64
	}
	// The idle windows come first and the load windows back to back: an
	// idle gap between load windows would let cached placements expire
	// unseen and crowd their re-reads into the next load window (that
	// doubled the figure before).
	var idle, load []window
	for range s.o.Rounds {
		before, err := redisCommandStats(f.redis.addr)
		if err != nil {
			return err
		}
		t0 := time.Now()
		select {
		case <-time.After(s.o.Duration):
		case <-ctx.Done():
			return ctx.Err()
		}
		after, err := redisCommandStats(f.redis.addr)
		if err != nil {
			return err
		}
		idle = append(idle, window{delta(before, after), time.Since(t0).Seconds(), 0})
	}
	// Entries expired during the idle windows: one cache lifetime of load
	// (the lease) refreshes them all before anything is measured, and the
	// windows then see the steady re-read of each id once per lifetime.
	settle := pinboard.DefaultLease // the rig's pinboards run with the default lease
	if s.o.Smoke {
		settle = time.Second
	}
	if _, _, err := f.runLoadgen(ctx, "redis-settle", append(common, "-duration", settle.String(), "-requests", "0")...); err != nil {
		return err
	}
	before, err := redisCommandStats(f.redis.addr)
	if err != nil {
		return err
	}
	cacheBefore, err := placementCounters(f.pinboard.admin)
	if err != nil {
		return err
	}
	for round := 1; round <= s.o.Rounds; round++ {
		t0 := time.Now()
		rep, _, err := f.runLoadgen(ctx, "redis-load", append(common, "-duration", s.o.Duration.String(), "-requests", "0")...)
		if err != nil {
			return err
		}
		after, err := redisCommandStats(f.redis.addr)
		if err != nil {
			return err
		}
		load = append(load, window{delta(before, after), time.Since(t0).Seconds(), rep.Requests.Sent})
		before = after
		smp := sampleOf(rep)
		smp.Workload, smp.Target, smp.Round = "steady", "pinboard", round
		s.res.Samples = append(s.res.Samples, smp)
		s.logf("  redis round %d: %d requests, %d commands (idle window %d)", round, rep.Requests.Sent, sum(load[len(load)-1].calls), sum(idle[round-1].calls))
	}
	cacheAfter, err := placementCounters(f.pinboard.admin)
	if err != nil {
		return err
	}
	totals := map[string][2]int64{}
	var reqs, loadCalls, idleCalls int64
	var loadSecs, idleSecs float64
	for i := range load {
		l, id := load[i], idle[i]
		reqs += l.reqs
		loadCalls, idleCalls = loadCalls+sum(l.calls), idleCalls+sum(id.calls)
		loadSecs, idleSecs = loadSecs+l.secs, idleSecs+id.secs
		for k, v := range l.calls {
			t := totals[k]
			t[1] += v
			totals[k] = t
		}
		for k, v := range id.calls {
			t := totals[k]
			t[0] += v
			totals[k] = t
		}
	}
	// Ratios of sums, not medians of per-window ratios: the re-reads come
	// in waves (ids first read together expire together, give or take the
	// spread), so single windows swing between nearly none and a whole wave.
	var perReq, netPerReq float64
	if reqs > 0 {
		perReq = float64(loadCalls) / float64(reqs)
		netPerReq = math.Max(0, float64(loadCalls)-float64(idleCalls)*loadSecs/max(idleSecs, 1e-9)) / float64(reqs)
	}
	s.res.Values["redis commands/request"] = perReq
	s.res.Values["redis commands/request net of idle"] = netPerReq
	s.res.Values["redis requests"] = float64(reqs)
	var missPerReq, refreshPerSec float64
	if reqs > 0 {
		missPerReq = (cacheAfter.misses - cacheBefore.misses) / float64(reqs)
		refreshPerSec = (cacheAfter.refreshes - cacheBefore.refreshes) / max(loadSecs, 1e-9)
	}
	s.res.Values["redis placement misses/request"] = missPerReq
	s.res.Values["redis placement refreshes/s"] = refreshPerSec
	b := &s.md
	b.WriteString("## redis (steady state)\n\n")
	fmt.Fprintf(b, "Requests through pinboard over %d ids already placed (uniform, closed loop, 64 connections); `INFO commandstats` deltas over each "+
		"load window ÷ requests, and over idle windows of the same length measured first (heartbeats, the janitor); the load windows run back to back, "+
		"as an idle gap would let cached placements expire unseen and crowd their re-reads into the next window, after %v of unmeasured load. %d idle and %d load windows, %v each.\n\n",
		keys, settle, s.o.Rounds, s.o.Rounds, s.o.Duration)
	fmt.Fprintf(b, "**Redis commands per request: %s** (all commands in the load windows ÷ all their requests); net of the idle background: %s. Requests measured: %d over %.1f s.\n\n",
		fmtNum(perReq, 5), fmtNum(netPerReq, 5), reqs, loadSecs)
	fmt.Fprintf(b, "**Requests that waited for Redis (placement cache misses) per request: %s**; placements refreshed ahead of their expiry in the "+
		"background: %s per second (the pinboard's `pinned_placecache_misses_total` and `pinned_placement_refreshes_total{result=\"extended\"}` over the load windows).\n\n",
		fmtNum(missPerReq, 5), fmtNum(refreshPerSec, 1))
	var names []string
	for k := range totals {
		names = append(names, k)
	}
	sort.Strings(names)
	var rows [][]string
	for _, k := range names {
		rows = append(rows, []string{"`" + strings.ReplaceAll(k, "|", "\\|") + "`", fmt.Sprint(totals[k][0]), fmt.Sprint(totals[k][1])})
	}
	if len(rows) == 0 {
		rows = append(rows, []string{"(none)", "0", "0"})
	}
	table(b, []string{"command", "calls in idle windows", "calls in load windows"}, rows)
	s.res.Markdown = b.String()
	return nil
}

func delta(before, after map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 && k != "info" {
			out[k] = d
		}
	}
	return out
}

func sumDelta(before, after map[string]int64) int64 { return sum(delta(before, after)) }

func sum(m map[string]int64) int64 {
	var t int64
	for _, v := range m {
		t += v
	}
	return t
}

// ---- memory ----

func (s *session) memorySuite(ctx context.Context) error {
	r, c, err := s.startLocalCounter()
	if err != nil {
		return err
	}
	defer r.close()
	steps := []int{10_000, 100_000}
	if s.o.Smoke {
		steps = []int{1000, 2000}
		s.note("smoke: 1 000 and 2 000 instances instead of 10 000 and 100 000; the host benchmark is not run")
	}
	url := "http://" + c.addr
	if code, _ := httpGet(url+"/counter/warm/", 5*time.Second); code != 200 {
		return fmt.Errorf("counter warm-up request = %d", code)
	}
	base, err := heapStats(c.admin)
	if err != nil {
		return err
	}
	rss0, _ := rssKiB(c.Pid())
	var rows [][]string
	active := 0
	for _, n := range steps {
		rep, _, err := r.runLoadgen(ctx, "memory", "-url", url, "-path", "/counter/{id}/", "-dist", "new", "-c", "64",
			"-requests", strconv.Itoa(n-active), "-duration", "10m")
		if err != nil {
			return err
		}
		active += int(rep.Requests.Sent - rep.Requests.Errors)
		if rep.Requests.Errors > 0 {
			s.note("%d activation requests failed: %s", rep.Requests.Errors, sampleOf(rep).ErrorDetail)
		}
		h, err := heapStats(c.admin)
		if err != nil {
			return err
		}
		rss, _ := rssKiB(c.Pid())
		per := float64(h["HeapAlloc"]-base["HeapAlloc"]) / float64(active)
		perInuse := float64(h["HeapInuse"]-base["HeapInuse"]) / float64(active)
		perRSS := float64(rss-rss0) * 1024 / float64(active)
		s.res.Values[fmt.Sprintf("bytes/instance %d heap", n)] = per
		s.res.Values[fmt.Sprintf("bytes/instance %d rss", n)] = perRSS
		rows = append(rows, []string{fmt.Sprint(active), fmtNum(per, 0), fmtNum(perInuse, 0), fmtNum(perRSS, 0),
			fmtNum(float64(h["HeapAlloc"])/(1<<20), 1), fmtNum(float64(rss)/1024, 1)})
		s.logf("  memory: %d instances, %.0f B/instance heap", active, per)
	}
	b := &s.md
	b.WriteString("## memory per idle instance\n\n")
	b.WriteString("A local-mode counter process; instances activated by GET /counter/<new id>/ and left idle (idle timeout 1 h). Heap figures come from the " +
		"worker's admin listener (`/debug/pprof/heap?gc=1&debug=1`: a GC, then runtime.MemStats) minus the figure before the first activation; RSS from /proc. " +
		"A counter instance is the host's bookkeeping plus the Counter object (id, nonce, a websocket map).\n\n")
	table(b, []string{"idle instances", "HeapAlloc B/instance", "HeapInuse B/instance", "RSS B/instance", "HeapAlloc MiB", "RSS MiB"}, rows)
	if !s.o.Smoke {
		out, err := hostBench(ctx, s.o.ModuleDir)
		if err != nil {
			s.note("host benchmark failed: %v", err)
		} else {
			b.WriteString("The host's own overhead (an empty object type, in process: `go test -run '^$' -bench IdleInstanceMemory -benchtime 1x ./host`):\n\n")
			var hr [][]string
			for _, m := range out {
				hr = append(hr, []string{m[0], m[1]})
				s.res.Values["host bench bytes/instance "+m[0]], _ = strconv.ParseFloat(m[1], 64)
			}
			table(b, []string{"instances", "B/instance"}, hr)
		}
	}
	s.res.Markdown = b.String()
	return nil
}

var benchLine = regexp.MustCompile(`BenchmarkIdleInstanceMemory/(\d+)\S*\s+\d+\s+.*?([\d.]+) B/instance`)

func hostBench(ctx context.Context, dir string) ([][2]string, error) {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", "IdleInstanceMemory", "-benchtime", "1x", "-timeout", "300s", "./host")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%v\n%s", err, tail(out, 1000))
	}
	var res [][2]string
	for _, m := range benchLine.FindAllStringSubmatch(string(out), -1) {
		res = append(res, [2]string{m[1], m[2]})
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("no B/instance lines in:\n%s", tail(out, 1000))
	}
	return res, nil
}

var memStatLine = regexp.MustCompile(`(?m)^# (HeapAlloc|HeapInuse|Sys) = (\d+)`)

// heapStats forces a GC in the process behind admin and returns its
// runtime.MemStats heap figures.
func heapStats(admin string) (map[string]int64, error) {
	code, body := httpGet("http://"+admin+"/debug/pprof/heap?gc=1&debug=1", 30*time.Second)
	if code != 200 {
		return nil, fmt.Errorf("GET %s heap profile: %d", admin, code)
	}
	out := map[string]int64{}
	for _, m := range memStatLine.FindAllStringSubmatch(string(body), -1) {
		out[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
	}
	if len(out) == 0 {
		return nil, errors.New("heap profile without MemStats")
	}
	return out, nil
}

// ---- profile ----

// profileSuite captures CPU and allocation profiles of the pinboard and of
// the worker from their admin listeners while the proxy suite's closed-64
// load runs through pinboard.
func (s *session) profileSuite(ctx context.Context) error {
	f, err := s.startFleet(1, false)
	if err != nil {
		return err
	}
	defer f.close()
	if err := os.MkdirAll(s.o.ProfileDir, 0o755); err != nil {
		return err
	}
	d := 3 * s.o.Duration
	secs := int(d.Seconds())
	if secs < 1 {
		secs = 1
	}
	url := "http://" + f.pinboard.addr
	args := []string{"-url", url, "-path", "/counter/{id}/", "-dist", "uniform", "-keys", "1000", "-c", "64", "-requests", "0"}
	if _, _, err := f.runLoadgen(ctx, "profile-warm", append(args, "-duration", s.o.Warmup.String())...); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, p := range []struct{ name, admin string }{{"pinboard", f.pinboard.admin}, {"worker", f.workers[0].admin}} {
		for _, kind := range []string{"profile", "allocs"} {
			file := p.name + "-cpu.pb.gz"
			if kind == "allocs" {
				file = p.name + "-allocs.pb.gz"
			}
			u := fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", p.admin, kind, secs)
			wg.Go(func() {
				if err := fetch(ctx, u, filepath.Join(s.o.ProfileDir, file), d+30*time.Second); err != nil {
					errs <- err
				}
			})
		}
	}
	rep, _, err := f.runLoadgen(ctx, "profile", append(args, "-duration", (d+time.Second).String())...)
	wg.Wait()
	close(errs)
	if err != nil {
		return err
	}
	for e := range errs {
		return e
	}
	smp := sampleOf(rep)
	smp.Workload, smp.Target = "profile", "pinboard"
	s.res.Samples = append(s.res.Samples, smp)
	s.res.Values["profile rate"] = smp.Rate
	b := &s.md
	b.WriteString("## profile\n\n")
	fmt.Fprintf(b, "CPU and allocation profiles (%d s each, `?seconds=%d` on `/debug/pprof/profile` and `/debug/pprof/allocs` of both admin listeners) "+
		"under closed-loop load through pinboard (64 connections, 1000 uniform ids, %.0f req/s while profiled), written to `%s`.\n\n",
		secs, secs, smp.Rate, s.o.ProfileDir)
	s.res.Markdown = b.String()
	return nil
}
