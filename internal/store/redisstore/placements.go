package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/faults"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/wire"
)

// Lookup implements store.Store. It reads through the client-side cache,
// so Redis tracks the key for this connection and a later change reaches
// OnInvalidate.
func (s *Store) Lookup(ctx context.Context, ns, id string) (store.Placement, error) {
	p, _, err := s.LookupUntil(ctx, ns, id)
	return p, err
}

// Placement implements store.Store: Lookup's session.
func (s *Store) Placement(ctx context.Context, ns, id string) (string, error) {
	p, _, err := s.LookupUntil(ctx, ns, id)
	return p.Session, err
}

// PlacementUntil implements store.CachedPlacements: LookupUntil's session.
func (s *Store) PlacementUntil(ctx context.Context, ns, id string) (string, time.Time, error) {
	p, until, err := s.LookupUntil(ctx, ns, id)
	return p.Session, until, err
}

// LookupUntil implements store.CachedLookups: Lookup, and when the
// client-side cache entry behind the answer expires. A fresh entry lives
// CacheTTL less a random fifth at most, so that placements read together
// (a pinboard's first second of traffic) do not all expire, and all get
// re-read, in the same instant of every later TTL.
func (s *Store) LookupUntil(ctx context.Context, ns, id string) (store.Placement, time.Time, error) {
	c, err := s.get(ctx)
	if err != nil {
		return store.Placement{}, time.Time{}, err
	}
	ttl := s.cacheTTL - rand.N(s.cacheTTL/5+1)
	res := c.DoCache(ctx, c.B().Get().Key(wire.KeyPlacement(ns, id)).Cache(), ttl)
	var until time.Time
	if at := res.CachePXAT(); at > 0 {
		until = time.UnixMilli(at)
	}
	v, err := res.ToString()
	if rueidis.IsRedisNil(err) {
		return store.Placement{}, until, nil
	}
	if err != nil {
		return store.Placement{}, until, s.wrap(ctx, "placement", err)
	}
	p, err := parsePlacement(v)
	return p, until, err
}

// parsePlacement decodes a placement key's value ("" is none).
func parsePlacement(v string) (store.Placement, error) {
	if v == "" {
		return store.Placement{}, nil
	}
	epoch, since, sid, ok := wire.ParsePlacement(v)
	if !ok {
		return store.Placement{}, fmt.Errorf("redisstore: placement value %q is not \"<epoch> <since> <session>\" (protocol version %d): does a pinboard of another version share this Redis?", v, wire.Version)
	}
	return store.Placement{Session: sid, Epoch: epoch, Since: time.UnixMilli(since)}, nil
}

func (s *Store) indexAdd(ctx context.Context, c rueidis.Client, sid, ns, name string) error {
	err := scriptIndexAdd.Exec(ctx, c, []string{wire.KeyOwned(sid)}, []string{name, wire.OwnedCountPrefix + ns}).Error()
	return s.wrap(ctx, "index", err)
}

