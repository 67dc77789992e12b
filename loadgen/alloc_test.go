//go:build !race

package loadgen

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
)

// TestHotPathDoesNotAllocate: once a worker is warm, choosing a scenario
// and an id, sending, and recording allocate nothing; neither does the GET
// executor against a fasthttp server.
func TestHotPathDoesNotAllocate(t *testing.T) {
	for _, ic := range []IDConfig{{Dist: DistUniform}, {Dist: DistZipf}, {Dist: DistNew}} {
		r := mustNew(t, Config{URL: "http://127.0.0.1:1", IDs: ic,
			Scenarios: []Scenario{{Name: "a"}, {Name: "b", Kind: KindPost}}})
		withExec(r, func(_ []byte, o *outcome) { o.status = 200 })
		w := r.newWorker(0, nil, clock.Instant{})
		step := func() {
			sc := w.send()
			w.st.record(sc, time.Millisecond, &w.out, clock.Instant{})
		}
		step()
		step()
		if n := testing.AllocsPerRun(1000, step); n != 0 {
			t.Errorf("%s: %v allocations per request; want 0", ic.Dist, n)
		}
	}

	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"count":1}`) })
	cfg := tg.config()
	r := mustNew(t, cfg)
	e := newHTTPExec(r.hc, r.httpBase, &r.cfg.Scenarios[0], nil)
	var o outcome
	id := []byte("id42")
	get := func() {
		o = outcome{}
		e.exec(id, &o)
		if o.err != nil {
			t.Fatal(o.err)
		}
	}
	get()
	get()
	if n := testing.AllocsPerRun(1000, get); n != 0 {
		t.Errorf("GET executor: %v allocations per request; want 0", n)
	}
	r.hc.CloseIdleConnections()
}
