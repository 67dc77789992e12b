package registry

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/hotids"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
)

func (e *env) get(path string) reply { return e.do("GET", path, token, nil) }

// raw sends path exactly as written (escapes kept) on a fresh connection.
func (e *env) raw(method, path string) reply {
	e.t.Helper()
	c, err := net.Dial("tcp", e.hc.Addr)
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", method, path, token)
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	return reply{code: resp.StatusCode(), body: append([]byte(nil), resp.Body()...), hdr: map[string]string{"content-type": string(resp.Header.ContentType())}}
}

func TestPlacementLookup(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		sid := e.register(registerBody(w, "c1"))
		pl, err := e.st.ClaimPlacement(context.Background(), "/counter", "alice", sid)
		if pl.Session != sid || pl.Epoch == 0 || err != nil {
			t.Fatalf("ClaimPlacement = %+v, %v", pl, err)
		}
		r := e.get(wire.PathPlacements + "/counter/alice")
		if r.code != 200 {
			t.Fatalf("GET placement = %d %s; want 200", r.code, r.body)
		}
		var info wire.PlacementInfo
		r.decode(t, &info)
		// The epoch and the time of the claim, as the store recorded them.
		want := wire.PlacementInfo{Namespace: "/counter", ID: "alice", SessionID: sid, ClientID: "c1", AdvertiseURL: w.URL, Live: true,
			Epoch: pl.Epoch, Since: pl.Since.UnixMilli()}
		if info != want {
			t.Fatalf("placement = %+v; want %+v", info, want)
		}
		for path, code := range map[string]int{
			"/counter/bob":       404, // not placed
			"/other/alice":       404, // another namespace
			"/counter/.hidden":   400,
			"/counter/al%69ce":   400, // decodes to alice: refused, not looked up
			"/coun%74er/alice":   400,
			"/counter/a~b@c:d+e": 404, // every byte of the id grammar is accepted
		} {
			if r := e.raw("GET", wire.PathPlacements+path); r.code != code || r.hdr["content-type"] != "application/json" {
				t.Errorf("GET placements%s = %d %s (%s); want %d with a JSON error", path, r.code, r.body, r.hdr["content-type"], code)
			}
		}
		if r := e.do("GET", wire.PathPlacements+"/counter/alice", "", nil); r.code != 401 {
			t.Fatalf("GET placement without a token = %d; want 401", r.code)
		}
		// A holder whose session ended is still reported, not live.
		e.st.Claim(context.Background(), "/counter", "ghost", "DeadSessionDeadSessionDeadSess")
		r = e.get(wire.PathPlacements + "/counter/ghost")
		r.decode(t, &info)
		if r.code != 200 || info.Live || info.ClientID != "" || info.SessionID != "DeadSessionDeadSessionDeadSess" {
			t.Fatalf("GET placement of a dead holder = %d %+v; want 200, not live, its session", r.code, info)
		}
	})
}

// Evicting queues an evict message that the holder's next heartbeat ack
// carries once; the placement stays until the worker releases it. An
// unplaced id is a 404; a dead holder's placement is deleted at once.
func TestEvict(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		sid := e.register(registerBody(w, "c1"))
		e.st.Claim(context.Background(), "/counter", "alice", sid)

		r := e.do("DELETE", wire.PathPlacements+"/counter/alice", token, nil)
		if r.code != 202 {
			t.Fatalf("DELETE placement = %d %s; want 202", r.code, r.body)
		}
		var ev wire.EvictResponse
		r.decode(t, &ev)
		if want := (wire.EvictResponse{Namespace: "/counter", ID: "alice", SessionID: sid, ClientID: "c1", Queued: true}); ev != want {
			t.Fatalf("evict = %+v; want %+v", ev, want)
		}
		_, hb := e.heartbeat(heartbeatBody(sid, nil, 0))
		want := wire.Message{Type: wire.MessageEvict, Namespace: "/counter", ID: "alice"}
		if len(hb.Messages) != 1 || hb.Messages[0] != want {
			t.Fatalf("heartbeat messages = %+v; want [%+v]", hb.Messages, want)
		}
		if _, hb = e.heartbeat(heartbeatBody(sid, nil, 0)); len(hb.Messages) != 0 {
			t.Fatalf("second heartbeat messages = %+v; want none (delivered once)", hb.Messages)
		}
		if h, _ := e.st.Placement(context.Background(), "/counter", "alice"); h != sid {
			t.Fatalf("placement after evict = %q; want %q until the worker releases it", h, sid)
		}
		if got := e.metric(`pinned_registry_evictions_total{result="queued"}`); got != "1" {
			t.Errorf("evictions queued = %s; want 1", got)
		}

		if r := e.do("DELETE", wire.PathPlacements+"/counter/bob", token, nil); r.code != 404 || r.errField(t).Field != "id" {
			t.Fatalf("DELETE of an unplaced id = %d %s; want 404 naming the id", r.code, r.body)
		}
		if r := e.do("DELETE", wire.PathPlacements+"/counter/alice", "", nil); r.code != 401 {
			t.Fatalf("DELETE without a token = %d; want 401", r.code)
		}

		dead := "DeadSessionDeadSessionDeadSess"
		e.st.Claim(context.Background(), "/counter", "ghost", dead)
		r = e.do("DELETE", wire.PathPlacements+"/counter/ghost", token, nil)
		r.decode(t, &ev)
		if r.code != 202 || !ev.Released || ev.Queued || ev.SessionID != dead {
			t.Fatalf("DELETE of a dead holder's placement = %d %+v; want 202 released", r.code, ev)
		}
		if h, _ := e.st.Placement(context.Background(), "/counter", "ghost"); h != "" {
			t.Fatalf("placement of a dead holder after evict = %q; want none", h)
		}
	})
}

