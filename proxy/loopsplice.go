package proxy

import (
	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/internal/base/netloop"
)

// A loop moves a Content-Length response body of at least SpliceMin bytes
// from the worker's socket to the client's through a pipe, with splice(2):
// the bytes never enter the proxy's memory (the worker's socket buffers'
// pages are moved into the pipe and out to the client's socket). The head,
// and whatever of the body came with it, go out as for any relayed body
// first. Backpressure is the same as the copying relay's: the loop splices
// from the worker only into an empty pipe, and only when the client has
// taken everything spliced before, so a stream holds at most one pipe's
// worth (SplicePipeSize) whatever the speeds, and a slow client stalls
// only its own stream. Chunked bodies and bodies delimited by the worker's
// close keep the copying path: splice cannot frame them, and the proxy
// must parse (and re-frame) them.
//
// A Content-Length request body of at least SpliceMin (over ReplayBodyMax:
// smaller ones are held whole) goes the other way the same way: the head,
// and what came of the body with it (at least its first upStartMax bytes,
// within HeaderTimeout, as on the fasthttp engine), are written from the
// loop's memory, the rest is spliced from the client's socket into a pipe
// and on to the worker's, and the loop splices from the client only into
// an empty pipe (pumpUpload). Such a body is not held: the request is
// never sent again (outcome: not replayable, like the fasthttp engine's
// streamed bodies). The worker's answer is read once the whole body has
// gone out, an early one too, as on the fasthttp engine; a request that
// ends before (the client closed or stalled, the worker stopped taking the
// body, any answer of the proxy's own) closes the worker's connection and,
// after the answer, the client's, whose body is unread. Chunked request
// bodies, and bodies between ReplayBodyMax and SpliceMin, go to the
// fasthttp engine with their connection.

// splicePipe is a pipe of a loop's, for one spliced stream at a time.
type splicePipe struct {
	r, w int
	size int // its capacity (F_GETPIPE_SZ)
}

// maxPooledPipes is how many idle pipes a loop keeps.
const maxPooledPipes = 16

// getPipe returns an empty pipe, pooled or new (sized to SplicePipeSize,
// or as close as the system allows).
func (lp *loop) getPipe() (*splicePipe, error) {
	if n := len(lp.pipes); n > 0 {
		pp := lp.pipes[n-1]
		lp.pipes = lp.pipes[:n-1]
		return pp, nil
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return nil, err
	}
	pp := &splicePipe{r: fds[0], w: fds[1]}
	size, err := unix.FcntlInt(uintptr(pp.w), unix.F_SETPIPE_SZ, lp.p.cfg.SplicePipeSize)
	if err != nil {
		// Above /proc/sys/fs/pipe-max-size (EPERM without CAP_SYS_RESOURCE),
		// or out of the user's pipe pages: the pipe keeps its size.
		if size, err = unix.FcntlInt(uintptr(pp.w), unix.F_GETPIPE_SZ, 0); err != nil {
			pp.close()
			return nil, err
		}
	}
	pp.size = size
	return pp, nil
}

// putPipe takes a pipe back; one that may hold bytes is closed.
func (lp *loop) putPipe(pp *splicePipe, empty bool) {
	if empty && len(lp.pipes) < maxPooledPipes && !lp.shuttingDown {
		lp.pipes = append(lp.pipes, pp)
		return
	}
	pp.close()
}

func (pp *splicePipe) close() {
	_ = netloop.Close(pp.r)
	_ = netloop.Close(pp.w)
}

// spliceFlags: never block; move pages where the kernel can.
const spliceFlags = unix.SPLICE_F_NONBLOCK | unix.SPLICE_F_MOVE

