package registry

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// Limits of the console endpoints.
const (
	// DefaultInstancesLimit is the page size of GET /registry/instances
	// without limit=; MaxInstancesLimit the largest accepted (400 beyond).
	DefaultInstancesLimit = 100
	MaxInstancesLimit     = 1000
	// DefaultHotN is the rows of GET /registry/hot without n=; MaxHotN the
	// most accepted (400 beyond).
	DefaultHotN = 20
	MaxHotN     = 200
)

// placementTarget reads {namespace} and {id} of /registry/placements/...
// and checks them, and that the raw request target spells exactly that
// path: the router matches a decoded path, and no percent-escape may turn
// into a different id than the one written.
func placementTarget(ctx *fasthttp.RequestCtx) (ns, id string, e *badRequest) {
	nsSeg, _ := ctx.UserValue("namespace").(string)
	id, _ = ctx.UserValue("id").(string)
	if err := wire.CheckSegment([]byte(nsSeg), wire.MaxNamespaceLen); err != wire.SegmentOK {
		return "", "", bad("namespace", "%v (the namespace without its leading slash)", err)
	}
	if err := wire.CheckSegment([]byte(id), wire.MaxIDLen); err != wire.SegmentOK {
		return "", "", bad("id", "%v", err)
	}
	raw := ctx.Request.Header.RequestURI()
	if q := slices.Index(raw, '?'); q >= 0 {
		raw = raw[:q]
	}
	if string(raw) != wire.PathPlacements+"/"+nsSeg+"/"+id {
		return "", "", bad("id", "the path must be %s/<namespace>/<id> as is (no percent-escapes)", wire.PathPlacements)
	}
	return "/" + nsSeg, id, nil
}

// lookupPlacement reads a placement and its holder's session. ok is false
// when (ns, id) is not placed. The session is the zero value (and live
// false) when the holder has ended.
func (r *Registry) lookupPlacement(sctx context.Context, ns, id string) (info wire.PlacementInfo, ok bool, err error) {
	info = wire.PlacementInfo{Namespace: ns, ID: id}
	pl, err := r.st.Lookup(sctx, ns, id)
	info.SessionID, info.Epoch = pl.Session, pl.Epoch
	if !pl.Since.IsZero() {
		info.Since = pl.Since.UnixMilli()
	}
	if err != nil || info.SessionID == "" {
		return info, false, err
	}
	sess, err := r.st.Session(sctx, info.SessionID)
	switch {
	case errors.Is(err, store.ErrUnknownSession):
		return info, true, nil
	case err != nil:
		return info, true, err
	}
	info.ClientID, info.AdvertiseURL, info.Live = sess.ClientID, sess.AdvertiseURL, true
	return info, true, nil
}

// placed reads the placement a /registry/placements call names. When the
// call cannot go on (a bad path, no placement, a store failure) it answers
// it and returns the status and false.
func (r *Registry) placed(ctx *fasthttp.RequestCtx, sctx context.Context) (wire.PlacementInfo, int, bool) {
	ns, id, e := placementTarget(ctx)
	if e != nil {
		return wire.PlacementInfo{}, writeBad(ctx, e), false
	}
	info, ok, err := r.lookupPlacement(sctx, ns, id)
	if err != nil {
		return info, r.storeFailed(ctx, "placement", err), false
	}
	if !ok {
		return info, writeError(ctx, fasthttp.StatusNotFound, "no placement for "+wire.PlacementName(ns, id), "id"), false
	}
	return info, 0, true
}

func (r *Registry) placement(ctx *fasthttp.RequestCtx, _ string) int {
	sctx, cancel := r.storeContext()
	defer cancel()
	info, code, ok := r.placed(ctx, sctx)
	if !ok {
		return code
	}
	return writeJSON(ctx, fasthttp.StatusOK, info)
}

// evict queues an evict message for the worker holding the placement; when
// the holder's session has ended it deletes the placement itself
// (compare-and-delete on that session: the proxy would replace it anyway).
func (r *Registry) evict(ctx *fasthttp.RequestCtx, _ string) int {
	sctx, cancel := r.storeContext()
	defer cancel()
	info, code, ok := r.placed(ctx, sctx)
	if !ok {
		return code
	}
	ns, id := info.Namespace, info.ID
	out := wire.EvictResponse{Namespace: ns, ID: id, SessionID: info.SessionID, ClientID: info.ClientID}
	if !info.Live {
		released, err := r.st.Release(sctx, ns, id, info.SessionID, info.Epoch)
		if err != nil {
			return r.storeFailed(ctx, "release", err)
		}
		out.Released = released
		r.m.evictReleased.Inc()
		r.log.Info("evict: the holder's session has ended; placement deleted", "namespace", ns, "instance", id, "session", info.SessionID, "released", released)
		return writeJSON(ctx, fasthttp.StatusAccepted, out)
	}
	// The message goes to the client's queue, which its current session's
	// next heartbeat takes: when the holder has been superseded, the new
	// process (which holds no instance of the id) takes it, and the old
	// session's placement goes with its lease.
	if err := r.st.Push(sctx, info.ClientID, wire.Message{Type: wire.MessageEvict, Namespace: ns, ID: id}); err != nil {
		return r.storeFailed(ctx, "push", err)
	}
	out.Queued = true
	r.m.pushed.Inc()
	r.m.evictQueued.Inc()
	r.log.Info("control message queued", "session", info.SessionID, "client", info.ClientID, "type", wire.MessageEvict, "namespace", ns, "instance", id)
	return writeJSON(ctx, fasthttp.StatusAccepted, out)
}

