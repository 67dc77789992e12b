// Package storetest is the conformance suite for store.Store: one set of
// tests that memstore and redisstore both run (each from its own test file),
// so the two implementations cannot drift apart. It asserts the semantics in
// the store package doc, the Reaper contract, and invalidation delivery.
//
// The suite only uses the Harness to let time pass and to provoke
// invalidations; it never sleeps to synchronise. Against Redis, time has to
// pass on Redis's own clock, so Harness.Elapse waits for real there, and the
// suite uses short leases.
//
// Two leases keep that from flaking on a busy machine: a session a test
// lets run out registers with Harness.Lease (expiring), every other one
// with lasting (25 leases: 10 s on Redis), and heartbeats renew for lasting.
// So no check that a session is still alive comes after an Elapse within
// the short lease: such checks follow its registration at once (a few store
// calls, against a whole lease), or a renewal for lasting. Checks that a
// session has ended follow an Elapse past its lease, which real waiting can
// only lengthen.
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

// Harness is one fresh, empty store under test and the means to drive it.
type Harness struct {
	// Store is the store under test; it must also implement store.Reaper.
	// The suite closes it.
	Store store.Store
	// Lease is the lease the suite registers with: long on a fake clock,
	// a few hundred milliseconds on a real one.
	Lease time.Duration
	// Elapse lets d pass on the store's clock and then lets the store
	// notice expiries (a fake clock's Advance plus memstore.Expire, or real
	// waiting for Redis).
	Elapse func(d time.Duration)
	// Flush drops all data (FLUSHALL, memstore.Flush).
	Flush func()
	// KillConnections closes the store's connections from the server side
	// (CLIENT KILL); nil for a store without connections.
	KillConnections func()
}

// NewHarness builds a Harness whose store reports its invalidations to
// opts.OnInvalidate.
type NewHarness func(t *testing.T, opts store.Options) Harness

// Invalidations records what a store reports to OnInvalidate.
type Invalidations struct {
	mu      sync.Mutex
	got     []store.Invalidation
	changed chan struct{}
}

func newInvalidations() *Invalidations {
	return &Invalidations{changed: make(chan struct{})}
}

// Record is an OnInvalidate callback.
func (r *Invalidations) Record(inv store.Invalidation) {
	r.mu.Lock()
	r.got = append(r.got, inv)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// Reset forgets everything recorded so far.
func (r *Invalidations) Reset() {
	r.mu.Lock()
	r.got = nil
	r.mu.Unlock()
}

// Wait waits up to 5 s until want has been recorded since the last Reset.
func (r *Invalidations) Wait(t testing.TB, want store.Invalidation) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := slices.Contains(r.got, want)
		got := slices.Clone(r.got)
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("invalidation %+v not delivered within 5s; got %+v", want, got)
		}
	}
}

// next returns a channel closed at the next Record.
func (r *Invalidations) next() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// settled fails unless the placement of (ns, id) reads want after the
// test's own write. A store with a client-side cache may answer from an
// entry whose invalidation is still in flight (redisstore: Redis sends it
// after the write's reply, and to the connection that read the key, which
// need not be the one that wrote it); the read is repeated after each
// invalidation the store reports, for up to 5 s.
func settled(t *testing.T, h Harness, inv *Invalidations, ns, id, want, after string) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		ch := inv.next() // before the read: a Record after it wakes us
		p, err := h.Store.Placement(bg, ns, id)
		if err == nil && p == want {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("Placement(%s, %s) %s = %q, %v; want %q", ns, id, after, p, err, want)
		}
	}
}

// Run runs the conformance suite; newHarness is called once per subtest.
func Run(t *testing.T, newHarness NewHarness) {
	tests := []struct {
		name string
		f    func(t *testing.T, h Harness, inv *Invalidations)
	}{
		{"RegisterAndRead", testRegisterAndRead},
		{"RegisterRefusesDuplicateID", testRegisterDuplicate},
		{"HeartbeatUpdatesAndExtends", testHeartbeat},
		{"HeartbeatUnknown", testHeartbeatUnknown},
		{"ExpiryRemovesAndHeartbeatNeverRecreates", testExpiry},
		{"SupersedeByClientID", func(t *testing.T, h Harness, inv *Invalidations) { testSupersede(t, h, true) }},
		{"SupersedeByAdvertiseURL", func(t *testing.T, h Harness, inv *Invalidations) { testSupersede(t, h, false) }},
		{"SupersedeOnlyLiveSessions", testSupersedeOnlyLive},
		{"SupersededKeepsPlacementsUntilLease", testSupersededKeepsPlacements},
		{"PushDeliveredOnceInOrder", testPush},
		{"PushQueueIsBounded", testPushBounded},
		{"PushExactlyOnceUnderConcurrentHeartbeats", testPushConcurrent},
		{"ClaimFirstWins", testClaim},
		{"ClaimConcurrentOneWinner", testClaimConcurrent},
		{"LookupOrClaimReadsOrClaims", testLookupOrClaim},
		{"LookupOrClaimConcurrentOneClaims", testLookupOrClaimConcurrent},
		{"ReplaceComparesAndSets", testReplace},
		{"ReleaseComparesAndDeletes", testRelease},
		{"ReleaseComparesTheEpoch", testReleaseEpoch},
		{"RenewComparesSessionAndEpoch", testRenew},
		{"EpochsStrictlyIncrease", testEpochs},
		{"EpochsConcurrentClaimsAgree", testEpochsConcurrent},
		{"EpochsIncreaseAcrossReap", testEpochsReap},
		{"EpochsIncreaseAcrossFlush", testEpochsFlush},
		{"PlacementCounts", testPlacementCounts},
		{"ListPlacementsPagesEveryIDOnce", testListPages},
		{"ListPlacementsBySession", testListBySession},
		{"ListPlacementsExactlyOnceUnderChurn", testListChurn},
		{"ListPlacementsRefusesBadCursor", testListBadCursor},
		{"ReapCollectsDeadSessions", testReap},
		{"NamespaceKnownUntilReaped", testNamespaceKnown},
		{"InvalidatePlacement", testInvalidatePlacement},
		{"InvalidateSession", testInvalidateSession},
		{"InvalidateOnExpiry", testInvalidateExpiry},
		{"InvalidateAllOnFlush", testInvalidateFlush},
		{"InvalidateAllOnConnectionLoss", testInvalidateKill},
		{"DeregisterEndsSessionAtOnce", testDeregister},
		{"DeregisterNeverTouchesAnotherSession", testDeregisterOthers},
		{"InvalidateOnDeregister", testInvalidateDeregister},
		{"NonceSingleUse", testNonce},
		{"NonceConcurrentOneWinner", testNonceConcurrent},
		{"ReserveSlotCapsLiveSessionsPerToken", testReserveSlot},
		{"ReserveSlotConcurrentNeverExceedsCap", testReserveSlotConcurrent},
		{"CancelledContext", testCancelled},
		{"ClosedStore", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := newInvalidations()
			h := newHarness(t, store.Options{OnInvalidate: inv.Record})
			t.Cleanup(h.Store.Close)
			tc.f(t, h, inv)
		})
	}
}

var bg = context.Background()

func sess(id, client, url string, ns ...string) store.Session {
	return store.Session{ID: id, ClientID: client, Secret: "secret-" + id, AdvertiseURL: url, Namespaces: ns, Headroom: 5, Verified: true}
}

// lasting is the lease of a session a test needs alive throughout, and of
// every heartbeat: long enough that no stall of a busy machine ends it
// mid-test.
func lasting(h Harness) time.Duration { return 25 * h.Lease }

// register registers s for lasting.
func register(t *testing.T, h Harness, s store.Session) []string {
	t.Helper()
	return registerFor(t, h, s, lasting(h))
}

// expiring registers s for Harness.Lease: a session the test lets run out.
func expiring(t *testing.T, h Harness, s store.Session) []string {
	t.Helper()
	return registerFor(t, h, s, h.Lease)
}

func registerFor(t *testing.T, h Harness, s store.Session, lease time.Duration) []string {
	t.Helper()
	sup, err := h.Store.Register(bg, s, lease)
	if err != nil {
		t.Fatalf("Register(%s) = %v", s.ID, err)
	}
	return sup
}

