//go:build linux

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/clock"
)

// loopEngineSupported reports whether EngineLoop can run on this platform.
const loopEngineSupported = true

// Event-loop tuning.
const (
	// housekeepEvery is how often a loop checks request and connect
	// timeouts, idle connections and the series: timeouts fire up to this
	// late.
	housekeepEvery = 10 * time.Millisecond
	// maxDefer is the longest a loop sleeps on its timer alone, leaving
	// ready responses unread until it wakes (see wait).
	maxDefer = 2 * time.Millisecond
	// yieldEvery is how often a loop yields to the Go scheduler. The
	// runtime takes the P of a goroutine that has run 10ms without being
	// rescheduled at each of its system calls (and keeps doing so until it
	// is rescheduled): a loop that never yielded would pay a P handoff,
	// futex wake-ups and a busy sysmon on every wait. Each yield costs
	// a futex wake-up of an idle thread and its sleep again (Gosched's
	// wakep), so the loop yields no more often than that 10ms asks: at
	// 2ms those were nearly all of the open loop's futex calls (0.15 per
	// request at 12 000 req/s, 0.04 at 8ms; profiles/README.md).
	yieldEvery = 8 * time.Millisecond
	// closedQuota is how many measured requests a closed loop takes from
	// the shared Requests budget at a time.
	closedQuota = 32
	// maxEvents is the epoll batch size.
	maxEvents = 256
)

// wakeIndex marks the loop's eventfd in epoll data (connections use their
// index).
const wakeIndex = -1

// loopRun is what the loops of one run share; it is immutable while they
// run, except for the atomics.
type loopRun struct {
	r            *Runner
	base         time.Time     // ns offsets below count from here (monotonic)
	t0           clock.Instant // base as an Instant
	monoBase     int64         // CLOCK_MONOTONIC at base, for absolute sleeps
	sch          *schedule     // open loop; nil in the closed loop
	warmupEnd    int64         // closed loop: requests sent before this are warmup
	sendEnd      int64         // closed loop: no request is sent from here on; -1 unbounded
	sa           unix.Sockaddr // the target
	family       int
	dialErr      error // address resolution failed: every request fails with it
	reqs         []*rawRequest
	ser          *series
	measureStart clock.Instant
	deferReads   bool // loops may sleep on their timer with responses unread
	budget       atomic.Int64
	budgetHit    atomic.Bool
	stop         atomic.Bool  // cancelled
	trace        bool         // Config.TraceFile: number requests and record them
	seq          atomic.Int64 // the next Trace-Seq
}

// runLoops runs the event-loop engine and returns every loop's statistics.
func (r *Runner) runLoops(ctx context.Context, base time.Time, sch *schedule, ser *series, measureStart clock.Instant) (engineResult, error) {
	cfg := &r.cfg
	lr, err := r.newLoopRun(ctx, base, sch, ser, measureStart)
	if err != nil {
		return engineResult{}, err
	}
	n := cfg.Loops
	loops := make([]*evLoop, n)
	for k := range loops {
		conns := cfg.Connections / n
		if k < cfg.Connections%n {
			conns++
		}
		l, err := newEvLoop(lr, k, n, conns)
		if err != nil {
			for _, l := range loops[:k] {
				l.closeFds()
			}
			return engineResult{}, err
		}
		loops[k] = l
	}
	done := make(chan struct{})
	var stopper sync.WaitGroup
	stopper.Go(func() {
		select {
		case <-ctx.Done():
			lr.stop.Store(true)
			for _, l := range loops {
				l.wake()
			}
		case <-done:
		}
	})
	var wg sync.WaitGroup
	for _, l := range loops {
		wg.Go(l.run)
	}
	wg.Wait()
	close(done)
	stopper.Wait()

	if lr.trace {
		var all [][]traceRecord
		for _, l := range loops {
			all = append(all, l.traces)
		}
		if err := writeTrace(cfg.TraceFile, all); err != nil {
			return engineResult{}, err
		}
	}
	res := engineResult{recorders: n, measureStart: measureStart, stoppedBy: StopDuration}
	for _, l := range loops {
		res.stats = append(res.stats, &l.st)
	}
	if lr.budgetHit.Load() {
		res.stoppedBy = StopRequests
	}
	return res, nil
}

