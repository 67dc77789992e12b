package wire

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func TestAlarmDeliveryHeaderRoundTrip(t *testing.T) {
	for _, d := range []AlarmDelivery{
		{Name: "a", ScheduledMs: 0, Attempt: 1},
		{Name: "session-expiry:v2", ScheduledMs: 1_764_000_000_123, Attempt: 6},
		{Name: strings.Repeat("n", MaxAlarmNameLen), ScheduledMs: MaxAlarmTimeMs, Attempt: MaxAlarmAttempts},
	} {
		got, err := ParseAlarmDelivery([]byte(d.Header()))
		if err != nil || got != d {
			t.Errorf("ParseAlarmDelivery(%q) = %+v, %v; want %+v", d.Header(), got, err, d)
		}
	}
	if h := (AlarmDelivery{Name: "x", ScheduledMs: 42, Attempt: 3}).Header(); h != "3 42 x" {
		t.Errorf("Header = %q; want %q", h, "3 42 x")
	}
}

func TestParseAlarmDeliveryRefusesMalformed(t *testing.T) {
	for _, v := range []string{
		"", "1", "1 2", "1 2 ", "0 2 a", "-1 2 a", "x 2 a", "1 x a", "1 -5 a", "101 2 a",
		"1 2 a b", "1 2 .a", "1 2 a%2F", "1 2 a/b", "1  2 a", "1 99999999999999999999 a",
		"1 2 " + strings.Repeat("n", MaxAlarmNameLen+1),
	} {
		if d, err := ParseAlarmDelivery([]byte(v)); err == nil {
			t.Errorf("ParseAlarmDelivery(%q) = %+v; want an error", v, d)
		}
	}
}

func TestAlarmCheck(t *testing.T) {
	ok := Alarm{Name: "a", AtMs: 1}
	if f, err := ok.Check(); err != nil {
		t.Fatalf("Check(%+v) = %s %v", ok, f, err)
	}
	for _, c := range []struct {
		a     Alarm
		field string
	}{
		{Alarm{Name: "", AtMs: 1}, "name"},
		{Alarm{Name: "a/b", AtMs: 1}, "name"},
		{Alarm{Name: strings.Repeat("n", MaxAlarmNameLen+1), AtMs: 1}, "name"},
		{Alarm{Name: "a", AtMs: -1}, "atMs"},
		{Alarm{Name: "a", AtMs: MaxAlarmTimeMs + 1}, "atMs"},
		{Alarm{Name: "a", AtMs: 1, EveryMs: MinAlarmEveryMs - 1}, "everyMs"},
		{Alarm{Name: "a", AtMs: 1, EveryMs: -5}, "everyMs"},
		{Alarm{Name: "a", AtMs: 1, MaxAttempts: MaxAlarmAttempts + 1}, "maxAttempts"},
		{Alarm{Name: "a", AtMs: 1, MaxAttempts: -1}, "maxAttempts"},
		{Alarm{Name: "a", AtMs: 1, BackoffMs: MinAlarmBackoffMs - 1}, "backoffMs"},
		{Alarm{Name: "a", AtMs: 1, BackoffMs: MaxAlarmBackoffMs + 1}, "backoffMs"},
	} {
		if f, err := c.a.Check(); f != c.field || err == nil {
			t.Errorf("Check(%+v) = %q, %v; want field %q", c.a, f, err, c.field)
		}
	}
}

func TestAlarmNormalized(t *testing.T) {
	a := Alarm{Name: "a", AtMs: 7, EveryMs: 2000, SkipMissed: true, Failures: 3, Waits: 2, Gen: "old", DueMs: 9}.Normalized("g")
	want := Alarm{Name: "a", AtMs: 7, EveryMs: 2000, SkipMissed: true, MaxAttempts: DefaultAlarmAttempts, BackoffMs: DefaultAlarmBackoffMs, Gen: "g"}
	if a != want {
		t.Fatalf("Normalized = %+v; want %+v", a, want)
	}
}

func TestAlarmAfterSuccess(t *testing.T) {
	one := Alarm{Name: "a", AtMs: 1000}
	if _, ok := one.AfterSuccess(5000); ok {
		t.Error("a one-shot alarm continued after its success")
	}
	rep := Alarm{Name: "a", AtMs: 1000, EveryMs: 1000, Failures: 2, Waits: 3}
	cases := []struct {
		now, skip, once int64
	}{
		{now: 1500, skip: 2000, once: 2000}, // on time: the next tick
		{now: 2000, skip: 3000, once: 2000}, // the next tick is due now: fire it (once) or skip past now
		{now: 4700, skip: 5000, once: 4000}, // three ticks missed: fire the latest once, or skip them all
	}
	for _, c := range cases {
		for _, skip := range []bool{false, true} {
			r := rep
			r.SkipMissed = skip
			next, ok := r.AfterSuccess(c.now)
			want := c.once
			if skip {
				want = c.skip
			}
			if !ok || next.AtMs != want || next.Failures != 0 || next.Waits != 0 || next.EveryMs != 1000 {
				t.Errorf("skip=%v now=%d: AfterSuccess = %+v, %v; want AtMs %d, failures and waits reset", skip, c.now, next, ok, want)
			}
		}
	}
}

