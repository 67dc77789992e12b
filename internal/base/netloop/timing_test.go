package netloop

import (
	"testing"
	"time"
)

func TestArmAndDisarmDoNotAllocate(t *testing.T) {
	l := newLoop(t, Config{})
	defer l.Close()
	var tm Timer
	tm.H = timerFunc(func() {})
	allocs := testing.AllocsPerRun(1000, func() {
		l.ArmAfter(&tm, 5*time.Second)
		l.ArmAfter(&tm, 6*time.Second) // move
		l.Disarm(&tm)
	})
	if allocs != 0 {
		t.Fatalf("Arm/Disarm allocate %.1f times per call", allocs)
	}
}

// BenchmarkRearm is what a connection pays per request for its idle timer.
func BenchmarkRearm(b *testing.B) {
	l, err := New(Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	timers := make([]Timer, 1024)
	for i := range timers {
		timers[i].H = timerFunc(func() {})
		l.ArmAfter(&timers[i], time.Duration(i)*time.Millisecond)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.ArmAfter(&timers[i&1023], 60*time.Second)
	}
}
