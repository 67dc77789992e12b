// Package history records the events of a chaos run as JSON lines, one
// file per process, on a clock shared by every process of the machine
// (CLOCK_MONOTONIC, which is system-wide on Linux), so that events written
// by different processes compare directly.
//
// Invariants: every event is written with one write(2) on a file opened
// O_APPEND, before the call returns, so a process killed with SIGKILL loses
// no event it reported; a Writer is safe for concurrent use; Read returns the
// events of a file in file order and skips a torn last line (a process
// killed in the middle of a write).
package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Event kinds.
const (
	// Written by a worker process (the test fixture test/app/counter with PINNED_HISTORY).
	KindActivate = "activate" // an instance's setup ran: ID, Inst, Session, Epoch
	KindTeardown = "teardown" // an instance's teardown ran: ID, Inst, Session, Epoch
	KindServe    = "serve"    // a request was served: ID, Inst, Session, Epoch, Recv (when it was read), T (when the handler ran)
	KindEffect   = "effect"   // a background task is about to change state: ID, Inst, Session, Epoch
	KindLease    = "lease"    // a registration or renewal was acked: Session, Sent, ExpiresMs, Cause ("registered"/"renewed")
	KindLost     = "lost"     // the lease was lost and selfAbort ran: Session, Cause
	KindStart    = "start"    // the process started: Proc
	KindAlarm    = "alarm"    // an alarm handler ran: ID, Inst, Session, Alarm, Sched, Wall, Attempt

	// Written by the harness.
	KindRequest = "request" // one client request: see the Request fields
	KindNemesis = "nemesis" // a fault: Nemesis, Target, T (start), End
	KindExit    = "exit"    // a worker process is known dead (killed or exited): Proc
	KindStored  = "stored"  // after the run: the count the application's store holds for ID: Count
)

// Event is one line of a history file. T is always set (shared clock, ns);
// which other fields are set depends on Kind.
type Event struct {
	T    int64  `json:"t"`
	Kind string `json:"k"`
	Proc string `json:"p,omitempty"` // process incarnation (worker file name)

	ID      string `json:"id,omitempty"`
	Inst    string `json:"inst,omitempty"`
	Session string `json:"s,omitempty"`
	Epoch   uint64 `json:"epoch,omitempty"` // the instance's activation epoch
	Recv    int64  `json:"recv,omitempty"`

	Sent      int64  `json:"sent,omitempty"`
	ExpiresMs int64  `json:"exp,omitempty"`
	Cause     string `json:"cause,omitempty"`

	// Alarm run (worker): the alarm's name, its scheduled time and the
	// wall time it ran (unix ms, comparable across processes of one
	// machine), the attempt number.
	Alarm   string `json:"alarm,omitempty"`
	Sched   int64  `json:"sched,omitempty"`
	Wall    int64  `json:"wall,omitempty"`
	Attempt int    `json:"att,omitempty"`

	// Request (harness client).
	Op         string `json:"op,omitempty"`
	Via        int    `json:"via,omitempty"` // pinboard index + 1
	End        int64  `json:"end,omitempty"`
	Status     int    `json:"status,omitempty"`
	Reason     string `json:"reason,omitempty"` // x-pinned-reason
	RetryAfter bool   `json:"ra,omitempty"`
	Err        string `json:"err,omitempty"` // client error class: timeout, refused, reset, other
	// Count: the count a 2xx POST /incr answered (request), or the stored
	// count (stored).
	Count int64 `json:"count,omitempty"`

	// Nemesis (harness).
	Nemesis string `json:"nem,omitempty"`
	Target  string `json:"target,omitempty"`
}

// Now returns the shared clock: CLOCK_MONOTONIC in nanoseconds.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("history: clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}

// Ago returns the shared-clock time d before now.
func Ago(d time.Duration) int64 { return Now() - int64(d) }

// At converts t (with a monotonic reading, e.g. from time.Now) to the
// shared clock.
func At(t time.Time) int64 { return Now() - int64(time.Since(t)) }

// Writer appends events to a file.
type Writer struct {
	mu  sync.Mutex
	f   *os.File
	buf []byte
	err error
}

// Create opens path for appending (creating it) and returns its Writer.
func Create(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return &Writer{f: f}, nil
}

// Write records e (stamping T with Now when it is zero). Errors are kept
// and reported by Close; a history that cannot be written fails the run.
func (w *Writer) Write(e Event) {
	if e.T == 0 {
		e.T = Now()
	}
	b, err := json.Marshal(e)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.err = errors.Join(w.err, err)
		return
	}
	w.buf = append(append(w.buf[:0], b...), '\n')
	if _, err := w.f.Write(w.buf); err != nil && w.err == nil {
		w.err = err
	}
}

// Close closes the file and returns the first error seen.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return errors.Join(w.err, w.f.Close())
}

// Read returns the events of a history file.
func Read(path string) ([]Event, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	var out []Event
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			if !bytes.HasSuffix(b, []byte("\n")) && !hasMore(sc) {
				break // torn last line of a killed process
			}
			return nil, fmt.Errorf("history: %s:%d: %w", path, line, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

func hasMore(sc *bufio.Scanner) bool { return sc.Scan() }
