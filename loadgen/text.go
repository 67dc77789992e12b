package loadgen

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pinned-go/pinned/clock"
)

// WriteText writes the human-readable summary table.
func (rep *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	c := &rep.Config
	mode := fmt.Sprintf("closed loop, %d connections", c.Connections)
	if c.Mode == "open" {
		mode = fmt.Sprintf("open loop %s, %d connections", rateText(c), c.Connections)
	}
	switch g := &rep.Generator; g.Engine {
	case EngineLoop:
		mode += fmt.Sprintf(", %d event loops", g.Loops)
		if c.CoalesceUs > 0 {
			mode += fmt.Sprintf(", slots coalesced over %s", fmtUs(float64(c.CoalesceUs)))
		}
	case EngineFastHTTP:
		mode += ", fasthttp engine"
		if c.MaxWorkers > 0 {
			mode += fmt.Sprintf(" (≤%d workers)", c.MaxWorkers)
		}
	}
	ids := string(c.IDs.Dist)
	switch c.IDs.Dist {
	case DistUniform:
		ids = fmt.Sprintf("uniform over %d", c.IDs.Keys)
	case DistZipf:
		ids = fmt.Sprintf("zipf s=%g over %d", c.IDs.ZipfS, c.IDs.Keys)
	case DistNew:
		ids = "new every request (run " + rep.RunID + ")"
	}
	fmt.Fprintf(&b, "loadgen %s", c.URL)
	if rep.Label != "" {
		fmt.Fprintf(&b, " [%s]", rep.Label)
	}
	fmt.Fprintf(&b, ": %s; ids %s\n", mode, ids)
	ok := rep.Requests.Sent - rep.Requests.Errors
	fmt.Fprintf(&b, "%s after %.2fs: %d sent, %d unsent, %d ok; ", stopText(rep), rep.ElapsedSeconds, rep.Requests.Sent, rep.Requests.Unsent, ok)
	target := ""
	if rep.TargetRate > 0 {
		target = fmt.Sprintf("target %.6g req/s", rep.TargetRate)
	}
	if ok > 0 {
		fmt.Fprintf(&b, "%.1f req/s achieved (successful responses per second", rep.AchievedRate)
		if target != "" {
			b.WriteString("; " + target)
		}
		b.WriteString(")")
	} else {
		b.WriteString("no successful responses")
		if target != "" {
			b.WriteString(" (" + target + ")")
		}
	}
	b.WriteString("\n\n")

	from := "from actual send"
	if c.Mode == "open" {
		from = "from intended send time"
	}
	fmt.Fprintf(&b, "latency (%s)", from)
	if rep.Latency.Count == 0 {
		b.WriteString(": none, no request got a response (see errors)\n")
	} else {
		b.WriteString("\n")
		latencyTable(&b, rep)
	}
	if l := rep.ScheduleLag; l != nil && l.Count > 0 {
		fmt.Fprintf(&b, "schedule lag   p50 %s, p90 %s, p99 %s, p99.9 %s, max %s (mean %s): how late requests left\n",
			fmtUs(float64(l.P50)), fmtUs(float64(l.P90)), fmtUs(float64(l.P99)), fmtUs(float64(l.P999)), fmtUs(float64(l.Max)), fmtUs(l.Mean))
	} else if l != nil {
		b.WriteString("schedule lag   none: no request left (see errors)\n")
	}
	writeCounts(&b, rep)
	_, err := io.WriteString(w, b.String())
	return err
}

// stopText says what ended the run: the bound reached (and the other one,
// when both were set, so that a count never cuts a timed run short
// unnoticed) or an interruption.
func stopText(rep *Report) string {
	c := &rep.Config
	dur := time.Duration(c.DurationSeconds * float64(time.Second)).String()
	switch rep.StoppedBy {
	case StopDuration:
		if c.Requests > 0 {
			return fmt.Sprintf("stopped by the duration bound (%s), before the request bound (%d)", dur, c.Requests)
		}
		return fmt.Sprintf("stopped by the duration bound (%s)", dur)
	case StopRequests:
		if c.DurationSeconds > 0 {
			return fmt.Sprintf("stopped by the request bound (%d), before the duration bound (%s)", c.Requests, dur)
		}
		return fmt.Sprintf("stopped by the request bound (%d)", c.Requests)
	case StopCanceled:
		return "interrupted"
	}
	return "stopped by " + rep.StoppedBy
}

