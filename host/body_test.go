package host

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// serveTCP serves h on a real 127.0.0.1 listener with srv (its Handler set
// here) and returns the address. Cleanup stops both.
func serveTCP(t *testing.T, h *Host, srv *fasthttp.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Handler = h.Handler
	srv.Logger = discardLogger{}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		_ = srv.Shutdown()
		<-done
		_ = h.Close(t.Context())
	})
	return ln.Addr().String()
}

// post sends a POST with body to addr+path on a fresh connection, the
// whole request first and only then reading the answer, as most clients do.
func post(t *testing.T, addr, path string, body []byte, chunked bool) (int, wire.Error, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	req.Header.SetMethod("POST")
	if chunked {
		req.SetBodyStream(bytes.NewReader(body), -1)
	} else {
		req.SetBody(body)
	}
	bw := bufio.NewWriter(c)
	if err := req.Write(bw); err != nil {
		return 0, wire.Error{}, err
	}
	if err := bw.Flush(); err != nil {
		return 0, wire.Error{}, err
	}
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		return 0, wire.Error{}, err
	}
	var e wire.Error
	if resp.StatusCode() != 200 {
		if err := json.Unmarshal(resp.Body(), &e); err != nil || e.Error == "" {
			t.Errorf("%d answer %q is not a JSON wire.Error", resp.StatusCode(), resp.Body())
		}
	}
	return resp.StatusCode(), e, nil
}

// A body over the host's limit gets 413 with a JSON error whoever refuses
// it: the host (server limit above the host's), or the server ConfigureServer
// set up (whose limit is the host's) after draining the body, so a client
// that writes a 5 MB body before reading gets the 413, never a reset.
func TestBodyLimit(t *testing.T) {
	const limit = 64 << 10
	e := newEnv()
	h, err := New(Config{Namespace: "/p", Logger: quietLogger(), MaxRequestBodySize: limit}, e.typ())
	if err != nil {
		t.Fatal(err)
	}
	if h.MaxRequestBodySize() != limit {
		t.Fatalf("MaxRequestBodySize() = %d; want %d", h.MaxRequestBodySize(), limit)
	}
	srv := &fasthttp.Server{}
	if err := h.ConfigureServer(srv); err != nil {
		t.Fatal(err)
	}
	if srv.MaxRequestBodySize != limit || srv.ErrorHandler == nil {
		t.Fatalf("ConfigureServer left MaxRequestBodySize %d, ErrorHandler set %v; want %d and set", srv.MaxRequestBodySize, srv.ErrorHandler != nil, limit)
	}
	addr := serveTCP(t, h, srv)

	if code, _, err := post(t, addr, "/p/x/incr", make([]byte, limit), false); err != nil || code != 200 {
		t.Fatalf("a body of exactly the limit = %d, %v; want 200", code, err)
	}
	for _, size := range []int{limit + 1, 5 << 20} {
		for i := range 5 {
			code, e, err := post(t, addr, "/p/x/incr", make([]byte, size), false)
			if err != nil {
				t.Fatalf("%d-byte body, try %d: %v; want a 413, never a connection error", size, i, err)
			}
			if code != 413 || !strings.Contains(e.Error, "larger than") {
				t.Fatalf("%d-byte body = %d %+v; want 413 naming the limit", size, code, e)
			}
		}
	}
	if code, _, err := post(t, addr, "/p/x/incr", make([]byte, limit+100), true); err != nil || code != 413 {
		t.Fatalf("chunked body over the limit = %d, %v; want 413", code, err)
	}

	// A server whose limit is above the host's: the host refuses the
	// difference itself, and counts it.
	h2, err := New(Config{Namespace: "/p", Logger: quietLogger(), MaxRequestBodySize: limit}, newEnv().typ())
	if err != nil {
		t.Fatal(err)
	}
	srv2 := &fasthttp.Server{MaxRequestBodySize: 2 * limit}
	if err := h2.ConfigureServer(srv2); err != nil || srv2.MaxRequestBodySize != 2*limit {
		t.Fatalf("ConfigureServer on a larger server = %v, limit %d; want nil and the server's limit kept", err, srv2.MaxRequestBodySize)
	}
	addr2 := serveTCP(t, h2, srv2)
	if code, e, err := post(t, addr2, "/p/x/incr", make([]byte, limit+1), false); err != nil || code != 413 || !strings.Contains(e.Error, "65536") {
		t.Fatalf("a body between the host's and the server's limit = %d %+v %v; want the host's 413", code, e, err)
	}
	if n := h2.met.rejections[rejectIndex(rejectBodyTooLarge)].Get(); n != 1 {
		t.Errorf("pinned_rejections_total{reason=body_too_large} = %d; want 1", n)
	}
}

// ConfigureServer refuses a server that cannot keep the host's limit.
func TestConfigureServerRefuses(t *testing.T) {
	h, err := New(Config{Namespace: "/p", Logger: quietLogger(), MaxRequestBodySize: 1 << 20}, newEnv().typ())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(t.Context())
	for name, srv := range map[string]*fasthttp.Server{
		"smaller limit": {MaxRequestBodySize: 1000},
		"streaming":     {StreamRequestBody: true},
	} {
		before := srv.MaxRequestBodySize
		if err := h.ConfigureServer(srv); err == nil {
			t.Errorf("%s: ConfigureServer = nil; want an error", name)
		}
		if srv.MaxRequestBodySize != before || srv.ErrorHandler != nil {
			t.Errorf("%s: ConfigureServer changed the server although it refused it", name)
		}
	}
	if _, err := New(Config{Namespace: "/p", MaxRequestBodySize: -1}, newEnv().typ()); err == nil {
		t.Error("New with a negative MaxRequestBodySize = nil error")
	}
	// A default fasthttp.Server and a default host agree.
	d, err := New(Config{Namespace: "/p", Logger: quietLogger()}, newEnv().typ())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(t.Context())
	if d.MaxRequestBodySize() != fasthttp.DefaultMaxRequestBodySize {
		t.Errorf("default MaxRequestBodySize %d; want fasthttp's default %d", d.MaxRequestBodySize(), fasthttp.DefaultMaxRequestBodySize)
	}
}
