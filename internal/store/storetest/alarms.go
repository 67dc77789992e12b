package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// RunAlarms runs the alarm conformance suite (store.Alarms semantics);
// newHarness is called once per subtest and its Store must implement
// store.Alarms. Alarm times are arguments, so nothing here waits.
func RunAlarms(t *testing.T, newHarness NewHarness) {
	tests := []struct {
		name string
		f    func(t *testing.T, st store.Alarms)
	}{
		{"SetListDelete", testAlarmSetListDelete},
		{"SetReplacesByName", testAlarmReplace},
		{"PerInstanceCap", testAlarmCap},
		{"ClaimTakesDueAlarmsOnce", testAlarmClaim},
		{"ClaimLimitAndNext", testAlarmClaimLimit},
		{"ConcurrentClaimsNeverShare", testAlarmClaimConcurrent},
		{"FinishComparesAndSets", testAlarmFinish},
		{"DeadLettersNewestFirstAndCapped", testAlarmDead},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, store.Options{})
			defer h.Store.Close()
			st, ok := h.Store.(store.Alarms)
			if !ok {
				t.Fatalf("%T does not implement store.Alarms", h.Store)
			}
			tc.f(t, st)
		})
	}
}

const alarmNS = "/counter"

// sameShardIDs returns n ids of alarmNS whose alarms share one shard.
func sameShardIDs(n int) (shard int, ids []string) {
	shard = -1
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprintf("id%d", i)
		s := wire.AlarmShard(wire.PlacementName(alarmNS, id))
		if shard < 0 {
			shard = s
		}
		if s == shard {
			ids = append(ids, id)
		}
	}
	return shard, ids
}

func alarm(name string, at int64, gen string) wire.Alarm {
	return wire.Alarm{Name: name, AtMs: at, Gen: gen}.Normalized(gen)
}

func mustSet(t *testing.T, st store.Alarms, id string, a wire.Alarm) {
	t.Helper()
	if err := st.SetAlarm(context.Background(), alarmNS, id, a, 100); err != nil {
		t.Fatalf("SetAlarm(%s, %+v): %v", id, a, err)
	}
}

func list(t *testing.T, st store.Alarms, id string) []wire.Alarm {
	t.Helper()
	as, err := st.ListAlarms(context.Background(), alarmNS, id)
	if err != nil {
		t.Fatalf("ListAlarms(%s): %v", id, err)
	}
	return as
}

func names(as []wire.Alarm) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Name)
	}
	return out
}

func claim(t *testing.T, st store.Alarms, shard int, now int64, max int) ([]store.ClaimedAlarm, int64) {
	t.Helper()
	cs, next, err := st.ClaimAlarms(context.Background(), shard, now, 30*time.Second, max)
	if err != nil {
		t.Fatalf("ClaimAlarms(%d, %d): %v", shard, now, err)
	}
	return cs, next
}

func claimedNames(cs []store.ClaimedAlarm) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.ID+"/"+c.Alarm.Name)
	}
	return out
}

func testAlarmSetListDelete(t *testing.T, st store.Alarms) {
	ctx := context.Background()
	mustSet(t, st, "a", alarm("tick", 2000, "g1"))
	mustSet(t, st, "a", alarm("expire", 1000, "g2"))
	mustSet(t, st, "b", alarm("tick", 3000, "g3"))
	got := list(t, st, "a")
	if !slices.Equal(names(got), []string{"expire", "tick"}) {
		t.Fatalf("ListAlarms(a) = %v; want [expire tick] (by name)", names(got))
	}
	if got[0].DueMs != 1000 || got[0].Gen != "g2" || got[0].MaxAttempts != wire.DefaultAlarmAttempts || got[1].DueMs != 2000 {
		t.Errorf("ListAlarms(a) = %+v; want due times 1000 and 2000, the stored fields", got)
	}
	if l := list(t, st, "nobody"); len(l) != 0 {
		t.Errorf("ListAlarms(nobody) = %v; want none", l)
	}
	if ok, err := st.DeleteAlarm(ctx, alarmNS, "a", "tick"); err != nil || !ok {
		t.Fatalf("DeleteAlarm(a, tick) = %v, %v; want true", ok, err)
	}
	if ok, err := st.DeleteAlarm(ctx, alarmNS, "a", "tick"); err != nil || ok {
		t.Fatalf("second DeleteAlarm(a, tick) = %v, %v; want false", ok, err)
	}
	if n := names(list(t, st, "a")); !slices.Equal(n, []string{"expire"}) {
		t.Errorf("after delete: %v; want [expire]", n)
	}
	if n := names(list(t, st, "b")); !slices.Equal(n, []string{"tick"}) {
		t.Errorf("b's alarm after deleting a's of the same name: %v; want [tick]", n)
	}
	// A deleted alarm is never claimed.
	shard := wire.AlarmShard(wire.PlacementName(alarmNS, "a"))
	cs, _ := claim(t, st, shard, 10_000, 100)
	for _, c := range cs {
		if c.ID == "a" && c.Alarm.Name == "tick" {
			t.Errorf("a deleted alarm was claimed: %+v", c)
		}
	}
}