// newLoopRun prepares what the loops of a run share.
func (r *Runner) newLoopRun(ctx context.Context, base time.Time, sch *schedule, ser *series, measureStart clock.Instant) (*loopRun, error) {
	cfg := &r.cfg
	lr := &loopRun{r: r, base: base, t0: clock.FromTime(base), sch: sch, ser: ser, measureStart: measureStart, sendEnd: -1}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("loadgen: clock_gettime: %w", err)
	}
	lr.monoBase = ts.Nano() - int64(time.Since(base))
	if sch == nil {
		lr.warmupEnd = int64(cfg.Warmup)
		if cfg.Duration != Unbounded {
			lr.sendEnd = int64(cfg.Warmup + cfg.Duration)
		}
		lr.budget.Store(cfg.Requests)
	}
	lr.resolve(ctx, r.hostPort)
	lr.deferReads = sch != nil
	lr.trace = cfg.TraceFile != ""
	for _, s := range cfg.Scenarios {
		lr.reqs = append(lr.reqs, newRawRequest(&s, r.host, cfg.Headers))
		if s.Kind == KindDownload || s.Kind == KindUpload {
			lr.deferReads = false // a bulk body must not wait for the timer
		}
	}
	return lr, nil
}

// resolve finds the target's address once, before the loops start.
func (lr *loopRun) resolve(ctx context.Context, hostPort string) {
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		lr.dialErr = err
		return
	}
	p, err := net.LookupPort("tcp", port)
	if err != nil {
		lr.dialErr = err
		return
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		addrs, lerr := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if lerr != nil || len(addrs) == 0 {
			lr.dialErr = fmt.Errorf("resolve %s: %v", host, lerr)
			return
		}
		ip = addrs[0]
		for _, a := range addrs {
			if a.Unmap().Is4() {
				ip = a // prefer IPv4 when the name has both, as most clients do
				break
			}
		}
	}
	ip = ip.Unmap()
	if ip.Is4() {
		lr.sa, lr.family = &unix.SockaddrInet4{Port: p, Addr: ip.As4()}, unix.AF_INET
	} else {
		lr.sa, lr.family = &unix.SockaddrInet6{Port: p, Addr: ip.As16()}, unix.AF_INET6
	}
}

// Connection states.
const (
	csFree       uint8 = iota // no socket
	csConnecting              // connect in progress
	csIdle                    // connected, no request
	csBusy                    // a request written or being written, response pending
)

// Errors the loops report (values, so that failing requests do not
// allocate).
var (
	errRequestTimeout = errors.New("no complete response within the timeout")
	errConnectTimeout = errors.New("connect timed out")
)

// lconn is one connection of a loop, owned by it.
type lconn struct {
	idx      int32
	gen      int32 // bumped at every close: tells stale epoll events apart
	fd       int
	state    uint8
	writing  bool // EPOLLOUT is armed: the request is not fully written
	rbuf     []byte
	rlen     int
	wbuf     []byte
	woff     int
	shared   []byte // a large static body, written after wbuf
	soff     int
	stream   int64 // generated body bytes left to write after wbuf
	streamed int64 // generated body bytes written
	bodyLen  int64
	p        respParser
	sc       int
	warm     bool
	slot     int64 // open loop: the slot served; -1 in the closed loop
	intended int64 // ns from base (open loop)
	sent     int64 // ns from base: just before the first write
	deadline int64 // request or connect timeout
	idleAt   int64
	rxTS     int64 // kernel receive time of the last read (wall ns), 0 if none
	seq      int64 // the request's Trace-Seq (Config.TraceFile), else -1
}

// Kernel receive timestamps: unknown until the first read tells.
const (
	tsUnknown uint8 = iota
	tsYes
	tsNo
)

// evLoop is one event loop: its epoll instance, its connections, its share
// of the schedule (slots k, k+n, k+2n, ...) and its statistics. Everything
// in it is owned by its goroutine.
type evLoop struct {
	lr         *loopRun
	cfg        *Config
	k, n       int
	epfd, evfd int
	sa         unix.Sockaddr // the loop's copy of the target's address
	events     [maxEvents]unix.EpollEvent
	oob        [64]byte
	conns      []lconn
	idle       []int32 // a stack: the most recently used connection is reused first
	free       []int32
	ndial      int // connecting
	nbusy      int
	nopen      int // not free
	pick       picker
	st         stats
	live       *liveCounters
	kernelTS   uint8
	bulk       bool // a read filled the buffer: responses may outgrow the socket buffer, so never leave them unread
	stopping   bool // no new request: the schedule or the bounds ended, or the run was cancelled
	// open loop: the released slots waiting for a connection are
	// [nextSend, nextRel), step n
	nextRel, nextSend int64
	quota             int64 // closed loop: measured requests taken from the budget, not yet sent
	now               int64 // ns from base, read when the loop last woke
	wallOff           int64 // wall ns − now: converts kernel timestamps
	nextHK            int64
	nextYield         int64
	traces            []traceRecord // Config.TraceFile
}

