package pinboard

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/pinned-go/pinned/internal/base/cmdline"
)

// Exit statuses of Main: those of every pinned command (cmdline.Status). A
// second SIGTERM or SIGINT during the shutdown makes Main return
// cmdline.ExitForced instead: 128 + the signal's number (143, 130).
const (
	ExitOK     = cmdline.ExitOK
	ExitFailed = cmdline.ExitFailed // the pinboard ran and failed (a listener died, a port was taken)
	ExitConfig = cmdline.ExitUsage  // the configuration is invalid; the message names what to change
)

// Main is the whole pinboard command: it parses args and the environment
// (environ, as os.Environ), wires a Pinboard (registry and proxy), and runs
// it until SIGTERM or SIGINT; SIGHUP re-reads the token file. The first
// SIGTERM or SIGINT starts the graceful shutdown (Pinboard.Run); a second
// one ends it at once: Main logs so and returns cmdline.ExitForced (128 +
// the signal's number) without waiting. -h prints every setting to stdout,
// -version the version. The dev token, when generated, is printed to
// stdout; logs go to stderr, starting with a warning per unknown PINBOARD_*
// variable. It returns the exit status.
func Main(args, environ []string, stdout, stderr io.Writer) int {
	s, err := ParseSettings(args, environ, stdout)
	if err != nil {
		return cmdline.Exit(stderr, "pinboard", err)
	}
	hopts := &slog.HandlerOptions{Level: s.LogLevel}
	var h slog.Handler = slog.NewTextHandler(stderr, hopts)
	if s.LogJSON {
		h = slog.NewJSONHandler(stderr, hopts)
	}
	logger := slog.New(h)
	cmdline.Warn(logger, s.Unknown)
	setProcs(s.Loops, environ, logger)
	p, err := New(Config{Settings: s, Logger: logger})
	if err != nil {
		return cmdline.Exit(stderr, "pinboard", err)
	}
	if s.Dev {
		fmt.Fprintf(stdout, "pinboard: development mode: in-memory store, nothing survives a restart\n")
		if s.DevToken {
			fmt.Fprintf(stdout, "pinboard: dev token (Authorization: Bearer <token>): %s\n", s.Tokens[0])
		}
	}
	sigs := cmdline.NotifySignals(logger)
	defer sigs.Stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return sigs.Run(logger, func(ctx context.Context) int {
		reloads := make(chan struct{})
		go func() { // owned by Main: ends when ctx ends
			defer close(reloads)
			for {
				select {
				case <-hup:
					_ = p.ReloadTokens()
				case <-ctx.Done():
					return
				}
			}
		}()
		err := p.Run(ctx)
		<-reloads
		if err != nil {
			logger.Error("pinboard failed", "err", err)
			return ExitFailed
		}
		return ExitOK
	})
}

// setProcs gives the Go scheduler one P more than the event loops take
// (unless GOMAXPROCS is set in the environment): a loop keeps its P while it
// waits in epoll_wait (proxy.Front), so the other goroutines (the store's
// client, the registry, connections handed to the fasthttp path) need one
// of their own. A process-wide setting, so the command makes it, not a
// library.
func setProcs(loops int, environ []string, log *slog.Logger) {
	if loops == 0 {
		return
	}
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOMAXPROCS=") {
			return
		}
	}
	if n := runtime.GOMAXPROCS(0); n < loops+1 {
		runtime.GOMAXPROCS(loops + 1)
		log.Debug("GOMAXPROCS raised for the event loops", "from", n, "to", loops+1)
	}
}
