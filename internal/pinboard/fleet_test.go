package pinboard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fasthttp/router"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/placement"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/worker"
)

// The tests in this file run real pinboards (with the proxy), real
// worker.Workers and real host.Hosts on 127.0.0.1, sharing one redis-server.

// activations watches the object's lifecycle across every host of a test:
// a second live instance of one id anywhere is a duplicate.
type activations struct {
	mu    sync.Mutex
	live  map[string]int
	total map[string]int
	dups  []string
	fires []fire // alarm runs (alarms_test.go)
}

func newActivations() *activations {
	return &activations{live: map[string]int{}, total: map[string]int{}}
}

func (a *activations) up(id, worker string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live[id]++
	a.total[id]++
	if a.live[id] > 1 {
		a.dups = append(a.dups, id+" (again on "+worker+")")
	}
}

func (a *activations) down(id string) {
	a.mu.Lock()
	a.live[id]--
	a.mu.Unlock()
}

func (a *activations) check(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.dups) > 0 {
		t.Errorf("two live instances of one id: %v", a.dups)
	}
}

// obj is the test object: it counts its requests and says where it lives.
type obj struct {
	inst   *host.Instance
	worker string
	nonce  string
	n      int
}

type objState struct {
	Worker string `json:"worker"`
	ID     string `json:"id"`
	N      int    `json:"n"`
	Nonce  string `json:"nonce"`
}

func objType(worker string, act *activations) host.Type[*obj] {
	r := host.NewRoutes[*obj]()
	r.GET("/", func(o *obj, x *host.Ctx) error {
		o.n++
		return x.JSON(200, objState{Worker: o.worker, ID: o.inst.ID(), N: o.n, Nonce: o.nonce})
	})
	r.POST("/alarm", setAlarm)
	return host.Type[*obj]{
		Alarm: func(o *obj, x *host.AlarmCtx) error {
			o.n++
			act.fired(fire{id: o.inst.ID(), worker: o.worker, nonce: o.nonce, name: x.Name(), scheduled: x.Scheduled(), attempt: x.Attempt(), at: time.Now()})
			return nil
		},
		New: func(inst *host.Instance) (*obj, error) {
			var b [6]byte
			_, _ = rand.Read(b[:])
			act.up(inst.ID(), worker)
			return &obj{inst: inst, worker: worker, nonce: hex.EncodeToString(b[:])}, nil
		},
		Teardown: func(o *obj) { act.down(o.inst.ID()) },
		Routes:   r,
	}
}

// link is a TCP forwarder that the test can cut (a worker behind a cut
// link to its pinboard is partitioned, like a crashed or frozen process,
// and cannot even release its placements) or stall (connections stay
// open, no RST or FIN, but no byte passes either way: a stalled middlebox
// or a paused sidecar, which nothing on either side notices).
type link struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   []net.Conn
	cut     bool
	stalled bool
	resume  *sync.Cond // broadcast when stalled turns false or the link is cut
	wg      sync.WaitGroup
}

func newLink(t *testing.T, to string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &link{ln: ln}
	l.resume = sync.NewCond(&l.mu)
	l.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", to)
			l.mu.Lock()
			if err != nil || l.cut {
				l.mu.Unlock()
				c.Close()
				if up != nil {
					up.Close()
				}
				continue
			}
			l.conns = append(l.conns, c, up)
			l.mu.Unlock()
			l.wg.Go(func() { l.pump(up, c); up.Close() })
			l.wg.Go(func() { l.pump(c, up); c.Close() })
		}
	})
	t.Cleanup(func() { l.sever(); l.wg.Wait() })
	return l
}

// pump copies src to dst, holding what it read while the link is stalled.
func (l *link) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.mu.Lock()
			for l.stalled && !l.cut {
				l.resume.Wait()
			}
			l.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// stall stops every byte on the link, both ways, keeping the connections
