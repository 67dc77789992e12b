package bench

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/ci"
)

// The peers hand the backend the same forwarding fields as the pinboard
// (X-Forwarded-For, -Proto and -Host), so that a backend behind nginx or
// HAProxy parses as much per request as one behind the pinboard. Skipped
// for a peer that is not installed, except in CI (internal/testkit/ci).
func TestPeersForwardLikeThePinboard(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/counter/check/" {
			mu.Lock()
			seen = append(seen, r.Header.Clone())
			mu.Unlock()
		}
		w.WriteHeader(http.StatusOK)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	r, err := newRig(&Options{}, binaries{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	for _, peer := range []struct {
		name  string
		start func(string) (*proc, error)
	}{{"nginx", r.startNginx}, {"haproxy", r.startHAProxy}} {
		t.Run(peer.name, func(t *testing.T) {
			p, err := peer.start(ln.Addr().String())
			if errors.Is(err, errPeerMissing) {
				ci.Missing(t, peer.name+" is not installed (go run ./cmd/bench -install installs it)")
			}
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			seen = nil
			mu.Unlock()
			if code, _ := httpGet("http://"+p.addr+"/counter/check/", 5*time.Second); code != 200 {
				t.Fatalf("GET through %s = %d, want 200", peer.name, code)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(seen) != 1 {
				t.Fatalf("the backend saw %d requests, want 1", len(seen))
			}
			h := seen[0]
			for field, want := range map[string]string{
				"X-Forwarded-For":   "127.0.0.1",
				"X-Forwarded-Proto": "http",
				"X-Forwarded-Host":  p.addr,
			} {
				if got := h.Values(field); len(got) != 1 || got[0] != want {
					t.Errorf("%s sent %s: %q, want %q", peer.name, field, got, want)
				}
			}
		})
	}
}
