package cmdline

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// ExitForced returns the exit status of a command that a second SIGINT or
// SIGTERM ended before its graceful shutdown finished: 128 + the signal's
// number (130 for SIGINT, 143 for SIGTERM), as if the signal had killed it.
func ExitForced(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 128 + int(syscall.SIGTERM)
}

// Signals turns SIGINT and SIGTERM into a command's stop: the first one
// cancels Context (the graceful shutdown begins); a second one ends the
// command at once (Run). Its goroutine is stopped by Stop.
type Signals struct {
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	ch     chan os.Signal
	forced chan os.Signal // the second signal
	quit   chan struct{}
	done   chan struct{}
}

// NotifySignals starts relaying SIGINT and SIGTERM. The first one is
// logged on log at INFO, with how to cut the shutdown short.
func NotifySignals(log *slog.Logger) *Signals {
	s := &Signals{log: log, ch: make(chan os.Signal, 2), forced: make(chan os.Signal, 1), quit: make(chan struct{}), done: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	signal.Notify(s.ch, syscall.SIGINT, syscall.SIGTERM)
	go s.relay() // owned by s: Stop ends it
	return s
}

func (s *Signals) relay() {
	defer close(s.done)
	first := true
	for {
		select {
		case sig := <-s.ch:
			if first {
				first = false
				s.log.Info("signal received: shutting down gracefully; send it again to exit at once", "signal", sig.String())
				s.cancel()
				continue
			}
			select {
			case s.forced <- sig:
			default: // a third signal: the second is enough
			}
		case <-s.quit:
			return
		}
	}
}

// Context is cancelled by the first SIGINT or SIGTERM.
func (s *Signals) Context() context.Context { return s.ctx }

// Stop stops relaying signals (their default action applies again) and
// waits for the relay to end. It is idempotent.
func (s *Signals) Stop() {
	signal.Stop(s.ch)
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
	s.cancel()
}

// Run calls run with Context on a goroutine and returns its exit status;
// when a second signal arrives first (the shutdown takes too long for the
// operator), it logs that at ERROR on log and returns ExitForced at once,
// without waiting for run: the caller exits the process with that status.
func (s *Signals) Run(log *slog.Logger, run func(context.Context) int) int {
	code := make(chan int, 1)
	go func() { code <- run(s.ctx) }() // the command's body; the process ends with it or with the second signal
	select {
	case c := <-code:
		return c
	case sig := <-s.forced:
		status := ExitForced(sig)
		log.Error("second signal: exiting at once, the shutdown cut short", "signal", sig.String(), "status", status)
		return status
	}
}

// DefaultProgressEvery is how often a shutdown in progress logs what it
// still waits for (ShutdownLog).
const DefaultProgressEvery = time.Second

// Waiting is one thing a shutdown waits for and how many of it are left.
type Waiting struct {
	What string // plural: "connections", "instances"
	N    int
}

// ShutdownLog logs a command's graceful shutdown: what it still waits for,
// at most once per interval and only while something is left, and at the
// end how long it took. Its goroutine is stopped by Done.
type ShutdownLog struct {
	log   *slog.Logger
	start time.Time
	quit  chan struct{}
	done  chan struct{}
}

// StartShutdownLog begins logging on log a shutdown bounded by deadline:
// every interval (DefaultProgressEvery when zero), "shutting down: waiting"
// with each count of waiting() that is not zero, the time elapsed and the
// time left.
func StartShutdownLog(log *slog.Logger, deadline time.Time, interval time.Duration, waiting func() []Waiting) *ShutdownLog {
	if interval <= 0 {
		interval = DefaultProgressEvery
	}
	l := &ShutdownLog{log: log, start: time.Now(), quit: make(chan struct{}), done: make(chan struct{})}
	go func() { // owned by l: Done ends it
		defer close(l.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				var attrs []any
				for _, w := range waiting() {
					if w.N > 0 {
						attrs = append(attrs, w.What, w.N)
					}
				}
				if attrs == nil {
					continue
				}
				now := time.Now()
				attrs = append(attrs, "elapsed", now.Sub(l.start).Round(time.Millisecond), "left", max(deadline.Sub(now), 0).Round(time.Millisecond))
				log.Info("shutting down: waiting", attrs...)
			case <-l.quit:
				return
			}
		}
	}()
	return l
}

// Done stops the progress lines and logs msg at INFO with how long the
// shutdown took ("took") and attrs.
func (l *ShutdownLog) Done(msg string, attrs ...any) {
	close(l.quit)
	<-l.done
	l.log.Info(msg, append(attrs, "took", time.Since(l.start).Round(time.Millisecond))...)
}
