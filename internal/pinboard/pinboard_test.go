package pinboard

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Options()...) }

const token = "pinboard-test-token-0123456789"

// envOf is the environment (as os.Environ) holding m.
func envOf(m map[string]string) []string {
	var env []string
	for k, v := range m {
		env = append(env, k+"="+v)
	}
	return env
}

func TestParseSettings(t *testing.T) {
	s, err := ParseSettings(nil, envOf(map[string]string{EnvToken: token}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.Listen != DefaultListen || s.AdminListen != DefaultAdminListen || s.RedisURL != DefaultRedisURL ||
		s.Lease != DefaultLease || s.ShutdownTimeout != DefaultShutdownTimeout || !slices.Equal(s.Tokens, []string{token}) || s.Dev {
		t.Fatalf("defaults = %+v", s)
	}
	if s.RegisterIPLimit != registry.DefaultRegisterIPLimit || s.RegisterTokenLimit != registry.DefaultRegisterTokenLimit ||
		s.AuthFailureLimit != registry.DefaultAuthFailureLimit || s.MaxSessionsPerToken != registry.DefaultMaxSessionsPerToken ||
		s.NonceTTL != registry.DefaultNonceTTL || s.MaxTrackedClients != registry.DefaultMaxTrackedClients || s.AdvertisePorts != nil {
		t.Fatalf("hardening defaults = %+v", s)
	}
	if s.RestartFence != DefaultLease {
		t.Fatalf("restart fence defaults to %v, want the lease %v", s.RestartFence, DefaultLease)
	}
	if s.EpochTTL != store.DefaultEpochTTL {
		t.Fatalf("epoch TTL defaults to %v, want %v", s.EpochTTL, store.DefaultEpochTTL)
	}
	if s.Loops != runtime.NumCPU() || s.NoHotIDs {
		t.Fatalf("loops %d (want one per CPU, %d), no-hot-ids %v (want false)", s.Loops, runtime.NumCPU(), s.NoHotIDs)
	}
	if s, err := ParseSettings([]string{"-loops", "0"}, envOf(map[string]string{EnvToken: token, EnvNoHotIDs: "true", EnvLoops: "3"}), io.Discard); err != nil ||
		s.Loops != 0 || !s.NoHotIDs {
		t.Errorf("-loops 0 over %s=3, %s=true: loops %d, no-hot-ids %v, %v", EnvLoops, EnvNoHotIDs, s.Loops, s.NoHotIDs, err)
	}
	if _, err := ParseSettings(nil, envOf(map[string]string{EnvToken: token, EnvLoops: "-1"}), io.Discard); err == nil || !strings.Contains(err.Error(), EnvLoops) {
		t.Errorf("%s=-1: %v; want an error naming it", EnvLoops, err)
	}
	if s, err := ParseSettings([]string{"-epoch-ttl", "2h"}, envOf(map[string]string{EnvToken: token, EnvEpochTTL: "1h"}), io.Discard); err != nil || s.EpochTTL != 2*time.Hour {
		t.Errorf("-epoch-ttl 2h over %s=1h: %v, %v", EnvEpochTTL, s.EpochTTL, err)
	}
	for _, c := range []struct {
		v    string
		want time.Duration
		bad  bool
	}{{"", 0, false}, {"lease/4", 0, false}, {"off", -1, false}, {"3s", 3 * time.Second, false}, {"11s", 0, true}, {"0s", 0, true}, {"soon", 0, true}} {
		env := map[string]string{EnvToken: token}
		if c.v != "" {
			env[EnvRefreshAhead] = c.v
		}
		s, err := ParseSettings(nil, envOf(env), io.Discard)
		if c.bad {
			if err == nil || !strings.Contains(err.Error(), EnvRefreshAhead) {
				t.Errorf("%s=%s: %v; want an error naming it", EnvRefreshAhead, c.v, err)
			}
		} else if err != nil || s.RefreshAhead != c.want {
			t.Errorf("%s=%q: %v, %v; want %v", EnvRefreshAhead, c.v, s.RefreshAhead, err, c.want)
		}
	}
	if _, err := ParseSettings(nil, envOf(map[string]string{EnvToken: token, EnvEpochTTL: "10ms"}), io.Discard); err == nil || !strings.Contains(err.Error(), EnvEpochTTL) {
		t.Errorf("%s=10ms: %v; want an error naming it", EnvEpochTTL, err)
	}
	for _, c := range []struct {
		args []string
		want time.Duration
	}{{[]string{"-lease", "4s"}, 4 * time.Second}, {[]string{"-lease", "4s", "-restart-fence", "lease"}, 4 * time.Second},
		{[]string{"-restart-fence", "0"}, 0}, {[]string{"-restart-fence", "30s"}, 30 * time.Second}} {
		if s, err := ParseSettings(c.args, envOf(map[string]string{EnvToken: token}), io.Discard); err != nil || s.RestartFence != c.want {
			t.Errorf("ParseSettings(%q): restart fence %v, %v; want %v", c.args, s.RestartFence, err, c.want)
		}
	}
	s, err = ParseSettings([]string{"-register-ip-rate", "2/s burst 4", "-max-sessions-per-token", "off"}, envOf(map[string]string{
		EnvToken: token, EnvRegisterIPRate: "9/s", EnvRegisterTokenRate: "off", EnvAuthFailureRate: "3/10m",
		EnvNonceTTL: "10s", EnvMaxTrackedClients: "50", EnvAdvertisePorts: "8080, 443",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.RegisterIPLimit != (registry.Limit{Events: 2, Per: time.Second, Burst: 4}) || !s.RegisterTokenLimit.Off() ||
		s.AuthFailureLimit != (registry.Limit{Events: 3, Per: 10 * time.Minute, Burst: 3}) || s.MaxSessionsPerToken != -1 ||
		s.NonceTTL != 10*time.Second || s.MaxTrackedClients != 50 || !slices.Equal(s.AdvertisePorts, []uint16{8080, 443}) {
		t.Fatalf("hardening settings = %+v", s)
	}
	env := map[string]string{
		EnvToken: token + "," + token + "-old", EnvListen: "127.0.0.1:1", EnvAdminListen: "127.0.0.1:2",
		EnvRedisURL: "redis://r:1/2", EnvLease: "3s", EnvAdvertiseNetworks: "10.0.0.0/8, 192.168.1.7/16",
		EnvLogLevel: "debug", EnvLogFormat: "json",
	}
	s, err = ParseSettings([]string{"-listen", "127.0.0.1:9", "-lease", "4s"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if s.Listen != "127.0.0.1:9" || s.AdminListen != "127.0.0.1:2" || s.RedisURL != "redis://r:1/2" || s.Lease != 4*time.Second ||
		!slices.Equal(s.Tokens, []string{token, token + "-old"}) || s.LogLevel != slog.LevelDebug || !s.LogJSON ||
		!slices.Equal(s.AdvertiseNetworks, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")}) {
		t.Fatalf("flags over env = %+v", s)
	}

	file := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(file, []byte("# rotated 2026-12-01\n"+token+"\n\n"+token+"-previous\n"), 0o600)
	s, err = ParseSettings(nil, envOf(map[string]string{EnvTokenFile: file}), io.Discard)
	if err != nil || !slices.Equal(s.Tokens, []string{token, token + "-previous"}) || s.TokenFile != file {
		t.Fatalf("token file: %+v, %v", s, err)
	}

	s, err = ParseSettings([]string{"-dev"}, envOf(nil), io.Discard)
	if err != nil || !s.Dev || !s.DevToken || len(s.Tokens) != 1 || len(s.Tokens[0]) < 16 {
		t.Fatalf("-dev without a token: %+v, %v", s, err)
	}

	f := func(args []string, env map[string]string, wantSub string) {
		t.Helper()
		_, err := ParseSettings(args, envOf(env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), wantSub) {
			t.Errorf("ParseSettings(%q, %v) = %v; want an error naming %q", args, env, err, wantSub)
		}
	}
	f(nil, nil, EnvToken)
	f(nil, map[string]string{EnvToken: token, EnvTokenFile: file}, "both")
	f(nil, map[string]string{EnvTokenFile: filepath.Join(t.TempDir(), "missing")}, EnvTokenFile)
	f(nil, map[string]string{EnvToken: token, EnvLease: "10"}, EnvLease)
	f(nil, map[string]string{EnvToken: token, EnvLease: "100ms"}, EnvLease)
	f(nil, map[string]string{EnvToken: token, EnvListen: "8080"}, EnvListen)
	f(nil, map[string]string{EnvToken: token, EnvListen: ":99999"}, EnvListen)
	f([]string{"-admin-listen", "127.0.0.1:-1"}, map[string]string{EnvToken: token}, EnvAdminListen)
	f(nil, map[string]string{EnvToken: token, EnvAdvertiseNetworks: "10.0.0.0"}, EnvAdvertiseNetworks)
	f(nil, map[string]string{EnvToken: token, EnvLogLevel: "loud"}, EnvLogLevel)
	f(nil, map[string]string{EnvToken: token, EnvRegisterIPRate: "5"}, EnvRegisterIPRate)
	f(nil, map[string]string{EnvToken: token, EnvAuthFailureRate: "0/s"}, EnvAuthFailureRate)
	f(nil, map[string]string{EnvToken: token, EnvRegisterTokenRate: "5/fortnight"}, EnvRegisterTokenRate)
	f(nil, map[string]string{EnvToken: token, EnvMaxSessions: "0"}, EnvMaxSessions)
	f(nil, map[string]string{EnvToken: token, EnvMaxTrackedClients: "-1"}, EnvMaxTrackedClients)
	f(nil, map[string]string{EnvToken: token, EnvNonceTTL: "1m"}, EnvNonceTTL)
	f(nil, map[string]string{EnvToken: token, EnvNonceTTL: "100ms"}, EnvNonceTTL)
	f(nil, map[string]string{EnvToken: token, EnvAdvertisePorts: "80,0"}, EnvAdvertisePorts)
	f([]string{"extra"}, map[string]string{EnvToken: token}, "unexpected argument")
	f([]string{"-nope"}, map[string]string{EnvToken: token}, "not defined")
}

func TestMainExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(nil, envOf(nil), &out, &errb); code != ExitConfig || !strings.Contains(errb.String(), EnvToken) {
		t.Fatalf("Main without a token = %d, %q; want %d naming %s", code, errb.String(), ExitConfig, EnvToken)
	}
	errb.Reset()
	if code := Main(nil, envOf(map[string]string{EnvToken: "short"}), &out, &errb); code != ExitConfig || !strings.Contains(errb.String(), "at least 16") {
		t.Fatalf("Main with a short token = %d, %q; want %d", code, errb.String(), ExitConfig)
	}
	out.Reset()
	if code := Main([]string{"-h"}, envOf(nil), &out, io.Discard); code != ExitOK || !strings.Contains(out.String(), "-lease duration (env PINBOARD_LEASE") {
		t.Fatalf("Main -h = %d, %q; want 0 and every setting on stdout", code, out.String())
	}
	errb.Reset()
	if code := Main(nil, envOf(map[string]string{EnvToken: token, EnvListen: ":99999"}), &out, &errb); code != ExitConfig ||
		!strings.Contains(errb.String(), EnvListen) {
		t.Fatalf("Main with %s=:99999 = %d, %q; want %d naming %s", EnvListen, code, errb.String(), ExitConfig, EnvListen)
	}
}

// running is a pinboard started in-process on 127.0.0.1 ports.
type running struct {
	p      *Pinboard
	public string
	admin  string
	hc     *fasthttp.Client
	cancel context.CancelFunc
	done   chan error
	logs   *logtest.Buffer
}

// start runs a pinboard (registry and proxy) with s.
func start(t *testing.T, s Settings) *running {
	t.Helper()
	return startConfig(t, Config{Settings: s})
}

// startRegistryOnly runs a pinboard without a data plane (Config.NoProxy).
func startRegistryOnly(t *testing.T, s Settings) *running {
	t.Helper()
	return startConfig(t, Config{Settings: s, NoProxy: true})
}

// startConfig runs a pinboard with cfg, on 127.0.0.1 listeners, with a
// test token, a 2 s lease by default and logs captured.
func startConfig(t *testing.T, cfg Config) *running {
	t.Helper()
	pub, _ := net.Listen("tcp", "127.0.0.1:0")
	adm, _ := net.Listen("tcp", "127.0.0.1:0")
	logs := &logtest.Buffer{}
	s := &cfg.Settings
	if len(s.Tokens) == 0 {
		s.Tokens = []string{token}
	}
	s.Lease = cmp.Or(s.Lease, 2*time.Second)
	s.ShutdownTimeout = 5 * time.Second
	cfg.Logger, cfg.PublicListener, cfg.AdminListener = slog.New(slog.NewTextHandler(logs, nil)), pub, adm
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{p: p, public: pub.Addr().String(), admin: adm.Addr().String(), cancel: cancel, done: make(chan error, 1), logs: logs,
		hc: &fasthttp.Client{MaxIdleConnDuration: 100 * time.Millisecond}}
	go func() { r.done <- p.Run(ctx) }()
	t.Cleanup(func() {
		r.stop(t)
		r.hc.CloseIdleConnections()
	})
	return r
}

func (r *running) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok && err != nil {
			t.Errorf("Run = %v", err)
		}
		if ok {
			close(r.done)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of cancel")
	}
}

func (r *running) do(method, addr, path, tok string, body any) (int, []byte) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + path)
	req.Header.SetMethod(method)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != nil {
		b, _ := json.Marshal(body)
		req.SetBody(b)
	}
	if err := r.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		return 0, []byte(err.Error())
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...)
}

// waitHealth polls /healthz until it answers want (polling a server whose
// readiness depends on an external process, Redis).
func (r *running) waitHealth(t *testing.T, want int) wire.Healthz {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := r.do("GET", r.public, wire.PathHealthz, "", nil)
		var h wire.Healthz
		json.Unmarshal(body, &h)
		if code == want {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz = %d %s; want %d", code, body, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunServesRegistryAndAdmin(t *testing.T) {
	srv := redistest.Start(t)
	r := startRegistryOnly(t, Settings{RedisURL: srv.URL})
	r.waitHealth(t, 200)
	w := fakeworker.Start(t, "secret")
	code, body := r.do("POST", r.public, wire.PathRegister, token, wire.RegisterRequest{
		ClientID: "c1", Secret: "secret", Namespaces: []string{"/counter"}, AdvertiseURL: w.URL, Headroom: 1,
		Challenge: "x-0123456789abcdefghijkl", ChallengeValue: fakeworker.Value("x-0123456789abcdefghijkl"),
	})
	if code != 200 {
		t.Fatalf("register = %d %s", code, body)
	}
	var rr wire.RegisterResponse
	json.Unmarshal(body, &rr)
	if rr.ExpiresInMs != 2000 {
		t.Fatalf("expiresInMs = %d; want the pinboard's 2s lease", rr.ExpiresInMs)
	}
	// Admin: metrics with registry, process and Go metrics; pprof.
	code, body = r.do("GET", r.admin, "/metrics", "", nil)
	for _, want := range []string{"pinned_registry_registrations_total 1", "pinned_pinboard_info{", "go_goroutines", "process_resident_memory_bytes", `pinned_registry_requests_total{endpoint="register",code="200"} 1`} {
		if code != 200 || !bytes.Contains(body, []byte(want)) {
			t.Errorf("admin /metrics = %d, lacks %q", code, want)
		}
	}
	if code, body := r.do("GET", r.admin, "/debug/pprof/", "", nil); code != 200 || !bytes.Contains(body, []byte("goroutine")) {
		t.Errorf("admin /debug/pprof/ = %d", code)
	}
	if code, _ := r.do("GET", r.admin, "/debug/pprof/goroutine?debug=1", "", nil); code != 200 {
		t.Errorf("admin /debug/pprof/goroutine = %d", code)
	}
	// Neither is on the public port.
	for _, p := range []string{"/metrics", "/debug/pprof/", "/debug/pprof/heap"} {
		if code, _ := r.do("GET", r.public, p, "", nil); code != 404 {
			t.Errorf("public %s = %d; want 404 (admin endpoints are never public)", p, code)
		}
	}
	if strings.Contains(r.logs.String(), token) || strings.Contains(r.logs.String(), "secret\"") {
		t.Errorf("a token or secret reached the logs:\n%s", r.logs)
	}
}

// Redis down at start: the pinboard serves at once, /healthz reports the
// store error, and it connects when Redis appears.
func TestStartsWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	r := startRegistryOnly(t, Settings{RedisURL: srv.URL})
	h := r.waitHealth(t, 503)
	if h.OK || !strings.Contains(h.Store, "unavailable") {
		t.Fatalf("healthz while Redis is down = %+v; want the store error", h)
	}
	if code, _ := r.do("GET", r.public, wire.PathWorkers, token, nil); code != 503 {
		t.Fatalf("workers while Redis is down = %d; want 503", code)
	}
	srv.Restart(t)
	r.waitHealth(t, 200)
	if code, body := r.do("GET", r.public, wire.PathWorkers, token, nil); code != 200 {
		t.Fatalf("workers after Redis came up = %d %s", code, body)
	}
}

// The data plane's wiring: store invalidations reach the resolver (read
// first: Redis reports only tracked keys), the proxy's metrics are on the
// admin /metrics, and a registry-only pinboard (NoProxy) has neither and
// answers 404 to everything but the registry.
func TestDataPlaneWiring(t *testing.T) {
	for _, dev := range []bool{true, false} {
		name := map[bool]string{true: "dev", false: "redis"}[dev]
		t.Run(name, func(t *testing.T) {
			s := Settings{Dev: dev}
			if !dev {
				s.RedisURL = redistest.Start(t).URL
			}
			r := start(t, s)
			r.waitHealth(t, 200)
			res := r.p.dp.res
			before := res.CacheStats().Invalidations
			st := r.p.Store()
			if _, err := st.Placement(context.Background(), "/counter", "abc"); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Claim(context.Background(), "/counter", "abc", "s1"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for res.CacheStats().Invalidations == before {
				if time.Now().After(deadline) {
					t.Fatal("the claim's invalidation never reached the resolver")
				}
				time.Sleep(5 * time.Millisecond) // Redis pushes invalidations asynchronously
			}
			if code, _ := r.do("GET", r.public, "/counter/abc/", "", nil); code != 404 {
				t.Fatalf("GET /counter/abc/ = %d; want the proxy's 404 (no worker served /counter)", code)
			}
			code, body := r.do("GET", r.admin, "/metrics", "", nil)
			for _, want := range []string{"pinned_proxy_responses_total{class=\"4xx\"} 1", "pinned_proxy_endpoints 0", "pinned_placement_sessions 0"} {
				if code != 200 || !bytes.Contains(body, []byte(want)) {
					t.Errorf("admin /metrics lacks %q", want)
				}
			}
		})
	}
	t.Run("registry only", func(t *testing.T) {
		r := startRegistryOnly(t, Settings{Dev: true})
		r.waitHealth(t, 200)
		if r.p.dp != nil {
			t.Fatal("NoProxy built a data plane")
		}
		if code, _ := r.do("GET", r.public, "/counter/abc/", "", nil); code != 404 {
			t.Errorf("non-registry request = %d; want 404", code)
		}
		if code, body := r.do("GET", r.admin, "/metrics", "", nil); code != 200 || bytes.Contains(body, []byte("pinned_proxy_")) {
			t.Errorf("admin /metrics of a registry-only pinboard = %d, with proxy metrics: %v", code, bytes.Contains(body, []byte("pinned_proxy_")))
		}
	})
}

// A WebSocket tunnel through the pinboard closes when its placement leaves
// the tunnel's session: the resolver's check reports the new holder
// (placement.Config.OnMoved) and the pinboard closes the tunnel
// (proxy.Proxy.CloseTunnels).
func TestTunnelClosesWhenPlacementMoves(t *testing.T) {
	r := start(t, Settings{Dev: true})
	r.waitHealth(t, 200)
	// A worker that accepts any upgrade and echoes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				var req fasthttp.Request
				br := bufio.NewReader(c)
				if req.Read(br) != nil {
					return
				}
				_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
				_, _ = io.Copy(c, br)
			})
		}
	})
	st := r.p.Store()
	if _, err := st.Register(context.Background(), store.Session{ID: "s1", ClientID: "c1", Secret: "k", AdvertiseURL: "http://" + ln.Addr().String(),
		Namespaces: []string{"/counter"}, Headroom: 10, Verified: true}, time.Minute); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", r.public)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /counter/x/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var resp fasthttp.Response
	resp.SkipBody = true
	if err := resp.Read(br); err != nil || resp.StatusCode() != 101 {
		t.Fatalf("handshake: %d %v", resp.StatusCode(), err)
	}
	echo := func() error {
		if _, err := io.WriteString(c, "ping"); err != nil {
			return err
		}
		b := make([]byte, 4)
		_, err := io.ReadFull(br, b)
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("echo through the tunnel: %v", err)
	}
	checks := r.p.dp.res.Metrics().GetOrCreateCounter("pinned_placement_tunnel_checks_total")
	for deadline := time.Now().Add(5 * time.Second); checks.Get() == 0; time.Sleep(5 * time.Millisecond) { // Run's check of the new tunnel
		if time.Now().After(deadline) {
			t.Fatal("the new tunnel's placement was never checked")
		}
	}
	if err := echo(); err != nil {
		t.Fatalf("the check closed a tunnel whose placement did not move: %v", err)
	}
	if ok, err := st.Release(context.Background(), "/counter", "x", "s1", 0); !ok || err != nil {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("the tunnel still carries bytes after its placement was released")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the tunnel was not closed within 5 s of its placement's release")
	}
}

