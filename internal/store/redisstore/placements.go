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

	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
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
	p, err := s.placementOf(ctx, res)
	return p, until, err
}

// LookupFresh implements store.FreshLookups: a GET of the placement key
// on the server, outside the client-side cache (no tracking is asked for;
// the key stays tracked as long as a cached read of it is).
func (s *Store) LookupFresh(ctx context.Context, ns, id string) (store.Placement, error) {
	c, err := s.get(ctx)
	if err != nil {
		return store.Placement{}, err
	}
	return s.placementOf(ctx, c.Do(ctx, c.B().Get().Key(wire.KeyPlacement(ns, id)).Build()))
}

// placementOf decodes the reply to a GET of a placement key (nil is none).
func (s *Store) placementOf(ctx context.Context, res rueidis.RedisResult) (store.Placement, error) {
	v, err := res.ToString()
	if rueidis.IsRedisNil(err) {
		return store.Placement{}, nil
	}
	if err != nil {
		return store.Placement{}, s.wrap(ctx, "placement", err)
	}
	return parsePlacement(v)
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

// ClaimPlacement implements store.Store. On a single node it is
// LookupOrClaim; on a cluster (and with the planted bug claim_no_nx) it
// claims without reading first (claimApart).
func (s *Store) ClaimPlacement(ctx context.Context, ns, id, sessionID string) (store.Placement, error) {
	if sessionID == "" {
		return store.Placement{}, errors.New("cannot claim: empty session id")
	}
	c, err := s.get(ctx)
	if err != nil {
		return store.Placement{}, err
	}
	name := wire.PlacementName(ns, id)
	if faults.Has(faults.ClaimNoNX) {
		p, _, err := s.claimApart(ctx, c, ns, name, sessionID)
		return p, err
	}
	if s.apart(c) {
		p, _, err := s.placeThenIndex(ctx, c, ns, name, sessionID)
		return p, err
	}
	p, _, err := s.place(ctx, c, ns, name, sessionID)
	return p, err
}

// apart reports whether a claim must index apart from the claim script:
// on a cluster, where the claiming session's index lives in another slot
// than the placement; and with the planted bug claim_no_nx (pinned_faults
// builds only), whose blind claim needs the read and the write apart, so
// that two pinboards can both read "none" and both write.
func (s *Store) apart(c rueidis.Client) bool {
	return c.Mode() == rueidis.ClientModeCluster || faults.Has(faults.ClaimNoNX) || s.indexApart
}

// LookupOrClaim implements store.Store. On a single node it is one script
// in one round trip (place); on a cluster (apart), a tracked read and,
// when there is no placement, claimApart.
func (s *Store) LookupOrClaim(ctx context.Context, ns, id, sessionID string) (store.Placement, bool, error) {
	if sessionID == "" {
		return store.Placement{}, false, errors.New("cannot claim: empty session id")
	}
	c, err := s.get(ctx)
	if err != nil {
		return store.Placement{}, false, err
	}
	name := wire.PlacementName(ns, id)
	if !s.apart(c) {
		return s.place(ctx, c, ns, name, sessionID)
	}
	if !faults.Has(faults.ClaimNoNX) {
		return s.placeThenIndex(ctx, c, ns, name, sessionID)
	}
	// The planted bug's blind claim: a read, then the claim apart.
	res := c.DoMulti(ctx, c.B().ClientCaching().Yes().Build(), c.B().Get().Key(wire.KeyPlacementName(name)).Build())
	if err := res[0].Error(); err != nil {
		return store.Placement{}, false, s.wrap(ctx, "placement", err)
	}
	v, err := res[1].ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return store.Placement{}, false, s.wrap(ctx, "placement", err)
	}
	if v != "" {
		p, err := parsePlacement(v)
		return p, false, err
	}
	return s.claimApart(ctx, c, ns, name, sessionID)
}

// placeThenIndex is LookupOrClaim on a cluster, where the claiming
// session's index lives in another slot than the placement: scriptPlace
// without the index and the tracked GET in one round trip on the
// placement's node (as place), then, only when the script wrote the
// placement, the index add: two round trips for a new id, one for a placed
// id. Claim first, index second is what makes the index race-free without
// a second add (see the package doc): a release of the same id by the same
// session removes its index entry before it reads the placement again, so
// either the release's read sees the new placement and indexes it, or the
// removal came first and this add comes after it.
func (s *Store) placeThenIndex(ctx context.Context, c rueidis.Client, ns, name, sessionID string) (store.Placement, bool, error) {
	return s.placeTracked(ctx, c, ns, name, sessionID, false)
}

// place runs scriptPlace on a single node and reads the placement back,
// tracked (trackedAfter): the placement of name, claimed for sessionID and
// indexed in the same script when there was none. One round trip (EVALSHA,
// CLIENT CACHING YES, GET). The answer is the GET's, the value Redis
// tracks from; claimed only when it is what the script wrote (another
// client may have changed it in between: then its value is the answer).
func (s *Store) place(ctx context.Context, c rueidis.Client, ns, name, sessionID string) (store.Placement, bool, error) {
	return s.placeTracked(ctx, c, ns, name, sessionID, true)
}

