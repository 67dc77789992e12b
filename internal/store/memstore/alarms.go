package memstore

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// alarmShard mirrors one redisstore alarm shard: records, due times, the
// per-instance name index and the dead letters. Its maps are made on first
// use; the zero value is an empty shard.
type alarmShard struct {
	recs  map[string]string              // member -> stored record
	due   map[string]int64               // member -> due ms (claimed: end of the claim)
	index map[string]map[string]struct{} // placement name -> alarm names
	dead  map[string]string              // dead key -> stored dead letter
	deadT map[string]int64               // dead key -> when it died
}

func (sh *alarmShard) init() {
	if sh.recs == nil {
		sh.recs, sh.due = map[string]string{}, map[string]int64{}
		sh.index = map[string]map[string]struct{}{}
		sh.dead, sh.deadT = map[string]string{}, map[string]int64{}
	}
}

func (s *Store) alarmShardOf(ns, id string) (*alarmShard, string) {
	name := wire.PlacementName(ns, id)
	sh := &s.alarms[wire.AlarmShard(name)]
	sh.init()
	return sh, name
}

// SetAlarm implements store.Alarms.
func (s *Store) SetAlarm(ctx context.Context, ns, id string, a wire.Alarm, max int) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	sh, name := s.alarmShardOf(ns, id)
	names := sh.index[name]
	if _, ok := names[a.Name]; !ok && len(names) >= max {
		return store.ErrTooManyAlarms
	}
	if names == nil {
		names = map[string]struct{}{}
		sh.index[name] = names
	}
	names[a.Name] = struct{}{}
	m := wire.AlarmMember(ns, id, a.Name)
	sh.recs[m] = store.EncodeAlarm(a)
	sh.due[m] = a.AtMs
	return nil
}

// DeleteAlarm implements store.Alarms.
func (s *Store) DeleteAlarm(ctx context.Context, ns, id, name string) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	sh, pname := s.alarmShardOf(ns, id)
	m := wire.AlarmMember(ns, id, name)
	_, ok := sh.recs[m]
	sh.remove(pname, m, name)
	return ok, nil
}

func (sh *alarmShard) remove(pname, member, name string) {
	delete(sh.recs, member)
	delete(sh.due, member)
	if names := sh.index[pname]; names != nil {
		delete(names, name)
		if len(names) == 0 {
			delete(sh.index, pname)
		}
	}
}

// ListAlarms implements store.Alarms.
func (s *Store) ListAlarms(ctx context.Context, ns, id string) ([]wire.Alarm, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	sh, pname := s.alarmShardOf(ns, id)
	out := []wire.Alarm{}
	for name := range sh.index[pname] {
		m := wire.AlarmMember(ns, id, name)
		rec, ok := sh.recs[m]
		if !ok {
			continue
		}
		a, err := store.DecodeAlarm(rec)
		if err != nil {
			return nil, err
		}
		a.DueMs = sh.due[m]
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b wire.Alarm) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// ClaimAlarms implements store.Alarms. It scans the shard (the memory store
// serves `pinboard -dev` and tests, not large alarm sets).
func (s *Store) ClaimAlarms(ctx context.Context, shard int, nowMs int64, claim time.Duration, max int) ([]store.ClaimedAlarm, int64, error) {
	if err := s.begin(ctx); err != nil {
		return nil, 0, err
	}
	defer s.mu.Unlock()
	sh := &s.alarms[shard]
	sh.init()
	type cand struct {
		m   string
		due int64
	}
	var due []cand
	for m, d := range sh.due {
		if d <= nowMs {
			due = append(due, cand{m, d})
		}
	}
	slices.SortFunc(due, func(a, b cand) int { return cmp.Or(cmp.Compare(a.due, b.due), cmp.Compare(a.m, b.m)) })
	var out []store.ClaimedAlarm
	for _, c := range due[:min(len(due), max)] {
		ns, id, _, ok := wire.SplitAlarmMember(c.m)
		a, err := store.DecodeAlarm(sh.recs[c.m])
		if !ok || err != nil {
			delete(sh.due, c.m) // an alarm that cannot be delivered: never claimed again
			continue
		}
		sh.due[c.m] = nowMs + claim.Milliseconds()
		out = append(out, store.ClaimedAlarm{Namespace: ns, ID: id, Alarm: a, Record: sh.recs[c.m]})
	}
	next := int64(-1)
	for _, d := range sh.due {
		if next < 0 || d < next {
			next = d
		}
	}
	return out, next, nil
}

// FinishAlarm implements store.Alarms.
func (s *Store) FinishAlarm(ctx context.Context, c store.ClaimedAlarm, next *wire.Alarm, nextDueMs int64, dead *wire.DeadAlarm, maxDead int) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	sh, pname := s.alarmShardOf(c.Namespace, c.ID)
	m := wire.AlarmMember(c.Namespace, c.ID, c.Alarm.Name)
	if rec, ok := sh.recs[m]; !ok || rec != c.Record {
		return false, nil
	}
	if next == nil {
		sh.remove(pname, m, c.Alarm.Name)
	} else {
		sh.recs[m] = store.EncodeAlarm(*next)
		sh.due[m] = nextDueMs
	}
	if dead != nil {
		k := wire.DeadAlarmKey(m, dead.Alarm.AtMs)
		sh.dead[k] = store.EncodeDeadAlarm(*dead)
		sh.deadT[k] = dead.DeadAtMs
		for len(sh.deadT) > maxDead {
			oldest, at := "", int64(0)
			for k, t := range sh.deadT {
				if oldest == "" || t < at || t == at && k < oldest {
					oldest, at = k, t
				}
			}
			delete(sh.deadT, oldest)
			delete(sh.dead, oldest)
		}
	}
	return true, nil
}

// DeadAlarms implements store.Alarms.
func (s *Store) DeadAlarms(ctx context.Context, max int) ([]wire.DeadAlarm, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []wire.DeadAlarm
	for i := range s.alarms {
		for _, v := range s.alarms[i].dead {
			d, err := store.DecodeDeadAlarm(v)
			if err != nil {
				return nil, err
			}
			out = append(out, d)
		}
	}
	return store.NewestDeadAlarms(out, max), nil
}
