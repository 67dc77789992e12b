// Package counterapp is the counter demo's object type: a durable counter
// per id under /counter (GET /, POST /incr, POST /incr-later, POST /alarm,
// DELETE /alarm, GET /alarms, GET /stream, WebSocket /ws). examples/counter
// serves it in one process (package countercmd); examples/fleet serves it
// on three workers behind a pinboard.
//
// JSON answers carry the instance's activation epoch ("epoch", see
// host.Instance.Epoch). With Options.Persist the count survives its
// instance: it lives in Redis under "counter:<id>" as a fenced key (package
// fence). Activation loads it with fence.Load, which fences out every older
// activation of the id; every increment (POST /incr, and the task of POST
// /incr-later) writes the new count with fence.Set before it is answered or
// counted (write-through: the instance's memory is its state, the store its
// copy, which an older activation's late write must never overwrite).
// A write refused as stale aborts the instance (503 stale from a request:
// nothing was written, the proxy may send it to the current holder); a
// store that cannot be reached answers 503 with Retry-After (the increment
// may or may not have landed).
package counterapp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/fence"
	"github.com/pinned-go/pinned/host"
)

// Counter is the demo object: one counter per id. Its fields are touched
// only inside the instance's turn (non-concurrent handlers, stream steps,
// Instance.Do), so they need no locks.
type Counter struct {
	hooks   *Hooks
	store   rueidis.Client // Options.Persist; nil: in memory only
	inst    *host.Instance
	nonce   string // random per activation: shows when an id was re-activated
	count   int64
	sockets map[*host.WebSocket]chan struct{} // open websockets and their "count changed" signal; nil until the first (an idle counter stays small)
}

// maxStreamLines bounds GET /stream?n=N.
const maxStreamLines = 1_000_000

// maxIncrDelay bounds POST /incr-later?delay=D.
const maxIncrDelay = time.Minute

// maxAlarmDelay bounds POST /alarm?delay=D (and at=T, counted from now).
const maxAlarmDelay = 24 * time.Hour

// Hooks observe counters (the test fixture, test/app/counter, records them
// in its chaos history). Every field may be nil. They run inside the instance's turn and must
// return promptly.
type Hooks struct {
	// Activated is called at the end of a successful setup.
	Activated func(c *Counter)
	// TornDown is called by the teardown.
	TornDown func(c *Counter)
	// Served is called by every GET / and POST /incr, /incr-later handler
	// before it answers.
	Served func(c *Counter, x *host.Ctx)
	// Effect is called when a background task (incr-later) increments.
	Effect func(c *Counter)
	// Alarm is called by the Alarm handler before it increments.
	Alarm func(c *Counter, x *host.AlarmCtx)
}

// KeyPrefix starts the Redis key of a persisted count: "counter:<id>".
const KeyPrefix = "counter:"

// StoreTimeout bounds one fenced operation on the persisting Redis.
const StoreTimeout = 5 * time.Second

// Options configure the object type. The zero value is the in-memory
// counter without observers.
type Options struct {
	// Hooks observe counters (the test fixture's chaos history).
	Hooks Hooks
	// Persist, when set, keeps every count in this Redis (see the package
	// doc). The caller owns the client and closes it after the host.
	Persist rueidis.Client
}

// Instance returns the counter's instance.
func (c *Counter) Instance() *host.Instance { return c.inst }

// Nonce returns the random nonce of this activation.
func (c *Counter) Nonce() string { return c.nonce }

// Type is the object type a host runs under /counter.
func Type() host.Type[*Counter] { return TypeWithOptions(Options{}) }

// TypeWithHooks is Type with observers.
func TypeWithHooks(hooks Hooks) host.Type[*Counter] { return TypeWithOptions(Options{Hooks: hooks}) }

// TypeWithOptions is Type configured by o.
func TypeWithOptions(o Options) host.Type[*Counter] {
	hk := &o.Hooks
	rdb := o.Persist
	r := host.NewRoutes[*Counter]()
	r.GET("/", (*Counter).get)
	r.POST("/incr", (*Counter).incr)
	r.POST("/incr-later", (*Counter).incrLater)
	r.GET("/stream", (*Counter).stream)
	r.WebSocket("/ws", (*Counter).ws)
	r.POST("/alarm", (*Counter).setAlarm)
	r.DELETE("/alarm", (*Counter).deleteAlarm)
	r.GET("/alarms", (*Counter).alarms)
	return host.Type[*Counter]{
		Alarm: (*Counter).alarm,
		New: func(inst *host.Instance) (*Counter, error) {
			var b [8]byte
			if _, err := rand.Read(b[:]); err != nil {
				return nil, fmt.Errorf("cannot make a nonce: %w", err)
			}
			c := &Counter{hooks: hk, store: rdb, inst: inst, nonce: hex.EncodeToString(b[:])}
			if err := c.load(); err != nil {
				return nil, err
			}
			if hk.Activated != nil {
				hk.Activated(c)
			}
			return c, nil
		},
		Teardown: func(c *Counter) {
			if hk.TornDown != nil {
				hk.TornDown(c)
			}
		},
		Routes: r,
	}
}

