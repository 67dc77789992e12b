// Package faults holds the test-only fault hooks the chaos harness
// (test/chaos) uses to plant known bugs in the real binaries and prove that
// its checker catches them.
//
// Invariant: a binary built without the build tag pinned_faults cannot be
// switched: Has is a constant false there and every hook compiles away. With
// the tag, the faults named in the environment variable PINNED_FAULTS (a
// comma-separated list of the Fault constants) are read once, when the
// process starts, and never change afterwards. Unknown names make the
// process exit with status 2 at start, so a typo cannot silently run a
// healthy binary.
//
// The faults (each one named after the invariant it breaks, see
// ARCHITECTURE.md "The lease (worker/)"):
//
//   - no_self_abort: on lease loss the worker withdraws the lease (Admit
//     refuses) but neither cancels the session context nor aborts the
//     hosts' instances: they live on (until the host's own guard meets them
//     or they go idle); the inline checks in Admit and Instance.Do keep them
//     from acting, so the chaos checker sees instances never aborted.
//   - receive_anchor: anchorLease counts the lease from the ack's RECEIVE
//     time instead of the send time (etcd's mistake).
//   - blind_renew: the registry's heartbeat renews the session record with a
//     blind write, re-creating it when it is gone (after a Redis restart)
//     instead of answering 409 reregister.
//   - watchdog_only: Admit does not check the lease inline; only the loop's
//     watchdog fences. Pair it with late_watchdog to make the watchdog lag.
//   - late_watchdog: the loop notices an expired lease LateWatchdog late
//     (a frozen watchdog). Harmless on its own while Admit checks inline.
//   - replace_no_compare: the store's Replace (internal/store/redisstore)
//     writes the placement blindly instead of compare-and-set from the dead
//     holder: two pinboards that both found the holder dead both "win" and
//     route the id to two workers.
//   - claim_no_nx: the store's Claim writes the placement blindly instead of
//     SET NX: two pinboards placing a new id at once both "win". (Its
//     LookupOrClaim then reads and claims in two steps, as on a cluster,
//     so that both can read "none" first.)
//   - no_tombstone: a worker's host forgets the epochs it released
//     (internal/base/activation): a route from a pinboard's stale cached
//     placement activates a second instance beside the current one.
//   - short_tombstone: the host remembers released epochs for
//     ShortTombstoneWindow instead of its window, shorter than a pinboard
//     may route from its cache.
//   - release_any_epoch: the store's Release deletes the placement of the
//     session whatever its epoch, instead of only the epoch the closed
//     instance held: a release that arrives after the placement was renewed
//     under a newer epoch deletes the renewed one while its instance lives.
//   - no_death_proof: fast failover ends the session of every worker the
//     proxy found unreachable without a proof of death (a dial timeout, a
//     partition, a full accept queue taken for a dead process): the ids of a
//     live worker move while it still serves them.
package faults

import "time"

// Fault names one planted bug.
type Fault string

// The faults. See the package doc.
const (
	NoSelfAbort   Fault = "no_self_abort"
	ReceiveAnchor Fault = "receive_anchor"
	BlindRenew    Fault = "blind_renew"
	WatchdogOnly  Fault = "watchdog_only"
	LateWatchdog  Fault = "late_watchdog"
	// The store's placement writes without their check.
	ReplaceNoCompare Fault = "replace_no_compare"
	ClaimNoNX        Fault = "claim_no_nx"
	// The stale-route fence.
	NoTombstone     Fault = "no_tombstone"
	ShortTombstone  Fault = "short_tombstone"
	ReleaseAnyEpoch Fault = "release_any_epoch"
	// Fast failover.
	NoDeathProof Fault = "no_death_proof"
)

// ShortTombstoneWindow is how long released epochs are remembered under
// ShortTombstone.
const ShortTombstoneWindow = 50 * time.Millisecond

// All lists every fault.
func All() []Fault {
	return []Fault{NoSelfAbort, ReceiveAnchor, BlindRenew, WatchdogOnly, LateWatchdog, ReplaceNoCompare, ClaimNoNX,
		NoTombstone, ShortTombstone, ReleaseAnyEpoch, NoDeathProof}
}

// EnvVar is the environment variable a pinned_faults binary reads.
const EnvVar = "PINNED_FAULTS"

// BuildTag is the build tag that compiles the hooks in.
const BuildTag = "pinned_faults"
