package netloop

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Options()...) }

// run starts l on a goroutine and stops it (and waits) at cleanup.
func run(t *testing.T, l *Loop) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- l.Run() }()
	t.Cleanup(func() {
		l.Stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func newLoop(t *testing.T, cfg Config) *Loop {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type taskFunc func()

func (f taskFunc) RunTask() { f() }

// onLoop runs f on the loop and waits for it.
func onLoop(l *Loop, f func()) {
	done := make(chan struct{})
	l.Post(taskFunc(func() { f(); close(done) }))
	<-done
}

func TestPostRunsOnTheLoopInOrder(t *testing.T) {
	l := newLoop(t, Config{})
	run(t, l)
	var got []int
	var wg sync.WaitGroup
	wg.Add(100)
	for i := range 100 {
		l.Post(taskFunc(func() { got = append(got, i); wg.Done() })) // loop goroutine only: no lock
	}
	wg.Wait()
	onLoop(l, func() {
		for i, v := range got {
			if v != i {
				t.Fatalf("task %d ran as %d: posts from one goroutine must run in order", i, v)
			}
		}
	})
}

func TestPostWakesASleepingLoop(t *testing.T) {
	l := newLoop(t, Config{})
	run(t, l)
	// No timer is armed, so the loop sleeps without a deadline: only the
	// eventfd can wake it.
	for range 50 {
		done := make(chan struct{})
		time.Sleep(time.Millisecond) // let the loop reach its wait; correctness does not depend on it
		l.Post(taskFunc(func() { close(done) }))
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("a posted task did not run within 5 s: Post did not wake the loop")
		}
	}
}

type recorder struct {
	events chan uint32
}

func (r *recorder) OnEvent(ev uint32) { r.events <- ev }

func socketPair(t *testing.T) (a, b int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fds[0]); _ = unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func TestEdgeTriggeredReadEvents(t *testing.T) {
	l := newLoop(t, Config{})
	a, b := socketPair(t)
	r := &recorder{events: make(chan uint32, 16)}
	var tok Token
	onRun := make(chan struct{})
	run(t, l)
	l.Post(taskFunc(func() {
		var err error
		if tok, err = l.Add(a, r); err != nil {
			t.Error(err)
		}
		close(onRun)
	}))
	<-onRun
	// The first edge: writable.
	if ev := <-r.events; ev&EventWrite == 0 {
		t.Fatalf("first event %#x, want writable", ev)
	}
	if _, err := unix.Write(b, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-r.events:
		if ev&EventRead == 0 {
			t.Fatalf("event %#x after a write from the peer, want readable", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no readable event")
	}
	buf := make([]byte, 64)
	n, err := Read(a, buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("Read = %q, %v", buf[:n], err)
	}
	if _, err := Read(a, buf); err != unix.EAGAIN {
		t.Fatalf("Read on a drained socket = %v, want EAGAIN", err)
	}
	// Deleted: the peer's next write reaches nobody.
	onLoop(l, func() { l.Del(tok) })
	_, _ = unix.Write(b, []byte("x"))
	select {
	case ev := <-r.events:
		t.Fatalf("event %#x after Del", ev)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestStaleTokenDoesNothing(t *testing.T) {
	l := newLoop(t, Config{})
	a, _ := socketPair(t)
	c, _ := socketPair(t)
	r1 := &recorder{events: make(chan uint32, 16)}
	r2 := &recorder{events: make(chan uint32, 16)}
	tok1, err := l.Add(a, r1)
	if err != nil {
		t.Fatal(err)
	}
	l.Del(tok1)
	tok2, err := l.Add(c, r2)
	if err != nil {
		t.Fatal(err)
	}
	if uint32(tok1) != uint32(tok2) {
		t.Fatalf("slot not reused: %d, %d", uint32(tok1), uint32(tok2))
	}
	l.Del(tok1) // stale: must not remove c's registration
	if l.slots[uint32(tok2)].h != r2 {
		t.Fatal("a stale token deleted the slot's new owner")
	}
	_ = l.Run // not run: close its descriptors
	l.Close()
}

type fire struct {
	at  *int64
	now func() int64
	ch  chan struct{}
}

func (f *fire) OnTimer() { *f.at = f.now(); close(f.ch) }

func TestTimersFireAtOrAfterTheirDeadline(t *testing.T) {
	l := newLoop(t, Config{Tick: time.Millisecond})
	run(t, l)
	for _, d := range []time.Duration{0, 3 * time.Millisecond, 20 * time.Millisecond, 150 * time.Millisecond} {
		var firedAt, armedAt int64
		f := &fire{at: &firedAt, now: Nanotime, ch: make(chan struct{})}
		tm := &Timer{H: f}
		l.Post(taskFunc(func() { armedAt = Nanotime(); l.Arm(tm, armedAt+int64(d)) }))
		select {
		case <-f.ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("timer of %v did not fire", d)
		}
		got := time.Duration(firedAt - armedAt)
		if got < d {
			t.Fatalf("timer of %v fired after %v: early", d, got)
		}
		// A wheel that left a timer behind in the tick it had just
		// processed slept a whole round (4 s here) before firing it.
		if got > d+time.Second {
			t.Fatalf("timer of %v fired after %v: a round of the wheel late", d, got)
		}
	}
}

type counterTimer struct{ n *atomic.Int32 }

func (c counterTimer) OnTimer() { c.n.Add(1) }

func TestDisarmedTimerNeverFires(t *testing.T) {
	l := newLoop(t, Config{Tick: time.Millisecond})
	run(t, l)
	var n atomic.Int32
	timers := make([]Timer, 100)
	onLoop(l, func() {
		for i := range timers {
			timers[i].H = counterTimer{&n}
			l.ArmAfter(&timers[i], time.Duration(i%7)*time.Millisecond)
		}
		for i := range timers {
			if i%2 == 0 {
				l.Disarm(&timers[i])
			}
		}
	})
	// One more timer beyond the others tells when they all had their chance.
	done := make(chan struct{})
	var last int64
	onLoop(l, func() { l.ArmAfter(&Timer{H: &fire{at: &last, now: Nanotime, ch: done}}, 30*time.Millisecond) })
	<-done
	if got := n.Load(); got != 50 {
		t.Fatalf("%d timers fired, want the 50 left armed", got)
	}
}

// TestTimerDisarmedByAnotherInTheSameTick: two timers due in the same
// advance; the first disarms the second, which must then not fire.
func TestTimerDisarmedByAnotherInTheSameTick(t *testing.T) {
	l := newLoop(t, Config{Tick: time.Millisecond})
	run(t, l)
	var second Timer
	var fired atomic.Bool
	second.H = timerFunc(func() { fired.Store(true) })
	first := Timer{H: timerFunc(func() { l.Disarm(&second) })}
	done := make(chan struct{})
	onLoop(l, func() {
		at := l.Now() + int64(2*time.Millisecond)
		l.Arm(&first, at)
		l.Arm(&second, at)
		l.Arm(&Timer{H: timerFunc(func() { close(done) })}, at+int64(5*time.Millisecond))
	})
	<-done
	if fired.Load() {
		t.Fatal("a timer disarmed by another timer of the same tick fired")
	}
}

type timerFunc func()

func (f timerFunc) OnTimer() { f() }

func TestWheelWrapsForFarDeadlines(t *testing.T) {
	// 64 slots of 1 ms: a 150 ms deadline goes round the wheel twice.
	l := newLoop(t, Config{Tick: time.Millisecond, WheelSlots: 64})
	run(t, l)
	var firedAt, armedAt int64
	f := &fire{at: &firedAt, now: Nanotime, ch: make(chan struct{})}
	onLoop(l, func() { armedAt = Nanotime(); l.ArmAfter(&Timer{H: f}, 150*time.Millisecond) })
	<-f.ch
	if got := time.Duration(firedAt - armedAt); got < 150*time.Millisecond {
		t.Fatalf("fired after %v, want ≥ 150ms", got)
	}
}

func TestAcceptReportsThePeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fd, err := DupListener(ln)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(fd)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		nfd, peer, err := Accept(fd)
		if err == unix.EAGAIN && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		defer Close(nfd)
		if want := c.LocalAddr().String(); peer.String() != want {
			t.Fatalf("peer %s, want %s", peer, want)
		}
		return
	}
}

func TestPostAfterStopDoesNotWriteToAClosedDescriptor(t *testing.T) {
	l := newLoop(t, Config{})
	done := make(chan error, 1)
	go func() { done <- l.Run() }()
	l.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The eventfd's number may belong to someone else now.
	a, b := socketPair(t)
	_ = b
	l.Post(taskFunc(func() {}))
	l.Wake()
	buf := make([]byte, 16)
	if n, err := Read(a, buf); err != unix.EAGAIN {
		t.Fatalf("read %d bytes, %v from an unrelated socket after Wake on a stopped loop", n, err)
	}
}
