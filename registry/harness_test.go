package registry

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/memstore"
	"github.com/pinned-go/pinned/internal/store/redisstore"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leakcheck.Options()...)
}

const (
	token    = "test-token-0123456789abcdef"
	oldToken = "old-token-0123456789abcdef"
)

// env is a registry served on a real 127.0.0.1 listener.
type env struct {
	t     *testing.T
	reg   *Registry
	st    store.Store
	url   string
	hc    *fasthttp.HostClient
	fake  *clock.Fake // memstore only
	mem   *memstore.Store
	redis *redistest.Server
	logs  *bytes.Buffer
}

type envOpt func(*Config)

// kinds are the stores every HTTP test runs against.
var kinds = []string{"memstore", "redis"}

func newEnv(t *testing.T, kind string, opts ...envOpt) *env {
	t.Helper()
	e := &env{t: t, logs: &bytes.Buffer{}}
	switch kind {
	case "memstore":
		e.fake = clock.NewFake(time.Unix(1_700_000_000, 0))
		m, err := memstore.New(memstore.Config{Clock: e.fake})
		if err != nil {
			t.Fatal(err)
		}
		e.st, e.mem = m, m
	case "redis":
		e.redis = redistest.Start(t)
		rs, err := redisstore.New(redisstore.Config{URL: e.redis.URL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rs.Connect(ctx); err != nil {
			t.Fatal(err)
		}
		e.st = rs
	}
	t.Cleanup(e.st.Close)
	cfg := Config{
		Store:  e.st,
		Tokens: []string{token},
		Logger: slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		// Tests send many calls from 127.0.0.1 with one token; the limit
		// tests turn the limits on themselves.
		RegisterIPLimit:    off,
		RegisterTokenLimit: off,
		AuthFailureLimit:   off,
	}
	if e.fake != nil {
		cfg.Clock = e.fake // the limits' buckets refill on the same fake time
	}
	for _, o := range opts {
		o(&cfg)
	}
	reg, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.reg = reg
	addr := serve(t, reg.NewRouter(nil))
	e.url = "http://" + addr
	e.hc = &fasthttp.HostClient{Addr: addr, MaxIdleConnDuration: time.Second}
	t.Cleanup(e.hc.CloseIdleConnections)
	return e
}

// forEachStore runs f as a subtest per store kind.
func forEachStore(t *testing.T, f func(t *testing.T, e *env), opts ...envOpt) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) { f(t, newEnv(t, kind, opts...)) })
	}
}

type reply struct {
	code int
	body []byte
	hdr  map[string]string
}

func (r reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("response %d %s: %v", r.code, r.body, err)
	}
}

func (r reply) errField(t *testing.T) wire.Error {
	t.Helper()
	var we wire.Error
	r.decode(t, &we)
	return we
}

// do sends a request with the given bearer token ("" for none) and a JSON
// body (a string is sent as is).
func (e *env) do(method, path, tok string, body any) reply {
	e.t.Helper()
	r, err := e.try(method, path, tok, body)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// try is do for any goroutine: it returns transport errors.
func (e *env) try(method, path, tok string, body any) (reply, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(e.url + path)
	req.Header.SetMethod(method)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	switch b := body.(type) {
	case nil:
	case string:
		req.SetBodyString(b)
	case []byte:
		req.SetBody(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return reply{}, err
		}
		req.SetBody(j)
	}
	if err := e.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		return reply{}, err
	}
	r := reply{code: resp.StatusCode(), body: append([]byte(nil), resp.Body()...), hdr: map[string]string{}}
	for k, v := range resp.Header.All() {
		r.hdr[strings.ToLower(string(k))] = string(v)
	}
	return r, nil
}

// metric returns the value of one series of the registry's metrics.
func (e *env) metric(series string) string {
	var b bytes.Buffer
	e.reg.Metrics().WritePrometheus(&b)
	for line := range strings.SplitSeq(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return "<missing>"
}

func (e *env) post(path string, body any) reply { return e.do("POST", path, token, body) }

// postChunked sends body with Transfer-Encoding: chunked (no Content-Length).
func (e *env) postChunked(path, body string) reply {
	e.t.Helper()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(e.url + path)
	req.Header.SetMethod("POST")
	req.Header.Set("Authorization", "Bearer "+token)
	req.SetBodyStream(strings.NewReader(body), -1)
	if err := e.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		e.t.Fatalf("POST %s: %v", path, err)
	}
	return reply{code: resp.StatusCode(), body: append([]byte(nil), resp.Body()...)}
}

// registerBody is a valid registration for the fake worker w.
func registerBody(w *fakeworker.Worker, client string, ns ...string) wire.RegisterRequest {
	if len(ns) == 0 {
		ns = []string{"/counter"}
	}
	c := newChallenge()
	return wire.RegisterRequest{
		ClientID: client, Secret: w.Secret, Namespaces: ns, AdvertiseURL: w.URL, Headroom: 10,
		Challenge: c, ChallengeValue: fakeworker.Value(c),
	}
}

// newChallenge mints a challenge the way a worker does (fresh, 130 bits).
func newChallenge() string { return rand.Text() }

// register registers and returns the session id.
func (e *env) register(body wire.RegisterRequest) string {
	e.t.Helper()
	r := e.post(wire.PathRegister, body)
	if r.code != 200 {
		e.t.Fatalf("register = %d %s; want 200", r.code, r.body)
	}
	var rr wire.RegisterResponse
	r.decode(e.t, &rr)
	if rr.SessionID == "" || rr.ExpiresInMs != e.reg.leaseMs {
		e.t.Fatalf("register = %+v; want a session id and expiresInMs %d", rr, e.reg.leaseMs)
	}
	return rr.SessionID
}

func heartbeatBody(sid string, w *fakeworker.Worker, n int) wire.HeartbeatRequest {
	hb := wire.HeartbeatRequest{SessionID: sid, Headroom: 9}
	if w != nil {
		hb.Challenge = newChallenge()
		hb.ChallengeValue = fakeworker.Value(hb.Challenge)
	}
	return hb
}

func (e *env) heartbeat(body wire.HeartbeatRequest) (reply, wire.HeartbeatResponse) {
	e.t.Helper()
	r := e.post(wire.PathHeartbeat, body)
	var hr wire.HeartbeatResponse
	if r.code == 200 {
		r.decode(e.t, &hr)
	}
	return r, hr
}

func (e *env) nack(r reply) string {
	e.t.Helper()
	if r.code != 409 {
		e.t.Fatalf("got %d %s; want 409", r.code, r.body)
	}
	var n wire.Nack
	r.decode(e.t, &n)
	return n.Nack
}

// expire lets the lease of every session run out: a fake clock on
// memstore, real waiting on Redis (whose clock decides).
func (e *env) expire() {
	e.t.Helper()
	if e.fake != nil {
		e.fake.Advance(e.reg.lease + time.Millisecond)
		e.mem.Expire()
		return
	}
	time.Sleep(e.reg.lease + e.reg.lease/5) // time must pass on Redis's clock
}

// off turns a Limit off.
var off = Limit{Events: -1}

func withLease(d time.Duration) envOpt { return func(c *Config) { c.Lease = d } }