func newEvLoop(lr *loopRun, k, n, conns int) (*evLoop, error) {
	l := &evLoop{lr: lr, cfg: &lr.r.cfg, k: k, n: n}
	var err error
	if l.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("loadgen: epoll_create1: %w", err)
	}
	if l.evfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		unix.Close(l.epfd)
		return nil, fmt.Errorf("loadgen: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: wakeIndex}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, l.evfd, &ev); err != nil {
		l.closeFds()
		return nil, fmt.Errorf("loadgen: epoll_ctl: %w", err)
	}
	l.conns = make([]lconn, conns)
	for i := range l.conns {
		l.conns[i].idx, l.conns[i].fd = int32(i), -1
		l.free = append(l.free, int32(conns-1-i))
	}
	l.idle = make([]int32, 0, conns)
	l.pick = lr.r.newPicker(k)
	l.st = newStats(len(l.cfg.Scenarios), lr.r.maxUs, lr.ser, lr.measureStart)
	l.live = &lr.r.live[k]
	// unix.Connect writes the raw form into the Sockaddr: one per loop.
	switch sa := lr.sa.(type) {
	case *unix.SockaddrInet4:
		c := *sa
		l.sa = &c
	case *unix.SockaddrInet6:
		c := *sa
		l.sa = &c
	}
	if lr.sch != nil {
		l.nextRel, l.nextSend = int64(k), int64(k)
	}
	return l, nil
}

func (l *evLoop) closeFds() {
	unix.Close(l.evfd)
	unix.Close(l.epfd)
}

// wake interrupts the loop's wait (called by the stopper goroutine).
func (l *evLoop) wake() {
	one := [8]byte{1}
	_, _ = unix.Write(l.evfd, one[:])
}

// run is the loop's goroutine.
func (l *evLoop) run() {
	preciseTimers()
	defer l.shutdown()
	l.tick()
	l.nextHK = l.now + int64(housekeepEvery)
	l.nextYield = l.now + int64(yieldEvery)
	for {
		if l.now >= l.nextYield {
			l.yield()
		}
		if l.lr.stop.Load() && !l.stopping {
			l.halt()
		}
		if l.now >= l.nextHK {
			l.housekeep()
		}
		if l.lr.sch != nil {
			l.release()
			l.dispatch()
		} else {
			l.fill()
		}
		if l.finished() {
			return
		}
		l.wait(l.wakeAt())
	}
}

// preciseTimers sets the timer slack of the calling thread to 1ns: its
// sleeps end on time, not up to 50µs late (the default slack).
func preciseTimers() { _ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0) }

// yield lets the Go scheduler reschedule the loop (see yieldEvery). The
// loop's goroutine is not locked to its thread: a locked goroutine cannot
// be rescheduled without handing its thread off and back. It usually
// resumes on the same thread; the timer slack is set again in case not.
func (l *evLoop) yield() {
	runtime.Gosched()
	preciseTimers()
	l.tick()
	l.nextYield = l.now + int64(yieldEvery)
}

// tick reads the clock.
func (l *evLoop) tick() {
	t := time.Now()
	l.now = int64(t.Sub(l.lr.base))
	l.wallOff = t.UnixNano() - l.now
}

// clock reads the monotonic clock without the wall reading.
func (l *evLoop) clock() int64 { return int64(time.Since(l.lr.base)) }

// instant converts a loop time to a clock.Instant.
func (l *evLoop) instant(ns int64) clock.Instant { return l.lr.t0.Add(time.Duration(ns)) }

// setState moves c to state s, keeping the counts.
func (l *evLoop) setState(c *lconn, s uint8) {
	switch c.state {
	case csConnecting:
		l.ndial--
	case csBusy:
		l.nbusy--
	case csFree:
		l.nopen++
	}
	switch s {
	case csConnecting:
		l.ndial++
	case csBusy:
		l.nbusy++
	case csFree:
		l.nopen--
	}
	c.state = s
}

