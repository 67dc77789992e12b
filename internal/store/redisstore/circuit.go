package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"

	"github.com/pinned-go/pinned/internal/store"
)

// Defaults of the circuit (Config.CircuitProbeInterval and
// Config.CircuitProbeTimeout).
const (
	// DefaultCircuitProbeInterval is how often the prober pings Redis while
	// the circuit is open: the longest a recovered Redis waits before calls
	// go through again.
	DefaultCircuitProbeInterval = 250 * time.Millisecond
	// DefaultCircuitProbeTimeout bounds one probe. A Redis slower than this
	// to answer a PING counts as down; it is well above the latency of a
	// loaded Redis (milliseconds) so that a slow one keeps serving.
	DefaultCircuitProbeTimeout = time.Second
)

// circuit makes the store fail fast while Redis is known to be down. A
// call that fails for a reason Redis itself may cause (an I/O error, a
// connection refused, the caller's deadline passing while Redis was being
// waited for, a node that cannot take writes) kicks the prober; the prober
// pings Redis, and when the ping fails too the circuit opens: every call
// from then on returns store.ErrUnavailable at once, without a command,
// until a ping succeeds again (the prober pings every probe interval). The
// prober is one goroutine owned by the store: started by Connect, stopped
// and waited for by Close.
type circuit struct {
	interval, timeout time.Duration
	disabled          bool

	open atomic.Bool   // read on every call
	kick chan struct{} // 1-slot: a call failed, probe now

	mu     sync.Mutex
	since  time.Time // when it opened
	reason error     // the probe's error that opened it
	done   chan struct{}

	openGauge *metrics.Gauge
	trips     *metrics.Counter
	fast      *metrics.Counter
}

func newCircuit(interval, timeout time.Duration, set *metrics.Set) *circuit {
	c := &circuit{
		interval: interval,
		timeout:  timeout,
		disabled: interval < 0,
		kick:     make(chan struct{}, 1),
		trips:    set.NewCounter("pinned_store_circuit_trips_total"),
		fast:     set.NewCounter("pinned_store_fast_failures_total"),
	}
	c.openGauge = set.NewGauge("pinned_store_circuit_open", func() float64 {
		if c.open.Load() {
			return 1
		}
		return 0
	})
	return c
}

// refuse returns the error of a call made while the circuit is open, or nil.
func (c *circuit) refuse() error {
	if !c.open.Load() {
		return nil
	}
	c.fast.Inc()
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Errorf("%w: redis unreachable since %s (failing fast, probing every %v): %v",
		store.ErrUnavailable, c.since.Format(time.RFC3339Nano), c.interval, c.reason)
}

// suspect asks the prober to check Redis now (it never blocks).
func (c *circuit) suspect() {
	if c.disabled {
		return
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// start runs the prober on its own goroutine until closing is closed.
func (s *Store) startProber() {
	c := s.circuit
	if c.disabled {
		return
	}
	c.mu.Lock()
	if c.done != nil {
		c.mu.Unlock()
		return
	}
	c.done = make(chan struct{})
	c.mu.Unlock()
	go s.probe(c.done)
}

// stopProber waits for the prober (Close has closed s.closing).
func (s *Store) stopProber() {
	c := s.circuit
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done != nil {
		<-done
	}
}

// probe is the prober: it waits for a kick, then pings until Redis answers,
// opening the circuit on the first failed ping and closing it on the first
// successful one.
func (s *Store) probe(done chan struct{}) {
	defer close(done)
	c := s.circuit
	for {
		select {
		case <-s.closing:
			return
		case <-c.kick:
		}
		for {
			err := s.pingOnce()
			if err == nil {
				if c.open.CompareAndSwap(true, false) {
					c.mu.Lock()
					down := time.Since(c.since)
					c.mu.Unlock()
					s.log.Info("redis reachable again; calls go through", "down", down.Round(time.Millisecond))
				}
				break
			}
			if !c.open.Load() {
				c.mu.Lock()
				c.since, c.reason = time.Now(), err
				c.mu.Unlock()
				c.open.Store(true)
				c.trips.Inc()
				s.log.Warn("redis unreachable; failing fast until a probe succeeds", "err", err, "probeEvery", c.interval)
			} else {
				c.mu.Lock()
				c.reason = err
				c.mu.Unlock()
			}
			t := time.NewTimer(c.interval)
			select {
			case <-s.closing:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// pingOnce sends one PING bounded by the probe timeout.
func (s *Store) pingOnce() error {
	cl := s.client.Load()
	if cl == nil {
		return nil // closed meanwhile: nothing to probe
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.circuit.timeout)
	defer cancel()
	return cl.Do(ctx, cl.B().Ping().Build()).Error()
}

// unavailableReply reports whether a Redis error reply means the node
// cannot serve now (a replica after a failover, a node loading its data, a
// cluster or a primary that is down, a slot in migration): a temporary
// condition, store.ErrUnavailable, not a bug.
func unavailableReply(e *rueidis.RedisError) bool {
	if e.IsLoading() || e.IsTryAgain() || e.IsClusterDown() {
		return true
	}
	msg := e.Error()
	for _, p := range []string{"READONLY", "MASTERDOWN", "NOREPLICAS"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