// pumpSplice moves the body on: what the pipe holds to the client, then,
// once it is empty, what the worker has sent into it, until the body is
// whole, a socket would block, or something fails.
func (x *loopExchange) pumpSplice() {
	lp, p, c := x.lp, x.lp.p, x.c
	st := &x.st
	if st.pipe == nil {
		pp, err := lp.getPipe()
		if err != nil {
			// No pipe (out of descriptors or pipe pages): copy instead.
			p.m.spliceFallbacks.Inc()
			st.splice = false
			x.pump()
			return
		}
		st.pipe = pp
	}
	for {
		for st.inPipe > 0 {
			n, err := unix.Splice(st.pipe.r, nil, c.fd, nil, st.inPipe, spliceFlags)
			if err == unix.EAGAIN {
				// The client's socket is full: its write event continues
				// (flush, clientDrained).
				lp.nl.ArmAfter(&c.timer, c.writeTimeout())
				return
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil || n == 0 {
				c.close() // the client is gone; abandons x
				return
			}
			st.inPipe -= int(n)
			p.m.splicedBytes.Add(int(n))
			// Bytes moved: a client that drains a pipe's worth more
			// slowly than StreamIdleTimeout is slow, not stalled.
			x.streamMoved()
		}
		lp.nl.Disarm(&c.timer)
		if st.remaining == 0 {
			st.done = true
			x.spliceDone()
			return
		}
		w := x.wc
		if !w.rready {
			return // the worker's read event continues (workerReadable)
		}
		n, err := unix.Splice(w.fd, nil, st.pipe.w, nil, int(min(st.remaining, int64(st.pipe.size))), spliceFlags)
		if err == unix.EAGAIN {
			w.rready = false
			return
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			x.streamBroken() // the worker ended (or failed) before the announced length
			return
		}
		// A short splice does not say the socket is empty (the pipe may
		// have run out of slots first): rready stays until EAGAIN says so.
		st.remaining -= n
		st.inPipe = int(n)
		x.streamMoved()
	}
}

// spliceDone ends a spliced stream: the worker's connection goes back to
// the pool only when nothing follows the body (bytes after the announced
// length would be taken for the next answer); endStream does the rest.
func (x *loopExchange) spliceDone() {
	if w := x.wc; w != nil && !x.closeAfter {
		if socketQuiet(w.fd) && !w.hup {
			w.rready = false // nothing follows: the connection is idle
		} else {
			// A byte after the announced length (n > 0), the worker's
			// close (n == 0), or an error: no next answer on it.
			x.closeAfter = true
		}
	}
	x.endStream()
}

// socketQuiet reports whether a peek at fd would block: the peer sent
// nothing more and did not close (a byte, the close or an error: false).
// The end of a body relayed whole asks it before the connection is pooled
// (spliceDone on the loops, sentMore on the fasthttp engine).
func socketQuiet(fd int) bool {
	var b [1]byte
	_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return err == unix.EAGAIN
}

// uploadState is a spliced request body's state: length bytes announced,
// left of them still in the client's socket, inPipe in the pipe on their
// way to the worker.
type uploadState struct {
	on     bool  // the body is being sent (or waits for its worker connection)
	length int64 // its Content-Length; 0: the request's body, if any, is held in x.body
	left   int64
	inPipe int
	pipe   *splicePipe
	armed  int64 // when the upload's idle timer was last moved
}

// upStartMax is how much of a spliced body must come with its head, within
// HeaderTimeout, before a loop starts the request: what the fasthttp
// engine's server reads of a streamed body with its head.
const upStartMax = 8 << 10

// upStart is how many bytes of a spliced body of cl bytes must arrive with
// its head, when room bytes of the connection's buffer follow the head.
func upStart(cl, room int) int {
	return min(cl, upStartMax, max(room, 0))
}

// bodyLen is the length of the request's body: held or spliced.
func (x *loopExchange) bodyLen() int64 {
	if x.up.length > 0 {
		return x.up.length
	}
	return int64(len(x.body))
}

// clientReadable: the client connection has bytes (or ended) while x
// splices its body; they are taken once the worker has taken the last ones
// and the head and what came with it have gone out.
func (x *loopExchange) clientReadable() {
	if x.up.inPipe == 0 && x.wc != nil && x.sent >= len(x.out) {
		x.pumpUpload()
	}
}

// pumpUpload moves a request body on: what the pipe holds to the worker,
// then, once it is empty, what the client has sent into it, until the body
// is whole, a socket would block, or something fails. The pull is the
// response splice's (pumpSplice) the other way round: the loop splices
// from the client only into an empty pipe, so a slow worker holds the
// client back (its socket buffers fill, then its window closes) and the
// stream holds at most one pipe.
func (x *loopExchange) pumpUpload() {
	p, c, w := x.lp.p, x.c, x.wc
	u := &x.up
	if !u.on || w == nil || x.sent < len(x.out) {
		return
	}
	for {
		for u.inPipe > 0 {
			n, err := unix.Splice(u.pipe.r, nil, w.fd, nil, u.inPipe, spliceFlags)
			if err == unix.EAGAIN {
				return // the worker's socket is full: its write event continues
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil || n == 0 {
				if err == nil {
					err = unix.EPIPE
				}
				x.sendFailed(err) // the worker is gone: as a failed write
				return
			}
			u.inPipe -= int(n)
			p.m.splicedRequestBytes.Add(int(n))
			x.uploadMoved()
		}
		if u.left == 0 {
			x.uploadDone()
			return
		}
		if !c.rready {
			return // the client's read event continues (clientReadable)
		}
		n, err := unix.Splice(c.fd, nil, u.pipe.w, nil, int(min(u.left, int64(u.pipe.size))), spliceFlags)
		if err == unix.EAGAIN {
			c.rready = false
			return
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			// The client closed (or broke) its connection mid-body: the
			// worker's connection, with half a body, closes (fail), and
			// the client gets the fasthttp path's answer to a body cut
			// off, if it still reads.
			x.fail(&p.replies.badBody)
			return
		}
		// A short splice does not say the socket is empty (the pipe may
		// have run out of slots first): rready stays until EAGAIN says so.
		u.left -= n
		u.inPipe = int(n)
		x.uploadMoved()
	}
}

// uploadDone: the whole body has gone to the worker. The pipe, empty, goes
// back to the loop; the wait for the answer starts (ResponseHeaderTimeout),
// and an answer that came before the body's end is read now.
func (x *loopExchange) uploadDone() {
	lp := x.lp
	u := &x.up
	lp.putPipe(u.pipe, true)
	u.pipe, u.on = nil, false
	x.arm(tResponse, lp.p.cfg.ResponseHeaderTimeout)
	x.c.sp.stamp(hopSent)
	if w := x.wc; w.rready {
		x.readResponse()
	}
}

// uploadMoved notes that bytes of the body moved: its idle timer
// (StreamIdleTimeout) starts again, moved at most four times per timeout.
func (x *loopExchange) uploadMoved() { x.idleMoved(&x.up.armed, tUpload) }

// uploadTimeout: no byte of the body moved for StreamIdleTimeout. As on
// the fasthttp path: a worker that takes nothing more is a write that
// timed out (decide: a body not held is never sent again); a client that
// sends nothing more gets 408 naming the body. Either way the client's
// connection closes after the answer (fail): the rest of its body is
// unread.
func (x *loopExchange) uploadTimeout() {
	p := x.lp.p
	if x.sent < len(x.out) || x.up.inPipe > 0 {
		x.sendFailed(unix.ETIMEDOUT)
		return
	}
	x.fail(&p.replies.bodyTimeout)
}
