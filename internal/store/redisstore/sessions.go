package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/base/faults"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

const keyPrefixSession = wire.KeyPrefixSession

func b01(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func i64(v int64) string { return strconv.FormatInt(v, 10) }

// Register implements store.Store.
func (s *Store) Register(ctx context.Context, in store.Session, lease time.Duration) ([]string, error) {
	if lease < time.Millisecond {
		return nil, fmt.Errorf("cannot register: lease %v must be at least 1ms", lease)
	}
	if in.ID == "" {
		return nil, fmt.Errorf("cannot register: empty session id")
	}
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	now := s.clock.Now().UnixMilli()
	exp := now + lease.Milliseconds()
	args := []string{ms(lease),
		wire.FieldClientID, in.ClientID,
		wire.FieldSecret, in.Secret,
		wire.FieldAdvertiseURL, in.AdvertiseURL,
		wire.FieldNamespaces, strings.Join(in.Namespaces, ","),
		wire.FieldHeadroom, strconv.Itoa(in.Headroom),
		wire.FieldDraining, b01(in.Draining),
		wire.FieldDrainDeadline, i64(in.DrainDeadline),
		wire.FieldVerified, b01(in.Verified),
		wire.FieldSuperseded, "0",
		wire.FieldRegisteredAt, i64(now),
		wire.FieldLastHeartbeat, i64(now),
		wire.FieldExpiresAt, i64(exp),
		wire.FieldTokenID, in.TokenID,
		wire.FieldMaxBodyBytes, i64(in.MaxBodyBytes),
	}
	// 1. The session hash, alone: a crash after this leaves a record nobody
	// can find, which expires with its lease.
	created, err := scriptRegister.Exec(ctx, c, []string{wire.KeySession(in.ID)}, args).AsInt64()
	if err != nil {
		return nil, s.wrap(ctx, "register", err)
	}
	if created == 0 {
		return nil, fmt.Errorf("cannot register: session id %q already exists", in.ID)
	}
	// 2. Make it findable: the janitor's list, the index with its namespace
	// count fields, the namespace sets.
	cmds := make(rueidis.Commands, 0, 2+len(in.Namespaces))
	cmds = append(cmds, c.B().Zadd().Key(wire.KeyWorkers).Nx().ScoreMember().ScoreMember(float64(exp), in.ID).Build())
	if len(in.Namespaces) > 0 {
		h := c.B().Hset().Key(wire.KeyOwned(in.ID)).FieldValue()
		for _, ns := range in.Namespaces {
			h = h.FieldValue(wire.OwnedCountPrefix+ns, "0")
		}
		cmds = append(cmds, h.Build())
	}
	for _, ns := range in.Namespaces {
		cmds = append(cmds, c.B().Sadd().Key(wire.KeyNamespace(ns)).Member(in.ID).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return nil, s.wrap(ctx, "register", err)
		}
	}
	// 3. Take over the client and the URL, learning who held them.
	res := c.DoMulti(ctx,
		c.B().Set().Key(wire.KeyClient(in.ClientID)).Value(in.ID).Get().PxMilliseconds(lease.Milliseconds()).Build(),
		c.B().Set().Key(wire.KeyAdvertise(in.AdvertiseURL)).Value(in.ID).Get().PxMilliseconds(lease.Milliseconds()).Build())
	var olds []string
	for _, r := range res {
		old, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			return nil, s.wrap(ctx, "register", err)
		}
		if old != in.ID && !slices.Contains(olds, old) {
			olds = append(olds, old)
		}
	}
	// 4. Mark the previous holders superseded (never re-creating them).
	var superseded []string
	for _, old := range olds {
		n, err := scriptSupersede.Exec(ctx, c, []string{wire.KeySession(old)}, nil).AsInt64()
		if err != nil {
			return superseded, s.wrap(ctx, "supersede", err)
		}
		if n == 1 {
			superseded = append(superseded, old)
		}
	}
	return superseded, nil
}

