package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/store/storetest"
	"github.com/pinned-go/pinned/internal/testkit/leakcheck"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Options()...) }

// admin is a plain client (no tracking) that tests use to poke Redis.
func admin(t *testing.T, srv *redistest.Server) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func open(t *testing.T, cfg Config) *Store { return openWith(t, cfg, nil) }

// openWith is open with tweak applied to the store's rueidis options
// before it connects.
func openWith(t *testing.T, cfg Config, tweak func(*rueidis.ClientOption)) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(&s.opt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	conformance(t, srv.URL, srv)
}

// TestConformanceCluster runs the same suite on a local three-master Redis
// Cluster: every script, the placement scripts with their hash-tagged epoch
// counter included, must run where its keys live.
func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	conformance(t, cl.URL, cl.Nodes...)
}

// conformance runs storetest on the Redis at url, made of nodes.
func conformance(t *testing.T, url string, nodes ...*redistest.Server) {
	each := func(t *testing.T, args ...string) {
		t.Helper()
		for _, n := range nodes {
			if _, err := n.Command(args...); err != nil {
				t.Fatalf("%v on %s: %v", args, n.Addr, err)
			}
		}
	}
	storetest.Run(t, func(t *testing.T, opts store.Options) storetest.Harness {
		each(t, "FLUSHALL")
		s := open(t, Config{Options: opts, URL: url})
		const lease = 400 * time.Millisecond
		return storetest.Harness{
			Store:           s,
			Lease:           lease,
			Elapse:          func(d time.Duration) { time.Sleep(d) }, // time must pass on Redis's clock
			Flush:           func() { each(t, "FLUSHALL") },
			KillConnections: func() { each(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") },
		}
	})
}

func TestInvalidationKeyMapping(t *testing.T) {
	f := func(key string, want store.Invalidation, wantOK bool) {
		t.Helper()
		got, ok := invalidationFor(key)
		if got != want || ok != wantOK {
			t.Errorf("invalidationFor(%q) = %+v, %v; want %+v, %v", key, got, ok, want, wantOK)
		}
	}
	f(wire.KeyPlacement("/counter", "abc"), store.Invalidation{Placement: "/counter/abc"}, true)
	f(wire.KeySession("sid1"), store.Invalidation{Session: "sid1"}, true)
	f(wire.KeyNamespace("/counter"), store.Invalidation{}, false)
	f(wire.KeyWorkers, store.Invalidation{}, false)
	f("other", store.Invalidation{}, false)
}

// Placement reads are served from the client-side cache once tracked.
func TestPlacementReadsHitTheCache(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Config{URL: srv.URL})
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Claim(ctx, "/a", "x", "s1"); err != nil {
		t.Fatal(err)
	}
	c, _ := s.get(ctx)
	cmd := func() rueidis.Cacheable { return c.B().Get().Key(wire.KeyPlacement("/a", "x")).Cache() }
	c.DoCache(ctx, cmd(), time.Minute)
	if r := c.DoCache(ctx, cmd(), time.Minute); !r.IsCacheHit() {
		t.Fatal("second DoCache read of a placement missed the cache")
	}
	if p, err := s.Placement(ctx, "/a", "x"); p != "s1" || err != nil {
		t.Fatalf("Placement = %q, %v; want s1", p, err)
	}
}

// PlacementUntil reports when the client-side cache entry behind its answer
// expires: within CacheTTL less a fifth and CacheTTL of the first read, the
// same instant on a cache hit (a hit does not make the value younger), and
// spread over that fifth across keys read together.
func TestPlacementUntil(t *testing.T) {
	srv := redistest.Start(t)
	const ttl = 10 * time.Second
	s := open(t, Config{URL: srv.URL, CacheTTL: ttl})
	defer s.Close()
	ctx := context.Background()
	untils := map[time.Time]bool{}
	for i := range 40 {
		id := "x" + strconv.Itoa(i)
		if _, err := s.Claim(ctx, "/a", id, "s1"); err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		h, until, err := s.PlacementUntil(ctx, "/a", id)
		after := time.Now()
		if h != "s1" || err != nil {
			t.Fatalf("PlacementUntil = %q, %v; want s1", h, err)
		}
		// CachePXAT has millisecond resolution.
		if lo, hi := before.Add(ttl-ttl/5-time.Millisecond), after.Add(ttl+time.Millisecond); until.Before(lo) || until.After(hi) {
			t.Fatalf("first read: until %v not within [%v, %v]", until, lo, hi)
		}
		h2, until2, err := s.PlacementUntil(ctx, "/a", id)
		if h2 != "s1" || err != nil || !until2.Equal(until) {
			t.Fatalf("cached read = %q %v %v; want s1 with the first read's until %v", h2, until2, err, until)
		}
		untils[until.Truncate(100*time.Millisecond)] = true
	}
	if len(untils) < 3 {
		t.Errorf("40 placements read together expire in %d distinct 100 ms slots; want them spread", len(untils))
	}
	// No placement: still an until (rueidis caches the nil too).
	if h, until, err := s.PlacementUntil(ctx, "/a", "none"); h != "" || err != nil || until.IsZero() {
		t.Errorf("absent placement = %q, %v, %v; want \"\", a time, nil", h, until, err)
	}
}

// LookupUntil is PlacementUntil with the whole placement: the epoch and
// since the claim returned, from the same cache entry (same until), and the
// replacement's epoch once the invalidation of the cached entry arrived.
func TestLookupUntil(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Config{URL: srv.URL, CacheTTL: 10 * time.Second})
	defer s.Close()
	ctx := context.Background()
	p, err := s.ClaimPlacement(ctx, "/a", "x", "s1")
	if err != nil {
		t.Fatal(err)
	}
	got, until, err := s.LookupUntil(ctx, "/a", "x")
	if err != nil || got.Session != "s1" || got.Epoch != p.Epoch || !got.Since.Equal(p.Since) || until.IsZero() {
		t.Fatalf("LookupUntil = %+v, %v, %v; want %+v and a time", got, until, err, p)
	}
	if h, until2, err := s.PlacementUntil(ctx, "/a", "x"); h != "s1" || err != nil || !until2.Equal(until) {
		t.Fatalf("PlacementUntil = %q, %v, %v; want s1 from the same entry (%v)", h, until2, err, until)
	}
	p2, err := s.ReplacePlacement(ctx, "/a", "x", "s1", "s2")
	if err != nil || p2.Epoch <= p.Epoch {
		t.Fatalf("ReplacePlacement = %+v, %v", p2, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _, err := s.LookupUntil(ctx, "/a", "x")
		if err == nil && got.Session == "s2" && got.Epoch == p2.Epoch {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("LookupUntil after the replace = %+v, %v; want %+v once invalidated", got, err, p2)
		}
		time.Sleep(5 * time.Millisecond) // the invalidation arrives on its own connection
	}
}

// Before Connect succeeds every call fails with ErrUnavailable naming the
// dial error; Connect keeps retrying and succeeds once Redis is up.
func TestConnectRetriesUntilRedisIsUp(t *testing.T) {
	srv := redistest.Start(t)
	addr := srv.Addr
	srv.Kill()
	s, err := New(Config{URL: "redis://" + addr + "/0", ConnectBackoffMin: 10 * time.Millisecond, ConnectBackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping before Connect = %v; want ErrUnavailable", err)
	}
	done := make(chan error, 1)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	go func() { done <- s.Connect(cctx) }()
	// Wait until Connect has failed at least once, visibly.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.Ping(ctx)
		if errors.Is(err, store.ErrUnavailable) && strings.Contains(err.Error(), "refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ping while Redis is down = %v; want ErrUnavailable naming the dial error", err)
		}
		time.Sleep(10 * time.Millisecond) // polling the connect loop's visible state
	}
	srv.Restart(t)
	if err := <-done; err != nil {
		t.Fatalf("Connect = %v; want nil once Redis is up", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping after Connect = %v", err)
	}
}

func TestConnectStopsOnClose(t *testing.T) {
	srv := redistest.Start(t)
	addr := srv.Addr
	srv.Kill()
	s, _ := New(Config{URL: "redis://" + addr + "/0", ConnectBackoffMin: time.Hour, ConnectBackoffMax: time.Hour})
	done := make(chan error, 1)
	go func() { done <- s.Connect(context.Background()) }()
	for s.Ping(context.Background()) != nil && !strings.Contains(s.Ping(context.Background()).Error(), "refused") {
		time.Sleep(5 * time.Millisecond) // polling the connect loop's visible state
	}
	s.Close()
	if err := <-done; !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Connect after Close = %v; want ErrClosed", err)
	}
}