func mustSession(t *testing.T, h Harness, id string) store.Session {
	t.Helper()
	s, err := h.Store.Session(bg, id)
	if err != nil {
		t.Fatalf("Session(%s) = %v; want a live session", id, err)
	}
	return s
}

func ids(ss []store.Session) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.ID)
	}
	return out
}

func testRegisterAndRead(t *testing.T, h Harness, _ *Invalidations) {
	in := sess("s1", "c1", "http://10.0.0.1:8080", "/a", "/b")
	in.Headroom, in.Draining, in.MaxBodyBytes = 7, true, 5<<20
	if sup := register(t, h, in); len(sup) != 0 {
		t.Fatalf("first Register superseded %v; want none", sup)
	}
	register(t, h, sess("s2", "c2", "http://10.0.0.2:8080", "/b"))
	got := mustSession(t, h, "s1")
	if got.ClientID != "c1" || got.Secret != "secret-s1" || got.AdvertiseURL != "http://10.0.0.1:8080" ||
		!slices.Equal(got.Namespaces, []string{"/a", "/b"}) || got.Headroom != 7 || !got.Draining || !got.Verified || got.Superseded ||
		got.MaxBodyBytes != 5<<20 {
		t.Fatalf("Session(s1) = %+v; want the registered fields", got)
	}
	if got := mustSession(t, h, "s2"); got.MaxBodyBytes != 0 {
		t.Fatalf("Session(s2).MaxBodyBytes = %d; want 0 for a session registered without one", got.MaxBodyBytes)
	}
	if got.RegisteredAt == 0 || got.LastHeartbeat != got.RegisteredAt || got.ExpiresAt != got.RegisteredAt+lasting(h).Milliseconds() {
		t.Fatalf("Session(s1) times = reg %d hb %d exp %d; want hb = reg and exp = reg + lease", got.RegisteredAt, got.LastHeartbeat, got.ExpiresAt)
	}
	all, err := h.Store.Sessions(bg)
	if err != nil || !slices.Equal(ids(all), []string{"s1", "s2"}) {
		t.Fatalf("Sessions() = %v, %v; want [s1 s2]", ids(all), err)
	}
	f := func(ns string, want ...string) {
		t.Helper()
		got, err := h.Store.NamespaceSessions(bg, ns)
		if err != nil || !slices.Equal(ids(got), want) {
			t.Errorf("NamespaceSessions(%q) = %v, %v; want %v", ns, ids(got), err, want)
		}
	}
	f("/a", "s1")
	f("/b", "s1", "s2")
	f("/none")
	if cur, err := h.Store.CurrentSession(bg, "c1"); cur != "s1" || err != nil {
		t.Fatalf("CurrentSession(c1) = %q, %v; want s1", cur, err)
	}
	if cur, err := h.Store.CurrentSession(bg, "nobody"); cur != "" || err != nil {
		t.Fatalf("CurrentSession(nobody) = %q, %v; want empty", cur, err)
	}
	if _, err := h.Store.Session(bg, "nope"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Session(nope) = %v; want ErrUnknownSession", err)
	}
}

func testRegisterDuplicate(t *testing.T, h Harness, _ *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1"))
	if _, err := h.Store.Register(bg, sess("s1", "c2", "http://h2"), h.Lease); err == nil {
		t.Fatal("Register with an existing session id succeeded; want an error")
	}
	if got := mustSession(t, h, "s1"); got.ClientID != "c1" {
		t.Fatalf("the refused duplicate changed the session: %+v", got)
	}
}

func testHeartbeat(t *testing.T, h Harness, _ *Invalidations) {
	in := sess("s1", "c1", "http://h1", "/a")
	in.Verified, in.MaxBodyBytes = false, 1<<20
	expiring(t, h, in)
	h.Elapse(h.Lease / 10) // the heartbeat's time differs from the registration's
	got, msgs, err := h.Store.Heartbeat(bg, "s1", store.Update{Headroom: 3, Draining: true, DrainDeadline: 12345}, lasting(h))
	if err != nil || len(msgs) != 0 {
		t.Fatalf("Heartbeat = %v, %v; want ok and no messages", msgs, err)
	}
	if got.Headroom != 3 || !got.Draining || got.DrainDeadline != 12345 || got.Verified || got.MaxBodyBytes != 1<<20 {
		t.Fatalf("Heartbeat returned %+v; want headroom 3, draining, deadline 12345, unverified, the registered body limit", got)
	}
	if got.ExpiresAt != got.LastHeartbeat+lasting(h).Milliseconds() || got.LastHeartbeat <= got.RegisteredAt {
		t.Fatalf("Heartbeat times = reg %d hb %d exp %d; want hb > reg and exp = hb + the heartbeat's lease", got.RegisteredAt, got.LastHeartbeat, got.ExpiresAt)
	}
	// Verified is sticky: set by a verified heartbeat, kept by a pairless one.
	if got, _, _ := h.Store.Heartbeat(bg, "s1", store.Update{Verified: true}, lasting(h)); !got.Verified {
		t.Fatal("a verified heartbeat did not mark the session verified")
	}
	if got, _, _ := h.Store.Heartbeat(bg, "s1", store.Update{}, lasting(h)); !got.Verified || got.Draining {
		t.Fatalf("a pairless heartbeat: %+v; want still verified, no longer draining", got)
	}
	// Past the lease it registered with, alive thanks to the heartbeats.
	h.Elapse(h.Lease + h.Lease/5)
	if s := mustSession(t, h, "s1"); !s.Verified || s.Headroom != 0 {
		t.Fatalf("Session after heartbeats = %+v; want verified, headroom 0", s)
	}
}

func testHeartbeatUnknown(t *testing.T, h Harness, _ *Invalidations) {
	if _, _, err := h.Store.Heartbeat(bg, "never", store.Update{}, h.Lease); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Heartbeat(never) = %v; want ErrUnknownSession", err)
	}
	if _, err := h.Store.Session(bg, "never"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("a refused heartbeat created a session: Session(never) = %v", err)
	}
}

func testExpiry(t *testing.T, h Harness, _ *Invalidations) {
	expiring(t, h, sess("s1", "c1", "http://h1", "/a"))
	register(t, h, sess("s2", "c2", "http://h2", "/a"))
	h.Elapse(h.Lease / 2)
	heartbeat(t, h, "s2")
	h.Elapse(h.Lease/2 + h.Lease/5)
	if _, err := h.Store.Session(bg, "s1"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Session(s1) after its lease = %v; want ErrUnknownSession", err)
	}
	if _, _, err := h.Store.Heartbeat(bg, "s1", store.Update{Headroom: 1}, h.Lease); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Heartbeat(s1) after its lease = %v; want ErrUnknownSession", err)
	}
	if _, err := h.Store.Session(bg, "s1"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("the late heartbeat re-created s1: Session(s1) = %v", err)
	}
	all, _ := h.Store.Sessions(bg)
	if !slices.Equal(ids(all), []string{"s2"}) {
		t.Fatalf("Sessions() = %v; want [s2]", ids(all))
	}
	nss, _ := h.Store.NamespaceSessions(bg, "/a")
	if !slices.Equal(ids(nss), []string{"s2"}) {
		t.Fatalf("NamespaceSessions(/a) = %v; want [s2]", ids(nss))
	}
	if cur, _ := h.Store.CurrentSession(bg, "c1"); cur != "" {
		t.Fatalf("CurrentSession(c1) = %q after expiry; want empty", cur)
	}
	mustSession(t, h, "s2")
}

