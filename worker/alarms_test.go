package worker

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// alarmPinboard answers the alarm calls from a script and records them.
type alarmPinboard struct {
	mu      sync.Mutex
	calls   []string // path + body
	answers []func(ctx *fasthttp.RequestCtx)
}

func (p *alarmPinboard) handle(ctx *fasthttp.RequestCtx) {
	p.mu.Lock()
	p.calls = append(p.calls, string(ctx.Path())+" "+string(ctx.PostBody()))
	var answer func(*fasthttp.RequestCtx)
	if len(p.answers) > 0 {
		answer, p.answers = p.answers[0], p.answers[1:]
	}
	p.mu.Unlock()
	if string(ctx.Request.Header.Peek("Authorization")) != "Bearer "+testToken {
		status(401, "", "")(ctx)
		return
	}
	if answer == nil {
		status(500, "unscripted", "")(ctx)
		return
	}
	answer(ctx)
}

func status(code int, msg, field string) func(*fasthttp.RequestCtx) {
	return func(ctx *fasthttp.RequestCtx) {
		b, _ := json.Marshal(wire.Error{Error: msg, Field: field})
		ctx.SetStatusCode(code)
		ctx.SetBody(b)
	}
}

func ok(v any) func(*fasthttp.RequestCtx) {
	return func(ctx *fasthttp.RequestCtx) {
		b, _ := json.Marshal(v)
		ctx.SetBody(b)
	}
}

func (p *alarmPinboard) script(answers ...func(*fasthttp.RequestCtx)) {
	p.mu.Lock()
	p.calls, p.answers = nil, answers
	p.mu.Unlock()
}

func (p *alarmPinboard) recorded() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

func newAlarmWorker(t *testing.T) (*Worker, *alarmPinboard) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &alarmPinboard{}
	srv := &fasthttp.Server{Handler: p.handle}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	w, err := New(Config{PinboardURL: "http://" + ln.Addr().String(), AdvertiseURL: "http://127.0.0.1:2", Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.pinboard.close()
		_ = srv.Shutdown()
		ln.Close()
		<-done
	})
	return w, p
}

// The alarm calls name the session of the context they get (the
// instance's lease), carry the alarm as the protocol spells it, and map the
// pinboard's refusals to errors a caller can test.
func TestAlarmCalls(t *testing.T) {
	w, p := newAlarmWorker(t)
	ctx := context.WithValue(context.Background(), sessionKey{}, "sess-A")
	a := host.Alarm{Name: "tick", At: time.UnixMilli(5000), Every: 2 * time.Second, SkipMissed: true, MaxAttempts: 3, Backoff: 50 * time.Millisecond}

	p.script(ok(wire.AlarmSetResponse{Gen: "g"}))
	if err := w.SetAlarm(ctx, "/counter", "x", a); err != nil {
		t.Fatalf("SetAlarm = %v", err)
	}
	want := wire.PathAlarmSet + ` {"sessionId":"sess-A","namespace":"/counter","id":"x","alarm":{"name":"tick","atMs":5000,"everyMs":2000,"skipMissed":true,"maxAttempts":3,"backoffMs":50}}`
	if got := p.recorded(); len(got) != 1 || got[0] != want {
		t.Fatalf("calls %q; want [%q]", got, want)
	}

	p.script(ok(wire.AlarmListResponse{Alarms: []wire.Alarm{{Name: "tick", AtMs: 5000, EveryMs: 2000, MaxAttempts: 3, BackoffMs: 50, Failures: 2, DueMs: 9000}}}))
	as, err := w.Alarms(ctx, "/counter", "x")
	if err != nil || len(as) != 1 || as[0].Name != "tick" || as[0].Every != 2*time.Second || as[0].Failures != 2 ||
		as[0].Due.UnixMilli() != 9000 || as[0].At.UnixMilli() != 5000 || as[0].Backoff != 50*time.Millisecond {
		t.Fatalf("Alarms = %+v, %v", as, err)
	}

	p.script(ok(wire.AlarmDeleteResponse{Deleted: true}))
	if del, err := w.DeleteAlarm(ctx, "/counter", "x", "tick"); err != nil || !del {
		t.Fatalf("DeleteAlarm = %v, %v; want true", del, err)
	}

	for _, c := range []struct {
		answer func(*fasthttp.RequestCtx)
		want   error
	}{
		{status(409, "not the holder", "sessionId"), host.ErrAlarmNotHolder},
		{status(409, "too many", "alarm"), host.ErrTooManyAlarms},
		{status(400, "bad name", "alarm.name"), ErrAlarmRefused},
		{status(501, "no alarms here", ""), ErrAlarmRefused},
	} {
		p.script(c.answer)
		if err := w.SetAlarm(ctx, "/counter", "x", a); !errors.Is(err, c.want) {
			t.Errorf("SetAlarm refused = %v; want %v", err, c.want)
		}
		if n := len(p.recorded()); n != 1 {
			t.Errorf("%d calls for a refusal a retry cannot fix; want 1", n)
		}
	}
	if got := w.m.alarmCalls[resultRefused].Get(); got != 4 {
		t.Errorf("refused calls = %d; want 4", got)
	}
}

// A transient failure (503, 429, no answer) is retried within ctx.
func TestAlarmCallRetriesWithinItsContext(t *testing.T) {
	w, p := newAlarmWorker(t)
	ctx := context.WithValue(context.Background(), sessionKey{}, "s")
	p.script(status(503, "store down", ""), status(429, "slow down", ""), ok(wire.AlarmSetResponse{Gen: "g"}))
	if err := w.SetAlarm(ctx, "/counter", "x", host.Alarm{Name: "a", At: time.UnixMilli(1)}); err != nil {
		t.Fatalf("SetAlarm after two transient failures = %v; want nil", err)
	}
	if n := len(p.recorded()); n != 3 {
		t.Fatalf("%d calls; want 3", n)
	}
	p.script() // every call fails (500 unscripted)
	// The second call goes 100 ms after the first: a deadline of 1 s leaves
	// a busy machine 900 ms to make it.
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := w.SetAlarm(tctx, "/counter", "x", host.Alarm{Name: "a", At: time.UnixMilli(1)})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, host.ErrAlarmUnavailable) {
		t.Fatalf("SetAlarm while the pinboard fails = %v; want the context's deadline and host.ErrAlarmUnavailable", err)
	}
	if n := len(p.recorded()); n < 2 {
		t.Errorf("%d calls before the deadline; want retries", n)
	}
}
