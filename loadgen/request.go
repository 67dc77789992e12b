package loadgen

import (
	"maps"
	"slices"
	"strconv"
	"strings"
)

// idPlaceholder is replaced by the request's id in method, path and body
// templates.
const idPlaceholder = "{id}"

// template is a string split at its "{id}" placeholders.
type template struct {
	parts []string // len = placeholders + 1
}

func newTemplate(s string) template {
	return template{parts: strings.Split(s, idPlaceholder)}
}

// withPrefix returns t with prefix prepended (a base URL before a path).
func (t template) withPrefix(prefix string) template {
	parts := append([]string(nil), t.parts...)
	parts[0] = prefix + parts[0]
	return template{parts: parts}
}

// appendTo appends the template with id substituted.
func (t *template) appendTo(dst, id []byte) []byte {
	dst = append(dst, t.parts[0]...)
	for _, p := range t.parts[1:] {
		dst = append(dst, id...)
		dst = append(dst, p...)
	}
	return dst
}

// size returns the rendered length for an id of idLen bytes.
func (t *template) size(idLen int) int {
	n := (len(t.parts) - 1) * idLen
	for _, p := range t.parts {
		n += len(p)
	}
	return n
}

// hasID reports whether the template uses the id at all.
func (t *template) hasID() bool { return len(t.parts) > 1 }

// static returns the template's text when it has no placeholder.
func (t *template) static() (string, bool) { return t.parts[0], !t.hasID() }

// maxInlineBody is the largest body the event loops render into a
// connection's write buffer; a larger body that does not depend on the id
// is written from the one shared copy, and a generated (upload) body is
// written from the pattern block.
const maxInlineBody = 16 << 10

// rawRequest renders one scenario's HTTP/1.1 requests for the event
// loops: "<method> <path> HTTP/1.1", Host, the headers, Content-Length and
// the body, into a connection's write buffer.
type rawRequest struct {
	method, path template
	fields       string   // "\r\nHost: ...\r\n<headers>" up to the framing field
	body         template // post: the body template (generated bodies are pre-rendered)
	shared       []byte   // a large body without placeholders, written from here
	stream       int64    // upload: generated body bytes streamed after the head
	head         bool     // method HEAD: the response has no body
	kind         Kind
}

// newRawRequest prepares scenario s for host (the Host field value).
func newRawRequest(s *Scenario, host string, headers []Header) *rawRequest {
	r := &rawRequest{method: newTemplate(s.Method), path: newTemplate(s.Path), kind: s.Kind, head: s.Method == "HEAD"}
	var f strings.Builder
	f.WriteString(" HTTP/1.1\r\n")
	hasHost := false
	all := append([]Header(nil), headers...)
	for _, k := range sortedHeaderNames(s.Headers) {
		all = append(all, Header{k, s.Headers[k]})
	}
	for _, h := range all {
		hasHost = hasHost || strings.EqualFold(h.Name, "Host")
	}
	if !hasHost {
		f.WriteString("Host: " + host + "\r\n")
	}
	for _, h := range all {
		f.WriteString(h.Name + ": " + h.Value + "\r\n")
	}
	r.fields = f.String()
	switch s.Kind {
	case KindPost:
		body := s.Body
		if body == "" {
			b := make([]byte, s.BodySize)
			fillPattern(b, 0)
			body = string(b)
		}
		r.body = newTemplate(body)
		if text, ok := r.body.static(); ok && len(text) > maxInlineBody {
			r.shared = []byte(text)
		}
	case KindUpload:
		r.stream = s.BodySize
	}
	return r
}

// render appends the request for id to dst and returns it with the number
// of body bytes the request carries (rendered into dst, or to be written
// from r.shared or the pattern block after dst). A seq of 0 or more is
// sent in a Trace-Seq field (Config.TraceFile).
func (r *rawRequest) render(dst, id []byte, seq int64) ([]byte, int64) {
	dst = r.method.appendTo(dst, id)
	dst = append(dst, ' ')
	dst = r.path.appendTo(dst, id)
	dst = append(dst, r.fields...)
	if seq >= 0 {
		dst = append(dst, traceSeqField+": "...)
		dst = strconv.AppendInt(dst, seq, 10)
		dst = append(dst, "\r\n"...)
	}
	var n int64
	switch {
	case r.kind == KindUpload:
		n = r.stream
	case r.shared != nil:
		n = int64(len(r.shared))
	case r.kind == KindPost:
		n = int64(r.body.size(len(id)))
	default:
		return append(dst, "\r\n"...), 0
	}
	dst = append(dst, "Content-Length: "...)
	dst = strconv.AppendInt(dst, n, 10)
	dst = append(dst, "\r\n\r\n"...)
	if r.kind == KindPost && r.shared == nil {
		dst = r.body.appendTo(dst, id)
	}
	return dst, n
}

// sortedHeaderNames returns a scenario's header names in a fixed order, so
// that requests are reproducible.
func sortedHeaderNames(h map[string]string) []string {
	return slices.Sorted(maps.Keys(h))
}
