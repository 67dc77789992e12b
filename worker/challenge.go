package worker

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"sync"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// challengeSet holds the challenge pairs of the registry calls in flight:
// a pair is added just before its call is sent and removed when the call
// returns, so the endpoint answers only while the pinboard can be proving it.
type challengeSet struct {
	mu    sync.Mutex
	pairs []challengePair // at most maxInflightHeartbeats + 2
}

type challengePair struct{ challenge, value string }

// newChallengePair mints a challenge and its value from crypto/rand
// (each ≥ 128 bits).
func newChallengePair() challengePair {
	return challengePair{challenge: rand.Text(), value: rand.Text()}
}

func (s *challengeSet) add(p challengePair) {
	s.mu.Lock()
	s.pairs = append(s.pairs, p)
	s.mu.Unlock()
}

func (s *challengeSet) remove(challenge string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.pairs {
		if p.challenge == challenge {
			s.pairs = append(s.pairs[:i], s.pairs[i+1:]...)
			return
		}
	}
}

// lookup returns the value of a live challenge, comparing in constant time.
func (s *challengeSet) lookup(challenge []byte) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pairs {
		if subtle.ConstantTimeCompare(challenge, []byte(p.challenge)) == 1 {
			return p.value, true
		}
	}
	return "", false
}

// HandleChallenge serves GET wire.PathChallenge?challenge=<challenge>, the
// pinboard's proof that the advertise URL reaches this process. It answers
// 200 {"value": <value>} only when the X-Pinned-Proxy-Secret header equals
// the worker's secret (constant-time comparison) and the challenge is one the
// worker is proving right now (its registry call is in flight). Otherwise:
// 405 for another method, 403 + X-Pinned-Reason: forbidden for a wrong or
// missing secret (checked first, so an unauthenticated caller learns nothing
// about challenges), 400 without a challenge, 404 for an unknown or stale
// one, each with a JSON wire.Error body. It never echoes the secret.
func (w *Worker) HandleChallenge(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set(fasthttp.HeaderCacheControl, "no-store")
	if !ctx.IsGet() {
		ctx.Response.Header.Set(fasthttp.HeaderAllow, fasthttp.MethodGet)
		writeJSON(ctx, fasthttp.StatusMethodNotAllowed, wire.Error{Error: "method not allowed: use GET"})
		return
	}
	if subtle.ConstantTimeCompare(ctx.Request.Header.Peek(wire.HeaderProxySecret), w.secret) != 1 {
		ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonForbidden)
		writeJSON(ctx, fasthttp.StatusForbidden, wire.Error{Error: "wrong or missing " + wire.HeaderProxySecret, Field: wire.HeaderProxySecret})
		return
	}
	challenge := ctx.QueryArgs().Peek(wire.QueryChallenge)
	if len(challenge) == 0 {
		writeJSON(ctx, fasthttp.StatusBadRequest, wire.Error{Error: "missing challenge", Field: wire.QueryChallenge})
		return
	}
	value, ok := w.challenges.lookup(challenge)
	if !ok {
		writeJSON(ctx, fasthttp.StatusNotFound, wire.Error{Error: "unknown or stale challenge", Field: wire.QueryChallenge})
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, wire.ChallengeResponse{Value: value})
}

// Mount registers HandleChallenge at wire.PathChallenge on r, next to the
// hosts' routes, for every method (it answers 405 itself to all but GET).
func (w *Worker) Mount(r *router.Router) {
	r.ANY(wire.PathChallenge, w.HandleChallenge)
}

// writeJSON answers status with v as a JSON body.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only wire types are passed: cannot happen
		panic("worker: cannot encode " + err.Error())
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