func testSupersede(t *testing.T, h Harness, byClient bool) {
	expiring(t, h, sess("old", "c1", "http://h1", "/a"))
	next := sess("new", "c2", "http://h1", "/a")
	if byClient {
		next = sess("new", "c1", "http://h2", "/a")
	}
	if sup := register(t, h, next); !slices.Equal(sup, []string{"old"}) {
		t.Fatalf("Register(new) superseded %v; want [old]", sup)
	}
	if s := mustSession(t, h, "old"); !s.Superseded {
		t.Fatalf("Session(old) = %+v; want Superseded", s)
	}
	if _, _, err := h.Store.Heartbeat(bg, "old", store.Update{}, h.Lease); !errors.Is(err, store.ErrSuperseded) {
		t.Fatalf("Heartbeat(old) = %v; want ErrSuperseded", err)
	}
	if _, _, err := h.Store.Heartbeat(bg, "new", store.Update{}, lasting(h)); err != nil {
		t.Fatalf("Heartbeat(new) = %v", err)
	}
	if byClient {
		if cur, _ := h.Store.CurrentSession(bg, "c1"); cur != "new" {
			t.Fatalf("CurrentSession(c1) = %q; want new", cur)
		}
	}
	// The superseded record stays (flagged) until its lease runs out, and
	// is still listed so that nothing re-places its ids early.
	nss, _ := h.Store.NamespaceSessions(bg, "/a")
	if !slices.Equal(ids(nss), []string{"new", "old"}) {
		t.Fatalf("NamespaceSessions(/a) = %v; want [new old]", ids(nss))
	}
	// A third registration does not report "old" again.
	third := sess("third", "c1", "http://h1", "/a")
	sup := register(t, h, third)
	if !slices.Equal(sup, []string{"new"}) {
		t.Fatalf("Register(third) superseded %v; want [new]", sup)
	}
	h.Elapse(h.Lease + h.Lease/5)
	if _, err := h.Store.Session(bg, "old"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Session(old) after its lease = %v; want ErrUnknownSession", err)
	}
}

func testSupersedeOnlyLive(t *testing.T, h Harness, _ *Invalidations) {
	expiring(t, h, sess("old", "c1", "http://h1"))
	h.Elapse(h.Lease + h.Lease/5)
	if sup := register(t, h, sess("new", "c1", "http://h1")); len(sup) != 0 {
		t.Fatalf("Register after the old lease ran out superseded %v; want none", sup)
	}
}

func testSupersededKeepsPlacements(t *testing.T, h Harness, inv *Invalidations) {
	reaper := h.Store.(store.Reaper)
	expiring(t, h, sess("old", "c1", "http://h1", "/a"))
	if w, _ := h.Store.Claim(bg, "/a", "x", "old"); w != "old" {
		t.Fatalf("Claim = %q; want old", w)
	}
	expiring(t, h, sess("new", "c1", "http://h1", "/a"))
	if p, _ := h.Store.Placement(bg, "/a", "x"); p != "old" {
		t.Fatalf("Placement after supersede = %q; want old (kept until its lease ends)", p)
	}
	if st, _ := reaper.Reap(bg, 0); st.Placements != 0 {
		t.Fatalf("Reap before the lease ran out freed %d placements; want 0", st.Placements)
	}
	h.Elapse(h.Lease + h.Lease/5)
	if _, _, err := h.Store.Heartbeat(bg, "new", store.Update{}, h.Lease); !errors.Is(err, store.ErrUnknownSession) {
		// new was not heartbeating either; both are gone now.
		t.Fatalf("Heartbeat(new) = %v; want ErrUnknownSession", err)
	}
	st, err := reaper.Reap(bg, 0)
	if err != nil || st.Placements != 1 {
		t.Fatalf("Reap after the lease = %+v, %v; want 1 placement freed", st, err)
	}
	settled(t, h, inv, "/a", "x", "", "after reap")
}

// heartbeat renews id for lasting and returns the messages it took.
func heartbeat(t *testing.T, h Harness, id string) []wire.Message {
	t.Helper()
	_, msgs, err := h.Store.Heartbeat(bg, id, store.Update{}, lasting(h))
	if err != nil {
		t.Fatalf("Heartbeat(%s) = %v", id, err)
	}
	return msgs
}

func testPush(t *testing.T, h Harness, _ *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1"))
	want := []wire.Message{{Type: wire.MessageDrain, DeadlineMs: 42}, {Type: wire.MessageWindDown}}
	for _, m := range want {
		if err := h.Store.Push(bg, "c1", m); err != nil {
			t.Fatal(err)
		}
	}
	if got := heartbeat(t, h, "s1"); !slices.Equal(got, want) {
		t.Fatalf("first Heartbeat messages = %v; want %v", got, want)
	}
	if got := heartbeat(t, h, "s1"); len(got) != 0 {
		t.Fatalf("second Heartbeat messages = %v; want none (exactly once)", got)
	}
	// A superseded session does not take its client's messages: the
	// current one does.
	if err := h.Store.Push(bg, "c1", want[0]); err != nil {
		t.Fatal(err)
	}
	register(t, h, sess("s2", "c1", "http://h1"))
	if _, msgs, err := h.Store.Heartbeat(bg, "s1", store.Update{}, h.Lease); !errors.Is(err, store.ErrSuperseded) || len(msgs) != 0 {
		t.Fatalf("Heartbeat(superseded) = %v, %v; want ErrSuperseded and no messages", msgs, err)
	}
	if got := heartbeat(t, h, "s2"); !slices.Equal(got, want[:1]) {
		t.Fatalf("Heartbeat(s2) messages = %v; want %v", got, want[:1])
	}
}

