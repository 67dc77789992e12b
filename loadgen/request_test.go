package loadgen

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestRawRequestRender: what the event loops write is a valid HTTP/1.1
// request (net/http parses it) with the id in method, path and body, the
// configured headers, a Host field and an exact Content-Length.
func TestRawRequestRender(t *testing.T) {
	f := func(s Scenario, headers []Header, id string, check func(*http.Request, []byte, int64)) {
		t.Helper()
		if err := s.normalize("/c/{id}/"); err != nil {
			t.Fatal(err)
		}
		r := newRawRequest(&s, "example.test:8080", headers)
		buf, n := r.render(nil, []byte(id), -1)
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(buf)))
		if err != nil {
			t.Fatalf("%q is not a request net/http reads: %v", buf, err)
		}
		body, _ := io.ReadAll(req.Body)
		check(req, body, n)
	}
	f(Scenario{}, []Header{{"X-Bench", "1"}}, "id7", func(req *http.Request, body []byte, n int64) {
		if req.Method != "GET" || req.RequestURI != "/c/id7/" || req.Host != "example.test:8080" || req.Header.Get("X-Bench") != "1" || n != 0 || len(body) != 0 {
			t.Errorf("GET: %s %s host %q headers %v body %q (%d)", req.Method, req.RequestURI, req.Host, req.Header, body, n)
		}
		if len(req.Header.Values("User-Agent")) != 0 || req.ContentLength != 0 {
			t.Errorf("GET carries fields nobody asked for: %v", req.Header)
		}
	})
	f(Scenario{Kind: KindPost, Method: "PUT{id}", Path: "/k/{id}/{id}", Body: `{"id":"{id}","n":1}`, Headers: map[string]string{"Content-Type": "application/json"}},
		nil, "abc", func(req *http.Request, body []byte, n int64) {
			if req.Method != "PUTabc" || req.RequestURI != "/k/abc/abc" || string(body) != `{"id":"abc","n":1}` || n != int64(len(body)) || req.ContentLength != n ||
				req.Header.Get("Content-Type") != "application/json" {
				t.Errorf("templated PUT: %s %s body %q n %d CL %d", req.Method, req.RequestURI, body, n, req.ContentLength)
			}
		})
	f(Scenario{Kind: KindPost, BodySize: 10}, []Header{{"host", "other.test"}}, "x", func(req *http.Request, body []byte, n int64) {
		if string(body) != "abcdefghij" || n != 10 || req.Host != "other.test" {
			t.Errorf("generated POST: body %q n %d host %q (a Host header replaces the URL's)", body, n, req.Host)
		}
	})
	// A large static body and an upload are written after the head, from
	// shared memory: the head announces them.
	big := strings.Repeat("z", maxInlineBody+1)
	s := Scenario{Kind: KindPost, Body: big}
	_ = s.normalize("/")
	r := newRawRequest(&s, "h", nil)
	head, n := r.render(nil, []byte("i"), -1)
	if n != int64(len(big)) || string(r.shared) != big || !bytes.HasSuffix(head, []byte("Content-Length: 16385\r\n\r\n")) {
		t.Errorf("large body: n %d, shared %d bytes, head %q", n, len(r.shared), head)
	}
	s = Scenario{Kind: KindUpload, BodySize: 1 << 30}
	_ = s.normalize("/")
	r = newRawRequest(&s, "h", nil)
	if head, n = r.render(nil, []byte("i"), -1); n != 1<<30 || r.stream != 1<<30 || !bytes.HasSuffix(head, []byte("Content-Length: 1073741824\r\n\r\n")) {
		t.Errorf("upload: n %d stream %d head %q", n, r.stream, head)
	}
}
