package proxy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// newStatic places the namespace /counter on w.
func newStatic(w *worker) *proxytest.Static {
	res := proxytest.NewStatic()
	res.PlaceNamespace("/counter", w.session("s", "k"))
	return res
}

// errBody is the JSON body of one of the proxy's own replies.
func errBody(msg, field string) string {
	b, err := json.Marshal(wire.Error{Error: msg, Field: field})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// pathEchoProxy starts a worker that answers every request with its path,
// the namespace /counter placed on it, and a proxy on the chosen engine.
func pathEchoProxy(t *testing.T, loops int, mutate func(*proxy.Config)) (*front, *proxytest.Static) {
	t.Helper()
	w := startWorker(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBody(ctx.Path()) })
	res := newStatic(w)
	return startProxy(t, loops, res, mutate), res
}

// dial connects to addr; the connection is closed when the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// exchangeOnce sends req on a new connection and reads one response.
func exchangeOnce(t *testing.T, addr, req string) *fasthttp.Response {
	t.Helper()
	c := dial(t, addr)
	defer c.Close()
	return rawResponse(t, c, bufio.NewReader(c), req)
}

// The refusal of one client's request never answers another's: a head
// announcing a body over MaxRequestBodySize (with Expect: 100-continue, as
// curl sends it, or with the body refused first for its target), then a
// head over MaxHeaderBytes on a new connection, many times over. Each gets
// its own answer: 413 naming the body, 431 naming the head. (The fasthttp
// path marked the first head for its error handler in a table keyed by the
// request's address; the server reuses request objects across connections,
// and a mark the Expect path or an early refusal left behind answered the
// next connection's parse error with 413.)
func TestRefusalDoesNotAnswerAnotherConnection(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		res := newStatic(w)
		f := startProxy(t, loops, res, nil)
		tooLarge := errBody("request body larger than 67108864 bytes", "body")
		headTooLarge := errBody("request head larger than 16384 bytes", "header")
		bigHead := "GET /counter/x/ HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("b", 20<<10) + "\r\n\r\n"
		firsts := []struct{ name, req string }{
			{"expect", "POST /counter/x/incr HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 73400320\r\n\r\n"},
			{"bad target", "POST /counter/a%2Fb HTTP/1.1\r\nHost: h\r\nContent-Length: 73400320\r\n\r\n" + strings.Repeat("x", 16<<10)},
		}
		for round := range 40 {
			first := firsts[round%len(firsts)]
			resp := exchangeOnce(t, f.addr, first.req)
			if first.name == "expect" && (resp.StatusCode() != 413 || string(resp.Body()) != tooLarge) {
				t.Fatalf("round %d, %s: %d %s; want 413 %s", round, first.name, resp.StatusCode(), resp.Body(), tooLarge)
			}
			resp = exchangeOnce(t, f.addr, bigHead)
			if resp.StatusCode() != 431 || string(resp.Body()) != headTooLarge {
				t.Fatalf("round %d, a 20 KB head after %s: %d %s; want 431 %s", round, first.name, resp.StatusCode(), resp.Body(), headTooLarge)
			}
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests; want none", n)
		}
	})
}

// readAll reads c to its end (within 10 s) and returns the responses in
// it, each as its status and body.
func readAll(t *testing.T, c net.Conn) []string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading to the end of the connection: %v, after %q", err, b)
	}
	return parseResponses(b)
}

// parseResponses splits b into responses, each as its status and body;
// bytes that do not make a whole response end the list as "rest: ...".
func parseResponses(b []byte) []string {
	var got []string
	br := bufio.NewReader(bytes.NewReader(b))
	for {
		if _, err := br.Peek(1); err != nil {
			return got
		}
		var resp fasthttp.Response
		if err := resp.Read(br); err != nil {
			rest, _ := io.ReadAll(br)
			return append(got, "rest: "+string(rest))
		}
		got = append(got, strconv.Itoa(resp.StatusCode())+" "+string(resp.Body()))
	}
}

