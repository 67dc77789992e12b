package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// Bounds of one ListPlacements call.
const (
	// listScanCalls bounds the SCAN or HSCAN round trips of one page.
	listScanCalls = 8
	// listMinCount is the smallest COUNT hint a page's SCAN uses: with a
	// small limit over a large keyspace, each call still covers a useful
	// stretch of it.
	listMinCount = 128
)

// scriptListingSeen keeps a listing's set of returned placement names.
// KEYS[1] pinned:i:<iteration>; ARGV[1] TTL ms, ARGV[2] how many may be
// added, ARGV[3] "1" when the listing may start here (else a missing set
// is an expired or forged cursor), ARGV[4..] candidate names in order.
// It adds and returns the candidates not returned before, up to ARGV[2],
// and reports 1 when a new one was left over for lack of room. The member
// "" (never a placement name) marks the listing as started.
var scriptListingSeen = lua(`
if ARGV[3] ~= '1' and redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('PINNEDCURSOR') end
local room = tonumber(ARGV[2])
local out = {}
local over = 0
for i = 4, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 0 then
    if #out >= room then over = 1 break end
    redis.call('SADD', KEYS[1], ARGV[i])
    out[#out + 1] = ARGV[i]
  end
end
redis.call('SADD', KEYS[1], '')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {over, out}`)

// listCursor is where a listing stands: its iteration id (the key of its
// seen set), the source it is reading (a node address without a session
// filter, else a session id) and the SCAN cursor within that source.
type listCursor struct {
	iter string
	pos  string
	scan uint64
}

func (c listCursor) encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.iter + "\n" + c.pos + "\n" + strconv.FormatUint(c.scan, 10)))
}

func decodeListCursor(s string) (listCursor, bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return listCursor{}, false
	}
	parts := strings.Split(string(b), "\n")
	if len(parts) != 3 || len(parts[0]) != listIterLen {
		return listCursor{}, false
	}
	if _, err := base64.RawURLEncoding.DecodeString(parts[0]); err != nil {
		return listCursor{}, false
	}
	scan, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return listCursor{}, false
	}
	return listCursor{iter: parts[0], pos: parts[1], scan: scan}, true
}

// listIterLen is the length of an iteration id: 96 random bits, base64url.
const listIterLen = 16