func TestGracefulShutdown(t *testing.T) {
	r := startRegistryOnly(t, Settings{Dev: true, ShutdownDelay: 0})
	r.waitHealth(t, 200)
	start := time.Now()
	r.stop(t)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("shutdown took %v", d)
	}
	if code, _ := r.do("GET", r.public, wire.PathHealthz, "", nil); code != 0 {
		t.Fatalf("the public listener still answers after shutdown: %d", code)
	}
	if !strings.Contains(r.logs.String(), "pinboard stopped") {
		t.Fatalf("no stop log line:\n%s", r.logs)
	}
	if strings.Contains(r.logs.String(), "did not finish") {
		t.Fatalf("a clean shutdown was logged as timed out:\n%s", r.logs)
	}
}

func TestReloadTokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(file, []byte(token+"\n"+token+"-old\n"), 0o600)
	s, err := ParseSettings([]string{"-dev"}, envOf(map[string]string{EnvTokenFile: file}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := startRegistryOnly(t, s)
	r.waitHealth(t, 200)
	if code, _ := r.do("GET", r.public, wire.PathWorkers, token+"-old", nil); code != 200 {
		t.Fatalf("old token during rotation = %d; want 200", code)
	}
	os.WriteFile(file, []byte(token+"\n"), 0o600)
	if err := r.p.ReloadTokens(); err != nil {
		t.Fatal(err)
	}
	if code, _ := r.do("GET", r.public, wire.PathWorkers, token+"-old", nil); code != 401 {
		t.Fatalf("old token after reload = %d; want 401", code)
	}
	os.WriteFile(file, []byte("# empty\n"), 0o600)
	if err := r.p.ReloadTokens(); err == nil {
		t.Fatal("ReloadTokens accepted a file without tokens")
	}
	if code, _ := r.do("GET", r.public, wire.PathWorkers, token, nil); code != 200 {
		t.Fatalf("current token after a failed reload = %d; want 200", code)
	}
}

func TestRedactURL(t *testing.T) {
	if got := redactURL("redis://user:hunter2@10.0.0.5:6379/0"); strings.Contains(got, "hunter2") || !strings.Contains(got, "10.0.0.5:6379") {
		t.Fatalf("redactURL = %q; want the host without the password", got)
	}
}
