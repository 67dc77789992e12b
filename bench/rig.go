package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/testkit/procrun"
)

// token is the deployment token of the bench's pinboard and workers.
const token = "bench-deployment-token-0123456789abcdef"

var (
	pinboardReady = regexp.MustCompile(`msg="pinboard listening".* public=(\S+) admin=(\S+)`)
	counterReady  = regexp.MustCompile(`msg="counter demo listening".* addr=(\S+)`)
	redisReady    = regexp.MustCompile(`Ready to accept connections`)
)

// binaries are the executables a rig runs.
type binaries struct {
	pinboard, pinboardB, counter, loadgen, simworkers string
	pinboardSpans, counterSpans                       string // built with -tags pinned_spans (the trace suite)
}

// proc is a started process and the addresses it serves.
type proc struct {
	*procrun.Proc
	name  string
	addr  string // public host:port
	admin string // admin host:port ("" if none)
	pids  []int  // the pids whose CPU counts for it (nginx: master and workers)
}

// rig owns every process of one suite and kills them all in close.
type rig struct {
	o     *Options
	bins  binaries
	dir   string
	procs []*proc
}

func newRig(o *Options, bins binaries) (*rig, error) {
	dir, err := os.MkdirTemp("", "pinned-bench-")
	if err != nil {
		return nil, err
	}
	return &rig{o: o, bins: bins, dir: dir}, nil
}

// close kills every process the rig started (in reverse order) and removes
// its directory.
func (r *rig) close() {
	for i := len(r.procs) - 1; i >= 0; i-- {
		p := r.procs[i]
		if p.name == "nginx" || p.name == "haproxy" {
			_ = p.Signal(15) // nginx: TERM is a fast shutdown; workers follow their master
			select {
			case <-p.Exited():
			case <-time.After(5 * time.Second):
			}
		}
		p.Kill()
	}
	r.procs = nil
	os.RemoveAll(r.dir)
}

// pinned returns args prefixed by taskset when cpus is set.
func pinned(cpus, bin string, args ...string) (string, []string) {
	if cpus == "" {
		return bin, args
	}
	return "taskset", append([]string{"-c", cpus, bin}, args...)
}

func (r *rig) start(name string, cpus string, s procrun.Spec) (*proc, error) {
	s.Name = name
	s.Bin, s.Args = pinned(cpus, s.Bin, s.Args...)
	if s.ReadyTimeout == 0 {
		s.ReadyTimeout = 30 * time.Second
	}
	p, err := procrun.Start(s)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	pp := &proc{Proc: p, name: name, pids: []int{p.Pid()}}
	r.procs = append(r.procs, pp)
	return pp, nil
}

// freeAddr returns a 127.0.0.1 address with a port free right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (r *rig) startRedis() (*proc, error) { return r.startRedisNode("redis", false) }

// startRedisNode starts a redis-server named name; a cluster node
// (cluster-enabled, its own nodes file) when cluster is set, to be joined
// by redistest.FormCluster.
func (r *rig) startRedisNode(name string, cluster bool) (*proc, error) {
	bin := os.Getenv("PINNED_REDIS_SERVER")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			return nil, errors.New("redis-server not found: apt-get install redis-server, or set PINNED_REDIS_SERVER")
		}
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", r.dir, "--logfile", ""}
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-config-file", "nodes-"+port+".conf")
	}
	p, err := r.start(name, r.o.PinBackend, procrun.Spec{
		Bin:   bin,
		Args:  args,
		Ready: redisReady,
	})
	if err != nil {
		return nil, err
	}
	p.addr = addr
	return p, nil
}

// startPinboard runs a pinboard binary on Redis at redisAddr. PINBOARD_*
// variables in the bench's own environment reach it too (try a setting in
// any suite: PINBOARD_CACHE_REFRESH_AHEAD=off go run ./cmd/bench ...),
// except those the rig sets itself.
func (r *rig) startPinboard(name, bin, redisAddr string) (*proc, error) {
	return r.startPinboardURL(name, bin, "redis://"+redisAddr+"/0")
}

// startPinboardEnv is startPinboard with more settings (the failover
// suite's PINBOARD_FAST_FAILOVER), which win over the bench's environment.
func (r *rig) startPinboardEnv(name, bin, redisAddr string, extra ...string) (*proc, error) {
	return r.startPinboardURL(name, bin, "redis://"+redisAddr+"/0", extra...)
}

// startPinboardURL is startPinboard on the Redis at redisURL (a cluster's
// seeds), with more settings in env, which win over the bench's own
// environment like the rig's.
func (r *rig) startPinboardURL(name, bin, redisURL string, env ...string) (*proc, error) {
	env = append([]string{
		"PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0",
		"PINBOARD_REDIS_URL=" + redisURL, "PINBOARD_TOKEN=" + token,
		"PINBOARD_RESTART_FENCE=0s", // the rig's Redis has just started; nothing to fence
	}, env...)
	env = append(env, passThrough(os.Environ(), "PINBOARD_", env)...)
	p, err := r.start(name, r.o.PinProxy, procrun.Spec{
		Bin:   bin,
		Env:   env,
		Ready: pinboardReady,
	})
	if err != nil {
		return nil, err
	}
	p.addr, p.admin = p.Ready()[1], p.Ready()[2]
	return p, nil
}