func testPushBounded(t *testing.T, h Harness, _ *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1"))
	for i := range 100 {
		if err := h.Store.Push(bg, "c1", wire.Message{Type: wire.MessageDrain, DeadlineMs: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	got := heartbeat(t, h, "s1")
	if len(got) == 0 || len(got) >= 100 || got[len(got)-1].DeadlineMs != 99 {
		t.Fatalf("after 100 pushes a heartbeat got %d messages ending %v; want a bounded queue keeping the newest", len(got), got[len(got)-1:])
	}
}

func testPushConcurrent(t *testing.T, h Harness, _ *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1"))
	const pushes, beaters, rounds = 10, 8, 5
	var mu sync.Mutex
	seen := map[int64]int{}
	for round := range rounds {
		for i := range pushes {
			if err := h.Store.Push(bg, "c1", wire.Message{Type: wire.MessageDrain, DeadlineMs: int64(round*pushes + i + 1)}); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for range beaters {
			wg.Go(func() {
				_, msgs, err := h.Store.Heartbeat(bg, "s1", store.Update{}, lasting(h))
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				for _, m := range msgs {
					seen[m.DeadlineMs]++
				}
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	if len(seen) != pushes*rounds {
		t.Fatalf("delivered %d distinct messages; want %d", len(seen), pushes*rounds)
	}
	for d, n := range seen {
		if n != 1 {
			t.Fatalf("message %d delivered %d times; want exactly once", d, n)
		}
	}
}

func testClaim(t *testing.T, h Harness, inv *Invalidations) {
	if p, err := h.Store.Placement(bg, "/a", "x"); p != "" || err != nil {
		t.Fatalf("Placement before any claim = %q, %v; want none", p, err)
	}
	if w, err := h.Store.Claim(bg, "/a", "x", "s1"); w != "s1" || err != nil {
		t.Fatalf("first Claim = %q, %v; want s1", w, err)
	}
	if w, err := h.Store.Claim(bg, "/a", "x", "s2"); w != "s1" || err != nil {
		t.Fatalf("second Claim = %q, %v; want the winner s1", w, err)
	}
	if w, err := h.Store.Claim(bg, "/a", "x", "s1"); w != "s1" || err != nil {
		t.Fatalf("repeated Claim by the holder = %q, %v; want s1", w, err)
	}
	settled(t, h, inv, "/a", "x", "s1", "after the claims")
	if p, _ := h.Store.Placement(bg, "/b", "x"); p != "" {
		t.Fatalf("Placement(/b, x) = %q; want none (namespaces are separate)", p)
	}
}

func testClaimConcurrent(t *testing.T, h Harness, _ *Invalidations) {
	const n = 16
	got := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			w, err := h.Store.Claim(bg, "/a", "race", fmt.Sprintf("s%d", i))
			if err != nil {
				t.Error(err)
			}
			got[i] = w
		})
	}
	wg.Wait()
	for _, w := range got {
		if w != got[0] || w == "" {
			t.Fatalf("concurrent claims returned %v; want one winner for all", got)
		}
	}
	if p, _ := h.Store.Placement(bg, "/a", "race"); p != got[0] {
		t.Fatalf("Placement = %q; want the winner %q", p, got[0])
	}
	counts, _ := h.Store.PlacementCounts(bg, got[0], []string{"/a"})
	if counts["/a"] != 1 {
		t.Fatalf("winner's PlacementCounts = %v; want /a: 1", counts)
	}
	for i := range n {
		if id := fmt.Sprintf("s%d", i); id != got[0] {
			if c, _ := h.Store.PlacementCounts(bg, id, []string{"/a"}); c["/a"] != 0 {
				t.Fatalf("loser %s PlacementCounts = %v; want /a: 0", id, c)
			}
		}
	}
}

// testLookupOrClaim: the placement when there is one (nothing written,
// nothing indexed), a claim under a new epoch when there is none.
func testLookupOrClaim(t *testing.T, h Harness, inv *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1", "/a"))
	register(t, h, sess("s2", "c2", "http://h2", "/a"))
	p1, claimed, err := h.Store.LookupOrClaim(bg, "/a", "x", "s1")
	if !claimed {
		t.Fatalf("LookupOrClaim of a new id = %+v, claimed %v, %v; want claimed", p1, claimed, err)
	}
	p1 = mustPlace(t, "LookupOrClaim of a new id", store.Placement{}, p1, err, "s1")
	lookup(t, h, inv, "/a", "x", p1)
	for _, sid := range []string{"s2", "s1"} {
		p, claimed, err := h.Store.LookupOrClaim(bg, "/a", "x", sid)
		if err != nil || claimed || p.Session != "s1" || p.Epoch != p1.Epoch || !p.Since.Equal(p1.Since) {
			t.Fatalf("LookupOrClaim by %s of a placed id = %+v, claimed %v, %v; want %+v unchanged", sid, p, claimed, err, p1)
		}
	}
	lookup(t, h, inv, "/a", "x", p1)
	if c, _ := h.Store.PlacementCounts(bg, "s1", []string{"/a"}); c["/a"] != 1 {
		t.Fatalf("PlacementCounts(s1) = %v; want /a: 1", c)
	}
	if c, _ := h.Store.PlacementCounts(bg, "s2", []string{"/a"}); c["/a"] != 0 {
		t.Fatalf("PlacementCounts(s2) = %v; want /a: 0 (finding s1's placement indexes nothing)", c)
	}
	if ok, err := h.Store.Release(bg, "/a", "x", "s1", 0); !ok || err != nil {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	p2, claimed, err := h.Store.LookupOrClaim(bg, "/a", "x", "s2")
	if !claimed {
		t.Fatalf("LookupOrClaim after the release = %+v, claimed %v, %v; want claimed", p2, claimed, err)
	}
	mustPlace(t, "LookupOrClaim after the release", p1, p2, err, "s2")
	if c, _ := h.Store.PlacementCounts(bg, "s2", []string{"/a"}); c["/a"] != 1 {
		t.Fatalf("PlacementCounts(s2) = %v; want /a: 1", c)
	}
	if _, _, err := h.Store.LookupOrClaim(bg, "/a", "y", ""); err == nil {
		t.Fatal("LookupOrClaim with an empty session succeeded")
	}
}

// testLookupOrClaimConcurrent: of concurrent calls for one new id exactly
// one claims, and all answer its placement.
func testLookupOrClaimConcurrent(t *testing.T, h Harness, inv *Invalidations) {
	const n = 16
	got := make([]store.Placement, n)
	claims := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p, claimed, err := h.Store.LookupOrClaim(bg, "/a", "race", fmt.Sprintf("s%d", i))
			if err != nil {
				t.Error(err)
			}
			got[i], claims[i] = p, claimed
		})
	}
	wg.Wait()
	winners := 0
	for i, p := range got {
		if p.Session == "" || p.Session != got[0].Session || p.Epoch != got[0].Epoch || !p.Since.Equal(got[0].Since) {
			t.Fatalf("concurrent calls returned %+v; want one placement for all", got)
		}
		if claims[i] {
			winners++
			if p.Session != fmt.Sprintf("s%d", i) {
				t.Fatalf("call %d claimed, but the placement is %+v", i, p)
			}
		}
	}
	if winners != 1 {
		t.Fatalf("%d calls claimed; want exactly one", winners)
	}
	lookup(t, h, inv, "/a", "race", got[0])
	if c, _ := h.Store.PlacementCounts(bg, got[0].Session, []string{"/a"}); c["/a"] != 1 {
		t.Fatalf("winner's PlacementCounts = %v; want /a: 1", c)
	}
	for i := range n {
		if id := fmt.Sprintf("s%d", i); id != got[0].Session {
			if c, _ := h.Store.PlacementCounts(bg, id, []string{"/a"}); c["/a"] != 0 {
				t.Fatalf("loser %s PlacementCounts = %v; want /a: 0", id, c)
			}
		}
	}
}

func testReplace(t *testing.T, h Harness, inv *Invalidations) {
	if w, _ := h.Store.Replace(bg, "/a", "x", "s1", "s2"); w != "" {
		t.Fatalf("Replace of a missing placement = %q; want none", w)
	}
	if p, _ := h.Store.Placement(bg, "/a", "x"); p != "" {
		t.Fatalf("Replace created a placement: %q", p)
	}
	h.Store.Claim(bg, "/a", "x", "s1")
	if w, err := h.Store.Replace(bg, "/a", "x", "s9", "s2"); w != "s1" || err != nil {
		t.Fatalf("Replace from the wrong holder = %q, %v; want the current holder s1", w, err)
	}
	if w, err := h.Store.Replace(bg, "/a", "x", "s1", "s2"); w != "s2" || err != nil {
		t.Fatalf("Replace from s1 = %q, %v; want s2", w, err)
	}
	settled(t, h, inv, "/a", "x", "s2", "after Replace")
	if w, _ := h.Store.Replace(bg, "/a", "x", "s1", "s3"); w != "s2" {
		t.Fatalf("a second Replace from the old holder = %q; want s2 (lost)", w)
	}
}

// mustPlace runs a claim or replace that must win for session and
// returns its placement, which must be strictly newer than after.
func mustPlace(t *testing.T, what string, after store.Placement, p store.Placement, err error, session string) store.Placement {
	t.Helper()
	if err != nil || p.Session != session {
		t.Fatalf("%s = %+v, %v; want a placement on %s", what, p, err, session)
	}
	if p.Epoch <= after.Epoch {
		t.Fatalf("%s: epoch %d; want more than the previous %d", what, p.Epoch, after.Epoch)
	}
	if p.Since.IsZero() || p.Since.Before(after.Since) {
		t.Fatalf("%s: since %v; want set, not before the previous %v", what, p.Since, after.Since)
	}
	return p
}

// lookup reads a placement and requires it to equal want. A store whose
// reads are served from a client-side cache refreshed by asynchronous
// invalidations (Redis: a read right after a write made through another
// connection may still be served the old value until that connection has
// processed the write's invalidation, see the store package doc) is read
// again after each invalidation, for up to 5 s.
func lookup(t *testing.T, h Harness, inv *Invalidations, ns, id string, want store.Placement) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		ch := inv.next() // before the read: an invalidation after it wakes us
		got, err := h.Store.Lookup(bg, ns, id)
		if err == nil && got.Since.Equal(want.Since) && got.Session == want.Session && got.Epoch == want.Epoch {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("Lookup(%s, %s) = %+v, %v; want %+v", ns, id, got, err, want)
		}
	}
}

// testEpochs: every way a placement ends (release: eviction, idle, drain;
// replace: failover from a dead session) is followed by a strictly larger
// epoch, a lost claim or replace allocates none, and Lookup reads exactly
// what the winning write returned.
func testEpochs(t *testing.T, h Harness, inv *Invalidations) {
	lookup(t, h, inv, "/a", "x", store.Placement{})
	p1, err := h.Store.ClaimPlacement(bg, "/a", "x", "s1")
	p1 = mustPlace(t, "first ClaimPlacement", store.Placement{}, p1, err, "s1")
	lookup(t, h, inv, "/a", "x", p1)
	if p, err := h.Store.ClaimPlacement(bg, "/a", "x", "s2"); err != nil || p != p1 && !(p.Session == p1.Session && p.Epoch == p1.Epoch && p.Since.Equal(p1.Since)) {
		t.Fatalf("losing ClaimPlacement = %+v, %v; want the winner's placement %+v", p, err, p1)
	}
	if p, err := h.Store.ReplacePlacement(bg, "/a", "x", "s9", "s2"); err != nil || p.Session != "s1" || p.Epoch != p1.Epoch {
		t.Fatalf("ReplacePlacement from the wrong holder = %+v, %v; want %+v unchanged", p, err, p1)
	}
	lookup(t, h, inv, "/a", "x", p1)
	p2, err := h.Store.ReplacePlacement(bg, "/a", "x", "s1", "s2")
	p2 = mustPlace(t, "ReplacePlacement s1 -> s2 (failover)", p1, p2, err, "s2")
	lookup(t, h, inv, "/a", "x", p2)
	if ok, err := h.Store.Release(bg, "/a", "x", "s2", 0); !ok || err != nil {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	lookup(t, h, inv, "/a", "x", store.Placement{})
	if p, err := h.Store.ReplacePlacement(bg, "/a", "x", "s2", "s3"); err != nil || p.Session != "" || p.Epoch != 0 {
		t.Fatalf("ReplacePlacement of a released placement = %+v, %v; want none", p, err)
	}
	// The same session claims again after its release (an idle eviction
	// and a new request): still a new epoch.
	last := p2
	for i := range 20 {
		p, err := h.Store.ClaimPlacement(bg, "/a", "x", "s2")
		last = mustPlace(t, fmt.Sprintf("ClaimPlacement after release #%d", i+1), last, p, err, "s2")
		if _, err := h.Store.Release(bg, "/a", "x", "s2", 0); err != nil {
			t.Fatal(err)
		}
	}
	// The holder-only forms agree.
	if w, err := h.Store.Claim(bg, "/a", "x", "s4"); w != "s4" || err != nil {
		t.Fatalf("Claim = %q, %v; want s4", w, err)
	}
	p, err := h.Store.Lookup(bg, "/a", "x")
	mustPlace(t, "Claim", last, p, err, "s4")
	if p, _ := h.Store.Lookup(bg, "/b", "x"); p.Session != "" {
		t.Fatalf("Lookup(/b, x) = %+v; want none (namespaces are separate)", p)
	}
}

func testEpochsConcurrent(t *testing.T, h Harness, inv *Invalidations) {
	const n = 16
	got := make([]store.Placement, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			p, err := h.Store.ClaimPlacement(bg, "/a", "race", fmt.Sprintf("s%d", i))
			if err != nil {
				t.Error(err)
			}
			got[i] = p
		})
	}
	wg.Wait()
	for _, p := range got {
		if p.Session == "" || p.Session != got[0].Session || p.Epoch != got[0].Epoch || !p.Since.Equal(got[0].Since) {
			t.Fatalf("concurrent claims returned %+v; want one winning placement for all", got)
		}
	}
	lookup(t, h, inv, "/a", "race", got[0])
}