// ---- the open loop ----

// release moves the slots due by now into the backlog.
func (l *evLoop) release() {
	sch := l.lr.sch
	for !l.stopping && l.nextRel < sch.total && int64(sch.offset(l.nextRel)) <= l.now {
		l.nextRel += int64(l.n)
	}
}

// backlog returns how many released slots wait for a connection.
func (l *evLoop) backlog() int64 { return (l.nextRel - l.nextSend) / int64(l.n) }

// dispatch sends waiting slots on idle connections and dials for the rest.
func (l *evLoop) dispatch() {
	for l.nextSend < l.nextRel {
		if n := len(l.idle); n > 0 {
			c := &l.conns[l.idle[n-1]]
			l.idle = l.idle[:n-1]
			slot := l.nextSend
			l.nextSend += int64(l.n)
			l.start(c, slot)
			continue
		}
		if int64(l.ndial) >= l.backlog() || len(l.free) == 0 {
			return
		}
		if err := l.dial(); err != nil {
			l.failSlot(err)
		}
	}
}

// failSlot fails the oldest waiting slot without sending it: no
// connection could be made for it.
func (l *evLoop) failSlot(err error) {
	slot := l.nextSend
	l.nextSend += int64(l.n)
	sc, _ := l.pick.next()
	l.live.sent.Add(1)
	o := outcome{err: err, class: classConnect}
	l.finish(sc, slot < l.lr.sch.warmup, slot, int64(l.lr.sch.offset(slot)), -1, l.clock(), &o)
}

// abandon counts the waiting slots as unsent and stops the schedule.
func (l *evLoop) abandon() {
	for s := l.nextSend; s < l.nextRel; s += int64(l.n) {
		if s >= l.lr.sch.warmup {
			l.st.unsent++
		}
	}
	l.nextSend = l.nextRel
	l.stopping = true
	l.closeConnecting()
}

// ---- the closed loop ----

// fill keeps the closed loop's connections open and busy: a connection
// that closed is dialled again; a connect that fails is a failed request.
func (l *evLoop) fill() {
	for tries := len(l.conns); tries > 0 && len(l.free) > 0 && l.mayTake(); tries-- {
		if err := l.dial(); err != nil {
			l.failRequest(err)
		}
	}
}

// failRequest counts a closed-loop request that failed for want of a
// connection.
func (l *evLoop) failRequest(err error) {
	if !l.take() {
		return
	}
	sc, _ := l.pick.next()
	l.live.sent.Add(1)
	now := l.clock()
	o := outcome{err: err, class: classConnect}
	l.finish(sc, now < l.lr.warmupEnd, -1, 0, -1, now, &o)
}

// take reports whether the closed loop may send another request, taking it
// from the Requests budget when it is measured. The loops take the budget
// closedQuota requests at a time, so that they rarely touch the shared
// counter; the total is exact.
func (l *evLoop) take() bool {
	if l.closedStopping() {
		return false
	}
	if l.now < l.lr.warmupEnd || l.cfg.Requests == Unbounded {
		return true
	}
	if l.quota == 0 {
		left := l.lr.budget.Add(-closedQuota)
		l.quota = max(0, closedQuota+min(left, 0))
		if l.quota == 0 {
			l.lr.budgetHit.Store(true)
			l.stopping = true
			return false
		}
	}
	l.quota--
	return true
}

// mayTake reports whether take may still succeed, without taking; a loop
// whose budget is spent stops.
func (l *evLoop) mayTake() bool {
	if l.closedStopping() {
		return false
	}
	if l.cfg.Requests == Unbounded || l.now < l.lr.warmupEnd || l.quota > 0 || l.lr.budget.Load() > 0 {
		return true
	}
	l.lr.budgetHit.Store(true)
	l.stopping = true
	return false
}

// closedStopping reports whether the closed loop sends no more requests.
func (l *evLoop) closedStopping() bool {
	if !l.stopping && l.lr.sendEnd >= 0 && l.now >= l.lr.sendEnd {
		l.stopping = true
	}
	return l.stopping
}

// ---- requests ----