func testAlarmReplace(t *testing.T, st store.Alarms) {
	shard := wire.AlarmShard(wire.PlacementName(alarmNS, "a"))
	mustSet(t, st, "a", alarm("tick", 1000, "g1"))
	mustSet(t, st, "a", alarm("tick", 5000, "g2"))
	got := list(t, st, "a")
	if len(got) != 1 || got[0].Gen != "g2" || got[0].AtMs != 5000 || got[0].DueMs != 5000 {
		t.Fatalf("after re-setting: %+v; want one alarm, gen g2, due 5000", got)
	}
	if cs, _ := claim(t, st, shard, 2000, 100); len(cs) != 0 {
		t.Errorf("claim at 2000 = %v; want nothing (the replaced alarm's time no longer counts)", claimedNames(cs))
	}
	// Re-setting a claimed alarm makes it due at its new time.
	cs, _ := claim(t, st, shard, 5000, 100)
	if len(cs) != 1 {
		t.Fatalf("claim at 5000 = %v; want the alarm", claimedNames(cs))
	}
	mustSet(t, st, "a", alarm("tick", 6000, "g3"))
	if cs, _ := claim(t, st, shard, 6000, 100); len(cs) != 1 || cs[0].Alarm.Gen != "g3" {
		t.Fatalf("claim at 6000 after re-setting a claimed alarm = %+v; want the new one", cs)
	}
}

