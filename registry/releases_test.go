package registry

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
)

// A batch frees each placement exactly as a release of its own would: the
// right epoch on the named session frees, another epoch or a placement of
// another session does not, a malformed id fails that release only, a
// session of another client refuses the whole call, an ended one frees
// nothing, and a batch over the limit is refused before anything changes.
func TestReleasesBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		old := e.register(registerBody(w, "c1"))
		w2 := fakeworker.Start(t, "s2")
		other := e.register(registerBody(w2, "c2"))
		epochs := map[string]uint64{}
		for _, id := range []string{"a", "b", "c", "d"} {
			p, _, err := e.st.LookupOrClaim(bg, "/counter", id, old)
			if err != nil {
				t.Fatal(err)
			}
			epochs[id] = p.Epoch
		}
		if _, _, err := e.st.LookupOrClaim(bg, "/counter", "theirs", other); err != nil {
			t.Fatal(err)
		}
		body := wire.ReleasesRequest{ClientID: "c1", Namespace: "/counter", SessionID: old, Releases: []wire.ReleasedItem{
			{ID: "a", Epoch: epochs["a"]},     // freed
			{ID: "b", Epoch: epochs["b"] + 1}, // another epoch: kept
			{ID: "c"},                         // any epoch: freed
			{ID: "bad id"},                    // malformed: this one fails alone
			{ID: "theirs"},                    // another session's: kept
			{ID: "nowhere"},                   // not placed: nothing
			{ID: "d", Epoch: epochs["d"]},     // freed
		}}
		var out wire.ReleasesResponse
		r := e.post(wire.PathReleases, body)
		r.decode(t, &out)
		if r.code != 200 || len(out.Results) != len(body.Releases) {
			t.Fatalf("releases = %d %s; want 200 with %d results", r.code, r.body, len(body.Releases))
		}
		want := []wire.ReleaseResult{{Released: true}, {}, {Released: true}, {Status: 400, Field: "id"}, {}, {}, {Released: true}}
		for i, w := range want {
			got := out.Results[i]
			got.Error = ""
			if got != w {
				t.Errorf("release %d (%s) = %+v; want %+v", i, body.Releases[i].ID, out.Results[i], w)
			}
		}
		if out.Results[3].Error == "" {
			t.Errorf("the malformed id's result has no error message: %+v", out.Results[3])
		}
		for id, held := range map[string]string{"a": "", "b": old, "c": "", "d": "", "theirs": other} {
			if p, _ := e.st.Placement(bg, "/counter", id); p != held {
				t.Errorf("placement of %s after the batch = %q; want %q", id, p, held)
			}
		}
		if got := e.metric(`pinned_registry_releases_total{result="released"}`); got != "3" {
			t.Errorf(`releases{result="released"} = %s; want 3 (one per instance)`, got)
		}
		// Another client's session: the whole call is refused.
		if r := e.post(wire.PathReleases, wire.ReleasesRequest{ClientID: "c2", Namespace: "/counter", SessionID: old, Releases: []wire.ReleasedItem{{ID: "b"}}}); r.code != 403 || r.errField(t).Field != "sessionId" {
			t.Fatalf("releases naming another client's session = %d %s; want 403 sessionId", r.code, r.body)
		}
		if p, _ := e.st.Placement(bg, "/counter", "b"); p != old {
			t.Fatalf("b after a refused batch = %q; want %q", p, old)
		}
		// An ended session frees nothing.
		if r := e.post(wire.PathReleases, wire.ReleasesRequest{ClientID: "c1", Namespace: "/counter", SessionID: "endedSession", Releases: []wire.ReleasedItem{{ID: "b"}}}); r.code != 200 || !strings.Contains(string(r.body), `"results":[{}]`) {
			t.Fatalf("releases of an ended session = %d %s; want 200 with one result, not released", r.code, r.body)
		}
		// Without sessionId: the client's current session.
		if r := e.post(wire.PathReleases, wire.ReleasesRequest{ClientID: "c1", Namespace: "/counter", Releases: []wire.ReleasedItem{{ID: "b"}}}); r.code != 200 || !strings.Contains(string(r.body), `"released":true`) {
			t.Fatalf("releases without sessionId = %d %s; want b released", r.code, r.body)
		}
		// Malformed calls change nothing.
		over := make([]wire.ReleasedItem, wire.MaxReleaseBatch+1)
		for i := range over {
			over[i] = wire.ReleasedItem{ID: fmt.Sprint(i)}
		}
		for name, c := range map[string]struct {
			body  any
			field string
		}{
			"over the limit": {wire.ReleasesRequest{ClientID: "c1", Namespace: "/counter", Releases: over}, "releases"},
			"none":           {wire.ReleasesRequest{ClientID: "c1", Namespace: "/counter"}, "releases"},
			"no client":      {wire.ReleasesRequest{Namespace: "/counter", Releases: []wire.ReleasedItem{{ID: "x"}}}, "clientId"},
			"bad namespace":  {wire.ReleasesRequest{ClientID: "c1", Namespace: "counter", Releases: []wire.ReleasedItem{{ID: "x"}}}, "namespace"},
			"bad session":    {`{"clientId":"c1","namespace":"/n","sessionId":"a b","releases":[{"id":"x"}]}`, "sessionId"},
		} {
			if r := e.post(wire.PathReleases, c.body); r.code != 400 || r.errField(t).Field != c.field {
				t.Errorf("releases, %s = %d %s; want 400 %s", name, r.code, r.body, c.field)
			}
		}
	})
}
