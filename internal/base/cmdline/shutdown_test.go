package cmdline

import (
	"context"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/logtest"
)

// The progress lines name only what is still waited for, none is written
// while nothing is, and Done reports how long the shutdown took.
func TestShutdownLog(t *testing.T) {
	var rec logtest.Recorder
	script := [][]Waiting{
		{{"connections", 2}, {"instances", 0}},
		{{"connections", 0}, {"instances", 0}},
		{{"connections", 1}, {"instances", 3}},
	}
	calls := make(chan int, len(script))
	n := 0
	l := StartShutdownLog(rec.Logger(slog.LevelInfo), time.Now().Add(time.Hour), time.Millisecond, func() []Waiting {
		if n >= len(script) {
			return nil
		}
		w := script[n]
		n++
		calls <- n
		return w
	})
	for range script {
		<-calls // the goroutine asked; Done waits for its line
	}
	l.Done("test stopped", "extra", 1)
	lines := rec.Find("shutting down: waiting", nil)
	if len(lines) != 2 {
		t.Fatalf("%d progress lines; want 2 (none while nothing is waited for):\n%s", len(lines), rec.Dump())
	}
	if a := lines[0].Attrs; a["connections"] != "2" || a["instances"] != "" || a["elapsed"] == "" || a["left"] == "" {
		t.Errorf("first line %v; want connections=2, no instances, elapsed and left", lines[0])
	}
	if a := lines[1].Attrs; a["connections"] != "1" || a["instances"] != "3" {
		t.Errorf("second line %v; want connections=1 instances=3", lines[1])
	}
	done := rec.Find("test stopped", map[string]string{"extra": "1"})
	if len(done) != 1 || done[0].Attrs["took"] == "" {
		t.Fatalf("no final line with took:\n%s", rec.Dump())
	}
	if got := rec.Records(); got[len(got)-1].Msg != "test stopped" {
		t.Errorf("a line after Done:\n%s", rec.Dump())
	}
}

// The first SIGTERM cancels Context and is logged; a second signal makes
// Run return ExitForced for it at once, without waiting for the body.
func TestSignalsSecondSignalForcesTheExit(t *testing.T) {
	var rec logtest.Recorder
	log := rec.Logger(slog.LevelInfo)
	s := NotifySignals(log)
	defer s.Stop()
	release := make(chan struct{})
	defer close(release) // the body ends with the test
	code := s.Run(log, func(ctx context.Context) int {
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			t.Error(err)
			return 0
		}
		<-ctx.Done() // the first signal began the shutdown
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			t.Error(err)
			return 0
		}
		<-release // a shutdown that would never end
		return 0
	})
	if code != 130 {
		t.Errorf("Run = %d after SIGTERM then SIGINT; want 130 (128 + SIGINT)", code)
	}
	if len(rec.Find("signal received: shutting down gracefully; send it again to exit at once", map[string]string{"signal": "terminated"})) != 1 {
		t.Errorf("the first signal was not logged:\n%s", rec.Dump())
	}
	if len(rec.Find("second signal: exiting at once, the shutdown cut short", map[string]string{"signal": "interrupt", "status": "130"})) != 1 {
		t.Errorf("the second signal was not logged:\n%s", rec.Dump())
	}
}

func TestExitForced(t *testing.T) {
	if got := ExitForced(syscall.SIGTERM); got != 143 {
		t.Errorf("ExitForced(SIGTERM) = %d; want 143", got)
	}
	if got := ExitForced(os.Interrupt); got != 130 {
		t.Errorf("ExitForced(os.Interrupt) = %d; want 130", got)
	}
}
