package loadgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// selfSigned returns a certificate for 127.0.0.1 and its key, PEM encoded.
func selfSigned(t testing.TB) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "loadgen test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// startTLSTarget serves h over TLS on 127.0.0.1 and returns the https URL
// and the certificate.
func startTLSTarget(t testing.TB, h fasthttp.RequestHandler) (string, []byte) {
	t.Helper()
	certPEM, keyPEM := selfSigned(t)
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