// ListPlacements implements store.PlacementLister with SCAN, never KEYS.
//
// Without a session filter it SCANs every node (sorted by address) with
// MATCH pinned:p:{<ns>/*}; with one it HSCANs each session's placement index
// pinned:o:<sid> (sorted by session id) with MATCH <ns>/*, which reads only
// that worker's entries instead of the whole keyspace. Either way each
// candidate's placement key is read (one pipelined round trip) and kept
// only while it exists (and names that session).
//
// SCAN returns every key present for the whole iteration at least once,
// but may return one twice (when Redis shrinks the table between calls),
// and its COUNT is only a hint. So each listing keeps the names it has
// returned in a set, pinned:i:<iteration> (refreshed with every page,
// ListingTTL; deleted by the last page): a page returns only names not in
// it, which makes "exactly once" hold across pages. When a SCAN reply has
// more new names than the page has room for, the page ends without moving
// past that reply: the next page runs the same SCAN cursor again and the
// set skips what was returned, so nothing is lost and the limit holds.
func (s *Store) ListPlacements(ctx context.Context, q store.ListQuery) (store.ListPage, error) {
	if q.Limit < 1 {
		return store.ListPage{}, errors.New("redisstore: ListQuery.Limit must be at least 1")
	}
	c, err := s.get(ctx)
	if err != nil {
		return store.ListPage{}, err
	}
	first := q.Cursor == ""
	var cur listCursor
	if first {
		var b [listIterLen * 3 / 4]byte
		rand.Read(b[:])
		cur.iter = base64.RawURLEncoding.EncodeToString(b[:])
	} else {
		var ok bool
		if cur, ok = decodeListCursor(q.Cursor); !ok {
			return store.ListPage{}, store.ErrBadCursor
		}
	}
	seenKey := wire.KeyListing(cur.iter)

	// Sources in a stable order, and where the cursor stands among them.
	var sources []string
	nodes := map[string]rueidis.Client{}
	if q.Sessions == nil {
		nodes = c.Nodes()
		for addr := range nodes {
			sources = append(sources, addr)
		}
	} else {
		sources = slices.Clone(q.Sessions)
	}
	slices.Sort(sources)
	sources = slices.Compact(sources)
	at, scan := 0, uint64(0)
	if !first {
		at, _ = slices.BinarySearch(sources, cur.pos)
		if at < len(sources) && sources[at] == cur.pos {
			scan = cur.scan
		}
	}

	// Check (or start) the listing's seen set before reading anything.
	if _, _, err := s.markSeen(ctx, c, seenKey, first, 0, nil); err != nil {
		return store.ListPage{}, err
	}
	count := int64(max(q.Limit, listMinCount))
	var page store.ListPage
	for calls := 0; calls < listScanCalls && at < len(sources) && len(page.Placements) < q.Limit; calls++ {
		src := sources[at]
		var names []string
		var next uint64
		if q.Sessions == nil {
			node := nodes[src]
			// pinned:p:{<ns>/<id>}: the glob's braces are literal.
			e, err := node.Do(ctx, node.B().Scan().Cursor(scan).Match(wire.KeyPrefixPlacement+"{"+q.Namespace+"/*}").Count(count).Build()).AsScanEntry()
			if err != nil {
				return store.ListPage{}, s.wrap(ctx, "list placements", err)
			}
			for _, k := range e.Elements {
				if name, ok := wire.PlacementOfKey(k); ok {
					names = append(names, name)
				}
			}
			next = e.Cursor
		} else {
			e, err := c.Do(ctx, c.B().Hscan().Key(wire.KeyOwned(src)).Cursor(scan).Match(q.Namespace+"/*").Count(count).Build()).AsScanEntry()
			if err != nil {
				return store.ListPage{}, s.wrap(ctx, "list placements", err)
			}
			for i := 0; i < len(e.Elements); i += 2 { // field, value pairs
				names = append(names, e.Elements[i])
			}
			next = e.Cursor
		}
		holders, err := s.holders(ctx, c, names)
		if err != nil {
			return store.ListPage{}, err
		}
		var kept []string
		byName := map[string]string{}
		for i, name := range names {
			h := holders[i]
			if h == "" || (q.Sessions != nil && h != src) {
				continue
			}
			if _, dup := byName[name]; !dup {
				byName[name] = h
				kept = append(kept, name)
			}
		}
		added, over := []string(nil), false
		if len(kept) > 0 {
			if added, over, err = s.markSeen(ctx, c, seenKey, true, q.Limit-len(page.Placements), kept); err != nil {
				return store.ListPage{}, err
			}
		}
		for _, name := range added {
			page.Placements = append(page.Placements, store.ListedPlacement{
				ID: strings.TrimPrefix(name, q.Namespace+"/"), SessionID: byName[name]})
		}
		if over {
			break // the same SCAN cursor again on the next page
		}
		if scan = next; scan == 0 {
			at++
		}
	}
	if at >= len(sources) {
		// Complete: the seen set has done its work.
		if err := c.Do(ctx, c.B().Del().Key(seenKey).Build()).Error(); err != nil {
			return store.ListPage{}, s.wrap(ctx, "list placements", err)
		}
		return page, nil
	}
	cur.pos, cur.scan = sources[at], scan
	page.Cursor = cur.encode()
	return page, nil
}

// holders reads the placement keys of names in one pipelined round trip
// ("" for a missing one).
func (s *Store) holders(ctx context.Context, c rueidis.Client, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	cmds := make(rueidis.Commands, len(names))
	for i, name := range names {
		cmds[i] = c.B().Get().Key(wire.KeyPlacementName(name)).Build()
	}
	out := make([]string, len(names))
	for i, r := range c.DoMulti(ctx, cmds...) {
		v, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, s.wrap(ctx, "list placements", err)
		}
		if _, _, sid, ok := wire.ParsePlacement(v); ok {
			out[i] = sid
		}
	}
	return out, nil
}

// markSeen runs scriptListingSeen: it returns the names of candidates that
// the listing had not returned yet (at most room of them, now recorded) and
// whether a new one was left over.
func (s *Store) markSeen(ctx context.Context, c rueidis.Client, key string, mayStart bool, room int, candidates []string) ([]string, bool, error) {
	start := "0"
	if mayStart {
		start = "1"
	}
	args := append([]string{strconv.FormatInt(store.ListingTTL.Milliseconds(), 10), strconv.Itoa(room), start}, candidates...)
	v, err := scriptListingSeen.Exec(ctx, c, []string{key}, args).ToArray()
	if err != nil {
		if e, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(e.Error(), "PINNEDCURSOR") {
			return nil, false, store.ErrBadCursor
		}
		return nil, false, s.wrap(ctx, "list placements", err)
	}
	if len(v) != 2 {
		return nil, false, fmt.Errorf("redisstore: list placements: unexpected script reply of %d elements", len(v))
	}
	over, err := v[0].AsInt64()
	if err != nil {
		return nil, false, s.wrap(ctx, "list placements", err)
	}
	added, err := v[1].AsStrSlice()
	if err != nil {
		return nil, false, s.wrap(ctx, "list placements", err)
	}
	return added, over == 1, nil
}
