package chaos

import (
	"encoding/json"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/chaoscheck"
	"github.com/pinned-go/pinned/internal/testkit/history"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// failoverLease is the pinboards' lease in the failover test. Workers keep
// their sessions through a failover only when it completes within lease −
// LeaseBuffer (5 s) − HeartbeatInterval (3 s): 7 s here (2 s with the
// default 10 s lease; docs/redis.md).
const failoverLease = 15 * time.Second

// placements reads the placement of every id ("<epoch> <since> <session>")
// from the Redis at addr.
func placements(t *testing.T, addr string, ids []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, id := range ids {
		v, err := redistest.Command(addr, "GET", wire.KeyPlacement("/counter", id))
		if err != nil {
			t.Fatalf("GET the placement of %s from %s: %v", id, addr, err)
		}
		m[id] = v
	}
	return m
}

// liveSessions asks a pinboard's registry for the live sessions: advertise
// URL -> session id.
func liveSessions(t *testing.T, addr string) map[string]string {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + addr + wire.PathWorkers)
	req.Header.Set("Authorization", "Bearer "+token)
	if err := fasthttp.DoTimeout(req, resp, 5*time.Second); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("GET %s = %v %d %s", wire.PathWorkers, err, resp.StatusCode(), resp.Body())
	}
	var ws wire.WorkersResponse
	if err := json.Unmarshal(resp.Body(), &ws); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, w := range ws.Workers {
		if !w.Superseded {
			m[w.AdvertiseURL] = w.SessionID
		}
	}
	return m
}

var uptimeRE = regexp.MustCompile(`uptime_in_seconds:(\d+)`)

// uptime reads a Redis server's uptime.
func uptime(addr string) time.Duration {
	out, err := redistest.Command(addr, "INFO", "server")
	if m := uptimeRE.FindStringSubmatch(out); err == nil && m != nil {
		n, _ := strconv.Atoi(m[1])
		return time.Duration(n) * time.Second
	}
	return 0
}

// A primary failover under load, with real redis-server and redis-sentinel
// processes: the pinboards reach Redis through three sentinels; the primary
// is killed; the sentinels promote the replica. The client's downtime (the
// span of failed requests after the kill) is at most the failover time
// (kill to promotion) plus 1 s; the workers keep their sessions; every
// placement survives on the replica; and the chaos checker finds no
// overlap.
func TestSentinelFailover(t *testing.T) {
	c := startCluster(t, clusterConfig{sentinel: true, lease: failoverLease.String()})
	for n := 1; n <= 3; n++ {
		waitReady(t, c.worker(n))
	}
	lc := startClient(c, nIDs, clients, *seedFlag)
	lc.waitWarm(t, 40*time.Second)
	// The replica becomes the primary: it must be older than the
	// pinboards' restart fence (10 s), which would rightly refuse to place
	// ids on a Redis that just started.
	for deadline := time.Now().Add(20 * time.Second); uptime(c.replica.Addr) <= 10*time.Second; {
		if time.Now().After(deadline) {
			t.Fatal("the replica's uptime did not pass 10 s")
		}
		time.Sleep(200 * time.Millisecond) // polling Redis's own clock
	}
	time.Sleep(warmup)
	before := liveSessions(t, c.pbs[0].addr)
	if len(before) != 3 {
		t.Fatalf("live sessions before the failover: %v; want 3", before)
	}
	// Asynchronous replication: the writes of the last instant may not
	// have reached the replica when the primary dies. The placements of a
	// warm cluster were written long ago; WAIT makes sure of them here.
	if _, err := redistest.Command(c.redis.Addr, "WAIT", "1", "2000"); err != nil {
		t.Fatal(err)
	}
	placed := placements(t, c.redis.Addr, lc.ids)

	e := history.Event{Kind: history.KindNemesis, Nemesis: "redis-failover", Target: "primary", T: history.Now()}
	killed := time.Now()
	c.redis.Kill()
	var promoted time.Time
	for deadline := killed.Add(30 * time.Second); promoted.IsZero(); {
		if m, err := c.sentinels.Master(); err == nil && m == c.replica.Addr {
			promoted = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatal("the sentinels did not promote the replica within 30 s")
		}
		time.Sleep(10 * time.Millisecond) // polling the sentinels
	}
	e.End = history.Now()
	c.hist.Write(e)
	failover := promoted.Sub(killed)
	time.Sleep(10 * time.Second) // load through the new primary
	lc.close()
	after := liveSessions(t, c.pbs[0].addr)
	c.stop()

	ev := c.events()
	rep := chaoscheck.Check(chaoscheck.Config{LeaseBuffer: leaseBuf, ClientTimeout: clientTimeout}, ev)
	t.Logf("failover %v\n%s", failover.Round(time.Millisecond), rep)
	if !rep.OK() || rep.MaxOverlap != 0 {
		t.Errorf("the checker found violations or an overlap across the failover")
	}
	// Downtime: from the kill to the end of the last failed request that
	// began within 30 s of it.
	var down time.Duration
	failed := 0
	for _, r := range ev {
		if r.Kind != history.KindRequest || r.T < e.T || r.T > e.T+int64(30*time.Second) {
			continue
		}
		if r.Err != "" || r.Status >= 500 {
			failed++
			down = max(down, time.Duration(r.End-e.T))
		}
	}
	t.Logf("downtime %v (%d failed requests); failover (kill to promotion) %v", down.Round(time.Millisecond), failed, failover.Round(time.Millisecond))
	if down > failover+time.Second {
		t.Errorf("downtime %v exceeds the failover time %v + 1 s", down, failover)
	}
	for _, r := range ev {
		if r.Kind == history.KindLost && r.T > e.T {
			t.Errorf("%s lost its lease (%s) across the failover", r.Proc, r.Cause)
		}
	}
	for url, sid := range before {
		if after[url] != sid {
			t.Errorf("worker %s: session %s before the failover, %q after; want it kept", url, sid, after[url])
		}
	}
	now := placements(t, c.replica.Addr, lc.ids)
	lost := 0
	for _, id := range lc.ids {
		if placed[id] != "" && now[id] != placed[id] {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d placements changed across the failover; want every one kept on the replica", lost, len(lc.ids))
	}
	if rep.Requests[chaoscheck.Class2xx] < 1000 {
		t.Errorf("only %d requests succeeded: the run did not exercise the system", rep.Requests[chaoscheck.Class2xx])
	}
}
