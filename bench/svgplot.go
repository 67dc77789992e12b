package bench

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// curve is one plotted series: y over x, points in x order; NaN ys are
// left out (not measured).
type curve struct {
	name string
	x, y []float64
}

// chart is a scale curve's plot: x on a log scale (the dimension grows by
// tens), y linear from 0, or on a log scale when logY is set (so that a
// straight line of slope 1 is linear growth).
type chart struct {
	title, xLabel, yLabel string
	logY                  bool
	curves                []curve
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH             = 720, 420
	chartL, chartR             = 80, 20
	chartT, chartB             = 40, 60
	chartInW, chartInH float64 = chartW - chartL - chartR, chartH - chartT - chartB
)

var chartColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

// svg returns the chart as a self-contained SVG document (no scripts, no
// external resources). A chart without a single finite point says so in
// its plot area.
func (c chart) svg() string {
	xMin, xMax, yMin, yMax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, cv := range c.curves {
		for i := range cv.x {
			if !c.usable(cv.x[i], cv.y[i]) {
				continue
			}
			xMin, xMax = math.Min(xMin, cv.x[i]), math.Max(xMax, cv.x[i])
			yMin, yMax = math.Min(yMin, cv.y[i]), math.Max(yMax, cv.y[i])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, "<rect width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n", chartW, chartH)
	fmt.Fprintf(&b, "<text x=\"%d\" y=\"22\" font-size=\"14\">%s</text>\n", chartL, html.EscapeString(c.title))
	fmt.Fprintf(&b, "<rect x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#888\"/>\n", chartL, chartT, chartInW, chartInH)
	fmt.Fprintf(&b, "<text x=\"%g\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", chartL+chartInW/2, chartH-14, html.EscapeString(c.xLabel))
	fmt.Fprintf(&b, "<text x=\"18\" y=\"%g\" text-anchor=\"middle\" transform=\"rotate(-90 18 %g)\">%s</text>\n",
		chartT+chartInH/2, chartT+chartInH/2, html.EscapeString(c.yLabel))
	if math.IsInf(xMin, 1) {
		fmt.Fprintf(&b, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" fill=\"#888\">not measured</text>\n</svg>\n", chartL+chartInW/2, chartT+chartInH/2)
		return b.String()
	}
	// x: decades from the one at or below xMin to the one at or above xMax.
	lx0, lx1 := math.Floor(math.Log10(xMin)), math.Ceil(math.Log10(xMax))
	if lx1 == lx0 {
		lx1++
	}
	xOf := func(x float64) float64 { return chartL + (math.Log10(x)-lx0)/(lx1-lx0)*chartInW }
	for d := lx0; d <= lx1; d++ {
		x := xOf(math.Pow(10, d))
		fmt.Fprintf(&b, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%g\" stroke=\"#ddd\"/>\n", x, chartT, x, chartT+chartInH)
		fmt.Fprintf(&b, "<text x=\"%.1f\" y=\"%g\" text-anchor=\"middle\">%s</text>\n", x, chartT+chartInH+16, tickLabel(math.Pow(10, d)))
	}
	var yOf func(float64) float64
	if c.logY {
		ly0, ly1 := math.Floor(math.Log10(yMin)), math.Ceil(math.Log10(yMax))
		if ly1 == ly0 {
			ly1++
		}
		yOf = func(y float64) float64 { return chartT + chartInH - (math.Log10(y)-ly0)/(ly1-ly0)*chartInH }
		for d := ly0; d <= ly1; d++ {
			y := yOf(math.Pow(10, d))
			fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", chartL, y, chartL+chartInW, y)
			fmt.Fprintf(&b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", chartL-6, y+4, tickLabel(math.Pow(10, d)))
		}
	} else {
		step := niceStep(math.Max(yMax, 1e-9) / 5)
		top := step * math.Ceil(math.Max(yMax, 1e-9)/step)
		yOf = func(y float64) float64 { return chartT + chartInH - y/top*chartInH }
		for v := 0.0; v <= top*1.0000001; v += step {
			y := yOf(v)
			fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%g\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", chartL, y, chartL+chartInW, y)
			fmt.Fprintf(&b, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", chartL-6, y+4, tickLabel(v))
		}
	}
	for i, cv := range c.curves {
		color := chartColors[i%len(chartColors)]
		var pts []string
		for j := range cv.x {
			if !c.usable(cv.x[j], cv.y[j]) {
				continue
			}
			px, py := xOf(cv.x[j]), yOf(cv.y[j])
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px, py))
			fmt.Fprintf(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s: %s at %s</title></circle>\n",
				px, py, color, html.EscapeString(cv.name), tickLabel(cv.y[j]), tickLabel(cv.x[j]))
		}
		if len(pts) > 1 {
			fmt.Fprintf(&b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", color, strings.Join(pts, " "))
		}
		ly := chartT + 16 + 18*i
		fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n", chartL+12, ly, chartL+36, ly, color)
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"%d\">%s</text>\n", chartL+42, ly+4, html.EscapeString(cv.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// usable reports whether (x, y) can be drawn: finite, x > 0, and y > 0 on
// a log scale.
func (c chart) usable(x, y float64) bool {
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }
	return !bad(x) && !bad(y) && x > 0 && (!c.logY || y > 0)
}

// niceStep rounds raw up to 1, 2, 2.5 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			return m * mag
		}
	}
	return 10 * mag
}

// tickLabel writes v briefly: 1k, 10k, 1M, 0.5, 120.
func tickLabel(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6 && math.Mod(a, 1e5) == 0:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e3 && math.Mod(a, 100) == 0:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	case a >= 100 || a == math.Trunc(a):
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