// open; unstall lets them pass again.
func (l *link) stall()   { l.setStalled(true) }
func (l *link) unstall() { l.setStalled(false) }

func (l *link) setStalled(v bool) {
	l.mu.Lock()
	l.stalled = v
	l.resume.Broadcast()
	l.mu.Unlock()
}

// sever cuts the link: every connection closes and new ones are refused.
func (l *link) sever() {
	l.mu.Lock()
	l.cut = true
	l.resume.Broadcast()
	for _, c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.ln.Close()
}

// fleetWorker is a real worker with a real host of obj.
type fleetWorker struct {
	name string
	w    *worker.Worker
	h    *host.Host
	link *link
	srv  *fasthttp.Server
	ln   net.Listener
	once sync.Once
	// frozen, while open, holds every request in the handler, and the
	// worker's link to its pinboard is stalled: a stopped process (its
	// kernel still accepts connections; nothing answers).
	frozenMu sync.Mutex
	frozen   chan struct{}
}

// freeze stops the worker like SIGSTOP: no answer, no heartbeat, its port
// still open.
func (fw *fleetWorker) freeze() {
	fw.frozenMu.Lock()
	fw.frozen = make(chan struct{})
	fw.frozenMu.Unlock()
	fw.link.stall()
}

// thaw lets it run again.
func (fw *fleetWorker) thaw() {
	fw.frozenMu.Lock()
	if fw.frozen != nil {
		close(fw.frozen)
		fw.frozen = nil
	}
	fw.frozenMu.Unlock()
	fw.link.unstall()
}

// wait blocks while the worker is frozen.
func (fw *fleetWorker) wait() {
	fw.frozenMu.Lock()
	f := fw.frozen
	fw.frozenMu.Unlock()
	if f != nil {
		<-f
	}
}

// startFleetWorker starts a worker registered with the pinboard at
// pinboardAddr through a link, with the given idle timeout for instances.
func startFleetWorker(t *testing.T, name, pinboardAddr string, act *activations, idle time.Duration) *fleetWorker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fw := &fleetWorker{name: name, link: newLink(t, pinboardAddr), ln: ln}
	fw.w, err = worker.New(worker.Config{
		PinboardURL: "http://" + fw.link.ln.Addr().String(), AdvertiseURL: "http://" + ln.Addr().String(), Token: token,
		LeaseBuffer: 500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, RetryInterval: 100 * time.Millisecond,
		ReleaseAttempts: 1, Logger: discardLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	fw.h, err = host.New(host.Config{Namespace: "/counter", Worker: fw.w, IdleTimeout: idle, SweepInterval: 50 * time.Millisecond,
		Logger: discardLogger()}, objType(name, act))
	if err != nil {
		t.Fatal(err)
	}
	if err := fw.h.Start(); err != nil {
		t.Fatal(err)
	}
	r := router.New()
	fw.w.Mount(r)
	handler := fw.h.Wrap(r.Handler)
	fw.srv = &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { fw.wait(); handler(ctx) },
		IdleTimeout: time.Minute, MaxIdleWorkerDuration: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = fw.srv.Serve(ln) })
	wg.Go(func() { _ = fw.w.Run(ctx) })
	t.Cleanup(func() {
		fw.thaw()
		fw.kill()
		cancel()
		hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer hcancel()
		_ = fw.h.Close(hctx)
		wg.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for !fw.w.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("worker %s never became ready", name)
		}
		time.Sleep(10 * time.Millisecond) // registration crosses the pinboard and its store
	}
	return fw
}

// kill makes the worker vanish like a crashed process: its port closes and
// it can no longer reach the pinboard.
func (fw *fleetWorker) kill() {
	fw.once.Do(func() {
		fw.link.sever()
		_ = fw.ln.Close()
		_ = fw.srv.Shutdown()
		// The process's instances die with it (an expired context aborts
		// them all; their releases fail on the severed link).
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = fw.h.Close(ctx)
	})
}

