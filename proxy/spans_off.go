//go:build !pinned_spans

package proxy

// spanStamps is empty without the pinned_spans tag (spans.go).
type spanStamps struct{}

func (*spanStamps) begin([]byte, int64) {}
func (*spanStamps) stamp(int)           {}
func (*spanStamps) stampAt(int, int64)  {}

// spanLog is empty without the pinned_spans tag.
type spanLog struct{}

func (*spanLog) record(*spanStamps) {}
func (*spanLog) flush(int)          {}
