package proxy

import (
	"bytes"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/internal/base/netloop"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// A loop relays a response body that it does not buffer (longer than
// BufferedResponseMax, chunked, or delimited by the worker closing) with
// backpressure: it reads the worker only when everything read before has been
// written to the client, so it holds one buffer per stream whatever the
// speeds. A Content-Length body passes through as it is; a chunked one is
// decoded strictly and re-chunked (extensions dropped, trailers the proxy does
// not manage passed on); a body delimited by close goes to the client
// chunked. A worker that breaks its framing mid-stream, or stalls longer than
// StreamIdleTimeout, ends the client connection: the head has been sent, so
// nothing else can tell the client the body is incomplete.

// streamState is an exchange's relay state.
type streamState struct {
	on        bool
	mode      uint8
	remaining int64 // smLength: body bytes still to come
	done      bool  // the worker's body is complete
	armed     int64 // when the stream's idle timer was last moved

	// Splicing (loopsplice.go): the body goes through pipe; inPipe bytes
	// of it are in the pipe, not yet at the client.
	splice bool
	inPipe int
	pipe   *splicePipe

	// Chunked decoding.
	cs    uint8
	size  int64  // csData: bytes left in the chunk
	line  []byte // a size or trailer line split across reads
	trail []byte // trailer fields to pass on
}

// Stream modes.
const (
	smLength uint8 = iota
	smChunked
	smClose
)

// Chunked decoder states.
const (
	csSize uint8 = iota
	csData
	csDataCR
	csDataLF
	csTrailer
	csDone
)

// maxChunkLine bounds a chunk-size line or a trailer line.
const maxChunkLine = 4096

// startStream sends the head and what has arrived of the body, then relays
// the rest.
func (x *loopExchange) startStream(cl int) {
	lp, p, c := x.lp, x.lp.p, x.c
	rh := &x.resp
	st := &x.st
	*st = streamState{on: true, line: st.line[:0], trail: st.trail[:0]}
	switch {
	case cl >= 0:
		st.mode, st.remaining = smLength, int64(cl)
		st.splice = p.cfg.SpliceMin > 0 && int64(cl) >= p.cfg.SpliceMin
	case cl == -1:
		st.mode = smChunked
	default:
		st.mode = smClose
		x.closeAfter = true
	}
	if x.clientClose || lp.f.closing.Load() {
		x.c.closeAfter = true
	}
	out := x.appendHead(lp.getOut(), st.mode == smClose) // the client gets it chunked
	body := x.rbuf[x.headLen:x.rn]
	x.headLen, x.rn = 0, 0
	out, ok := x.frame(out, body)
	if !ok {
		// Broken before the head went out: the client gets the proxy's
		// 502, as for a broken head.
		lp.putOut(out)
		st.on = false
		x.badGateway("bad chunked framing from worker", nil)
		return
	}
	p.countResponse(rh.StatusCode())
	x.record(rh.StatusCode(), knownReason(rh.Peek(wire.HeaderReason)), int64(cl))
	c.streaming = true
	st.armed = lp.nl.Now()
	x.arm(tStream, p.cfg.StreamIdleTimeout)
	c.answerOwned(out)
}

// frame appends the client's framing of body bytes from the worker to out.
// It reports false when the worker's framing is broken.
func (x *loopExchange) frame(out, b []byte) ([]byte, bool) {
	st := &x.st
	switch st.mode {
	case smLength:
		if int64(len(b)) > st.remaining {
			x.closeAfter = true // more than announced: not reusable
			b = b[:st.remaining]
		}
		st.remaining -= int64(len(b))
		out = append(out, b...)
		if st.remaining == 0 {
			st.done = true
		}
		return out, true
	case smClose:
		if len(b) > 0 {
			out = appendChunk(out, b)
		}
		return out, true
	}
	return x.dechunk(out, b)
}

// appendChunk appends b as one chunk.
func appendChunk(out, b []byte) []byte {
	out = strconvAppendHex(out, len(b))
	out = append(out, '\r', '\n')
	out = append(out, b...)
	return append(out, '\r', '\n')
}

// dechunk decodes chunked bytes from the worker and appends them re-chunked.
func (x *loopExchange) dechunk(out, b []byte) ([]byte, bool) {
	st := &x.st
	for len(b) > 0 {
		switch st.cs {
		case csSize, csTrailer:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				if len(st.line)+len(b) > maxChunkLine {
					return out, false
				}
				st.line = append(st.line, b...)
				return out, true
			}
			line := b[:i+1]
			if len(st.line) > 0 {
				if len(st.line)+len(line) > maxChunkLine {
					return out, false
				}
				st.line = append(st.line, line...)
				line = st.line
			}
			b = b[i+1:]
			var ok bool
			if st.cs == csSize {
				out, ok = x.sizeLine(out, line)
			} else {
				out, ok = x.trailerLine(out, line)
			}
			st.line = st.line[:0]
			if !ok {
				return out, false
			}
			if st.cs == csDone && len(b) > 0 {
				x.closeAfter = true // bytes after the body
				return out, true
			}
		case csData:
			n := int64(len(b))
			if n > st.size {
				n = st.size
			}
			out = appendChunk(out, b[:n])
			st.size -= n
			b = b[n:]
			if st.size == 0 {
				st.cs = csDataCR
			}
		case csDataCR:
			if b[0] != '\r' {
				return out, false
			}
			b = b[1:]
			st.cs = csDataLF
		case csDataLF:
			if b[0] != '\n' {
				return out, false
			}
			b = b[1:]
			st.cs = csSize
		case csDone:
			x.closeAfter = true
			return out, true
		}
	}
	return out, true
}

