//go:build !race

package proxy_test

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// The forward path allocates nothing per request once warm: head scan,
// route, resolve, field hygiene, worker round trip, response, whether the
// response body is buffered or streamed. The count covers the whole process
// (client and worker are fasthttp and allocate nothing either), so any
// allocation the proxy adds fails it.
func TestForwardAllocs(t *testing.T) {
	for _, size := range []int{16, 32 << 10, 256 << 10} { // buffered, buffered, streamed
		m := newInmem(t, make([]byte, size))
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://front/counter/alice/incr?x=1")
		req.Header.Set("Cookie", "a=1")
		req.Header.Set("X-Forwarded-For", "6.6.6.6")
		for i := 0; i < 100; i++ { // warm the pools
			get(t, m.via, req, resp, size)
		}
		if n := testing.AllocsPerRun(500, func() { get(t, m.via, req, resp, size) }); n != 0 {
			t.Errorf("body of %d bytes: %v allocations per request; want 0", size, n)
		}
		post := fasthttp.AcquireRequest()
		post.SetRequestURI("http://front/counter/alice/incr")
		post.Header.SetMethod("POST")
		post.SetBodyString(`{"by":1}`)
		for i := 0; i < 100; i++ {
			get(t, m.via, post, resp, size)
		}
		// fasthttp's Server discards what is left of a streamed request
		// body after every handler with io.CopyN, whose LimitReader
		// escapes: one allocation in the proxy's server, one in the
		// worker's, even for a body read to its end (fasthttp v1.79
		// server.go, requestStream.discard). Nothing else may allocate.
		if n := testing.AllocsPerRun(500, func() { get(t, m.via, post, resp, size) }); n > 2 {
			t.Errorf("POST, response of %d bytes: %v allocations per request; want ≤ 2 (fasthttp's discards)", size, n)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseRequest(post)
		fasthttp.ReleaseResponse(resp)
		m.close()
	}
}
