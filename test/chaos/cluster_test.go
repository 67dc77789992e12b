package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/fence"
	"github.com/pinned-go/pinned/internal/testkit/history"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/internal/testkit/tcpfwd"
)

const token = "chaos-deployment-token-0123456789"

var (
	pinboardReady = regexp.MustCompile(`msg="pinboard listening".* public=(\S+) admin=(\S+)`)
	counterReady  = regexp.MustCompile(`msg="counter demo listening".* addr=(\S+)`)
	counterClient = regexp.MustCompile(`msg="fleet mode: registering with the pinboard".* client=(\S+)`)
)

// clusterConfig says how to build and run a cluster.
type clusterConfig struct {
	tags   []string // build tags (faults.BuildTag for planted bugs)
	faults string   // PINNED_FAULTS
	// sentinel runs Redis as a primary, a replica and three sentinels, the
	// pinboards connecting through the sentinels (no store proxies then).
	sentinel bool
	// lease is PINBOARD_LEASE ("": the pinboard's default, 10 s).
	lease string
	// leaseOnly turns the pinboards' fast failover off
	// (PINBOARD_FAST_FAILOVER=off): a dead worker's ids move when its lease
	// ends, on every pinboard at once.
	leaseOnly bool
	// idle is the workers' PINNED_IDLE_TIMEOUT (0: the counter's default,
	// 5 min). The stale-route nemeses need shortIdle, so that the ids the
	// client leaves alone go idle and move within the fault.
	idle time.Duration
}

// shortIdle is the workers' idle timeout under TestChaos (and the planted
// stale-route faults): shorter than a lease, as a pinboard may route from
// its cache that long.
const shortIdle = 3 * time.Second

// cluster is the system under test plus the harness's own history.
type cluster struct {
	t    testing.TB
	cfg  clusterConfig
	dir  string // history files
	hist *history.Writer

	redis     *redistest.Server    // the directory; restarted by a nemesis
	app       *redistest.Server    // the counters' own store (-persist); never faulted
	replica   *redistest.Server    // with sentinel
	sentinels *redistest.Sentinels // with sentinel
	pbs       []*pinboardProc
	ws        []*workerProc
	proxys    []*tcpfwd.Forwarder // worker n's control path (n-1)
	rproxys   []*tcpfwd.Forwarder // pinboard n's store path (n-1); none with sentinel

	mu sync.Mutex // guards processes being replaced

	// drainRetry is how long the drain nemesis retries a refused push
	// (0: drainRetry).
	drainRetry time.Duration

	// onPinboardRestart is called after a pinboard was restarted (the
	// client drops its idle connections to the dead process).
	onPinboardRestart func()
	// storm, set by the client, sends bursts of requests for every id
	// through both pinboards at once until the deadline.
	storm func(until time.Time)
	// client is the load client (set by startClient), which the stale-route
	// nemeses hush and ask through.
	client *loadClient
	all    []*proctest.Proc // every process started, for keep
}

type pinboardProc struct {
	*proctest.Proc
	n    int // 1-based (history.Event.Via)
	addr string
}

type workerProc struct {
	*proctest.Proc
	n        int // 1-based
	inc      int // incarnation
	addr     string
	clientID string
	proc     string // history name "w<n>.<inc>"
}

