package placement

import "github.com/pinned-go/pinned/internal/store"

// Tiers of eligible sessions, best first. A session with room is preferred
// to one without (headroom 0 gets no new placements while another
// eligible worker has room); within that, one that did not just refuse or
// fail a request (Refused, within AvoidFor) is preferred.
const (
	tierRoom = iota
	tierRoomAvoided
	tierFull
	tierFullAvoided
	tiers
)

// choose picks the session for a new placement among live: eligible are the
// sessions that are verified, not superseded, not draining, not exclude
// (a holder found gone) and have a usable advertise URL; among the best non-empty tier it takes two at random and
// keeps the one with more headroom (power of two choices, which spreads a
// burst of new ids without herding onto the roomiest worker, whose headroom
// the store only learns at its next heartbeat). The headroom used is the
// heartbeat's minus the placements this resolver made on the session since.
// It returns -1 when no session is eligible.
func (r *Resolver) choose(live []store.Session, exclude string) int {
	now := r.clock.Now()
	var (
		byTier [tiers][]int
		room   = make([]int, len(live))
	)
	r.mu.Lock()
	for i := range live {
		s := &live[i]
		if !s.Verified || s.Superseded || s.Draining || s.ID == exclude {
			continue
		}
		if _, bad := r.unusable[s.ID]; bad {
			continue
		}
		if _, dead := r.dead[s.ID]; dead {
			continue
		}
		room[i] = max(0, s.Headroom)
		avoided := false
		if e := r.sessions[s.ID]; e != nil {
			if s.LastHeartbeat > e.hb {
				// A newer heartbeat: its headroom counts our placements.
				e.hb, e.placed = s.LastHeartbeat, 0
			}
			room[i] = max(0, room[i]-e.placed)
			avoided = r.cfg.AvoidFor > 0 && !e.refused.IsZero() && now.Sub(e.refused) < r.cfg.AvoidFor
		}
		t := tierRoom
		if room[i] == 0 {
			t = tierFull
		}
		if avoided {
			t++
		}
		byTier[t] = append(byTier[t], i)
	}
	r.mu.Unlock()
	for _, c := range byTier {
		switch len(c) {
		case 0:
			continue
		case 1:
			return c[0]
		}
		a := int(r.cfg.Rand(int64(len(c))))
		b := int(r.cfg.Rand(int64(len(c) - 1)))
		if b >= a {
			b++
		}
		if room[c[b]] > room[c[a]] {
			return c[b]
		}
		return c[a]
	}
	return -1
}