// fleetPinboard is a running pinboard with its data plane.
type fleetPinboard struct {
	*running
	res *placement.Resolver
}

func startFleetPinboard(t *testing.T, redisURL string) *fleetPinboard {
	t.Helper()
	fp := &fleetPinboard{running: start(t, Settings{RedisURL: redisURL})}
	fp.res = fp.p.dp.res
	fp.waitHealth(t, 200)
	return fp
}

type answer struct {
	code  int
	state objState
	body  string
	retry string
}

func (fp *fleetPinboard) get(t *testing.T, id string) answer {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + fp.public + "/counter/" + id + "/")
	if err := fp.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("GET %s: %v", id, err)
	}
	a := answer{code: resp.StatusCode(), body: string(resp.Body()), retry: string(resp.Header.Peek(wire.HeaderRetryAfter))}
	if a.code == 200 {
		if err := json.Unmarshal(resp.Body(), &a.state); err != nil {
			t.Fatalf("GET %s: %s: %v", id, resp.Body(), err)
		}
	}
	return a
}

// Concurrent first requests for the same ids through two pinboards sharing
// one Redis activate exactly one instance per id, and every request reaches
// it.
func TestFleetOneInstanceAcrossPinboards(t *testing.T) {
	srv := redistest.Start(t)
	p1, p2 := startFleetPinboard(t, srv.URL), startFleetPinboard(t, srv.URL)
	act := newActivations()
	startFleetWorker(t, "a", p1.public, act, time.Minute)
	startFleetWorker(t, "b", p2.public, act, time.Minute)
	startFleetWorker(t, "c", p1.public, act, time.Minute)
	for i := range 25 {
		id := fmt.Sprintf("one%d", i)
		answers := make([]answer, 6)
		var wg sync.WaitGroup
		for j := range answers {
			wg.Go(func() { answers[j] = []*fleetPinboard{p1, p2}[j%2].get(t, id) })
		}
		wg.Wait()
		for j, a := range answers {
			if a.code != 200 || a.state.Nonce != answers[0].state.Nonce {
				t.Fatalf("%s: answer %d = %d %s; answer 0 = %s; want one instance", id, j, a.code, a.body, answers[0].body)
			}
		}
		act.mu.Lock()
		n := act.total[id]
		act.mu.Unlock()
		if n != 1 {
			t.Fatalf("%s activated %d times; want 1", id, n)
		}
	}
	act.check(t)
}

// A release (the instance closed for idleness on its worker) invalidates
// the cached placement in both pinboards; the next request, through either,
// activates one fresh instance.
func TestFleetReleaseInvalidatesBothPinboards(t *testing.T) {
	srv := redistest.Start(t)
	p1, p2 := startFleetPinboard(t, srv.URL), startFleetPinboard(t, srv.URL)
	act := newActivations()
	startFleetWorker(t, "a", p1.public, act, 400*time.Millisecond)
	first := p1.get(t, "x")
	if first.code != 200 {
		t.Fatalf("GET x = %d %s", first.code, first.body)
	}
	// Both pinboards serve x from their caches (each read the placement,
	// so Redis tracks it for both).
	for _, p := range []*fleetPinboard{p1, p2} {
		res := p.res
		deadline := time.Now().Add(5 * time.Second)
		for {
			hits := res.CacheStats().Hits
			if a := p.get(t, "x"); a.state.Nonce != first.state.Nonce {
				t.Fatalf("GET x = %s; want the first instance", a.body)
			}
			if res.CacheStats().Hits > hits {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("x never served from the cache")
			}
		}
	}
	inv1, inv2 := p1.res.CacheStats().Invalidations, p2.res.CacheStats().Invalidations
	// Idle for 400 ms: the host closes the instance and releases x.
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, err := p1.p.Store().Placement(context.Background(), "/counter", "x")
		if err != nil {
			t.Fatal(err)
		}
		if h == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("x was never released")
		}
		time.Sleep(20 * time.Millisecond) // the release crosses the worker's loop, the registry and Redis
	}
	deadline = time.Now().Add(5 * time.Second)
	for p1.res.CacheStats().Invalidations == inv1 || p2.res.CacheStats().Invalidations == inv2 {
		if time.Now().After(deadline) {
			t.Fatal("the release's invalidation did not reach both pinboards")
		}
		time.Sleep(5 * time.Millisecond) // Redis pushes invalidations asynchronously
	}
	again := p2.get(t, "x")
	if again.code != 200 || again.state.Nonce == first.state.Nonce || again.state.N != 1 {
		t.Fatalf("GET x after the release = %s; want a fresh instance", again.body)
	}
	if a := p1.get(t, "x"); a.state.Nonce != again.state.Nonce {
		t.Fatalf("pinboard 1 after the release = %s; want the fresh instance %s", a.body, again.state.Nonce)
	}
	act.check(t)
}

