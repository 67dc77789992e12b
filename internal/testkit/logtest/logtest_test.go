package logtest

import (
	"log/slog"
	"testing"
)

// Records keep the level, the message, attributes added with With (also
// inside a group) and the record's own; levels below the logger's are
// dropped.
func TestRecorder(t *testing.T) {
	r := &Recorder{}
	l := r.Logger(slog.LevelInfo).With("logger", "pinned.x")
	l.Debug("dropped")
	l.Info("hello", "n", 1)
	l.WithGroup("g").With("a", "b").Warn("grouped", "c", 2, slog.Group("h", "d", true))
	recs := r.Records()
	if len(recs) != 2 {
		t.Fatalf("records = %v", recs)
	}
	if got := r.Find("hello", map[string]string{"logger": "pinned.x", "n": "1"}); len(got) != 1 || got[0].Level != slog.LevelInfo {
		t.Errorf("Find(hello) = %v", got)
	}
	if got := r.Find("grouped", map[string]string{"logger": "pinned.x", "g.a": "b", "g.c": "2", "g.h.d": "true"}); len(got) != 1 {
		t.Errorf("Find(grouped) = %v; all: %s", got, r.Dump())
	}
	if got := r.Find("hello", map[string]string{"n": "2"}); len(got) != 0 {
		t.Errorf("Find with a wrong value = %v", got)
	}
}
