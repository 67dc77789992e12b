package pinboard

import (
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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/logtest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/wire"
	"github.com/pinned-go/pinned/internal/registry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Options()...) }

const token = "pinboard-test-token-0123456789"

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

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
	if s, err := ParseSettings([]string{"-epoch-ttl", "2h"}, envOf(map[string]string{EnvToken: token, EnvEpochTTL: "1h"}), io.Discard); err != nil || s.EpochTTL != 2*time.Hour {
		t.Errorf("-epoch-ttl 2h over %s=1h: %v, %v", EnvEpochTTL, s.EpochTTL, err)
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
	if code := Main(nil, envOf(nil), &out, &errb, nil); code != ExitConfig || !strings.Contains(errb.String(), EnvToken) {
		t.Fatalf("Main without a token = %d, %q; want %d naming %s", code, errb.String(), ExitConfig, EnvToken)
	}
	errb.Reset()
	if code := Main(nil, envOf(map[string]string{EnvToken: "short"}), &out, &errb, nil); code != ExitConfig || !strings.Contains(errb.String(), "at least 16") {
		t.Fatalf("Main with a short token = %d, %q; want %d", code, errb.String(), ExitConfig)
	}
	if code := Main([]string{"-h"}, envOf(nil), &out, io.Discard, nil); code != ExitOK {
		t.Fatalf("Main -h = %d; want 0", code)
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

func start(t *testing.T, s Settings, dp func(DataPlaneDeps) (DataPlane, error)) *running {
	t.Helper()
	pub, _ := net.Listen("tcp", "127.0.0.1:0")
	adm, _ := net.Listen("tcp", "127.0.0.1:0")
	logs := &logtest.Buffer{}
	if len(s.Tokens) == 0 {
		s.Tokens = []string{token}
	}
	s.Lease = cmp.Or(s.Lease, 2*time.Second)
	s.ShutdownTimeout = 5 * time.Second
	p, err := New(Config{Settings: s, Logger: slog.New(slog.NewTextHandler(logs, nil)), NewDataPlane: dp, PublicListener: pub, AdminListener: adm})
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
	r := start(t, Settings{RedisURL: srv.URL}, nil)
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
	r := start(t, Settings{RedisURL: srv.URL}, nil)
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

// fakeDataPlane records what the pinboard hands it.
type fakeDataPlane struct {
	deps DataPlaneDeps
	mu   sync.Mutex
	invs []store.Invalidation
	seen []string
	ran  chan struct{}
}

func (f *fakeDataPlane) Handle(ctx *fasthttp.RequestCtx) {
	f.mu.Lock()
	f.seen = append(f.seen, string(ctx.Path()))
	f.mu.Unlock()
	ctx.SetStatusCode(299)
}

func (f *fakeDataPlane) Invalidate(inv store.Invalidation) {
	f.mu.Lock()
	f.invs = append(f.invs, inv)
	f.mu.Unlock()
}

func (f *fakeDataPlane) Run(ctx context.Context) error {
	close(f.ran)
	<-ctx.Done()
	return nil
}

func (f *fakeDataPlane) ConfigureServer(s *fasthttp.Server) { s.Name = "configured" }

func TestDataPlanePlugsIn(t *testing.T) {
	for _, dev := range []bool{true, false} {
		name := map[bool]string{true: "dev", false: "redis"}[dev]
		t.Run(name, func(t *testing.T) {
			s := Settings{Dev: dev}
			if !dev {
				s.RedisURL = redistest.Start(t).URL
			}
			fdp := &fakeDataPlane{ran: make(chan struct{})}
			r := start(t, s, func(d DataPlaneDeps) (DataPlane, error) {
				fdp.deps = d
				d.Metrics.NewCounter("pinned_proxy_test_total").Inc()
				return fdp, nil
			})
			r.waitHealth(t, 200)
			<-fdp.ran
			if fdp.deps.Store == nil || fdp.deps.Lease != 2*time.Second || fdp.deps.Logger == nil || fdp.deps.Clock == nil ||
				fdp.deps.DialControl == nil || fdp.deps.DialControl("tcp", "169.254.169.254:80", nil) == nil ||
				fdp.deps.DialControl("tcp", "127.0.0.1:80", nil) != nil {
				t.Fatalf("deps = %+v; want every field, DialControl refusing the metadata address", fdp.deps)
			}
			if code, _ := r.do("GET", r.public, "/counter/abc/incr", "", nil); code != 299 {
				t.Fatalf("non-registry request = %d; want the data plane's 299", code)
			}
			if code, _ := r.do("GET", r.public, "/counter/abc/", "", nil); code != 299 {
				t.Fatalf("trailing slash = %d; want the data plane's 299, no redirect", code)
			}
			// Store invalidations reach the data plane (read first: Redis
			// reports only tracked keys).
			st := fdp.deps.Store
			st.Placement(context.Background(), "/counter", "abc")
			st.Claim(context.Background(), "/counter", "abc", "s1")
			deadline := time.Now().Add(5 * time.Second)
			for {
				fdp.mu.Lock()
				ok := slices.Contains(fdp.invs, store.Invalidation{Placement: "/counter/abc"})
				fdp.mu.Unlock()
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the claim's invalidation never reached the data plane")
				}
				time.Sleep(5 * time.Millisecond)
			}
			code, body := r.do("GET", r.admin, "/metrics", "", nil)
			if code != 200 || !bytes.Contains(body, []byte("pinned_proxy_test_total 1")) {
				t.Fatal("the data plane's metrics are not on the admin /metrics")
			}
		})
	}
}

func TestGracefulShutdown(t *testing.T) {
	r := start(t, Settings{Dev: true, ShutdownDelay: 0}, nil)
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
	r := start(t, s, nil)
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
