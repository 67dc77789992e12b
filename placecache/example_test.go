package placecache_test

import (
	"fmt"

	"github.com/pinned-go/pinned/placecache"
)

// A read-through cache in front of a store (here a map), with the
// Begin/Put guard that keeps a value read before an invalidation from
// being cached after it.
func Example() {
	store := map[string]string{"/counter/alice": "session-1"}
	cache, err := placecache.New[string](placecache.Config{Name: "example"})
	if err != nil {
		panic(err)
	}
	lookup := func(name string) string {
		if v, ok := cache.Get([]byte(name), cache.Now()); ok {
			return v + " (cached)"
		}
		t := cache.Begin([]byte(name)) // before reading the store
		v := store[name]
		cache.Put([]byte(name), v, t)
		return v + " (from the store)"
	}
	fmt.Println(lookup("/counter/alice"))
	fmt.Println(lookup("/counter/alice"))

	// The placement moves; the store's invalidation reaches the cache.
	store["/counter/alice"] = "session-2"
	cache.Invalidate("/counter/alice")
	fmt.Println(lookup("/counter/alice"))

	// A reader that read the store before an invalidation cannot cache
	// what it read: its Put is refused.
	t := cache.Begin([]byte("/counter/bob"))
	stale := "session-1"             // read from the store ...
	cache.Invalidate("/counter/bob") // ... and the value changed meanwhile
	fmt.Println("stale put stored:", cache.Put([]byte("/counter/bob"), stale, t))
	fmt.Printf("%+v\n", cache.Stats())
	// Output:
	// session-1 (from the store)
	// session-1 (cached)
	// session-2 (from the store)
	// stale put stored: false
	// {Hits:1 Misses:2 Invalidations:2 Evictions:0 RefusedPuts:1 Refreshes:0 Size:1 TableBytes:384}
}
