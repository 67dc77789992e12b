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

// TestPlaceCommandCost measures what LookupOrClaim costs Redis on a single
// node, with the pinboard's restart fence on: one round trip (counted by a
// tap between the store and Redis) of three commands, EVALSHA of the place
// script, CLIENT CACHING YES and GET (the read Redis tracks); inside the
// script, for a new id: GET of the placement, the restart fence's INFO
// server, GET, TIME and SET of the epoch counter, SET of the placement,
// HSETNX and HINCRBY of the session's index; for a placed id: the GET only.
func TestPlaceCommandCost(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	tap := redistest.NewTap(t, srv.Addr)
	s := openOneConn(t, Config{URL: tap.URL, RestartFence: time.Second}) // no connection opens mid-measure
	ctx := context.Background()
	if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h", Namespaces: []string{"/n"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitUptime(t, adm, 1)
	if _, err := s.Claim(ctx, "/n", "warm", "s1"); err != nil { // loads the script
		t.Fatal(err)
	}
	measure := func(what string, wantClaimed bool, want map[string]int64) {
		t.Helper()
		tap.Reset()
		before := commandStats(t, adm)
		p, claimed, err := s.LookupOrClaim(ctx, "/n", "x", "s1")
		if p.Session != "s1" || claimed != wantClaimed || err != nil {
			t.Fatalf("%s: LookupOrClaim = %+v, %v, %v; want s1, claimed %v", what, p, claimed, err, wantClaimed)
		}
		after := commandStats(t, adm)
		trips := tap.Trips()
		after["info"]-- // the INFO commandstats that read before (counted once it returned)
		got := map[string]int64{}
		var total int64
		for k, v := range after {
			if d := v - before[k]; d > 0 && k != "ping" {
				got[k] = d
				total += d
			}
		}
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(got)) {
			fmt.Fprintf(&b, " %s=%d", k, got[k])
		}
		t.Logf("%s: %d round trips, %d commands:%s", what, len(trips), total, b.String())
		if len(trips) != 1 || !slices.Equal(trips[0].Names(), []string{"EVALSHA", "CLIENT CACHING", "GET"}) {
			t.Errorf("%s: round trips %v; want one: EVALSHA, CLIENT CACHING YES, GET", what, trips)
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: commands%s; want %v", what, b.String(), want)
		}
	}
	measure("a new id", true, map[string]int64{"evalsha": 1, "client|caching": 1, "get": 3, "info": 1, "time": 1, "set": 2, "hsetnx": 1, "hincrby": 1})
	measure("a placed id", false, map[string]int64{"evalsha": 1, "client|caching": 1, "get": 2})
}

// TestPlaceRoundTripsOnACluster counts the round trips of LookupOrClaim
// where the index lives apart from the placement (a cluster; here a single
// node told to index apart, behind a tap): for a new id, the place script
// with the tracked read, then the index add; for a placed id, the first
// only. The placement is indexed either way.
func TestPlaceRoundTripsOnACluster(t *testing.T) {
	srv := redistest.Start(t)
	tap := redistest.NewTap(t, srv.Addr)
	s := openOneConn(t, Config{URL: tap.URL})
	s.indexApart = true
	ctx := context.Background()
	if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h", Namespaces: []string{"/n"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, "/n", "warm", "s1"); err != nil { // loads the scripts
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what    string
		claimed bool
		trips   [][]string
	}{
		{"a new id", true, [][]string{{"EVALSHA", "CLIENT CACHING", "GET"}, {"EVALSHA"}}},
		{"a placed id", false, [][]string{{"EVALSHA", "CLIENT CACHING", "GET"}}},
	} {
		tap.Reset()
		p, claimed, err := s.LookupOrClaim(ctx, "/n", "x", "s1")
		if p.Session != "s1" || claimed != tc.claimed || err != nil {
			t.Fatalf("%s: LookupOrClaim = %+v, %v, %v; want s1, claimed %v", tc.what, p, claimed, err, tc.claimed)
		}
		trips := tap.Trips()
		var got [][]string
		for _, tr := range trips {
			got = append(got, tr.Names())
		}
		if !slices.EqualFunc(got, tc.trips, slices.Equal) {
			t.Errorf("%s: round trips %v; want %v", tc.what, got, tc.trips)
		}
	}
	if c, err := s.PlacementCounts(ctx, "s1", []string{"/n"}); err != nil || c["/n"] != 2 {
		t.Fatalf("PlacementCounts = %v, %v; want 2 (warm and x indexed)", c, err)
	}
}

// TestPlacementCountsCostIsFlat: PlacementCounts reads the namespaces'
// count fields of the session's index with one HMGET, whatever the number
// of placements the index holds (the registry's worker list reads it for
// every session: an HGETALL would send a field per placement, a million
// for a worker holding a million ids, on Redis's one thread).
func TestPlacementCountsCostIsFlat(t *testing.T) {
	srv := redistest.Start(t)
	adm := admin(t, srv)
	s := open(t, Config{URL: srv.URL})
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Register(ctx, store.Session{ID: "s1", ClientID: "c1", AdvertiseURL: "http://h", Namespaces: []string{"/n", "/m"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	for i := range n {
		if _, err := s.Claim(ctx, "/n", fmt.Sprint("x", i), "s1"); err != nil {
			t.Fatal(err)
		}
	}
	before := commandStats(t, adm)
	c, err := s.PlacementCounts(ctx, "s1", []string{"/n", "/m"})
	if err != nil || c["/n"] != n || c["/m"] != 0 {
		t.Fatalf("PlacementCounts = %v, %v; want /n: %d, /m: 0", c, err, n)
	}
	after := commandStats(t, adm)
	if d := after["hmget"] - before["hmget"]; d != 1 {
		t.Errorf("%d HMGET; want 1", d)
	}
	for _, cmd := range []string{"hgetall", "hkeys", "hvals", "hscan"} {
		if d := after[cmd] - before[cmd]; d != 0 {
			t.Errorf("%d %s over an index of %d placements; want none", d, strings.ToUpper(cmd), n)
		}
	}
}
