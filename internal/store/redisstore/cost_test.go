package redisstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

// commandStats reads INFO commandstats: calls per command, counting both
// the commands clients sent and those scripts ran.
func commandStats(t *testing.T, adm rueidis.Client) map[string]int64 {
	t.Helper()
	info, err := adm.Do(context.Background(), adm.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, l := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(l, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", l, err)
		}
		out[name] = v
	}
	return out
}

// TestClaimCommandCost measures what one winning claim of a fresh id costs
// Redis, with the pinboard's restart fence on: the commands sent (EVALSHA:
// the index add and the claim script in one pipeline, then the index add
// again) and the commands those scripts run (the restart fence's INFO
// server among them). The epoch adds three commands inside the claim script
// (GET and SET of the counter, TIME) and no round trip.
func TestClaimCommandCost(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	s := open(t, Config{URL: srv.URL, RestartFence: time.Second})
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h", Namespaces: []string{"/n"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitUptime(t, adm, 1)
	if _, err := s.Claim(ctx, "/n", "warm", "s1"); err != nil { // loads the scripts
		t.Fatal(err)
	}
	before := commandStats(t, adm)
	if h, err := s.Claim(ctx, "/n", "x", "s1"); h != "s1" || err != nil {
		t.Fatalf("Claim = %q, %v", h, err)
	}
	after := commandStats(t, adm)
	after["info"]-- // the INFO commandstats that read before (counted once it returned)
	got := map[string]int64{}
	var total int64
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			got[k] = d
			total += d
		}
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(got)) {
		fmt.Fprintf(&b, " %s=%d", k, got[k])
	}
	t.Logf("one claim: %d commands:%s", total, b.String())
	want := map[string]int64{"evalsha": 3, "hsetnx": 2, "hincrby": 1, "get": 2, "set": 2, "time": 1, "info": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d calls; want %d (got%s)", k, got[k], v, b.String())
		}
	}
}
