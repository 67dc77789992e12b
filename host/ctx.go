package host

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// Ctx is one request to an instance. It is valid only until the handler
// returns (or, when the handler called Stream, until the stream ends); the
// host reuses it afterwards, so never keep it, nor anything that aliases
// the request (Param, ParamBytes, Path, the RequestCtx's buffers).
//
// A handler answers through the fasthttp RequestCtx (status, headers, body)
// or the helpers here, then returns nil. Returning an *Error replaces the
// response with its status and JSON body; returning any other error
// replaces it with 500 (logged, throttled) — or, when the instance was
// aborted under the handler, with 503 + Retry-After and X-Pinned-Reason:
// aborted, since the request's outcome is unknown.
type Ctx struct {
	rc     *fasthttp.RequestCtx
	h      *Host
	inst   *Instance
	route  *route
	path   []byte
	vals   [MaxParams][]byte
	stream *stream
}

func (h *Host) putCtx(c *Ctx) {
	*c = Ctx{}
	h.ctxPool.Put(c)
}

// RequestCtx returns the underlying fasthttp request context: the request,
// the response, and fasthttp's usual helpers. Note that its own Done
// channel is fasthttp's server shutdown, not the instance's end; use
// Context for that.
func (c *Ctx) RequestCtx() *fasthttp.RequestCtx { return c.rc }

// Instance returns the instance serving the request.
func (c *Ctx) Instance() *Instance { return c.inst }

// ID returns the instance's id.
func (c *Ctx) ID() string { return c.inst.id }

// Context returns the instance's context (see Instance.Context): it is
// cancelled when the instance is aborted.
func (c *Ctx) Context() context.Context { return c.inst.Context() }

// Path returns the path remainder after the id ("/" when there is none),
// raw as on the wire (nothing is percent-decoded). It aliases the request.
func (c *Ctx) Path() []byte { return c.path }

// ParamBytes returns the raw value of the route's path parameter name, or
// nil when the route has no such parameter. It aliases the request buffer:
// copy it to keep it past the handler.
func (c *Ctx) ParamBytes(name string) []byte {
	for i, n := range c.route.names {
		if n == name {
			return c.vals[i]
		}
	}
	return nil
}

// Param returns the value of the route's path parameter name ("" when the
// route has none), raw as on the wire. It does not allocate: the string
// aliases the request buffer and is valid only while c is (see Ctx). Use
// strings.Clone to keep it, for example as a map key.
func (c *Ctx) Param(name string) string {
	b := c.ParamBytes(name)
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// JSON answers status with v encoded as JSON.
func (c *Ctx) JSON(status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("cannot encode response: %w", err)
	}
	c.rc.SetStatusCode(status)
	c.rc.SetContentType("application/json")
	c.rc.SetBody(b)
	return nil
}

// DecodeJSON decodes the request body into v. A malformed body returns an
// *Error with status 400, so a handler can return it as is.
func (c *Ctx) DecodeJSON(v any) error {
	if err := json.Unmarshal(c.rc.PostBody(), v); err != nil {
		return &Error{Status: fasthttp.StatusBadRequest, Message: "invalid JSON body: " + err.Error(), Field: "body"}
	}
	return nil
}

// Error answers status with the JSON body wire.Error{Error: msg}.
func (c *Ctx) Error(status int, msg string) {
	c.h.writeError(c.rc, status, msg, "")
}

// Stream makes the response body a pull-based stream of the chunks seq
// yields (sent with chunked transfer encoding; set headers such as the
// content type before returning). seq runs step by step while fasthttp
// writes the response, after the handler returned: each step (the code up
// to the next yield) runs only when the previous chunk has been handed to
// the connection, inside the instance's turn unless the route is concurrent,
// so it may touch the object's state. Between steps no turn is held and a
// slow client holds back only its own stream. A yielded slice may be reused
// by seq once its next step begins. Yielding a non-nil error ends the
// response abruptly (the client sees a truncated body).
//
// The open stream keeps the instance busy (no idle eviction). When the
// instance is aborted the stream's next write fails and seq is stopped:
// yield returns false and seq's remaining code runs (inside the turn) so its
// deferred cleanups happen. seq should return promptly when yield returns
// false, and should check c.Context() before long work.
func (c *Ctx) Stream(seq iter.Seq2[[]byte, error]) error {
	if c.stream != nil {
		return ErrStreamStarted
	}
	s := newStream(c, seq)
	c.stream = s
	c.rc.SetBodyStream(s, -1)
	return nil
}
