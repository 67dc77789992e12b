// Package metricshttp serves pinned's metrics over fasthttp: an application
// mounts one handler that writes, in the Prometheus text exposition format
// (version 0.0.4), every metrics.Set it owns (its hosts', its worker's,
// its own) and, optionally, the go_* and process_* metrics.
//
//	set := metrics.NewSet() // given to host.Config and worker.Config
//	r.GET("/metrics", metricshttp.Handler(metricshttp.Config{
//		Sets: []*metrics.Set{set}, Process: true, Metadata: true}))
//
// Invariants:
//
//   - The output is valid exposition whatever the sets hold: the lines of
//     one metric name are written as one contiguous group, in the order
//     the name first appeared, even when several sets (or a set's
//     RegisterMetricsWriter callbacks) contribute samples to it.
//   - Nothing is global: the handler writes only the sets it was given (and
//     the process's own go_*/process_* metrics when Config.Process is set);
//     metrics.RegisterSet and the default set are not used.
//   - It answers GET and HEAD only (405 otherwise) and never panics on the
//     content of a set.
//   - With Config.Metadata, each family gets at most one "# HELP" and one
//     "# TYPE" line, written before its first sample; Catalogue() (the
//     types and meanings) is docs/metrics.md row for row.
package metricshttp

import (
	"bytes"
	"io"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
)

// ContentType is the Content-Type of the Prometheus text format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Config says what a handler writes.
type Config struct {
	// Sets are written in order. A nil entry is skipped.
	Sets []*metrics.Set
	// Process adds the go_* (runtime) and process_* (CPU, memory, file
	// descriptors, I/O) metrics of the running process.
	Process bool
	// Metadata adds "# HELP" and "# TYPE" lines: for pinned's families the
	// type and meaning from Catalogue (docs/metrics.md); for go_* and
	// process_* a HELP naming their source (they stay untyped). Other
	// names get none. Nothing is added when the output already carries
	// TYPE lines (metrics.ExposeMetadata was switched on).
	Metadata bool
}

// Handler returns a fasthttp handler serving cfg's metrics. Mount it at
// /metrics on an admin listener (or on the application's server when that
// port is private).
func Handler(cfg Config) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if !ctx.IsGet() && !ctx.IsHead() {
			ctx.Response.Header.Set(fasthttp.HeaderAllow, "GET, HEAD")
			ctx.SetContentType("application/json")
			ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
			ctx.SetBodyString(`{"error":"method not allowed; use GET"}`)
			return
		}
		ctx.SetContentType(ContentType)
		Write(ctx, cfg)
	}
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Write writes cfg's metrics to w in the Prometheus text format, each
// metric name's lines in one group.
func Write(w io.Writer, cfg Config) {
	raw := bufPool.Get().(*bytes.Buffer)
	raw.Reset()
	defer bufPool.Put(raw)
	for _, s := range cfg.Sets {
		if s != nil {
			s.WritePrometheus(raw)
		}
	}
	if cfg.Process {
		metrics.WriteProcessMetrics(raw)
	}
	meta := cfg.Metadata && !bytes.Contains(raw.Bytes(), []byte("# TYPE "))
	w.Write(group(raw.Bytes(), meta))
}

// group reorders exposition lines so that the lines of each metric name are
// contiguous. Comment lines (# HELP, # TYPE) stay in front of the group of
// the name they describe. The relative order of names (first appearance)
// and of lines within a name is kept. With meta, HELP and TYPE lines are
// written before each family (metadata).
func group(in []byte, meta bool) []byte {
	type span struct{ lines [][]byte }
	var order []string
	groups := map[string]*span{}
	for len(in) > 0 {
		line := in
		if i := bytes.IndexByte(in, '\n'); i >= 0 {
			line, in = in[:i+1], in[i+1:]
		} else {
			line, in = append(line[:len(line):len(line)], '\n'), nil
		}
		name := lineName(line)
		if name == "" {
			continue // blank or unparseable: dropped
		}
		g := groups[name]
		if g == nil {
			g = &span{}
			groups[name] = g
			order = append(order, name)
		}
		g.lines = append(g.lines, line)
	}
	out := make([]byte, 0, len(in)+64*len(order))
	described := map[string]bool{}
	for _, name := range order {
		if meta {
			out = appendMetadata(out, name, described)
		}
		for _, l := range groups[name].lines {
			out = append(out, l...)
		}
	}
	return out
}

// appendMetadata writes the HELP (and TYPE) lines of the family name
// belongs to, once per family. A histogram's _bucket, _sum and _count
// lines belong to its family; their groups follow each other, since they
// first appear together.
func appendMetadata(out []byte, name string, described map[string]bool) []byte {
	family, f, ok := name, Family{}, false
	if f, ok = catalogueIndex[name]; !ok {
		for _, suffix := range [...]string{"_bucket", "_sum", "_count"} {
			if base, cut := strings.CutSuffix(name, suffix); cut {
				if hf, found := catalogueIndex[base]; found && hf.Type == "histogram" {
					family, f, ok = base, hf, true
					break
				}
			}
		}
	}
	if described[family] {
		return out
	}
	described[family] = true
	switch {
	case ok:
		out = append(out, "# HELP "+family+" "+escapeHelp(f.Help)+" ("+f.Component+")\n"...)
		out = append(out, "# TYPE "+family+" "+f.Type+"\n"...)
	case strings.HasPrefix(name, "go_"):
		out = append(out, "# HELP "+name+" Go runtime metric (VictoriaMetrics/metrics)\n"...)
	case strings.HasPrefix(name, "process_"):
		out = append(out, "# HELP "+name+" process metric (VictoriaMetrics/metrics)\n"...)
	}
	return out
}

// escapeHelp escapes a HELP text (backslash and newline).
func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

// lineName returns the metric name a line belongs to: the name of a sample,
// or the name a "# HELP" / "# TYPE" comment describes; "" for anything else.
func lineName(line []byte) string {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return ""
	}
	if line[0] == '#' {
		f := bytes.Fields(line)
		if len(f) >= 3 && (string(f[1]) == "HELP" || string(f[1]) == "TYPE") {
			return string(f[2])
		}
		return ""
	}
	end := bytes.IndexAny(line, "{ \t")
	if end <= 0 {
		return ""
	}
	return string(line[:end])
}
