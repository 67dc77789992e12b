package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ---- scale: how every cost grows ----

// The scale suite measures how pinned's costs grow with each dimension a
// deployment can grow in (rows S1–S8, docs/scale.md): each row runs its
// points (1×, 10×, 100×, 1000× of its first one, bounded by
// Options.ScaleMax) one after another, each point on a rig of its own, and
// reports a table, a log-log slope per figure and an SVG plot per curve
// beside the markdown report. Smoke mode runs the smallest point of every
// row (S6: two pinboards, so that invalidations cross pinboards) with
// shorter windows.

// scaleRow is one row of the scale suite.
type scaleRow struct {
	id     string
	title  string // the dimension
	dim    string // what a point counts
	points []int  // the full ladder
	smoke  int    // the smoke point
	target string // what the row must show
}

// scaleRows are the suite's rows, in the order it runs them. S7 runs the
// points of S3 and of S5 on a Redis Cluster and on one node.
var scaleRows = []scaleRow{
	{"S1", "cached placements in one pinboard", "n ids", []int{1_000, 10_000, 100_000, 1_000_000}, 1_000,
		"≤ 128 B of pinboard RSS per cached id; lookup p99 flat"},
	{"S2", "idle instances on one worker", "n instances", []int{1_000, 10_000, 100_000, 1_000_000}, 1_000,
		"≤ 600 MB of worker RSS at 1 M instances; activation p99 flat"},
	{"S3", "registered workers (simulated, real protocol)", "workers", []int{1, 10, 100, 1000}, 1,
		"cold placement p99 and Redis commands per activation flat in the number of workers"},
	{"S4", "heartbeats", "workers", []int{1, 10, 100, 1000}, 1,
		"Redis commands/s and CPU of Redis and the pinboard measured; where the ceiling is"},
	{"S5", "activation storm: the worker holding the ids is killed", "n ids", []int{100, 1_000, 10_000, 100_000}, 100,
		"time until 99 % are served again, Redis peak ops, 503s: lease-only and fast failover"},
	{"S6", "pinboards sharing one Redis", "pinboards", []int{1, 2, 5, 10}, 2,
		"invalidation messages and Redis CPU per placement change flat per pinboard; placement p99 flat"},
	{"S7", "Redis Cluster (3 masters) against one node", "S3 workers / S5 ids", nil, 0,
		"S3 and S5 on the cluster within 1.5× of one node"},
	{"S8", "SIGTERM of a worker holding idle instances", "n instances", []int{1_000, 10_000, 100_000, 1_000_000}, 1_000,
		"every id released and re-placeable within the shutdown timeout at 1 M; releases batched"},
}

// ScaleRowIDs are the names of the scale suite's rows (Options.ScaleRows).
func ScaleRowIDs() []string {
	ids := make([]string, len(scaleRows))
	for i, r := range scaleRows {
		ids[i] = r.id
	}
	return ids
}

// CheckScale returns an error naming what is wrong with a selection of
// scale rows or a ScaleMax.
func CheckScale(rows []string, scaleMax int) error {
	for _, r := range rows {
		if !slices.Contains(ScaleRowIDs(), r) {
			return fmt.Errorf("unknown scale row %q; want some of %v", r, ScaleRowIDs())
		}
	}
	if scaleMax != 0 && !slices.Contains([]int{1, 10, 100, 1000}, scaleMax) {
		return fmt.Errorf("scale max %d; want 1, 10, 100 or 1000", scaleMax)
	}
	return nil
}

// row returns the row named id.
func row(id string) scaleRow {
	for _, r := range scaleRows {
		if r.id == id {
			return r
		}
	}
	panic("no scale row " + id)
}

// pointsOf returns the points of a row this run measures.
func (s *session) pointsOf(id string) []int {
	r := row(id)
	if s.o.Smoke {
		return []int{r.smoke}
	}
	limit := s.o.ScaleMax
	if limit == 0 {
		limit = 1000
	}
	var out []int
	for _, p := range r.points {
		if p <= r.points[0]*limit {
			out = append(out, p)
		}
	}
	return out
}

// scalePoint is what one point of a row measured.
type scalePoint struct {
	x       int    // the dimension
	variant string // "" or the configuration ("lease-only", "cluster", …)
	v       map[string]float64
}

