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
// no external resources) plotting the latency percentile curves of reports
// on one chart, in the style of HdrHistogram's plotter: the x axis is the
// percentile on a log scale of 1/(1-p) (0%, 90%, 99%, 99.9%, ...), the y
// axis the latency. A table of the headline percentiles follows.
func WritePlotHTML(w io.Writer, title string, reports []*Report) error {
	var b strings.Builder
	if title == "" {
		title = "loadgen latency by percentile"
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
		"td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}td:first-child,th:first-child{text-align:left}</style>\n")
	fmt.Fprintf(&b, "</head><body>\n<h2>%s</h2>\n", html.EscapeString(title))
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

	b.WriteString("<table>\n<tr><th>run</th><th>mode</th><th>count</th><th>rate/s</th><th>errors</th><th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>p99.99</th><th>max</th></tr>\n")
	for i, rep := range reports {
		l := &rep.Latency
		fmt.Fprintf(&b, "<tr><td style=\"color:%s\">%s</td><td>%s</td><td>%d</td><td>%.1f</td><td>%d</td>",
			plotColors[i%len(plotColors)], html.EscapeString(labels[i]), html.EscapeString(rep.Config.Mode),
			l.Count, rep.AchievedRate, rep.Errors.Total)
		for _, v := range []int64{l.P50, l.P90, l.P99, l.P999, l.P9999, l.Max} {
			fmt.Fprintf(&b, "<td>%s</td>", html.EscapeString(fmtUs(float64(v))))
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</table>\n<p>Latency is measured from the intended send time in open-loop runs (coordinated-omission free) " +
		"and from the actual send in closed-loop runs.</p>\n</body></html>\n")
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