func TestInstancesListing(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w1, w2 := fakeworker.Start(t, "s1"), fakeworker.Start(t, "s2")
		s1 := e.register(registerBody(w1, "c1"))
		s2 := e.register(registerBody(w2, "c2"))
		want := map[string]string{} // id -> client
		for i := range 40 {
			id, sid, client := fmt.Sprintf("id-%02d", i), s1, "c1"
			if i%3 == 0 {
				sid, client = s2, "c2"
			}
			e.st.Claim(context.Background(), "/counter", id, sid)
			want[id] = client
		}
		e.st.Claim(context.Background(), "/other", "x", s1)

		list := func(query string) map[string]string {
			t.Helper()
			got := map[string]string{}
			cursor := ""
			for pages := 0; ; pages++ {
				if pages > 100 {
					t.Fatal("the listing did not end")
				}
				r := e.get(wire.PathInstances + "?" + query + "&cursor=" + url.QueryEscape(cursor))
				if r.code != 200 {
					t.Fatalf("GET instances?%s = %d %s", query, r.code, r.body)
				}
				var page wire.InstancesResponse
				r.decode(t, &page)
				if page.Namespace != "/counter" || len(page.Instances) > 7 {
					t.Fatalf("page = %+v; want /counter, at most 7", page)
				}
				for _, in := range page.Instances {
					if _, dup := got[in.ID]; dup {
						t.Fatalf("id %s listed twice", in.ID)
					}
					got[in.ID] = in.ClientID
				}
				if cursor = page.Cursor; cursor == "" {
					return got
				}
			}
		}
		if got := list("namespace=/counter&limit=7"); !equalMaps(got, want) {
			t.Fatalf("listed %v; want %v", got, want)
		}
		c1 := map[string]string{}
		for id, c := range want {
			if c == "c1" {
				c1[id] = c
			}
		}
		if got := list("namespace=/counter&limit=7&worker=c1"); !equalMaps(got, c1) {
			t.Fatalf("listed for c1 %v; want %v", got, c1)
		}
		if got := list("namespace=/counter&limit=7&worker=nobody"); len(got) != 0 {
			t.Fatalf("listed for an unknown worker %v; want nothing", got)
		}
		for query, field := range map[string]string{
			"":                                     "namespace",
			"namespace=counter":                    "namespace",
			"namespace=/counter&limit=0":           "limit",
			"namespace=/counter&limit=1001":        "limit",
			"namespace=/counter&limit=x":           "limit",
			"namespace=/counter&worker=a/b":        "worker",
			"namespace=/counter&cursor=not-a-real": "cursor",
		} {
			if r := e.get(wire.PathInstances + "?" + query); r.code != 400 || r.errField(t).Field != field {
				t.Errorf("GET instances?%s = %d %s; want 400 naming %s", query, r.code, r.body, field)
			}
		}
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestHotAndTraffic(t *testing.T) {
	sk, err := hotids.New(hotids.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, "memstore", func(c *Config) { c.Hot = sk })
	now := time.Now()
	for i := range 30 {
		name := "/counter/alice"
		if i%3 == 0 {
			name = "/counter/bob"
		}
		sk.Record([]byte(name), "sess-1", 200, "", 10, time.Millisecond, now)
	}
	sk.Record([]byte("/counter/carol"), "", 503, wire.ReasonNoWorker, 0, 0, now)
	r := e.get(wire.PathHot + "?namespace=/counter&n=2")
	var hot wire.HotResponse
	r.decode(t, &hot)
	if r.code != 200 || hot.Namespace != "/counter" || hot.WindowSeconds != 60 || len(hot.IDs) != 2 {
		t.Fatalf("GET hot = %d %s; want 200 with 2 ids", r.code, r.body)
	}
	if a, b := hot.IDs[0], hot.IDs[1]; a.ID != "alice" || a.Requests != 20 || a.Bytes != 200 || a.Holder != "sess-1" || a.P99Ms <= 0 || b.ID != "bob" || b.Requests != 10 {
		t.Fatalf("hot ids = %+v; want alice 20, bob 10", hot.IDs)
	}
	if r := e.get(wire.PathHot + "?namespace=/counter"); r.code != 200 {
		t.Fatalf("GET hot without n = %d", r.code)
	}
	for _, q := range []string{"n=2", "namespace=/counter&n=0", "namespace=/counter&n=201", "namespace=x"} {
		if r := e.get(wire.PathHot + "?" + q); r.code != 400 {
			t.Errorf("GET hot?%s = %d; want 400", q, r.code)
		}
	}
	r = e.get(wire.PathTraffic)
	var tr wire.TrafficResponse
	r.decode(t, &tr)
	if r.code != 200 || tr.Requests != 31 || len(tr.Holders) != 1 || tr.Holders[0].Requests != 30 ||
		len(tr.NotOK) != 1 || tr.NotOK[0] != (wire.AnswerCount{Status: 503, Reason: wire.ReasonNoWorker, Count: 1}) {
		t.Fatalf("GET traffic = %d %s", r.code, r.body)
	}
	if r := e.do("GET", wire.PathHot+"?namespace=/counter", "", nil); r.code != 401 {
		t.Fatalf("GET hot without a token = %d; want 401", r.code)
	}
	// Without a sketch: no traffic, not an error.
	e2 := newEnv(t, "memstore")
	if r := e2.get(wire.PathHot + "?namespace=/counter"); r.code != 200 || string(r.body) != `{"namespace":"/counter","windowSeconds":60,"errorBound":0,"ids":[]}` {
		t.Fatalf("GET hot without a sketch = %d %s", r.code, r.body)
	}
}
