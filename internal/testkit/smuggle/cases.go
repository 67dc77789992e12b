package smuggle

import (
	"strconv"
	"strings"
)

// Namespace is the namespace every request of the tables targets; the
// backend under test must serve it. Ids are "a" (and "b" for requests
// smuggled behind another).
const Namespace = "/counter"

// Request is one raw request (or pipelined sequence) the front end must
// refuse: answer Status, close the connection, and forward nothing.
type Request struct {
	// Name identifies the case in test output.
	Name string
	// Raw is sent as is on a fresh connection.
	Raw string
	// Status is the one acceptable status code.
	Status int
	// Why cites the rule or the source of the payload.
	Why string
	// Class groups the cases: the target-independent classes (framing,
	// field, chunk, size) apply to every path a server serves, not only to
	// proxied ones.
	Class Class
}

// Class is a group of request cases.
type Class string

// Classes of request cases.
const (
	ClassFraming Class = "framing" // Content-Length and Transfer-Encoding
	ClassField   Class = "field"   // field syntax
	ClassLine    Class = "line"    // the request line
	ClassHost    Class = "host"    // Host and absolute-form
	ClassChunk   Class = "chunk"   // chunked framing
	ClassSize    Class = "size"    // head limits
	ClassBody    Class = "body"    // the proxy's body limit
	ClassUpgrade Class = "upgrade" // Upgrade other than a WebSocket handshake
	ClassTarget  Class = "target"  // the id and the path after it
)

// AnyPath reports whether the case's fault is independent of its target,
// so that it applies as well with the target replaced by any other path.
func (c Request) AnyPath() bool {
	switch c.Class {
	case ClassFraming, ClassField, ClassChunk, ClassSize:
		return true
	}
	return false
}

// WithTarget returns the case with the "/counter/a" that starts its
// request target (the first one, in the request line) replaced by target.
func (c Request) WithTarget(target string) Request {
	c.Raw = strings.Replace(c.Raw, " /counter/a", " "+target, 1)
	return c
}

// Response is one raw answer from a backend that the front end must turn
// into a 502 without relaying any of it.
type Response struct {
	Name string
	// Raw is written by the backend after it has read a request head.
	Raw string
	Why string
}

// Control is a request that looks odd but is valid: the front end must
// forward it exactly once. It keeps the refusals honest (a front end that
// refused everything would pass the Request table).
type Control struct {
	Name string
	Raw  string
	// Body is the request body the backend must see.
	Body string
	Why  string
}

// Sources cited in Why.
const (
	rfc9112  = "RFC 9112"
	rfc9110  = "RFC 9110"
	probe    = "Http11Probe"
	haproxy  = "HAProxy http_transfer_encoding.vtc"
	garden   = "HTTP Garden"
	smuggler = "PortSwigger http-request-smuggler"
	policy   = "pinned policy"
)

// The smuggled request pipelined behind several cases: a front end that
// framed the first request differently from its backend would forward it.
const smuggled = "GET /counter/b HTTP/1.1\r\nHost: h\r\n\r\n"

// post starts a POST to /counter/a with Host: h and the given fields (each
// without its CRLF), ending the head.
func post(fields ...string) string {
	var b strings.Builder
	b.WriteString("POST /counter/a HTTP/1.1\r\nHost: h\r\n")
	for _, f := range fields {
		b.WriteString(f)
		b.WriteString("\r\n")
	}
	b.WriteString("\r\n")
	return b.String()
}

// get is a GET to /counter/a with Host: h and the given fields.
func get(fields ...string) string {
	return strings.Replace(post(fields...), "POST", "GET", 1)
}

// chunked is a chunked POST whose body is the given raw chunk bytes.
func chunked(body string, fields ...string) string {
	return post(append([]string{"Transfer-Encoding: chunked"}, fields...)...) + body
}

