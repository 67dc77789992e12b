package registry

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/wire"
)

// endpoint wraps a handler with authentication, the request counter and
// the duration histogram. h returns the status code it answered.
func (r *Registry) endpoint(name string, auth bool, h func(*fasthttp.RequestCtx) int) fasthttp.RequestHandler {
	dur := r.m.duration[name]
	return func(ctx *fasthttp.RequestCtx) {
		start := time.Now()
		code := fasthttp.StatusUnauthorized
		if !auth || r.authorized(ctx) {
			code = h(ctx)
		}
		r.m.request(name, code)
		dur.UpdateDuration(start)
	}
}

// authorized checks the bearer token and answers 401 when it is wrong.
func (r *Registry) authorized(ctx *fasthttp.RequestCtx) bool {
	tok, ok := bearer(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if ok && r.tokens.Load().check(tok) {
		return true
	}
	r.m.authFailures.Inc()
	if r.authLog.allow(10 * time.Second) {
		r.log.Warn("registry call refused: missing or invalid bearer token", "remote", ctx.RemoteIP().String(), "path", string(ctx.Path()))
	}
	ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="pinboard"`)
	writeError(ctx, fasthttp.StatusUnauthorized, "missing or invalid bearer token (Authorization: Bearer <deployment token>)", "")
	return false
}

// decodeRequest reads the body (bounded by wire.MaxBodyBytes) and parses it.
func decodeRequest[T any](ctx *fasthttp.RequestCtx, parse func([]byte) (T, *badRequest)) (T, *badRequest) {
	body, e := readBody(ctx, wire.MaxBodyBytes)
	if e != nil {
		var zero T
		return zero, e
	}
	return parse(body)
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) int {
	b, err := json.Marshal(v)
	if err != nil { // only our own types are marshalled: a bug
		panic(err)
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
	return code
}

func writeError(ctx *fasthttp.RequestCtx, code int, msg, field string) int {
	return writeJSON(ctx, code, wire.Error{Error: msg, Field: field})
}

func writeBad(ctx *fasthttp.RequestCtx, e *badRequest) int {
	return writeError(ctx, e.status, e.msg, e.field)
}

func writeNack(ctx *fasthttp.RequestCtx, nack string) int {
	return writeJSON(ctx, fasthttp.StatusConflict, wire.Nack{Nack: nack})
}

// storeFailed answers a store error: 503 + Retry-After when the store is
// unavailable or slow, 500 otherwise. It logs at most every 10 s.
func (r *Registry) storeFailed(ctx *fasthttp.RequestCtx, op string, err error) int {
	r.m.storeErrors.Inc()
	if r.storeLog.allow(10 * time.Second) {
		r.log.Error("store call failed", "op", op, "err", err)
	}
	if errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrClosed) {
		ctx.Response.Header.Set(wire.HeaderRetryAfter, "1")
		return writeError(ctx, fasthttp.StatusServiceUnavailable, "the directory is unavailable; retry", "")
	}
	return writeError(ctx, fasthttp.StatusInternalServerError, "the directory failed", "")
}

func (r *Registry) register(ctx *fasthttp.RequestCtx) int {
	req, e := decodeRequest(ctx, func(b []byte) (wire.RegisterRequest, *badRequest) {
		return parseRegister(b, r.maxNS, !r.allowPair)
	})
	if e != nil {
		r.m.registerFailures[failInvalid].Inc()
		r.log.Warn("registration refused", "reason", "invalid", "field", e.field, "err", e.msg, "client", req.ClientID)
		return writeBad(ctx, e)
	}
	log := r.log.With("client", req.ClientID, "advertiseUrl", req.AdvertiseURL, "namespaces", req.Namespaces)
	verified := false
	if req.Challenge != "" {
		select {
		case r.sem <- struct{}{}:
		default:
			r.m.registerFailures[failBusy].Inc()
			ctx.Response.Header.Set(wire.HeaderRetryAfter, "1")
			return writeError(ctx, fasthttp.StatusServiceUnavailable, "too many registrations in progress; retry", "")
		}
		err := r.verifier.verify(context.Background(), req.AdvertiseURL, req.Secret, req.Challenge, req.ChallengeValue)
		<-r.sem
		if err != nil {
			ce := err.(*challengeError)
			r.m.challengeFailures[ce.reason].Inc()
			r.m.registerFailures[ce.reason].Inc()
			log.Warn("registration refused", "reason", ce.reason, "err", ce.msg)
			return writeError(ctx, fasthttp.StatusUnprocessableEntity, err.Error(), "challenge")
		}
		verified = true
	}
	sid := mintSessionID()
	sctx, cancel := r.storeContext()
	defer cancel()
	superseded, err := r.st.Register(sctx, store.Session{
		ID: sid, ClientID: req.ClientID, Secret: req.Secret, AdvertiseURL: req.AdvertiseURL,
		Namespaces: req.Namespaces, Headroom: req.Headroom, Draining: req.Draining, Verified: verified,
	}, r.lease)
	if err != nil {
		r.m.registerFailures[failStore].Inc()
		log.Warn("registration refused", "reason", "store", "err", err)
		return r.storeFailed(ctx, "register", err)
	}
	r.m.registrations.Inc()
	log.Info("worker registered", "session", sid, "verified", verified, "headroom", req.Headroom, "draining", req.Draining)
	for _, old := range superseded {
		r.m.superseded.Inc()
		log.Info("session superseded", "session", old, "by", sid, "reason", "superseded")
	}
	return writeJSON(ctx, fasthttp.StatusOK, wire.RegisterResponse{SessionID: sid, ExpiresInMs: r.leaseMs})
}

func (r *Registry) heartbeat(ctx *fasthttp.RequestCtx) int {
	req, e := decodeRequest(ctx, parseHeartbeat)
	if e != nil {
		return writeBad(ctx, e)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	verified := false
	if req.Challenge != "" {
		// Re-prove the advertise URL with the session's own secret. Unknown
		// and superseded sessions are answered without dialling anyone.
		sess, err := r.st.Session(sctx, req.SessionID)
		switch {
		case errors.Is(err, store.ErrUnknownSession):
			return writeNack(ctx, wire.NackReregister)
		case err != nil:
			return r.storeFailed(ctx, "session", err)
		case sess.Superseded:
			return writeNack(ctx, wire.NackSuperseded)
		}
		if err := r.verifier.verify(context.Background(), sess.AdvertiseURL, sess.Secret, req.Challenge, req.ChallengeValue); err != nil {
			ce := err.(*challengeError)
			r.m.challengeFailures[ce.reason].Inc()
			r.log.Warn("heartbeat refused: challenge failed", "session", req.SessionID, "client", sess.ClientID, "reason", ce.reason, "err", ce.msg)
			return writeNack(ctx, wire.NackReregister)
		}
		verified = true
	}
	sess, msgs, err := r.st.Heartbeat(sctx, req.SessionID, store.Update{
		Headroom: req.Headroom, Draining: req.Draining, DrainDeadline: req.DrainDeadline, Verified: verified,
	}, r.lease)
	switch {
	case errors.Is(err, store.ErrUnknownSession):
		return writeNack(ctx, wire.NackReregister)
	case errors.Is(err, store.ErrSuperseded):
		return writeNack(ctx, wire.NackSuperseded)
	case err != nil:
		return r.storeFailed(ctx, "heartbeat", err)
	}
	r.m.heartbeats.Inc()
	if len(msgs) > 0 {
		r.m.delivered.Add(len(msgs))
		for _, m := range msgs {
			r.log.Info("control message delivered", "session", req.SessionID, "client", sess.ClientID, "type", m.Type, "deadlineMs", m.DeadlineMs)
		}
	}
	return writeJSON(ctx, fasthttp.StatusOK, wire.HeartbeatResponse{ExpiresInMs: r.leaseMs, Messages: msgs, Reregister: !sess.Verified})
}

func (r *Registry) release(ctx *fasthttp.RequestCtx) int {
	req, e := decodeRequest(ctx, parseRelease)
	if e != nil {
		return writeBad(ctx, e)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	cur, err := r.st.CurrentSession(sctx, req.ClientID)
	if err != nil {
		return r.storeFailed(ctx, "current session", err)
	}
	released := false
	if cur != "" {
		if released, err = r.st.Release(sctx, req.Namespace, req.ID, cur); err != nil {
			return r.storeFailed(ctx, "release", err)
		}
	}
	if released {
		r.m.released.Inc()
	} else {
		r.m.releaseNoop.Inc()
	}
	r.log.Debug("release", "namespace", req.Namespace, "instance", req.ID, "session", cur, "client", req.ClientID, "released", released)
	return writeJSON(ctx, fasthttp.StatusOK, wire.ReleaseResponse{Released: released})
}

func (r *Registry) push(ctx *fasthttp.RequestCtx) int {
	req, e := decodeRequest(ctx, parsePush)
	if e != nil {
		return writeBad(ctx, e)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	cur, err := r.st.CurrentSession(sctx, req.ClientID)
	if err != nil {
		return r.storeFailed(ctx, "current session", err)
	}
	if cur == "" {
		return writeError(ctx, fasthttp.StatusNotFound, "no live session for this clientId", "clientId")
	}
	if err := r.st.Push(sctx, req.ClientID, wire.Message{Type: req.Type, DeadlineMs: req.DeadlineMs}); err != nil {
		return r.storeFailed(ctx, "push", err)
	}
	r.m.pushed.Inc()
	r.log.Info("control message queued", "session", cur, "client", req.ClientID, "type", req.Type, "deadlineMs", req.DeadlineMs)
	return writeJSON(ctx, fasthttp.StatusAccepted, wire.PushResponse{Queued: true})
}

// workerInfos reads every live session with its placement counts.
func (r *Registry) workerInfos(ctx context.Context) ([]wire.WorkerInfo, error) {
	sessions, err := r.st.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]wire.WorkerInfo, 0, len(sessions))
	for _, s := range sessions {
		counts, err := r.st.PlacementCounts(ctx, s.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, wire.WorkerInfo{
			SessionID: s.ID, ClientID: s.ClientID, AdvertiseURL: s.AdvertiseURL,
			Namespaces: s.Namespaces, Headroom: s.Headroom, Draining: s.Draining,
			DrainDeadline: s.DrainDeadline, Verified: s.Verified, Superseded: s.Superseded,
			RegisteredAtMs: s.RegisteredAt, LastHeartbeatMs: s.LastHeartbeat, ExpiresAtMs: s.ExpiresAt,
			Placements: counts,
		})
	}
	return out, nil
}

func (r *Registry) workers(ctx *fasthttp.RequestCtx) int {
	sctx, cancel := r.storeContext()
	defer cancel()
	ws, err := r.workerInfos(sctx)
	if err != nil {
		return r.storeFailed(ctx, "workers", err)
	}
	return writeJSON(ctx, fasthttp.StatusOK, wire.WorkersResponse{Workers: ws})
}

// available reports whether a session can take new placements.
func available(w wire.WorkerInfo) bool {
	return !w.Draining && !w.Superseded && w.Verified && w.Headroom > 0
}

// summarize builds the per-namespace overview.
func summarize(ws []wire.WorkerInfo) map[string]wire.NamespaceOverview {
	out := map[string]wire.NamespaceOverview{}
	for _, w := range ws {
		for _, ns := range w.Namespaces {
			o := out[ns]
			o.Workers++
			if available(w) {
				o.AvailableWorker++
			}
			if !w.Draining && !w.Superseded {
				o.Headroom += w.Headroom
			}
			out[ns] = o
		}
		for _, ns := range slices.Sorted(maps.Keys(w.Placements)) {
			o := out[ns]
			o.Placements += w.Placements[ns]
			out[ns] = o
		}
	}
	return out
}

func (r *Registry) overview(ctx *fasthttp.RequestCtx) int {
	sctx, cancel := r.storeContext()
	defer cancel()
	ws, err := r.workerInfos(sctx)
	if err != nil {
		return r.storeFailed(ctx, "overview", err)
	}
	return writeJSON(ctx, fasthttp.StatusOK, wire.OverviewResponse{
		ProtocolVersion: wire.Version, LeaseMs: r.leaseMs, Sessions: len(ws),
		Namespaces: summarize(ws), Workers: ws,
	})
}

func (r *Registry) healthz(ctx *fasthttp.RequestCtx) int {
	sctx, cancel := r.storeContext()
	defer cancel()
	h := wire.Healthz{OK: true, Store: "ok", ShuttingDown: r.shutdown.Load()}
	if err := r.st.Ping(sctx); err != nil {
		h.OK, h.Store = false, err.Error()
	}
	if h.ShuttingDown {
		h.OK = false
	}
	code := fasthttp.StatusOK
	if !h.OK {
		code = fasthttp.StatusServiceUnavailable
	}
	return writeJSON(ctx, code, h)
}
