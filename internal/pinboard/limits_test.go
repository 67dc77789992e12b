package pinboard

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Every data-plane limit is a flag and a variable; unset ones stay zero
// (the proxy's default); bad values name the variable.
func TestParseProxyLimits(t *testing.T) {
	s, err := ParseSettings([]string{"-max-body-bytes", "1024", "-header-timeout", "2s", "-worker-max-queue", "-1"},
		envOf(map[string]string{EnvToken: token, "PINBOARD_WORKER_MAX_CONNS": "7", "PINBOARD_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.7/32",
			"PINBOARD_WORKER_QUEUE_TIMEOUT": "250ms", "PINBOARD_MAX_BODY_BYTES": "99"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.Proxy.MaxRequestBodySize != 1024 || s.Proxy.HeaderTimeout != 2*time.Second || s.Proxy.Endpoint.MaxQueue != -1 ||
		s.Proxy.Endpoint.MaxConns != 7 || s.Proxy.Endpoint.QueueTimeout != 250*time.Millisecond {
		t.Errorf("limits %+v", s.Proxy)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32")}; !slices.Equal(s.Proxy.TrustedProxies, want) {
		t.Errorf("trusted proxies %v", s.Proxy.TrustedProxies)
	}
	if s.Proxy.IdleTimeout != 0 || s.Proxy.MaxHeaderBytes != 0 || s.Proxy.Endpoint.DialTimeout != 0 {
		t.Errorf("unset limits were written: %+v", s.Proxy)
	}
	for _, bad := range [][]string{
		{"-max-body-bytes", "0"}, {"-max-header-bytes", "-1"}, {"-header-timeout", "0s"}, {"-header-timeout", "soon"},
		{"-worker-max-conns", "x"}, {"-trusted-proxies", "10.0.0.1"}, {"-max-attempts", "-1"},
	} {
		_, err := ParseSettings(bad, envOf(map[string]string{EnvToken: token}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), limitEnv(strings.TrimPrefix(bad[0], "-"))) {
			t.Errorf("%v: err %v; want one naming %s", bad, err, limitEnv(strings.TrimPrefix(bad[0], "-")))
		}
	}
}

// The limits reach the running proxy: a body over -max-body-bytes is a 413
// before any worker sees it, and a head slower than -header-timeout is a
// 408 and a closed connection.
func TestProxyLimitsApplied(t *testing.T) {
	s, err := ParseSettings([]string{"-dev", "-max-body-bytes", "16", "-header-timeout", "300ms"}, envOf(map[string]string{EnvToken: token}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, s)
	r.waitHealth(t, 200)
	w := startWorker(t, "a", r.public)
	if code, body := r.do("POST", r.public, "/counter/lim/", strings.Repeat("x", 16), nil); code != 200 {
		t.Fatalf("16-byte body: %d %s", code, body)
	}
	resp := rawRequest(t, r.public, "POST /counter/big/ HTTP/1.1\r\nHost: h\r\nContent-Length: 17\r\n\r\n"+strings.Repeat("x", 17))
	if resp.StatusCode() != 413 {
		t.Errorf("17-byte body: %d %s; want 413", resp.StatusCode(), resp.Body())
	}
	if w.served("big") {
		t.Error("the worker saw the refused request")
	}

	c, err := net.Dial("tcp", r.public)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte("GET /counter/slow/ HTTP/1.1\r\nHost: h\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(c) // until the pinboard closes
	if el := time.Since(start); !strings.HasPrefix(string(got), "HTTP/1.1 408") || el > 3*time.Second {
		t.Errorf("slow head: %q after %v; want 408 and close near 300ms", got, el)
	}
}

// The proxy dials workers through the registry's address policy
// (registry.Registry.DialControl), checked on the address actually
// connected: a worker whose address the policy now refuses is never
// connected to.
func TestProxyDialsThroughTheRegistryPolicy(t *testing.T) {
	var calls atomic.Int64
	var refuse atomic.Bool
	var policy dialControl
	r := startConfig(t, Config{Settings: Settings{Dev: true}, wrapDialControl: func(p dialControl) dialControl {
		policy = p
		return func(network, address string, c syscall.RawConn) error {
			calls.Add(1)
			if refuse.Load() {
				return errors.New("refused by policy")
			}
			return policy(network, address, c)
		}
	}})
	if policy == nil || policy("tcp", "169.254.169.254:80", nil) == nil || policy("tcp", "127.0.0.1:80", nil) != nil {
		t.Fatal("the policy handed to the proxy is not the registry's (it must refuse the metadata address)")
	}
	r.waitHealth(t, 200)
	startWorker(t, "a", r.public)
	refuse.Store(true)
	resp := rawRequest(t, r.public, "GET /counter/p/ HTTP/1.1\r\nHost: h\r\n\r\n")
	if resp.StatusCode() != 503 || string(resp.Header.Peek(wire.HeaderReason)) != wire.ReasonUnreachable {
		t.Errorf("refused address: %d %q %s; want 503 unreachable", resp.StatusCode(), resp.Header.Peek(wire.HeaderReason), resp.Body())
	}
	if calls.Load() == 0 {
		t.Fatal("the proxy dialled the worker without the policy hook")
	}
	refuse.Store(false)
	if code, body := r.do("GET", r.public, "/counter/p/", "", nil); code != 200 {
		t.Fatalf("GET once the policy allows: %d %s", code, body)
	}
}
