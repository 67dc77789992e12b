package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/smuggle"
	"github.com/pinned-go/pinned/proxy"
)

// FuzzProxyDifferential: raw bytes go to the proxy
// (fasthttp) in front of a capturing backend parsed by Go's net/http, and
// the same bytes are parsed by net/http.ReadRequest as the reference.
// Properties, per input:
//
//   - every request the backend sees is one the reference parser also
//     reads from the input, in the same order, with the same method and
//     target (origin-form), and the same body when the backend read it
//     whole;
//   - the client receives exactly one 204 (the backend's answer) per
//     request the backend read whole, and the i-th final response the
//     client gets answers the i-th reference request: no request is
//     smuggled, lost or answered out of order.
//
// Seeds: the smuggling tables (internal/testkit/smuggle) and
// testdata/fuzz/FuzzProxyDifferential.
func FuzzProxyDifferential(f *testing.F) {
	for _, c := range smuggle.Requests() {
		if len(c.Raw) < 4096 {
			f.Add([]byte(c.Raw))
		}
	}
	for _, c := range append(append(smuggle.Controls(), smuggle.Tolerated()...), smuggle.LateChunkErrors()...) {
		f.Add([]byte(c.Raw))
	}
	d := startDifferential(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		d.check(t, in)
	})
}

// differential is the fuzz target's fixture: a net/http backend that
// records every request, and a proxy whose resolver sends every name to the
// endpoint of the current input (a fresh session per input, so that the
// backend's records are attributed by X-Pinned-Session).
type differential struct {
	proxyAddr string
	backend   string
	res       *oneSession
	execs     atomic.Int64

	mu       sync.Mutex
	records  map[string][]backendRecord // by session
	inflight map[string]int
}

type backendRecord struct {
	seq            int
	method, target string
	body           []byte
	complete       bool // the body was read to its end
}

// oneSession resolves every name to one session.
type oneSession struct {
	s atomic.Pointer[proxy.Session]
}

func (o *oneSession) Lookup([]byte, time.Time) (proxy.Route, bool) {
	return proxy.Route{Session: o.s.Load()}, true
}

func (o *oneSession) Resolve(context.Context, []byte) (proxy.Route, error) {
	return proxy.Route{Session: o.s.Load()}, nil
}
func (o *oneSession) Refused([]byte, proxy.Route, string) {}

func startDifferential(tb testing.TB) *differential {
	d := &differential{res: &oneSession{}, records: map[string][]backendRecord{}, inflight: map[string]int{}}
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	d.backend = bln.Addr().String()
	bsrv := &http.Server{
		Handler:           http.HandlerFunc(d.serveBackend),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          nil,
	}
	bdone := make(chan struct{})
	go func() { defer close(bdone); _ = bsrv.Serve(bln) }()

	p, err := proxy.New(proxy.Config{
		Resolver:              d.res,
		Logger:                slog.New(slog.NewTextHandler(io.Discard, nil)),
		HeaderTimeout:         2 * time.Second,
		ResponseHeaderTimeout: 2 * time.Second,
		StreamIdleTimeout:     2 * time.Second,
		MaxAttempts:           1,
		// Every input has a session (and so an endpoint) of its own: the
		// janitor closes those of past inputs.
		EndpointSweepInterval: 100 * time.Millisecond,
	})
	if err != nil {
		tb.Fatal(err)
	}
	srv := p.NewServer()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	d.proxyAddr = ln.Addr().String()
	done, janitorDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	janitor, stopJanitor := context.WithCancel(context.Background())
	go func() { defer close(janitorDone); _ = p.Run(janitor) }()
	tb.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
		stopJanitor()
		<-janitorDone
		_ = p.Close()
		_ = bsrv.Close()
		<-bdone
	})
	return d
}

// serveBackend records the request under its session and answers 204 with
// its sequence number.
func (d *differential) serveBackend(w http.ResponseWriter, r *http.Request) {
	session := r.Header.Get("X-Pinned-Session")
	d.mu.Lock()
	d.inflight[session]++
	d.mu.Unlock()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	d.mu.Lock()
	seq := len(d.records[session])
	d.records[session] = append(d.records[session], backendRecord{
		seq: seq, method: r.Method, target: r.RequestURI, body: body, complete: err == nil,
	})
	d.inflight[session]--
	d.mu.Unlock()
	if err != nil {
		return
	}
	w.Header().Set("X-Seq", strconv.Itoa(seq))
	w.WriteHeader(http.StatusNoContent)
}

// refRequest is a request as net/http.ReadRequest reads it.
type refRequest struct {
	method, target string
	body           []byte
	bodyErr        bool // the body is malformed: the last request read
}

