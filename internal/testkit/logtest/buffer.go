package logtest

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer for a text or JSON slog handler (or a child
// process's stderr) that several goroutines write at once; String returns
// everything written so far. The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns a copy of everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
