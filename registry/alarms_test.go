package registry

import (
	"sync"
	"testing"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/testkit/fakeworker"
)

// The alarm calls of the worker holding an instance: set, list, delete;
// every other session (or none) is refused, so a worker that lost its
// lease cannot touch the alarms of an id placed elsewhere since.
func TestAlarmCallsOfTheHolder(t *testing.T) {
	var mu sync.Mutex
	var nudged []int64
	forEachStore(t, func(t *testing.T, e *env) {
		wa := fakeworker.Start(t, "sa")
		wb := fakeworker.Start(t, "sb")
		a := e.register(registerBody(wa, "ca"))
		b := e.register(registerBody(wb, "cb"))
		if _, err := e.st.Claim(bg, "/counter", "x", a); err != nil {
			t.Fatal(err)
		}
		set := func(sid string, al wire.Alarm) reply {
			return e.post(wire.PathAlarmSet, wire.AlarmSetRequest{SessionID: sid, Namespace: "/counter", ID: "x", Alarm: al})
		}
		r := set(a, wire.Alarm{Name: "tick", AtMs: 5000, EveryMs: 2000, MaxAttempts: 3})
		var sr wire.AlarmSetResponse
		r.decode(t, &sr)
		if r.code != 200 || sr.Gen == "" {
			t.Fatalf("set by the holder = %d %s; want 200 with a gen", r.code, r.body)
		}
		mu.Lock()
		if len(nudged) == 0 || nudged[len(nudged)-1] != 5000 {
			t.Errorf("OnAlarmSet saw %v; want the due time 5000", nudged)
		}
		mu.Unlock()
		for _, sid := range []string{b, "unknownSession000000000"} {
			if r := set(sid, wire.Alarm{Name: "evil", AtMs: 1}); r.code != 409 || r.errField(t).Field != "sessionId" {
				t.Errorf("set by %s = %d %s; want 409 on sessionId", sid, r.code, r.body)
			}
		}
		var lr wire.AlarmListResponse
		r = e.post(wire.PathAlarmList, wire.AlarmListRequest{SessionID: a, Namespace: "/counter", ID: "x"})
		r.decode(t, &lr)
		want := wire.Alarm{Name: "tick", AtMs: 5000, EveryMs: 2000, MaxAttempts: 3, BackoffMs: wire.DefaultAlarmBackoffMs, Gen: sr.Gen, DueMs: 5000}
		if r.code != 200 || len(lr.Alarms) != 1 || lr.Alarms[0] != want {
			t.Fatalf("list = %d %+v; want [%+v]", r.code, lr.Alarms, want)
		}
		if r := e.post(wire.PathAlarmList, wire.AlarmListRequest{SessionID: b, Namespace: "/counter", ID: "x"}); r.code != 409 {
			t.Errorf("list by another session = %d; want 409", r.code)
		}
		if r := e.post(wire.PathAlarmDelete, wire.AlarmDeleteRequest{SessionID: b, Namespace: "/counter", ID: "x", Name: "tick"}); r.code != 409 {
			t.Errorf("delete by another session = %d; want 409", r.code)
		}
		var dr wire.AlarmDeleteResponse
		for _, want := range []bool{true, false} {
			r := e.post(wire.PathAlarmDelete, wire.AlarmDeleteRequest{SessionID: a, Namespace: "/counter", ID: "x", Name: "tick"})
			r.decode(t, &dr)
			if r.code != 200 || dr.Deleted != want {
				t.Fatalf("delete = %d %s; want deleted=%v", r.code, r.body, want)
			}
		}
		if e.metric("pinned_registry_alarms_set_total") != "1" || e.metric("pinned_registry_alarm_calls_refused_total") != "4" {
			t.Errorf("alarms set %s, refused %s; want 1 and 4", e.metric("pinned_registry_alarms_set_total"), e.metric("pinned_registry_alarm_calls_refused_total"))
		}
		// The holder's session ends: its alarm calls are refused.
		e.expire()
		if r := set(a, wire.Alarm{Name: "late", AtMs: 1}); r.code != 409 {
			t.Errorf("set after the session expired = %d %s; want 409", r.code, r.body)
		}
	}, func(c *Config) {
		c.OnAlarmSet = func(shard int, due int64) {
			if shard == wire.AlarmShard("/counter/x") {
				mu.Lock()
				nudged = append(nudged, due)
				mu.Unlock()
			}
		}
	})
}

