package registry

import (
	"context"
	"errors"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// releaseParallelism bounds the store calls one POST /registry/releases
// runs at a time. The Redis client pipelines concurrent calls on one
// connection, so a batch costs a few round trips, not one per release,
// while a batch never holds more than this many of the store's calls.
const releaseParallelism = 64

// parseReleases checks the whole body of POST /registry/releases: the
// fields every release shares, and the count. A release's id is checked on
// its own (checkReleasedID): one malformed id fails that release only.
func parseReleases(body []byte) (wire.ReleasesRequest, *badRequest) {
	var r wire.ReleasesRequest
	if e := decode(body, &r); e != nil {
		return r, e
	}
	if e := checkReleaseOf(r.ClientID, r.Namespace, r.SessionID); e != nil {
		return r, e
	}
	switch n := len(r.Releases); {
	case n == 0:
		return r, bad("releases", "is required (at least one release)")
	case n > wire.MaxReleaseBatch:
		return r, bad("releases", "has %d releases; at most %d per call", n, wire.MaxReleaseBatch)
	}
	return r, nil
}

// checkReleasedID checks the id of one release of a batch.
func checkReleasedID(id string) *badRequest {
	if id == "" {
		return bad("id", "is required")
	}
	if e := wire.CheckSegment([]byte(id), wire.MaxIDLen); e != wire.SegmentOK {
		return bad("id", "%v", e)
	}
	return nil
}

// releases frees many placements of one session: each exactly as release
// would free it alone, with its own result, at most releaseParallelism
// store calls at a time.
func (r *Registry) releases(ctx *fasthttp.RequestCtx, _ string) int {
	req, e := decodeRequest(ctx, parseReleases)
	if e != nil {
		return writeBad(ctx, e)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	first := req.Releases[0].ID
	target, code, err := r.releaseTarget(sctx, req.ClientID, req.SessionID, req.Namespace, first)
	switch {
	case code == fasthttp.StatusForbidden:
		return writeError(ctx, code, "sessionId belongs to another clientId", "sessionId")
	case err != nil:
		return r.storeFailed(ctx, "session", err)
	}
	out := wire.ReleasesResponse{Results: make([]wire.ReleaseResult, len(req.Releases))}
	errs := make([]error, len(req.Releases))
	r.forEachRelease(sctx, req, target, out.Results, errs)
	failed := 0
	for i, res := range out.Results {
		if res.Status == 0 {
			r.countRelease(res.Released)
		} else if res.Status >= 500 {
			failed++
			if failed == 1 && r.storeLog.Allow() {
				r.log.Error("store call failed", "op", "releases", "namespace", req.Namespace, "instance", req.Releases[i].ID, "err", errs[i])
			}
		}
	}
	if failed > 0 {
		r.m.storeErrors.Add(failed)
	}
	r.log.Debug("releases", "namespace", req.Namespace, "instances", len(req.Releases), "session", target, "client", req.ClientID, "storeFailures", failed)
	return writeJSON(ctx, fasthttp.StatusOK, out)
}

// storeFailure is the result of a release the store failed: what
// storeFailed would answer that release alone (503, retry, when the store
// is unavailable or slow; 500 otherwise), without the error's text.
func storeFailure(err error) wire.ReleaseResult {
	if errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrClosed) {
		return wire.ReleaseResult{Status: fasthttp.StatusServiceUnavailable, Error: "the directory is unavailable; retry"}
	}
	return wire.ReleaseResult{Status: fasthttp.StatusInternalServerError, Error: "the directory failed"}
}

// forEachRelease runs the releases of req against target, writing each
// result into out and each store error into errs (same index). Its
// goroutines end before it returns.
func (r *Registry) forEachRelease(sctx context.Context, req wire.ReleasesRequest, target string, out []wire.ReleaseResult, errs []error) {
	do := func(i int) {
		it := req.Releases[i]
		if e := checkReleasedID(it.ID); e != nil {
			out[i] = wire.ReleaseResult{Status: e.status, Error: e.msg, Field: e.field}
			return
		}
		if target == "" {
			return // the session ended: nothing to free
		}
		released, err := r.st.Release(sctx, req.Namespace, it.ID, target, it.Epoch)
		if err != nil {
			out[i], errs[i] = storeFailure(err), err
			return
		}
		out[i].Released = released
	}
	n := len(req.Releases)
	workers := min(n, releaseParallelism)
	if workers <= 1 {
		for i := range n {
			do(i)
		}
		return
	}
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				do(i)
			}
		})
	}
	wg.Wait()
}
