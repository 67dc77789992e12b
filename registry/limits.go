package registry

import (
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/time/rate"

	"github.com/pinned-go/pinned/clock"
)

// Limit is a token bucket: Events per Per on average, bursts of up to Burst.
// The zero Limit means "use the default" wherever a Limit is configured; a
// negative Events turns the limit off.
type Limit struct {
	Events int           // tokens added per Per; < 0: no limit
	Per    time.Duration // the refill period; 0 means one second
	Burst  int           // bucket size; 0 means max(Events, 1)
}

// Defaults of the registry's limits.
var (
	// DefaultRegisterIPLimit bounds registrations per client IP (an IPv6
	// client counts by its /64).
	DefaultRegisterIPLimit = Limit{Events: 5, Per: time.Second, Burst: 20}
	// DefaultRegisterTokenLimit bounds registrations per deployment token.
	// Every worker of a fleet shares the token, so it is looser than the
	// per-IP limit: a fleet of 100 restarting at once registers within a
	// few seconds.
	DefaultRegisterTokenLimit = Limit{Events: 20, Per: time.Second, Burst: 100}
	// DefaultAuthFailureLimit bounds failed authentications (wrong or
	// missing token) per client IP; beyond it every registry call from that
	// IP is answered 429 before its token is even looked at, so tokens
	// cannot be guessed faster.
	DefaultAuthFailureLimit = Limit{Events: 10, Per: time.Minute, Burst: 10}
)

// Other defaults of the hardening options.
const (
	// DefaultMaxTrackedClients is the default Config.MaxTrackedClients.
	DefaultMaxTrackedClients = 10_000
	// DefaultMaxSessionsPerToken is the default Config.MaxSessionsPerToken.
	DefaultMaxSessionsPerToken = 1024
	// DefaultNonceTTL is the default Config.NonceTTL.
	DefaultNonceTTL = 30 * time.Second
	// MaxNonceTTL is the longest Config.NonceTTL accepted.
	MaxNonceTTL = 30 * time.Second
)

// Off reports whether the limit is turned off.
func (l Limit) Off() bool { return l.Events < 0 }

// String formats the limit as the pinboard's flags take it: "N/PERIOD
// burst B", or "off".
func (l Limit) String() string {
	if l.Off() {
		return "off"
	}
	return fmt.Sprintf("%d/%v burst %d", l.Events, l.Per, l.Burst)
}

// withDefaults fills the zero fields of a configured limit.
func (l Limit) withDefaults(def Limit) Limit {
	if l == (Limit{}) {
		return def
	}
	if l.Off() {
		return l
	}
	if l.Per == 0 {
		l.Per = time.Second
	}
	if l.Burst == 0 {
		l.Burst = max(l.Events, 1)
	}
	return l
}

func (l Limit) validate(name string) error {
	switch {
	case l.Off():
		return nil
	case l.Events == 0:
		return fmt.Errorf("Config.%s allows 0 events: use a negative Events to turn it off", name)
	case l.Per < 0 || l.Burst < 0:
		return fmt.Errorf("Config.%s has a negative Per or Burst", name)
	}
	return nil
}

func (l Limit) rate() rate.Limit { return rate.Limit(float64(l.Events) / l.Per.Seconds()) }

// ParseLimit reads a limit written "N/PERIOD" with an optional
// " burst B" (PERIOD a Go duration, a bare unit meaning one of it:
// "5/s burst 20", "10/1m", "100/10s"), or "off".
func ParseLimit(s string) (Limit, error) {
	s = strings.TrimSpace(s)
	if s == "off" {
		return Limit{Events: -1}, nil
	}
	var l Limit
	spec, burst, hasBurst := strings.Cut(s, " burst ")
	n, per, ok := strings.Cut(strings.TrimSpace(spec), "/")
	if !ok {
		return l, fmt.Errorf("%q: want N/PERIOD (e.g. 5/s or 10/1m), optionally followed by \" burst B\", or off", s)
	}
	var err error
	if l.Events, err = strconv.Atoi(strings.TrimSpace(n)); err != nil || l.Events <= 0 {
		return l, fmt.Errorf("%q: the count must be a positive integer", s)
	}
	per = strings.TrimSpace(per)
	if per != "" && (per[0] < '0' || per[0] > '9') {
		per = "1" + per
	}
	if l.Per, err = time.ParseDuration(per); err != nil || l.Per <= 0 {
		return l, fmt.Errorf("%q: the period must be a positive duration such as s, 1m or 10s", s)
	}
	if hasBurst {
		if l.Burst, err = strconv.Atoi(strings.TrimSpace(burst)); err != nil || l.Burst <= 0 {
			return l, fmt.Errorf("%q: the burst must be a positive integer", s)
		}
	}
	return l.withDefaults(Limit{}), nil
}

// limiterTable keeps one token bucket per key (a client IP or a token id)
// in an LRU of bounded size: memory stays bounded whatever the number of
// clients, at the price that a key evicted by many newer ones starts again
// with a full bucket.
type limiterTable[K comparable] struct {
	lim   Limit
	clock clock.Clock
	mu    sync.Mutex
	lru   *simplelru.LRU[K, *rate.Limiter]
}

// newLimiterTable returns the table of a limit, or nil for a limit that is
// off (a nil table allows everything).
func newLimiterTable[K comparable](l Limit, size int, c clock.Clock) *limiterTable[K] {
	if l.Off() {
		return nil
	}
	lru, err := simplelru.NewLRU[K, *rate.Limiter](size, nil)
	if err != nil { // size > 0 is validated by New
		panic(err)
	}
	return &limiterTable[K]{lim: l, clock: c, lru: lru}
}

func (t *limiterTable[K]) get(key K) *rate.Limiter {
	l, ok := t.lru.Get(key)
	if !ok {
		l = rate.NewLimiter(t.lim.rate(), t.lim.Burst)
		t.lru.Add(key, l)
	}
	return l
}

// take spends one token of key's bucket. When the bucket is empty it spends
// nothing and returns how long until a token is available.
func (t *limiterTable[K]) take(key K) (ok bool, retry time.Duration) {
	if t == nil {
		return true, 0
	}
	now := t.clock.Now().Wall()
	t.mu.Lock()
	defer t.mu.Unlock()
	l := t.get(key)
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// blocked reports, without spending, whether key's bucket is empty, and
// how long until it holds a token again.
func (t *limiterTable[K]) blocked(key K) (bool, time.Duration) {
	if t == nil {
		return false, 0
	}
	now := t.clock.Now().Wall()
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.lru.Peek(key)
	if !ok {
		return false, 0
	}
	if tok := l.TokensAt(now); tok < 1 {
		return true, time.Duration((1 - tok) / float64(t.lim.rate()) * float64(time.Second))
	}
	return false, 0
}

// spend takes one token of key's bucket if it has one (a failure counted).
func (t *limiterTable[K]) spend(key K) {
	if t == nil {
		return
	}
	now := t.clock.Now().Wall()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.get(key).AllowN(now, 1)
}

// len returns the number of buckets kept (tests).
func (t *limiterTable[K]) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

// clientKey is the rate-limit key of a client address: the IPv4 address,
// or the first address of the /64 of an IPv6 one (one host usually holds a
// whole /64). It does not allocate.
func clientKey(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.Addr()
	}
	return a
}

// retryAfter is the Retry-After value (whole seconds, at least 1) for a wait.
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}