// testEpochsReap: a placement collected with its dead session (Reap, the
// janitor after a kill -9) is followed by a larger epoch.
func testEpochsReap(t *testing.T, h Harness, inv *Invalidations) {
	expiring(t, h, sess("dead", "c1", "http://h1", "/a"))
	p1, err := h.Store.ClaimPlacement(bg, "/a", "x", "dead")
	p1 = mustPlace(t, "ClaimPlacement", store.Placement{}, p1, err, "dead")
	h.Elapse(h.Lease + h.Lease/5)
	if st, err := h.Store.(store.Reaper).Reap(bg, 0); err != nil || st.Placements != 1 {
		t.Fatalf("Reap = %+v, %v; want the dead session's placement", st, err)
	}
	lookup(t, h, inv, "/a", "x", store.Placement{})
	p2, err := h.Store.ClaimPlacement(bg, "/a", "x", "next")
	mustPlace(t, "ClaimPlacement after Reap", p1, p2, err, "next")
}

// testEpochsFlush: the store forgets everything (FLUSHALL; a Redis
// restarted without persistence forgets the same), epoch counters
// included; the time floor alone keeps the next epoch above the last one.
func testEpochsFlush(t *testing.T, h Harness, _ *Invalidations) {
	last := store.Placement{}
	for i := range 5 { // the counter runs ahead of the microsecond clock
		p, err := h.Store.ClaimPlacement(bg, "/a", "x", "s1")
		last = mustPlace(t, fmt.Sprintf("ClaimPlacement #%d", i+1), last, p, err, "s1")
		h.Store.Release(bg, "/a", "x", "s1", 0)
	}
	h.Elapse(10 * time.Millisecond) // a restart takes at least this long
	h.Flush()
	p, err := h.Store.ClaimPlacement(bg, "/a", "x", "s2")
	mustPlace(t, "ClaimPlacement after a flush", last, p, err, "s2")
}

func testRelease(t *testing.T, h Harness, inv *Invalidations) {
	h.Store.Claim(bg, "/a", "x", "s1")
	if ok, err := h.Store.Release(bg, "/a", "x", "s2", 0); ok || err != nil {
		t.Fatalf("Release by a non-owner = %v, %v; want false", ok, err)
	}
	settled(t, h, inv, "/a", "x", "s1", "after a non-owner release (left alone)")
	if ok, err := h.Store.Release(bg, "/a", "x", "s1", 0); !ok || err != nil {
		t.Fatalf("Release by the owner = %v, %v; want true", ok, err)
	}
	settled(t, h, inv, "/a", "x", "", "after release")
	if ok, _ := h.Store.Release(bg, "/a", "x", "s1", 0); ok {
		t.Fatal("a second Release reported true; want false")
	}
	if ok, _ := h.Store.Release(bg, "/a", "x", "", 0); ok {
		t.Fatal("Release with an empty session reported true")
	}
}

// testReleaseEpoch: a release naming an epoch deletes only the placement
// of that epoch; a renewed placement (same session, newer epoch) survives a
// release of the old one.
func testReleaseEpoch(t *testing.T, h Harness, inv *Invalidations) {
	p1, err := h.Store.ClaimPlacement(bg, "/a", "x", "s1")
	p1 = mustPlace(t, "ClaimPlacement", store.Placement{}, p1, err, "s1")
	if ok, err := h.Store.Release(bg, "/a", "x", "s1", p1.Epoch+1); ok || err != nil {
		t.Fatalf("Release of another epoch = %v, %v; want false", ok, err)
	}
	settled(t, h, inv, "/a", "x", "s1", "after a release of another epoch (left alone)")
	p2, err := h.Store.RenewPlacement(bg, "/a", "x", "s1", p1.Epoch)
	p2 = mustPlace(t, "RenewPlacement", p1, p2, err, "s1")
	if ok, err := h.Store.Release(bg, "/a", "x", "s1", p1.Epoch); ok || err != nil {
		t.Fatalf("late Release of the renewed epoch = %v, %v; want false (the newer placement stays)", ok, err)
	}
	lookup(t, h, inv, "/a", "x", p2)
	if ok, err := h.Store.Release(bg, "/a", "x", "s1", p2.Epoch); !ok || err != nil {
		t.Fatalf("Release of the current epoch = %v, %v; want true", ok, err)
	}
	lookup(t, h, inv, "/a", "x", store.Placement{})
}

// testRenew: RenewPlacement writes a new epoch on the same session only
// when both the session and the epoch match, and answers the placement
// afterwards.
func testRenew(t *testing.T, h Harness, inv *Invalidations) {
	if p, err := h.Store.RenewPlacement(bg, "/a", "x", "s1", 7); err != nil || p.Session != "" {
		t.Fatalf("RenewPlacement of no placement = %+v, %v; want none", p, err)
	}
	lookup(t, h, inv, "/a", "x", store.Placement{})
	p1, err := h.Store.ClaimPlacement(bg, "/a", "x", "s1")
	p1 = mustPlace(t, "ClaimPlacement", store.Placement{}, p1, err, "s1")
	for _, c := range []struct {
		sid   string
		epoch uint64
	}{{"s2", p1.Epoch}, {"s1", p1.Epoch - 1}, {"s1", p1.Epoch + 1}} {
		p, err := h.Store.RenewPlacement(bg, "/a", "x", c.sid, c.epoch)
		if err != nil || p.Session != "s1" || p.Epoch != p1.Epoch {
			t.Fatalf("RenewPlacement(%s, %d) of %+v = %+v, %v; want it unchanged", c.sid, c.epoch, p1, p, err)
		}
	}
	lookup(t, h, inv, "/a", "x", p1)
	p2, err := h.Store.RenewPlacement(bg, "/a", "x", "s1", p1.Epoch)
	p2 = mustPlace(t, "RenewPlacement", p1, p2, err, "s1")
	lookup(t, h, inv, "/a", "x", p2)
	if c, _ := h.Store.PlacementCounts(bg, "s1", []string{"/a"}); c["/a"] != 1 {
		t.Fatalf("PlacementCounts(s1) after a renewal = %v; want /a: 1", c)
	}
	if _, err := h.Store.RenewPlacement(bg, "/a", "x", "", p2.Epoch); err == nil {
		t.Fatal("RenewPlacement with an empty session succeeded")
	}
}

