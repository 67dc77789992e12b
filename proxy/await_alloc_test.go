//go:build !race

package proxy_test

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// Over real TCP sockets the forward path (which then writes the request and
// awaits the response without an extra read) allocates nothing per request
// either; the count covers the whole process.
func TestForwardAllocsTCP(t *testing.T) {
	r := newTCPRig(t, make([]byte, 64), false)
	defer r.close()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + r.client.Addr + "/counter/alice/")
	for range 100 { // warm the pools
		get(t, r.client, req, resp, 64)
	}
	if n := testing.AllocsPerRun(500, func() { get(t, r.client, req, resp, 64) }); n != 0 {
		t.Errorf("%v allocations per request over TCP; want 0", n)
	}
}
