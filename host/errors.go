package host

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrInstanceClosed is returned by Instance.Go, Instance.Do and
	// WebSocket.WriteMessage once the instance is closing or closed (or the
	// socket has ended). Work that gets it should stop: the instance is going
	// away and a later request activates a fresh one.
	ErrInstanceClosed = errors.New("host: instance closed")
	// ErrHostClosed is returned by Start after Close. Create a new Host.
	ErrHostClosed = errors.New("host: host closed")
	// ErrStreamStarted is returned by Ctx.Stream when the handler already set
	// a stream; a response has one body.
	ErrStreamStarted = errors.New("host: response stream already set")
	// ErrStale is what an application returns (or wraps) when its own store
	// refused it as stale: a newer activation of the id has written there
	// (a fenced write or load refused, see Instance.Epoch). From New it
	// answers 503 stale and leaves no instance; from a handler it aborts the
	// instance (eviction reason stale) and answers 503 stale. Return it only
	// when the request had no effect: the proxy may send it again to the
	// id's current holder.
	ErrStale = errors.New("host: activation is stale")
)

// Error is an error with an HTTP status. A handler (or the object's New)
// that returns an *Error answers with its Status and the JSON body
// wire.Error{Error: Message, Field: Field}. Any other error answers 500 with
// a generic body and is logged.
type Error struct {
	Status  int    // HTTP status, e.g. 404
	Message string // the "error" member of the JSON body
	Field   string // optional: the request field that was wrong
}

// NewError returns an *Error with the given status and message.
func NewError(status int, message string) *Error {
	return &Error{Status: status, Message: message}
}

// Errorf returns an *Error with the given status and a formatted message.
func Errorf(status int, format string, args ...any) *Error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%d %s (field %s)", e.Status, e.Message, e.Field)
	}
	return fmt.Sprintf("%d %s", e.Status, e.Message)
}
