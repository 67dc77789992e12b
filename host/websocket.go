package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/fasthttp/websocket"
)

// wsCloseTimeout bounds the close frame the host writes when a websocket
// handler returns.
const wsCloseTimeout = time.Second

// WebSocket is one open websocket of an instance, handed to a
// WebSocketHandler. Reading is for the handler's goroutine only
// (ReadMessage, or Conn's reader methods); WriteMessage may be called from
// any goroutine, for example from another request's handler that pushes to
// every socket of the instance.
type WebSocket struct {
	conn   *websocket.Conn
	inst   *Instance
	route  *route
	params []string

	wmu sync.Mutex // serialises writers

	mu        sync.Mutex // guards closed and goingAway
	closed    bool       // no more writes: the handler returned or the instance aborted
	goingAway bool       // the instance is closing: the handler was asked to return
}

// Conn returns the underlying fasthttp/websocket connection, for its
// reader, ping/pong and limit settings. Do not write through it directly
// while other goroutines use WriteMessage, and do not keep it after the
// handler returned.
func (ws *WebSocket) Conn() *websocket.Conn { return ws.conn }

// Instance returns the socket's instance.
func (ws *WebSocket) Instance() *Instance { return ws.inst }

// Context returns the instance's context (cancelled on abort).
func (ws *WebSocket) Context() context.Context { return ws.inst.Context() }

// Param returns the value of the route's path parameter name (a copy, safe
// to keep), or "".
func (ws *WebSocket) Param(name string) string {
	for i, n := range ws.route.names {
		if n == name {
			return ws.params[i]
		}
	}
	return ""
}

// ReadMessage reads the next message (see websocket.Conn.ReadMessage). It
// fails once the instance is aborted.
func (ws *WebSocket) ReadMessage() (messageType int, p []byte, err error) {
	return ws.conn.ReadMessage()
}

// WriteMessage writes one message, bounded by Config.WebSocketWriteTimeout.
// It is safe for concurrent use and returns ErrInstanceClosed once the
// socket's handler has returned or the instance was aborted.
func (ws *WebSocket) WriteMessage(messageType int, data []byte) error {
	ws.wmu.Lock()
	defer ws.wmu.Unlock()
	ws.mu.Lock()
	closed := ws.closed
	ws.mu.Unlock()
	if closed {
		return ErrInstanceClosed
	}
	_ = ws.conn.SetWriteDeadline(time.Now().Add(ws.inst.h.cfg.WebSocketWriteTimeout))
	return ws.conn.WriteMessage(messageType, data)
}

// kick ends the socket of an aborted instance: writes are refused and the
// connection is closed under the handler, whose reads and writes then fail
// at once. Called with the shard lock held, only while the socket is
// registered (its handler has not returned).
func (ws *WebSocket) kick() {
	ws.mu.Lock()
	ws.closed = true
	ws.mu.Unlock()
	nc := ws.conn.NetConn()
	if u, ok := nc.(interface{ UnsafeConn() net.Conn }); ok {
		// fasthttp's hijacked conn ignores Close (the server closes it when
		// the hijack handler returns); close the socket itself.
		nc = u.UnsafeConn()
	}
	_ = nc.Close()
}

// goAway asks the handler of a closing (not aborted) instance's socket to
// return: its pending and next reads fail at once, and the host then sends
// a 1001 "going away" close frame. A socket has no natural end, so a
// graceful close does not wait for it. (A handler that resets the read
// deadline keeps the socket until the close is upgraded to an abort.)
// Called with the shard lock held, only while the socket is registered.
func (ws *WebSocket) goAway() {
	ws.mu.Lock()
	ws.goingAway = true
	ws.mu.Unlock()
	_ = ws.conn.NetConn().SetReadDeadline(time.Unix(1, 0))
}

// upgrade answers a websocket route: the handshake is written by fasthttp
// after this returns, and the socket's handler then runs on fasthttp's
// hijack goroutine. The request's activity ends here; the socket takes its
// own when its handler starts.
func (h *Host) upgrade(c *Ctx) {
	inst, r, rc := c.inst, c.route, c.rc
	var params []string
	if n := len(r.names); n > 0 {
		params = make([]string, n)
		for i := range n {
			params[i] = string(c.vals[i])
		}
	}
	h.putCtx(c)
	// A failed handshake has been answered by the upgrader's Error.
	_ = h.upgrader.Upgrade(rc, func(conn *websocket.Conn) { h.serveWebSocket(inst, r, params, conn) })
	h.release(inst)
}

// serveWebSocket runs a websocket handler on fasthttp's hijack goroutine
// and returns only when the handler has returned: fasthttp closes and
// recycles the connection right after.
func (h *Host) serveWebSocket(inst *Instance, r *route, params []string, conn *websocket.Conn) {
	ws := &WebSocket{conn: conn, inst: inst, route: r, params: params}
	sh := &h.shards[inst.shard]
	sh.mu.Lock()
	if inst.state != stateActive {
		// Closed between the handshake and now.
		sh.mu.Unlock()
		ws.writeClose(websocket.CloseGoingAway, "instance closed")
		return
	}
	sh.hold(inst)
	x := inst.extra()
	if x.sockets == nil {
		x.sockets = make(map[*WebSocket]struct{})
	}
	x.sockets[ws] = struct{}{}
	sh.mu.Unlock()
	h.met.websockets.Inc()

	err := h.callWebSocket(inst, r, ws)

	sh.mu.Lock()
	delete(x.sockets, ws)
	sh.mu.Unlock()
	ws.mu.Lock()
	kicked, goingAway := ws.closed, ws.goingAway
	ws.closed = true
	ws.mu.Unlock()
	ws.wmu.Lock() // let concurrent writers finish (bounded by their deadline)
	if !kicked {
		switch {
		case goingAway || inst.Context().Err() != nil:
			ws.writeClose(websocket.CloseGoingAway, "instance closed")
		case err != nil && !isCloseError(err):
			ws.writeClose(websocket.CloseInternalServerErr, "internal error")
		default:
			ws.writeClose(websocket.CloseNormalClosure, "")
		}
	}
	ws.wmu.Unlock()
	if err != nil && !isCloseError(err) && !goingAway && inst.Context().Err() == nil {
		h.logThrottled(slog.LevelWarn, "websocket handler failed", "instance", inst.id, "route", r.pattern, "error", err)
	}
	h.met.websockets.Dec()
	h.release(inst)
}

func (h *Host) callWebSocket(inst *Instance, r *route, ws *WebSocket) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("websocket handler panicked: %v\n%s", p, debug.Stack())
			h.abort(inst, EvictAbort)
		}
	}()
	return r.ws(inst.obj, ws)
}

// writeClose sends a close frame, best effort.
func (ws *WebSocket) writeClose(code int, text string) {
	_ = ws.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, text), time.Now().Add(wsCloseTimeout))
}

// isCloseError reports errors that just mean the peer went away.
func isCloseError(err error) bool {
	var ce *websocket.CloseError
	return errors.As(err, &ce) || errors.Is(err, net.ErrClosed) || errors.Is(err, ErrInstanceClosed)
}
