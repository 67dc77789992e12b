package loadgen

import (
	"io"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// executor performs one scenario's requests for one worker. It is owned by
// that worker: no method is called concurrently.
type executor interface {
	// exec performs one request for id and fills o (reset by the caller).
	exec(id []byte, o *outcome)
	// close releases the executor's connections, if it holds any.
	close()
}

// httpExec runs get, post, download and upload scenarios on a shared
// HostClient, reusing one Request and Response.
type httpExec struct {
	hc     *fasthttp.HostClient
	kind   Kind
	size   int64
	method template
	tmpl   template
	req    fasthttp.Request
	resp   fasthttp.Response
	uri    []byte
	meth   []byte    // the method rendered, when it has a placeholder
	btmpl  template  // post: the body template
	body   []byte    // post: the body (rendered per request when it has a placeholder)
	gen    genReader // upload: the streamed body
	buf    []byte    // download: the read buffer
}

// downloadBufSize is the read size for streamed responses.
const downloadBufSize = 32 << 10

func newHTTPExec(hc *fasthttp.HostClient, base string, s *Scenario, headers []Header) *httpExec {
	e := &httpExec{hc: hc, kind: s.Kind, size: s.BodySize, method: newTemplate(s.Method), tmpl: newTemplate(s.Path).withPrefix(base)}
	e.req.Header.SetMethod(s.Method)
	for _, h := range headers {
		e.req.Header.Add(h.Name, h.Value)
	}
	for _, k := range sortedHeaderNames(s.Headers) {
		e.req.Header.Add(k, s.Headers[k])
	}
	switch s.Kind {
	case KindPost:
		if s.Body != "" {
			e.btmpl = newTemplate(s.Body)
			e.body = e.btmpl.appendTo(nil, nil)
			break
		}
		e.body = make([]byte, s.BodySize)
		fillPattern(e.body, 0)
	case KindDownload:
		e.buf = make([]byte, downloadBufSize)
	}
	return e
}

func (e *httpExec) exec(id []byte, o *outcome) {
	e.uri = e.tmpl.appendTo(e.uri[:0], id)
	e.req.SetRequestURIBytes(e.uri)
	if e.method.hasID() {
		e.meth = e.method.appendTo(e.meth[:0], id)
		e.req.Header.SetMethodBytes(e.meth)
	}
	switch e.kind {
	case KindPost:
		if e.btmpl.hasID() {
			e.body = e.btmpl.appendTo(e.body[:0], id)
		}
		e.req.SetBodyRaw(e.body)
	case KindUpload:
		e.gen.reset(e.size)
		e.req.SetBodyStream(&e.gen, int(e.size))
	}
	e.resp.StreamBody = e.kind == KindDownload
	err := e.hc.Do(&e.req, &e.resp)
	switch e.kind {
	case KindPost:
		if err == nil {
			o.sent = int64(len(e.body))
		}
	case KindUpload:
		o.sent = e.gen.off
	}
	if err != nil {
		o.err = err
		return
	}
	o.status = e.resp.StatusCode()
	if o.status < 200 || o.status > 299 {
		o.reason = e.resp.Header.Peek(wire.HeaderReason)
	}
	if e.kind != KindDownload {
		o.recv = int64(len(e.resp.Body()))
		return
	}
	o.recv, o.err = e.drain()
}

// drain reads and discards a streamed response body.
func (e *httpExec) drain() (n int64, err error) {
	if s := e.resp.BodyStream(); s != nil {
		for {
			m, rerr := s.Read(e.buf)
			n += int64(m)
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				err = rerr
				break
			}
		}
	} else {
		n = int64(len(e.resp.Body()))
	}
	if cerr := e.resp.CloseBodyStream(); err == nil && cerr != nil {
		err = cerr
	}
	return n, err
}

func (e *httpExec) close() {}

// patternBlock is the repeating content of generated bodies: printable, so
// a captured request is readable.
var patternBlock = func() (b [32 << 10]byte) {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	for i := range b {
		b[i] = alphabet[i%len(alphabet)]
	}
	return b
}()

// fillPattern fills p with the pattern as if p started at offset off.
func fillPattern(p []byte, off int64) {
	for len(p) > 0 {
		o := int(off % int64(len(patternBlock)))
		n := copy(p, patternBlock[o:])
		p = p[n:]
		off += int64(n)
	}
}

// genReader generates a body of a set size without holding it.
type genReader struct {
	off, size int64
}

func (g *genReader) reset(size int64) { g.off, g.size = 0, size }

func (g *genReader) Read(p []byte) (int, error) {
	left := g.size - g.off
	if left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > left {
		p = p[:left]
	}
	fillPattern(p, g.off)
	g.off += int64(len(p))
	return len(p), nil
}