// With fast failover off (the lease path), a worker that vanishes (no
// heartbeats, port closed): its ids answer 503 + Retry-After while its lease
// may still run in the store, then activate on another worker.
func TestFleetKilledWorkerIDsMoveAfterLease(t *testing.T) {
	srv := redistest.Start(t)
	p := &fleetPinboard{running: start(t, Settings{RedisURL: srv.URL, NoFastFailover: true})}
	p.res = p.p.dp.res
	p.waitHealth(t, 200)
	act := newActivations()
	a := startFleetWorker(t, "a", p.public, act, time.Minute)
	if ans := p.get(t, "x"); ans.state.Worker != "a" {
		t.Fatalf("GET x = %s; want a (the only worker)", ans.body)
	}
	startFleetWorker(t, "b", p.public, act, time.Minute)
	killed := time.Now()
	a.kill()
	lease := 2 * time.Second // start's default
	var moved answer
	for moved.code != 200 {
		ans := p.get(t, "x")
		switch {
		case ans.code == 200:
			moved = ans
		case ans.code != 503 || ans.retry == "":
			t.Fatalf("GET x with a gone = %d %s (Retry-After %q); want 503 with Retry-After", ans.code, ans.body, ans.retry)
		case time.Since(killed) > lease+5*time.Second:
			t.Fatalf("x did not move within %v of a's death", lease+5*time.Second)
		}
		time.Sleep(20 * time.Millisecond) // a client retrying
	}
	el := time.Since(killed)
	if moved.state.Worker != "b" || moved.state.N != 1 {
		t.Errorf("x after a's lease = %s; want a fresh instance on b", moved.body)
	}
	// a's last acknowledged heartbeat was at most a heartbeat interval
	// (300 ms) before the kill; its lease ran from that heartbeat's send.
	if el < lease-400*time.Millisecond {
		t.Errorf("x moved %v after the kill, before a's lease (%v) could have run out", el, lease)
	}
	t.Logf("x moved to b %v after a was killed (lease %v)", el, lease)
}

