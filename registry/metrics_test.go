package registry

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
	"github.com/pinned-go/pinned/internal/testkit/promcheck"
)

// The janitor publishes live workers and placements per namespace, read
// from the store, whatever bytes a namespace holds there: hostile names
// (quotes, newlines, invalid UTF-8, braces) become safe label values, no
// metric creation panics, and the exposition parses. Superseded sessions
// are not counted as workers; vanished namespaces drop their series.
func TestHostileNamespaces(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		sid := e.register(registerBody(w, "c1")) // serves /counter
		if _, err := e.st.Claim(bg, "/counter", "x", sid); err != nil {
			t.Fatal(err)
		}
		hostile := []string{"/a\"b", "/\xff\xfe", "/x\ny", `/z"} 1` + "\n" + `evil{a="`, "/" + strings.Repeat("n", 300)}
		if _, err := e.st.Register(bg, store.Session{
			ID: "hostile", ClientID: "h", AdvertiseURL: "http://127.0.0.1:9", Secret: "s", Namespaces: hostile, TokenID: "t",
		}, e.reg.Lease()); err != nil {
			t.Fatal(err)
		}
		for _, ns := range hostile {
			if _, err := e.st.Claim(bg, ns, "x", "hostile"); err != nil {
				t.Fatal(err)
			}
		}
		scrape := func() (string, map[string]promcheck.Family) {
			var out bytes.Buffer
			e.reg.Metrics().WritePrometheus(&out)
			return out.String(), promcheck.Parse(t, "registry metrics", out.Bytes())
		}
		e.reg.Sweep(bg)
		out, fams := scrape()
		for _, want := range []string{
			`pinned_registry_namespace_workers{namespace="/counter"} 1`,
			`pinned_registry_namespace_workers{namespace="/a_b"} 1`,
			`pinned_registry_namespace_workers{namespace="/x_y"} 1`,
			`pinned_registry_placements{namespace="/counter"} 1`,
			`pinned_registry_placements{namespace="/a_b"} 1`,
			`pinned_registry_live_workers 2`,
			`pinned_registry_sessions 2`,
		} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("metrics lack %q:\n%s", want, out)
			}
		}
		if _, ok := fams["evil"]; ok {
			t.Errorf("a namespace injected a metric family:\n%s", out)
		}
		if n := fams["pinned_registry_namespace_workers"].Series; n != 1+len(hostile) {
			t.Errorf("namespace_workers series = %d; want %d", n, 1+len(hostile))
		}

		// Superseded: the same client registers again elsewhere; the old
		// session no longer counts.
		w2 := fakeworker.Start(t, "s2")
		e.register(registerBody(w2, "c1"))
		e.reg.Sweep(bg)
		out, _ = scrape()
		for _, want := range []string{`pinned_registry_namespace_workers{namespace="/counter"} 1`, `pinned_registry_live_workers 2`, `pinned_registry_sessions 3`} {
			if !strings.Contains(out, want+"\n") {
				t.Errorf("after a supersede, metrics lack %q:\n%s", want, out)
			}
		}

		// The hostile session goes: its namespaces' series go with it.
		if _, err := e.st.Deregister(bg, "hostile"); err != nil {
			t.Fatal(err)
		}
		e.reg.Sweep(bg)
		out, _ = scrape()
		if strings.Contains(out, `namespace="/a_b"`) {
			t.Errorf("series of vanished namespaces remain:\n%s", out)
		}
	}, withLease(time.Minute))
}
