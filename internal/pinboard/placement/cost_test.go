package placement_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// commandDelta is after - before, per command, leaving out the INFO that
// read before (counted once it returned) and the client's keep-alive PINGs.
func commandDelta(before, after map[string]int64) (map[string]int64, int64) {
	d := map[string]int64{}
	var total int64
	for k, v := range after {
		if k == "ping" {
			continue
		}
		n := v - before[k]
		if k == "info" {
			n--
		}
		if n > 0 {
			d[k] = n
			total += n
		}
	}
	return d, total
}

func fmtCounts(m map[string]int64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, " %s=%d", k, m[k])
	}
	return b.String()
}

// TestColdActivationRoundTrips pins what one cold activation (a request
// for an id nobody holds) costs Redis through a pinboard, with the restart
// fence on as the pinboard runs it: one round trip (counted by a tap
// between the pinboard's store and Redis) of EVALSHA (the place script:
// read, and claim when nobody holds the id), CLIENT CACHING YES and GET
// (the read Redis tracks for the pinboard), and the commands the script
// runs. The namespace's sessions come from the client-side cache. The
// claim does not invalidate the route it cached: the next request for the
// id is a cache hit, with no round trip.
func TestColdActivationRoundTrips(t *testing.T) {
	e := newEnv(t, "redis")
	tap := redistest.NewTap(t, e.srv.Addr)
	e.pinboardURL, e.fence = tap.URL, time.Second
	for _, n := range []string{"a", "b", "c"} {
		e.register(startHost(t, n, e.fl), 1000)
	}
	waitFor(t, "Redis up longer than the fence", func() bool {
		s, _ := e.redis("INFO", "server").ToString()
		return strings.Contains(s, "uptime_in_seconds:") && !strings.Contains(s, "uptime_in_seconds:0\r")
	})
	pb := e.pinboard(nil, nil)
	// Warm-up: the script is loaded, the namespace's sessions cached, and
	// every connection of the store's client open (rueidis spreads
	// commands over its pipes and dials each on first use; 64 ids miss
	// one of up to 4 pipes with a chance below 1e-7).
	for i := range 64 {
		if ans := pb.get(t, fmt.Sprintf("warm%d", i)); ans.status != 200 {
			t.Fatalf("GET warm = %d %q", ans.status, ans.body)
		}
	}
	want := map[string]int64{"evalsha": 1, "client|caching": 1, "get": 3, "info": 1, "time": 1, "set": 2, "hsetnx": 1, "hincrby": 1}
	for i := range 5 {
		id := fmt.Sprintf("cold%d", i)
		tap.Reset()
		before := e.commandStats()
		if ans := pb.get(t, id); ans.status != 200 {
			t.Fatalf("GET %s = %d %q", id, ans.status, ans.body)
		}
		trips := tap.Trips()
		got, total := commandDelta(before, e.commandStats())
		t.Logf("cold activation %s: %d round trips, %d commands:%s", id, len(trips), total, fmtCounts(got))
		if len(trips) != 1 || !slices.Equal(trips[0].Names(), []string{"EVALSHA", "CLIENT CACHING", "GET"}) {
			t.Errorf("%s: round trips %v; want one: EVALSHA, CLIENT CACHING YES, GET", id, trips)
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: Redis commands%s; want %v", id, fmtCounts(got), want)
		}
		tap.Reset()
		misses := pb.res.CacheStats().Misses
		if ans := pb.get(t, id); ans.status != 200 {
			t.Fatalf("second GET %s = %d %q", id, ans.status, ans.body)
		}
		if n := pb.res.CacheStats().Misses - misses; n != 0 {
			t.Errorf("the request after %s's activation missed the cache %d times; want 0 (the claim invalidated its own route)", id, n)
		}
		if trips := tap.Trips(); len(trips) != 0 {
			t.Errorf("the request after %s's activation made round trips %v; want none", id, trips)
		}
	}
}
