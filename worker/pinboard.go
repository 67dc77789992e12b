package worker

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// pinboardClient makes the worker's registry calls. Its HostClient retries
// nothing itself; the loop and Release decide about retries. It keeps the
// connections it dialled, so that abort can fail the calls in flight at
// once.
type pinboardClient struct {
	hc     *fasthttp.HostClient
	base   string // scheme://host[:port][/prefix]
	auth   string // "Bearer <token>"
	perReq time.Duration

	connsMu sync.Mutex
	conns   map[*trackedConn]struct{}
	abortCh chan struct{} // closed by the next abort
}

func newPinboardClient(u *url.URL, cfg Config) *pinboardClient {
	isTLS := u.Scheme == "https"
	p := &pinboardClient{
		base:    u.String(),
		auth:    "Bearer " + cfg.Token,
		perReq:  cfg.RequestTimeout,
		conns:   make(map[*trackedConn]struct{}),
		abortCh: make(chan struct{}),
	}
	p.hc = &fasthttp.HostClient{
		Addr:                      fasthttp.AddMissingPort(u.Host, isTLS),
		IsTLS:                     isTLS,
		Name:                      "pinned-worker",
		MaxConns:                  cfg.MaxConns,
		MaxConnWaitTimeout:        cfg.RequestTimeout,
		ReadTimeout:               cfg.RequestTimeout,
		WriteTimeout:              cfg.RequestTimeout,
		MaxResponseBodySize:       wire.MaxBodyBytes,
		MaxIdemponentCallAttempts: 1,
		DisablePathNormalizing:    true,
		DialTimeout:               p.dial,
	}
	return p
}

// dial is fasthttp's own dial (HostClient's default), remembered for abort.
func (p *pinboardClient) dial(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := fasthttp.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, p: p}
	p.connsMu.Lock()
	p.conns[tc] = struct{}{}
	p.connsMu.Unlock()
	return tc, nil
}

// abort closes every connection to the pinboard, idle or carrying a call:
// the calls in flight fail at once instead of waiting for their deadline.
// It closes the channel aborted returned until now.
func (p *pinboardClient) abort() {
	p.connsMu.Lock()
	defer p.connsMu.Unlock()
	for tc := range p.conns {
		_ = tc.Conn.Close()
		delete(p.conns, tc)
	}
	close(p.abortCh)
	p.abortCh = make(chan struct{})
}

// aborted returns a channel closed by the next abort.
func (p *pinboardClient) aborted() <-chan struct{} {
	p.connsMu.Lock()
	defer p.connsMu.Unlock()
	return p.abortCh
}

// trackedConn is a connection to the pinboard that abort can close.
type trackedConn struct {
	net.Conn
	p *pinboardClient
}

func (tc *trackedConn) Close() error {
	tc.p.connsMu.Lock()
	delete(tc.p.conns, tc)
	tc.p.connsMu.Unlock()
	return tc.Conn.Close()
}

// reply is the outcome of one registry call: err for a transport failure
// (status 0), otherwise the status and the body.
type reply struct {
	status int
	body   []byte
	err    error
}

// post sends in as JSON to path and waits for the answer until deadline (or
// the request timeout, whichever is first).
func (p *pinboardClient) post(path string, in any, deadline time.Time) reply {
	b, err := json.Marshal(in)
	if err != nil {
		return reply{err: fmt.Errorf("cannot encode %s body: %w", path, err)}
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(p.base + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.Set(fasthttp.HeaderAuthorization, p.auth)
	req.Header.SetContentType("application/json")
	req.SetBody(b)
	if d := time.Now().Add(p.perReq); deadline.IsZero() || d.Before(deadline) {
		deadline = d
	}
	if err := p.hc.DoDeadline(req, resp, deadline); err != nil {
		return reply{err: fmt.Errorf("cannot reach the pinboard at %s: %w", p.base, err)}
	}
	return reply{status: resp.StatusCode(), body: append([]byte(nil), resp.Body()...)}
}

// close drops the idle connections to the pinboard.
func (p *pinboardClient) close() { p.hc.CloseIdleConnections() }

// describe says what went wrong with a non-200 reply, for logs: the status
// and the pinboard's wire.Error message when there is one (bounded; the
// pinboard's errors never contain our token or secret).
func (r reply) describe() string {
	if r.err != nil {
		return r.err.Error()
	}
	s := "HTTP " + strconv.Itoa(r.status)
	var e wire.Error
	if json.Unmarshal(r.body, &e) == nil && e.Error != "" {
		msg := e.Error
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		s += ": " + msg
		if e.Field != "" {
			s += " (field " + e.Field + ")"
		}
	}
	return s
}

// field is the "field" member of the reply's wire.Error ("" for none).
func (r reply) field() string {
	var e wire.Error
	if r.err != nil || json.Unmarshal(r.body, &e) != nil {
		return ""
	}
	return e.Field
}

// nack returns the NACK of a 409 reply ("" for anything else). An
// unparseable 409 counts as reregister, the safe reading.
func (r reply) nack() string {
	if r.err != nil || r.status != fasthttp.StatusConflict {
		return ""
	}
	var n wire.Nack
	if json.Unmarshal(r.body, &n) == nil && n.Nack == wire.NackSuperseded {
		return wire.NackSuperseded
	}
	return wire.NackReregister
}

// decodeRegister parses a 200 registration answer.
func decodeRegister(b []byte) (wire.RegisterResponse, error) {
	var r wire.RegisterResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("malformed registration answer: %w", err)
	}
	if r.SessionID == "" {
		return r, fmt.Errorf("malformed registration answer: empty sessionId")
	}
	if r.ExpiresInMs <= 0 {
		return r, fmt.Errorf("malformed registration answer: expiresInMs %d is not positive", r.ExpiresInMs)
	}
	return r, nil
}

// decodeAck parses a 200 heartbeat answer.
func decodeAck(b []byte) (wire.HeartbeatResponse, error) {
	var r wire.HeartbeatResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("malformed heartbeat ack: %w", err)
	}
	if r.ExpiresInMs <= 0 {
		return r, fmt.Errorf("malformed heartbeat ack: expiresInMs %d is not positive", r.ExpiresInMs)
	}
	return r, nil
}
