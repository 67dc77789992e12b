package netloop

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Event bits a Handler receives (epoll's).
const (
	EventRead   = unix.EPOLLIN
	EventWrite  = unix.EPOLLOUT
	EventHangup = unix.EPOLLHUP | unix.EPOLLRDHUP
	EventError  = unix.EPOLLERR
)

// Handler receives the events of one registered descriptor, on the loop
// goroutine.
type Handler interface {
	OnEvent(events uint32)
}

// Task is work posted to a loop from another goroutine (Post).
type Task interface {
	RunTask()
}

// Token names one registration on a loop (Add); zero is none.
type Token uint64

// Defaults for Config.
const (
	// DefaultTick is the timer wheel's slot width: timers fire within a tick
	// of their deadline.
	DefaultTick = 10 * time.Millisecond
	// DefaultWheelSlots is the number of slots; deadlines further than
	// slots × tick ahead go round the wheel more than once.
	DefaultWheelSlots = 4096
	// DefaultMaxEvents is how many events one wait returns at most.
	DefaultMaxEvents = 256
	// DefaultYieldEvery is how often a busy loop passes through the Go
	// scheduler (runtime.Gosched), and the longest a wait lasts.
	DefaultYieldEvery = 8 * time.Millisecond
)

// Config configures a Loop. A zero field means its default.
type Config struct {
	// Tick: DefaultTick.
	Tick time.Duration
	// WheelSlots: DefaultWheelSlots, rounded up to a multiple of 64.
	WheelSlots int
	// MaxEvents: DefaultMaxEvents.
	MaxEvents int
	// YieldEvery: DefaultYieldEvery. The runtime's monitor takes a
	// goroutine that has not been rescheduled for 10 ms for a runaway:
	// it preempts it and, when it sits in a system call (epoll_wait),
	// hands its P to another thread and goes back to polling every 20 µs
	// (each poll a nanosleep). A loop that yields this often is never
	// such a runaway, and an idle one wakes this often to do so.
	YieldEvery time.Duration
}

// ErrStopped is returned by Run when it is called on a stopped loop.
var ErrStopped = errors.New("netloop: loop stopped")

// Loop is one event loop. Make it with New, run it with Run on a goroutine of
// its own, stop it with Stop. The zero value is not usable.
type Loop struct {
	epfd   int
	evfd   int
	events []unix.EpollEvent

	slots []slot
	free  []uint32

	wheel wheel
	now   int64 // monotonic ns, read after every wait and before every batch

	yieldEvery int64 // ns
	yielded    int64 // when the loop last passed through the scheduler

	mu       sync.Mutex
	posted   []Task
	spare    []Task
	sleeping atomic.Bool // the loop is (about to be) in epoll_wait: Post must wake it
	stopped  atomic.Bool
	running  atomic.Bool
	wakeBuf  [8]byte
	// wakeMu keeps Wake from writing to the eventfd's number after Run
	// closed it (and the number was reused): Wake holds it shared.
	wakeMu    sync.RWMutex
	closed    bool // guarded by wakeMu
	closeOnce sync.Once
}

type slot struct {
	h   Handler
	fd  int32
	gen uint32
}

// New makes a loop: an epoll instance and an eventfd for Post. It starts no
// goroutine.
func New(cfg Config) (*Loop, error) {
	if cfg.Tick <= 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.WheelSlots <= 0 {
		cfg.WheelSlots = DefaultWheelSlots
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	if cfg.YieldEvery <= 0 {
		cfg.YieldEvery = DefaultYieldEvery
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("netloop: epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("netloop: eventfd: %w", err)
	}
	l := &Loop{
		epfd:       epfd,
		evfd:       evfd,
		events:     make([]unix.EpollEvent, cfg.MaxEvents),
		slots:      make([]slot, 1, 64), // slot 0 is the eventfd's
		yieldEvery: int64(cfg.YieldEvery),
	}
	l.wheel.init(cfg.Tick, cfg.WheelSlots)
	l.now = nanotime()
	l.wheel.last = l.wheel.tickOf(l.now) - 1
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET}
	if err := epollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &ev); err != nil {
		_ = unix.Close(evfd)
		_ = unix.Close(epfd)
		return nil, fmt.Errorf("netloop: epoll_ctl eventfd: %w", err)
	}
	return l, nil
}

// Now returns the loop's notion of the current time in monotonic nanoseconds
// (see Nanotime), refreshed after every wait. Loop goroutine only.
func (l *Loop) Now() int64 { return l.now }

// Add registers fd for edge-triggered read and write events (plus hang-ups
// and errors, which are always reported), delivered to h. Loop goroutine only
// (or before Run).
func (l *Loop) Add(fd int, h Handler) (Token, error) {
	var idx uint32
	if n := len(l.free); n > 0 {
		idx = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		l.slots = append(l.slots, slot{})
		idx = uint32(len(l.slots) - 1)
	}
	s := &l.slots[idx]
	s.gen++
	s.h, s.fd = h, int32(fd)
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET,
		Fd:     int32(idx),
		Pad:    int32(s.gen),
	}
	if err := epollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		s.h = nil
		l.free = append(l.free, idx)
		return 0, err
	}
	return Token(uint64(s.gen)<<32 | uint64(idx)), nil
}

