// Package logtest captures slog records for tests that assert what a
// component logs: the message, the level, and every attribute, including
// those added with Logger.With (groups are flattened as "group.key").
//
// Invariant: a Recorder keeps every record handled, in order, and is safe
// for concurrent use; values are kept as their slog.Value.String() form.
package logtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// Record is one captured log record.
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// String formats r like slog's text handler (attributes unordered).
func (r Record) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "level=%s msg=%q", r.Level, r.Msg)
	for k, v := range r.Attrs {
		fmt.Fprintf(&b, " %s=%q", k, v)
	}
	return b.String()
}

// Recorder collects records.
type Recorder struct {
	mu      sync.Mutex
	records []Record
}

// Logger returns a logger writing into r at level and above.
func (r *Recorder) Logger(level slog.Level) *slog.Logger {
	return slog.New(&handler{r: r, level: level})
}

// Records returns a copy of every record so far.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Record(nil), r.records...)
}

// Find returns the records with message msg whose attributes include every
// key/value pair of want (as strings).
func (r *Recorder) Find(msg string, want map[string]string) []Record {
	var out []Record
	for _, rec := range r.Records() {
		if rec.Msg != msg {
			continue
		}
		ok := true
		for k, v := range want {
			if rec.Attrs[k] != v {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, rec)
		}
	}
	return out
}

// Dump formats every record, one a line, for failure messages.
func (r *Recorder) Dump() string {
	var b strings.Builder
	for _, rec := range r.Records() {
		b.WriteString(rec.String())
		b.WriteByte('\n')
	}
	return b.String()
}

type handler struct {
	r      *Recorder
	level  slog.Level
	attrs  []slog.Attr // from WithAttrs, keys already prefixed
	prefix string      // from WithGroup
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *handler) Handle(_ context.Context, rec slog.Record) error {
	out := Record{Level: rec.Level, Msg: rec.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		flatten(out.Attrs, "", a)
	}
	rec.Attrs(func(a slog.Attr) bool {
		flatten(out.Attrs, h.prefix, a)
		return true
	})
	h.r.mu.Lock()
	h.r.records = append(h.r.records, out)
	h.r.mu.Unlock()
	return nil
}

func flatten(m map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p = prefix + a.Key + "."
		}
		for _, g := range v.Group() {
			flatten(m, p, g)
		}
		return
	}
	m[prefix+a.Key] = v.String()
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		if h.prefix != "" {
			a = slog.Attr{Key: strings.TrimSuffix(h.prefix, ".") + "." + a.Key, Value: a.Value}
		}
		n.attrs = append(n.attrs, a)
	}
	return &n
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.prefix = h.prefix + name + "."
	return &n
}
