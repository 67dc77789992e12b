package smuggle

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Result is what a front end did with one raw request.
type Result struct {
	// Statuses are the status codes of the complete responses received, in
	// order (1xx included).
	Statuses []int
	// Closed: the front end closed the connection (EOF or reset) after its
	// responses, before the deadline.
	Closed bool
	// ContentType and Body are those of the first final response.
	ContentType string
	Body        []byte
	// Raw is every byte received.
	Raw []byte
	// Elapsed is the time from the first byte written to the end of reading.
	Elapsed time.Duration
}

// Status returns the first final status, or 0 when none arrived.
func (r Result) Status() int {
	for _, s := range r.Statuses {
		if s >= 200 {
			return s
		}
	}
	return 0
}

// Send writes raw on a new connection to addr and reads until the front end
// closes the connection or timeout passes, whichever is first. A write that
// fails because the front end already answered and closed is not an error.
func Send(addr, raw string, timeout time.Duration) (Result, error) {
	var r Result
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return r, err
	}
	defer c.Close()
	start := time.Now()
	deadline := start.Add(timeout)
	_ = c.SetDeadline(deadline)
	// Write from another goroutine: a front end that answers before reading
	// everything (431) must not leave us blocked in Write while our read
	// side is what would drain its answer.
	werr := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c, raw)
		werr <- err
	}()
	var buf bytes.Buffer
	_, rerr := io.Copy(&buf, c)
	r.Elapsed = time.Since(start)
	<-werr
	r.Raw = buf.Bytes()
	switch {
	case rerr == nil: // io.Copy: EOF
		r.Closed = true
	case errors.Is(rerr, syscall.ECONNRESET):
		r.Closed = true
	case isTimeout(rerr):
	default:
		return r, fmt.Errorf("reading: %w", rerr)
	}
	br := bufio.NewReader(bytes.NewReader(r.Raw))
	for br.Buffered() > 0 || len(r.Statuses) == 0 {
		var resp fasthttp.Response
		if err := resp.Read(br); err != nil {
			break
		}
		r.Statuses = append(r.Statuses, resp.StatusCode())
		if resp.StatusCode() >= 200 && r.Body == nil {
			r.ContentType = string(resp.Header.ContentType())
			r.Body = append([]byte{}, resp.Body()...)
		}
		if _, err := br.Peek(1); err != nil {
			break
		}
	}
	return r, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Check reports how r falls short of the case: exactly one response, with
// c.Status, then the connection closed.
func (c Request) Check(r Result) error {
	switch {
	case len(r.Statuses) == 0:
		return fmt.Errorf("no response (closed=%v after %v); got %q", r.Closed, r.Elapsed.Round(time.Millisecond), clip(r.Raw))
	case len(r.Statuses) > 1 || r.Statuses[0] != c.Status:
		return fmt.Errorf("statuses %v; want exactly [%d]; got %q", r.Statuses, c.Status, clip(r.Raw))
	case !r.Closed:
		return fmt.Errorf("status %d but the connection stayed open", r.Statuses[0])
	}
	return nil
}

// JSONError checks that the first final response is pinned's error shape,
// a JSON wire.Error with a message, and returns it.
func (r Result) JSONError() (wire.Error, error) {
	var e wire.Error
	if r.ContentType != "application/json" {
		return e, fmt.Errorf("Content-Type %q; want application/json", r.ContentType)
	}
	if err := json.Unmarshal(r.Body, &e); err != nil || e.Error == "" {
		return e, fmt.Errorf("body %q is not a wire.Error", r.Body)
	}
	return e, nil
}

// clip shortens b for an error message.
func clip(b []byte) []byte {
	if len(b) > 300 {
		return append(append([]byte(nil), b[:300]...), "..."...)
	}
	return b
}
