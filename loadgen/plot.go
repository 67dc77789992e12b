package loadgen

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// Plot geometry, in SVG user units.
const (
	plotW, plotH                       = 960, 540
	plotL, plotR, plotT, plotB         = 80, 30, 40, 70
	plotInnerW, plotInnerH     float64 = plotW - plotL - plotR, plotH - plotT - plotB
	maxPlotNines                       = 7
)

var plotColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// WritePlotHTML writes a self-contained HTML page (inline SVG, no scripts,
// no external resources) with two charts side by side. The first plots the
// latency percentile curves of reports in the style of HdrHistogram's
// plotter: the x axis is the percentile on a log scale of 1/(1-p) (0%, 90%,
// 99%, 99.9%, ...), the y axis the latency. The second is the run over
// time, from Report.Series: p50, p99 and p99.9 latency of each second
// above, requests per second and errors per second below. A table of the
// headline percentiles, schedule lag and generator CPU follows.
func WritePlotHTML(w io.Writer, title string, reports []*Report) error {
	var b strings.Builder
	if title == "" {
		title = "loadgen latency"
	}
	labels := make([]string, len(reports))
	maxCount, maxUs := int64(10), int64(1)
	for i, rep := range reports {
		labels[i] = seriesLabel(rep, i)
		maxCount = max(maxCount, rep.Latency.Count)
		for _, p := range rep.Distribution {
			maxUs = max(maxUs, p.Us)
		}
	}
	nines := min(maxPlotNines, max(2, int(math.Ceil(math.Log10(float64(maxCount))))))
	xOf := func(pct float64) float64 {
		v := float64(nines)
		if pct < 100 {
			v = min(v, math.Log10(100/(100-pct)))
		}
		return plotL + v/float64(nines)*plotInnerW
	}
	step, unit, div := yScale(maxUs)
	yMax := step * math.Ceil(float64(maxUs)/step)
	yOf := func(us float64) float64 { return plotT + plotInnerH - us/yMax*plotInnerH }

	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>\n", html.EscapeString(title))
	b.WriteString("<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}" +
		"td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}" +
		".charts{display:flex;flex-wrap:wrap;gap:1em}</style>\n")
	fmt.Fprintf(&b, "</head><body>\n<h2>%s</h2>\n<div class=\"charts\">\n", html.EscapeString(title))
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
		plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" fill=\"#fff\" stroke=\"#888\"/>\n", plotL, plotT, plotInnerW, plotInnerH)

	// x grid: 0%, 90%, 99%, ...
	for k := 0; k <= nines; k++ {
		pct := 100 - 100/math.Pow(10, float64(k))
		x := xOf(pct)
		fmt.Fprintf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%g\" stroke=\"#ddd\"/>\n", x, plotT, x, plotT+plotInnerH)
		fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", x, plotT+plotInnerH+18, ninesLabel(k))
	}
	fmt.Fprintf(&b, "<text x=\"%g\" y=\"%d\" text-anchor=\"middle\">percentile</text>\n", plotL+plotInnerW/2, plotH-20)
	// y grid
	for v := 0.0; v <= yMax*1.0000001; v += step {
		y := yOf(v)
		fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", plotL, y, plotL+plotInnerW, y)
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", plotL-6, y+4,
			strconv.FormatFloat(v/div, 'f', -1, 64))
	}
	fmt.Fprintf(&b, "<text x=\"18\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 18 %g)\">latency (%s)</text>\n",
		plotT+plotInnerH/2, plotT+plotInnerH/2, unit)

	for i, rep := range reports {
		color := plotColors[i%len(plotColors)]
		b.WriteString("<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + color + "\" points=\"")
		for _, p := range rep.Distribution {
			fmt.Fprintf(&b, "%.1f,%.1f ", xOf(p.Percentile), yOf(float64(p.Us)))
		}
		b.WriteString("\"><title>" + html.EscapeString(labels[i]) + "</title></polyline>\n")
		ly := plotT + 16 + 18*i
		fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n", plotL+12, ly, plotL+36, ly, color)
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\">%s</text>\n", plotL+42, ly+4, html.EscapeString(labels[i]))
	}
	b.WriteString("</svg>\n")
	writeSeriesSVG(&b, reports, labels)
	b.WriteString("</div>\n")

	b.WriteString("<table>\n<tr><th>run</th><th>mode</th><th>engine</th><th>count</th><th>rate/s</th><th>errors</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>p99.99</th><th>max</th>" +
		"<th>lag p99</th><th>lag max</th><th>generator CPU/req</th></tr>\n")
	for i, rep := range reports {
		l := &rep.Latency
		fmt.Fprintf(&b, "<tr><td style=\"color:%s\">%s</td><td>%s</td><td>%s</td><td>%d</td><td>%.1f</td><td>%d</td>",
			plotColors[i%len(plotColors)], html.EscapeString(labels[i]), html.EscapeString(rep.Config.Mode),
			html.EscapeString(string(rep.Generator.Engine)), l.Count, rep.AchievedRate, rep.Errors.Total)
		for _, v := range []int64{l.P50, l.P90, l.P99, l.P999, l.P9999, l.Max} {
			fmt.Fprintf(&b, "<td>%s</td>", html.EscapeString(fmtUs(float64(v))))
		}
		lag99, lagMax := "–", "–"
		if g := rep.ScheduleLag; g != nil {
			lag99, lagMax = fmtUs(float64(g.P99)), fmtUs(float64(g.Max))
		}
		fmt.Fprintf(&b, "<td>%s</td><td>%s</td><td>%.1fµs</td></tr>\n", html.EscapeString(lag99), html.EscapeString(lagMax), rep.Generator.CPUPerRequestUs)
	}
	b.WriteString("</table>\n<p>Latency is measured from the intended send time in open-loop runs (coordinated-omission free) " +
		"and from the actual send in closed-loop runs. Schedule lag is how late the generator sent (its own slop); generator CPU is its " +
		"process CPU time per request. Over time: each second's requests are those that completed in it.</p>\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// ninesLabel returns the percentile with k nines: 0%, 90%, 99%, 99.9%, ...
func ninesLabel(k int) string {
	switch k {
	case 0:
		return "0%"
	case 1:
		return "90%"
	case 2:
		return "99%"
	}
	return "99." + strings.Repeat("9", k-2) + "%"
}

func seriesLabel(rep *Report, i int) string {
	if rep.Label != "" {
		return rep.Label
	}
	return fmt.Sprintf("run %d (%s)", i+1, rep.Config.Mode)
}

// yScale picks a tick step (in µs) giving about 5 ticks up to maxUs, and the
// display unit with its divisor.
func yScale(maxUs int64) (step float64, unit string, div float64) {
	raw := float64(max(maxUs, 1)) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step = 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	step = max(step, 1)
	switch top := step * 5; {
	case top < 2000:
		return step, "µs", 1
	case top < 2e6:
		return step, "ms", 1e3
	default:
		return step, "s", 1e6
	}
}

// Series chart geometry: a latency panel above a rate panel.
const (
	serLatT, serLatH = 40, 280
	serRateT         = serLatT + serLatH + 50
	serRateH         = 110
)

// writeSeriesSVG draws the reports' per-second series: p50 (thin), p99
// (solid) and p99.9 (dashed) latency above, requests per second (line) and
// errors per second (red bars) below.
func writeSeriesSVG(b *strings.Builder, reports []*Report, labels []string) {
	var maxSec int64 = 1
	var maxUs int64 = 1
	maxRate := 1.0
	for _, rep := range reports {
		for _, p := range rep.Series {
			maxSec = max(maxSec, p.Second+1)
			maxUs = max(maxUs, p.P999)
			maxRate = max(maxRate, p.Rate)
		}
	}
	xOf := func(sec float64) float64 { return plotL + sec/float64(maxSec)*plotInnerW }
	step, unit, div := yScale(maxUs)
	yMax := step * math.Ceil(float64(maxUs)/step)
	yLat := func(us float64) float64 { return serLatT + serLatH - us/yMax*serLatH }
	rStep, _, _ := yScale(int64(math.Ceil(maxRate)))
	rMax := rStep * math.Ceil(maxRate/rStep)
	yRate := func(r float64) float64 { return serRateT + serRateH - r/rMax*serRateH }

	fmt.Fprintf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
		plotW, plotH, plotW, plotH)
	for _, panel := range []struct{ top, h float64 }{{serLatT, serLatH}, {serRateT, serRateH}} {
		fmt.Fprintf(b, "<rect x=\"%d\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"#fff\" stroke=\"#888\"/>\n", plotL, panel.top, plotInnerW, panel.h)
	}
	// x ticks: about 10 whole seconds
	xStep := max(1, int64(math.Ceil(float64(maxSec)/10)))
	for s := int64(0); s <= maxSec; s += xStep {
		x := xOf(float64(s))
		for _, panel := range []struct{ top, h float64 }{{serLatT, serLatH}, {serRateT, serRateH}} {
			fmt.Fprintf(b, "<line x1=\"%.1f\" y1=\"%g\" x2=\"%.1f\" y2=\"%g\" stroke=\"#eee\"/>\n", x, panel.top, x, panel.top+panel.h)
		}
		fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", x, serRateT+serRateH+16, s)
	}
	fmt.Fprintf(b, "<text x=\"%g\" y=\"%d\" text-anchor=\"middle\">second of the measured phase</text>\n", plotL+plotInnerW/2, plotH-8)
	for v := 0.0; v <= yMax*1.0000001; v += step {
		y := yLat(v)
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#eee\"/>\n", plotL, y, plotL+plotInnerW, y)
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", plotL-6, y+4, strconv.FormatFloat(v/div, 'f', -1, 64))
	}
	fmt.Fprintf(b, "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">latency (%s)</text>\n",
		serLatT+serLatH/2, serLatT+serLatH/2, unit)
	for _, v := range []float64{0, rMax / 2, rMax} {
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", plotL-6, yRate(v)+4, strconv.FormatFloat(v, 'f', -1, 64))
	}
	fmt.Fprintf(b, "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">req/s</text>\n",
		serRateT+serRateH/2, serRateT+serRateH/2)

	line := func(color, width, dash string, pts []string, tip string) {
		if len(pts) == 0 {
			return
		}
		fmt.Fprintf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"%s\"><title>%s</title></polyline>\n",
			color, width, dash, strings.Join(pts, " "), html.EscapeString(tip))
	}
	for i, rep := range reports {
		color := plotColors[i%len(plotColors)]
		var p50, p99, p999, rate []string
		for _, p := range rep.Series {
			x := xOf(float64(p.Second) + 0.5)
			rate = append(rate, fmt.Sprintf("%.1f,%.1f", x, yRate(p.Rate)))
			if p.Errors > 0 {
				w := plotInnerW / float64(maxSec) * 0.6
				fmt.Fprintf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#d62728\" opacity=\"0.6\"><title>%s: %d errors in second %d</title></rect>\n",
					x-w/2, yRate(float64(p.Errors)), w, float64(serRateT+serRateH)-yRate(float64(p.Errors)), html.EscapeString(labels[i]), p.Errors, p.Second)
			}
			if p.Requests == p.Errors {
				continue // no response: no latency
			}
			p50 = append(p50, fmt.Sprintf("%.1f,%.1f", x, yLat(float64(p.P50))))
			p99 = append(p99, fmt.Sprintf("%.1f,%.1f", x, yLat(float64(p.P99))))
			p999 = append(p999, fmt.Sprintf("%.1f,%.1f", x, yLat(float64(p.P999))))
		}
		line(color, "1", "", p50, labels[i]+" p50")
		line(color, "2", "", p99, labels[i]+" p99")
		line(color, "2", ` stroke-dasharray="6 3"`, p999, labels[i]+" p99.9")
		line(color, "2", "", rate, labels[i]+" requests/s")
		// The legend sits above the panels, three runs to a row, so that no
		// spike hides it.
		lx, ly := plotL+(i%3)*280, 12+(i/3)*14
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n", lx, ly, lx+20, ly, color)
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%d\">%s</text>\n", lx+26, ly+4, html.EscapeString(labels[i]))
	}
	fmt.Fprintf(b, "<text x=\"%g\" y=\"%d\" text-anchor=\"end\" fill=\"#555\">thin p50, solid p99, dashed p99.9 of each second</text>\n", plotL+plotInnerW, serLatT-6)
	b.WriteString("</svg>\n")
}