// startCounter runs the counter (the test fixture test/app/counter: the
// demo with GET /blob and a history) with an admin listener: in fleet mode
// registered with pinboardAddr, or in local mode when pinboardAddr is "".
func (r *rig) startCounter(name, pinboardAddr string) (*proc, error) {
	return r.startCounterEnv(name, pinboardAddr)
}

// startCounterEnv is startCounter with more environment (PINNED_HISTORY).
func (r *rig) startCounterEnv(name, pinboardAddr string, extra ...string) (*proc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	env := append([]string{"PINNED_LISTEN=" + addr, "PINNED_ADMIN_LISTEN=" + admin}, extra...)
	if pinboardAddr != "" {
		env = append(env, "PINNED_PINBOARD_URL=http://"+pinboardAddr, "PINNED_TOKEN="+token, "PINNED_ADVERTISE_URL=http://"+addr)
	}
	p, err := r.start(name, r.o.PinBackend, procrun.Spec{
		Bin:   r.bins.counter,
		Args:  []string{"-idle-timeout", "1h", "-max-instances", "2000000"},
		Env:   env,
		Ready: counterReady,
	})
	if err != nil {
		return nil, err
	}
	p.addr, p.admin = addr, admin
	if pinboardAddr != "" {
		// Ready in fleet mode = registered: /healthz answers 200 only then.
		if err := poll(15*time.Second, "worker "+name+" registered", func() bool {
			code, _ := httpGet("http://"+addr+"/healthz", time.Second)
			return code == 200
		}); err != nil {
			return nil, fmt.Errorf("%w\n%s", err, p.Log())
		}
	}
	return p, nil
}

// startLocalCounter starts a rig with one counter in local mode; the
// caller closes the rig.
func (s *session) startLocalCounter() (*rig, *proc, error) {
	r, err := newRig(s.o, s.bins)
	if err != nil {
		return nil, nil, err
	}
	c, err := r.startCounter("counter-local", "")
	if err != nil {
		r.close()
		return nil, nil, err
	}
	return r, c, nil
}

// poll checks cond (another process's state, no event to wait on) every
// 20 ms until it holds or within passes.
func poll(within time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

var httpClient = &fasthttp.Client{MaxIdleConnDuration: time.Second, NoDefaultUserAgentHeader: true}

// httpGet returns the status and body of GET url (status 0 on a transport
// error).
func httpGet(url string, timeout time.Duration) (int, []byte) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	if err := httpClient.DoTimeout(req, resp, timeout); err != nil {
		return 0, nil
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...)
}

// fetch writes GET url into path (profiles); timeout bounds it.
func fetch(ctx context.Context, url, path string, timeout time.Duration) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	if err := httpClient.DoTimeout(req, resp, timeout); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode(), resp.Body())
	}
	return os.WriteFile(path, resp.Body(), 0o644)
}

// peerBinary finds a peer proxy's binary (nginx, haproxy) on PATH or in
// /usr/sbin, where Debian puts both (outside a user's PATH); errPeerMissing
// when it is in neither.
func peerBinary(name string) (string, error) {
	for _, p := range []string{name, "/usr/sbin/" + name} {
		if bin, err := exec.LookPath(p); err == nil {
			return bin, nil
		}
	}
	return "", errPeerMissing
}

// startPeer starts a peer proxy (nginx, haproxy) on a free address,
// pinned to the proxy's CPUs, and waits until a request through it is
// answered. configure writes its configuration for its binary bin to
// listen on addr, and returns how to run it and the file its errors go to
// ("" when they go to its output); that file and its output make the error
// when it exits or never answers.
func (r *rig) startPeer(name string, configure func(bin, addr string) (spec procrun.Spec, errorLog string, err error)) (*proc, error) {
	bin, err := peerBinary(name)
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	spec, errorLog, err := configure(bin, addr)
	if err != nil {
		return nil, err
	}
	p, err := r.start(name, r.o.PinProxy, spec)
	if err != nil {
		return nil, err
	}
	p.addr = addr
	if err := poll(10*time.Second, name+" answers", func() bool {
		code, _ := httpGet("http://"+addr+"/counter/warm/", time.Second)
		return code == 200 || exited(p)
	}); err != nil || exited(p) {
		if err == nil {
			err = errors.New(name + " exited")
		}
		var b []byte
		if errorLog != "" {
			b, _ = os.ReadFile(errorLog)
		}
		return nil, fmt.Errorf("%w\n%s%s", err, p.Log(), b)
	}
	return p, nil
}