// testNamespaceKnown: a namespace is known while a session registered for
// it is live, and after its end until Reap collects it; never before.
func testNamespaceKnown(t *testing.T, h Harness, _ *Invalidations) {
	known := func(ns string) bool {
		t.Helper()
		k, err := h.Store.NamespaceKnown(bg, ns)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if known("/a") {
		t.Fatal("NamespaceKnown(/a) before any registration = true")
	}
	expiring(t, h, sess("s1", "c1", "http://h1", "/a"))
	if !known("/a") || known("/b") {
		t.Fatalf("after registering s1 for /a: known(/a) = %v, known(/b) = %v; want true, false", known("/a"), known("/b"))
	}
	h.Elapse(h.Lease + h.Lease/5)
	if _, err := h.Store.Session(bg, "s1"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Session(s1) after its lease = %v; want ErrUnknownSession", err)
	}
	if !known("/a") {
		t.Fatal("NamespaceKnown(/a) right after its only session ended = false; want true until it is reaped")
	}
	if _, err := h.Store.(store.Reaper).Reap(bg, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for known("/a") { // a client-side cache hears of the reap by an invalidation
		if time.Now().After(deadline) {
			t.Fatal("NamespaceKnown(/a) after the reap = true; want false")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testPlacementCounts(t *testing.T, h Harness, _ *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1", "/a", "/b", "/c"))
	f := func(id string, want map[string]int) {
		t.Helper()
		got, err := h.Store.PlacementCounts(bg, id, []string{"/a", "/b", "/c"})
		if err != nil {
			t.Fatal(err)
		}
		for ns, n := range want {
			if got[ns] != n {
				t.Fatalf("PlacementCounts(%s) = %v; want %v", id, got, want)
			}
		}
	}
	f("s1", map[string]int{"/a": 0, "/b": 0, "/c": 0})
	if got, _ := h.Store.PlacementCounts(bg, "s1", []string{"/a", "/b", "/c"}); len(got) != 3 {
		t.Fatalf("PlacementCounts(s1) = %v; want the three served namespaces", got)
	}
	for _, id := range []string{"1", "2", "3"} {
		h.Store.Claim(bg, "/a", id, "s1")
	}
	h.Store.Claim(bg, "/b", "1", "s1")
	h.Store.Claim(bg, "/b", "1", "s1") // repeated: counted once
	f("s1", map[string]int{"/a": 3, "/b": 1, "/c": 0})
	h.Store.Release(bg, "/a", "1", "s1", 0)
	h.Store.Release(bg, "/a", "1", "s1", 0)
	h.Store.Replace(bg, "/a", "2", "s1", "s2")
	f("s1", map[string]int{"/a": 1, "/b": 1})
	f("s2", map[string]int{"/a": 1})
	if got, _ := h.Store.PlacementCounts(bg, "nobody", []string{"/a", "/b", "/c"}); len(got) != 0 {
		t.Fatalf("PlacementCounts(nobody) = %v; want empty", got)
	}
}

func testReap(t *testing.T, h Harness, inv *Invalidations) {
	reaper := h.Store.(store.Reaper)
	expiring(t, h, sess("dead", "c1", "http://h1", "/a"))
	register(t, h, sess("live", "c2", "http://h2", "/a"))
	for _, id := range []string{"1", "2", "3"} {
		h.Store.Claim(bg, "/a", id, "dead")
	}
	h.Store.Claim(bg, "/a", "live1", "live")
	h.Elapse(h.Lease / 2)
	heartbeat(t, h, "live")
	h.Elapse(h.Lease/2 + h.Lease/5)
	heartbeat(t, h, "live")
	// The proxy replaced one of the dead session's placements already.
	if w, _ := h.Store.Replace(bg, "/a", "3", "dead", "live"); w != "live" {
		t.Fatalf("Replace = %q; want live", w)
	}
	// Within the grace: nothing is collected.
	if st, err := reaper.Reap(bg, h.Lease*10); err != nil || st != (store.ReapStats{}) {
		t.Fatalf("Reap within the grace = %+v, %v; want nothing", st, err)
	}
	st, err := reaper.Reap(bg, 0)
	if err != nil || st != (store.ReapStats{Sessions: 1, Placements: 2}) {
		t.Fatalf("Reap = %+v, %v; want 1 session and 2 placements", st, err)
	}
	want := map[string]string{"1": "", "2": "", "3": "live", "live1": "live"}
	for id, holder := range want {
		settled(t, h, inv, "/a", id, holder, "after Reap")
	}
	if c, _ := h.Store.PlacementCounts(bg, "dead", []string{"/a"}); len(c) != 0 {
		t.Fatalf("PlacementCounts(dead) after Reap = %v; want empty", c)
	}
	if c, _ := h.Store.PlacementCounts(bg, "live", []string{"/a"}); c["/a"] != 2 {
		t.Fatalf("PlacementCounts(live) = %v; want /a: 2", c)
	}
	if st, err := reaper.Reap(bg, 0); err != nil || st != (store.ReapStats{}) {
		t.Fatalf("second Reap = %+v, %v; want nothing (idempotent)", st, err)
	}
	nss, _ := h.Store.NamespaceSessions(bg, "/a")
	if !slices.Equal(ids(nss), []string{"live"}) {
		t.Fatalf("NamespaceSessions(/a) after Reap = %v; want [live]", ids(nss))
	}
}

func testInvalidatePlacement(t *testing.T, h Harness, inv *Invalidations) {
	name := wire.PlacementName("/a", "x")
	want := store.Invalidation{Placement: name}
	step := func(what string, change func()) {
		t.Helper()
		// Read first: a tracking store reports only keys it has read.
		if _, err := h.Store.Placement(bg, "/a", "x"); err != nil {
			t.Fatal(err)
		}
		inv.Reset()
		change()
		t.Logf("after %s", what)
		inv.Wait(t, want)
	}
	step("claim", func() { h.Store.Claim(bg, "/a", "x", "s1") })
	step("replace", func() { h.Store.Replace(bg, "/a", "x", "s1", "s2") })
	step("release", func() { h.Store.Release(bg, "/a", "x", "s2", 0) })
	step("lookup-or-claim", func() { h.Store.LookupOrClaim(bg, "/a", "x", "s1") })
	step("release again", func() { h.Store.Release(bg, "/a", "x", "s1", 0) })
	expiring(t, h, sess("s3", "c3", "http://h3", "/a"))
	h.Store.Claim(bg, "/a", "x", "s3")
	step("reap", func() {
		h.Elapse(h.Lease + h.Lease/5)
		if st, err := h.Store.(store.Reaper).Reap(bg, 0); err != nil || st.Placements != 1 {
			t.Fatalf("Reap = %+v, %v; want 1 placement", st, err)
		}
	})
}

func testInvalidateSession(t *testing.T, h Harness, inv *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1"))
	want := store.Invalidation{Session: "s1"}
	mustSession(t, h, "s1")
	inv.Reset()
	heartbeat(t, h, "s1")
	inv.Wait(t, want)
	mustSession(t, h, "s1")
	inv.Reset()
	register(t, h, sess("s2", "c1", "http://h2"))
	inv.Wait(t, want) // superseded
	if s := mustSession(t, h, "s1"); !s.Superseded {
		t.Fatalf("Session(s1) after the invalidation = %+v; want Superseded (fresh, not cached)", s)
	}
}

func testInvalidateExpiry(t *testing.T, h Harness, inv *Invalidations) {
	expiring(t, h, sess("s1", "c1", "http://h1"))
	mustSession(t, h, "s1")
	inv.Reset()
	h.Elapse(h.Lease + h.Lease/5)
	inv.Wait(t, store.Invalidation{Session: "s1"})
	if _, err := h.Store.Session(bg, "s1"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Session(s1) after expiry = %v; want ErrUnknownSession", err)
	}
}

func testInvalidateFlush(t *testing.T, h Harness, inv *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1"))
	mustSession(t, h, "s1")
	inv.Reset()
	h.Flush()
	inv.Wait(t, store.Invalidation{All: true})
	// Each Redis connection receives its own flush notice, in no order
	// relative to the others, so a read may briefly hit a connection whose
	// notice is still in flight; it must converge within milliseconds.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := h.Store.Session(bg, "s1")
		if errors.Is(err, store.ErrUnknownSession) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Session(s1) after flush = %v; want ErrUnknownSession", err)
		}
		time.Sleep(time.Millisecond) // polling an external process
	}
}

func testInvalidateKill(t *testing.T, h Harness, inv *Invalidations) {
	if h.KillConnections == nil {
		t.Skip("this store has no connections to lose")
	}
	h.Store.Claim(bg, "/a", "x", "s1")
	if p, _ := h.Store.Placement(bg, "/a", "x"); p != "s1" {
		t.Fatalf("Placement = %q; want s1", p)
	}
	inv.Reset()
	h.KillConnections()
	inv.Wait(t, store.Invalidation{All: true})
	// The store recovers: the next read reconnects.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := h.Store.Placement(bg, "/a", "x")
		if err == nil && p == "s1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Placement after reconnect = %q, %v; want s1", p, err)
		}
		time.Sleep(10 * time.Millisecond) // polling an external process
	}
}