// latencyTable writes the latency percentiles: per scenario of a mix, all,
// and the open loop's service time.
func latencyTable(b *strings.Builder, rep *Report) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  scenario\tcount\terrors\tmean\tp50\tp90\tp99\tp99.9\tp99.99\tmax\t")
	row := func(name string, errs string, l *Latency) {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, l.Count, errs,
			fmtUs(l.Mean), fmtUs(float64(l.P50)), fmtUs(float64(l.P90)), fmtUs(float64(l.P99)),
			fmtUs(float64(l.P999)), fmtUs(float64(l.P9999)), fmtUs(float64(l.Max)))
	}
	if len(rep.Scenarios) > 1 {
		for i := range rep.Scenarios {
			s := &rep.Scenarios[i]
			row(s.Name, strconv.FormatInt(s.Errors, 10), &s.Latency)
		}
	}
	row("all", strconv.FormatInt(rep.Errors.Total, 10), &rep.Latency)
	if rep.Service != nil {
		row("service time", "", rep.Service)
	}
	_ = tw.Flush()
	if rep.Latency.Clamped > 0 {
		fmt.Fprintf(b, "  %d latencies above the histogram range were clamped to it (raise -max-latency)\n", rep.Latency.Clamped)
	}
}

// writeCounts writes bytes, statuses, errors and the generator's cost.
func writeCounts(b *strings.Builder, rep *Report) {
	fmt.Fprintf(b, "bytes          sent %s, received %s\n", fmtBytes(rep.Bytes.Sent), fmtBytes(rep.Bytes.Received))
	if len(rep.Statuses) > 0 {
		b.WriteString("statuses      ")
		for _, k := range sortedKeys(rep.Statuses) {
			fmt.Fprintf(b, " %s×%d", k, rep.Statuses[k])
		}
		b.WriteByte('\n')
	}
	e := &rep.Errors
	fmt.Fprintf(b, "errors         %d (%.3f%% of sent+unsent)", e.Total, 100*rep.ErrorRate)
	if e.Total > 0 {
		fmt.Fprintf(b, ": timeout %d, connect %d, connection %d, pool %d, other %d", e.Timeout, e.Connect, e.Connection, e.Pool, e.Other)
		if len(e.Status) > 0 {
			b.WriteString("; status")
			for _, k := range sortedKeys(e.Status) {
				fmt.Fprintf(b, " %s×%d", k, e.Status[k])
			}
		}
		if len(e.Reason) > 0 {
			b.WriteString("; reason")
			for _, k := range sortedKeys(e.Reason) {
				fmt.Fprintf(b, " %s×%d", k, e.Reason[k])
			}
		}
	}
	b.WriteByte('\n')
	for _, k := range sortedKeys(e.Samples) {
		fmt.Fprintf(b, "  first %s error: %s\n", k, e.Samples[k])
	}
	if rep.Requests.WSSkipped > 0 {
		fmt.Fprintf(b, "websocket      %d non-echo messages skipped\n", rep.Requests.WSSkipped)
	}
	g := &rep.Generator
	recorders := fmt.Sprintf("%d workers", g.Workers)
	if g.Engine == EngineLoop {
		recorders = fmt.Sprintf("%d loops", g.Loops)
	}
	fmt.Fprintf(b, "generator      %s engine, %s, GOMAXPROCS %d, CPU %.2fs = %.1fµs/request, %d GCs (pause total %s, max %s)\n",
		g.Engine, recorders, g.GoMaxProcs, g.CPUSeconds, g.CPUPerRequestUs, g.GCCount, fmtUs(float64(g.GCPauseTotalUs)), fmtUs(float64(g.GCPauseMaxUs)))
}

// rateText describes the open loop's rate: constant, or its schedule.
func rateText(c *ReportConfig) string {
	if len(c.Stages) == 0 {
		return fmt.Sprintf("%.6g req/s", c.Rate)
	}
	var parts []string
	for _, st := range c.Stages {
		r := fmt.Sprintf("%.6g", st.Rate)
		if st.EndRate != 0 && st.EndRate != st.Rate {
			r += "→" + fmt.Sprintf("%.6g", st.EndRate)
		}
		if st.Duration > 0 {
			r += " for " + st.Duration.String()
		}
		parts = append(parts, r)
	}
	return "req/s " + strings.Join(parts, ", ") + " (the last rate holds)"
}

// progress writes one line per ProgressInterval until stop is closed.
func (r *Runner) progress(stop <-chan struct{}, t0 clock.Instant) {
	clk := r.cfg.Clock
	t := clk.NewTimer(r.cfg.ProgressInterval)
	defer t.Stop()
	var prevDone int64
	prevAt := t0
	for {
		select {
		case <-stop:
			return
		case <-t.C():
		}
		now := clk.Now()
		var sent, done, errs int64
		for i := range r.live {
			c := &r.live[i]
			sent, done, errs = sent+c.sent.Load(), done+c.done.Load(), errs+c.errs.Load()
		}
		rate := 0.0
		if d := now.Sub(prevAt); d > 0 {
			rate = float64(done-prevDone) / d.Seconds()
		}
		phase := ""
		if now.Sub(t0) < r.cfg.Warmup {
			phase = " (warmup)"
		}
		fmt.Fprintf(r.cfg.Progress, "loadgen: %6.1fs%s sent %d done %d errors %d in-flight %d rate %.0f/s\n",
			now.Sub(t0).Round(100*time.Millisecond).Seconds(), phase, sent, done, errs, sent-done, rate)
		prevDone, prevAt = done, now
		t.Reset(r.cfg.ProgressInterval)
	}
}