func TestAlarmCallsValidateAndCap(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		w := fakeworker.Start(t, "s")
		sid := e.register(registerBody(w, "c"))
		if _, err := e.st.Claim(bg, "/counter", "x", sid); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			body  string
			field string
		}{
			{`{"sessionId":"","namespace":"/counter","id":"x","alarm":{"name":"a","atMs":1}}`, "sessionId"},
			{`{"sessionId":"` + sid + `","namespace":"counter","id":"x","alarm":{"name":"a","atMs":1}}`, "namespace"},
			{`{"sessionId":"` + sid + `","namespace":"/counter","id":"a/b","alarm":{"name":"a","atMs":1}}`, "id"},
			{`{"sessionId":"` + sid + `","namespace":"/counter","id":"x","alarm":{"name":"","atMs":1}}`, "alarm.name"},
			{`{"sessionId":"` + sid + `","namespace":"/counter","id":"x","alarm":{"name":"a","atMs":-1}}`, "alarm.atMs"},
			{`{"sessionId":"` + sid + `","namespace":"/counter","id":"x","alarm":{"name":"a","atMs":1,"everyMs":5}}`, "alarm.everyMs"},
			{`{"sessionId":"` + sid + `","namespace":"/counter","id":"x","alarm":{"name":"a","atMs":"soon"}}`, "alarm.atMs"},
		} {
			r := e.post(wire.PathAlarmSet, c.body)
			if r.code != 400 || r.errField(t).Field != c.field {
				t.Errorf("%s = %d %s; want 400 on %s", c.body, r.code, r.body, c.field)
			}
		}
		for i, name := range []string{"a", "b", "c"} {
			r := e.post(wire.PathAlarmSet, wire.AlarmSetRequest{SessionID: sid, Namespace: "/counter", ID: "x", Alarm: wire.Alarm{Name: name, AtMs: 1}})
			if want := map[bool]int{true: 200, false: 409}[i < 2]; r.code != want {
				t.Errorf("alarm %d of a cap of 2 = %d %s; want %d", i+1, r.code, r.body, want)
			}
		}
		if r := e.do("POST", wire.PathAlarmSet, "", wire.AlarmSetRequest{}); r.code != 401 {
			t.Errorf("set without a token = %d; want 401", r.code)
		}
		if r := e.do("GET", wire.PathAlarmsDead+"?limit=0", token, nil); r.code != 400 || r.errField(t).Field != "limit" {
			t.Errorf("dead ?limit=0 = %d %s; want 400 on limit", r.code, r.body)
		}
	}, func(c *Config) { c.MaxAlarmsPerInstance = 2 })
}

func TestDeadAlarmsListing(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		st := e.st.(store.Alarms)
		if err := st.SetAlarm(bg, "/counter", "x", wire.Alarm{Name: "a", AtMs: 1}.Normalized("g"), 10); err != nil {
			t.Fatal(err)
		}
		cs, _, err := st.ClaimAlarms(bg, wire.AlarmShard("/counter/x"), 10, 30e9, 10)
		if err != nil || len(cs) != 1 {
			t.Fatalf("claim = %v, %v", cs, err)
		}
		dead := wire.DeadAlarm{Namespace: "/counter", ID: "x", Alarm: cs[0].Alarm, DeadAtMs: 20, Error: "HTTP 500: boom"}
		if ok, err := st.FinishAlarm(bg, cs[0], nil, 0, &dead, 10); !ok || err != nil {
			t.Fatalf("finish = %v, %v", ok, err)
		}
		var dr wire.DeadAlarmsResponse
		r := e.do("GET", wire.PathAlarmsDead, token, nil)
		r.decode(t, &dr)
		if r.code != 200 || len(dr.DeadAlarms) != 1 || dr.DeadAlarms[0] != dead {
			t.Fatalf("dead = %d %+v; want [%+v]", r.code, dr.DeadAlarms, dead)
		}
		if r := e.do("GET", wire.PathAlarmsDead, "", nil); r.code != 401 {
			t.Errorf("dead letters without a token = %d; want 401", r.code)
		}
	})
}
