//go:build !race

package worker

import (
	"testing"

	"github.com/pinned-go/pinned/clock"
)

func TestAdmitDoesNotAllocate(t *testing.T) {
	w := newLeasedWorker(t, clock.Real{})
	secret, session, wrong := w.secret, []byte("s1"), []byte("nope")
	f := func(name string, secret, session []byte) {
		t.Helper()
		if n := testing.AllocsPerRun(1000, func() { w.Admit(secret, session) }); n != 0 {
			t.Errorf("Admit(%s) allocates %v times per call; want 0", name, n)
		}
	}
	f("ok", secret, session)
	f("ok without session", secret, nil)
	f("forbidden", wrong, session)
	f("other session", secret, wrong)
}
