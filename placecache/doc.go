// Package placecache is the pinboard's in-process cache of placements: a
// generic map from names ("/<namespace>/<id>") to values (the placement
// resolver, internal/pinboard/placement, stores a route: a handle of the
// session holding the placement, and its epoch) with a TTL, a bounded size and an invalidation guard. It
// caches nothing else (sessions live in the resolver). It sits in front of
// the store, so that a proxied request in steady state costs no Redis round
// trip, and it is kept honest by the store's invalidations (rueidis
// client-side caching on Redis, direct calls with the in-memory store).
//
// # The second-level-cache race and how it is closed
//
// A reader misses, reads the store, and inserts what it read. If the value
// changes in the store and the invalidation for it is processed between the
// read and the insert, a naive cache would insert the old value after the
// invalidation and keep it until its TTL (Lettuce had exactly this bug,
// redis/lettuce#3481). Every shard therefore carries an invalidation
// sequence number: a reader captures it with Begin before reading the store,
// and Put inserts only if no invalidation touched that shard since. An
// invalidation of everything (InvalidateAll, used on connection loss and
// FLUSHALL) bumps every shard. A Put that loses this race is simply dropped:
// the next request misses again.
//
// # Keys
//
// The cache keeps no names, only two 64-bit hashes of each under seeds
// drawn when it is made: the first is the entry's key in its shard's table
// (Robin Hood open addressing, kept 70–87.5 % full, so that an entry costs
// about 65 bytes where a Go map of names cost 140 of heap;
// BenchmarkEntryMemory), the second is kept in the entry and compared on
// every read. A name is served another name's value only if both hashes
// collide: with n entries cached, a probability of at most n/2^128 per
// lookup (about 3·10^-33 at a million entries), far below that of a
// hardware fault. Two names that share only the key simply evict each
// other. Forgetting is always allowed, so Invalidate drops whatever
// entry holds the name's key.
//
// # Memory
//
// When V holds no pointers (the resolver's routes do not), a shard's table
// of 64 KiB or more lives in an anonymous mapping of its own outside the
// Go heap (slots.go), unmapped as soon as the table outgrows it, and when
// the Cache is unreachable (a runtime cleanup; there is no Close, so no
// Get can ever read an unmapped table). A million entries are then about
// 65 MB of tables that the collector neither scans nor counts: on the
// heap, as the bulk of the live heap, they let the heap grow to twice
// their size before each cycle (GOGC), with the arrays outgrown meanwhile
// as garbage. Stats.TableBytes (pinned_placecache_table_bytes) is the
// tables' size either way. Values with pointers keep their tables on the
// heap.
//
// # Invariants
//
//   - GetAhead (Config.RefreshAhead) hands out at most one refresh per
//     entry (none for an entry whose slot in the refresh table another
//     name took meanwhile); a refresh is an ordinary Begin, store read and
//     Put, so the invariants below hold for it as for a miss.
//   - Get, GetAhead and Peek never allocate and take only their shard's
//     read lock; no lock or counter is shared by all requests (counters
//     live in the shards and are summed when metrics are written; the
//     refresh table is touched only by entries due for a refresh). Get
//     and GetAhead count a hit or a miss; Peek, a second look after a Get
//     missed, counts nothing.
//   - An entry is never returned after an Invalidate/InvalidateAll that
//     completed before the Get started, and never returned once older than
//     Config.TTL (the safety net when an invalidation is lost; keep it at or
//     below the lease), nor, for PutUntil, after its until: a value a cache
//     below served from its own memory is not made younger here.
//   - Put after an invalidation of the same shard that happened after the
//     matching Begin is refused.
//   - Size is bounded by Config.MaxEntries (rounded up to a multiple of the
//     shard count); inserting into a full shard evicts an arbitrary entry of
//     that shard, expired entries first when one is found cheaply.
package placecache
