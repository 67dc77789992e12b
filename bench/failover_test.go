package bench

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Each id is asked every max(Interval, N ÷ Rate); the smoke run has one
// small size; bad fields are named.
func TestFailoverOptions(t *testing.T) {
	var full, smoke FailoverOptions
	full.defaults(false)
	smoke.defaults(true)
	if len(full.IDs) != 2 || full.IDs[0] != 100 || full.IDs[1] != 10_000 || len(smoke.IDs) != 1 || smoke.IDs[0] != failoverSmokeIDs {
		t.Errorf("IDs: full %v, smoke %v", full.IDs, smoke.IDs)
	}
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{20, 100 * time.Millisecond}, {100, 100 * time.Millisecond}, {500, 100 * time.Millisecond}, {10_000, 2 * time.Second}} {
		if got := full.interval(c.n); got != c.want {
			t.Errorf("interval(%d) = %v; want %v (100 ms, or N ÷ 5000 req/s)", c.n, got, c.want)
		}
	}
	if err := full.Check(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	for _, c := range []struct {
		o    FailoverOptions
		want string
	}{
		{FailoverOptions{IDs: []int{100, 0}}, "failover ids 0"},
		{FailoverOptions{Interval: -time.Second}, "failover interval -1s"},
		{FailoverOptions{Within: -time.Second}, "failover within -1s"},
		{FailoverOptions{InFlight: -1}, "failover in flight -1"},
	} {
		if err := c.o.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%+v) = %v; want %q", c.o, err, c.want)
		}
	}
}

// The summary counts an id as served again only by a 200 to a request sent
// after the kill (not one sent before it and answered after), from the kill
// to the end of that answer; it sorts what every request that ended after
// the kill got (those in flight at the kill too), and counts failures that
// ended before it apart; an id never served again leaves the percentiles
// that fall on it empty (-1).
func TestFailoverSummary(t *testing.T) {
	ms := time.Millisecond
	tr := &failoverTrace{ids: 4, interval: 100 * ms, kill: 1000 * ms, cpu: 10 * ms, elapsed: 2000 * ms, reqs: []failoverReq{
		{id: 0, status: 200, intended: 0, sent: 1 * ms, done: 2 * ms},
		{id: 1, status: 200, intended: 25 * ms, sent: 26 * ms, done: 27 * ms},
		{id: 2, status: 503, reason: wire.ReasonUnreachable, intended: 948 * ms, sent: 950 * ms, done: 951 * ms}, // before the kill
		{id: 3, status: 200, intended: 989 * ms, sent: 990 * ms, done: 1100 * ms},                                // before the kill, answered after
		{id: 0, status: 503, reason: wire.ReasonUnreachable, intended: 1000 * ms, sent: 1001 * ms, done: 1003 * ms},
		{id: 0, status: 200, intended: 1100 * ms, sent: 1102 * ms, done: 1250 * ms},
		{id: 0, status: 200, intended: 1200 * ms, sent: 1200 * ms, done: 1210 * ms}, // sent later, answered first: the first 200
		{id: 1, status: 0, reason: "timeout", intended: 1025 * ms, sent: 1030 * ms, done: 1530 * ms},
		{id: 1, status: 200, intended: 1125 * ms, sent: 1125 * ms, done: 1400 * ms},
		{id: 2, status: 502, intended: 1050 * ms, sent: 1050 * ms, done: 1060 * ms},
		{id: 2, status: 200, intended: 1150 * ms, sent: 1150 * ms, done: 1160 * ms},
		{id: 3, status: 503, reason: wire.ReasonUnreachable, intended: 1075 * ms, sent: 1080 * ms, done: 1090 * ms},
		{id: 1, status: 503, reason: wire.ReasonUnreachable, intended: 995 * ms, sent: 995 * ms, done: 1005 * ms}, // in flight at the kill
	}}
	r := tr.summary()
	// Recoveries: id 0 at 210 ms (the answer that ended first), id 1 at
	// 400, id 2 at 160, id 3 never.
	if r.Recovered != 3 || r.IDs != 4 || r.RecoveryP50Ms != 210 || r.RecoveryP99Ms != -1 || r.RecoveryMaxMs != -1 {
		t.Errorf("recovery: %d of %d, p50 %v p99 %v max %v; want 3 of 4, 210, -1, -1", r.Recovered, r.IDs, r.RecoveryP50Ms, r.RecoveryP99Ms, r.RecoveryMaxMs)
	}
	// First asks after the kill: 1, 30, 50, 80 ms.
	if r.FirstAskP50Ms != 30 || r.FirstAskMaxMs != 80 {
		t.Errorf("first ask p50 %v max %v; want 30, 80", r.FirstAskP50Ms, r.FirstAskMaxMs)
	}
	if r.Requests != 10 || r.NotOK["503 unreachable"] != 3 || r.NotOK["502 -"] != 1 || len(r.NotOK) != 2 ||
		r.NoAnswer != 1 || r.NoAnswerBy["timeout"] != 1 || r.PreKillNotOK != 1 {
		t.Errorf("answers: requests %d, not ok %v, no answer %d %v, before the kill %d; want 10, 3×503 unreachable and 1×502, 1 timeout, 1",
			r.Requests, r.NotOK, r.NoAnswer, r.NoAnswerBy, r.PreKillNotOK)
	}
	// Lags, sorted: 0 0 0 0 0 1 1 1 1 2 2 5 5 ms (every request, before
	// the kill too).
	if r.LagP50Ms != 1 || r.LagP99Ms != 5 || r.LagMaxMs != 5 || r.ClientCPUUsPerReq != 10_000.0/13 || r.ClientCores != 0.005 {
		t.Errorf("client: lag p50 %v p99 %v max %v, CPU %v µs/req, %v cores; want 1, 5, 5, %v, 0.005", r.LagP50Ms, r.LagP99Ms, r.LagMaxMs, r.ClientCPUUsPerReq, r.ClientCores, 10_000.0/13)
	}
}

