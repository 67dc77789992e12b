//go:build !race

package placecache

import "testing"

func TestGetDoesNotAllocate(t *testing.T) {
	c, _ := New[string](Config{})
	n := []byte("/counter/abc")
	c.Put(n, "s", c.Begin(n))
	if a := testing.AllocsPerRun(1000, func() {
		if _, ok := c.Get(n, c.Now()); !ok {
			t.Fatal("miss")
		}
	}); a != 0 {
		t.Fatalf("Get allocates %v times per hit", a)
	}
	ca, _ := New[string](Config{RefreshAhead: DefaultTTL})
	ca.Put(n, "s", ca.Begin(n))
	if a := testing.AllocsPerRun(1000, func() {
		if _, ok, _ := ca.GetAhead(n, ca.Now()); !ok {
			t.Fatal("miss")
		}
	}); a != 0 {
		t.Fatalf("GetAhead allocates %v times per hit (refresh due)", a)
	}
	miss := []byte("/counter/none")
	if a := testing.AllocsPerRun(1000, func() { c.Get(miss, c.Now()); c.Peek(miss, c.Now()); c.Begin(miss) }); a != 0 {
		t.Fatalf("Get+Peek+Begin allocate %v times per miss", a)
	}
}
