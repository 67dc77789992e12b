// Package alarm is the pinboard's alarm scheduler: it claims due alarms
// from the store (store.Alarms: memstore with -dev, redisstore on Redis)
// and delivers each one through a Deliverer to the worker holding its
// instance, then applies the outcome (wire.Alarm.AfterSuccess,
// AfterFailure, AfterUnavailable) with a compare-and-set on the claimed
// record. Every pinboard runs one; they share the work through the store.
//
// # Loop
//
// Run owns one loop goroutine (its caller's) and one goroutine per delivery
// in flight. The loop keeps, per shard, when to claim it next: after a claim
// the earliest due time the store reports, at most PollInterval away (so
// alarms set through another pinboard, or left by a dead one, are found
// within it), at once when the claim was full; Nudge (the registry calls it
// for every alarm it sets, and a delivery for the alarm it reschedules)
// moves a shard's time earlier and wakes the loop. A shard is claimed only
// for as many alarms as there are free delivery slots (Concurrency), so a
// claimed alarm never waits for a slot while its claim runs out.
//
// # Outcomes
//
//   - 2xx: the alarm is removed, or a repeating one moves to its next
//     occurrence (missed-tick policy in wire.Alarm.AfterSuccess).
//   - 503, or ErrNotDelivered (no worker, none reachable): not an attempt;
//     due again after UnavailableBackoff doubled per such delivery, at most
//     UnavailableBackoffMax. When pauseAfter deliveries in a row find no
//     worker (every worker is down), claiming pauses: one probe alarm per
//     pause (doubling up to UnavailableBackoffMax) until a delivery reaches
//     a worker again, so an outage costs no claim per alarm.
//   - anything else (the handler failed, 4xx, 502/504, a timeout after
//     sending): a failed attempt; retried after the alarm's backoff, and
//     after its last attempt dead-lettered (logged, counted, kept in the
//     store: GET /registry/alarms/dead).
//
// # Invariants
//
//   - Two pinboards never deliver one alarm at once: a claim makes it
//     invisible to every other claim for Claim, which exceeds
//     DeliveryTimeout plus StoreTimeout, the longest a live pinboard holds
//     it. Only a pinboard that dies (or stops longer than that) lets its
//     claim end with the delivery's outcome unknown; the alarm is then
//     delivered again (at least once).
//   - An alarm is removed only after a 2xx (or as a dead letter), and only
//     if its record is still the one claimed: setting it again while it is
//     delivered keeps the new one.
//   - Run returns only after every delivery it started has finished
//     (bounded by DeliveryTimeout plus StoreTimeout).
//   - Metrics live on Config.Metrics: pinned_alarms_claimed_total,
//     pinned_alarm_deliveries_total{result}, pinned_alarms_dead_lettered_total,
//     pinned_alarms_stale_total, pinned_alarm_store_errors_total,
//     pinned_alarm_lateness_seconds, pinned_alarm_deliveries_in_flight.
package alarm