// Drain: once a worker reports draining, new ids go to other workers while
// the ids it holds keep being served by it.
func TestFleetDrainMovesNewIDsAway(t *testing.T) {
	srv := redistest.Start(t)
	p := startFleetPinboard(t, srv.URL)
	act := newActivations()
	a := startFleetWorker(t, "a", p.public, act, time.Minute)
	for i := range 5 {
		if ans := p.get(t, fmt.Sprintf("old%d", i)); ans.state.Worker != "a" {
			t.Fatalf("GET old%d = %s; want a", i, ans.body)
		}
	}
	startFleetWorker(t, "b", p.public, act, time.Minute)
	if code, body := p.do("POST", p.public, wire.PathPush, token, wire.PushRequest{ClientID: a.w.ClientID(), Type: wire.MessageDrain}); code != 202 {
		t.Fatalf("push drain = %d %s", code, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var ws wire.WorkersResponse
		_, body := p.do("GET", p.public, wire.PathWorkers, token, nil)
		_ = json.Unmarshal(body, &ws)
		draining := false
		for _, w := range ws.Workers {
			draining = draining || w.ClientID == a.w.ClientID() && w.Draining
		}
		if draining {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a never reported draining: %s", body)
		}
		time.Sleep(20 * time.Millisecond) // the drain travels in a heartbeat ack and the next heartbeat
	}
	for i := range 15 {
		if ans := p.get(t, fmt.Sprintf("new%d", i)); ans.state.Worker != "b" {
			t.Fatalf("GET new%d = %d %s; want b", i, ans.code, ans.body)
		}
	}
	for i := range 5 {
		if ans := p.get(t, fmt.Sprintf("old%d", i)); ans.state.Worker != "a" || ans.state.N != 2 {
			t.Errorf("GET old%d during a's drain = %d %s; want a's instance, second request", i, ans.code, ans.body)
		}
	}
	act.check(t)
}

// One pinboard's Redis link goes silent (a stalled middlebox: connections
// open, no byte passes, nothing to notice) while the placements it cached
// move: the instances idle out and release, and the other pinboard places
// the ids again, about half on the other worker. The silent pinboard still
// routes from its cache, with the old epochs. No id may get a second live
// instance: the old holder refuses those routes (503 stale, its instance
// closed under that epoch), and the silent pinboard answers 503 +
// Retry-After, or reaches the one current instance.
func TestFleetSilentRedisLinkNeverActivatesTwice(t *testing.T) {
	srv := redistest.Start(t)
	toRedis := newLink(t, srv.Addr)
	p1 := startFleetPinboard(t, "redis://"+toRedis.ln.Addr().String()+"/0")
	p2 := startFleetPinboard(t, srv.URL)
	act := newActivations()
	startFleetWorker(t, "a", p2.public, act, 400*time.Millisecond)
	startFleetWorker(t, "b", p2.public, act, 400*time.Millisecond)

	const n = 20
	ids := make([]string, n)
	first := map[string]string{} // id -> worker of its first instance
	for i := range ids {
		ids[i] = fmt.Sprintf("silent%d", i)
		for range 2 { // the second is served from p1's cache
			a := p1.get(t, ids[i])
			if a.code != 200 {
				t.Fatalf("GET %s through p1 = %d %s", ids[i], a.code, a.body)
			}
			first[ids[i]] = a.state.Worker
		}
	}
	toRedis.stall()
	defer toRedis.unstall() // before the cleanups close p1's store

	// Every instance idles out and releases its placement (through the
	// workers' own pinboard, p2).
	deadline := time.Now().Add(20 * time.Second)
	for _, id := range ids {
		for {
			h, err := p2.p.Store().Placement(context.Background(), "/counter", id)
			if err != nil {
				t.Fatal(err)
			}
			if h == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s was never released", id)
			}
			time.Sleep(20 * time.Millisecond) // the idle sweep, the release call and Redis
		}
	}
	// p2 places them again; keep them busy so they do not idle out while
	// p1 is asked.
	current := map[string]string{} // id -> nonce of its current instance
	moved := 0
	for _, id := range ids {
		a := p2.get(t, id)
		if a.code != 200 {
			t.Fatalf("GET %s through p2 = %d %s", id, a.code, a.body)
		}
		current[id] = a.state.Nonce
		if a.state.Worker != first[id] {
			moved++
		}
	}
	t.Logf("%d of %d ids placed again on the other worker", moved, n)

	var wg sync.WaitGroup
	answers := make([]answer, n)
	for i, id := range ids {
		wg.Go(func() { answers[i] = p1.get(t, id) })
	}
	wg.Wait()
	refused := 0
	for i, a := range answers {
		switch {
		case a.code == 200 && a.state.Nonce == current[ids[i]]:
		case a.code == 503 && a.retry != "":
			refused++
		default:
			t.Errorf("GET %s through the silent pinboard = %d %s (Retry-After %q); want 503 + Retry-After or the current instance %s",
				ids[i], a.code, a.body, a.retry, current[ids[i]])
		}
	}
	t.Logf("the silent pinboard: %d of %d answered 503 + Retry-After, the rest reached the current instance", refused, n)
	act.check(t)
	act.mu.Lock()
	defer act.mu.Unlock()
	for _, id := range ids {
		if act.total[id] != 2 {
			t.Errorf("%s activated %d times; want 2 (once per placement)", id, act.total[id])
		}
	}
}

