//go:build !pinned_spans

package proxy

import "github.com/valyala/fasthttp"

// spanStamps is empty without the pinned_spans tag (spans.go).
type spanStamps struct{}

func (*spanStamps) begin([]byte, int64)             {}
func (*spanStamps) stamp(int)                       {}
func (*spanStamps) stampAt(int, int64)              {}
func (*spanStamps) worker(*fasthttp.ResponseHeader) {}

// spanLog is empty without the pinned_spans tag.
type spanLog struct{}

func (*spanLog) record(*spanStamps) {}
func (*spanLog) flush(int)          {}
