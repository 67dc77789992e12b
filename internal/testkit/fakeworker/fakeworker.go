// Package fakeworker is a minimal worker endpoint for tests of the registry
// and the pinboard: a fasthttp server on 127.0.0.1 that answers
// GET /_pinned/challenge the way a worker does (the value for the
// challenge, only with the right secret), or misbehaves in one of the ways
// the pinboard must refuse. It is not a worker (no heartbeats, no lease);
// tests drive the registry protocol themselves.
package fakeworker

import (
	"bufio"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Mode is how the fake answers a challenge.
type Mode int

// Modes.
const (
	OK          Mode = iota // {"value": Value(challenge)} when the secret matches, else 403
	WrongValue              // a value that does not match
	Redirect                // 302 to a URL that would answer correctly
	Huge                    // a 200 body larger than the 4 KiB cap (with a Marker inside)
	HugeChunked             // the same, chunked, so only reading reveals the size
	Slow                    // no answer until the test ends
	Malformed               // a 200 that is not {"value": ...} (with a Marker inside)
	Status500               // a 500 (with a Marker inside)
	// ArmedOnly answers like OK, but only challenges armed with Arm (as a
	// real worker answers only the challenges of its calls in flight); 404
	// for any other.
	ArmedOnly
)

// Marker is a string the misbehaving modes put in their bodies: a test
// asserts that it never reaches a registry response (bodies are never
// echoed).
const Marker = "FAKEWORKER-BODY-MARKER"

// Value is the fake's proof function: the value it answers for challenge.
// A registration or heartbeat sends challengeValue = Value(challenge).
func Value(challenge string) string { return "proof:" + challenge }

// Worker is a running fake.
type Worker struct {
	// URL is the advertise URL, http://127.0.0.1:<port>.
	URL string
	// Secret is the secret the fake expects in x-pinned-proxy-secret.
	Secret string

	mode    atomic.Int64
	hits    atomic.Int64
	armedMu sync.Mutex
	armed   map[string]bool
	srv     *fasthttp.Server
	ln      net.Listener
	unblock chan struct{}
	once    sync.Once
}

// Start starts a fake with the given secret; it stops when the test ends.
func Start(tb testing.TB, secret string) *Worker {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	w := &Worker{URL: "http://" + ln.Addr().String(), Secret: secret, ln: ln, unblock: make(chan struct{})}
	// A short MaxIdleWorkerDuration: fasthttp's worker-pool cleaner sleeps that
	// long before it notices the server stopped (goleak in callers).
	w.srv = &fasthttp.Server{Handler: w.handle, ReadTimeout: 10 * time.Second, MaxIdleWorkerDuration: 100 * time.Millisecond}
	done := make(chan struct{})
	go func() { // owned by the test: ends when Close shuts the server down
		defer close(done)
		_ = w.srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		w.Close()
		<-done
	})
	return w
}

// Close stops the fake (unblocking Slow answers). It is idempotent.
func (w *Worker) Close() {
	w.once.Do(func() {
		close(w.unblock)
		// Close the listener ourselves: a Shutdown that runs before Serve
		// has registered it would leave Serve accepting forever.
		_ = w.ln.Close()
		_ = w.srv.Shutdown()
	})
}

// SetMode changes how the fake answers.
func (w *Worker) SetMode(m Mode) { w.mode.Store(int64(m)) }

// Arm makes ArmedOnly answer challenge; Disarm stops it.
func (w *Worker) Arm(challenge string) {
	w.armedMu.Lock()
	defer w.armedMu.Unlock()
	if w.armed == nil {
		w.armed = map[string]bool{}
	}
	w.armed[challenge] = true
}

// Disarm makes ArmedOnly refuse challenge again.
func (w *Worker) Disarm(challenge string) {
	w.armedMu.Lock()
	defer w.armedMu.Unlock()
	delete(w.armed, challenge)
}

// Hits returns how many challenge requests the fake has received.
func (w *Worker) Hits() int { return int(w.hits.Load()) }

func (w *Worker) handle(ctx *fasthttp.RequestCtx) {
	if string(ctx.Path()) != wire.PathChallenge {
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		return
	}
	w.hits.Add(1)
	if string(ctx.Request.Header.Peek(wire.HeaderProxySecret)) != w.Secret {
		ctx.SetStatusCode(fasthttp.StatusForbidden)
		ctx.SetBodyString(Marker)
		return
	}
	challenge := string(ctx.QueryArgs().Peek(wire.QueryChallenge))
	answer := func(v string) {
		b, _ := json.Marshal(wire.ChallengeResponse{Value: v})
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
	}
	switch Mode(w.mode.Load()) {
	case OK:
		answer(Value(challenge))
	case ArmedOnly:
		w.armedMu.Lock()
		armed := w.armed[challenge]
		w.armedMu.Unlock()
		if !armed {
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			return
		}
		answer(Value(challenge))
	case WrongValue:
		answer("not-" + Value(challenge))
	case Redirect:
		ctx.Redirect(w.URL+wire.PathChallenge+"?"+ctx.QueryArgs().String(), fasthttp.StatusFound)
	case Huge:
		ctx.SetBodyString(`{"value":"` + Marker + strings.Repeat("x", 8<<10) + `"}`)
	case HugeChunked:
		ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
			bw.Write([]byte(`{"value":"` + Marker))
			for range 8 {
				bw.Write([]byte(strings.Repeat("x", 1024)))
				bw.Flush()
			}
			bw.Write([]byte(`"}`))
		})
	case Slow:
		select {
		case <-w.unblock:
		case <-time.After(30 * time.Second):
		}
		answer(Value(challenge))
	case Malformed:
		ctx.SetBodyString("<html>" + Marker + "</html>")
	case Status500:
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetBodyString(Marker)
	}
}