// startNginx starts nginx in front of backend (nginxConf).
func (r *rig) startNginx(backend string) (*proc, error) {
	p, err := r.startPeer("nginx", func(bin, addr string) (procrun.Spec, string, error) {
		dir := filepath.Join(r.dir, "nginx")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return procrun.Spec{}, "", err
		}
		conf := fmt.Sprintf(nginxConf, dir, dir, dir, dir, dir, dir, dir, backend, addr)
		cfgPath, errorLog := filepath.Join(dir, "nginx.conf"), filepath.Join(dir, "error.log")
		spec := procrun.Spec{Bin: bin, Args: []string{"-p", dir, "-c", cfgPath, "-e", errorLog}}
		return spec, errorLog, os.WriteFile(cfgPath, []byte(conf), 0o644)
	})
	if err != nil {
		return nil, err
	}
	p.pids = append([]int{p.Pid()}, children(p.Pid())...)
	return p, nil
}

// nginxConf: static upstream with keep-alive (no per-request connection
// churn), HTTP/1.1 upstream, no access log, response buffering off for the
// streamed bodies (/blob, read in 64 KiB pieces), request buffering off,
// WebSocket upgrades passed on for /ws (nginx's documented setup), and
// X-Forwarded-For, -Proto and -Host set as the pinboard sets them, so that
// every proxy hands its backend the same fields (proxy_set_header is not
// inherited by a location that sets its own, hence the repetition).
const nginxConf = `daemon off;
master_process on;
worker_processes auto;
user root root;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 8192; multi_accept on; }
http {
  access_log off;
  client_body_temp_path %s/body;
  proxy_temp_path %s/proxy;
  fastcgi_temp_path %s/fcgi;
  uwsgi_temp_path %s/uwsgi;
  scgi_temp_path %s/scgi;
  keepalive_requests 1000000;
  upstream backend {
    server %s;
    keepalive 1024;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
  }
  server {
    listen %s reuseport backlog=4096;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_request_buffering off;
    }
    location ~ /ws$ {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_read_timeout 300s;
      proxy_send_timeout 300s;
      proxy_buffering off;
    }
    location ~ /blob$ {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_buffering off;
      proxy_buffer_size 64k;
      proxy_buffers 8 64k;
      proxy_busy_buffers_size 128k;
      proxy_request_buffering off;
    }
  }
}
`

// startHAProxy starts HAProxy in front of backend (haproxyConf).
func (r *rig) startHAProxy(backend string) (*proc, error) {
	return r.startPeer("haproxy", func(bin, addr string) (procrun.Spec, string, error) {
		cfgPath := filepath.Join(r.dir, "haproxy.cfg")
		spec := procrun.Spec{Bin: bin, Args: []string{"-f", cfgPath, "-db"}}
		return spec, "", os.WriteFile(cfgPath, []byte(fmt.Sprintf(haproxyConf, addr, backend)), 0o644)
	})
}

// haproxyConf: one frontend, one static server, keep-alive both ways with
// idle server connections shared (http-reuse always), no logging,
// X-Forwarded-For, -Proto and -Host set as the pinboard sets them. The
// server takes 512 requests at a time and queues the rest for up to 1 s
// (503 beyond), as the pinboard does per worker by default
// (PINBOARD_WORKER_MAX_CONNS, PINBOARD_WORKER_QUEUE_TIMEOUT).
const haproxyConf = `global
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  timeout http-keep-alive 60s
  timeout queue 1s
  option http-keep-alive
  http-reuse always
  option forwardfor
frontend fe
  bind %s
  http-request set-header X-Forwarded-Proto http
  http-request set-header X-Forwarded-Host %%[req.hdr(host)]
  default_backend be
backend be
  server w1 %s maxconn 512
`

func exited(p *proc) bool {
	select {
	case <-p.Exited():
		return true
	default:
		return false
	}
}

var errPeerMissing = errors.New("not installed")

// children lists the processes whose parent is pid (nginx's workers).
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := statFields(string(b))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// statFields returns the fields of /proc/<pid>/stat after the command
// name: index 0 is the state (field 3 of proc(5)).
func statFields(s string) []string {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(s[i+1:])
}

// cpuTicks returns utime+stime of pid in clock ticks (every thread).
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := statFields(string(b))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64) // utime: field 14
	s, _ := strconv.ParseInt(f[12], 10, 64) // stime: field 15
	return u + s, nil
}

// clkTck is USER_HZ, 100 on every Linux ABI Go supports.
const clkTck = 100

// rssKiB returns VmRSS and VmHWM of pid.
func rssKiB(pid int) (rss, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm
}

// passThrough returns the entries of environ whose names start with prefix
// and are not set in fixed.
func passThrough(environ []string, prefix string, fixed []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, prefix) || slices.ContainsFunc(fixed, func(f string) bool { return strings.HasPrefix(f, k+"=") }) {
			continue
		}
		out = append(out, kv)
	}
	return out
}