// Heartbeat implements store.Store.
func (s *Store) Heartbeat(ctx context.Context, id string, u store.Update, lease time.Duration) (store.Session, []wire.Message, error) {
	if lease < time.Millisecond {
		return store.Session{}, nil, fmt.Errorf("cannot heartbeat: lease %v must be at least 1ms", lease)
	}
	c, err := s.get(ctx)
	if err != nil {
		return store.Session{}, nil, err
	}
	now := s.clock.Now().UnixMilli()
	exp := now + lease.Milliseconds()
	hb := scriptHeartbeat
	if faults.Has(faults.BlindRenew) {
		hb = scriptHeartbeatBlind // planted bug (pinned_faults builds only)
	}
	arr, err := hb.Exec(ctx, c, []string{wire.KeySession(id)}, []string{
		ms(lease), i64(now), i64(exp), strconv.Itoa(u.Headroom), b01(u.Draining), i64(u.DrainDeadline), b01(u.Verified),
	}).ToArray()
	if err != nil {
		return store.Session{}, nil, s.wrap(ctx, "heartbeat", err)
	}
	if len(arr) == 0 {
		return store.Session{}, nil, fmt.Errorf("redisstore: heartbeat: empty script reply")
	}
	switch status, _ := arr[0].AsInt64(); status {
	case statusUnknown:
		return store.Session{}, nil, store.ErrUnknownSession
	case statusSuperseded:
		return store.Session{}, nil, store.ErrSuperseded
	}
	fields := make(map[string]string, (len(arr)-1)/2)
	for i := 1; i+1 < len(arr); i += 2 {
		k, _ := arr[i].ToString()
		v, _ := arr[i+1].ToString()
		fields[k] = v
	}
	sess, err := decodeSession(id, fields)
	if err != nil {
		return store.Session{}, nil, err
	}
	// One round trip: extend the client and URL pointers while they still
	// name this session, the janitor's score, and take the queue. A failed
	// refresh is repaired by the next heartbeat (the pointers live a whole
	// lease); only a failed take fails the heartbeat.
	cmds := rueidis.Commands{
		c.B().Evalsha().Sha1(scriptRefreshPointer.sha).Numkeys(1).Key(wire.KeyClient(sess.ClientID)).Arg(id, ms(lease)).Build(),
		c.B().Evalsha().Sha1(scriptRefreshPointer.sha).Numkeys(1).Key(wire.KeyAdvertise(sess.AdvertiseURL)).Arg(id, ms(lease)).Build(),
		c.B().Zadd().Key(wire.KeyWorkers).Xx().Gt().ScoreMember().ScoreMember(float64(exp), id).Build(),
		c.B().Evalsha().Sha1(scriptTakeAll.sha).Numkeys(1).Key(wire.KeyQueue(sess.ClientID)).Build(),
	}
	if sess.TokenID != "" {
		// Keep the session's slot under its token (XX: never re-add one
		// that Deregister or expiry removed).
		cmds = append(cmds,
			c.B().Zadd().Key(wire.KeyToken(sess.TokenID)).Xx().Gt().ScoreMember().ScoreMember(float64(exp), id).Build(),
			c.B().Pexpire().Key(wire.KeyToken(sess.TokenID)).Milliseconds(lease.Milliseconds()).Build())
	}
	res := c.DoMulti(ctx, cmds...)
	for i, r := range res[:2] {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
			key := []string{wire.KeyClient(sess.ClientID), wire.KeyAdvertise(sess.AdvertiseURL)}[i]
			scriptRefreshPointer.Exec(ctx, c, []string{key}, []string{id, ms(lease)})
		}
	}
	take := res[3]
	if e, ok := rueidis.IsRedisErr(take.Error()); ok && e.IsNoScript() {
		take = scriptTakeAll.Exec(ctx, c, []string{wire.KeyQueue(sess.ClientID)}, nil)
	}
	raw, err := take.AsStrSlice()
	if err != nil {
		return store.Session{}, nil, s.wrap(ctx, "heartbeat", err)
	}
	var msgs []wire.Message
	for _, r := range raw {
		var m wire.Message
		if json.Unmarshal([]byte(r), &m) == nil {
			msgs = append(msgs, m)
		}
	}
	return sess, msgs, nil
}

// decodeSession builds a Session from its hash fields.
func decodeSession(id string, f map[string]string) (store.Session, error) {
	var err error
	num := func(name string) int64 {
		v, e := strconv.ParseInt(f[name], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("redisstore: session %s: field %q: %w", id, name, e)
		}
		return v
	}
	s := store.Session{
		ID:            id,
		ClientID:      f[wire.FieldClientID],
		Secret:        f[wire.FieldSecret],
		AdvertiseURL:  f[wire.FieldAdvertiseURL],
		Headroom:      int(num(wire.FieldHeadroom)),
		Draining:      f[wire.FieldDraining] == "1",
		DrainDeadline: num(wire.FieldDrainDeadline),
		Verified:      f[wire.FieldVerified] == "1",
		Superseded:    f[wire.FieldSuperseded] == "1",
		RegisteredAt:  num(wire.FieldRegisteredAt),
		LastHeartbeat: num(wire.FieldLastHeartbeat),
		ExpiresAt:     num(wire.FieldExpiresAt),
		TokenID:       f[wire.FieldTokenID],
	}
	if v := f[wire.FieldMaxBodyBytes]; v != "" { // absent from a record written before protocol 2
		s.MaxBodyBytes = num(wire.FieldMaxBodyBytes)
	}
	if ns := f[wire.FieldNamespaces]; ns != "" {
		s.Namespaces = strings.Split(ns, ",")
	}
	return s, err
}