// The load asks every id at its slots through a real connection, takes the
// kill time just before calling kill, and ends once every id was answered
// 200 to a request sent after the kill, long before its bound. The server
// stands in for a pinboard whose worker died: after the kill it answers
// each id's first request 503 unreachable, then 200.
func TestFailoverLoad(t *testing.T) {
	var mu sync.Mutex
	dead := false
	refused := map[string]bool{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		defer mu.Unlock()
		p := string(ctx.Path())
		if dead && !refused[p] {
			refused[p] = true
			ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonUnreachable)
			ctx.SetStatusCode(503)
			return
		}
		ctx.SetStatusCode(200)
	}}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		<-served
	})
	const n = 10
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "id" + string(rune('a'+i))
	}
	client := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 16, MaxIdemponentCallAttempts: 1}
	defer client.CloseIdleConnections()
	load := failoverLoad{client: client, base: "http://" + ln.Addr().String(), ids: ids, interval: 50 * time.Millisecond,
		preKill: 200 * time.Millisecond, within: 30 * time.Second, timeout: 10 * time.Second, inFlight: 16}
	prepared := false
	tr, err := load.run(context.Background(), func() error { prepared = true; return nil }, func() {
		if !prepared {
			t.Error("kill before prepare")
		}
		mu.Lock()
		dead = true
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	r := tr.summary()
	if r.Recovered != n || r.RecoveryMaxMs < 0 {
		t.Fatalf("%d of %d ids served again (max %v ms)", r.Recovered, n, r.RecoveryMaxMs)
	}
	// Every id was refused exactly once after the kill (by a request sent
	// after it, or by one in flight at it), and nothing before it.
	if r.NotOK["503 unreachable"] != n || len(r.NotOK) != 1 || r.PreKillNotOK != 0 || r.NoAnswer != 0 {
		t.Errorf("answers after the kill %v, not ok before it %d, no answer %d; want %d × 503 unreachable and nothing else", r.NotOK, r.PreKillNotOK, r.NoAnswer, n)
	}
	var before int
	for _, q := range tr.reqs {
		if q.sent < tr.kill {
			before++
		}
		if q.sent < q.intended || q.done < q.sent || q.id < 0 || q.id >= n {
			t.Fatalf("request %+v: out of order", q)
		}
	}
	if before < n {
		t.Errorf("%d requests before the kill; want every id asked (%d)", before, n)
	}
	// Every id was served again by its second request after the kill (a
	// tenth of a second); a load that ran on to its bound (30 s) would
	// have sent 6 000.
	if r.Requests > 2000 {
		t.Errorf("%d requests after the kill; the load did not stop once every id was served", r.Requests)
	}
	if r.LagMaxMs < 0 || r.ClientCPUUsPerReq <= 0 {
		t.Errorf("client: lag max %v ms, CPU %v µs/req", r.LagMaxMs, r.ClientCPUUsPerReq)
	}
}

// checkFailoverSmoke checks the failover suite's smoke run: in both
// configurations every id was served again and nothing failed before the
// kill; fast failover proved one death and moved the ids before a
// lease-only pinboard could (which answered 503 meanwhile and proved
// nothing); both cost Redis commands.
func checkFailoverSmoke(t *testing.T, r *SuiteResult) {
	t.Helper()
	if r == nil {
		t.Error("no failover suite result")
		return
	}
	runs := map[string]FailoverRun{}
	for _, x := range r.Failover {
		runs[x.Config] = x
	}
	fast, lease := runs["fast"], runs["lease-only"]
	if len(r.Failover) != 2 || fast.IDs != failoverSmokeIDs || lease.IDs != failoverSmokeIDs {
		t.Fatalf("failover runs: %+v; want one fast and one lease-only with %d ids", r.Failover, failoverSmokeIDs)
	}
	for _, x := range []FailoverRun{fast, lease} {
		if x.Recovered != x.IDs || x.PreKillNotOK != 0 || x.RedisCommands <= 0 || x.Requests <= 0 || x.ClientCPUUsPerReq <= 0 {
			t.Errorf("failover %s: %d of %d served again, %d not ok before the kill, %d Redis commands, %d requests, client CPU %v µs/req",
				x.Config, x.Recovered, x.IDs, x.PreKillNotOK, x.RedisCommands, x.Requests, x.ClientCPUUsPerReq)
		}
	}
	if fast.DeathsProven != 1 || fast.FastFailovers < 1 {
		t.Errorf("fast: %v deaths proven, %v fast failovers; want 1 and at least 1", fast.DeathsProven, fast.FastFailovers)
	}
	if lease.DeathsProven != 0 || lease.FastFailovers != 0 || statusClass(lease, true) == 0 {
		t.Errorf("lease-only: %v deaths proven, %v fast failovers, answers %v; want none, none, and 503s while the lease ran", lease.DeathsProven, lease.FastFailovers, lease.NotOK)
	}
	if !(fast.RecoveryMaxMs >= 0 && fast.RecoveryMaxMs < lease.RecoveryP50Ms) {
		t.Errorf("recovery: fast max %v ms, lease-only p50 %v ms; want every id moved by fast failover before half of them could move at the lease's end",
			fast.RecoveryMaxMs, lease.RecoveryP50Ms)
	}
	if v, ok := r.Values["20 ids lease-only/fast recovery p50"]; !ok || !(v > 1) {
		t.Errorf("failover: lease-only/fast recovery p50 = %v (present %v); want > 1", v, ok)
	}
}