func testAlarmCap(t *testing.T, st store.Alarms) {
	ctx := context.Background()
	for _, n := range []string{"a", "b"} {
		if err := st.SetAlarm(ctx, alarmNS, "x", alarm(n, 1, "g"), 2); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.SetAlarm(ctx, alarmNS, "x", alarm("c", 1, "g"), 2); !errors.Is(err, store.ErrTooManyAlarms) {
		t.Fatalf("a third alarm with max 2: %v; want ErrTooManyAlarms", err)
	}
	if err := st.SetAlarm(ctx, alarmNS, "x", alarm("b", 9, "g2"), 2); err != nil {
		t.Fatalf("replacing an alarm at the cap: %v; want it allowed", err)
	}
	if err := st.SetAlarm(ctx, alarmNS, "y", alarm("c", 1, "g"), 2); err != nil {
		t.Fatalf("another instance's alarm: %v; the cap is per instance", err)
	}
	if _, err := st.DeleteAlarm(ctx, alarmNS, "x", "a"); err != nil {
		t.Fatal(err)
	}
	if err := st.SetAlarm(ctx, alarmNS, "x", alarm("c", 1, "g"), 2); err != nil {
		t.Fatalf("after a delete freed a slot: %v", err)
	}
}

func testAlarmClaim(t *testing.T, st store.Alarms) {
	shard, ids := sameShardIDs(3)
	mustSet(t, st, ids[0], alarm("a", 1000, "g"))
	mustSet(t, st, ids[1], alarm("a", 2000, "g"))
	mustSet(t, st, ids[2], alarm("a", 9000, "g"))
	if cs, next := claim(t, st, shard, 999, 100); len(cs) != 0 || next != 1000 {
		t.Fatalf("claim before any is due = %v, next %d; want nothing, next 1000", claimedNames(cs), next)
	}
	cs, next := claim(t, st, shard, 2000, 100)
	if want := []string{ids[0] + "/a", ids[1] + "/a"}; !slices.Equal(claimedNames(cs), want) {
		t.Fatalf("claim at 2000 = %v; want %v in due order", claimedNames(cs), want)
	}
	if cs[0].Namespace != alarmNS || cs[0].Alarm.AtMs != 1000 || cs[0].Record == "" {
		t.Errorf("claimed = %+v; want its namespace, alarm and record", cs[0])
	}
	if next != 9000 {
		t.Errorf("next after claiming = %d; want 9000 (the claims end at 32000)", next)
	}
	if again, _ := claim(t, st, shard, 31_999, 100); len(again) != 1 || again[0].ID != ids[2] {
		t.Fatalf("claim during the claims = %v; want only %s (claimed alarms are not due again before their claim ends)", claimedNames(again), ids[2])
	}
	if l := list(t, st, ids[0]); len(l) != 1 || l[0].DueMs != 32_000 {
		t.Errorf("a claimed alarm lists as %+v; want due at the end of its claim (32000)", l)
	}
	if back, _ := claim(t, st, shard, 32_000, 100); !slices.Equal(claimedNames(back), []string{ids[0] + "/a", ids[1] + "/a"}) {
		t.Fatalf("claim after the claims ended = %v; want both again (at least once)", claimedNames(back))
	}
}

func testAlarmClaimLimit(t *testing.T, st store.Alarms) {
	shard, ids := sameShardIDs(5)
	for i, id := range ids {
		mustSet(t, st, id, alarm("a", int64(100+i), "g"))
	}
	cs, next := claim(t, st, shard, 1000, 2)
	if len(cs) != 2 || cs[0].ID != ids[0] || cs[1].ID != ids[1] {
		t.Fatalf("claim of 2 = %v; want the two earliest", claimedNames(cs))
	}
	if next != 102 {
		t.Errorf("next = %d; want 102 (more are due)", next)
	}
	if cs, next := claim(t, st, wire.AlarmShards-1-shard%wire.AlarmShards, 1000, 2); len(cs) != 0 || next != -1 {
		t.Errorf("claim of an empty shard = %v, %d; want nothing, -1", claimedNames(cs), next)
	}
}

func testAlarmClaimConcurrent(t *testing.T, st store.Alarms) {
	shard, ids := sameShardIDs(50)
	for _, id := range ids {
		for _, n := range []string{"a", "b"} {
			mustSet(t, st, id, alarm(n, 1000, "g"))
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				cs, _, err := st.ClaimAlarms(context.Background(), shard, 5000, time.Minute, 7)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, n := range claimedNames(cs) {
					seen[n]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != 100 {
		t.Errorf("%d distinct alarms claimed; want all 100", len(seen))
	}
	for n, k := range seen {
		if k != 1 {
			t.Errorf("%s claimed %d times by concurrent claimers; want once", n, k)
		}
	}
}

func testAlarmFinish(t *testing.T, st store.Alarms) {
	ctx := context.Background()
	shard, ids := sameShardIDs(1)
	id := ids[0]
	mustSet(t, st, id, alarm("once", 1000, "g1"))
	mustSet(t, st, id, alarm("rep", 1000, "g2"))
	mustSet(t, st, id, alarm("reset", 1000, "g3"))
	cs, _ := claim(t, st, shard, 1000, 100)
	byName := map[string]store.ClaimedAlarm{}
	for _, c := range cs {
		byName[c.Alarm.Name] = c
	}
	// "reset" is set again while its delivery is in flight: that
	// delivery's outcome must not touch the new alarm.
	mustSet(t, st, id, alarm("reset", 7000, "g4"))
	if ok, err := st.FinishAlarm(ctx, byName["reset"], nil, 0, nil, 10); err != nil || ok {
		t.Fatalf("FinishAlarm of a re-set alarm = %v, %v; want false", ok, err)
	}
	if ok, err := st.FinishAlarm(ctx, byName["once"], nil, 0, nil, 10); err != nil || !ok {
		t.Fatalf("FinishAlarm(once, remove) = %v, %v; want true", ok, err)
	}
	next := byName["rep"].Alarm
	next.AtMs, next.Failures = 4000, 0
	if ok, err := st.FinishAlarm(ctx, byName["rep"], &next, 4000, nil, 10); err != nil || !ok {
		t.Fatalf("FinishAlarm(rep, next) = %v, %v; want true", ok, err)
	}
	got := list(t, st, id)
	if !slices.Equal(names(got), []string{"rep", "reset"}) || got[0].AtMs != 4000 || got[0].DueMs != 4000 || got[1].Gen != "g4" || got[1].DueMs != 7000 {
		t.Fatalf("after the finishes: %+v; want rep at 4000 and the re-set reset (g4, 7000)", got)
	}
	// A second finish of the same claim (a late duplicate) changes nothing.
	if ok, err := st.FinishAlarm(ctx, byName["once"], nil, 0, nil, 10); err != nil || ok {
		t.Fatalf("a repeated FinishAlarm = %v, %v; want false", ok, err)
	}
	if cs, _ := claim(t, st, shard, 3999, 100); len(cs) != 0 {
		t.Fatalf("claim at 3999 = %v; want nothing (rep is due at 4000, reset at 7000)", claimedNames(cs))
	}
	if cs, _ := claim(t, st, shard, 4000, 100); !slices.Equal(claimedNames(cs), []string{id + "/rep"}) {
		t.Fatalf("claim at 4000 = %v; want rep", claimedNames(cs))
	}
	// A deleted alarm's delivery finishes to nothing.
	cs, _ = claim(t, st, shard, 7000, 100)
	if len(cs) != 1 {
		t.Fatalf("claim at 7000 = %v; want reset", claimedNames(cs))
	}
	if _, err := st.DeleteAlarm(ctx, alarmNS, id, "reset"); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.FinishAlarm(ctx, cs[0], &cs[0].Alarm, 9000, nil, 10); err != nil || ok {
		t.Fatalf("FinishAlarm of a deleted alarm = %v, %v; want false (it stays deleted)", ok, err)
	}
	if n := names(list(t, st, id)); !slices.Equal(n, []string{"rep"}) {
		t.Fatalf("alarms = %v; want [rep]", n)
	}
}

func testAlarmDead(t *testing.T, st store.Alarms) {
	ctx := context.Background()
	shard, ids := sameShardIDs(4)
	for i, id := range ids {
		mustSet(t, st, id, alarm("a", int64(1000+i), "g"))
	}
	cs, _ := claim(t, st, shard, 5000, 100)
	if len(cs) != 4 {
		t.Fatalf("claimed %v; want 4", claimedNames(cs))
	}
	for i, c := range cs {
		d := &wire.DeadAlarm{Namespace: c.Namespace, ID: c.ID, Alarm: c.Alarm, DeadAtMs: int64(10_000 + i), Error: fmt.Sprintf("HTTP 500 #%d", i)}
		if ok, err := st.FinishAlarm(ctx, c, nil, 0, d, 3); err != nil || !ok {
			t.Fatalf("FinishAlarm(dead) = %v, %v", ok, err)
		}
	}
	dead, err := st.DeadAlarms(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range dead {
		got = append(got, d.ID+" "+d.Error)
	}
	want := []string{ids[3] + " HTTP 500 #3", ids[2] + " HTTP 500 #2", ids[1] + " HTTP 500 #1"}
	if !slices.Equal(got, want) {
		t.Fatalf("DeadAlarms = %v; want %v (newest first, the shard keeps 3)", got, want)
	}
	if d, err := st.DeadAlarms(ctx, 1); err != nil || len(d) != 1 || d[0].ID != ids[3] || d[0].Alarm.Name != "a" {
		t.Fatalf("DeadAlarms(1) = %+v, %v; want the newest", d, err)
	}
	for _, id := range ids {
		if l := list(t, st, id); len(l) != 0 {
			t.Errorf("a dead-lettered one-shot alarm is still listed: %+v", l)
		}
	}
}
