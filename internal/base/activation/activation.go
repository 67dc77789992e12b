// Package activation holds the rule that decides, in a worker process, what a
// routed request may do to the instance of its id: be served by the live
// instance, activate a new one, supersede the live one, or be refused as
// stale. The host applies it to every request in fleet mode; the protocol's
// simulation (test/sim) applies the same code to its simulated workers.
//
// A route names a placement: the worker session and the placement's epoch
// (wire.HeaderEpoch). Epochs of one (namespace, id) strictly increase with
// every placement, fleet-wide. The rule:
//
//   - A live instance serves a route of its own epoch (or one without an
//     epoch); an older route is refused stale (the id was placed again since);
//     a newer one supersedes it (the id was placed again, here).
//   - A request without an epoch is unfenced: it is served by whatever
//     instance is live and activates one when none is (a custom resolver
//     that knows no epochs; the pinboard always sends one).
//   - With no live instance, a route activates one only if its epoch is above
//     every epoch under which an instance of the id closed here within the
//     retention window (Released). An instance that closed released its
//     placement (or was superseded by a newer one), so a route at or below its
//     epoch names a placement that no longer exists: a pinboard still routing
//     from a cached placement. Activating it would bring up a second instance
//     beside the one the current placement may have brought up elsewhere.
//
// # Invariants
//
//   - Decide is a pure function of its arguments; it never allocates.
//   - Released remembers, for every id whose instance closed within the
//     window, the largest such epoch; it forgets an id only once the window
//     has passed since the id's last close (Expire), never earlier. Its
//     methods are not safe for concurrent use: the caller's lock guards it
//     (the host: the directory shard's mutex).
//   - Forgetting is only a bound on memory: a stale route arriving after the
//     window is no longer recognised, which is why the window must exceed how
//     long any pinboard may route from a cached placement (at most the lease
//     after Redis last confirmed it) plus the longest a request may travel.
package activation

import "github.com/pinned-go/pinned/internal/base/faults"

// Verdict is what a routed request may do.
type Verdict uint8

const (
	// Serve: the live instance serves the request.
	Serve Verdict = iota
	// Activate: no instance is live and the route may bring one up under its
	// epoch.
	Activate
	// Supersede: the route is newer than the live instance, which must close
	// (without releasing the placement, which is the route's now) before the
	// route activates its own.
	Supersede
	// Stale: the route names a placement older than the live instance, or
	// one whose instance closed here already: answer 503 stale (nothing ran),
	// so the pinboard re-resolves.
	Stale
)

// String names the verdict.
func (v Verdict) String() string {
	switch v {
	case Serve:
		return "serve"
	case Activate:
		return "activate"
	case Supersede:
		return "supersede"
	case Stale:
		return "stale"
	}
	return "unknown"
}

// Decide applies the rule to a request whose route carries epoch (0: the
// request carried none). live says an instance of the id is live, with
// epoch liveEpoch; released and wasReleased are Released.Floor of the id.
func Decide(epoch uint64, live bool, liveEpoch uint64, released uint64, wasReleased bool) Verdict {
	if live {
		switch {
		case epoch == 0 || epoch == liveEpoch:
			return Serve
		case epoch < liveEpoch:
			return Stale
		default:
			return Supersede
		}
	}
	if epoch != 0 && wasReleased && epoch <= released && !faults.Has(faults.NoTombstone) {
		return Stale
	}
	return Activate
}