// Requests pipelined behind one the proxy refuses at once (no worker for
// the name: the loop knows it without waiting for anything) are each
// answered once, in order. (A loop answering such a request before it had
// taken the request's bytes off the connection's buffer read the same
// request again, answered it again and again, and then panicked slicing
// the buffer the nested call had given back.)
func TestPipelinedRefusalsAnsweredOnce(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		f, res := pathEchoProxy(t, loops, nil)
		res.PlaceRoute("/counter/nobody", proxy.Route{}) // placed on no session: 503 no_worker
		noWorker := "503 " + errBody("no worker serves the namespace", "")
		c := dial(t, f.addr)
		var b strings.Builder
		var want []string
		for i := range 4 {
			b.WriteString("GET /counter/nobody/" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: h\r\n\r\n")
			want = append(want, noWorker)
			b.WriteString("GET /counter/x/" + strconv.Itoa(i) + " HTTP/1.1\r\nHost: h\r\n\r\n")
			want = append(want, "200 /counter/x/"+strconv.Itoa(i))
		}
		b.WriteString("GET /counter/nobody/end HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		want = append(want, noWorker)
		if _, err := io.WriteString(c, b.String()); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, c); !slices.Equal(got, want) {
			t.Errorf("answers:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// A head that arrives pipelined behind a request, and never completes, gets
// 408 once HeaderTimeout has passed, like any other head. (A loop left
// such a connection without a timer after answering the request before it.)
func TestPipelinedPartialHeadTimesOut(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		f, _ := pathEchoProxy(t, loops, func(c *proxy.Config) { c.HeaderTimeout = 300 * time.Millisecond })
		c := dial(t, f.addr)
		if _, err := io.WriteString(c, "GET /counter/x/1 HTTP/1.1\r\nHost: h\r\n\r\nGET /counter/x/2 HTTP/1.1\r\nHo"); err != nil {
			t.Fatal(err)
		}
		want := []string{"200 /counter/x/1", "408 " + errBody("request head not received in time", "")}
		if got := readAll(t, c); !slices.Equal(got, want) {
			t.Errorf("answers %q; want %q", got, want)
		}
	})
}

// coldStatic is a Static whose cache always misses: every route comes from
// Resolve, as for an id no request has touched lately.
type coldStatic struct{ *proxytest.Static }

func (coldStatic) Lookup([]byte, time.Time) (proxy.Route, bool) { return proxy.Route{}, false }

// A head announcing a body longer than the holder accepts
// (Session.MaxBodyBytes) gets 413 naming the holder's limit before any
// byte of the body: with Expect: 100-continue, no 100 Continue comes first
// (the name is resolved to learn the holder); without, the 413 comes at
// once when the holder is known, without waiting for a body the client may
// never send. The proxy's own limit is refused the same way.
func TestBodyOverLimitRefusedBeforeBody(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		s := w.session("s", "k")
		s.MaxBodyBytes = 4 << 20
		warm := proxytest.NewStatic()
		warm.PlaceNamespace("/counter", s)
		cold := coldStatic{proxytest.NewStatic()}
		cold.PlaceNamespace("/counter", s)
		// HeaderTimeout is far beyond the test's patience: an answer that
		// comes at all came without waiting for the body.
		long := func(c *proxy.Config) { c.HeaderTimeout = time.Minute; c.MaxRequestBodySize = 8 << 20 }
		fw, fc := startProxy(t, loops, warm, long), startProxy(t, loops, cold, long)
		overHolder := "413 " + errBody("request body larger than the worker accepts (4194304 bytes)", "body")
		overProxy := "413 " + errBody("request body larger than 8388608 bytes", "body")
		post := func(cl, extra string) string {
			return "POST /counter/x/upload HTTP/1.1\r\nHost: h\r\n" + extra + "Content-Length: " + cl + "\r\n\r\n"
		}
		for _, tc := range []struct {
			name string
			f    *front
			req  string
			want string
		}{
			{"expect, holder cached", fw, post("5000000", "Expect: 100-continue\r\n"), overHolder},
			{"expect, holder resolved", fc, post("5000000", "Expect: 100-continue\r\n"), overHolder},
			{"no body sent, holder cached", fw, post("5000000", ""), overHolder},
			{"expect, over the proxy's limit", fc, post("9000000", "Expect: 100-continue\r\n"), overProxy},
			{"no body sent, over the proxy's limit", fc, post("9000000", ""), overProxy},
		} {
			c := dial(t, tc.f.addr)
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			got := readAll(t, c) // the proxy closes after its refusal
			_ = c.Close()
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("%s: answers %q; want only %q (no 100 Continue before it)", tc.name, got, tc.want)
			}
		}
		if n := len(w.requests()); n != 0 {
			t.Errorf("worker saw %d requests; want none", n)
		}
	})
}