// AddListener registers a listening socket for read events, level-triggered
// (so that a backlog left by one accept batch is reported again).
func (l *Loop) AddListener(fd int, h Handler) (Token, error) {
	tok, err := l.Add(fd, h)
	if err != nil {
		return 0, err
	}
	idx := uint32(tok)
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(idx), Pad: int32(l.slots[idx].gen)}
	if err := epollCtl(l.epfd, unix.EPOLL_CTL_MOD, fd, &ev); err != nil {
		l.Del(tok)
		return 0, err
	}
	return tok, nil
}

// Del unregisters the descriptor of tok (it does not close it). Events
// already collected for it in the current batch are dropped. Deleting a stale
// or zero token does nothing.
func (l *Loop) Del(tok Token) {
	idx, gen := uint32(tok), uint32(tok>>32)
	if idx == 0 || int(idx) >= len(l.slots) {
		return
	}
	s := &l.slots[idx]
	if s.gen != gen || s.h == nil {
		return
	}
	_ = epollCtl(l.epfd, unix.EPOLL_CTL_DEL, int(s.fd), nil)
	s.h, s.fd = nil, -1
	l.free = append(l.free, idx)
}

// Post runs t on the loop goroutine soon. Any goroutine may call it. Tasks
// posted after Stop never run.
func (l *Loop) Post(t Task) {
	l.mu.Lock()
	l.posted = append(l.posted, t)
	l.mu.Unlock()
	if l.sleeping.Load() {
		l.Wake()
	}
}

// Wake interrupts the loop's wait. Any goroutine may call it.
func (l *Loop) Wake() {
	l.wakeMu.RLock()
	if !l.closed {
		one := [8]byte{1}
		_, _ = Write(l.evfd, one[:])
	}
	l.wakeMu.RUnlock()
}

// Stop makes Run return after the callbacks in progress. Any goroutine may
// call it; it does not wait.
func (l *Loop) Stop() {
	l.stopped.Store(true)
	l.Wake()
}

// Run runs the loop on the calling goroutine until Stop, then closes the
// epoll instance and the eventfd (registered descriptors are the owners' to
// close; their handlers are not called again). Call it once.
func (l *Loop) Run() error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("netloop: Run called twice")
	}
	defer l.Close()
	for !l.stopped.Load() {
		l.runPosted()
		l.now = nanotime()
		if l.now-l.yielded >= l.yieldEvery {
			runtime.Gosched()
			l.yielded = l.now
		}
		l.wheel.advance(l.now)
		timeout := l.wheel.timeout(l.now)
		if maxMs := int(l.yieldEvery / int64(time.Millisecond)); timeout < 0 || timeout > maxMs {
			timeout = max(maxMs, 1)
		}
		if timeout != 0 {
			l.sleeping.Store(true)
			// A Post that came in before the flag was set did not wake
			// us: look once more before sleeping.
			l.mu.Lock()
			pending := len(l.posted) > 0
			l.mu.Unlock()
			if pending || l.stopped.Load() {
				timeout = 0
			}
		}
		n, err := epollWait(l.epfd, l.events, timeout)
		l.sleeping.Store(false)
		if err != nil {
			return fmt.Errorf("netloop: epoll_wait: %w", err)
		}
		l.now = nanotime()
		for i := 0; i < n; i++ {
			ev := &l.events[i]
			idx, gen := uint32(ev.Fd), uint32(ev.Pad)
			if idx == 0 {
				_, _ = Read(l.evfd, l.wakeBuf[:])
				continue
			}
			if int(idx) >= len(l.slots) {
				continue
			}
			s := &l.slots[idx]
			if s.gen != gen || s.h == nil {
				continue // deleted earlier in this batch
			}
			s.h.OnEvent(ev.Events)
		}
	}
	return nil
}

// Close releases the loop's epoll instance and eventfd. Run calls it when it
// returns; call it yourself only for a loop that never ran. Idempotent.
func (l *Loop) Close() {
	l.closeOnce.Do(func() {
		l.stopped.Store(true)
		l.wakeMu.Lock()
		l.closed = true
		_ = unix.Close(l.evfd)
		l.wakeMu.Unlock()
		_ = unix.Close(l.epfd)
	})
}

func (l *Loop) runPosted() {
	l.mu.Lock()
	if len(l.posted) == 0 {
		l.mu.Unlock()
		return
	}
	batch := l.posted
	l.posted = l.spare[:0]
	l.mu.Unlock()
	for i, t := range batch {
		t.RunTask()
		batch[i] = nil
	}
	l.mu.Lock()
	l.spare = batch[:0]
	l.mu.Unlock()
}

// nanotime returns monotonic nanoseconds since an arbitrary origin.
func nanotime() int64 { return int64(time.Since(origin)) }

var origin = time.Now()

// Nanotime returns the monotonic clock on the scale of Loop.Now.
func Nanotime() int64 { return nanotime() }

// Time converts a reading on the scale of Loop.Now to a time.Time (with its
// monotonic reading), without reading the clock.
func Time(ns int64) time.Time { return origin.Add(time.Duration(ns)) }
