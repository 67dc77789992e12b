package proxy_test

import (
	"bufio"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// answerKind is one kind of request in TestEveryAnswerBelongsToItsRequest:
// what to send for a request with marker m, and the answer (status and
// body) that request deserves.
type answerKind struct {
	name string
	// closes: the proxy closes the connection after the answer, so the
	// kind ends its connection.
	closes bool
	// reaches: the worker may see (part of) the request.
	reaches bool
	req     func(m string) string
	want    func(m string) string
}

// answerKinds are the requests the proxy forwards and every kind of answer
// it makes itself, for the limits set up in TestEveryAnswerBelongsToItsRequest.
func answerKinds() []answerKind {
	get := func(target, extra string) string {
		return "GET " + target + " HTTP/1.1\r\nHost: h\r\n" + extra + "\r\n"
	}
	post := func(target, extra string, n int) string {
		return "POST " + target + " HTTP/1.1\r\nHost: h\r\n" + extra + "Content-Length: " + strconv.Itoa(n) + "\r\n\r\n"
	}
	chunked := func(target string, n int) string {
		var b strings.Builder
		b.WriteString("POST " + target + " HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
		for ; n > 0; n -= 8 << 10 {
			b.WriteString(strconv.FormatInt(int64(min(n, 8<<10)), 16) + "\r\n" + strings.Repeat("c", min(n, 8<<10)) + "\r\n")
		}
		b.WriteString("0\r\n\r\n")
		return b.String()
	}
	is := func(answer string) func(string) string { return func(string) string { return answer } }
	echo := func(suffix string, n int) func(string) string {
		return func(m string) string { return "200 /counter/" + m + suffix + " " + strconv.Itoa(n) }
	}
	var fields strings.Builder
	for i := range 101 {
		fields.WriteString("X-F" + strconv.Itoa(i) + ": v\r\n")
	}
	return []answerKind{
		{name: "get", reaches: true, req: func(m string) string { return get("/counter/"+m+"/", "") }, want: echo("/", 0)},
		{name: "post, read with the head", reaches: true,
			req: func(m string) string { return post("/counter/"+m+"/p", "", 100) + strings.Repeat("b", 100) }, want: echo("/p", 100)},
		{name: "post, streamed", reaches: true,
			req: func(m string) string { return post("/counter/"+m+"/s", "", 20<<10) + strings.Repeat("b", 20<<10) }, want: echo("/s", 20<<10)},
		{name: "404 not an object", req: func(m string) string { return get("/"+m, "") },
			want: is("404 " + errBody("not an object path: want /<namespace>/<id>[/...]", "path"))},
		{name: "400 escaped slash", closes: true, req: func(m string) string { return get("/counter/"+m+"/a%2Fb", "") },
			want: is("400 " + errBody("path must not contain escaped '/', '\\', '.', NUL or '%'", "path"))},
		{name: "400 Content-Length with Transfer-Encoding", closes: true,
			req: func(m string) string {
				return post("/counter/"+m+"/", "Transfer-Encoding: chunked\r\n", 5) + "0\r\n\r\n"
			},
			want: is("400 " + errBody("both Content-Length and Transfer-Encoding", "transfer-encoding"))},
		{name: "400 obs-fold", closes: true, req: func(m string) string { return get("/counter/"+m+"/", "X-A: 1\r\n 2\r\n") },
			want: is("400 " + errBody("obsolete line folding", "header"))},
		{name: "413 over the proxy's limit, Expect", closes: true,
			req:  func(m string) string { return post("/counter/"+m+"/", "Expect: 100-continue\r\n", 1<<20) },
			want: is("413 " + errBody("request body larger than 262144 bytes", "body"))},
		{name: "413 over the proxy's limit, no body sent", closes: true,
			req:  func(m string) string { return post("/big/"+m+"/", "", 1<<20) },
			want: is("413 " + errBody("request body larger than 262144 bytes", "body"))},
		{name: "413 over the holder's limit, no body sent", closes: true,
			req:  func(m string) string { return post("/counter/"+m+"/", "", 100<<10) },
			want: is("413 " + errBody("request body larger than the worker accepts (65536 bytes)", "body"))},
		{name: "413 chunked past the holder's limit", closes: true, reaches: true,
			req:  func(m string) string { return chunked("/counter/"+m+"/", 70<<10) },
			want: is("413 " + errBody("request body larger than the worker accepts (65536 bytes)", "body"))},
		{name: "413 chunked past the proxy's limit", closes: true, reaches: true,
			req:  func(m string) string { return chunked("/big/"+m+"/", 300<<10) },
			want: is("413 " + errBody("request body larger than 262144 bytes", "body"))},
		{name: "431 long field", closes: true, req: func(m string) string { return get("/counter/"+m+"/", "X-Big: "+strings.Repeat("b", 20<<10)+"\r\n") },
			want: is("431 " + errBody("request head larger than 16384 bytes", "header"))},
		{name: "431 long target", closes: true, req: func(m string) string { return get("/counter/"+m+"/"+strings.Repeat("t", 20<<10), "") },
			want: is("431 " + errBody("request head larger than 16384 bytes", "header"))},
		{name: "431 too many fields", closes: true, req: func(m string) string { return get("/counter/"+m+"/", fields.String()) },
			want: is("431 " + errBody("more than 100 header fields", "header"))},
		{name: "505", closes: true, req: func(m string) string { return "GET /counter/" + m + "/ HTTP/3.1\r\nHost: h\r\n\r\n" },
			want: is("505 " + errBody("HTTP version not supported: only HTTP/1.x", "version"))},
		{name: "503 no_worker", req: func(m string) string { return get("/counter/nobody/"+m, "") },
			want: is("503 " + errBody("no worker serves the namespace", ""))},
		{name: "503 overloaded", req: func(m string) string { return get("/stuck/"+m+"/", "") },
			want: is("503 " + errBody("worker overloaded", ""))},
		{name: "408 head", closes: true, req: func(m string) string { return "GET /counter/" + m + "/ HTTP/1.1\r\nHo" },
			want: is("408 " + errBody("request head not received in time", ""))},
		{name: "408 body", closes: true, req: func(m string) string { return post("/counter/"+m+"/", "", 1000) + "b" },
			want: is("408 " + errBody("request body not received in time", "body"))},
	}
}

// Every answer belongs to its request: clients on several connections at
// once send every kind of request the proxy forwards and every kind it
// refuses (400 target and smuggling refusals, 404, 413 by Content-Length,
// with and without Expect, and by a chunked body, against the proxy's and
// the holder's limits, 431 for a long field, a long target and too many
// fields, 505, 503 no_worker and overloaded, 408 for a head and for a body
// that do not come), each carrying a marker of its own, on fresh
// connections, on keep-alive ones and pipelined, in an order drawn at
// random. Each connection must get exactly the answers its requests
// deserve, in order: a forwarded request the worker's echo of its own
// marker, a refusal its own status and body; and the worker must never see
// the marker of a request refused before forwarding. (The proxy makes
// no 405 or 414, and no 501: see the smuggling policy.)
func TestEveryAnswerBelongsToItsRequest(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		release := make(chan struct{})
		var held atomic.Int64
		echo := func(ctx *fasthttp.RequestCtx) {
			var n int
			if s := ctx.RequestBodyStream(); s != nil {
				b, _ := io.ReadAll(s)
				n = len(b)
			} else {
				n = len(ctx.Request.Body())
			}
			ctx.SetBodyString(string(ctx.RequestURI()) + " " + strconv.Itoa(n))
		}
		w := startWorker(t, echo)
		stuck := startWorker(t, func(*fasthttp.RequestCtx) { held.Add(1); <-release })
		holder := w.session("holder", "k")
		holder.MaxBodyBytes = 64 << 10
		res := proxytest.NewStatic()
		res.PlaceNamespace("/counter", holder)
		res.PlaceNamespace("/big", w.session("big", "k"))
		res.PlaceNamespace("/stuck", stuck.session("stuck", "k"))
		res.PlaceRoute("/counter/nobody", proxy.Route{})
		const stuckConns = 16
		f := startProxy(t, loops, res, func(c *proxy.Config) {
			c.MaxRequestBodySize = 256 << 10
			c.HeaderTimeout = 2 * time.Second // every other request is written whole
			c.Endpoint.MaxConns = stuckConns
			c.Endpoint.MaxQueue = -1
		})
		t.Cleanup(func() { close(release) }) // before the proxy's shutdown (cleanups run last first)

		// Fill the stuck worker's in-flight cap: every further request
		// for it is 503 overloaded.
		for i := range stuckConns {
			c := dial(t, f.addr)
			if _, err := io.WriteString(c, "GET /stuck/hold"+strconv.Itoa(i)+"/ HTTP/1.1\r\nHost: h\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, func() bool { return held.Load() == stuckConns })

		kinds := answerKinds()
		var keeps []answerKind
		for _, k := range kinds {
			if !k.closes {
				keeps = append(keeps, k)
			}
		}
		var (
			mu      sync.Mutex
			refused []string // markers of requests refused before forwarding
			total   atomic.Int64
		)
		var wg sync.WaitGroup
		const clients, conns = 10, 15 // fewer clients than Endpoint.MaxConns: none of theirs is overloaded
		for client := range clients {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(client), uint64(loops)))
				for conn := range conns {
					// A connection: requests the proxy keeps it open after,
					// then maybe one it closes after.
					var plan []answerKind
					for n := 1 + rng.IntN(6); len(plan) < n; {
						k := kinds[rng.IntN(len(kinds))]
						if len(plan) < n-1 && rng.IntN(4) > 0 {
							k = keeps[rng.IntN(len(keeps))] // mostly, go on
						}
						plan = append(plan, k)
						if k.closes {
							break
						}
					}
					var reqs, want []string
					for i, k := range plan {
						m := "m" + strconv.Itoa(client) + "x" + strconv.Itoa(conn) + "x" + strconv.Itoa(i)
						req := k.req(m)
						if i == len(plan)-1 && !k.closes {
							// The last request asks to close, so that the
							// answers end with the connection.
							j := strings.Index(req, "\r\n") + 2
							req = req[:j] + "Connection: close\r\n" + req[j:]
						}
						reqs, want = append(reqs, req), append(want, k.want(m))
						if !k.reaches && !strings.HasPrefix(k.want(m), "200 ") {
							mu.Lock()
							refused = append(refused, m)
							mu.Unlock()
						}
					}
					mode := "fresh"
					if len(plan) > 1 {
						mode = [...]string{"keep-alive", "pipelined"}[rng.IntN(2)]
					}
					got := converse(t, f.addr, mode, reqs)
					total.Add(int64(len(plan)))
					if !slices.Equal(got, want) {
						t.Errorf("client %d connection %d (%s) answers:\n  %s\nwant:\n  %s", client, conn, mode,
							strings.Join(got, "\n  "), strings.Join(want, "\n  "))
					}
				}
			})
		}
		wg.Wait()
		for _, r := range w.requests() {
			for _, m := range refused {
				if strings.Contains(r.uri, "/"+m) {
					t.Errorf("worker saw %s, which the proxy refused", r.uri)
				}
			}
		}
		t.Logf("%d requests on %d connections from %d clients", total.Load(), clients*conns, clients)
	})
}

// converse sends reqs on a new connection (keep-alive: each after the
// answer to the one before; pipelined: all at once; fresh: the only one)
// and returns the answers up to the end of the connection.
func converse(t *testing.T, addr, mode string, reqs []string) []string {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	var got []string
	if mode == "keep-alive" {
		for _, req := range reqs[:len(reqs)-1] {
			if _, err := io.WriteString(c, req); err != nil {
				return append(got, "write: "+err.Error())
			}
			var resp fasthttp.Response
			if err := resp.Read(br); err != nil {
				return append(got, "read: "+err.Error())
			}
			got = append(got, strconv.Itoa(resp.StatusCode())+" "+string(resp.Body()))
		}
		reqs = reqs[len(reqs)-1:]
	}
	// Written while the answers are read: a pipeline longer than the
	// socket buffers must not wait for a reader.
	go func() { _, _ = io.WriteString(c, strings.Join(reqs, "")) }()
	b, err := io.ReadAll(br)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		got = append(got, "read: "+err.Error())
	}
	return append(got, parseResponses(b)...)
}
