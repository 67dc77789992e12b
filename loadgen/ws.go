package loadgen

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/fasthttp/websocket"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// minWSMessage is the smallest websocket message: the unique tag
// "#wwwwwwww.ssssssssssssss" (worker and sequence number in hex).
const minWSMessage = 24

// wsExec measures websocket echo round trips on one connection per worker.
// The connection is dialled on first use with the id of that request and
// kept until it fails; round trips after the dial ignore their id.
type wsExec struct {
	d       *websocket.Dialer
	tmpl    template
	hdr     http.Header
	timeout time.Duration
	worker  uint32
	seq     uint64
	conn    *websocket.Conn
	msg     []byte // the message; its first minWSMessage bytes are the tag
	rbuf    []byte // len(msg)+1, so a longer message is told apart
	uri     []byte
}

func newWSDialer(cfg *Config, serverName string) *websocket.Dialer {
	d := &websocket.Dialer{HandshakeTimeout: cfg.Timeout, TLSClientConfig: tlsConfig(cfg.TLS, serverName)}
	if dial := cfg.Dial; dial != nil {
		d.NetDialContext = func(_ context.Context, _, addr string) (net.Conn, error) { return dial(addr) }
	} else {
		nd := &net.Dialer{Timeout: cfg.Timeout}
		d.NetDialContext = nd.DialContext
	}
	return d
}

func newWSExec(d *websocket.Dialer, base string, s *Scenario, headers []Header, timeout time.Duration, worker int) *wsExec {
	hdr := make(http.Header, len(headers)+len(s.Headers))
	for _, h := range headers {
		hdr.Add(h.Name, h.Value)
	}
	for _, k := range sortedHeaderNames(s.Headers) {
		hdr.Add(k, s.Headers[k])
	}
	e := &wsExec{
		d:       d,
		tmpl:    newTemplate(s.Path).withPrefix(base),
		hdr:     hdr,
		timeout: timeout,
		worker:  uint32(worker),
		msg:     make([]byte, s.BodySize),
		rbuf:    make([]byte, s.BodySize+1),
	}
	fillPattern(e.msg, 0)
	return e
}

func (e *wsExec) exec(id []byte, o *outcome) {
	if e.conn == nil && !e.dial(id, o) {
		return
	}
	e.seq++
	e.tag()
	deadline := time.Now().Add(e.timeout)
	_ = e.conn.SetWriteDeadline(deadline)
	if err := e.conn.WriteMessage(websocket.TextMessage, e.msg); err != nil {
		e.fail(o, err)
		return
	}
	o.sent = int64(len(e.msg))
	_ = e.conn.SetReadDeadline(deadline)
	for {
		_, r, err := e.conn.NextReader()
		if err != nil {
			e.fail(o, err)
			return
		}
		n, err := io.ReadFull(r, e.rbuf)
		o.recv += int64(n)
		switch {
		case err == nil: // longer than ours: someone else's message
			m, err := io.Copy(io.Discard, r)
			o.recv += m
			if err != nil {
				e.fail(o, err)
				return
			}
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			if n == len(e.msg) && bytes.Equal(e.rbuf[:n], e.msg) {
				return // our echo
			}
		default:
			e.fail(o, err)
			return
		}
		o.other++
	}
}

// tag writes the worker and sequence number into the message head, making
// it unique within the run.
func (e *wsExec) tag() {
	const hex = "0123456789abcdef"
	m := e.msg
	m[0] = '#'
	w := e.worker
	for i := 8; i >= 1; i-- {
		m[i] = hex[w&15]
		w >>= 4
	}
	m[9] = '.'
	s := e.seq
	for i := 23; i >= 10; i-- {
		m[i] = hex[s&15]
		s >>= 4
	}
}

// dial opens the worker's websocket. A handshake refused with a non-2xx
// status is reported as that status (with X-Pinned-Reason), not as a
// transport error; a 2xx instead of 101 is an "other" error.
func (e *wsExec) dial(id []byte, o *outcome) bool {
	e.uri = e.tmpl.appendTo(e.uri[:0], id)
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	conn, resp, err := e.d.DialContext(ctx, string(e.uri), e.hdr)
	if resp != nil && resp.Body != nil {
		_ = resp.Body.Close()
	}
	if err != nil {
		if errors.Is(err, websocket.ErrBadHandshake) && resp != nil && (resp.StatusCode < 200 || resp.StatusCode > 299) {
			o.status = resp.StatusCode
			if r := resp.Header.Get(wire.HeaderReason); r != "" {
				o.reason = []byte(r)
			}
			return false
		}
		o.err = err
		return false
	}
	e.conn = conn
	return true
}

func (e *wsExec) fail(o *outcome, err error) {
	o.err = err
	e.close()
}

func (e *wsExec) close() {
	if e.conn == nil {
		return
	}
	_ = e.conn.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(100*time.Millisecond))
	_ = e.conn.Close()
	e.conn = nil
}