func testCancelled(t *testing.T, h Harness, _ *Invalidations) {
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := h.Store.Placement(ctx, "/a", "x"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Placement(cancelled ctx) = %v; want context.Canceled", err)
	}
	if _, err := h.Store.Register(ctx, sess("s1", "c1", "http://h1"), h.Lease); !errors.Is(err, context.Canceled) {
		t.Fatalf("Register(cancelled ctx) = %v; want context.Canceled", err)
	}
}

func testClosed(t *testing.T, h Harness, _ *Invalidations) {
	h.Store.Close()
	h.Store.Close() // idempotent
	if err := h.Store.Ping(bg); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Ping after Close = %v; want ErrClosed", err)
	}
	if _, err := h.Store.Claim(bg, "/a", "x", "s1"); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Claim after Close = %v; want ErrClosed", err)
	}
}

func testDeregister(t *testing.T, h Harness, inv *Invalidations) {
	reaper := h.Store.(store.Reaper)
	register(t, h, sess("s1", "c1", "http://h1", "/a"))
	register(t, h, sess("s2", "c2", "http://h2", "/a"))
	if w, _ := h.Store.Claim(bg, "/a", "x", "s1"); w != "s1" {
		t.Fatalf("Claim = %q; want s1", w)
	}
	if ok, err := h.Store.Deregister(bg, "s1"); !ok || err != nil {
		t.Fatalf("Deregister(s1) = %v, %v; want true", ok, err)
	}
	if _, err := h.Store.Session(bg, "s1"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Session(s1) after Deregister = %v; want ErrUnknownSession", err)
	}
	if _, _, err := h.Store.Heartbeat(bg, "s1", store.Update{}, h.Lease); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Heartbeat(s1) after Deregister = %v; want ErrUnknownSession", err)
	}
	if _, err := h.Store.Session(bg, "s1"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("the refused heartbeat re-created s1: %v", err)
	}
	if cur, _ := h.Store.CurrentSession(bg, "c1"); cur != "" {
		t.Fatalf("CurrentSession(c1) after Deregister = %q; want empty", cur)
	}
	all, _ := h.Store.Sessions(bg)
	nss, _ := h.Store.NamespaceSessions(bg, "/a")
	if !slices.Equal(ids(all), []string{"s2"}) || !slices.Equal(ids(nss), []string{"s2"}) {
		t.Fatalf("Sessions() = %v, NamespaceSessions(/a) = %v after Deregister; want [s2]", ids(all), ids(nss))
	}
	if ok, err := h.Store.Deregister(bg, "s1"); ok || err != nil {
		t.Fatalf("second Deregister(s1) = %v, %v; want false", ok, err)
	}
	if ok, err := h.Store.Deregister(bg, "never"); ok || err != nil {
		t.Fatalf("Deregister(never) = %v, %v; want false", ok, err)
	}
	// The placement names a dead session now (the proxy replaces it on
	// demand); the janitor collects it once the grace has passed.
	if st, _ := reaper.Reap(bg, h.Lease*10); st.Placements != 0 {
		t.Fatalf("Reap within the grace freed %d placements; want 0", st.Placements)
	}
	if w, _ := h.Store.Replace(bg, "/a", "y", "s1", "s2"); w != "" {
		t.Fatalf("Replace of a missing placement = %q", w)
	}
	st, err := reaper.Reap(bg, 0)
	if err != nil || st != (store.ReapStats{Sessions: 1, Placements: 1}) {
		t.Fatalf("Reap after Deregister = %+v, %v; want 1 session, 1 placement", st, err)
	}
	settled(t, h, inv, "/a", "x", "", "after reap")
	// A new registration of the same client is not superseding anyone.
	if sup := register(t, h, sess("s3", "c1", "http://h1", "/a")); len(sup) != 0 {
		t.Fatalf("Register after Deregister superseded %v; want none", sup)
	}
	heartbeat(t, h, "s2")
}

func testDeregisterOthers(t *testing.T, h Harness, inv *Invalidations) {
	register(t, h, sess("old", "c1", "http://h1", "/a"))
	register(t, h, sess("new", "c1", "http://h1", "/a")) // supersedes old by client and URL
	h.Store.Claim(bg, "/a", "x", "new")
	if ok, err := h.Store.Deregister(bg, "old"); !ok || err != nil {
		t.Fatalf("Deregister(old, superseded) = %v, %v; want true", ok, err)
	}
	if cur, _ := h.Store.CurrentSession(bg, "c1"); cur != "new" {
		t.Fatalf("CurrentSession(c1) = %q after deregistering the old session; want new (pointer untouched)", cur)
	}
	if _, _, err := h.Store.Heartbeat(bg, "new", store.Update{}, lasting(h)); err != nil {
		t.Fatalf("Heartbeat(new) = %v", err)
	}
	settled(t, h, inv, "/a", "x", "new", "after deregistering the superseded session")
	// The URL pointer still names new: a third registration at the URL
	// supersedes new (and only new).
	if sup := register(t, h, sess("third", "c9", "http://h1")); !slices.Equal(sup, []string{"new"}) {
		t.Fatalf("Register(third) superseded %v; want [new]", sup)
	}
}

func testInvalidateDeregister(t *testing.T, h Harness, inv *Invalidations) {
	register(t, h, sess("s1", "c1", "http://h1"))
	mustSession(t, h, "s1")
	inv.Reset()
	if ok, err := h.Store.Deregister(bg, "s1"); !ok || err != nil {
		t.Fatalf("Deregister = %v, %v", ok, err)
	}
	inv.Wait(t, store.Invalidation{Session: "s1"})
	if _, err := h.Store.Session(bg, "s1"); !errors.Is(err, store.ErrUnknownSession) {
		t.Fatalf("Session(s1) after the invalidation = %v; want ErrUnknownSession (not a cached copy)", err)
	}
}

func testNonce(t *testing.T, h Harness, _ *Invalidations) {
	f := func(id string, want bool) {
		t.Helper()
		if got, err := h.Store.UseNonce(bg, id, "r:tok:http://h1", h.Lease); got != want || err != nil {
			t.Fatalf("UseNonce(%q) = %v, %v; want %v", id, got, err, want)
		}
	}
	f("n1", true)
	f("n1", false)
	f("n2", true)
	f("n1", false)
	h.Elapse(h.Lease + h.Lease/5)
	f("n1", true) // the record expired with its TTL
	f("n1", false)
}

func testNonceConcurrent(t *testing.T, h Harness, _ *Invalidations) {
	const n = 100
	var wins, fails int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			ok, err := h.Store.UseNonce(bg, "same", "h:tok:s1", h.Lease*10)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				fails++
			case ok:
				wins++
			}
		})
	}
	wg.Wait()
	if wins != 1 || fails != 0 {
		t.Fatalf("%d concurrent UseNonce of one nonce: %d first uses, %d errors; want exactly 1 and 0", n, wins, fails)
	}
}

