package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// handler serves one endpoint; tokenID is the id of the deployment token
// the call authenticated with ("" for unauthenticated endpoints). It
// returns the status code it answered.
type handler func(ctx *fasthttp.RequestCtx, tokenID string) int

// endpoint wraps a handler with the failed-authentication limit,
// authentication, the request counter and the duration histogram.
func (r *Registry) endpoint(name string, auth bool, h handler) fasthttp.RequestHandler {
	dur := r.m.duration[name]
	return func(ctx *fasthttp.RequestCtx) {
		start := time.Now()
		var code int
		if !auth {
			code = h(ctx, "")
		} else {
			client := clientKey(ctx.RemoteIP())
			if blocked, wait := r.authFails.blocked(client); blocked {
				// Refused before the token is looked at: a client that
				// guessed wrong too often learns nothing more. Heartbeats of
				// live sessions are the exception (see heartbeatWhileLimited).
				if name == epHeartbeat {
					code = r.heartbeatWhileLimited(ctx, client, wait)
				} else {
					code = r.authLimited(ctx, wait)
				}
			} else if tok, ok := r.authorized(ctx); ok {
				code = h(ctx, tok)
			} else {
				r.authFails.spend(client)
				code = fasthttp.StatusUnauthorized
			}
		}
		r.m.request(name, code)
		dur.UpdateDuration(start)
	}
}

func (r *Registry) authLimited(ctx *fasthttp.RequestCtx, wait time.Duration) int {
	return r.tooMany(ctx, limitAuthIP, wait, "too many failed authentications from this address; retry later")
}