// placeTracked is place (indexed in the script) and placeThenIndex (the
// index added after a write, in a round trip of its own).
func (s *Store) placeTracked(ctx context.Context, c rueidis.Client, ns, name, sessionID string, indexInScript bool) (store.Placement, bool, error) {
	call := scriptPlace.with(placementKeys(name), sessionID, s.fenceSeconds, i64(s.clock.Now().UnixMilli()), s.epochTTL)
	if indexInScript {
		call = scriptPlace.with(append(placementKeys(name), wire.KeyOwned(sessionID)), sessionID, s.fenceSeconds,
			i64(s.clock.Now().UnixMilli()), s.epochTTL, name, wire.OwnedCountPrefix+ns)
	}
	res, get := trackedAfter(ctx, c, call, wire.KeyPlacementName(name))
	written, claimed, err := s.placeReply(ctx, res)
	if err != nil {
		return store.Placement{}, false, err
	}
	v, err := get.ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return store.Placement{}, false, s.wrap(ctx, "placement", err)
	}
	p, err := parsePlacement(v)
	if err != nil {
		return store.Placement{}, false, err
	}
	if claimed && !indexInScript {
		// The index of what this script wrote, even when another write
		// followed it (its writer indexes its own).
		if err := s.indexAdd(ctx, c, written.Session, ns, name); err != nil {
			return store.Placement{}, false, err
		}
	}
	return p, claimed && p == written, nil
}

// placeReply decodes scriptPlace's {claimed, placement}.
func (s *Store) placeReply(ctx context.Context, res rueidis.RedisResult) (store.Placement, bool, error) {
	arr, err := res.ToArray()
	if err != nil {
		return store.Placement{}, false, s.fenced(ctx, "claim", err)
	}
	if len(arr) != 2 {
		return store.Placement{}, false, fmt.Errorf("redisstore: claim: unexpected reply of %d elements", len(arr))
	}
	claimed, _ := arr[0].AsInt64()
	v, err := arr[1].ToString()
	if err != nil {
		return store.Placement{}, false, s.wrap(ctx, "claim", err)
	}
	p, err := parsePlacement(v)
	return p, claimed == 1, err
}

// claimApart is the claim of the planted bug claim_no_nx (pinned_faults
// builds only), in the order clusters used before placeThenIndex: the
// index add and the (blind) claim script in one pipeline, then, after a
// win, the index add again (see the package doc's race); after a loss, the
// index entry is removed unless the placement turned out to be ours.
func (s *Store) claimApart(ctx context.Context, c rueidis.Client, ns, name, sessionID string) (store.Placement, bool, error) {
	claim := scriptPlace
	if faults.Has(faults.ClaimNoNX) {
		claim = scriptPlaceBlind // planted bug (pinned_faults builds only)
	}
	res := pipeline(ctx, c,
		scriptIndexAdd.with([]string{wire.KeyOwned(sessionID)}, name, wire.OwnedCountPrefix+ns),
		claim.with(placementKeys(name), sessionID, s.fenceSeconds, i64(s.clock.Now().UnixMilli()), s.epochTTL))
	if err := res[0].Error(); err != nil {
		return store.Placement{}, false, s.wrap(ctx, "index", err)
	}
	p, claimed, err := s.placeReply(ctx, res[1])
	if err != nil {
		return store.Placement{}, false, errors.Join(err, s.unindex(ctx, c, sessionID, ns, name))
	}
	if p.Session == sessionID {
		return p, claimed, s.indexAdd(ctx, c, sessionID, ns, name)
	}
	return p, claimed, s.unindex(ctx, c, sessionID, ns, name)
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

// RenewPlacement implements store.Store.
func (s *Store) RenewPlacement(ctx context.Context, ns, id, sessionID string, epoch uint64) (store.Placement, error) {
	if sessionID == "" {
		return store.Placement{}, errors.New("cannot renew: empty session id")
	}
	c, err := s.get(ctx)
	if err != nil {
		return store.Placement{}, err
	}
	v, err := scriptRenew.Exec(ctx, c, placementKeys(wire.PlacementName(ns, id)),
		[]string{sessionID, strconv.FormatUint(epoch, 10), i64(s.clock.Now().UnixMilli()), s.epochTTL}).ToString()
	if err != nil {
		return store.Placement{}, s.wrap(ctx, "renew", err)
	}
	return parsePlacement(v)
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, ns, id, sessionID string, epoch uint64) (bool, error) {
	if sessionID == "" {
		return false, nil
	}
	c, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	if faults.Has(faults.ReleaseAnyEpoch) {
		epoch = 0 // planted bug (pinned_faults builds only)
	}
	n, err := scriptRelease.Exec(ctx, c, placementKeys(wire.PlacementName(ns, id)),
		[]string{sessionID, s.epochTTL, strconv.FormatUint(epoch, 10)}).AsInt64()
	if err != nil {
		return false, s.wrap(ctx, "release", err)
	}
	if n == 0 {
		return false, nil
	}
	return true, s.unindex(ctx, c, sessionID, ns, wire.PlacementName(ns, id))
}

// PlacementCounts implements store.Store: one HMGET of the namespaces'
// count fields of the session's index (never the whole index, which holds
// a field per placement).
func (s *Store) PlacementCounts(ctx context.Context, sessionID string, namespaces []string) (map[string]int, error) {
	out := make(map[string]int, len(namespaces))
	if len(namespaces) == 0 {
		return out, nil
	}
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	fields := make([]string, len(namespaces))
	for i, ns := range namespaces {
		fields[i] = wire.OwnedCountPrefix + ns
	}
	vals, err := c.Do(ctx, c.B().Hmget().Key(wire.KeyOwned(sessionID)).Field(fields...).Build()).ToArray()
	if err != nil {
		return nil, s.wrap(ctx, "placement counts", err)
	}
	for i, ns := range namespaces {
		if i < len(vals) {
			if str, err := vals[i].ToString(); err == nil { // nil: no such field
				out[ns], _ = strconv.Atoi(str)
			}
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
			n, err := scriptRelease.Exec(ctx, c, placementKeys(field), []string{sid, s.epochTTL, "0"}).AsInt64()
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