// start sends the next request on connection c: slot ≥ 0 in the open loop,
// -1 in the closed loop.
func (l *evLoop) start(c *lconn, slot int64) {
	sc, id := l.pick.next()
	req := l.lr.reqs[sc]
	c.seq = -1
	if l.lr.trace {
		c.seq = l.lr.seq.Add(1) - 1
	}
	c.wbuf, c.bodyLen = req.render(c.wbuf[:0], id, c.seq)
	c.woff, c.soff, c.shared, c.stream, c.streamed = 0, 0, req.shared, req.stream, 0
	c.p.reset(req.head)
	c.sc, c.rlen, c.rxTS = sc, 0, 0
	c.sent = l.clock()
	c.slot = slot
	if slot >= 0 {
		c.intended = int64(l.lr.sch.offset(slot))
		c.warm = slot < l.lr.sch.warmup
	} else {
		c.warm = c.sent < l.lr.warmupEnd
	}
	c.deadline = c.sent + int64(l.cfg.Timeout)
	l.setState(c, csBusy)
	l.live.sent.Add(1)
	l.write(c)
}

// write writes as much of c's request as the socket takes.
func (l *evLoop) write(c *lconn) {
	for {
		var p []byte
		switch {
		case c.woff < len(c.wbuf):
			p = c.wbuf[c.woff:]
		case c.soff < len(c.shared):
			p = c.shared[c.soff:]
		case c.stream > 0:
			p = patternBlock[c.streamed%int64(len(patternBlock)):]
			p = p[:min(int64(len(p)), c.stream)]
		default:
			if c.writing {
				c.writing = false
				l.ctl(c, unix.EPOLLIN)
			}
			return
		}
		n, err := rawWrite(c.fd, p)
		if err == unix.EAGAIN {
			if !c.writing {
				c.writing = true
				l.ctl(c, unix.EPOLLIN|unix.EPOLLOUT)
			}
			return
		}
		if err != nil {
			l.fail(c, classConnection, err)
			return
		}
		switch {
		case c.woff < len(c.wbuf):
			c.woff += n
		case c.soff < len(c.shared):
			c.soff += n
		default:
			c.stream -= int64(n)
			c.streamed += int64(n)
		}
	}
}

// bodySent returns how many body bytes of c's request were written.
func (c *lconn) bodySent() int64 {
	if c.shared != nil || c.streamed > 0 || c.stream > 0 {
		return int64(c.soff) + c.streamed
	}
	// the body, if any, is the tail of wbuf
	return max(0, c.bodyLen-int64(len(c.wbuf)-c.woff))
}

// read reads what c's socket holds and advances the response.
func (l *evLoop) read(c *lconn) {
	for {
		buf := c.rbuf[c.rlen:]
		if len(buf) == 0 {
			l.fail(c, classOther, errHeadTooLarge)
			return
		}
		n, ts, err := recvmsg(c.fd, buf, l.oob[:])
		switch {
		case err == unix.EAGAIN:
			return
		case err == unix.EINTR:
			continue
		case err != nil:
			l.fail(c, classConnection, err)
			return
		case n == 0:
			if perr := c.p.eof(); perr != nil {
				l.fail(c, classConnection, perr)
				return
			}
			l.complete(c, true)
			return
		}
		if ts != 0 {
			c.rxTS = ts
			if l.kernelTS == tsUnknown {
				l.kernelTS = tsYes
			}
		} else {
			l.kernelTS = tsNo
		}
		if n == len(c.rbuf) {
			l.bulk = true
		}
		data := c.rbuf[:c.rlen+n]
		used, perr := c.p.parse(data)
		if perr != nil {
			l.fail(c, classOther, perr)
			return
		}
		if c.p.done() {
			if used < len(data) {
				l.fail(c, classOther, errExtraData)
				return
			}
			l.complete(c, c.p.close)
			return
		}
		c.rlen = copy(c.rbuf, data[used:])
		if n < len(buf) {
			return // drained; epoll reports the rest
		}
	}
}

