package main

import (
	"io"
	"strconv"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/host"
)

// maxBlobSize bounds GET /blob?size=N.
const maxBlobSize = 1 << 30

// addBlob adds GET /blob to the counter's routes.
func addBlob(r *host.Routes[*counterapp.Counter]) { r.GET("/blob", blob) }

// blob answers GET /counter/{id}/blob?size=N (default 1 MiB) with N bytes
// of a fixed pattern, Content-Length framed and generated while fasthttp
// writes them (nothing is held): the large-body workload of bench's
// streaming suite. It does not touch the object's state.
func blob(_ *counterapp.Counter, x *host.Ctx) error {
	n := int64(1 << 20)
	if v := x.RequestCtx().QueryArgs().Peek("size"); len(v) > 0 {
		k, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil || k < 0 || k > maxBlobSize {
			return &host.Error{Status: 400, Message: "size must be an integer from 0 to " + strconv.Itoa(maxBlobSize), Field: "size"}
		}
		n = k
	}
	x.RequestCtx().SetContentType("application/octet-stream")
	x.RequestCtx().SetBodyStream(&patternReader{left: n}, int(n))
	return nil
}

// blobPattern is what GET /blob repeats; it is never written after it is
// made.
var blobPattern = func() []byte {
	b := make([]byte, 32<<10)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return b
}()

// patternReader yields left bytes of blobPattern.
type patternReader struct{ left, off int64 }

func (r *patternReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n := 0
	for n < len(p) {
		k := copy(p[n:], blobPattern[r.off:])
		n += k
		r.off = (r.off + int64(k)) % int64(len(blobPattern))
	}
	r.left -= int64(n)
	return n, nil
}