func TestAlarmAfterFailure(t *testing.T) {
	a := Alarm{Name: "a", AtMs: 1000, MaxAttempts: 3, BackoffMs: 100, Waits: 4}
	now := int64(10_000)
	n1, due1, dead, ok := a.AfterFailure(now)
	if dead || !ok || n1.Failures != 1 || n1.Waits != 0 || n1.AtMs != 1000 || due1 != now+100 {
		t.Fatalf("first failure: %+v due %d dead %v ok %v; want failures 1, due now+100", n1, due1, dead, ok)
	}
	n2, due2, dead, ok := n1.AfterFailure(now)
	if dead || !ok || n2.Failures != 2 || due2 != now+200 {
		t.Fatalf("second failure: %+v due %d dead %v; want failures 2, due now+200 (doubled)", n2, due2, dead)
	}
	if _, _, dead, ok := n2.AfterFailure(now); !dead || ok {
		t.Fatalf("third failure of 3 attempts: dead %v ok %v; want a dead one-shot alarm", dead, ok)
	}
	r := n2
	r.EveryMs = 5000
	next, due, dead, ok := r.AfterFailure(now)
	if !dead || !ok || next.AtMs != 6000 || due != 6000 || next.Failures != 0 {
		t.Fatalf("last failure of a repeating alarm: %+v due %d dead %v ok %v; want the occurrence dead and the next one (6000, once policy) kept", next, due, dead, ok)
	}
	big := Alarm{Name: "a", MaxAttempts: MaxAlarmAttempts, BackoffMs: MaxAlarmBackoffMs / 2, Failures: 50}
	if _, due, _, _ := big.AfterFailure(0); due != MaxAlarmBackoffMs {
		t.Errorf("backoff after 51 failures = %d; want the cap %d", due, MaxAlarmBackoffMs)
	}
}

func TestAlarmAfterUnavailable(t *testing.T) {
	a := Alarm{Name: "a", AtMs: 1, Failures: 2}
	now := int64(1000)
	var dues []int64
	for range 6 {
		var due int64
		a, due = a.AfterUnavailable(now, 100, 1000, 0)
		dues = append(dues, due-now)
	}
	want := []int64{100, 200, 400, 800, 1000, 1000}
	for i := range want {
		if dues[i] != want[i] {
			t.Fatalf("waits = %v; want %v", dues, want)
		}
	}
	if a.Failures != 2 || a.Waits != 6 {
		t.Errorf("after waits: %+v; want failures unchanged (2) and 6 waits", a)
	}
	if _, due := a.AfterUnavailable(now, 100, 1000, 5000); due != now+5000 {
		t.Errorf("Retry-After 5 s: due %d; want now+5000", due)
	}
}

func TestAlarmMemberAndShard(t *testing.T) {
	m := AlarmMember("/counter", "abc", "tick")
	if m != "/counter/abc/tick" {
		t.Fatalf("AlarmMember = %q", m)
	}
	ns, id, name, ok := SplitAlarmMember(m)
	if !ok || ns != "/counter" || id != "abc" || name != "tick" {
		t.Fatalf("SplitAlarmMember(%q) = %q %q %q %v", m, ns, id, name, ok)
	}
	for _, bad := range []string{"", "/counter/abc", "/counter/abc/", "counter/abc/x", "/counter//x", "//a/b"} {
		if _, _, _, ok := SplitAlarmMember(bad); ok {
			t.Errorf("SplitAlarmMember(%q) accepted", bad)
		}
	}
	seen := map[int]bool{}
	for i := range 1000 {
		s := AlarmShard(PlacementName("/counter", "id"+string(rune('a'+i%26))+string(rune('a'+i/26))))
		if s < 0 || s >= AlarmShards {
			t.Fatalf("AlarmShard = %d; want [0, %d)", s, AlarmShards)
		}
		seen[s] = true
	}
	if len(seen) != AlarmShards {
		t.Errorf("1000 ids hit %d of %d shards", len(seen), AlarmShards)
	}
}

// The keys of one instance's alarms share one hash tag (one Cluster slot):
// that of its shard.
func TestAlarmKeysShareTheShardTag(t *testing.T) {
	s := AlarmShard(PlacementName("/counter", "abc"))
	tag := "{" + strconv.Itoa(s) + "}"
	for _, k := range []string{KeyAlarmDue(s), KeyAlarmRecords(s), KeyAlarmIndex("/counter", "abc"), KeyAlarmDead(s), KeyAlarmDeadTimes(s)} {
		if !strings.HasPrefix(k, KeyPrefixAlarms+tag+":") || strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Errorf("key %q: want the prefix %q and no other brace", k, KeyPrefixAlarms+tag+":")
		}
	}
	if got := DeadAlarmKey("/n/i/a", 42); got != "/n/i/a@42" {
		t.Errorf("DeadAlarmKey = %q", got)
	}
}

func TestAlarmJSONNames(t *testing.T) {
	b, _ := json.Marshal(AlarmSetRequest{SessionID: "s", Namespace: "/n", ID: "i", Alarm: Alarm{Name: "a", AtMs: 5, EveryMs: 1000, SkipMissed: true, MaxAttempts: 3, BackoffMs: 10}})
	want := `{"sessionId":"s","namespace":"/n","id":"i","alarm":{"name":"a","atMs":5,"everyMs":1000,"skipMissed":true,"maxAttempts":3,"backoffMs":10}}`
	if string(b) != want {
		t.Errorf("json = %s; want %s", b, want)
	}
	b, _ = json.Marshal(DeadAlarm{Namespace: "/n", ID: "i", Alarm: Alarm{Name: "a", AtMs: 1, Failures: 6, Gen: "g"}, DeadAtMs: 2, Error: "HTTP 500"})
	want = `{"namespace":"/n","id":"i","alarm":{"name":"a","atMs":1,"failures":6,"gen":"g"},"deadAtMs":2,"error":"HTTP 500"}`
	if string(b) != want {
		t.Errorf("json = %s; want %s", b, want)
	}
}