// A namespace no worker has served recently is a 404 unknown_namespace
// without Retry-After (clients stop asking), on both engines; one whose
// workers all went away a moment ago stays 503 no_worker with Retry-After.
func TestFleetUnknownNamespaceIs404(t *testing.T) {
	for _, loops := range []int{0, 1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			srv := redistest.Start(t)
			fp := &fleetPinboard{running: start(t, Settings{RedisURL: srv.URL, Loops: loops})}
			fp.res = fp.p.dp.res
			fp.waitHealth(t, 200)
			act := newActivations()
			fw := startFleetWorker(t, "a", fp.public, act, time.Minute)
			if a := fp.get(t, "alice"); a.code != 200 {
				t.Fatalf("GET /counter/alice/ = %d %s", a.code, a.body)
			}
			for _, path := range []string{"/nosuchns/alice/", "/Counter/alice/"} {
				code, h, body := fp.request(t, "GET", path)
				if code != 404 || h.Peek(wire.HeaderReason) == nil || string(h.Peek(wire.HeaderReason)) != wire.ReasonUnknownNamespace ||
					h.Peek(wire.HeaderRetryAfter) != nil {
					t.Fatalf("GET %s = %d %s (reason %q, Retry-After %q); want 404 unknown_namespace without Retry-After",
						path, code, body, h.Peek(wire.HeaderReason), h.Peek(wire.HeaderRetryAfter))
				}
			}
			// The only worker leaves (its session ends at once).
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := fw.w.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			code, h, body := fp.request(t, "GET", "/counter/alice/")
			if code != 503 || string(h.Peek(wire.HeaderReason)) != wire.ReasonNoWorker || h.Peek(wire.HeaderRetryAfter) == nil {
				t.Fatalf("GET /counter/alice/ after its workers left = %d %s (reason %q); want 503 no_worker with Retry-After",
					code, body, h.Peek(wire.HeaderReason))
			}
		})
	}
}

// request sends one request through the pinboard's public port and returns the answer's status, head and body.
func (fp *fleetPinboard) request(t *testing.T, method, path string) (int, *fasthttp.ResponseHeader, string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + fp.public + path)
	if err := fp.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	h := &fasthttp.ResponseHeader{}
	resp.Header.CopyTo(h)
	return resp.StatusCode(), h, string(resp.Body())
}

// A worker that died leaves its ids unreachable until its lease runs out:
// the 503's Retry-After says how long that still is (the lease left), on
// both engines, rather than a flat second, so that clients do not poll in
// vain.
func TestFleetRetryAfterIsTheLeaseLeft(t *testing.T) {
	const lease = 8 * time.Second
	for _, loops := range []int{0, 1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			srv := redistest.Start(t)
			p := &fleetPinboard{running: start(t, Settings{RedisURL: srv.URL, Lease: lease, Loops: loops, NoFastFailover: true})}
			p.res = p.p.dp.res
			p.waitHealth(t, 200)
			act := newActivations()
			a := startFleetWorker(t, "a", p.public, act, time.Minute)
			if ans := p.get(t, "x"); ans.code != 200 {
				t.Fatalf("GET x = %d %s", ans.code, ans.body)
			}
			startFleetWorker(t, "b", p.public, act, time.Minute)
			a.kill()
			killed := time.Now()
			ans := p.get(t, "x")
			n, err := strconv.Atoi(ans.retry)
			// a's last acknowledged heartbeat was at most 300 ms before the
			// kill, and its lease runs 8 s from it.
			left := lease - time.Since(killed)
			if ans.code != 503 || err != nil || n < int(left/time.Second)-1 || time.Duration(n)*time.Second > lease {
				t.Fatalf("GET x after a died = %d %s, Retry-After %q; want 503 with Retry-After about the lease left (%v)",
					ans.code, ans.body, ans.retry, left.Round(time.Second))
			}
			t.Logf("Retry-After %ds, %v after the kill (lease %v)", n, time.Since(killed).Round(time.Millisecond), lease)
		})
	}
}

