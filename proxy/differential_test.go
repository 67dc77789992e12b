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

// FuzzProxyDifferential: the byte streams of one or more client
// connections go to the proxy in front of a capturing backend parsed by Go's
// net/http, and each connection's bytes are parsed by net/http.ReadRequest
// as its reference. An input is one connection's bytes as they stand, or,
// after connsMagic, the writes of up to maxFuzzConns connections in the
// order they are made (decodeConns), so that the input decides how the
// connections interleave. Every input runs against both engines: the event
// loops (a Front, which hands what it does not serve to the fasthttp
// server) and the fasthttp server alone. Properties, per input and engine:
//
//   - every request the backend read whole is answered on exactly one
//     connection, and the i-th final response a connection gets answers
//     the i-th request its reference reads: a 204 (the backend's answer)
//     carries the sequence number of a backend request with the same
//     method, target and body as that reference request; no request is
//     smuggled, lost, answered out of order or answered on another
//     connection;
//   - every other request the backend sees (its body broke off) is a
//     reference request of some connection, after the last one answered
//     there.
//
// Seeds: the smuggling tables (internal/testkit/smuggle), connections
// interleaved (fuzzConnSeeds) and testdata/fuzz/FuzzProxyDifferential.
func FuzzProxyDifferential(f *testing.F) {
	for _, c := range smuggle.Requests() {
		if len(c.Raw) < 4096 {
			f.Add([]byte(c.Raw))
		}
	}
	for _, c := range append(append(smuggle.Controls(), smuggle.Tolerated()...), smuggle.LateChunkErrors()...) {
		f.Add([]byte(c.Raw))
	}
	for _, in := range fuzzConnSeeds() {
		f.Add(in)
	}
	d := startDifferential(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		d.check(t, in)
	})
}

// connsMagic starts an input of several connections (decodeConns).
const connsMagic = "\xffconns\n"

// maxFuzzConns bounds the connections of one input.
const maxFuzzConns = 4

// fuzzWrite is one write of an input: n bytes on connection conn, or, when
// b is empty, conn shutting its sending side down.
type fuzzWrite struct {
	conn int
	b    []byte
}

// decodeConns reads an input: without connsMagic in front, the bytes of one
// connection, written at once; with it, segments of a connection byte (its
// index modulo maxFuzzConns), a length n (two bytes, big-endian) and n
// bytes that connection writes at once (fewer at the end of the input),
// n = 0 shutting its sending side down (what it writes after that is
// dropped). It returns each connection's bytes and the writes in order.
func decodeConns(in []byte) (conns [][]byte, writes []fuzzWrite) {
	rest, ok := bytes.CutPrefix(in, []byte(connsMagic))
	if !ok {
		return [][]byte{in}, []fuzzWrite{{0, in}}
	}
	conns = make([][]byte, maxFuzzConns)
	shut := make([]bool, maxFuzzConns)
	for len(rest) >= 3 {
		c, n := int(rest[0])%maxFuzzConns, int(rest[1])<<8|int(rest[2])
		rest = rest[3:]
		b := rest[:min(n, len(rest))]
		rest = rest[len(b):]
		if shut[c] {
			continue
		}
		shut[c] = n == 0
		conns[c] = append(conns[c], b...)
		writes = append(writes, fuzzWrite{c, b})
	}
	return conns, writes
}

// encodeConns is decodeConns's inverse, for seeds (writes of at most 64 KiB
// - 1).
func encodeConns(writes ...fuzzWrite) []byte {
	out := []byte(connsMagic)
	for _, w := range writes {
		out = append(append(out, byte(w.conn), byte(len(w.b)>>8), byte(len(w.b))), w.b...)
	}
	return out
}

