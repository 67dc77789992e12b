//go:build !race

package placecache

// raceEnabled: the race detector maps shadow memory of its own, which
// blurs the process's anonymous memory that TestTablesLiveOffHeap reads.
const raceEnabled = false