// reference parses in with net/http: the requests up to the first error
// (a request whose body fails is the last, marked bodyErr), and that error.
func reference(in []byte) ([]refRequest, error) {
	var out []refRequest
	br := bufio.NewReader(bytes.NewReader(in))
	for {
		// RFC 9112 §2.2: empty lines before a request line are ignored
		// (fasthttp does; net/http does not).
		for {
			b, err := br.Peek(1)
			if err != nil || (b[0] != '\r' && b[0] != '\n') {
				break
			}
			if b, _ := br.Peek(2); b[0] == '\r' && (len(b) < 2 || b[1] != '\n') {
				break
			}
			_, _ = br.ReadByte()
		}
		// net/http refuses targets that fasthttp reads (a bad escape such
		// as "/a%0"), which says nothing about framing: it reads a
		// placeholder instead, and the target is taken from the line as
		// net/http splits it.
		line, err := br.ReadString('\n')
		if err != nil {
			return out, err
		}
		target := ""
		if method, rest, ok := strings.Cut(line, " "); ok {
			if t, proto, ok := strings.Cut(rest, " "); ok {
				target = t
				line = method + " /placeholder " + proto
			}
		}
		br = bufio.NewReader(io.MultiReader(strings.NewReader(line), br))
		req, err := http.ReadRequest(br)
		if err != nil {
			return out, err
		}
		body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		out = append(out, refRequest{method: req.Method, target: originTarget(target), body: body, bodyErr: err != nil})
		if err != nil {
			return out, fmt.Errorf("body of request %d: %w", len(out)-1, err)
		}
	}
}

// originTarget reduces an absolute-form target to origin-form, as the
// proxy sends it.
func originTarget(t string) string {
	if strings.HasPrefix(t, "/") {
		return t
	}
	i := strings.Index(t, "://")
	if i < 0 {
		return t
	}
	rest := t[i+3:]
	if j := strings.IndexAny(rest, "/?"); j >= 0 {
		return rest[j:]
	}
	return ""
}

func (d *differential) check(t *testing.T, in []byte) {
	n := d.execs.Add(1)
	session := "fz" + strconv.FormatInt(n, 10)
	d.res.s.Store(&proxy.Session{ID: session, Secret: "secret", AdvertiseURL: "http://" + d.backend})
	refs, refErr := reference(in)

	c, err := net.Dial("tcp", d.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		_, _ = c.Write(in)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	got, rerr := io.ReadAll(c)
	_ = c.Close()
	if isNetTimeout(rerr) {
		t.Fatalf("no end of the proxy's answer within 10s to %q: %q", in, got)
	}

	// Let backend handlers of this input finish (a body cut off by the
	// proxy ends in the handler's read error).
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		d.mu.Lock()
		busy := d.inflight[session]
		d.mu.Unlock()
		if busy == 0 || time.Now().After(deadline) {
			break
		}
	}
	d.mu.Lock()
	recs := d.records[session]
	delete(d.records, session)
	delete(d.inflight, session)
	d.mu.Unlock()

	// Every backend request is a reference request, in order.
	next := 0
	for _, r := range recs {
		for next < len(refs) && (refs[next].method != r.method || refs[next].target != r.target ||
			r.complete && (refs[next].bodyErr || !bytes.Equal(refs[next].body, r.body))) {
			next++
		}
		if next == len(refs) {
			t.Fatalf("backend saw %s %q body %q (complete=%v), which net/http does not read from the input "+
				"(reference: %d requests, then %v)\ninput %q\nclient got %q", r.method, r.target, r.body, r.complete,
				len(refs), refErr, in, got)
		}
		next++
	}

	// The client's responses, paired with the reference requests.
	br := bufio.NewReader(bytes.NewReader(got))
	answered := map[int]bool{}
	for i := 0; ; {
		var req *http.Request
		if i < len(refs) {
			req = &http.Request{Method: refs[i].method}
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			break
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode < 200 {
			continue
		}
		if resp.StatusCode == http.StatusNoContent {
			seq, err := strconv.Atoi(resp.Header.Get("X-Seq"))
			if err != nil || seq < 0 || seq >= len(recs) || answered[seq] {
				t.Fatalf("response %d: 204 with X-Seq %q; backend has %d records\ninput %q", i, resp.Header.Get("X-Seq"), len(recs), in)
			}
			answered[seq] = true
			r := recs[seq]
			if i >= len(refs) {
				t.Fatalf("response %d answers a request net/http does not read (reference: %d requests, then %v): backend saw %s %q\ninput %q",
					i, len(refs), refErr, r.method, r.target, in)
			}
			if ref := refs[i]; ref.method != r.method || ref.target != r.target || ref.bodyErr || !bytes.Equal(ref.body, r.body) {
				t.Fatalf("response %d: backend saw %s %q body %q; reference request %d is %s %q body %q\ninput %q",
					i, r.method, r.target, r.body, i, ref.method, ref.target, ref.body, in)
			}
		}
		i++
	}
	for _, r := range recs {
		if r.complete && !answered[r.seq] {
			t.Fatalf("backend answered %s %q (seq %d) but the client got no 204 for it\ninput %q\nclient got %q",
				r.method, r.target, r.seq, in, got)
		}
	}
}