// get returns the figure key (NaN when not measured).
func (p scalePoint) get(key string) float64 {
	if v, ok := p.v[key]; ok {
		return v
	}
	return math.NaN()
}

// scaleColumn is one column of a row's table: a figure and its precision.
type scaleColumn struct {
	key, head string
	prec      int
}

// scalePlot is one plot of a row: each key over the points, one curve per
// key and variant.
type scalePlot struct {
	name, title, yLabel string
	keys                []string
	logY                bool
}

// scaleReport is one row's section of the report.
type scaleReport struct {
	row      string
	dim      string // what a point counts, when not the row's (S7)
	about    string // the method, in markdown
	cols     []scaleColumn
	plots    []scalePlot
	pts      []scalePoint
	verdicts []string // against the row's target
}

// scaleSuite runs the selected rows and writes the section.
func (s *session) scaleSuite(ctx context.Context) error {
	want := func(id string) bool { return len(s.o.ScaleRows) == 0 || slices.Contains(s.o.ScaleRows, id) }
	if err := CheckScale(s.o.ScaleRows, s.o.ScaleMax); err != nil {
		return err
	}
	if s.o.Smoke {
		s.note("smoke: the smallest point of every row (S6: 2 pinboards), short windows; its numbers are not measurements")
	}
	var reports []scaleReport
	run := func(f func(context.Context) ([]scaleReport, error)) error {
		rs, err := f(ctx)
		reports = append(reports, rs...)
		return err
	}
	steps := []struct {
		rows []string
		f    func(context.Context) ([]scaleReport, error)
	}{
		{[]string{"S1", "S2"}, func(ctx context.Context) ([]scaleReport, error) { return s.scaleFillRows(ctx, want("S1"), want("S2")) }},
		{[]string{"S3", "S4"}, func(ctx context.Context) ([]scaleReport, error) { return s.scaleFleetRows(ctx, want("S3"), want("S4")) }},
		{[]string{"S5"}, s.scaleStormRow},
		{[]string{"S6"}, s.scalePinboardsRow},
		{[]string{"S7"}, s.scaleClusterRow},
		{[]string{"S8"}, s.scaleDrainRow},
	}
	for _, st := range steps {
		if !slices.ContainsFunc(st.rows, want) {
			continue
		}
		if err := run(st.f); err != nil {
			return err
		}
	}
	return s.writeScale(reports)
}

// scaleKey is the name of a figure in SuiteResult.Values: "S1 1000 rss B/id",
// "S5 100 lease-only time to 99% s".
func scaleKey(row string, p scalePoint, key string) string {
	k := row + " " + strconv.Itoa(p.x)
	if p.variant != "" {
		k += " " + p.variant
	}
	return k + " " + key
}