// complete records c's response and reuses or closes the connection.
func (l *evLoop) complete(c *lconn, closeConn bool) {
	now := l.clock()
	done := now
	if c.rxTS != 0 {
		// The kernel's receive time of the response's last bytes: exact
		// even when the loop read them late (deferReads). It is a wall
		// time, converted with the offset of the loop's last wake-up, and
		// trusted only between the send and now.
		if t := c.rxTS - l.wallOff; t >= c.sent && t <= now {
			done = t
		}
	}
	if l.lr.trace && !c.warm && c.seq >= 0 && len(l.traces) < maxTraceRecords {
		intended := c.intended
		if c.slot < 0 {
			intended = c.sent
		}
		var rx int64
		if c.rxTS != 0 {
			rx = c.rxTS - l.wallOff + l.lr.monoBase
		}
		mb := l.lr.monoBase
		l.traces = append(l.traces, traceRecord{seq: c.seq, status: c.p.status, t: [4]int64{intended + mb, c.sent + mb, rx, done + mb}})
	}
	o := outcome{status: c.p.status, sent: c.bodySent(), recv: c.p.body}
	if o.status < 200 || o.status > 299 {
		o.reason = c.p.reasonBytes()
	}
	l.finish(c.sc, c.warm, c.slot, c.intended, c.sent, done, &o)
	if closeConn || c.writing {
		l.closeConn(c)
		return
	}
	l.setState(c, csIdle)
	c.idleAt = now
	l.reuse(c)
}

// reuse hands an idle connection to the next request: in the closed loop
// its next request, in the open loop the idle stack.
func (l *evLoop) reuse(c *lconn) {
	if l.lr.sch != nil {
		l.idle = append(l.idle, c.idx)
		return
	}
	if l.take() {
		l.start(c, -1)
		return
	}
	l.closeConn(c)
}

// fail records c's request, if one is in flight, as failed and closes
// the connection.
func (l *evLoop) fail(c *lconn, class errClass, err error) {
	if c.state == csBusy {
		o := outcome{err: err, class: class, sent: c.bodySent()}
		l.finish(c.sc, c.warm, c.slot, c.intended, c.sent, l.clock(), &o)
	}
	l.closeConn(c)
}

// finish tallies one request: slot is the open loop's (-1 in the closed
// loop), sent is -1 for a request that never got a connection.
func (l *evLoop) finish(sc int, warm bool, slot, intended, sent, done int64, o *outcome) {
	l.live.done.Add(1)
	if obs := l.lr.r.observe; obs != nil && slot >= 0 {
		obs(slot, l.instant(intended), l.instant(done))
	}
	if o.err != nil || o.status < 200 || o.status > 299 {
		l.live.errs.Add(1)
	}
	if warm {
		return
	}
	if l.lr.sch == nil {
		l.st.record(sc, time.Duration(done-max(sent, 0)), o, l.instant(done))
		return
	}
	if sent >= 0 {
		l.st.recordLag(time.Duration(sent - intended))
		if o.err == nil {
			l.st.recordService(time.Duration(done - sent))
		}
	}
	l.st.record(sc, time.Duration(done-intended), o, l.instant(done))
}

// ---- connections ----

// dial starts connecting a free connection.
func (l *evLoop) dial() error {
	if l.lr.dialErr != nil {
		return l.lr.dialErr
	}
	c := &l.conns[l.free[len(l.free)-1]]
	fd, err := unix.Socket(l.lr.family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1) != nil {
		l.kernelTS = tsNo
	}
	if err := unix.Connect(fd, l.sa); err != nil && err != unix.EINPROGRESS {
		unix.Close(fd)
		return err
	}
	// Connected or not, EPOLLOUT reports the outcome.
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT, Fd: c.idx, Pad: c.gen}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		unix.Close(fd)
		return err
	}
	if c.rbuf == nil {
		c.rbuf = make([]byte, maxResponseHead)
		c.wbuf = make([]byte, 0, 1024)
	}
	l.free = l.free[:len(l.free)-1]
	c.fd, c.rlen, c.writing = fd, 0, false
	c.deadline = l.now + int64(l.cfg.Timeout)
	l.setState(c, csConnecting)
	return nil
}

// connected completes c's connect.
func (l *evLoop) connected(c *lconn) {
	errno, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && errno != 0 {
		err = syscall.Errno(errno)
	}
	if err != nil {
		l.closeConn(c)
		l.dialFailed(err)
		return
	}
	l.ctl(c, unix.EPOLLIN)
	l.setState(c, csIdle)
	c.idleAt = l.now
	l.reuse(c)
}

// dialFailed counts a failed connect as a failed request: the open loop's
// oldest waiting slot, or one closed-loop request.
func (l *evLoop) dialFailed(err error) {
	if l.lr.sch == nil {
		l.failRequest(err)
	} else if l.backlog() > 0 {
		l.failSlot(err)
	}
}