func TestConfigValidation(t *testing.T) {
	f := func(cfg Config, wantSub string) {
		t.Helper()
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), wantSub) {
			t.Errorf("New(%+v) = %v; want an error containing %q", cfg, err, wantSub)
		}
	}
	f(Config{}, "URL is empty")
	f(Config{URL: "http://x"}, "cannot parse")
	f(Config{URL: "redis://x", CacheTTL: -1}, "CacheTTL")
	f(Config{URL: "redis://x", ConnectBackoffMin: time.Second, ConnectBackoffMax: time.Millisecond}, "below")
}

// The Redis keys are exactly the documented layout: a test that pins the
// schema so that a change is a conscious protocol change.
func TestKeyLayout(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	s := open(t, Config{URL: srv.URL})
	defer s.Close()
	ctx := context.Background()
	if _, _, err := s.ReserveSlot(ctx, "tok", "sid", 10, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Register(ctx, store.Session{ID: "sid", ClientID: "cid", AdvertiseURL: "http://h:1", Namespaces: []string{"/n"}, TokenID: "tok"}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	s.Claim(ctx, "/n", "x", "sid")
	s.Push(ctx, "cid", wire.Message{Type: wire.MessageDrain})
	nonce := wire.NonceID("a-challenge")
	if ok, err := s.UseNonce(ctx, nonce, "r:tok:http://h:1", 30*time.Second); !ok || err != nil {
		t.Fatalf("UseNonce = %v, %v", ok, err)
	}
	want := map[string]string{
		"pinned:s:sid": "hash", "pinned:c:cid": "string", "pinned:a:http://h:1": "string",
		"pinned:q:cid": "list", "pinned:n:/n": "set", "pinned:w": "zset",
		"pinned:p:{/n/x}": "string", "pinned:e:{/n/x}": "string", "pinned:o:sid": "hash",
		"pinned:x:" + nonce: "string", "pinned:t:tok": "zset",
	}
	keys, err := adm.Do(ctx, adm.B().Keys().Pattern("*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(want) {
		t.Errorf("keys = %v; want %d keys", keys, len(want))
	}
	for k, typ := range want {
		got, _ := adm.Do(ctx, adm.B().Type().Key(k).Build()).ToString()
		if got != typ {
			t.Errorf("TYPE %s = %q; want %q", k, got, typ)
		}
	}
	for k, ttl := range map[string]bool{"pinned:s:sid": true, "pinned:c:cid": true, "pinned:a:http://h:1": true, "pinned:q:cid": true,
		"pinned:p:{/n/x}": false, "pinned:e:{/n/x}": true, "pinned:o:sid": false, "pinned:x:" + nonce: true, "pinned:t:tok": true} {
		got, _ := adm.Do(ctx, adm.B().Pttl().Key(k).Build()).AsInt64()
		if (got > 0) != ttl {
			t.Errorf("PTTL %s = %d; want a TTL: %v", k, got, ttl)
		}
	}
	p, _ := s.Lookup(ctx, "/n", "x")
	if v, _ := adm.Do(ctx, adm.B().Get().Key("pinned:p:{/n/x}").Build()).ToString(); v != wire.FormatPlacement(p.Epoch, p.Since.UnixMilli(), "sid") || p.Epoch == 0 {
		t.Errorf("placement value = %q; want \"<epoch> <since> sid\" for %+v", v, p)
	}
	if v, _ := adm.Do(ctx, adm.B().Get().Key("pinned:e:{/n/x}").Build()).ToString(); v != strconv.FormatUint(p.Epoch, 10) {
		t.Errorf("epoch counter = %q; want the placement's epoch %d", v, p.Epoch)
	}
	if v, _ := adm.Do(ctx, adm.B().Get().Key("pinned:x:"+nonce).Build()).ToString(); v != "r:tok:http://h:1" {
		t.Errorf("nonce record = %q; want the binding r:tok:http://h:1", v)
	}
	if pttl, _ := adm.Do(ctx, adm.B().Pttl().Key("pinned:x:"+nonce).Build()).AsInt64(); pttl > 30_000 {
		t.Errorf("nonce PTTL = %d; want at most the 30s TTL", pttl)
	}
	if v, _ := adm.Do(ctx, adm.B().Hget().Key("pinned:s:sid").Field("tok").Build()).ToString(); v != "tok" {
		t.Errorf("session field tok = %q; want tok", v)
	}
	idx, _ := adm.Do(ctx, adm.B().Hgetall().Key("pinned:o:sid").Build()).AsStrMap()
	if idx["/n/x"] != "1" || idx["#/n"] != "1" || len(idx) != 2 {
		t.Errorf("index hash = %v; want {/n/x: 1, #/n: 1}", idx)
	}
}

// Pipelined scripts run by SHA; after SCRIPT FLUSH (or a Redis restart)
// they must load themselves again.
func TestScriptsSurviveScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	s := open(t, Config{URL: srv.URL})
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h", Namespaces: []string{"/n"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	s.Push(ctx, "c1", wire.Message{Type: wire.MessageDrain})
	if err := adm.Do(ctx, adm.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if w, err := s.Claim(ctx, "/n", "x", "s1"); w != "s1" || err != nil {
		t.Fatalf("Claim after SCRIPT FLUSH = %q, %v", w, err)
	}
	if c, _ := s.PlacementCounts(ctx, "s1", []string{"/n"}); c["/n"] != 1 {
		t.Fatalf("PlacementCounts after SCRIPT FLUSH = %v; want /n: 1", c)
	}
	adm.Do(ctx, adm.B().ScriptFlush().Build())
	_, msgs, err := s.Heartbeat(ctx, "s1", store.Update{}, time.Minute)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Heartbeat after SCRIPT FLUSH = %v, %v; want the queued message", msgs, err)
	}
	adm.Do(ctx, adm.B().ScriptFlush().Build())
	if w, err := s.Replace(ctx, "/n", "x", "s1", "s2"); w != "s2" || err != nil {
		t.Fatalf("Replace after SCRIPT FLUSH = %q, %v", w, err)
	}
	adm.Do(ctx, adm.B().ScriptFlush().Build())
	if ok, err := s.Deregister(ctx, "s1"); !ok || err != nil {
		t.Fatalf("Deregister after SCRIPT FLUSH = %v, %v", ok, err)
	}
	if n, _ := adm.Do(ctx, adm.B().Exists().Key("pinned:c:c1", "pinned:a:http://h").Build()).AsInt64(); n != 0 {
		t.Fatalf("%d pointers left after Deregister (its pointer scripts ran after SCRIPT FLUSH); want 0", n)
	}
}

// A Redis that restarted without persistence lost every session and
// placement, while workers may still serve under leases granted before the
// restart: with RestartFence, Claim and Replace are refused (unavailable,
// so the proxy answers 503 + Retry-After) until the server has been up that
// long, and nothing is written meanwhile.
func TestRestartFence(t *testing.T) {
	const fence = 4 * time.Second
	ctx := context.Background()
	// The fence is read from the server's uptime (whole seconds): the
	// refusals below need a server at least 2 s younger than the fence, so
	// one that took longer to start and connect is replaced by a fresh one.
	var (
		srv *redistest.Server
		s   *Store
		adm rueidis.Client
	)
	up := func() int64 { return uptime(t, adm) }
	for attempt := 1; ; attempt++ {
		srv = redistest.Start(t)
		s = open(t, Config{URL: srv.URL, RestartFence: fence})
		adm = admin(t, srv)
		if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://127.0.0.1:1", Namespaces: []string{"/n"}}, time.Minute); err != nil {
			t.Fatal(err)
		}
		n := up()
		if n < 2 {
			break
		}
		if attempt == 3 {
			t.Fatalf("3 fresh redis-servers were each %d s old or more once connected; the fence (%v) needs one under 2 s", n, fence)
		}
		t.Logf("redis-server %d s old once connected; starting a fresh one", n)
		s.Close()
		srv.Kill()
	}
	defer s.Close()
	if err := adm.Do(ctx, adm.B().Set().Key(wire.KeyPlacement("/n", "b")).Value(wire.FormatPlacement(1, 0, "old")).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, op := range []func() (string, error){
		func() (string, error) { return s.Claim(ctx, "/n", "a", "s1") },
		func() (string, error) { return s.Replace(ctx, "/n", "b", "old", "s1") },
	} {
		if _, err := op(); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, ErrRestartFence) {
			t.Fatalf("placement write on a %ds-old server: err = %v; want ErrUnavailable and ErrRestartFence", up(), err)
		}
	}
	if n, err := adm.Do(ctx, adm.B().Exists().Key(wire.KeyPlacement("/n", "a")).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("a fenced claim wrote the placement (exists=%d, %v)", n, err)
	}
	if c, err := s.PlacementCounts(ctx, "s1", []string{"/n"}); err != nil || c["/n"] != 0 {
		t.Fatalf("a fenced claim left an index entry: %v %v", c, err)
	}
	waitUptime(t, adm, int64(fence/time.Second))
	if h, err := s.Claim(ctx, "/n", "a", "s1"); err != nil || h != "s1" {
		t.Fatalf("claim after the fence = %q, %v; want s1", h, err)
	}
	// An already placed id is still answered during a fence: only writes wait.
	srv.Restart(t)
	if h, err := s.Claim(ctx, "/n", "a", "s1"); !errors.Is(err, ErrRestartFence) {
		t.Fatalf("claim right after a restart = %q, %v; want the fence", h, err)
	}
}

// uptime reads the server's uptime_in_seconds.
func uptime(t *testing.T, adm rueidis.Client) int64 {
	t.Helper()
	return infoInt(t, adm, "server", "uptime_in_seconds")
}

// infoInt reads one integer field of an INFO section.
func infoInt(t *testing.T, adm rueidis.Client, section, field string) int64 {
	t.Helper()
	// Around a restart of the server a command may fail on a dead
	// connection while the client reconnects.
	var info string
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err = adm.Do(context.Background(), adm.B().Info().Section(section).Build()).ToString()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// waitUptime waits (bounded) until the server has been up for secs.
func waitUptime(t *testing.T, adm rueidis.Client, secs int64) {
	t.Helper()
	deadline := time.Now().Add(time.Duration(secs+3) * time.Second)
	for uptime(t, adm) < secs {
		if time.Now().After(deadline) {
			t.Fatalf("uptime did not reach %d s", secs)
		}
		time.Sleep(50 * time.Millisecond) // waiting for Redis's own clock
	}
}

func TestAlarmConformance(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	storetest.RunAlarms(t, func(t *testing.T, opts store.Options) storetest.Harness {
		if err := adm.Do(context.Background(), adm.B().Flushall().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		return storetest.Harness{Store: open(t, Config{Options: opts, URL: srv.URL})}
	})
}