// Session implements store.Store. It reads through the client-side cache.
func (s *Store) Session(ctx context.Context, id string) (store.Session, error) {
	c, err := s.get(ctx)
	if err != nil {
		return store.Session{}, err
	}
	f, err := c.DoCache(ctx, c.B().Hgetall().Key(wire.KeySession(id)).Cache(), s.cacheTTL).AsStrMap()
	if err != nil {
		return store.Session{}, s.wrap(ctx, "session", err)
	}
	if len(f) == 0 {
		return store.Session{}, store.ErrUnknownSession
	}
	return decodeSession(id, f)
}

// sessions reads the given session ids through the cache, skipping the ones
// that no longer exist, sorted by id.
func (s *Store) sessions(ctx context.Context, c rueidis.Client, ids []string) ([]store.Session, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	slices.Sort(ids)
	cmds := make([]rueidis.CacheableTTL, len(ids))
	for i, id := range ids {
		cmds[i] = rueidis.CT(c.B().Hgetall().Key(wire.KeySession(id)).Cache(), s.cacheTTL)
	}
	out := make([]store.Session, 0, len(ids))
	for i, r := range c.DoMultiCache(ctx, cmds...) {
		f, err := r.AsStrMap()
		if err != nil {
			return nil, s.wrap(ctx, "sessions", err)
		}
		if len(f) == 0 {
			continue
		}
		sess, err := decodeSession(ids[i], f)
		if err != nil {
			return nil, err
		}
		out = append(out, sess)
	}
	return out, nil
}

// Sessions implements store.Store. The result is sorted by session id.
func (s *Store) Sessions(ctx context.Context) ([]store.Session, error) {
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	ids, err := c.Do(ctx, c.B().Zrange().Key(wire.KeyWorkers).Start("0").Stop("-1").Build()).AsStrSlice()
	if err != nil {
		return nil, s.wrap(ctx, "sessions", err)
	}
	return s.sessions(ctx, c, ids)
}

// NamespaceSessions implements store.Store. The result is sorted by
// session id. Both the membership and the sessions are read through the
// client-side cache.
func (s *Store) NamespaceSessions(ctx context.Context, ns string) ([]store.Session, error) {
	c, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	ids, err := c.DoCache(ctx, c.B().Smembers().Key(wire.KeyNamespace(ns)).Cache(), s.cacheTTL).AsStrSlice()
	if err != nil {
		return nil, s.wrap(ctx, "namespace sessions", err)
	}
	all, err := s.sessions(ctx, c, slices.Clone(ids))
	if err != nil {
		return nil, err
	}
	// A set member whose hash names other namespaces cannot happen (ids
	// are never reused), but filtering keeps the contract independent of it.
	return slices.DeleteFunc(all, func(x store.Session) bool { return !x.Serves(ns) }), nil
}

// NamespaceKnown implements store.Store: the namespace's set of session ids
// (members stay until the session is reaped) is not empty. It is the read
// NamespaceSessions made just before, served by the client-side cache.
func (s *Store) NamespaceKnown(ctx context.Context, ns string) (bool, error) {
	c, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	ids, err := c.DoCache(ctx, c.B().Smembers().Key(wire.KeyNamespace(ns)).Cache(), s.cacheTTL).AsStrSlice()
	if err != nil {
		return false, s.wrap(ctx, "namespace", err)
	}
	return len(ids) > 0, nil
}

