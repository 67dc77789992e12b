package registry

import (
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// OversizeHead reports whether a request head announces, by its
// Content-Length, a body larger than any registry call accepts
// (wire.MaxBodyBytes). A server that prefetches request bodies before its
// handler runs (fasthttp with StreamRequestBody reads up to 8 KiB first)
// asks this right after the head, so that the refusal does not wait for a
// body nobody will read: see RefuseOversize.
func OversizeHead(h *fasthttp.RequestHeader) bool {
	return h.ContentLength() > wire.MaxBodyBytes
}

// pathEndpoints maps the registry's paths to their endpoint label.
var pathEndpoints = map[string]string{
	wire.PathRegister: epRegister, wire.PathHeartbeat: epHeartbeat, wire.PathRelease: epRelease,
	wire.PathReleases:   epReleases,
	wire.PathDeregister: epDeregister, wire.PathPush: epPush, wire.PathWorkers: epWorkers,
	wire.PathOverview: epOverview, wire.PathHealthz: epHealthz,
}

// RefuseOversize answers a registry call whose head announced a body over
// wire.MaxBodyBytes (OversizeHead): 413 with a JSON error and Connection:
// close (the unread body must never be parsed as a next request), counted
// like the endpoint's other answers. Nothing of the body has been read;
// the token is not checked (a refusal for size tells nothing about it). It
// returns the status.
func (r *Registry) RefuseOversize(ctx *fasthttp.RequestCtx) int {
	ctx.SetConnectionClose()
	code := writeBad(ctx, errTooLarge)
	if ep, ok := pathEndpoints[string(ctx.Path())]; ok {
		r.m.request(ep, code)
	}
	return code
}