// unindex removes name from sid's index unless the placement names sid
// again by the time the removal is done (see the package doc).
func (s *Store) unindex(ctx context.Context, c rueidis.Client, sid, ns, name string) error {
	err := scriptIndexDel.Exec(ctx, c, []string{wire.KeyOwned(sid)}, []string{name, wire.OwnedCountPrefix + ns}).Error()
	if err != nil {
		return s.wrap(ctx, "unindex", err)
	}
	v, err := c.Do(ctx, c.B().Get().Key(wire.KeyPlacementName(name)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return nil
	}
	if err != nil {
		return s.wrap(ctx, "unindex", err)
	}
	if _, _, h, _ := wire.ParsePlacement(v); h == sid {
		return s.indexAdd(ctx, c, sid, ns, name)
	}
	return nil
}

// placementKeys are the keys of the placement scripts: the placement and
// its epoch counter (one hash tag, one cluster slot).
func placementKeys(name string) []string {
	return []string{wire.KeyPlacementName(name), wire.KeyEpochName(name)}
}

// Claim implements store.Store: ClaimPlacement's session.
func (s *Store) Claim(ctx context.Context, ns, id, sessionID string) (string, error) {
	p, err := s.ClaimPlacement(ctx, ns, id, sessionID)
	return p.Session, err
}

// ClaimPlacement implements store.Store.
func (s *Store) ClaimPlacement(ctx context.Context, ns, id, sessionID string) (store.Placement, error) {
	if sessionID == "" {
		return store.Placement{}, errors.New("cannot claim: empty session id")
	}
	c, err := s.get(ctx)
	if err != nil {
		return store.Placement{}, err
	}
	name := wire.PlacementName(ns, id)
	// Index first, claim second, in one round trip: Redis runs a pipeline
	// in order on one node (see the package doc for cluster mode).
	claim := scriptClaim
	if faults.Has(faults.ClaimNoNX) {
		claim = scriptClaimBlind // planted bug (pinned_faults builds only)
	}
	res := pipeline(ctx, c,
		scriptIndexAdd.with([]string{wire.KeyOwned(sessionID)}, name, wire.OwnedCountPrefix+ns),
		claim.with(placementKeys(name), sessionID, s.fenceSeconds, i64(s.clock.Now().UnixMilli()), s.epochTTL))
	if err := res[0].Error(); err != nil {
		return store.Placement{}, s.wrap(ctx, "index", err)
	}
	v, err := res[1].ToString()
	if err != nil {
		return store.Placement{}, errors.Join(s.fenced(ctx, "claim", err), s.unindex(ctx, c, sessionID, ns, name))
	}
	p, err := parsePlacement(v)
	if err != nil {
		return p, err
	}
	if p.Session == sessionID {
		return p, s.indexAdd(ctx, c, sessionID, ns, name)
	}
	return p, s.unindex(ctx, c, sessionID, ns, name)
}

// Replace implements store.Store: ReplacePlacement's session.
func (s *Store) Replace(ctx context.Context, ns, id, old, sessionID string) (string, error) {
	p, err := s.ReplacePlacement(ctx, ns, id, old, sessionID)
	return p.Session, err
}

// ReplacePlacement implements store.Store.
func (s *Store) ReplacePlacement(ctx context.Context, ns, id, old, sessionID string) (store.Placement, error) {
	if sessionID == "" || old == "" {
		return store.Placement{}, errors.New("cannot replace: empty session id")
	}
	c, err := s.get(ctx)
	if err != nil {
		return store.Placement{}, err
	}
	name := wire.PlacementName(ns, id)
	replace := scriptReplace
	if faults.Has(faults.ReplaceNoCompare) {
		replace = scriptReplaceBlind // planted bug (pinned_faults builds only)
	}
	res := pipeline(ctx, c,
		scriptIndexAdd.with([]string{wire.KeyOwned(sessionID)}, name, wire.OwnedCountPrefix+ns),
		replace.with(placementKeys(name), old, sessionID, s.fenceSeconds, i64(s.clock.Now().UnixMilli()), s.epochTTL))
	if err := res[0].Error(); err != nil {
		return store.Placement{}, s.wrap(ctx, "index", err)
	}
	v, err := res[1].ToString()
	if err != nil {
		return store.Placement{}, errors.Join(s.fenced(ctx, "replace", err), s.unindex(ctx, c, sessionID, ns, name))
	}
	p, err := parsePlacement(v)
	if err != nil {
		return p, err
	}
	if p.Session != sessionID {
		return p, s.unindex(ctx, c, sessionID, ns, name)
	}
	if err := s.indexAdd(ctx, c, sessionID, ns, name); err != nil {
		return p, err
	}
	if old != sessionID {
		return p, s.unindex(ctx, c, old, ns, name)
	}
	return p, nil
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, ns, id, sessionID string) (bool, error) {
	if sessionID == "" {
		return false, nil
	}
	c, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	n, err := scriptRelease.Exec(ctx, c, placementKeys(wire.PlacementName(ns, id)), []string{sessionID, s.epochTTL}).AsInt64()
	if err != nil {
		return false, s.wrap(ctx, "release", err)
	}
	if n == 0 {
		return false, nil
	}
	return true, s.unindex(ctx, c, sessionID, ns, wire.PlacementName(ns, id))
}

// PlacementCounts implements store.Store.
func (s *Store) PlacementCounts(ctx context.Context, sessionID string) (map[string]int, error) {
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	f, err := c.Do(ctx, c.B().Hgetall().Key(wire.KeyOwned(sessionID)).Build()).AsStrMap()
	if err != nil {
		return nil, s.wrap(ctx, "placement counts", err)
	}
	out := map[string]int{}
	for k, v := range f {
		if ns, ok := strings.CutPrefix(k, wire.OwnedCountPrefix); ok {
			n, _ := strconv.Atoi(v)
			out[ns] = n
		}
	}
	return out, nil
}

// Reap implements store.Reaper. Candidates are the sessions whose pinned:w
// score (their last known expiry) is at least grace old; a candidate whose
// hash still exists had a heartbeat whose score update lagged, and gets its
// score repaired instead. For a dead session it compare-and-deletes every
// indexed placement, removes it from its namespace sets, then deletes its
// index and its pinned:w entry (last, so that a Reap interrupted half-way is
// redone by the next one).
func (s *Store) Reap(ctx context.Context, grace time.Duration) (store.ReapStats, error) {
	var st store.ReapStats
	c, err := s.get(ctx)
	if err != nil {
		return st, err
	}
	before := s.clock.Now().UnixMilli() - grace.Milliseconds()
	ids, err := c.Do(ctx, c.B().Zrange().Key(wire.KeyWorkers).Min("-inf").Max(strconv.FormatInt(before, 10)).
		Byscore().Limit(0, int64(s.reapBatch)).Build()).AsStrSlice()
	if err != nil {
		return st, s.wrap(ctx, "reap", err)
	}
	for _, sid := range ids {
		exp, err := c.Do(ctx, c.B().Hget().Key(wire.KeySession(sid)).Field(wire.FieldExpiresAt).Build()).AsInt64()
		if err == nil {
			// Alive: repair the lagging score.
			err = c.Do(ctx, c.B().Zadd().Key(wire.KeyWorkers).Xx().Gt().ScoreMember().ScoreMember(float64(exp), sid).Build()).Error()
			if err != nil {
				return st, s.wrap(ctx, "reap", err)
			}
			continue
		}
		if !rueidis.IsRedisNil(err) {
			return st, s.wrap(ctx, "reap", err)
		}
		n, err := s.reapSession(ctx, c, sid)
		st.Placements += n
		if err != nil {
			return st, err
		}
		st.Sessions++
	}
	return st, nil
}

// reapSession collects one dead session and returns how many placements it
// deleted.
func (s *Store) reapSession(ctx context.Context, c rueidis.Client, sid string) (int, error) {
	freed := 0
	owned := wire.KeyOwned(sid)
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Hscan().Key(owned).Cursor(cursor).Count(256).Build()).AsScanEntry()
		if err != nil {
			return freed, s.wrap(ctx, "reap", err)
		}
		for i := 0; i+1 < len(e.Elements); i += 2 {
			field := e.Elements[i]
			if ns, ok := strings.CutPrefix(field, wire.OwnedCountPrefix); ok {
				if err := c.Do(ctx, c.B().Srem().Key(wire.KeyNamespace(ns)).Member(sid).Build()).Error(); err != nil {
					return freed, s.wrap(ctx, "reap", err)
				}
				continue
			}
			n, err := scriptRelease.Exec(ctx, c, placementKeys(field), []string{sid, s.epochTTL}).AsInt64()
			if err != nil {
				return freed, s.wrap(ctx, "reap", err)
			}
			freed += int(n)
		}
		cursor = e.Cursor
		if cursor == 0 {
			break
		}
	}
	for _, r := range c.DoMulti(ctx,
		c.B().Del().Key(owned).Build(),
		c.B().Zrem().Key(wire.KeyWorkers).Member(sid).Build()) {
		if err := r.Error(); err != nil {
			return freed, s.wrap(ctx, "reap", err)
		}
	}
	return freed, nil
}

// ErrRestartFence is wrapped (with store.ErrUnavailable) by Claim and
// Replace while the Redis server is younger than Config.RestartFence.
var ErrRestartFence = errors.New("redis restarted less than a lease ago: placements wait until every lease granted before the restart has run out")

// fenced maps a PINNEDFENCE script error to store.ErrUnavailable wrapping
// ErrRestartFence, and every other error through wrap.
func (s *Store) fenced(ctx context.Context, op string, err error) error {
	if e, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(e.Error(), "PINNEDFENCE") {
		up := strings.TrimSpace(strings.TrimPrefix(e.Error(), "PINNEDFENCE"))
		return fmt.Errorf("%w: %s: %w (server up %ss, fence %ss)", store.ErrUnavailable, op, ErrRestartFence, up, s.fenceSeconds)
	}
	return s.wrap(ctx, op, err)
}