// ctl sets the events c's socket is watched for.
func (l *evLoop) ctl(c *lconn, events uint32) {
	ev := unix.EpollEvent{Events: events, Fd: c.idx, Pad: c.gen}
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, c.fd, &ev)
}

// closeConn closes c's socket and frees it.
func (l *evLoop) closeConn(c *lconn) {
	if c.state == csFree {
		return
	}
	if c.state == csIdle {
		for i, x := range l.idle {
			if x == c.idx {
				l.idle = append(l.idle[:i], l.idle[i+1:]...)
				break
			}
		}
	}
	unix.Close(c.fd)
	c.fd, c.writing = -1, false
	c.gen++
	l.setState(c, csFree)
	l.free = append(l.free, c.idx)
}

// closeConnecting abandons every connect in progress.
func (l *evLoop) closeConnecting() {
	for i := range l.conns {
		if c := &l.conns[i]; c.state == csConnecting {
			l.closeConn(c)
		}
	}
}

// ---- the loop's rhythm ----

// halt stops a cancelled run: no new request; requests in flight finish
// (bounded by Timeout).
func (l *evLoop) halt() {
	if l.lr.sch != nil {
		l.abandon()
	}
	l.stopping = true
	l.closeConnecting()
}

// housekeep fires timeouts, closes connections idle too long, flushes the
// series and ends the open loop's drain.
func (l *evLoop) housekeep() {
	l.nextHK = l.now + int64(housekeepEvery)
	for i := range l.conns {
		c := &l.conns[i]
		switch {
		case c.state == csBusy && l.now >= c.deadline:
			l.fail(c, classTimeout, errRequestTimeout)
		case c.state == csConnecting && l.now >= c.deadline:
			l.closeConn(c)
			l.dialFailed(errConnectTimeout)
		}
	}
	for len(l.idle) > 0 {
		c := &l.conns[l.idle[0]] // the bottom of the stack: idle the longest
		if l.now-c.idleAt < int64(l.cfg.IdleConnTimeout) {
			break
		}
		l.closeConn(c)
	}
	l.st.iv.flushBefore(l.instant(l.now))
	if sch := l.lr.sch; sch != nil && !l.stopping && l.nextRel >= sch.total && l.backlog() > 0 &&
		l.now >= int64(sch.end+l.cfg.DrainTimeout) {
		l.abandon()
	}
}

// finished reports whether the loop is done: nothing left to send, nothing
// in flight.
func (l *evLoop) finished() bool {
	if l.nbusy > 0 {
		return false
	}
	if sch := l.lr.sch; sch != nil {
		return (l.stopping || l.nextRel >= sch.total) && l.backlog() == 0 && l.ndial == 0
	}
	if l.closedStopping() {
		l.closeConnecting()
		return true
	}
	return false
}

// wakeAt returns when the loop must wake up at the latest (ns from base),
// -1 for no timer.
func (l *evLoop) wakeAt() int64 {
	t := int64(-1)
	at := func(x int64) {
		if t < 0 || x < t {
			t = x
		}
	}
	if sch := l.lr.sch; sch != nil {
		if !l.stopping && l.nextRel < sch.total {
			at(int64(sch.offset(l.nextRel) + l.cfg.Coalesce))
		}
		if !l.stopping && l.nextRel >= sch.total && l.backlog() > 0 {
			at(int64(sch.end + l.cfg.DrainTimeout))
		}
	} else if !l.stopping {
		if l.lr.sendEnd >= 0 {
			at(l.lr.sendEnd)
		}
		if len(l.free) > 0 && l.mayTake() {
			at(l.now) // connections to replace (a failing target: retry at once)
		}
	}
	if l.nopen > 0 || l.st.iv.count > 0 {
		at(l.nextHK)
	}
	return t
}