// queryNamespace reads the namespace= query argument ("/name").
func queryNamespace(ctx *fasthttp.RequestCtx) (string, *badRequest) {
	ns := string(ctx.QueryArgs().Peek("namespace"))
	if ns == "" {
		return "", bad("namespace", "is required (namespace=/name)")
	}
	if e := wire.CheckNamespace(ns); e != wire.SegmentOK {
		return "", bad("namespace", "%v", e)
	}
	return ns, nil
}

// queryInt reads an integer query argument in [1, max], def when absent.
func queryInt(ctx *fasthttp.RequestCtx, name string, def, max int) (int, *badRequest) {
	v := ctx.QueryArgs().Peek(name)
	if v == nil {
		return def, nil
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || n < 1 || n > max {
		return 0, bad(name, "must be a whole number from 1 to %d", max)
	}
	return n, nil
}

func (r *Registry) instances(ctx *fasthttp.RequestCtx, _ string) int {
	lister, ok := r.st.(store.PlacementLister)
	if !ok {
		return writeError(ctx, fasthttp.StatusNotImplemented, "this pinboard's store cannot list placements", "")
	}
	ns, e := queryNamespace(ctx)
	if e != nil {
		return writeBad(ctx, e)
	}
	limit, e := queryInt(ctx, "limit", DefaultInstancesLimit, MaxInstancesLimit)
	if e != nil {
		return writeBad(ctx, e)
	}
	worker := string(ctx.QueryArgs().Peek("worker"))
	if worker != "" {
		if e := checkClientID("worker", worker); e != nil {
			return writeBad(ctx, e)
		}
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	sessions, err := r.st.Sessions(sctx)
	if err != nil {
		return r.storeFailed(ctx, "sessions", err)
	}
	clients := make(map[string]string, len(sessions))
	var filter []string
	if worker != "" {
		filter = []string{} // the worker's live sessions; none matches nothing
	}
	for _, s := range sessions {
		clients[s.ID] = s.ClientID
		if worker != "" && s.ClientID == worker {
			filter = append(filter, s.ID)
		}
	}
	page, err := lister.ListPlacements(sctx, store.ListQuery{
		Namespace: ns, Sessions: filter, Cursor: string(ctx.QueryArgs().Peek("cursor")), Limit: limit,
	})
	if errors.Is(err, store.ErrBadCursor) {
		return writeError(ctx, fasthttp.StatusBadRequest, "invalid or expired cursor: start the listing again without one", "cursor")
	}
	if err != nil {
		return r.storeFailed(ctx, "list placements", err)
	}
	out := wire.InstancesResponse{Namespace: ns, Worker: worker, Instances: make([]wire.InstanceInfo, len(page.Placements)), Cursor: page.Cursor}
	for i, p := range page.Placements {
		out.Instances[i] = wire.InstanceInfo{ID: p.ID, SessionID: p.SessionID, ClientID: clients[p.SessionID]}
	}
	return writeJSON(ctx, fasthttp.StatusOK, out)
}

func (r *Registry) hot(ctx *fasthttp.RequestCtx, _ string) int {
	ns, e := queryNamespace(ctx)
	if e != nil {
		return writeBad(ctx, e)
	}
	n, e := queryInt(ctx, "n", DefaultHotN, MaxHotN)
	if e != nil {
		return writeBad(ctx, e)
	}
	if r.hotids == nil {
		return writeJSON(ctx, fasthttp.StatusOK, wire.HotResponse{Namespace: ns, WindowSeconds: 60, IDs: []wire.HotID{}})
	}
	return writeJSON(ctx, fasthttp.StatusOK, r.hotids.Top(ns, n, time.Now()))
}

func (r *Registry) traffic(ctx *fasthttp.RequestCtx, _ string) int {
	if r.hotids == nil {
		return writeJSON(ctx, fasthttp.StatusOK, wire.TrafficResponse{WindowSeconds: 60, Holders: []wire.HolderTraffic{}, NotOK: []wire.AnswerCount{}})
	}
	return writeJSON(ctx, fasthttp.StatusOK, r.hotids.Traffic(time.Now()))
}