// Fast failover: a worker whose process is gone (its port refuses
// connections) loses its ids at once. The first request after the death
// finds it refused, the pinboard's probe confirms the refusal and ends its
// session, and that same request is served by a new instance on the other
// worker, long before the lease could have run out.
func TestFleetKilledWorkerIDsMoveAtOnce(t *testing.T) {
	const lease = 8 * time.Second
	for _, loops := range []int{0, 1} {
		t.Run(fmt.Sprintf("loops=%d", loops), func(t *testing.T) {
			srv := redistest.Start(t)
			p := &fleetPinboard{running: start(t, Settings{RedisURL: srv.URL, Lease: lease, Loops: loops})}
			p.res = p.p.dp.res
			p.waitHealth(t, 200)
			act := newActivations()
			a := startFleetWorker(t, "a", p.public, act, time.Minute)
			ids := []string{"k0", "k1", "k2", "k3", "k4"}
			for _, id := range ids {
				if ans := p.get(t, id); ans.state.Worker != "a" {
					t.Fatalf("GET %s = %s; want a (the only worker)", id, ans.body)
				}
			}
			startFleetWorker(t, "b", p.public, act, time.Minute)
			a.kill()
			killed := time.Now()
			for _, id := range ids {
				ans := p.get(t, id)
				if ans.code != 200 || ans.state.Worker != "b" || ans.state.N != 1 {
					t.Fatalf("GET %s after a died = %d %s; want a fresh instance on b at once", id, ans.code, ans.body)
				}
			}
			el := time.Since(killed)
			if el > lease/2 {
				t.Errorf("the ids moved %v after the kill; want well within the lease (%v)", el, lease)
			}
			if got := p.counter(t, `pinned_placement_death_probes_total{result="dead"}`); got != 1 {
				t.Errorf("death probes that proved a gone: %d; want 1", got)
			}
			act.check(t)
			t.Logf("%d ids moved to b %v after a was killed (lease %v)", len(ids), el.Round(time.Millisecond), lease)
		})
	}
}

