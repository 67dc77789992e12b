package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"
)

// errClass is the class of a failed request.
type errClass uint8

// Error classes. A request either gets a response (classNone for 2xx,
// classStatus otherwise) or fails with one of the transport classes.
const (
	classNone       errClass = iota
	classStatus              // a response with a non-2xx status
	classTimeout             // read, write or round-trip timeout
	classConnect             // the connection could not be established (refused, dial timeout, DNS, TLS handshake)
	classConnection          // an established connection failed (reset, closed early, truncated body)
	classPool                // no free connection within ConnWaitTimeout: the generator is short of connections
	classOther               // anything else (protocol errors, websocket handshake refused, ...)
	numClasses
)

var classNames = [numClasses]string{
	classNone:       "ok",
	classStatus:     "status",
	classTimeout:    "timeout",
	classConnect:    "connect",
	classConnection: "connection",
	classPool:       "pool",
	classOther:      "other",
}

func (c errClass) String() string { return classNames[c] }

// classify maps a transport error to its class. err must not be nil.
func classify(err error) errClass {
	var op *net.OpError
	var ce *websocket.CloseError
	var cv *tls.CertificateVerificationError
	var ra tls.RecordHeaderError
	var ae tls.AlertError
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return classPool
	case errors.Is(err, fasthttp.ErrDialTimeout),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.As(err, &op) && op.Op == "dial",
		errors.As(err, &cv), errors.As(err, &ra), errors.As(err, &ae):
		return classConnect
	case errors.Is(err, fasthttp.ErrTimeout),
		errors.Is(err, os.ErrDeadlineExceeded),
		errors.Is(err, context.DeadlineExceeded):
		return classTimeout
	case isTimeout(err):
		return classTimeout
	case errors.Is(err, fasthttp.ErrConnectionClosed),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, net.ErrClosed),
		errors.As(err, &ce):
		return classConnection
	}
	return classOther
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
