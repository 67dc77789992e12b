package counterapp

import (
	"fmt"
	"log/slog"

	"github.com/valyala/fasthttp"
)

// ServerLogger routes a fasthttp.Server's error messages (a connection that
// could not be served, a malformed request) through l at WARN, tagged
// logger=fasthttp, instead of the standard log package fasthttp uses by
// default. Both demos set it as their servers' Logger.
func ServerLogger(l *slog.Logger) fasthttp.Logger { return serverLogger{l} }

type serverLogger struct{ l *slog.Logger }

func (s serverLogger) Printf(format string, args ...any) {
	s.l.Warn(fmt.Sprintf(format, args...), "logger", "fasthttp")
}
