// Package hotids is the pinboard's hot-id telemetry: a bounded top-K sketch
// of the ids it routed in the last minute, per namespace, with each id's
// request count, rate, bytes, p99 latency and holder; plus, from the same
// calls, requests per worker session and the non-2xx answers by status and
// reason. The proxy calls [Sketch.Record] once per routed request; the
// registry reads [Sketch.Top] (GET /registry/hot) and [Sketch.Traffic]
// (GET /registry/traffic); the console shows both.
//
// # The sketch
//
// Space-saving (Metwally, Agrawal, El Abbadi 2005): a table of Capacity
// counters; a name already counted is incremented; a new name takes over
// the smallest counter, inheriting its count as its possible error. Every
// name whose true count exceeds the table's smallest count is in the table,
// and a reported count exceeds the true one by at most that smallest count.
//
// Stripes: the table is split by a hash of the placement name into Stripes
// independent tables, each with its own mutex, so requests for different
// ids rarely share a lock and an id always lands in the same stripe (its
// counts are never split). Windowing: each stripe keeps Slots tables per
// namespace, one per Window/Slots of time (10 s by default), reused
// round-robin: a query sums the slots of the last Window (the current slot
// is partial, so a query covers between Window−Window/Slots and Window of
// traffic; rates divide by the time actually covered).
//
// Error bound: for one id, the sum over the window's slots of that slot's
// smallest count when its table is full (an id missing from a full slot
// may have had up to that many requests there). [Sketch.ErrorBound] is the
// largest such sum over every stripe and namespace: no count reported by
// Top exceeds the truth by more, and no id with more requests than that is
// missing. It is exported as the gauge pinned_hotids_error_bound.
//
// # Invariants
//
//   - Record does not allocate once every table has seen a name of its
//     length (names are copied into per-counter buffers that keep their
//     capacity), takes exactly one stripe mutex (plus one shared mutex for
//     non-2xx answers only), and never blocks on I/O.
//   - Memory is bounded whatever the number of ids, namespaces, holders
//     or answers: Stripes × Slots × MaxNamespaces tables of Capacity
//     counters (each a name buffer of at most MaxNameLen bytes and an
//     88-bucket latency histogram of 4-byte counts, about 450 bytes with
//     a short name), allocated on first use; Stripes × Slots × MaxHolders
//     holder counters; Slots × MaxAnswers answer counters. A namespace
//     beyond MaxNamespaces takes the place of one without traffic in the
//     window, or is not tracked (its requests still count per holder and
//     per answer).
//   - No id, namespace or holder ever becomes a metric label.
//   - Times are wall-clock times given by the caller (Record's at, the
//     query's now), so tests drive the window without sleeping.
//
// # One pinboard's view
//
// Each pinboard sees only the requests it routed itself. Behind a load
// balancer that spreads clients over several pinboards, an operator
// aggregates by asking every pinboard (each has its own admin listener and
// public registry) and summing per id: requests, bytes and perSecond add
// up, errorBound adds up, p99Ms is at most the largest of the answers and
// the holder is the same on every pinboard (one placement). An id can be
// hot overall while missing from every pinboard's top n: ask each for a
// larger n than the rows wanted.
package hotids
