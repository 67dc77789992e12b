package placecache

import (
	"reflect"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A table's slots live outside the Go heap when its entries hold no
// pointers and the slots take at least offHeapMin bytes: an anonymous
// mapping of their own, returned to the system (munmap) as soon as the
// table has grown out of it. On the heap, a cache of a million entries was
// most of the live heap, so the collector let the heap grow to twice it
// before a cycle (GOGC 100), and each shard's growth left its old slots
// behind as garbage until then: about 1.8 times the slots' size in RSS.
// Off the heap the slots are their own size, the collector neither scans
// nor paces by them, and an outgrown array is gone at once.
//
// Invariants: an off-heap array holds no Go pointer (the collector cannot
// see into it): only entry types for which pointerFree holds go there. An
// array is unmapped only by the table that owns it, under its shard's
// lock, when it grows (the old array, after copying) or when the cache is
// unreachable (the cleanup New registers); no slice of it is kept anywhere
// else, and nothing reads a table without that lock.

// offHeapMin is the smallest slot array mapped outside the heap: below it
// a page-rounded mapping of its own costs more than the heap's overhead.
const offHeapMin = 64 << 10

// pointerFree reports whether values of t contain no pointers (so they may
// live in memory the collector does not scan).
func pointerFree(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
		return true
	case reflect.Array:
		return t.Len() == 0 || pointerFree(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if !pointerFree(t.Field(i).Type) {
				return false
			}
		}
		return true
	}
	return false
}

// newSlots returns n empty slots, mapped outside the heap when offHeap
// allows and they are large enough; mapped says whether they were (a
// failed mapping falls back to the heap).
func newSlots[E any](n int, offHeap bool) (slots []slot[E], mapped bool) {
	size := uintptr(n) * unsafe.Sizeof(slot[E]{})
	if !offHeap || size < offHeapMin {
		return make([]slot[E], n), false
	}
	p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]slot[E], n), false
	}
	return unsafe.Slice((*slot[E])(p), n), true
}

// unmapSlots returns slots that newSlots mapped to the system. Nothing may
// use them afterwards.
func unmapSlots[E any](s []slot[E]) {
	if len(s) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(&s[0]), uintptr(len(s))*unsafe.Sizeof(slot[E]{}))
	}
}

// slotsBytes is the size of the slot array of a table of n slots.
func slotsBytes[E any](n int) uint64 {
	return uint64(n) * uint64(unsafe.Sizeof(slot[E]{}))
}
