package proxy

// Inflight returns the requests holding or waiting for a connection to the
// session's endpoint (0 when it has none).
func Inflight(s *Session) int {
	if e := s.ep.Load(); e != nil && !e.isRetired() {
		return int(e.inflight.Load())
	}
	return 0
}