// CurrentSession implements store.Store.
func (s *Store) CurrentSession(ctx context.Context, clientID string) (string, error) {
	c, err := s.get(ctx)
	if err != nil {
		return "", err
	}
	id, err := c.Do(ctx, c.B().Get().Key(wire.KeyClient(clientID)).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	if err != nil {
		return "", s.wrap(ctx, "current session", err)
	}
	// The pointer is refreshed after the session on each heartbeat, so it
	// may outlive the session by a moment: check.
	n, err := c.Do(ctx, c.B().Exists().Key(wire.KeySession(id)).Build()).AsInt64()
	if err != nil {
		return "", s.wrap(ctx, "current session", err)
	}
	if n == 0 {
		return "", nil
	}
	return id, nil
}

// Deregister implements store.Store: the session hash is deleted by a
// script that returns its client, URL and token; then the pointers are
// compare-and-deleted, the token slot dropped, and the janitor's score set
// to now, so Reap collects the placements after its grace. Once the hash is
// gone the session is dead to every read; a failure of the follow-up steps
// is logged, not returned (the pointers expire with the lease, readers
// check the hash, and Reap finds the session by its old score).
func (s *Store) Deregister(ctx context.Context, id string) (bool, error) {
	c, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	arr, err := scriptDeregister.Exec(ctx, c, []string{wire.KeySession(id)}, nil).ToArray()
	if err != nil {
		return false, s.wrap(ctx, "deregister", err)
	}
	if len(arr) != 3 {
		return false, nil
	}
	cid, _ := arr[0].ToString()
	url, _ := arr[1].ToString()
	tok, _ := arr[2].ToString()
	var errs []error
	var calls []call
	if cid != "" {
		calls = append(calls, scriptDeletePointer.with([]string{wire.KeyClient(cid)}, id))
	}
	if url != "" {
		calls = append(calls, scriptDeletePointer.with([]string{wire.KeyAdvertise(url)}, id))
	}
	for _, r := range pipeline(ctx, c, calls...) {
		errs = append(errs, r.Error())
	}
	cmds := rueidis.Commands{c.B().Zadd().Key(wire.KeyWorkers).Xx().ScoreMember().ScoreMember(float64(s.clock.Now().UnixMilli()), id).Build()}
	if tok != "" {
		cmds = append(cmds, c.B().Zrem().Key(wire.KeyToken(tok)).Member(id).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		errs = append(errs, r.Error())
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("deregister: cleanup after deleting the session failed; it completes by expiry", "session", id, "err", err)
	}
	return true, nil
}

// UseNonce implements store.Store: SET pinned:x:<nonceId> binding NX PX ttl.
func (s *Store) UseNonce(ctx context.Context, nonceID, binding string, ttl time.Duration) (bool, error) {
	if ttl < time.Millisecond {
		return false, fmt.Errorf("cannot record a nonce: ttl %v must be at least 1ms", ttl)
	}
	c, err := s.get(ctx)
	if err != nil {
		return false, err
	}
	err = c.Do(ctx, c.B().Set().Key(wire.KeyNonce(nonceID)).Value(binding).Nx().PxMilliseconds(ttl.Milliseconds()).Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	if err != nil {
		return false, s.wrap(ctx, "use nonce", err)
	}
	return true, nil
}

// ReserveSlot implements store.Store with one script on pinned:t:<tokenId>.
func (s *Store) ReserveSlot(ctx context.Context, tokenID, sessionID string, max int, lease time.Duration) (int, bool, error) {
	if lease < time.Millisecond || sessionID == "" {
		return 0, false, fmt.Errorf("cannot reserve a session slot: need a session id and a lease of at least 1ms")
	}
	c, err := s.get(ctx)
	if err != nil {
		return 0, false, err
	}
	now := s.clock.Now().UnixMilli()
	arr, err := scriptReserveSlot.Exec(ctx, c, []string{wire.KeyToken(tokenID)},
		[]string{i64(now), i64(now + lease.Milliseconds()), sessionID, strconv.Itoa(max), ms(lease)}).ToArray()
	if err != nil {
		return 0, false, s.wrap(ctx, "reserve slot", err)
	}
	if len(arr) != 2 {
		return 0, false, fmt.Errorf("redisstore: reserve slot: unexpected reply of %d elements", len(arr))
	}
	held, _ := arr[0].AsInt64()
	ok, _ := arr[1].AsInt64()
	return int(held), ok == 1, nil
}

// Push implements store.Store.
func (s *Store) Push(ctx context.Context, clientID string, m wire.Message) error {
	c, err := s.get(ctx)
	if err != nil {
		return err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("cannot push: %w", err)
	}
	err = scriptPush.Exec(ctx, c, []string{wire.KeyQueue(clientID)}, []string{string(b), strconv.Itoa(s.maxQueue), ms(s.queueTTL)}).Error()
	return s.wrap(ctx, "push", err)
}