// Requests returns the request-side table: every case must get its Status
// and a closed connection, and the backend must see nothing. The slice is
// new on every call.
func Requests() []Request {
	const (
		bad      = 400
		tooLarge = 413
		tooBig   = 431
	)
	big := strings.Repeat("a", 1000)
	manyFields := func(n int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("X-F")
			b.WriteString(strconv.Itoa(i))
			b.WriteString(": v\r\n")
		}
		return strings.TrimSuffix(b.String(), "\r\n")
	}
	bigFields := func(total int) string {
		var b strings.Builder
		for i := 0; b.Len() < total; i++ {
			b.WriteString("X-Big")
			b.WriteString(strconv.Itoa(i))
			b.WriteString(": ")
			b.WriteString(big)
			b.WriteString("\r\n")
		}
		return strings.TrimSuffix(b.String(), "\r\n")
	}
	return []Request{
		// Content-Length together with Transfer-Encoding (RFC 9112 §6.1:
		// TE wins, the server must close; a proxy must not pass it on).
		{"CL.TE", post("Content-Length: 5", "Transfer-Encoding: chunked") + "0\r\n\r\n" + smuggled, bad, rfc9112 + " §6.1; " + probe + " SMUG-CL-TE", ClassFraming},
		{"TE.CL", post("Transfer-Encoding: chunked", "Content-Length: 5") + "0\r\n\r\n" + smuggled, bad, rfc9112 + " §6.1; " + probe + " SMUG-TE-CL", ClassFraming},
		{"CL 0 with TE", post("Content-Length: 0", "Transfer-Encoding: chunked") + "5\r\nabcde\r\n0\r\n\r\n", bad, rfc9112 + " §6.1", ClassFraming},
		{"CL.TE name case", post("content-length: 4", "tRANSFER-eNCODING: chunked") + "0\r\n\r\n", bad, probe + " SMUG-TE-CASE", ClassFraming},
		{"CL.TE value case", post("Content-Length: 4", "Transfer-Encoding: CHUNKED") + "0\r\n\r\n", bad, garden, ClassFraming},
		{"CL.TE with Expect", post("Expect: 100-continue", "Content-Length: 4", "Transfer-Encoding: chunked") + "0\r\n\r\n", bad, probe + " SMUG-EXPECT", ClassFraming},
		{"CL.TE xchunked", post("Content-Length: 4", "Transfer-Encoding: xchunked") + "0\r\n\r\n", bad, smuggler, ClassFraming},

		// Duplicate or malformed Content-Length (RFC 9110 §8.6, RFC 9112 §6.3).
		{"CL duplicate same", post("Content-Length: 3", "Content-Length: 3") + "abc", bad, rfc9112 + " §6.3; " + probe + " SMUG-DUPLICATE-CL", ClassFraming},
		{"CL duplicate differing", post("Content-Length: 3", "Content-Length: 4") + "abcd", bad, rfc9112 + " §6.3", ClassFraming},
		{"CL list same", post("Content-Length: 3, 3") + "abc", bad, rfc9110 + " §8.6 (a list is refused, not merged)", ClassFraming},
		{"CL list differing", post("Content-Length: 3, 4") + "abcd", bad, rfc9110 + " §8.6", ClassFraming},
		{"CL plus sign", post("Content-Length: +3") + "abc", bad, rfc9110 + " §8.6: 1*DIGIT; " + garden, ClassFraming},
		{"CL minus sign", post("Content-Length: -1") + "abc", bad, rfc9110 + " §8.6", ClassFraming},
		{"CL hex", post("Content-Length: 0x3") + "abc", bad, rfc9110 + " §8.6", ClassFraming},
		{"CL empty", post("Content-Length: ") + "abc", bad, garden + " (golang/go#61679)", ClassFraming},
		{"CL leading zeros", post("Content-Length: 003") + "abc", bad, policy + ": valid 1*DIGIT, refused as a parser-differential signal", ClassFraming},
		{"CL inner space", post("Content-Length: 1 0") + "0123456789", bad, rfc9110 + " §8.6", ClassFraming},
		{"CL trailing junk", post("Content-Length: 3abc") + "abc", bad, rfc9110 + " §8.6", ClassFraming},
		{"CL overflow", post("Content-Length: 99999999999999999999999") + "abc", bad, garden, ClassFraming},
		{"CL with vertical tab", post("Content-Length: 3\v") + "abc", bad, probe, ClassFraming},

		// Transfer codings other than exactly chunked (RFC 9112 §6.1, §6.3;
		// HAProxy refuses them with 400 too, except "gzip, chunked": 422).
		{"TE identity", post("Transfer-Encoding: identity", "Content-Length: 3") + "abc", bad, haproxy + "; RFC 7230 removed identity", ClassFraming},
		{"TE identity alone", post("Transfer-Encoding: identity") + "abc", bad, haproxy, ClassFraming},
		{"TE gzip", post("Transfer-Encoding: gzip") + "abc", bad, haproxy + ": chunked not final", ClassFraming},
		{"TE gzip, chunked", post("Transfer-Encoding: gzip, chunked") + "0\r\n\r\n", bad, haproxy + " (422 there; 400 here, see docs/proxy.md)", ClassFraming},
		{"TE chunked, gzip", post("Transfer-Encoding: chunked, gzip") + "0\r\n\r\n", bad, haproxy, ClassFraming},
		{"TE chunked, chunked", post("Transfer-Encoding: chunked, chunked") + "0\r\n\r\n", bad, haproxy, ClassFraming},
		{"TE chunked, identity", post("Transfer-Encoding: chunked, identity") + "0\r\n\r\n", bad, probe + " SMUG-TE-IDENTITY", ClassFraming},
		{"TE two fields", post("Transfer-Encoding: chunked", "Transfer-Encoding: chunked") + "0\r\n\r\n", bad, "fasthttp PR #2303", ClassFraming},
		{"TE two fields identity", post("Transfer-Encoding: chunked", "Transfer-Encoding: identity") + "0\r\n\r\n", bad, smuggler, ClassFraming},
		{"TE chunked;q=1", post("Transfer-Encoding: chunked;q=1") + "0\r\n\r\n", bad, rfc9112 + " §7: chunked has no parameters", ClassFraming},
		{"TE chunked parameter", post("Transfer-Encoding: chunked; foo=bar") + "0\r\n\r\n", bad, probe + " SMUG-TE-PARAM", ClassFraming},
		{"TE xchunked", post("Transfer-Encoding: xchunked") + "0\r\n\r\n", bad, smuggler, ClassFraming},
		{"TE chunkedx", post("Transfer-Encoding: chunkedx") + "0\r\n\r\n", bad, smuggler, ClassFraming},
		{"TE quoted", post(`Transfer-Encoding: "chunked"`) + "0\r\n\r\n", bad, smuggler, ClassFraming},
		{"TE empty", post("Transfer-Encoding: ") + "0\r\n\r\n", bad, probe + " SMUG-TE-EMPTY", ClassFraming},
		{"TE comma only", post("Transfer-Encoding: ,") + "0\r\n\r\n", bad, smuggler, ClassFraming},
		{"TE vertical tab", post("Transfer-Encoding: \vchunked") + "0\r\n\r\n", bad, smuggler, ClassFraming},
		{"TE form feed", post("Transfer-Encoding: \fchunked") + "0\r\n\r\n", bad, smuggler, ClassFraming},
		{"TE NUL", post("Transfer-Encoding: chunked\x00") + "0\r\n\r\n", bad, garden, ClassFraming},
		{"TE on HTTP/1.0", strings.Replace(post("Transfer-Encoding: chunked"), "HTTP/1.1", "HTTP/1.0", 1) + "0\r\n\r\n", bad, rfc9112 + " §6.1; fasthttp PR #2330", ClassFraming},
		{"TE and CL on HTTP/1.0", strings.Replace(post("Transfer-Encoding: chunked", "Content-Length: 5"), "HTTP/1.1", "HTTP/1.0", 1) + "0\r\n\r\n", bad, probe + " SMUG-TE-HTTP10", ClassFraming},

		// Field syntax (RFC 9112 §5, RFC 9110 §5.1).
		{"space before colon", post("Transfer-Encoding : chunked") + "0\r\n\r\n", bad, rfc9112 + " §5.1", ClassField},
		{"tab before colon", post("Transfer-Encoding\t: chunked") + "0\r\n\r\n", bad, rfc9112 + " §5.1", ClassField},
		{"space before colon CL", post("Content-Length : 3") + "abc", bad, rfc9112 + " §5.1", ClassField},
		{"space in name", get("X Foo: 1"), bad, rfc9110 + " §5.1", ClassField},
		{"empty name", get(": x"), bad, "golang/go#65244; fasthttp #1796", ClassField},
		{"no colon", get("NoColon"), bad, rfc9112 + " §5", ClassField},
		{"obs-fold", get("X-Long: a", "  b"), bad, rfc9112 + " §5.2 (reject, do not fold)", ClassField},
		{"obs-fold hides TE", post("X: y", " Transfer-Encoding: chunked", "Content-Length: 3") + "abc", bad, probe + " SMUG-OBS-FOLD", ClassField},
		{"obs-fold TE value", post("Transfer-Encoding:", " chunked") + "0\r\n\r\n", bad, garden, ClassField},
		{"leading space first field", "GET /counter/a HTTP/1.1\r\n Host: h\r\n\r\n", bad, rfc9112 + " §2.2", ClassField},
		{"bare CR in value", get("X: a\rb"), bad, rfc9112 + " §2.2", ClassField},
		{"bare CR in name", get("X\rY: 1"), bad, rfc9112 + " §2.2", ClassField},
		{"bare LF line end", "GET /counter/a HTTP/1.1\r\nHost: h\nX: 1\r\n\r\n", bad, rfc9112 + " §2.2 (MAY accept; refused)", ClassField},
		{"bare LF in value", "POST /counter/a HTTP/1.1\r\nHost: h\r\nX: a\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", bad, rfc9112 + " §2.2", ClassField},
		{"NUL in value", get("X: a\x00b"), bad, rfc9110 + " §5.5", ClassField},
		{"NUL in name", get("X\x00Y: 1"), bad, rfc9110 + " §5.1", ClassField},
		{"control char in value", get("X: a\x01b"), bad, rfc9110 + " §5.5", ClassField},
		{"DEL in name", get("X\x7fY: 1"), bad, rfc9110 + " §5.1", ClassField},
		{"non-token in name", get("X(Y): 1"), bad, rfc9110 + " §5.1", ClassField},

		// Request line (RFC 9112 §3).
		{"double space in request line", "GET  /counter/a HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9112 + " §3", ClassLine},
		{"tab in request line", "GET\t/counter/a HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9112 + " §3", ClassLine},
		{"space in target", "GET /counter/a b HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9112 + " §3", ClassLine},
		{"bare CR in target", "GET /counter/a\rb HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9112 + " §2.2", ClassLine},
		{"NUL in target", "GET /counter/a\x00 HTTP/1.1\r\nHost: h\r\n\r\n", bad, garden, ClassLine},
		{"bad version", "GET /counter/a HTTP/1.2x\r\nHost: h\r\n\r\n", bad, "fasthttp #1703", ClassLine},
		{"lowercase version", "GET /counter/a http/1.1\r\nHost: h\r\n\r\n", bad, rfc9112 + " §2.3", ClassLine},
		{"no version", "GET /counter/a\r\nHost: h\r\n\r\n", bad, rfc9112 + " §3 (no HTTP/0.9)", ClassLine},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", bad, "h2 prior knowledge on an HTTP/1 port", ClassLine},
		{"asterisk-form", "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", bad, policy + ": only origin- and absolute-form", ClassLine},
		{"CONNECT authority-form", "CONNECT h:80 HTTP/1.1\r\nHost: h:80\r\n\r\n", bad, policy, ClassLine},
		{"fragment in target", "GET /counter/a#x HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9112 + " §3.2", ClassLine},

		// Host (RFC 9112 §3.2).
		{"no Host", "GET /counter/a HTTP/1.1\r\n\r\n", bad, rfc9112 + " §3.2", ClassHost},
		{"two Host", get("Host: i"), bad, rfc9112 + " §3.2", ClassHost},
		{"Host list", "GET /counter/a HTTP/1.1\r\nHost: h, i\r\n\r\n", bad, rfc9112 + " §3.2", ClassHost},
		{"Host with userinfo", "GET /counter/a HTTP/1.1\r\nHost: u@h\r\n\r\n", bad, rfc9110 + " §7.2", ClassHost},
		{"Host with path", "GET /counter/a HTTP/1.1\r\nHost: h/x\r\n\r\n", bad, rfc9110 + " §7.2", ClassHost},
		{"Host with space", "GET /counter/a HTTP/1.1\r\nHost: h i\r\n\r\n", bad, rfc9110 + " §7.2", ClassHost},
		{"absolute-form host differs", "GET http://other/counter/a HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9112 + " §3.2.2", ClassHost},
		{"absolute-form port differs", "GET http://h:81/counter/a HTTP/1.1\r\nHost: h:80\r\n\r\n", bad, rfc9112 + " §3.2.2", ClassHost},
		{"absolute-form userinfo", "GET http://evil@h/counter/a HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9110 + " §4.2.4", ClassHost},

		// Chunked framing (RFC 9112 §7.1): the first chunk line is bad, so
		// the front end fails before any byte of the request leaves it.
		{"chunk size not hex", chunked("zz\r\nabc\r\n0\r\n\r\n"), bad, rfc9112 + " §7.1", ClassChunk},
		{"chunk size 0x", chunked("0x3\r\nabc\r\n0\r\n\r\n"), bad, "golang/go#64517 family; " + probe, ClassChunk},
		{"chunk size underscore", chunked("1_0\r\n0123456789abcdef\r\n0\r\n\r\n"), bad, garden, ClassChunk},
		{"chunk size plus", chunked("+3\r\nabc\r\n0\r\n\r\n"), bad, garden, ClassChunk},
		{"chunk size minus", chunked("-3\r\nabc\r\n0\r\n\r\n"), bad, garden, ClassChunk},
		{"chunk size empty", chunked("\r\nabc\r\n0\r\n\r\n"), bad, "golang/go#64517", ClassChunk},
		{"chunk size leading space", chunked(" 3\r\nabc\r\n0\r\n\r\n"), bad, garden, ClassChunk},
		{"chunk size overflow", chunked("fffffffffffffffff1\r\nabc\r\n0\r\n\r\n"), bad, garden, ClassChunk},
		{"chunk size bare LF", chunked("3\nabc\r\n0\r\n\r\n"), bad, "CVE-2025-22871", ClassChunk},
		{"chunk extension bare LF", chunked("3;x\nabc\r\n0\r\n\r\n"), bad, "fasthttp PR #1899", ClassChunk},
		{"chunk extension bare CR", chunked("3;x\ry\r\nabc\r\n0\r\n\r\n"), bad, rfc9112 + " §2.2", ClassChunk},
		{"last chunk bare LF", chunked("0\n\r\n" + smuggled), bad, "CVE-2025-22871", ClassChunk},

		// Sizes (RFC 6585 §5: 431; RFC 9110 §15.5.14: 413).
		{"head over 64 KiB", get(bigFields(65 << 10)), tooBig, "pinned: any head beyond the largest limit an operator may set", ClassSize},
		{"head over limit", get(bigFields(17 << 10)), tooBig, "proxy.Config.MaxHeaderBytes", ClassSize},
		{"too many fields", get(manyFields(200)), tooBig, "proxy.Config.MaxHeaderFields", ClassSize},
		{"target over limit", "GET /counter/a/" + strings.Repeat("x", 17<<10) + " HTTP/1.1\r\nHost: h\r\n\r\n", tooBig, "proxy.Config.MaxHeaderBytes", ClassSize},
		{"body over limit", post("Content-Length: 999999999999") + strings.Repeat("x", 8<<10), tooLarge, "proxy.Config.MaxRequestBodySize (after fasthttp's 8 KiB prefetch)", ClassBody},
		{"body over limit with Expect", post("Content-Length: 999999999999", "Expect: 100-continue"), tooLarge, rfc9110 + " §10.1.1", ClassBody},

		// Upgrades: only a proper WebSocket handshake.
		{"h2c upgrade", get("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"), bad, "BishopFox h2csmuggler", ClassUpgrade},
		{"h2c upgrade without settings", get("Connection: Upgrade", "Upgrade: h2c"), bad, "BishopFox h2csmuggler", ClassUpgrade},
		{"h2c on OPTIONS", strings.Replace(get("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA"), "GET", "OPTIONS", 1), bad, "BishopFox h2csmuggler", ClassUpgrade},
		{"websocket and h2c", get("Connection: Upgrade", "Upgrade: websocket, h2c"), bad, policy, ClassUpgrade},
		{"two Upgrade fields", get("Connection: Upgrade", "Upgrade: websocket", "Upgrade: h2c"), bad, policy, ClassUpgrade},
		{"TLS upgrade", get("Connection: Upgrade", "Upgrade: TLS/1.0"), bad, rfc9110 + " §7.8", ClassUpgrade},
		{"websocket without Connection", get("Upgrade: websocket", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="), bad, "RFC 6455 §4.1", ClassUpgrade},
		{"websocket on POST", post("Connection: Upgrade", "Upgrade: websocket", "Content-Length: 0"), bad, "RFC 6455 §4.1", ClassUpgrade},
		{"websocket on HTTP/1.0", strings.Replace(get("Connection: Upgrade", "Upgrade: websocket"), "HTTP/1.1", "HTTP/1.0", 1), bad, "RFC 6455 §4.1", ClassUpgrade},

		// The id and the path after it: nothing is decoded, nothing may
		// climb out of /<ns>/<id> once a backend decodes and normalises.
		{"id %2F", "GET /counter/a%2Fb HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id %2f lower", "GET /counter/a%2fb HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id %2e%2e", "GET /counter/%2e%2e/registry HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id %2E%2E", "GET /counter/%2E%2E HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id %5C", "GET /counter/a%5Cb HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id %00", "GET /counter/a%00 HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id %252F", "GET /counter/a%252Fb HTTP/1.1\r\nHost: h\r\n\r\n", bad, "GO-2026-4950 (double encoding)", ClassTarget},
		{"id %61 (encoded letter)", "GET /counter/%61 HTTP/1.1\r\nHost: h\r\n\r\n", bad, policy + ": no escapes in ids", ClassTarget},
		{"id semicolon", "GET /counter/a;b HTTP/1.1\r\nHost: h\r\n\r\n", bad, "path parameters (Tomcat/Spring)", ClassTarget},
		{"id dot-dot", "GET /counter/../registry/workers HTTP/1.1\r\nHost: h\r\n\r\n", bad, rfc9110 + " §4.2.4", ClassTarget},
		{"id dot", "GET /counter/./a HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"empty id", "GET /counter//a HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"empty namespace", "GET //counter/a HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id backslash", "GET /counter/a\\..\\b HTTP/1.1\r\nHost: h\r\n\r\n", bad, "IIS-style separators", ClassTarget},
		{"id non-ASCII", "GET /counter/\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
		{"id too long", "GET /counter/" + strings.Repeat("a", 300) + " HTTP/1.1\r\nHost: h\r\n\r\n", bad, "wire.MaxIDLen", ClassTarget},
		{"rest ..%2F", "GET /counter/a/..%2F..%2Fother/b HTTP/1.1\r\nHost: h\r\n\r\n", bad, policy + ": the path is forwarded as sent, so no dot segment may reach a worker that would resolve it", ClassTarget},
		{"rest dot-dot", "GET /counter/a/../b HTTP/1.1\r\nHost: h\r\n\r\n", bad, policy + ": the path is forwarded as sent, so no dot segment may reach a worker that would resolve it", ClassTarget},
		{"rest %2e%2e", "GET /counter/a/%2e%2e/b HTTP/1.1\r\nHost: h\r\n\r\n", bad, policy + ": the path is forwarded as sent, so no dot segment may reach a worker that would resolve it", ClassTarget},
		{"rest %25 double encoding", "GET /counter/a/%252e%252e/b HTTP/1.1\r\nHost: h\r\n\r\n", bad, "GO-2026-4950", ClassTarget},
		{"rest truncated escape", "GET /counter/a/x% HTTP/1.1\r\nHost: h\r\n\r\n", bad, garden, ClassTarget},
		{"namespace %2F", "GET /count%2Fer/a HTTP/1.1\r\nHost: h\r\n\r\n", bad, "pinned's id grammar (wire.CheckSegment, docs/protocol.md)", ClassTarget},
	}
}

// Controls returns valid requests that resemble the refused ones; each must
// reach the backend exactly once with Body.
func Controls() []Control {
	return []Control{
		{"plain GET", "GET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n", "", ""},
		{"TE chunked upper case", post("Transfer-Encoding: CHUNKED") + "3\r\nabc\r\n0\r\n\r\n", "abc", "codings are case-insensitive (RFC 9112 §7)"},
		{"TE name case", post("tRANSFER-eNCODING: chunked") + "3\r\nabc\r\n0\r\n\r\n", "abc", "field names are case-insensitive"},
		{"TE with OWS", post("Transfer-Encoding: \tchunked ") + "3\r\nabc\r\n0\r\n\r\n", "abc", "OWS around a value is not part of it"},
		{"CL with OWS", post("Content-Length:\t3 ") + "abc", "abc", "OWS around a value is not part of it"},
		{"CL zero", post("Content-Length: 0"), "", ""},
		{"chunk extension", chunked("3;name=value\r\nabc\r\n0\r\n\r\n"), "abc", "RFC 9112 §7.1.1: ignored"},
		{"chunk extension quoted", chunked("3;name=\"v;x\"\r\nabc\r\n0\r\n\r\n"), "abc", "RFC 9112 §7.1.1: quoted-string value"},
		{"chunk size upper hex", chunked("A\r\n0123456789\r\n0\r\n\r\n"), "0123456789", "HEXDIG is case-insensitive"},
		{"chunk trailer", chunked("3\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n"), "abc", "RFC 9112 §7.1.2"},
		{"absolute-form same host", "GET http://h/counter/a HTTP/1.1\r\nHost: h\r\n\r\n", "", "RFC 9112 §3.2.2"},
		{"leading empty line", "\r\nGET /counter/a HTTP/1.1\r\nHost: h\r\n\r\n", "", "RFC 9112 §2.2: SHOULD ignore one CRLF"},
		{"id with allowed punctuation", "GET /counter/a.b_c~d@e:f+g=h-i HTTP/1.1\r\nHost: h\r\n\r\n", "", "wire.CheckSegment"},
		{"escape in query", "GET /counter/a?x=%2F%2e%2e HTTP/1.1\r\nHost: h\r\n\r\n", "", "the query is not inspected"},
		{"HTTP/1.0 without Host", "GET /counter/a HTTP/1.0\r\n\r\n", "", "Host is required of HTTP/1.1 only"},
	}
}

// Tolerated returns requests that RFC 9112 calls invalid or discouraged but
// that the front end cannot refuse, because fasthttp's parser consumes the
// offending bytes where the proxy's raw scan never sees them (the request
// line, chunk extensions). fasthttp reads each of them one way only, and
// the backend receives the request regenerated: exactly once, clean, with
// Body. They are listed so that the tolerance is tested, not assumed.
func Tolerated() []Control {
	return []Control{
		{"bare LF ending the request line", "GET /counter/a HTTP/1.1\nHost: h\r\n\r\n", "", rfc9112 + " §2.2 (MAY)"},
		{"chunk extension with NUL", chunked("3;x=\x00\r\nabc\r\n0\r\n\r\n"), "abc", "extensions are dropped, never forwarded"},
		{"chunk extension without name", chunked("3;\r\nabc\r\n0\r\n\r\n"), "abc", "extensions are dropped, never forwarded"},
	}
}

// LateChunkErrors returns chunked bodies whose first chunk is well formed
// and whose framing breaks afterwards. The proxy streams chunked bodies, so
// the backend has already received the head and the first chunk; the front
// end must answer 400 and close, and the backend's read of the body must
// fail: it never sees a complete body, nor the request pipelined behind.
func LateChunkErrors() []Control {
	return []Control{
		{"chunk data bare LF", chunked("3\r\nabc\n0\r\n\r\n" + smuggled), "", rfc9112 + " §7.1"},
		{"chunk data too long", chunked("3\r\nabcdef\r\n0\r\n\r\n" + smuggled), "", rfc9112 + " §7.1"},
		{"chunk data too short", chunked("5\r\nabc\r\n0\r\n\r\n" + smuggled), "", rfc9112 + " §7.1; " + probe},
		{"second chunk size bad", chunked("3\r\nabc\r\nzz\r\n0\r\n\r\n" + smuggled), "", rfc9112 + " §7.1"},
		{"second chunk size bare LF", chunked("3\r\nabc\r\n3\nabc\r\n0\r\n\r\n" + smuggled), "", "CVE-2025-22871"},
		{"second chunk size 0x", chunked("3\r\nabc\r\n0x3\r\nabc\r\n0\r\n\r\n" + smuggled), "", garden},
	}
}

// Responses returns the response-side table: each answer, from a backend to
// a plain GET, must become a 502 with none of its bytes relayed.
func Responses() []Response {
	return []Response{
		{"CL.TE", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", rfc9112 + " §6.1"},
		{"TE.CL", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", rfc9112 + " §6.1"},
		{"TE gzip", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nEVIL", haproxy + ": 502"},
		{"TE identity", "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 4\r\n\r\nEVIL", haproxy},
		{"TE chunked, chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n4\r\nEVIL\r\n0\r\n\r\n", haproxy},
		{"TE two fields", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nEVIL\r\n0\r\n\r\n", smuggler},
		{"CL duplicate", "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nEVIL", rfc9112 + " §6.3"},
		{"CL differing", "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 2\r\n\r\nEVIL", rfc9112 + " §6.3"},
		{"CL plus sign", "HTTP/1.1 200 OK\r\nContent-Length: +4\r\n\r\nEVIL", rfc9110 + " §8.6"},
		{"CL empty", "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nEVIL", rfc9110 + " §8.6"},
		{"CR in value", "HTTP/1.1 200 OK\r\nX-Evil: a\rSet-Cookie: EVIL=1\r\nContent-Length: 4\r\n\r\nEVIL", rfc9112 + " §2.2; fasthttp #875"},
		{"LF in value", "HTTP/1.1 200 OK\r\nX-Evil: a\nSet-Cookie: EVIL=1\r\nContent-Length: 4\r\n\r\nEVIL", rfc9112 + " §2.2"},
		{"NUL in value", "HTTP/1.1 200 OK\r\nX-Evil: a\x00b\r\nContent-Length: 4\r\n\r\nEVIL", rfc9110 + " §5.5"},
		{"space in name", "HTTP/1.1 200 OK\r\nX Evil: a\r\nContent-Length: 4\r\n\r\nEVIL", rfc9110 + " §5.1"},
		{"space before colon", "HTTP/1.1 200 OK\r\nContent-Length : 4\r\n\r\nEVIL", rfc9112 + " §5.1"},
		{"obs-fold", "HTTP/1.1 200 OK\r\nX-Evil: a\r\n Set-Cookie: EVIL=1\r\nContent-Length: 4\r\n\r\nEVIL", rfc9112 + " §5.2: 502 or replace"},
		{"bad status line", "HTTP/1.1 2000 OK\r\nContent-Length: 4\r\n\r\nEVIL", rfc9112 + " §4"},
		{"101 to a plain request", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nEVIL", "websocket-smuggle"},
		{"head too large", "HTTP/1.1 200 OK\r\nX-Evil: " + strings.Repeat("a", 20<<10) + "\r\nContent-Length: 4\r\n\r\nEVIL", "proxy.Config.MaxResponseHeaderBytes"},
		{"truncated head", "HTTP/1.1 200 OK\r\nX-Evil: 1\r\nContent-Length: 4\r\n", "no CRLFCRLF before close"},
		{"bare LF head", "HTTP/1.1 200 OK\nX-Evil: 1\nContent-Length: 4\n\nEVIL", rfc9112 + " §2.2"},
	}
}