type state struct {
	ID       string `json:"id"`
	Count    int64  `json:"count"`
	Instance string `json:"instance"`
	Epoch    uint64 `json:"epoch"`
}

func (c *Counter) state() state {
	return state{ID: c.inst.ID(), Count: c.count, Instance: c.nonce, Epoch: c.inst.Epoch()}
}

// load reads the persisted count, fencing out older activations (a no-op
// without a store).
func (c *Counter) load() error {
	if c.store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.inst.Context(), StoreTimeout)
	defer cancel()
	v, err := fence.Load(ctx, c.store, KeyPrefix+c.inst.ID(), c.inst.Epoch())
	if err != nil {
		return storeError(err)
	}
	if v == "" {
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return fmt.Errorf("counter %s: persisted count %q: %w", c.inst.ID(), v, err)
	}
	c.count = n
	return nil
}

// persistIncr writes the incremented count to the store (a no-op without
// one) and returns it. The count in memory is the instance's state; the
// store gets it whole (fence.Set, write-through), so a late write of an
// older activation would overwrite a newer one's if the epoch did not
// refuse it. Call it inside the turn.
func (c *Counter) persistIncr(ctx context.Context) (int64, error) {
	n := c.count + 1
	if c.store == nil {
		return n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, StoreTimeout)
	defer cancel()
	err := fence.Set(ctx, c.store, KeyPrefix+c.inst.ID(), c.inst.Epoch(), strconv.FormatInt(n, 10))
	return n, storeError(err)
}

// errStoreUnavailable answers a store failure: 503 (with Retry-After, as
// every 503 of the host).
var errStoreUnavailable = &host.Error{Status: 503, Message: "counter store unavailable: the increment may or may not have been stored"}

// storeError passes a stale refusal on (host.ErrStale: the host aborts the
// instance and answers 503 stale) and makes any other store failure
// errStoreUnavailable.
func storeError(err error) error {
	if err == nil || errors.Is(err, fence.ErrStale) {
		return err
	}
	return errStoreUnavailable
}

// get answers GET /counter/{id}/.
func (c *Counter) get(x *host.Ctx) error {
	c.served(x)
	return x.JSON(200, c.state())
}

func (c *Counter) served(x *host.Ctx) {
	if c.hooks.Served != nil {
		c.hooks.Served(c, x)
	}
}

// incr answers POST /counter/{id}/incr, once the new count is stored.
func (c *Counter) incr(x *host.Ctx) error {
	c.served(x)
	n, err := c.persistIncr(x.Context())
	if err != nil {
		return err
	}
	c.set(n)
	return x.JSON(200, c.state())
}

// set changes the count and signals every websocket. Call it inside the turn.
func (c *Counter) set(n int64) {
	c.count = n
	for _, notify := range c.sockets {
		select {
		case notify <- struct{}{}:
		default: // a push is already pending; it will read the latest count
		}
	}
}