// A frozen worker (stopped: its port still accepts connections, nothing
// answers, no heartbeat) keeps its ids for the whole lease: no probe can
// prove it gone. Once the lease has run out in the store, the ids move
// within a second, while it is still frozen.
func TestFleetFrozenWorkerKeepsItsIDsForTheLease(t *testing.T) {
	const lease = 3 * time.Second
	srv := redistest.Start(t)
	p := &fleetPinboard{running: start(t, Settings{RedisURL: srv.URL, Lease: lease})}
	p.res = p.p.dp.res
	p.waitHealth(t, 200)
	act := newActivations()
	a := startFleetWorker(t, "a", p.public, act, time.Minute)
	if ans := p.get(t, "f"); ans.state.Worker != "a" {
		t.Fatalf("GET f = %s; want a (the only worker)", ans.body)
	}
	startFleetWorker(t, "b", p.public, act, time.Minute)
	a.freeze()
	frozen := time.Now()
	quick := &fasthttp.Client{MaxIdleConnDuration: time.Second}
	var moved time.Duration
	for moved == 0 {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://" + p.public + "/counter/f/")
		err := quick.DoTimeout(req, resp, 300*time.Millisecond)
		el := time.Since(frozen)
		if err == nil && resp.StatusCode() == 200 {
			var st objState
			_ = json.Unmarshal(resp.Body(), &st)
			if st.Worker != "b" {
				t.Fatalf("GET f while a is frozen = %s; want no answer from a", resp.Body())
			}
			moved = el
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if el > lease+5*time.Second {
			t.Fatalf("f did not move within %v of the freeze", el)
		}
	}
	// a's last acknowledged heartbeat was at most a heartbeat interval
	// (300 ms) before the freeze; its lease ran from that heartbeat's send.
	if moved < lease-400*time.Millisecond {
		t.Fatalf("f moved %v after the freeze, before a's lease (%v) could have run out", moved, lease)
	}
	if moved > lease+time.Second+300*time.Millisecond {
		t.Errorf("f moved %v after the freeze: more than a second after a's lease (%v) ran out", moved, lease)
	}
	if got := p.counter(t, `pinned_placement_death_probes_total{result="dead"}`); got != 0 {
		t.Errorf("a probe proved the frozen worker dead (%d); want none", got)
	}
	act.check(t)
	t.Logf("f moved to b %v after a froze (lease %v)", moved.Round(time.Millisecond), lease)
}

// counter reads one series of the pinboard's data-plane metrics.
func (fp *fleetPinboard) counter(t *testing.T, series string) uint64 {
	t.Helper()
	return fp.res.Metrics().GetOrCreateCounter(series).Get()
}

// A worker this pinboard cannot reach (its dials time out: a partition, a
// black hole), while it lives and heartbeats through another path, keeps
// its ids for its lease: a timeout proves nothing, so fast failover's probe
// ends nothing. (With the planted no_death_proof, the ids move at once.)
func TestFleetPartitionedWorkerKeepsItsIDs(t *testing.T) {
	srv := redistest.Start(t)
	var blocked atomic.Pointer[string] // the address whose dials time out
	dial := func(addr string, timeout time.Duration) (net.Conn, error) {
		if b := blocked.Load(); b != nil && *b == addr {
			time.Sleep(timeout)
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}
		}
		return net.DialTimeout("tcp", addr, timeout)
	}
	s := Settings{RedisURL: srv.URL, Lease: 8 * time.Second}
	s.Proxy.Endpoint.Dial = dial
	s.Proxy.Endpoint.DialTimeout = 200 * time.Millisecond
	p := &fleetPinboard{running: start(t, s)}
	p.res = p.p.dp.res
	p.waitHealth(t, 200)
	act := newActivations()
	a := startFleetWorker(t, "a", p.public, act, time.Minute)
	startFleetWorker(t, "b", p.public, act, time.Minute)
	// x is placed on a, and the proxy never connected to a: every request
	// to a dials, into the partition.
	addr := strings.TrimPrefix(a.w.AdvertiseURL(), "http://")
	blocked.Store(&addr)
	if h, err := p.p.Store().Claim(context.Background(), "/counter", "x", a.w.Session()); err != nil || h != a.w.Session() {
		t.Fatalf("Claim x for a = %q, %v", h, err)
	}
	for range 5 {
		ans := p.get(t, "x")
		if ans.code == 200 {
			t.Fatalf("GET x while a is cut off = %s; want no other instance while a's lease runs", ans.body)
		}
	}
	if got := p.counter(t, `pinned_placement_death_probes_total{result="not_proven"}`); got == 0 {
		t.Errorf("no probe of the unreachable worker ran (not_proven = 0)")
	}
	if got := p.counter(t, `pinned_placement_death_probes_total{result="dead"}`); got != 0 {
		t.Errorf("a probe took the unreachable worker for dead (%d)", got)
	}
	if !a.w.Ready() {
		t.Fatal("a lost its lease meanwhile: the test proves nothing")
	}
	act.check(t)
}
