//go:build !race

package registry

import (
	"net"
	"net/netip"
	"testing"

	"github.com/pinned-go/pinned/clock"
)

// Every authenticated call (heartbeats included) checks the failed-auth
// bucket of its client: that check must not allocate.
func TestAuthLimitCheckDoesNotAllocate(t *testing.T) {
	tab := newLimiterTable[netip.Addr](DefaultAuthFailureLimit, 16, clock.Real{})
	for _, s := range []string{"10.1.2.3", "2001:db8::7"} {
		ip := net.ParseIP(s)
		tab.spend(clientKey(ip))
		if n := testing.AllocsPerRun(100, func() { tab.blocked(clientKey(ip)) }); n != 0 {
			t.Errorf("blocked(clientKey(%s)) allocates %v times; want 0", s, n)
		}
	}
}
