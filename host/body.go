package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// bodyTooLarge reports whether a request's body is over the host's limit:
// announced by Content-Length, or (chunked) read whole by the server. A
// streamed body is never read here.
func (h *Host) bodyTooLarge(rc *fasthttp.RequestCtx) bool {
	max := h.cfg.MaxRequestBodySize
	if rc.Request.Header.ContentLength() > max {
		return true
	}
	return !rc.Request.IsBodyStream() && len(rc.Request.Body()) > max
}

// ConfigureServer makes s agree with the host's body limit
// (Config.MaxRequestBodySize), so that no body the host accepts is refused
// by the server and every body over the limit gets 413 with a JSON
// wire.Error, never a bare 400 or a connection reset:
//
//   - s.MaxRequestBodySize is set to the host's limit when it is zero
//     (fasthttp's default, 4 MiB); one above the host's limit is kept (the
//     host refuses the difference itself, after the server read it);
//   - s.ErrorHandler, when nil, is set to one that answers a body over the
//     server's limit with 413 after reading and discarding it (up to
//     Config.MaxBodyDrain: a client that sends its whole body before
//     reading the answer then receives it), and the server's other parse
//     errors like fasthttp does (431, 408, 400), with JSON bodies.
//
// It returns an error, and changes nothing, when s cannot keep the host's
// promise: s.MaxRequestBodySize is below the host's limit, or
// s.StreamRequestBody is on (fasthttp then bounds no streamed body, and
// handlers that read the whole body would read any size). Several hosts on
// one server: configure the one with the largest limit first, the others
// then find a limit at least theirs. Call it before s serves.
func (h *Host) ConfigureServer(s *fasthttp.Server) error {
	limit := h.cfg.MaxRequestBodySize
	switch {
	case s.StreamRequestBody:
		return fmt.Errorf("host %s: ConfigureServer: the server streams request bodies (StreamRequestBody), so fasthttp bounds none of them; turn it off", h.ns)
	case s.MaxRequestBodySize != 0 && s.MaxRequestBodySize < limit:
		return fmt.Errorf("host %s: ConfigureServer: the server accepts request bodies up to %d bytes, below the host's MaxRequestBodySize %d: raise the server's limit or lower the host's",
			h.ns, s.MaxRequestBodySize, limit)
	}
	if s.MaxRequestBodySize == 0 {
		s.MaxRequestBodySize = limit
	}
	if s.ErrorHandler == nil {
		serverLimit, drain := s.MaxRequestBodySize, h.cfg.MaxBodyDrain
		readBuf := s.ReadBufferSize
		if readBuf <= 0 {
			readBuf = defaultReadBufferSize
		}
		s.ErrorHandler = func(ctx *fasthttp.RequestCtx, err error) {
			serverError(ctx, err, serverLimit, drain, readBuf)
		}
	}
	return nil
}

// defaultReadBufferSize is fasthttp's read buffer size when
// Server.ReadBufferSize is zero (its defaultReadBufferSize).
const defaultReadBufferSize = 4096

// drainTail is how long the drain waits for the last bytes of a refused
// body that fasthttp's read buffer may already have taken.
const drainTail = 20 * time.Millisecond

// serverError answers a request fasthttp refused before any handler ran.
func serverError(ctx *fasthttp.RequestCtx, err error, limit int, drain int64, readBuf int) {
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		drainBody(ctx.Conn(), int64(ctx.Request.Header.ContentLength()), drain, int64(readBuf))
		jsonError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", limit), "")
	case errors.As(err, &small):
		jsonError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "request head too large", "")
	case errors.As(err, &netErr) && netErr.Timeout():
		jsonError(ctx, fasthttp.StatusRequestTimeout, "request timeout", "")
	default:
		jsonError(ctx, fasthttp.StatusBadRequest, "malformed request", "")
	}
}

// drainBody reads and discards what is left of a refused body of announced
// length cl on c, at most limit bytes, within the connection's read
// deadline, so that a client still sending it can finish and read the
// answer. fasthttp has already buffered up to readBuf bytes of it, unseen
// here: the drain reads until cl−readBuf bytes, then until the client has
// been quiet for drainTail. A body of no known length (chunked: fasthttp
// reports no positive Content-Length for it) is read until the client is
// quiet for drainTail. One announced over limit is not drained.
func drainBody(c net.Conn, cl, limit, readBuf int64) {
	if c == nil || cl > limit {
		return
	}
	var buf [32 << 10]byte
	got := int64(0)
	if cl > 0 {
		n, err := io.CopyBuffer(io.Discard, io.LimitReader(c, max(cl-readBuf, 0)), buf[:])
		if got = n; err != nil || got < cl-readBuf {
			return
		}
	}
	for got < limit {
		if err := c.SetReadDeadline(time.Now().Add(drainTail)); err != nil {
			return
		}
		n, err := c.Read(buf[:min(int64(len(buf)), limit-got)])
		got += int64(n)
		if err != nil {
			return // quiet for drainTail, or the client is done
		}
	}
}

// jsonError replaces the response with status and a JSON wire.Error.
func jsonError(ctx *fasthttp.RequestCtx, status int, msg, field string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(wire.Error{Error: msg, Field: field})
	ctx.SetBody(b)
}