// wait blocks until until (ns from base; -1: no timer) or until a socket or
// the stopper needs the loop, then handles what is ready.
//
// With the next slot at most maxDefer away, the open loop sleeps on the
// timer alone and collects ready sockets when it wakes: one wake-up per
// slot instead of two (the slot's, and the response's). Completion times
// come from the kernel's receive timestamps, so reading late does not make
// a response look slow; only the connection stays busy a little longer.
// A response larger than the socket buffer would wait for the loop, so
// the loop stops deferring once a read fills its buffer (and never does
// for download and upload scenarios).
func (l *evLoop) wait(until int64) {
	var timeout int64 = -1
	if until >= 0 {
		timeout = max(0, until-l.clock())
	}
	var n int
	switch {
	case timeout == 0:
		n = epollWait(l.epfd, l.events[:], 0, true)
	case timeout > 0 && timeout <= int64(max(maxDefer, l.cfg.Coalesce)) && l.lr.deferReads && l.kernelTS == tsYes && !l.bulk:
		sleepUntil(l.lr.monoBase + until)
		n = epollWait(l.epfd, l.events[:], 0, true)
	default:
		n = epollWait(l.epfd, l.events[:], timeout, false)
	}
	l.tick()
	for i := range n {
		l.event(&l.events[i])
	}
}

// event handles one epoll event.
func (l *evLoop) event(ev *unix.EpollEvent) {
	if ev.Fd == wakeIndex {
		var b [8]byte
		_, _ = unix.Read(l.evfd, b[:])
		return
	}
	c := &l.conns[ev.Fd]
	if c.gen != ev.Pad || c.state == csFree {
		return // the connection closed since the event was queued
	}
	switch c.state {
	case csConnecting:
		l.connected(c)
	case csIdle:
		// The target closed an idle connection (or sent what was not asked).
		l.closeConn(c)
	case csBusy:
		if ev.Events&unix.EPOLLOUT != 0 && c.writing {
			l.write(c)
			if c.state != csBusy {
				return
			}
		}
		if ev.Events&(unix.EPOLLIN|unix.EPOLLERR|unix.EPOLLHUP) != 0 {
			l.read(c)
		}
	}
}

// shutdown closes every connection and the loop's descriptors.
func (l *evLoop) shutdown() {
	for i := range l.conns {
		l.closeConn(&l.conns[i])
	}
	l.st.iv.flush()
	l.closeFds()
}

// ---- system calls ----

// rawWrite writes to a non-blocking socket. It never blocks, so it skips
// the runtime's system-call bookkeeping.
func rawWrite(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// recvmsg reads from a non-blocking socket into p and returns the kernel's
// receive timestamp of the data (SO_TIMESTAMPNS, wall ns), 0 if none came.
func recvmsg(fd int, p, oob []byte) (n int, ts int64, err error) {
	iov := unix.Iovec{Base: unsafe.SliceData(p)}
	iov.SetLen(len(p))
	msg := unix.Msghdr{Iov: &iov, Iovlen: 1, Control: unsafe.SliceData(oob)}
	msg.SetControllen(len(oob))
	r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), 0)
	if e != 0 {
		return 0, 0, e
	}
	ctl := oob[:msg.Controllen]
	for len(ctl) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(ctl) {
			break
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SO_TIMESTAMPNS && l >= unix.SizeofCmsghdr+16 {
			t := (*unix.Timespec)(unsafe.Pointer(&ctl[unix.SizeofCmsghdr]))
			ts = t.Nano()
		}
		adv := (l + 7) &^ 7
		if adv > len(ctl) {
			break
		}
		ctl = ctl[adv:]
	}
	return int(r), ts, nil
}

// epollWait waits up to timeout ns (-1: forever) for events. A wait that
// may block goes through the runtime's system-call path, so that the
// loop's P serves other goroutines meanwhile; a poll does not.
func epollWait(epfd int, events []unix.EpollEvent, timeout int64, poll bool) int {
	var ts unix.Timespec
	var tsp unsafe.Pointer
	if timeout >= 0 {
		ts = unix.NsecToTimespec(timeout)
		tsp = unsafe.Pointer(&ts)
	}
	var r uintptr
	var e syscall.Errno
	if poll {
		r, _, e = unix.RawSyscall6(unix.SYS_EPOLL_PWAIT2, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(tsp), 0, 0)
	} else {
		r, _, e = unix.Syscall6(unix.SYS_EPOLL_PWAIT2, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(tsp), 0, 0)
	}
	if e != 0 {
		return 0 // EINTR: the caller's round comes again
	}
	return int(r)
}

// sleepUntil sleeps until the absolute CLOCK_MONOTONIC time abs (ns).
func sleepUntil(abs int64) {
	ts := unix.NsecToTimespec(abs)
	for {
		_, _, e := unix.Syscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if e != unix.EINTR {
			return
		}
	}
}