func startCluster(t testing.TB, cfg clusterConfig) *cluster {
	t.Helper()
	c := &cluster{t: t, cfg: cfg, dir: t.TempDir()}
	h, err := history.Create(filepath.Join(c.dir, "harness.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	c.hist = h
	t.Cleanup(func() { h.Close() })
	c.redis = redistest.Start(t)
	c.app = redistest.Start(t)
	if cfg.sentinel {
		c.replica = redistest.StartReplica(t, c.redis)
		c.sentinels = redistest.StartSentinels(t, c.redis, 3, c.replica)
	} else {
		for range 2 {
			c.rproxys = append(c.rproxys, tcpfwd.Start(t, c.redis.Addr))
		}
	}
	for n := 1; n <= 2; n++ {
		c.pbs = append(c.pbs, c.startPinboard(n, proctest.FreeAddr(t)))
	}
	for n := 1; n <= 3; n++ {
		pb := c.pbs[(n-1)%2]
		px := tcpfwd.Start(t, pb.addr)
		c.proxys = append(c.proxys, px)
		c.ws = append(c.ws, c.startWorker(n, 1, proctest.FreeAddr(t)))
	}
	return c
}

func (c *cluster) env(extra ...string) []string {
	if c.cfg.faults != "" {
		extra = append(extra, "PINNED_FAULTS="+c.cfg.faults)
	}
	return extra
}

func (c *cluster) startPinboard(n int, addr string) *pinboardProc {
	c.t.Helper()
	// The port is reused after a kill: Go listens with SO_REUSEADDR.
	url := c.redis.URL
	switch {
	case c.sentinels != nil:
		url = c.sentinels.URL()
	case len(c.rproxys) > 0:
		url = "redis://" + c.rproxys[n-1].Addr() + "/0" // through the harness's store proxy
	}
	env := []string{
		"PINBOARD_LISTEN=" + addr, "PINBOARD_ADMIN_LISTEN=127.0.0.1:0",
		"PINBOARD_REDIS_URL=" + url, "PINBOARD_TOKEN=" + token,
		"PINBOARD_RESTART_FENCE=10s",
		"PINBOARD_REGISTER_IP_RATE=off", "PINBOARD_REGISTER_TOKEN_RATE=off",
		"PINBOARD_AUTH_FAILURE_RATE=off", "PINBOARD_MAX_SESSIONS_PER_TOKEN=off",
	}
	if c.cfg.leaseOnly {
		env = append(env, "PINBOARD_FAST_FAILOVER=off")
	}
	if c.cfg.lease != "" {
		env = append(env, "PINBOARD_LEASE="+c.cfg.lease)
	}
	p := proctest.Start(c.t, proctest.Spec{
		Name:         fmt.Sprintf("pinboard%d", n),
		Bin:          builder.Build(c.t, "github.com/pinned-go/pinned/cmd/pinboard", c.cfg.tags...),
		Env:          c.env(env...),
		Ready:        pinboardReady,
		ReadyTimeout: 20 * time.Second,
	})
	c.mu.Lock()
	c.all = append(c.all, p)
	c.mu.Unlock()
	return &pinboardProc{Proc: p, n: n, addr: addr}
}

func (c *cluster) startWorker(n, inc int, addr string) *workerProc {
	c.t.Helper()
	proc := fmt.Sprintf("w%d.%d", n, inc)
	env := []string{
		"PINNED_LISTEN=" + addr, "PINNED_PINBOARD_URL=http://" + c.proxys[n-1].Addr(),
		"PINNED_TOKEN=" + token, "PINNED_ADVERTISE_URL=http://" + addr,
		"PINNED_HISTORY=" + filepath.Join(c.dir, proc+".jsonl"),
		"PINNED_PERSIST=" + c.app.URL,
	}
	if c.cfg.idle > 0 {
		env = append(env, "PINNED_IDLE_TIMEOUT="+c.cfg.idle.String())
	}
	p := proctest.Start(c.t, proctest.Spec{
		Name:  proc,
		Bin:   builder.Build(c.t, "github.com/pinned-go/pinned/test/app/counter", c.cfg.tags...), // the fixture: the demo with its history
		Args:  []string{"-shutdown-timeout", "3s"},
		Env:   c.env(env...),
		Ready: counterReady,
	})
	c.mu.Lock()
	c.all = append(c.all, p)
	c.mu.Unlock()
	w := &workerProc{Proc: p, n: n, inc: inc, addr: addr, proc: proc}
	if m := p.WaitLog(counterClient, 10*time.Second); m != nil {
		w.clientID = m[1]
	}
	return w
}

// exited records that a worker process is dead (after it exited).
func (c *cluster) exited(w *workerProc) {
	<-w.Exited()
	c.hist.Write(history.Event{Kind: history.KindExit, Proc: w.proc})
}

// killWorker kills worker n with SIGKILL and starts its next incarnation
// on the same address. It returns the kill.
func (c *cluster) killWorker(n int) kill {
	old, at := c.killOnly(n)
	c.restartWorker(n, old)
	return kill{proc: old.proc, at: at}
}

// killOnly kills worker n with SIGKILL and returns the dead process and
// when (the shared clock) SIGKILL was sent; the worker stays down until
// restartWorker.
func (c *cluster) killOnly(n int) (*workerProc, int64) {
	c.mu.Lock()
	old := c.ws[n-1]
	c.mu.Unlock()
	at := history.Now()
	old.Kill()
	c.exited(old)
	return old, at
}

// restartWorker starts the next incarnation of the dead worker old on its
// address.
func (c *cluster) restartWorker(n int, old *workerProc) {
	nw := c.startWorker(n, old.inc+1, old.addr)
	c.mu.Lock()
	c.ws[n-1] = nw
	c.mu.Unlock()
}

// terminateWorker stops worker n gracefully (SIGTERM) and restarts it.
func (c *cluster) terminateWorker(n int) {
	c.mu.Lock()
	old := c.ws[n-1]
	c.mu.Unlock()
	if !old.Terminate(20 * time.Second) {
		c.t.Errorf("%s did not exit within 20 s of SIGTERM", old.proc)
		old.Kill()
	}
	c.exited(old)
	nw := c.startWorker(n, old.inc+1, old.addr)
	c.mu.Lock()
	c.ws[n-1] = nw
	c.mu.Unlock()
}

func (c *cluster) worker(n int) *workerProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ws[n-1]
}

// killPinboard kills pinboard n with SIGKILL and restarts it on its port.
func (c *cluster) killPinboard(n int) {
	c.mu.Lock()
	old := c.pbs[n-1]
	c.mu.Unlock()
	old.Kill()
	np := c.startPinboard(n, old.addr)
	c.mu.Lock()
	c.pbs[n-1] = np
	f := c.onPinboardRestart
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// stop ends every worker (SIGKILL), recording their deaths, and the rest.
func (c *cluster) stop() {
	for n := range c.ws {
		w := c.worker(n + 1)
		_ = w.Signal(syscall.SIGCONT)
		w.Kill()
		c.exited(w)
	}
	for _, p := range c.pbs {
		p.Kill()
	}
	for _, px := range append(c.proxys, c.rproxys...) {
		px.Close()
	}
}

// recordStored writes, after the run, the count the counters' store holds
// for each id (KindStored), for the checker's persisted-count invariant.
func (c *cluster) recordStored(ids []string) {
	c.t.Helper()
	rdb := redistest.Client(c.t, c.app.URL)
	for _, id := range ids {
		v, _, err := fence.Get(context.Background(), rdb, counterapp.KeyPrefix+id)
		if err != nil {
			c.t.Fatal(err)
		}
		var n int64
		if v != "" {
			if n, err = strconv.ParseInt(v, 10, 64); err != nil {
				c.t.Fatalf("stored count of %s: %q: %v", id, v, err)
			}
		}
		c.hist.Write(history.Event{Kind: history.KindStored, ID: id, Count: n})
	}
}

// events reads every history file of the run.
func (c *cluster) events() []history.Event {
	c.t.Helper()
	files, err := filepath.Glob(filepath.Join(c.dir, "*.jsonl"))
	if err != nil {
		c.t.Fatal(err)
	}
	var all []history.Event
	for _, f := range files {
		ev, err := history.Read(f)
		if err != nil {
			c.t.Fatal(err)
		}
		all = append(all, ev...)
	}
	return all
}

// keep copies the history files to dir (for a failed or long run).
func (c *cluster) keep(dir string) {
	files, _ := filepath.Glob(filepath.Join(c.dir, "*.jsonl"))
	os.MkdirAll(dir, 0o755)
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.all {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d-%s.log", i, p.Spec.Name)), []byte(p.Log()), 0o644)
	}
}
