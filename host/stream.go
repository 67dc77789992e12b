package host

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net"
	"runtime/debug"
	"time"
)

// errStreamAborted ends a stream whose instance was aborted.
var errStreamAborted = errors.New("host: stream aborted: instance closed")

// stream is the io.Reader fasthttp pulls a streamed response body from
// (RequestCtx.SetBodyStream). fasthttp calls Read on the connection's
// goroutine only once the previous bytes were accepted by the connection's
// writer, so the generator advances exactly as fast as the client reads.
//
// Read and Close are called by fasthttp's goroutine, one at a time. The
// fields under "shard lock" are shared with abort.
type stream struct {
	c          *Ctx
	inst       *Instance
	concurrent bool
	next       func() ([]byte, error, bool)
	stop       func()
	conn       net.Conn
	pending    []byte
	end        error // once set, every Read returns it

	// Guarded by the instance's shard lock.
	armed  bool // owned by the response: holds c and one activity
	closed bool
	kicked bool
}

func newStream(c *Ctx, seq iter.Seq2[[]byte, error]) *stream {
	next, stop := iter.Pull2(seq)
	return &stream{
		c:          c,
		inst:       c.inst,
		concurrent: c.route.concurrent,
		next:       next,
		stop:       stop,
		conn:       c.rc.Conn(),
	}
}

// arm hands c and the request's activity to the stream once the handler has
// returned. It reports false when the stream was already discarded (the
// handler replaced the body).
func (s *stream) arm() bool {
	inst := s.inst
	sh := &inst.h.shards[inst.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.closed {
		return false
	}
	s.armed = true
	x := inst.extra()
	if x.streams == nil {
		x.streams = make(map[*stream]struct{})
	}
	x.streams[s] = struct{}{}
	if x.aborted {
		s.kick()
	}
	inst.h.met.streams.Inc()
	return true
}

// kick makes the connection's blocked or next write fail so that fasthttp
// closes the stream of an aborted instance even when the client stopped
// reading. Called with the shard lock held, only while the stream is open.
func (s *stream) kick() {
	s.kicked = true
	if s.conn != nil {
		_ = s.conn.SetWriteDeadline(time.Unix(1, 0))
	}
}

// Read runs generator steps until it has bytes for p.
func (s *stream) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.end != nil {
			return 0, s.end
		}
		chunk, err, ok := s.step()
		switch {
		case !ok:
			s.end = io.EOF
		case err != nil:
			s.end = err
		default:
			s.pending = chunk
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// step runs one generator step inside the turn (unless the route is
// concurrent).
func (s *stream) step() (chunk []byte, err error, ok bool) {
	inst := s.inst
	if inst.Context().Err() != nil {
		return nil, errStreamAborted, true
	}
	if !s.concurrent {
		if !inst.acquireTurn() {
			return nil, errStreamAborted, true
		}
		defer inst.releaseTurn()
	}
	defer func() {
		if p := recover(); p != nil {
			inst.h.logThrottled(slog.LevelError, "stream generator panicked", "instance", inst.id,
				"route", s.c.route.pattern, "error", fmt.Sprintf("%v", p), "stack", string(debug.Stack()))
			inst.h.abort(inst, EvictAbort)
			chunk, err, ok = nil, errStreamAborted, true
		}
	}()
	return s.next()
}

// Close is called by fasthttp when the response is done (fully written,
// failed, or discarded). It stops the generator, letting its remaining code
// run inside the turn, and releases the stream's activity.
func (s *stream) Close() error {
	inst := s.inst
	h := inst.h
	sh := &h.shards[inst.shard]
	sh.mu.Lock()
	if s.closed {
		sh.mu.Unlock()
		return nil
	}
	s.closed = true
	armed, kicked := s.armed, s.kicked
	if armed {
		delete(inst.x.streams, s)
	}
	sh.mu.Unlock()

	if !armed {
		// Discarded inside the handler: the generator never started, so
		// stopping it runs none of its code (and the handler holds the turn).
		s.stop()
		return nil
	}
	if kicked && s.conn != nil {
		// The connection may serve another request; undo the abort deadline.
		_ = s.conn.SetWriteDeadline(time.Time{})
	}
	s.stopInTurn()
	h.met.streams.Dec()
	h.putCtx(s.c)
	s.c = nil
	h.release(inst)
	return nil
}

func (s *stream) stopInTurn() {
	inst := s.inst
	if !s.concurrent {
		// Not cancellable: the generator's cleanup must not race the object,
		// and teardown cannot start while this stream holds its activity.
		inst.turn <- struct{}{}
		defer inst.releaseTurn()
	}
	defer func() {
		if p := recover(); p != nil {
			inst.h.logThrottled(slog.LevelError, "stream generator panicked while stopping", "instance", inst.id,
				"error", fmt.Sprintf("%v", p), "stack", string(debug.Stack()))
		}
	}()
	s.stop()
}
