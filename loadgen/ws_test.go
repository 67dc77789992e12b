package loadgen

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// counterLikeWS is a websocket handler shaped like the counter example: on
// connect and before every echo it pushes a count update, which the
// loadgen's echo matcher must skip.
type counterLikeWS struct {
	up      websocket.FastHTTPUpgrader
	conns   sync.WaitGroup
	opened  atomic.Int64
	ids     sync.Map
	refuse  string // path suffix answered with 503 + X-Pinned-Reason
	updates atomic.Int64
}

func (s *counterLikeWS) handle(ctx *fasthttp.RequestCtx) {
	if s.refuse != "" && strings.HasSuffix(string(ctx.Path()), s.refuse) {
		ctx.Error("draining", 503) // resets the headers: set the reason after it
		ctx.Response.Header.Set(wire.HeaderReason, wire.ReasonDraining)
		return
	}
	s.ids.Store(string(ctx.Path()), true)
	s.conns.Add(1)
	err := s.up.Upgrade(ctx, func(c *websocket.Conn) {
		defer s.conns.Done()
		defer c.Close()
		s.opened.Add(1)
		push := func() error {
			n := s.updates.Add(1)
			return c.WriteMessage(websocket.TextMessage, fmt.Appendf(nil, `{"count":%d}`, n))
		}
		if push() != nil {
			return
		}
		for {
			typ, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if push() != nil || c.WriteMessage(typ, msg) != nil {
				return
			}
		}
	})
	if err != nil {
		s.conns.Done()
	}
}

func TestWebSocketEchoSkipsPushedMessages(t *testing.T) {
	ws := &counterLikeWS{}
	tg := startTarget(t, ws.handle)
	cfg := tg.config()
	cfg.Requests, cfg.Connections = 200, 3
	cfg.Scenarios = []Scenario{{Kind: KindWS, Path: "/counter/{id}/ws", BodySize: 40}}
	rep := run(t, cfg)
	ws.conns.Wait() // the handlers end once loadgen closes its sockets
	if rep.Errors.Total != 0 || rep.Requests.Sent != 200 || rep.Latency.Count != 200 {
		t.Fatalf("errors %+v sent %d latencies %d; want 0, 200, 200", rep.Errors, rep.Requests.Sent, rep.Latency.Count)
	}
	// One per worker, reused (a worker that started late may have found
	// the 200 requests taken).
	opened := ws.opened.Load()
	if opened < 1 || opened > 3 {
		t.Errorf("%d websockets opened; want 1..3 (at most one per worker)", opened)
	}
	// Each round trip is preceded by one pushed update, and each connection
	// pushed one more on connect.
	if rep.Requests.WSSkipped != 200+opened {
		t.Errorf("skipped %d non-echo messages; want 200 + %d", rep.Requests.WSSkipped, opened)
	}
	if rep.Bytes.Sent != 200*40 || rep.Bytes.Received < 200*40 {
		t.Errorf("bytes %+v; want 8000 sent and at least as many received", rep.Bytes)
	}
	if len(rep.Statuses) != 0 {
		t.Errorf("statuses %v; want none for websocket round trips", rep.Statuses)
	}
}

func TestWebSocketRefusedHandshakeIsAStatus(t *testing.T) {
	ws := &counterLikeWS{refuse: "/ws"}
	tg := startTarget(t, ws.handle)
	cfg := tg.config()
	cfg.Requests, cfg.Connections = 5, 1
	cfg.Scenarios = []Scenario{{Kind: KindWS, Path: "/counter/{id}/ws"}}
	rep := run(t, cfg)
	if rep.Errors.Status["503"] != 5 || rep.Errors.Reason[wire.ReasonDraining] != 5 || rep.Errors.Other != 0 {
		t.Fatalf("errors %+v; want 503×5 with reason draining", rep.Errors)
	}
}

// TestWSMessageTagsAreUnique checks the tag written into each message: the
// matcher relies on it to tell our echo from anything else.
func TestWSMessageTagsAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for w := range 3 {
		e := newWSExec(nil, "ws://x", &Scenario{Path: "/", BodySize: minWSMessage}, nil, 0, w)
		for range 1000 {
			e.seq++
			e.tag()
			if seen[string(e.msg)] {
				t.Fatalf("tag %q repeated", e.msg)
			}
			seen[string(e.msg)] = true
		}
		if !bytes.HasPrefix(e.msg, fmt.Appendf(nil, "#%08x.", w)) {
			t.Errorf("tag %q; want worker %d in it", e.msg, w)
		}
	}
}

// TestMixedScenarioFile runs a weighted mix of HTTP and websocket scenarios
// from a scenario file and checks every scenario gets its share.
func TestMixedScenarioFile(t *testing.T) {
	ws := &counterLikeWS{}
	var gets, posts atomic.Int64
	tg := startTarget(t, func(ctx *fasthttp.RequestCtx) {
		switch {
		case bytes.HasSuffix(ctx.Path(), []byte("/ws")):
			ws.handle(ctx)
		case ctx.IsPost():
			posts.Add(1)
		default:
			gets.Add(1)
		}
	})
	scs, err := ParseScenarioFile([]byte(`{"scenarios": [
		{"name": "read", "weight": 6, "kind": "get"},
		{"name": "incr", "weight": 3, "kind": "post", "path": "/counter/{id}/incr", "bodySize": 8},
		{"name": "watch", "weight": 1, "kind": "ws", "path": "/counter/{id}/ws"}
	]}`), "/counter/{id}/")
	if err != nil {
		t.Fatal(err)
	}
	cfg := tg.config()
	cfg.Requests, cfg.Connections, cfg.Scenarios = 2000, 4, scs
	rep := run(t, cfg)
	ws.conns.Wait()
	if rep.Errors.Total != 0 || rep.Requests.Sent != 2000 || len(rep.Scenarios) != 3 {
		t.Fatalf("errors %+v sent %d scenarios %d", rep.Errors, rep.Requests.Sent, len(rep.Scenarios))
	}
	want := map[string]float64{"read": 0.6, "incr": 0.3, "watch": 0.1}
	var sum int64
	for _, s := range rep.Scenarios {
		sum += s.Sent
		if share := float64(s.Sent) / 2000; share < want[s.Name]-0.05 || share > want[s.Name]+0.05 {
			t.Errorf("scenario %s: %d requests (%.2f); want share ≈ %.1f", s.Name, s.Sent, share, want[s.Name])
		}
		if s.Latency.Count != s.Sent {
			t.Errorf("scenario %s: %d latencies for %d requests", s.Name, s.Latency.Count, s.Sent)
		}
	}
	if sum != 2000 || gets.Load() != rep.Scenarios[0].Sent || posts.Load() != rep.Scenarios[1].Sent {
		t.Errorf("scenario totals %d, target saw %d GETs and %d POSTs; want 2000 and %d, %d",
			sum, gets.Load(), posts.Load(), rep.Scenarios[0].Sent, rep.Scenarios[1].Sent)
	}
}
