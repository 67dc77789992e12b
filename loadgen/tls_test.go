package loadgen

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/testkit/tlstest"
)

// startTLSTarget serves h over TLS on 127.0.0.1 and returns the https URL
// and the certificate.
func startTLSTarget(t testing.TB, h fasthttp.RequestHandler) (string, []byte) {
	t.Helper()
	certPEM, keyPEM := tlstest.SelfSigned(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h, Logger: quiet{}}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.ServeTLSEmbed(ln, certPEM, keyPEM) })
	t.Cleanup(func() {
		_ = ln.Close()
		_ = srv.Shutdown()
		wg.Wait()
	})
	return "https://" + ln.Addr().String(), certPEM
}

// TestHTTPS: https runs on the fasthttp engine; the certificate is verified
// unless told otherwise, against the roots given.
func TestHTTPS(t *testing.T) {
	url, certPEM := startTLSTarget(t, func(ctx *fasthttp.RequestCtx) {
		if !ctx.IsTLS() {
			ctx.Error("plain", 400)
			return
		}
		ctx.SetBodyString("secure")
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	for _, tc := range []struct {
		name string
		tls  *tls.Config
		ok   bool
	}{
		{"system roots", nil, false},
		{"insecure", &tls.Config{InsecureSkipVerify: true}, true},
		{"own CA", &tls.Config{RootCAs: pool}, true},
	} {
		rep := run(t, Config{URL: url, TLS: tc.tls, Requests: 10, Duration: Unbounded, Connections: 2})
		if rep.Generator.Engine != EngineFastHTTP {
			t.Fatalf("engine %q; want fasthttp for https", rep.Generator.Engine)
		}
		if tc.ok && (rep.Statuses["200"] != 10 || rep.Bytes.Received != 60) {
			t.Errorf("%s: statuses %v errors %+v; want 10 × 200 over TLS", tc.name, rep.Statuses, rep.Errors)
		}
		if !tc.ok && (rep.Errors.Connect != 10 || !strings.Contains(rep.Errors.Samples["connect"], "certificate")) {
			t.Errorf("%s: errors %+v; want 10 connect errors about the certificate", tc.name, rep.Errors)
		}
	}
}