// incrLater answers POST /counter/{id}/incr-later?delay=1s: a background
// task (Instance.Go) that increments after the delay. While it waits the
// instance is not idle; an abort cancels it.
func (c *Counter) incrLater(x *host.Ctx) error {
	delay := time.Second
	if v := x.RequestCtx().QueryArgs().Peek("delay"); len(v) > 0 {
		d, err := time.ParseDuration(string(v))
		if err != nil || d < 0 || d > maxIncrDelay {
			return &host.Error{Status: 400, Message: "delay must be a duration from 0s to " + maxIncrDelay.String(), Field: "delay"}
		}
		delay = d
	}
	c.served(x)
	err := c.inst.Go(func(ctx context.Context) error {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
			var err error
			if doErr := c.inst.Do(func() {
				if c.hooks.Effect != nil {
					c.hooks.Effect(c)
				}
				var n int64
				if n, err = c.persistIncr(ctx); err == nil {
					c.set(n)
				}
			}); doErr != nil {
				return doErr
			}
			if errors.Is(err, fence.ErrStale) {
				c.inst.Abort() // a newer activation exists: this one must end
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		return err
	}
	return x.JSON(202, map[string]any{"scheduled": true, "delay": delay.String(), "epoch": c.inst.Epoch()})
}

// stream answers GET /counter/{id}/stream?n=N with N lines of NDJSON,
// generated one at a time as the client reads them.
func (c *Counter) stream(x *host.Ctx) error {
	n := 10
	if v := x.RequestCtx().QueryArgs().Peek("n"); len(v) > 0 {
		k, err := strconv.Atoi(string(v))
		if err != nil || k < 0 || k > maxStreamLines {
			return &host.Error{Status: 400, Message: "n must be an integer from 0 to " + strconv.Itoa(maxStreamLines), Field: "n"}
		}
		n = k
	}
	x.RequestCtx().SetContentType("application/x-ndjson")
	return x.Stream(func(yield func([]byte, error) bool) {
		var line []byte
		for i := range n {
			// Each step runs inside the turn: reading c.count is safe.
			line = fmt.Appendf(line[:0], `{"line":%d,"count":%d}`+"\n", i, c.count)
			if !yield(line, nil) {
				return
			}
		}
	})
}

// ws answers WebSocket /counter/{id}/ws: it echoes every message and pushes
// {"count":N} whenever the count changes.
func (c *Counter) ws(ws *host.WebSocket) error {
	notify := make(chan struct{}, 1)
	if err := c.inst.Do(func() {
		if c.sockets == nil {
			c.sockets = map[*host.WebSocket]chan struct{}{}
		}
		c.sockets[ws] = notify
	}); err != nil {
		return err
	}
	defer c.inst.Do(func() { delete(c.sockets, ws) })

	// The pusher belongs to this handler, which waits for it before
	// returning (the connection is gone once the handler returns).
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(done)
	wg.Go(func() {
		var msg []byte
		for {
			select {
			case <-done:
				return
			case <-notify:
			}
			var n int64
			if c.inst.Do(func() { n = c.count }) != nil {
				return
			}
			msg = fmt.Appendf(msg[:0], `{"count":%d}`, n)
			if ws.WriteMessage(websocket.TextMessage, msg) != nil {
				return
			}
		}
	})

	for {
		mt, msg, err := ws.ReadMessage()
		if err != nil {
			return err
		}
		if err := ws.WriteMessage(mt, msg); err != nil {
			return err
		}
	}
}

// setAlarm answers POST /counter/{id}/alarm?delay=2s (or at=<unix ms>) and
// optionally name=N (default "incr"): a durable alarm that increments the
// count by one when it fires (202). Setting a name again replaces it.
func (c *Counter) setAlarm(x *host.Ctx) error {
	q := x.RequestCtx().QueryArgs()
	now := time.Now()
	at := now.Add(2 * time.Second)
	switch {
	case len(q.Peek("at")) > 0:
		ms, err := strconv.ParseInt(string(q.Peek("at")), 10, 64)
		if err != nil || ms < 0 || time.UnixMilli(ms).After(now.Add(maxAlarmDelay)) {
			return &host.Error{Status: 400, Message: "at must be unix milliseconds at most " + maxAlarmDelay.String() + " from now", Field: "at"}
		}
		at = time.UnixMilli(ms)
	case len(q.Peek("delay")) > 0:
		d, err := time.ParseDuration(string(q.Peek("delay")))
		if err != nil || d < 0 || d > maxAlarmDelay {
			return &host.Error{Status: 400, Message: "delay must be a duration from 0s to " + maxAlarmDelay.String(), Field: "delay"}
		}
		at = now.Add(d)
	}
	name := "incr"
	if v := q.Peek("name"); len(v) > 0 {
		name = string(v)
	}
	c.served(x)
	if err := c.inst.SetAlarm(name, at); err != nil {
		return err
	}
	return x.JSON(202, map[string]any{"alarm": name, "at": at.UnixMilli()})
}

// deleteAlarm answers DELETE /counter/{id}/alarm?name=N (204).
func (c *Counter) deleteAlarm(x *host.Ctx) error {
	name := "incr"
	if v := x.RequestCtx().QueryArgs().Peek("name"); len(v) > 0 {
		name = string(v)
	}
	if err := c.inst.DeleteAlarm(name); err != nil {
		return err
	}
	x.RequestCtx().SetStatusCode(204)
	return nil
}

type alarmState struct {
	Name     string `json:"name"`
	At       int64  `json:"at"`
	Due      int64  `json:"due,omitempty"`
	Failures int    `json:"failures,omitempty"`
}

// alarms answers GET /counter/{id}/alarms with the pending alarms.
func (c *Counter) alarms(x *host.Ctx) error {
	as, err := c.inst.Alarms()
	if err != nil {
		return err
	}
	out := make([]alarmState, 0, len(as))
	for _, a := range as {
		s := alarmState{Name: a.Name, At: a.At.UnixMilli(), Failures: a.Failures}
		if !a.Due.IsZero() {
			s.Due = a.Due.UnixMilli()
		}
		out = append(out, s)
	}
	return x.JSON(200, out)
}

// alarm is the Alarm handler: the count grows by one (stored first when
// the counter persists, like an increment).
func (c *Counter) alarm(x *host.AlarmCtx) error {
	if c.hooks.Alarm != nil {
		c.hooks.Alarm(c, x)
	}
	n, err := c.persistIncr(x.Context())
	if err != nil {
		return err
	}
	c.set(n)
	return nil
}