// sizeLine parses a chunk-size line (hex digits, optional extensions,
// CRLF); a zero size starts the trailer section.
func (x *loopExchange) sizeLine(out, line []byte) ([]byte, bool) {
	st := &x.st
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return out, false
	}
	line = line[:len(line)-2]
	var size int64
	i := 0
	for ; i < len(line); i++ {
		d := wire.Unhex(line[i])
		if d < 0 {
			break
		}
		if i >= 15 {
			return out, false // overflow
		}
		size = size<<4 | int64(d)
	}
	if i == 0 {
		return out, false
	}
	rest := line[i:]
	for len(rest) > 0 && (rest[0] == ' ' || rest[0] == '\t') {
		rest = rest[1:]
	}
	if len(rest) > 0 && rest[0] != ';' {
		return out, false
	}
	if bytes.IndexByte(rest, '\r') >= 0 {
		return out, false
	}
	if size == 0 {
		st.cs = csTrailer
		return out, true
	}
	st.size, st.cs = size, csData
	return out, true
}

// trailerLine takes one line of the trailer section; the empty line ends the
// body.
func (x *loopExchange) trailerLine(out, line []byte) ([]byte, bool) {
	st := &x.st
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return out, false
	}
	if len(line) == 2 {
		out = append(out, '0', '\r', '\n')
		out = append(out, st.trail...)
		out = append(out, '\r', '\n')
		st.cs, st.done = csDone, true
		return out, true
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || line[0] == ' ' || line[0] == '\t' || bytes.IndexByte(line[:len(line)-2], '\r') >= 0 {
		return out, false
	}
	if classify(line[:colon]) == hkOther && len(st.trail)+len(line) <= maxChunkLine {
		st.trail = append(st.trail, line...)
	}
	return out, true
}

// clientDrained: everything relayed so far is written; go on reading the
// worker (or end the stream).
func (x *loopExchange) clientDrained() {
	c := x.c
	c.releasePend()
	if x.st.done {
		x.endStream()
		return
	}
	c.state = stWrite
	if x.st.splice {
		x.pumpSplice()
		return
	}
	if x.wc != nil && x.wc.rready {
		x.pump()
	}
}

// workerReadable: the worker connection has bytes (or ended) while x
// streams; read them if the client has taken the last ones.
func (x *loopExchange) workerReadable() {
	if x.c.wpos >= len(x.c.pend) {
		x.pump()
	}
}

// pump reads what the worker has sent and writes it on.
func (x *loopExchange) pump() {
	if x.st.splice {
		x.pumpSplice()
		return
	}
	lp := x.lp
	w := x.wc
	for {
		n, err := netloop.Read(w.fd, x.rbuf)
		if err == unix.EAGAIN {
			w.rready = false
			return
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			if err == nil && x.st.mode == smClose {
				// The worker's close ends such a body.
				x.st.done = true
				x.closeAfter = true
				out := append(lp.getOut(), '0', '\r', '\n', '\r', '\n')
				x.c.answerOwned(out)
				return
			}
			x.streamBroken()
			return
		}
		if n < len(x.rbuf) && !w.hup {
			w.rready = false
		}
		x.streamMoved()
		var out []byte
		ok := true
		if x.st.mode == smLength {
			// Passed through from the read buffer: no copy.
			out, ok = x.frame(x.rbuf[:0], x.rbuf[:n])
			x.c.answerBorrowed(out)
		} else {
			out, ok = x.frame(lp.getOut(), x.rbuf[:n])
			if !ok {
				lp.putOut(out)
				x.streamBroken()
				return
			}
			x.c.answerOwned(out)
		}
		if !ok {
			x.streamBroken()
		}
		return
	}
}

// streamMoved notes that bytes of the stream moved: its idle timer
// (StreamIdleTimeout) starts again, moved at most four times per timeout.
func (x *loopExchange) streamMoved() { x.idleMoved(&x.st.armed, tStream) }

// idleMoved restarts a body's idle timer (kind, StreamIdleTimeout) when
// more than a quarter of the timeout passed since *armed.
func (x *loopExchange) idleMoved(armed *int64, kind uint8) {
	lp, p := x.lp, x.lp.p
	if now := lp.nl.Now(); time.Duration(now-*armed) > p.cfg.StreamIdleTimeout/4 {
		*armed = now
		x.arm(kind, p.cfg.StreamIdleTimeout)
	}
}

// endStream ends a relayed answer that the client has whole.
func (x *loopExchange) endStream() {
	c := x.c
	x.st.on = false
	c.streaming = false
	x.releaseConn()
	x.lp.nl.Disarm(&x.timer)
	c.x = nil
	x.lp.putExchange(x)
	c.answerDone()
}

// streamBroken ends a stream the worker broke: the client connection closes,
// since its head has gone out already.
func (x *loopExchange) streamBroken() {
	p := x.lp.p
	p.m.badGateway.Inc()
	if p.errLog.Allow() {
		p.log.Debug("stream ended early", "session", x.ep.id)
	}
	x.abortStream()
}

// streamTimeout ends a stream that made no progress for StreamIdleTimeout.
func (x *loopExchange) streamTimeout() {
	x.lp.p.m.timeouts.Inc()
	x.abortStream()
}

func (x *loopExchange) abortStream() {
	c := x.c
	x.st.on = false
	c.streaming = false
	x.dropConn()
	c.close() // abandons x
}