// writeScale writes every row's section: its method, a table, the slopes
// and verdicts, and the plots (SVG files beside the report).
func (s *session) writeScale(reports []scaleReport) error {
	b := &s.md
	b.WriteString("## scale\n\n")
	fmt.Fprintf(b, "How each cost grows (docs/scale.md has the method and the capacity table). Every point is measured on a rig of its own "+
		"(fresh redis-server, pinboards, workers), one after another; latency probes are open loops whose schedule lag and generator CPU "+
		"stand beside them, medians over %d runs of %v. A figure's *slope* is log(last ÷ first) ÷ log(dimension ratio) between the first and the "+
		"last point: 0 is flat, 1 grows linearly with the dimension.\n\n", s.o.Rounds, s.o.Duration)
	stamp := s.started.Format("20060102-1504")
	if err := os.MkdirAll(s.o.OutDir, 0o755); err != nil {
		return err
	}
	for i, r := range reports {
		rw := row(r.row)
		r.dim = r.dimOr()
		if i == 0 || reports[i-1].row != r.row {
			fmt.Fprintf(b, "### %s — %s\n\nTarget: %s.\n\n", rw.id, rw.title, rw.target)
		}
		fmt.Fprintf(b, "%s\n\n", r.about)
		head := []string{r.dim}
		hasVariant := slices.ContainsFunc(r.pts, func(p scalePoint) bool { return p.variant != "" })
		if hasVariant {
			head = append(head, "configuration")
		}
		for _, c := range r.cols {
			head = append(head, c.head)
		}
		var rows [][]string
		for _, p := range r.pts {
			line := []string{strconv.Itoa(p.x)}
			if hasVariant {
				line = append(line, p.variant)
			}
			for _, c := range r.cols {
				line = append(line, fmtNum(p.get(c.key), c.prec))
			}
			rows = append(rows, line)
			for k, v := range p.v {
				s.res.Values[scaleKey(r.row, p, k)] = v
			}
		}
		table(b, head, rows)
		if sl := slopes(r); sl != "" {
			b.WriteString(sl + "\n\n")
		}
		for _, v := range r.verdicts {
			fmt.Fprintf(b, "- %s\n", v)
		}
		if len(r.verdicts) > 0 {
			b.WriteString("\n")
		}
		for _, pl := range r.plots {
			name := fmt.Sprintf("%s-scale-%s-%s.svg", stamp, r.row, pl.name)
			if err := os.WriteFile(filepath.Join(s.o.OutDir, name), []byte(r.chart(pl, r.dim).svg()), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(b, "![%s %s](%s)\n", r.row, pl.title, name)
		}
		b.WriteString("\n")
	}
	capacity(b, reports)
	s.res.Markdown = b.String()
	return nil
}

// capacity writes what one process or one Redis takes, from the largest
// point of each row that ran: the capacity table of docs/scale.md.
func capacity(b *strings.Builder, reports []scaleReport) {
	var rows [][]string
	add := func(id, variant, key, what string, f func(float64) float64, prec int) {
		for _, r := range reports {
			if r.row != id {
				continue
			}
			if p, ok := largest(r.pts, variant, key); ok {
				rows = append(rows, []string{what, fmtNum(f(p.get(key)), prec), fmt.Sprintf("%s, %s = %d", id, r.dimOr(), p.x)})
				return
			}
		}
	}
	perGB := func(bytes float64) float64 { return perOrNaN(1e9, bytes) }
	same := func(v float64) float64 { return v }
	add("S1", "", "pinboard rss B/id", "placements one pinboard caches per GB of RSS", perGB, 0)
	add("S2", "", "worker rss B/instance", "idle instances per GB of a worker's RSS", perGB, 0)
	add("S1", "", "redis B/id", "placements per GB of Redis memory", perGB, 0)
	add("S2", "", "fill rate", "cold activations/s through one pinboard (closed loop, 64 connections)", same, 0)
	add("S4", "", "pinboard ceiling workers", "workers whose heartbeats take one pinboard core (extrapolated)", same, 0)
	add("S4", "", "redis ceiling workers", "workers whose heartbeats take Redis's thread (extrapolated)", same, 0)
	add("S5", leaseOnly, "time to 99% s", "seconds until 99 % of a killed worker's ids are served again, lease-only", same, 2)
	add("S5", fastFailover, "time to 99% s", "… with fast failover", same, 2)
	add("S8", "", "replaceable s", "seconds until a SIGTERMed worker's ids are re-placeable", same, 2)
	add("S7", cluster3, "cold placement p99 ms ratio", "cluster ÷ one node: cold placement p99", same, 2)
	add("S7", cluster3, "time to 99% s ratio", "cluster ÷ one node: time until 99 % of a killed worker's ids are served again", same, 2)
	if len(rows) == 0 {
		return
	}
	b.WriteString("### Capacity (from the largest point of each row)\n\n")
	table(b, []string{"capacity", "measured", "from"}, rows)
}

// dimOr is what the report's points count.
func (r scaleReport) dimOr() string {
	if r.dim != "" {
		return r.dim
	}
	return row(r.row).dim
}

// chart builds one plot of the row: a curve per key and variant.
func (r scaleReport) chart(pl scalePlot, dim string) chart {
	c := chart{title: r.row + ": " + pl.title, xLabel: dim + " (log scale)", yLabel: pl.yLabel, logY: pl.logY}
	var variants []string
	for _, p := range r.pts {
		if !slices.Contains(variants, p.variant) {
			variants = append(variants, p.variant)
		}
	}
	for _, k := range pl.keys {
		for _, vr := range variants {
			cv := curve{name: r.head(k)}
			if vr != "" {
				cv.name += ", " + vr
			}
			for _, p := range r.pts {
				if p.variant == vr {
					cv.x, cv.y = append(cv.x, float64(p.x)), append(cv.y, p.get(k))
				}
			}
			c.curves = append(c.curves, cv)
		}
	}
	return c
}

// head returns the column head of key (the key itself when no column
// shows it).
func (r scaleReport) head(key string) string {
	for _, c := range r.cols {
		if c.key == key {
			return c.head
		}
	}
	return key
}

// slope is the log-log slope of key between the first and the last point
// of a variant that measured it (NaN with fewer than two such points or a
// non-positive value).
func slope(pts []scalePoint, variant, key string) float64 {
	var xs, ys []float64
	for _, p := range pts {
		if v := p.get(key); p.variant == variant && !math.IsNaN(v) {
			xs, ys = append(xs, float64(p.x)), append(ys, v)
		}
	}
	if len(xs) < 2 || ys[0] <= 0 || ys[len(ys)-1] <= 0 || xs[0] == xs[len(xs)-1] {
		return math.NaN()
	}
	return math.Log(ys[len(ys)-1]/ys[0]) / math.Log(xs[len(xs)-1]/xs[0])
}

// growth names a slope: flat (below 0.2), sublinear, linear (0.8 to 1.2)
// or superlinear.
func growth(sl float64) string {
	switch {
	case math.IsNaN(sl):
		return "–"
	case sl < 0.2:
		return "flat"
	case sl < 0.8:
		return "sublinear"
	case sl <= 1.2:
		return "linear"
	}
	return "superlinear"
}

// slopes writes the slope of every plotted figure of the row.
func slopes(r scaleReport) string {
	var parts []string
	var variants []string
	for _, p := range r.pts {
		if !slices.Contains(variants, p.variant) {
			variants = append(variants, p.variant)
		}
	}
	for _, pl := range r.plots {
		for _, k := range pl.keys {
			for _, vr := range variants {
				sl := slope(r.pts, vr, k)
				if math.IsNaN(sl) {
					continue
				}
				name := r.head(k)
				if vr != "" {
					name += " (" + vr + ")"
				}
				parts = append(parts, fmt.Sprintf("%s %.2f (%s)", name, sl, growth(sl)))
			}
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "Slopes: " + strings.Join(parts, "; ") + "."
}

// largest returns the point of variant with the largest x that measured
// key, and whether there is one.
func largest(pts []scalePoint, variant, key string) (scalePoint, bool) {
	var best scalePoint
	ok := false
	for _, p := range pts {
		if p.variant == variant && !math.IsNaN(p.get(key)) && (!ok || p.x > best.x) {
			best, ok = p, true
		}
	}
	return best, ok
}

// verdictAtMost states a figure at the row's largest point against a bound
// that applies at point at (0: at whatever point is largest).
func verdictAtMost(pts []scalePoint, variant, key, what string, bound float64, at int) string {
	p, ok := largest(pts, variant, key)
	switch {
	case !ok:
		return what + ": not measured"
	case at != 0 && p.x < at:
		return fmt.Sprintf("%s: %s at %d (the target is for %d; not reached in this run)", what, fmtNum(p.get(key), 1), p.x, at)
	case p.get(key) <= bound:
		return fmt.Sprintf("%s: %s at %d — **holds** (≤ %s)", what, fmtNum(p.get(key), 1), p.x, fmtNum(bound, 0))
	}
	return fmt.Sprintf("%s: %s at %d — **missed** (≤ %s)", what, fmtNum(p.get(key), 1), p.x, fmtNum(bound, 0))
}

// verdictFlat states whether a figure stayed flat over the points.
func verdictFlat(pts []scalePoint, variant, key, what string) string {
	sl := slope(pts, variant, key)
	if math.IsNaN(sl) {
		return what + ": fewer than two points measured; flatness not judged"
	}
	verdict := "**holds**"
	if sl >= 0.2 {
		verdict = "**missed**: it grows"
	}
	return fmt.Sprintf("%s: slope %.2f (%s) — %s", what, sl, growth(sl), verdict)
}