// fuzzConnSeeds are inputs of several connections: pipelined requests of
// two connections interleaved a few bytes at a time, and refusals (the
// proxy's limits, a head cut off, smuggling refusals) interleaved with
// requests it forwards.
func fuzzConnSeeds() [][]byte {
	a := []byte("GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\nPOST /counter/a/p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
	b := []byte("GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\nGET /counter/b/2 HTTP/1.1\r\nHost: h\r\n\r\n")
	var interleaved []fuzzWrite
	for i := 0; i < max(len(a), len(b)); i += 7 {
		interleaved = append(interleaved, fuzzWrite{0, a[min(i, len(a)):min(i+7, len(a))]}, fuzzWrite{1, b[min(i, len(b)):min(i+7, len(b))]})
	}
	var clean []fuzzWrite // no empty writes: those shut a connection down
	for _, w := range interleaved {
		if len(w.b) > 0 {
			clean = append(clean, w)
		}
	}
	var long strings.Builder // longer than a connection buffer of a loop
	for i := range 160 {
		long.WriteString("GET /counter/a/" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: h\r\nX-Pad: " + strings.Repeat("p", 200) + "\r\n\r\n")
	}
	nobodies := "GET /nobody/a HTTP/1.1\r\nHost: h\r\n\r\nGET /nobody/b HTTP/1.1\r\nHost: h\r\n\r\nGET /counter/c HTTP/1.1\r\nHost: h\r\n\r\n"
	return [][]byte{
		encodeConns(clean...),
		encodeConns(fuzzWrite{0, []byte(nobodies)}, fuzzWrite{1, []byte(nobodies)}),
		encodeConns(fuzzWrite{0, []byte(long.String())}, fuzzWrite{1, []byte("GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n")}),
		encodeConns(
			fuzzWrite{0, []byte("POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Length: 2000000\r\n\r\n")},
			fuzzWrite{1, []byte("GET /counter/b HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2000000\r\n\r\n")},
		),
		encodeConns(
			fuzzWrite{0, []byte("POST /counter/a HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 99999999999\r\n\r\n")},
			fuzzWrite{1, []byte("GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n")},
			fuzzWrite{2, []byte("GET /counter/c HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n 2\r\n\r\n")},
			fuzzWrite{1, []byte("GET /counter/b%2Fx HTTP/1.1\r\nHost: h\r\n\r\n")},
			fuzzWrite{3, []byte("GET /counter/d HTTP/1.1\r\nHo")},
			fuzzWrite{3, nil},
			fuzzWrite{2, []byte("GET /counter/c/2 HTTP/1.1\r\nHost: h\r\n\r\n")},
		),
		encodeConns(
			fuzzWrite{0, []byte("POST /counter/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab")},
			fuzzWrite{1, []byte("POST /counter/b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")},
			fuzzWrite{0, []byte("c\r\n0\r\n\r\nGET /counter/a/2 HTTP/1.1\r\nHost: h\r\n\r\n")},
		),
	}
}

// differential is the fuzz target's fixture: a net/http backend that
// records every request, and a proxy on each engine whose resolver sends
// every name (but /nobody's) to the session of the current input and
// engine (a fresh one each time, so that the backend's records are
// attributed by X-Pinned-Session; its body limit, 1 MiB, lets an input
// announce past it and no input's body reach it).
type differential struct {
	engines []diffEngine
	backend string
	res     *oneSession
	execs   atomic.Int64

	mu       sync.Mutex
	records  map[string][]backendRecord // by session
	inflight map[string]int
}

// diffEngine is one of the proxy's engines the differential runs every
// input against.
type diffEngine struct {
	name, addr string
}

type backendRecord struct {
	seq            int
	method, target string
	body           []byte
	complete       bool // the body was read to its end
}

// oneSession resolves every name to one session, but the names of the
// namespace /nobody, which it knows are placed on no session: the proxy
// refuses them at once (503 no_worker), without waiting for anything.
type oneSession struct {
	s atomic.Pointer[proxy.Session]
}

// nobody reports whether name is in the namespace /nobody.
func nobody(name []byte) bool { return bytes.HasPrefix(name, []byte("/nobody/")) }

func (o *oneSession) Lookup(name []byte, _ time.Time) (proxy.Route, bool) {
	if nobody(name) {
		return proxy.Route{}, true
	}
	return proxy.Route{Session: o.s.Load()}, true
}

func (o *oneSession) Resolve(_ context.Context, name []byte) (proxy.Route, error) {
	if nobody(name) {
		return proxy.Route{}, proxy.ErrNoWorker
	}
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
	tb.Cleanup(func() { // after the proxies' (cleanups run last first)
		_ = bsrv.Close()
		<-bdone
	})

	for _, loops := range []int{loopEngine, fasthttpEngine} {
		f := startProxy(tb, loops, d.res, func(c *proxy.Config) {
			c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			c.HeaderTimeout = 2 * time.Second
			c.ResponseHeaderTimeout = 2 * time.Second
			c.StreamIdleTimeout = 2 * time.Second
			c.MaxAttempts = 1
			// Every input has a session (and so an endpoint) of its own:
			// the janitor closes those of past inputs.
			c.EndpointSweepInterval = 100 * time.Millisecond
		})
		runProxy(tb, f.p)
		e := diffEngine{name: "fasthttp", addr: f.addr}
		if loops > 0 {
			e.name = "loops"
		}
		d.engines = append(d.engines, e)
	}
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

// check runs in against every engine.
func (d *differential) check(t *testing.T, in []byte) {
	conns, writes := decodeConns(in)
	refs := make([][]refRequest, len(conns))
	refErrs := make([]error, len(conns))
	for i, c := range conns {
		refs[i], refErrs[i] = reference(c)
	}
	for _, e := range d.engines {
		d.checkEngine(t, e, in, writes, refs, refErrs)
	}
}

// checkEngine sends the writes of an input to one engine, each connection's
// in the order given, and checks what the backend saw and each connection
// got against the connections' references.
func (d *differential) checkEngine(t *testing.T, e diffEngine, in []byte, writes []fuzzWrite, refs [][]refRequest, refErrs []error) {
	n := d.execs.Add(1)
	session := "fz" + strconv.FormatInt(n, 10)
	// A limit the input can announce past (413 on the head) but that no
	// body it carries reaches.
	d.res.s.Store(&proxy.Session{ID: session, Secret: "secret", AdvertiseURL: "http://" + d.backend, MaxBodyBytes: 1 << 20})

	cs := make([]*net.TCPConn, len(refs))
	for i := range cs {
		c, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c.(*net.TCPConn)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	written := make(chan struct{})
	go func() {
		defer close(written)
		for _, w := range writes {
			if len(w.b) == 0 {
				_ = cs[w.conn].CloseWrite()
			} else {
				_, _ = cs[w.conn].Write(w.b)
			}
		}
		for _, c := range cs {
			_ = c.CloseWrite()
		}
	}()
	got := make([][]byte, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() {
			b, err := io.ReadAll(c)
			_ = c.Close()
			if isNetTimeout(err) {
				t.Errorf("%s: connection %d: no end of the proxy's answer within 10s: %q\ninput %q", e.name, i, b, in)
			}
			got[i] = b
		})
	}
	wg.Wait()
	<-written // the connections are closed: a write still waiting fails
	if t.Failed() {
		t.FailNow()
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

	// Each connection's final responses, paired with its reference
	// requests; a 204 names the backend record it answers.
	answeredOn := map[int]int{} // record seq → connection
	lastAnswered := make([]int, len(cs))
	for k := range cs {
		lastAnswered[k] = -1
		br := bufio.NewReader(bytes.NewReader(got[k]))
		for i := 0; ; {
			var req *http.Request
			if i < len(refs[k]) {
				req = &http.Request{Method: refs[k][i].method}
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
				if _, dup := answeredOn[seq]; err != nil || seq < 0 || seq >= len(recs) || dup {
					t.Fatalf("%s: connection %d, response %d: 204 with X-Seq %q; backend has %d records\ninput %q",
						e.name, k, i, resp.Header.Get("X-Seq"), len(recs), in)
				}
				answeredOn[seq] = k
				r := recs[seq]
				if i >= len(refs[k]) {
					t.Fatalf("%s: connection %d, response %d answers a request net/http does not read there "+
						"(reference: %d requests, then %v): backend saw %s %q\ninput %q", e.name, k, i, len(refs[k]), refErrs[k], r.method, r.target, in)
				}
				if ref := refs[k][i]; ref.method != r.method || ref.target != r.target || ref.bodyErr || !bytes.Equal(ref.body, r.body) {
					t.Fatalf("%s: connection %d, response %d: backend saw %s %q body %q; reference request %d there is %s %q body %q\ninput %q",
						e.name, k, i, r.method, r.target, r.body, i, ref.method, ref.target, ref.body, in)
				}
				lastAnswered[k] = i
			}
			i++
		}
	}

	// Every backend request: answered, or one its connection's reference
	// reads after the last answered there (its body broke off).
	for _, r := range recs {
		if _, ok := answeredOn[r.seq]; ok {
			continue
		}
		if r.complete {
			t.Fatalf("%s: backend answered %s %q (seq %d) but no connection got a 204 for it\ninput %q\nclients got %q",
				e.name, r.method, r.target, r.seq, in, got)
		}
		found := false
		for k := range refs {
			for _, ref := range refs[k][lastAnswered[k]+1:] {
				found = found || ref.method == r.method && ref.target == r.target
			}
		}
		if !found {
			t.Fatalf("%s: backend saw %s %q body %q (incomplete), which net/http does not read from any connection "+
				"after its answered requests\ninput %q\nclients got %q", e.name, r.method, r.target, r.body, in, got)
		}
	}
}