func testReserveSlot(t *testing.T, h Harness, _ *Invalidations) {
	f := func(tok, id string, wantHeld int, wantOK bool) {
		t.Helper()
		held, ok, err := h.Store.ReserveSlot(bg, tok, id, 2, h.Lease)
		if held != wantHeld || ok != wantOK || err != nil {
			t.Fatalf("ReserveSlot(%s, %s, max 2) = %d, %v, %v; want %d, %v", tok, id, held, ok, err, wantHeld, wantOK)
		}
	}
	f("t1", "s1", 1, true)
	f("t1", "s2", 2, true)
	f("t1", "s3", 2, false)
	f("t1", "s1", 2, true) // already holds one
	f("t2", "s9", 1, true) // tokens are separate
	for _, id := range []string{"s1", "s2"} {
		in := sess(id, "c-"+id, "http://"+id)
		in.TokenID = "t1"
		expiring(t, h, in)
	}
	// s2 heartbeats (for lasting), s1 does not: after the lease they
	// reserved only s2 holds a slot.
	heartbeat(t, h, "s2")
	h.Elapse(h.Lease + h.Lease/5)
	f("t1", "s3", 2, true)
	f("t1", "s4", 2, false)
	// Deregister frees the slot at once.
	if ok, _ := h.Store.Deregister(bg, "s2"); !ok {
		t.Fatal("Deregister(s2) = false")
	}
	f("t1", "s4", 2, true)
}

func testReserveSlotConcurrent(t *testing.T, h Harness, _ *Invalidations) {
	const n, max = 20, 5
	var wins int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, ok, err := h.Store.ReserveSlot(bg, "t", fmt.Sprintf("s%d", i), max, h.Lease*10)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != max {
		t.Fatalf("%d concurrent reservations with a cap of %d: %d admitted; want exactly %d", n, max, wins, max)
	}
}

func lister(t *testing.T, h Harness) store.PlacementLister {
	t.Helper()
	l, ok := h.Store.(store.PlacementLister)
	if !ok {
		t.Fatalf("%T does not implement store.PlacementLister", h.Store)
	}
	return l
}

// listAll pages through q with limit per page, calling between (if not
// nil) after every page, and returns every (id, holder) returned, in order.
// It fails on a page over the limit or a listing that does not end.
func listAll(t *testing.T, l store.PlacementLister, q store.ListQuery, between func(page int)) []store.ListedPlacement {
	t.Helper()
	var out []store.ListedPlacement
	for page := 0; ; page++ {
		if page > 10_000 {
			t.Fatal("the listing did not end after 10000 pages")
		}
		p, err := l.ListPlacements(bg, q)
		if err != nil {
			t.Fatalf("ListPlacements page %d: %v", page, err)
		}
		if len(p.Placements) > q.Limit {
			t.Fatalf("page %d holds %d placements; limit %d", page, len(p.Placements), q.Limit)
		}
		out = append(out, p.Placements...)
		if p.Cursor == "" {
			return out
		}
		q.Cursor = p.Cursor
		if between != nil {
			between(page)
		}
	}
}

// onceEach fails unless every id in want appears exactly once in got, and
// no id appears twice.
func onceEach(t *testing.T, got []store.ListedPlacement, want map[string]string) {
	t.Helper()
	seen := map[string]int{}
	for _, p := range got {
		seen[p.ID]++
		if seen[p.ID] > 1 {
			t.Fatalf("id %q listed twice", p.ID)
		}
		if h, ok := want[p.ID]; ok && h != p.SessionID {
			t.Fatalf("id %q listed with holder %q; want %q", p.ID, p.SessionID, h)
		}
	}
	for id := range want {
		if seen[id] != 1 {
			t.Fatalf("id %q listed %d times; want once (got %d placements)", id, seen[id], len(got))
		}
	}
}

func testListPages(t *testing.T, h Harness, _ *Invalidations) {
	l := lister(t, h)
	want := map[string]string{}
	for i := range 300 {
		id, sid := fmt.Sprintf("id-%03d", i), fmt.Sprintf("s%d", i%3)
		if _, err := h.Store.Claim(bg, "/a", id, sid); err != nil {
			t.Fatal(err)
		}
		want[id] = sid
	}
	for i := range 40 { // another namespace, never listed under /a
		h.Store.Claim(bg, "/ab", fmt.Sprintf("other-%d", i), "s0")
	}
	for _, limit := range []int{1, 7, 1000} {
		got := listAll(t, l, store.ListQuery{Namespace: "/a", Limit: limit}, nil)
		if len(got) != len(want) {
			t.Fatalf("limit %d: listed %d placements; want %d", limit, len(got), len(want))
		}
		onceEach(t, got, want)
	}
	if got := listAll(t, l, store.ListQuery{Namespace: "/none", Limit: 10}, nil); len(got) != 0 {
		t.Fatalf("a namespace without placements listed %v", got)
	}
}

func testListBySession(t *testing.T, h Harness, _ *Invalidations) {
	l := lister(t, h)
	want := map[string]string{}
	for i := range 200 {
		id, sid := fmt.Sprintf("id-%03d", i), fmt.Sprintf("s%d", i%4)
		h.Store.Claim(bg, "/a", id, sid)
		if sid == "s1" || sid == "s3" {
			want[id] = sid
		}
	}
	h.Store.Claim(bg, "/b", "elsewhere", "s1")
	// An index entry whose placement moved on is not listed for its old
	// holder: id-001 now belongs to s2.
	if w, _ := h.Store.Replace(bg, "/a", "id-001", "s1", "s2"); w != "s2" {
		t.Fatalf("Replace = %q", w)
	}
	delete(want, "id-001")
	got := listAll(t, l, store.ListQuery{Namespace: "/a", Sessions: []string{"s3", "s1"}, Limit: 9}, nil)
	if len(got) != len(want) {
		t.Fatalf("listed %d placements of s1 and s3; want %d", len(got), len(want))
	}
	onceEach(t, got, want)
	if got := listAll(t, l, store.ListQuery{Namespace: "/a", Sessions: []string{}, Limit: 9}, nil); len(got) != 0 {
		t.Fatalf("an empty session filter listed %v; want nothing", got)
	}
}

// Placements that stay put are listed exactly once even while others come
// and go between pages (many deletions make Redis shrink its tables, the
// case where SCAN repeats keys); a churned id is listed at most once.
func testListChurn(t *testing.T, h Harness, _ *Invalidations) {
	l := lister(t, h)
	stable := map[string]string{}
	for i := range 150 {
		id := fmt.Sprintf("stable-%03d", i)
		h.Store.Claim(bg, "/a", id, "s1")
		stable[id] = "s1"
	}
	for i := range 600 {
		h.Store.Claim(bg, "/a", fmt.Sprintf("churn-%03d", i), "s2")
	}
	next := 0
	for _, q := range []store.ListQuery{
		{Namespace: "/a", Limit: 5},
		{Namespace: "/a", Sessions: []string{"s1", "s2"}, Limit: 5},
	} {
		released := 0
		got := listAll(t, l, q, func(page int) {
			// Release many, place a few new ones, for the first pages.
			for ; page < 40 && released < 15*(page+1); released++ {
				h.Store.Release(bg, "/a", fmt.Sprintf("churn-%03d", released), "s2", 0)
			}
			for range 3 {
				if page < 40 {
					h.Store.Claim(bg, "/a", fmt.Sprintf("new-%04d", next), "s2")
					next++
				}
			}
		})
		for i := range released { // the next round churns again
			h.Store.Claim(bg, "/a", fmt.Sprintf("churn-%03d", i), "s2")
		}
		onceEach(t, got, stable)
	}
}

func testListBadCursor(t *testing.T, h Harness, _ *Invalidations) {
	l := lister(t, h)
	for i := range 30 {
		h.Store.Claim(bg, "/a", fmt.Sprintf("id-%d", i), "s1")
	}
	for _, c := range []string{"not a cursor", "bTpub3QtYS1jdXJzb3I", "%%%"} {
		if _, err := l.ListPlacements(bg, store.ListQuery{Namespace: "/a", Cursor: c, Limit: 5}); !errors.Is(err, store.ErrBadCursor) {
			t.Fatalf("ListPlacements with cursor %q = %v; want ErrBadCursor", c, err)
		}
	}
	// A finished listing's cursor cannot be reused to resume it, on Redis
	// because its set is gone; a page's cursor stays valid until then.
	p, err := l.ListPlacements(bg, store.ListQuery{Namespace: "/a", Limit: 5})
	if err != nil || p.Cursor == "" {
		t.Fatalf("first page = %+v, %v; want a cursor", p, err)
	}
	if _, err := l.ListPlacements(bg, store.ListQuery{Namespace: "/a", Cursor: p.Cursor, Limit: 5}); err != nil {
		t.Fatalf("second page: %v", err)
	}
}
