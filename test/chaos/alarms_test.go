package chaos

import (
	"testing"
	"time"

	"github.com/pinned-go/pinned/internal/testkit/chaoscheck"
)

// alarmDrain bounds the wait for the client's last alarms: their delay
// (1 s), plus a claim left by a killed pinboard (30 s), plus a failover.
const alarmDrain = 45 * time.Second

// awaitAlarms waits, once the client has stopped, until every alarm it set
// has run (or a Redis restart lost it), bounded by within; the checker then
// requires every other one to have run.
func (c *cluster) awaitAlarms(t testing.TB, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n := chaoscheck.UnrunAlarms(c.events())
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Logf("%d alarms still unrun %v after the client stopped", n, within)
			return
		}
		time.Sleep(250 * time.Millisecond) // the workers' histories are other processes' files
	}
}