// heartbeatWhileLimited serves a heartbeat from an address that is over its
// failed-authentication limit. Every other call from that address is
// refused outright; but a heartbeat keeps a lease, and a worker that shares
// its address (a NAT) with a client that keeps failing must not lose its
// lease for it. So a heartbeat naming a live session has its token checked
// as usual, and any other gets the same 429 without its token being looked
// at. Session ids are 144 random bits known only to their worker and to
// holders of a valid token, so a token guesser gains nothing: without a
// live session id its guesses are never evaluated, and what it can time is
// only whether the session exists.
func (r *Registry) heartbeatWhileLimited(ctx *fasthttp.RequestCtx, client netip.Addr, wait time.Duration) int {
	req, e := decodeRequest(ctx, parseHeartbeat)
	if e != nil {
		return r.authLimited(ctx, wait)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	if _, err := r.st.Session(sctx, req.SessionID); err != nil {
		return r.authLimited(ctx, wait)
	}
	tok, ok := r.checkToken(ctx)
	if !ok {
		r.m.authFailures.Inc()
		r.authFails.spend(client)
		return r.authLimited(ctx, wait)
	}
	return r.heartbeatReq(ctx, tok, req)
}

// tooMany answers 429 + Retry-After with a JSON error and counts it.
func (r *Registry) tooMany(ctx *fasthttp.RequestCtx, limit string, wait time.Duration, msg string) int {
	r.m.rateLimited[limit].Inc()
	if r.limitLog.Allow() {
		r.log.Warn("registry call refused: limit reached", "limit", limit, "remote", ctx.RemoteIP().String(), "retryAfter", wait)
	}
	ctx.Response.Header.Set(wire.HeaderRetryAfter, retryAfter(wait))
	return writeError(ctx, fasthttp.StatusTooManyRequests, msg, "")
}

// checkToken checks the bearer token and returns the id of the token that
// matched.
func (r *Registry) checkToken(ctx *fasthttp.RequestCtx) (string, bool) {
	tok, ok := bearer(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	if !ok {
		return "", false
	}
	return r.tokens.Load().check(tok)
}

// authorized checks the bearer token and answers 401 when it is wrong. It
// returns the id of the token that matched.
func (r *Registry) authorized(ctx *fasthttp.RequestCtx) (string, bool) {
	if id, ok := r.checkToken(ctx); ok {
		return id, true
	}
	r.m.authFailures.Inc()
	if r.authLog.Allow() {
		r.log.Warn("registry call refused: missing or invalid bearer token", "remote", ctx.RemoteIP().String(), "path", string(ctx.Path()))
	}
	ctx.Response.Header.Set(fasthttp.HeaderWWWAuthenticate, `Bearer realm="pinboard"`)
	writeError(ctx, fasthttp.StatusUnauthorized, "missing or invalid bearer token (Authorization: Bearer <deployment token>)", "")
	return "", false
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
// unavailable or slow, 500 otherwise. It logs at most every 10 s, at DEBUG
// while the store is still making its first connection (store.IsConnecting).
func (r *Registry) storeFailed(ctx *fasthttp.RequestCtx, op string, err error) int {
	r.m.storeErrors.Inc()
	switch {
	case store.IsConnecting(err):
		r.log.Debug("store not connected yet", "op", op, "err", err)
	case r.storeLog.Allow():
		r.log.Error("store call failed", "op", op, "err", err)
	}
	if errors.Is(err, store.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, store.ErrClosed) {
		ctx.Response.Header.Set(wire.HeaderRetryAfter, "1")
		return writeError(ctx, fasthttp.StatusServiceUnavailable, "the directory is unavailable; retry", "")
	}
	return writeError(ctx, fasthttp.StatusInternalServerError, "the directory failed", "")
}

func (r *Registry) register(ctx *fasthttp.RequestCtx, tok string) int {
	if ok, wait := r.regIP.take(clientKey(ctx.RemoteIP())); !ok {
		r.m.registerFailures[failRateLimited].Inc()
		return r.tooMany(ctx, limitRegisterIP, wait, "too many registrations from this address; retry later")
	}
	if ok, wait := r.regTok.take(tok); !ok {
		r.m.registerFailures[failRateLimited].Inc()
		return r.tooMany(ctx, limitRegisterToken, wait, "too many registrations with this deployment token; retry later")
	}
	req, e := decodeRequest(ctx, func(b []byte) (wire.RegisterRequest, *badRequest) {
		return parseRegister(b, r.maxNS, !r.allowPair)
	})
	if e == nil {
		if err := r.policy.checkURL(req.AdvertiseURL); err != nil {
			e = bad("advertiseUrl", "%v", err)
		}
	}
	if e != nil {
		r.m.registerFailures[failInvalid].Inc()
		r.log.Warn("registration refused", "reason", "invalid", "field", e.field, "err", e.msg, "client", req.ClientID)
		return writeBad(ctx, e)
	}
	log := r.log.With("client", req.ClientID, "advertiseUrl", req.AdvertiseURL, "namespaces", req.Namespaces)
	sctx, cancel := r.storeContext()
	defer cancel()
	verified := false
	if req.Challenge != "" {
		if code, ok := r.useNonce(ctx, sctx, req.Challenge, "r:"+tok+":"+req.AdvertiseURL, log); !ok {
			r.m.registerFailures[challengeReplay].Inc()
			return code
		}
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
	if r.maxPerTok > 0 {
		held, ok, err := r.st.ReserveSlot(sctx, tok, sid, r.maxPerTok, r.lease)
		if err != nil {
			r.m.registerFailures[failStore].Inc()
			return r.storeFailed(ctx, "reserve slot", err)
		}
		if !ok {
			r.m.registerFailures[failSessionCap].Inc()
			log.Warn("registration refused", "reason", failSessionCap, "token", tok, "live", held, "max", r.maxPerTok)
			return r.tooMany(ctx, failSessionCap, r.lease, fmt.Sprintf(
				"this deployment token already holds %d live sessions, the pinboard's maximum; retry once some end (or raise the cap)", held))
		}
	}
	superseded, err := r.st.Register(sctx, store.Session{
		ID: sid, ClientID: req.ClientID, Secret: req.Secret, AdvertiseURL: req.AdvertiseURL,
		Namespaces: req.Namespaces, Headroom: req.Headroom, Draining: req.Draining, Verified: verified,
		TokenID: tok, MaxBodyBytes: req.MaxBodyBytes,
	}, r.lease)
	if err != nil {
		r.m.registerFailures[failStore].Inc()
		if !store.IsConnecting(err) { // storeFailed logs that one at DEBUG
			log.Warn("registration refused", "reason", "store", "err", err)
		}
		return r.storeFailed(ctx, "register", err)
	}
	r.m.registrations.Inc()
	log.Info("worker registered", "session", sid, "verified", verified, "headroom", req.Headroom, "draining", req.Draining, "maxBodyBytes", req.MaxBodyBytes, "token", tok)
	for _, old := range superseded {
		r.m.superseded.Inc()
		log.Info("session superseded", "session", old, "by", sid, "reason", "superseded")
	}
	return writeJSON(ctx, fasthttp.StatusOK, wire.RegisterResponse{SessionID: sid, ExpiresInMs: r.leaseMs})
}

// useNonce records a challenge as used before anyone is dialled. It
// answers the request itself (422 for a replay, 503/500 for a store
// failure) and returns false when the call must stop there.
func (r *Registry) useNonce(ctx *fasthttp.RequestCtx, sctx context.Context, challenge, binding string, log *slog.Logger) (int, bool) {
	first, err := r.st.UseNonce(sctx, wire.NonceID(challenge), binding, r.nonceTTL)
	if err != nil {
		return r.storeFailed(ctx, "use nonce", err), false
	}
	if first {
		return 0, true
	}
	r.m.challengeFailures[challengeReplay].Inc()
	log.Warn("call refused: challenge reused", "reason", challengeReplay)
	return writeError(ctx, fasthttp.StatusUnprocessableEntity,
		"challenge failed: this challenge was already used; send a fresh one with every call", "challenge"), false
}

func (r *Registry) heartbeat(ctx *fasthttp.RequestCtx, tok string) int {
	req, e := decodeRequest(ctx, parseHeartbeat)
	if e != nil {
		return writeBad(ctx, e)
	}
	return r.heartbeatReq(ctx, tok, req)
}

// heartbeatReq serves a decoded heartbeat.
func (r *Registry) heartbeatReq(ctx *fasthttp.RequestCtx, tok string, req wire.HeartbeatRequest) int {
	sctx, cancel := r.storeContext()
	defer cancel()
	verified := false
	if req.Challenge != "" {
		// Re-prove the advertise URL with the session's own secret. Unknown
		// and superseded sessions are answered without dialling anyone.
		sess, err := r.st.Session(sctx, req.SessionID)
		if faults.Has(faults.BlindRenew) && (errors.Is(err, store.ErrUnknownSession) || err == nil && sess.AdvertiseURL == "") {
			// Planted bug (pinned_faults builds only): renew blindly, also
			// the record a blind renewal re-created.
			goto renew
		}
		switch {
		case errors.Is(err, store.ErrUnknownSession):
			return writeNack(ctx, wire.NackReregister)
		case err != nil:
			return r.storeFailed(ctx, "session", err)
		case sess.Superseded:
			return writeNack(ctx, wire.NackSuperseded)
		}
		log := r.log.With("session", req.SessionID, "client", sess.ClientID)
		if code, ok := r.useNonce(ctx, sctx, req.Challenge, "h:"+tok+":"+req.SessionID, log); !ok {
			return code
		}
		if err := r.verifier.verify(context.Background(), sess.AdvertiseURL, sess.Secret, req.Challenge, req.ChallengeValue); err != nil {
			ce := err.(*challengeError)
			r.m.challengeFailures[ce.reason].Inc()
			log.Warn("heartbeat refused: challenge failed", "reason", ce.reason, "err", ce.msg)
			return writeNack(ctx, wire.NackReregister)
		}
		verified = true
	}
renew:
	if faults.Has(faults.BlindRenew) {
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

func (r *Registry) release(ctx *fasthttp.RequestCtx, _ string) int {
	req, e := decodeRequest(ctx, parseRelease)
	if e != nil {
		return writeBad(ctx, e)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	target, code, err := r.releaseTarget(sctx, req.ClientID, req.SessionID, req.Namespace, req.ID)
	switch {
	case code == fasthttp.StatusForbidden:
		return writeError(ctx, code, "sessionId belongs to another clientId", "sessionId")
	case err != nil:
		return r.storeFailed(ctx, "session", err)
	}
	released := false
	if target != "" {
		if released, err = r.st.Release(sctx, req.Namespace, req.ID, target, req.Epoch); err != nil {
			return r.storeFailed(ctx, "release", err)
		}
	}
	r.countRelease(released)
	r.log.Debug("release", "namespace", req.Namespace, "instance", req.ID, "session", target, "epoch", req.Epoch, "client", req.ClientID, "released", released)
	return writeJSON(ctx, fasthttp.StatusOK, wire.ReleaseResponse{Released: released})
}

// releaseTarget is the session a release of clientID's compares against:
// sessionID when it is live and the client's (403 when it belongs to
// another client; "" when it ended: an ended session frees nothing, the
// janitor or the proxy takes care of its placements), else, without
// sessionID, the client's current session. ns and id name the first
// instance, for the log. A store failure is returned as err (code 0).
func (r *Registry) releaseTarget(sctx context.Context, clientID, sessionID, ns, id string) (target string, code int, err error) {
	if sessionID == "" {
		cur, err := r.st.CurrentSession(sctx, clientID)
		return cur, 0, err
	}
	sess, err := r.st.Session(sctx, sessionID)
	switch {
	case errors.Is(err, store.ErrUnknownSession):
		return "", 0, nil
	case err != nil:
		return "", 0, err
	case sess.ClientID != clientID:
		r.m.releaseRefused.Inc()
		r.log.Warn("release refused: the session belongs to another client", "session", sessionID, "client", clientID, "namespace", ns, "instance", id)
		return "", fasthttp.StatusForbidden, nil
	}
	return sessionID, 0, nil
}

// countRelease counts one release's outcome.
func (r *Registry) countRelease(released bool) {
	if released {
		r.m.released.Inc()
	} else {
		r.m.releaseNoop.Inc()
	}
}

func (r *Registry) deregister(ctx *fasthttp.RequestCtx, _ string) int {
	req, e := decodeRequest(ctx, parseDeregister)
	if e != nil {
		return writeBad(ctx, e)
	}
	sctx, cancel := r.storeContext()
	defer cancel()
	ok, err := r.st.Deregister(sctx, req.SessionID)
	if err != nil {
		return r.storeFailed(ctx, "deregister", err)
	}
	if ok {
		r.m.deregistered.Inc()
		r.log.Info("worker deregistered", "session", req.SessionID, "reason", "deregister")
	} else {
		r.m.deregisterNoop.Inc()
		r.log.Debug("deregister of an ended session", "session", req.SessionID)
	}
	return writeJSON(ctx, fasthttp.StatusOK, wire.DeregisterResponse{Deregistered: ok})
}

func (r *Registry) push(ctx *fasthttp.RequestCtx, _ string) int {
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
		counts, err := r.st.PlacementCounts(ctx, s.ID, s.Namespaces)
		if err != nil {
			return nil, err
		}
		out = append(out, wire.WorkerInfo{
			SessionID: s.ID, ClientID: s.ClientID, AdvertiseURL: s.AdvertiseURL,
			Namespaces: s.Namespaces, Headroom: s.Headroom, Draining: s.Draining,
			DrainDeadline: s.DrainDeadline, Verified: s.Verified, Superseded: s.Superseded,
			RegisteredAtMs: s.RegisteredAt, LastHeartbeatMs: s.LastHeartbeat, ExpiresAtMs: s.ExpiresAt,
			Placements: counts, MaxBodyBytes: s.MaxBodyBytes,
		})
	}
	return out, nil
}

func (r *Registry) workers(ctx *fasthttp.RequestCtx, _ string) int {
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

func (r *Registry) overview(ctx *fasthttp.RequestCtx, _ string) int {
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

func (r *Registry) healthz(ctx *fasthttp.RequestCtx, _ string) int {
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
