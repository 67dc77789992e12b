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
// must parse (and re-frame) them. Request bodies too: a loop takes only
// bodies it holds for a resend (ReplayBodyMax); larger ones go to the
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
		var b [1]byte
		_, _, err := unix.Recvfrom(w.fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == unix.EAGAIN && !w.hup {
			w.rready = false // nothing follows: the connection is idle
		} else {
			// A byte after the announced length (n > 0), the worker's
			// close (n == 0), or an error: no next answer on it.
			x.closeAfter = true
		}
	}
	x.endStream()
}
