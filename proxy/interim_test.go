package proxy_test

import (
	"bytes"
	"mime/multipart"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/proxy"
	"github.com/pinned-go/pinned/proxy/proxytest"
)

// proxyTo starts a proxy whose "/counter" namespace goes to addr.
func proxyTo(t *testing.T, loops int, addr string, mutate func(*proxy.Config)) *front {
	t.Helper()
	res := proxytest.NewStatic()
	res.PlaceNamespace("/counter", &proxy.Session{ID: "s", Secret: "k", AdvertiseURL: "http://" + addr})
	return startProxy(t, loops, res, mutate)
}

// Interim 1xx responses are not relayed; the final one is
// (reverseproxy_test.go: Test1xxResponses).
func TestInterimResponsesDropped(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		addr, _ := rawWorker(t, "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"+
			"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		f := proxyTo(t, loops, addr, nil)
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") || strings.Contains(resp, "Link:") || !strings.HasSuffix(resp, "ok") {
			t.Errorf("response %q", resp)
		}
	})
}

// A worker that sends 100 Continue and then hangs up does not hang the
// request (reverseproxy_test.go: TestReverseProxyInvalidUpstream100ContinueDoNotHang;
// a worker that stays silent is TestNoHang).
func TestInterimThenSilenceDoesNotHang(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		addr, _ := rawWorker(t, "HTTP/1.1 100 Continue\r\n\r\n")
		f := proxyTo(t, loops, addr, func(c *proxy.Config) { c.ResponseHeaderTimeout = 300 * time.Millisecond })
		start := time.Now()
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 502") && !strings.HasPrefix(resp, "HTTP/1.1 504") {
			t.Errorf("response %q; want 502 or 504", resp)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Errorf("took %v", el)
		}
	})
}

// A trailer the worker did not announce still reaches the client
// (reverseproxy_test.go: TestUnannouncedTrailer).
func TestUnannouncedTrailer(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		addr, _ := rawWorker(t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"3\r\nabc\r\n0\r\nX-Unannounced: 1\r\n\r\n")
		f := proxyTo(t, loops, addr, nil)
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.Contains(resp, "abc\r\n") || !strings.HasSuffix(resp, "0\r\nX-Unannounced: 1\r\n\r\n") {
			t.Errorf("response %q", resp)
		}
	})
}

// Empty and odd Connection options strip nothing they should not
// (reverseproxy_test.go: TestReverseProxyStripEmptyConnection).
func TestEmptyConnectionOptions(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		w, f, _, _ := setup(t, loops, nil)
		resp := raw(t, f.addr, "GET /counter/a HTTP/1.1\r\nHost: h\r\nConnection: , ,\t,keep-alive,\r\nConnection: Host, Content-Length\r\nX-Keep: 1\r\n\r\n")
		if !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Fatalf("response %q", resp)
		}
		r := w.last()
		if r.get("Host") != "h" || r.get("X-Keep") != "1" || r.get("Connection") != "" {
			t.Errorf("worker got %v", r.headers)
		}
	})
}

// A multipart body is not parsed by the proxy (DisablePreParseMultipartForm):
// the worker gets the bytes the client sent.
func TestMultipartPassedThrough(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", "a.bin")
		_, _ = fw.Write(bytes.Repeat([]byte{0, 1, 2, 3}, 5000))
		_ = mw.WriteField("k", "v")
		_ = mw.Close()
		var got []byte
		_, f, _, _ := setupWorkerServer(t, loops, func(ctx *fasthttp.RequestCtx) {
			got = append([]byte(nil), mustRead(ctx)...)
		}, func(s *fasthttp.Server) { s.DisablePreParseMultipartForm = true })
		resp := raw(t, f.addr, "POST /counter/a HTTP/1.1\r\nHost: h\r\nContent-Type: "+mw.FormDataContentType()+
			"\r\nContent-Length: "+itoa(body.Len())+"\r\n\r\n"+body.String())
		if !strings.HasPrefix(resp, "HTTP/1.1 200") {
			t.Fatalf("response %q", resp)
		}
		if !bytes.Equal(got, body.Bytes()) {
			t.Errorf("worker got %d bytes; want the %d the client sent", len(got), body.Len())
		}
	})
}

// HEAD, 204 and 304 responses carry no body; HEAD keeps the length.
func TestBodilessResponses(t *testing.T) {
	bothEngines(t, func(t *testing.T, loops int) {
		_, f, _, _ := setup(t, loops, func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case "/counter/a/204":
				ctx.SetStatusCode(204)
			case "/counter/a/304":
				ctx.SetStatusCode(304)
			default:
				ctx.SetBodyString("twelve bytes")
			}
		})
		resp := raw(t, f.addr, "HEAD /counter/a HTTP/1.1\r\nHost: h\r\n\r\n")
		if !strings.Contains(resp, "Content-Length: 12") || !strings.HasSuffix(resp, "\r\n\r\n") {
			t.Errorf("HEAD: %q", resp)
		}
		for _, code := range []string{"204", "304"} {
			resp := raw(t, f.addr, "GET /counter/a/"+code+" HTTP/1.1\r\nHost: h\r\n\r\n")
			if !strings.HasPrefix(resp, "HTTP/1.1 "+code) || !strings.HasSuffix(resp, "\r\n\r\n") {
				t.Errorf("%s: %q", code, resp)
			}
		}
	})
}

func mustRead(ctx *fasthttp.RequestCtx) []byte {
	var b bytes.Buffer
	_, _ = b.ReadFrom(ctx.RequestBodyStream())
	return b.Bytes()
}

func itoa(n int) string { return strconv.Itoa(n) }
