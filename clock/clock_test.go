package clock

import (
	"testing"
	"time"
)

func TestInstantSubCountsSuspend(t *testing.T) {
	f := NewFake(time.Unix(1000, 0))
	a := f.Now()
	f.Advance(2 * time.Second)
	if got := f.Now().Sub(a); got != 2*time.Second {
		t.Fatalf("after Advance(2s): Sub = %v; want 2s", got)
	}
	f.Suspend(20 * time.Second)
	if got := f.Now().Sub(a); got != 22*time.Second {
		t.Fatalf("after Suspend(20s): Sub = %v; want 22s (wall counts a suspend)", got)
	}
	b := f.Now()
	f.StepWall(-30 * time.Second)
	f.Advance(time.Second)
	if got := f.Now().Sub(b); got != time.Second {
		t.Fatalf("after a backward wall step: Sub = %v; want 1s (monotonic wins)", got)
	}
	if !f.Now().Elapsed(b, time.Second) || f.Now().Elapsed(b, time.Second+1) {
		t.Fatalf("Elapsed is inconsistent with Sub")
	}
}

func TestFakeTimersFireInOrderAtTheirInstant(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	start := f.Now()
	t1 := f.NewTimer(3 * time.Second)
	t2 := f.NewTimer(1 * time.Second)
	t3 := f.NewTimer(10 * time.Second)
	f.Advance(5 * time.Second)
	for i, tm := range []Timer{t2, t1} {
		select {
		case <-tm.C():
		default:
			t.Fatalf("timer %d did not fire", i)
		}
	}
	select {
	case <-t3.C():
		t.Fatal("t3 fired early")
	default:
	}
	if !t3.Stop() {
		t.Fatal("Stop on an armed timer = false")
	}
	if t3.Stop() {
		t.Fatal("second Stop = true")
	}
	if got := f.Now().Sub(start); got != 5*time.Second {
		t.Fatalf("elapsed = %v; want 5s", got)
	}
	f.Suspend(time.Hour)
	t1.Reset(time.Second)
	f.Suspend(time.Hour)
	select {
	case <-t1.C():
		t.Fatal("a suspend fired a timer")
	default:
	}
}

func TestBlockUntil(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	done := make(chan struct{})
	go func() {
		tm := f.NewTimer(time.Second)
		<-tm.C()
		close(done)
	}()
	if !f.BlockUntil(1, nil) {
		t.Fatal("BlockUntil returned false")
	}
	f.Advance(time.Second)
	<-done
}

func TestRealClockMoves(t *testing.T) {
	var c Real
	a := c.Now()
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	if d := c.Now().Sub(a); d < time.Millisecond {
		t.Fatalf("elapsed %v after a 1ms timer", d)
	}
	if n := testing.AllocsPerRun(100, func() { _ = c.Now() }); n != 0 {
		t.Fatalf("Real.Now allocates %v", n)
	}
}

// Sleep returns when its timer fires or it is woken (false), and when stop
// is closed (true); untimed, only wake and stop end it; it leaves no timer
// armed.
func TestSleep(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	wake, stop := make(chan struct{}, 1), make(chan struct{})
	closed := make(chan struct{})
	close(closed)
	res := make(chan bool)
	noTimer := func(what string) {
		t.Helper()
		if f.BlockUntil(1, closed) {
			t.Fatalf("%s: a timer is still armed", what)
		}
	}

	go func() { res <- Sleep(f, time.Second, true, wake, stop) }()
	f.BlockUntil(1, nil)
	f.Advance(time.Second - 1)
	select {
	case <-res:
		t.Fatal("returned before its deadline")
	default:
	}
	f.Advance(1)
	if <-res {
		t.Fatal("at its deadline: reported stopped")
	}
	noTimer("after firing")

	go func() { res <- Sleep(f, time.Hour, true, wake, stop) }()
	f.BlockUntil(1, nil)
	wake <- struct{}{}
	if <-res {
		t.Fatal("woken: reported stopped")
	}
	noTimer("after a wake")

	go func() { res <- Sleep(f, time.Nanosecond, false, wake, stop) }()
	f.Advance(time.Hour)
	select {
	case <-res:
		t.Fatal("untimed: returned without a wake")
	default:
	}
	wake <- struct{}{}
	if <-res {
		t.Fatal("untimed, woken: reported stopped")
	}

	go func() { res <- Sleep(f, time.Hour, true, wake, stop) }()
	f.BlockUntil(1, nil)
	close(stop)
	if !<-res {
		t.Fatal("stopped: reported not stopped")
	}
	noTimer("after stop")
}

// Split and Join are inverses, on both scales, whichever way the wall
// clock moved.
func TestSplitJoin(t *testing.T) {
	f := NewFake(time.Unix(1000, 0))
	base := f.Now()
	f.Advance(3 * time.Second)
	f.StepWall(-time.Hour)
	i := f.Now()
	mono, wall := i.Split(base)
	if mono != 3*time.Second || wall != 3*time.Second-time.Hour {
		t.Fatalf("Split = %v, %v; want 3s, 3s-1h", mono, wall)
	}
	if got := base.Join(mono, wall); got != i {
		t.Fatalf("Join(Split) = %+v; want %+v", got, i)
	}
}