// A body that does not come in time gets 408 naming the body, not the
// head: announced and never sent (short enough to be read with the head,
// or long enough to stream), or stopped part way. A head that does not
// come in time still gets 408 naming the head; a connection that sends
// nothing at all gets that too on the fasthttp engine (a loop closes it
// without a word, as an idle keep-alive connection).
func TestBodyNotReceivedInTime(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w := startWorker(t, nil)
		f := startProxy(t, loops, newStatic(w), func(c *proxy.Config) {
			c.HeaderTimeout = 300 * time.Millisecond
			c.StreamIdleTimeout = 300 * time.Millisecond
		})
		bodyLate := "408 " + errBody("request body not received in time", "body")
		headLate := "408 " + errBody("request head not received in time", "")
		post := func(cl int, body string) string {
			return "POST /counter/x/upload HTTP/1.1\r\nHost: h\r\nContent-Length: " + strconv.Itoa(cl) + "\r\n\r\n" + body
		}
		silent := headLate
		if loops > 0 {
			silent = ""
		}
		for _, tc := range []struct {
			name, req, want string
		}{
			{"short body never sent", post(1000, ""), bodyLate},
			{"short body cut off", post(1000, strings.Repeat("x", 10)), bodyLate},
			{"long body never sent", post(100_000, ""), bodyLate},
			{"long body cut off", post(100_000, strings.Repeat("x", 20<<10)), bodyLate},
			{"head cut off", "POST /counter/x/upload HTTP/1.1\r\nHost: h\r\nContent-Le", headLate},
			{"nothing sent", "", silent},
		} {
			c := dial(t, f.addr)
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			got := readAll(t, c)
			_ = c.Close()
			if want := []string{tc.want}; tc.want == "" && len(got) != 0 || tc.want != "" && !slices.Equal(got, want) {
				t.Errorf("%s: answers %q; want %q", tc.name, got, tc.want)
			}
		}
	})
}

// Requests pipelined in one write longer than a connection's buffer are
// all answered, in order, each with its own marker: what a read brings
// beyond the request it completes is kept whole for the requests after it.
// (A loop read up to 64 KiB into its scratch buffer but kept what followed
// the first request in a connection buffer of MaxHeaderBytes +
// ReplayBodyMax, 32 KiB by default: the bytes beyond were dropped, and the
// requests after them were read from a stream with a hole in it.)
func TestLongPipelineKeptWhole(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		f, _ := pathEchoProxy(t, loops, nil)
		c := dial(t, f.addr)
		var b strings.Builder
		var want []string
		pad := "X-Pad: " + strings.Repeat("p", 200) + "\r\n"
		for i := range 300 { // about 75 KB
			path := "/counter/x/" + strconv.Itoa(i)
			b.WriteString("GET " + path + " HTTP/1.1\r\nHost: h\r\n" + pad + "\r\n")
			want = append(want, "200 "+path)
		}
		b.WriteString("GET /counter/x/end HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
		want = append(want, "200 /counter/x/end")
		go func() { _, _ = io.WriteString(c, b.String()) }()
		if got := readAll(t, c); !slices.Equal(got, want) {
			t.Errorf("%d answers, want %d; first difference at %d", len(got), len(want), firstDiff(got, want))
		}
	})
}

// firstDiff returns the index of the first element where a and b differ.
func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
