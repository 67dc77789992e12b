package alarm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/logthrottle"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// Deliverer sends one due alarm to the worker holding (namespace, id), as
// POST /<namespace>/<id>/_pinned/alarm with the alarm in wire.HeaderAlarm,
// placing and activating the id like any request.
//
// It returns the worker's (or the proxy's) status; a non-2xx status may
// come with an error describing the answer (for dead letters). status 0
// means no answer: err then wraps ErrNotDelivered when the request provably
// reached no worker (none serves the namespace, none could be connected
// to), and anything else (a timeout after sending) leaves the outcome
// unknown. A 503 must mean that no handler ran (the host answers an abort
// under the alarm handler with 500, not 503 aborted).
type Deliverer interface {
	Deliver(ctx context.Context, namespace, id string, alarm wire.AlarmDelivery) (status int, err error)
}

// ErrNotDelivered is wrapped by a Deliverer's error when the alarm reached
// no worker: the delivery is retried without counting an attempt.
var ErrNotDelivered = errors.New("alarm not delivered")

// Defaults of Config fields left zero.
const (
	DefaultPollInterval          = time.Second
	DefaultClaim                 = 30 * time.Second
	DefaultDeliveryTimeout       = 10 * time.Second
	DefaultStoreTimeout          = 2 * time.Second
	DefaultConcurrency           = 64
	DefaultBatch                 = 100
	DefaultUnavailableBackoff    = 250 * time.Millisecond
	DefaultUnavailableBackoffMax = 5 * time.Second
	DefaultMaxDeadLetters        = 1000
	// pauseAfter is how many consecutive deliveries must find no worker
	// before the scheduler stops claiming and only probes.
	pauseAfter = 3
)

// Config configures a Scheduler.
type Config struct {
	// Store holds the alarms. Required.
	Store store.Alarms
	// Deliverer sends due alarms. Required.
	Deliverer Deliverer
	// Clock is the scheduler's clock (alarm times are its wall time); nil
	// means clock.Real.
	Clock clock.Clock
	// Logger is tagged logger=pinned.alarm; nil means slog.Default().
	Logger *slog.Logger
	// Metrics receives the scheduler's metrics; nil means a new set.
	Metrics *metrics.Set
	// PollInterval bounds how long a shard goes unclaimed: alarms set
	// through another pinboard, or left by one that died, are found within
	// it. Alarms set through this pinboard's registry are found at once
	// (Nudge). Zero means DefaultPollInterval.
	PollInterval time.Duration
	// Claim is how long a claimed alarm stays invisible to every other
	// claim while it is delivered: a pinboard that dies leaves it due again
	// a Claim later. It must exceed DeliveryTimeout plus StoreTimeout, so
	// that no live pinboard's claim ends while it still delivers. Zero
	// means DefaultClaim.
	Claim time.Duration
	// DeliveryTimeout bounds one delivery. Zero means
	// DefaultDeliveryTimeout.
	DeliveryTimeout time.Duration
	// StoreTimeout bounds each store call. Zero means DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Concurrency bounds the deliveries in flight; alarms are claimed only
	// when a delivery slot is free. Zero means DefaultConcurrency.
	Concurrency int
	// Batch bounds the alarms one claim takes. Zero means DefaultBatch.
	Batch int
	// UnavailableBackoff and UnavailableBackoffMax bound the wait after a
	// delivery that found no worker (doubled per such delivery of one
	// alarm), and the pause of all claims while every delivery finds none
	// (doubled per failed probe). Zero means the defaults.
	UnavailableBackoff, UnavailableBackoffMax time.Duration
	// MaxDeadLetters is how many dead letters each shard keeps (the
	// newest). Zero means DefaultMaxDeadLetters.
	MaxDeadLetters int
}

func (c Config) withDefaults() (Config, error) {
	if c.Store == nil || c.Deliverer == nil {
		return c, errors.New("alarm: Config.Store and Config.Deliverer are required")
	}
	return c.settings()
}

// CheckSettings validates c's settings (everything but Store and
// Deliverer) as New would, so that a configuration error is reported
// before anything starts.
func CheckSettings(c Config) error {
	_, err := c.settings()
	return err
}

// settings validates the settings and fills in their defaults.
func (c Config) settings() (Config, error) {
	for name, v := range map[string]int64{
		"PollInterval": int64(c.PollInterval), "Claim": int64(c.Claim), "DeliveryTimeout": int64(c.DeliveryTimeout),
		"StoreTimeout": int64(c.StoreTimeout), "Concurrency": int64(c.Concurrency), "Batch": int64(c.Batch),
		"UnavailableBackoff": int64(c.UnavailableBackoff), "UnavailableBackoffMax": int64(c.UnavailableBackoffMax),
		"MaxDeadLetters": int64(c.MaxDeadLetters),
	} {
		if v < 0 {
			return c, fmt.Errorf("alarm: Config.%s is negative; use 0 for the default", name)
		}
	}
	c.Clock = clock.Or(c.Clock)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Metrics == nil {
		c.Metrics = metrics.NewSet()
	}
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.Claim = cmp.Or(c.Claim, DefaultClaim)
	c.DeliveryTimeout = cmp.Or(c.DeliveryTimeout, DefaultDeliveryTimeout)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, DefaultStoreTimeout)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.UnavailableBackoff = cmp.Or(c.UnavailableBackoff, DefaultUnavailableBackoff)
	c.UnavailableBackoffMax = cmp.Or(c.UnavailableBackoffMax, DefaultUnavailableBackoffMax)
	c.MaxDeadLetters = cmp.Or(c.MaxDeadLetters, DefaultMaxDeadLetters)
	if c.Claim <= c.DeliveryTimeout+c.StoreTimeout {
		return c, fmt.Errorf("alarm: Claim %v must exceed DeliveryTimeout %v plus StoreTimeout %v: a claim must outlast its delivery", c.Claim, c.DeliveryTimeout, c.StoreTimeout)
	}
	if c.UnavailableBackoffMax < c.UnavailableBackoff {
		return c, fmt.Errorf("alarm: UnavailableBackoffMax %v is below UnavailableBackoff %v", c.UnavailableBackoffMax, c.UnavailableBackoff)
	}
	if c.Batch > 1000 {
		return c, fmt.Errorf("alarm: Batch %d is above 1000 (one claim script handles at most that many)", c.Batch)
	}
	return c, nil
}

// Scheduler claims due alarms from the store and delivers them. Create it
// with New, run it with Run (once), and call Nudge when an alarm is set.
type Scheduler struct {
	cfg   Config
	st    store.Alarms
	d     Deliverer
	clock clock.Clock
	log   *slog.Logger
	m     *schedMetrics

	slots chan struct{} // one per delivery in flight
	wake  chan struct{} // nudges the loop (buffered 1)

	mu sync.Mutex
	// next is when each shard is claimed next (unix ms); math.MaxInt64
	// while a claim of it is in progress.
	next       [wire.AlarmShards]int64
	unavail    int   // consecutive deliveries that found no worker
	pauseLen   int64 // current pause of all claims (ms), 0 while healthy
	pauseUntil int64 // no claim before (unix ms)
	probing    bool  // a probe delivery is in flight
	offset     int   // shard the next pass starts with (fairness)

	storeLog, deadLog logthrottle.Every
	running           atomic.Bool
}

// New validates cfg and returns a Scheduler. It does no I/O and starts no
// goroutine.
func New(cfg Config) (*Scheduler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		cfg:      cfg,
		st:       cfg.Store,
		d:        cfg.Deliverer,
		clock:    cfg.Clock,
		log:      cfg.Logger.With("logger", "pinned.alarm"),
		m:        newSchedMetrics(cfg.Metrics),
		slots:    make(chan struct{}, cfg.Concurrency),
		wake:     make(chan struct{}, 1),
		storeLog: logthrottle.Every{Interval: 10 * time.Second},
		deadLog:  logthrottle.Every{Interval: time.Second},
	}
	s.m.inFlight = cfg.Metrics.NewGauge("pinned_alarm_deliveries_in_flight", func() float64 { return float64(len(s.slots)) })
	return s, nil
}

// Metrics returns the set holding the scheduler's metrics.
func (s *Scheduler) Metrics() *metrics.Set { return s.cfg.Metrics }

// Nudge tells the scheduler that shard holds an alarm due at dueMs (unix
// ms): it claims that shard then at the latest. Safe for concurrent use;
// it never blocks.
func (s *Scheduler) Nudge(shard int, dueMs int64) {
	if shard < 0 || shard >= wire.AlarmShards {
		return
	}
	s.mu.Lock()
	if dueMs < s.next[shard] {
		s.next[shard] = dueMs
	}
	s.mu.Unlock()
	s.poke()
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Scheduler) nowMs() int64 { return s.clock.Now().UnixMilli() }

// Run claims and delivers until ctx ends, then waits for the deliveries in
// flight (each bounded by DeliveryTimeout and StoreTimeout) and returns
// nil. Every goroutine it starts has ended when it returns. Run may be
// called once.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("alarm: Scheduler.Run called twice")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	s.log.Info("alarm scheduler started", "shards", wire.AlarmShards, "poll", s.cfg.PollInterval, "claim", s.cfg.Claim, "concurrency", s.cfg.Concurrency)
	for ctx.Err() == nil {
		wait := s.pass(ctx, &wg)
		t := s.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C():
		case <-s.wake:
		}
		t.Stop()
	}
	return nil
}

// pass claims every shard that is due, as far as delivery slots allow,
// starts the deliveries, and returns how long the loop may sleep.
func (s *Scheduler) pass(ctx context.Context, wg *sync.WaitGroup) time.Duration {
	now := s.nowMs()
	wakeAt := now + s.cfg.PollInterval.Milliseconds()
	s.mu.Lock()
	start := s.offset
	s.offset = (s.offset + 1) % wire.AlarmShards
	s.mu.Unlock()
	for i := range wire.AlarmShards {
		if ctx.Err() != nil {
			break
		}
		shard := (start + i) % wire.AlarmShards
		s.mu.Lock()
		probe := s.pauseLen > 0
		if probe && s.probing {
			s.mu.Unlock()
			break // the probe's end pokes the loop
		}
		if probe && now < s.pauseUntil {
			wakeAt = min(wakeAt, s.pauseUntil)
			s.mu.Unlock()
			break
		}
		due := s.next[shard] <= now
		if !due {
			wakeAt = min(wakeAt, s.next[shard])
			s.mu.Unlock()
			continue
		}
		free := cap(s.slots) - len(s.slots)
		if free == 0 {
			s.mu.Unlock()
			break // a finished delivery pokes the loop
		}
		limit := min(s.cfg.Batch, free)
		if probe {
			limit = 1
		}
		s.next[shard] = math.MaxInt64
		s.mu.Unlock()

		claimed, nextDue := s.claim(shard, now, limit)
		nxt := now + s.cfg.PollInterval.Milliseconds()
		switch {
		case claimed == nil && nextDue == math.MinInt64: // store error: retry after the poll interval
		case len(claimed) == limit && !probe:
			nxt = now // more may be due
		case nextDue >= 0 && nextDue < nxt:
			nxt = nextDue
		}
		s.mu.Lock()
		s.next[shard] = min(s.next[shard], nxt)
		wakeAt = min(wakeAt, s.next[shard])
		if probe && len(claimed) > 0 {
			s.probing = true
		}
		s.mu.Unlock()
		for _, c := range claimed {
			s.slots <- struct{}{} // never blocks: at most free were claimed
			wg.Go(func() { s.deliver(c, probe) })
		}
		if probe && len(claimed) > 0 {
			break // one probe at a time
		}
	}
	return time.Duration(max(wakeAt-s.nowMs(), 0)) * time.Millisecond
}

// claim runs one ClaimAlarms; on a store error it returns nil and
// math.MinInt64.
func (s *Scheduler) claim(shard int, now int64, limit int) ([]store.ClaimedAlarm, int64) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	defer cancel()
	claimed, next, err := s.st.ClaimAlarms(ctx, shard, now, s.cfg.Claim, limit)
	if err != nil {
		s.storeError("claim", err)
		return nil, math.MinInt64
	}
	s.m.claimed.Add(len(claimed))
	return claimed, next
}

func (s *Scheduler) storeError(op string, err error) {
	s.m.storeErrors.Inc()
	switch {
	case store.IsConnecting(err): // the pinboard has just started: nothing failed yet
		s.log.Debug("alarm store not connected yet; retrying", "op", op, "err", err)
	case s.storeLog.Allow():
		s.log.Error("alarm store call failed; retrying", "op", op, "err", err)
	}
}

// outcome classes of a delivery.
const (
	resultOK          = "ok"
	resultFailed      = "failed"
	resultUnavailable = "unavailable"
)

// classify says what a delivery's answer means for the alarm.
func classify(status int, err error) string {
	switch {
	case status >= 200 && status < 300:
		return resultOK
	case status == 503, status == 0 && errors.Is(err, ErrNotDelivered):
		return resultUnavailable
	}
	return resultFailed
}

// describe is a dead letter's Error: the status and what the answer said,
// or the transport error.
func describe(status int, err error) string {
	msg := ""
	if err != nil {
		msg = err.Error()
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
	}
	if status == 0 {
		return msg
	}
	if msg == "" {
		return fmt.Sprintf("HTTP %d", status)
	}
	return fmt.Sprintf("HTTP %d: %s", status, msg)
}

// deliver sends one claimed alarm and applies the outcome to the store.
func (s *Scheduler) deliver(c store.ClaimedAlarm, probe bool) {
	defer func() {
		<-s.slots
		s.poke()
	}()
	start := s.nowMs()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DeliveryTimeout)
	status, err := s.d.Deliver(ctx, c.Namespace, c.ID, c.Alarm.Delivery())
	cancel()
	now := s.nowMs()
	result := classify(status, err)
	s.m.deliveries[result].Inc()
	var (
		next *wire.Alarm
		due  int64
		dead *wire.DeadAlarm
	)
	switch result {
	case resultOK:
		s.m.lateness.Update(float64(max(start-c.Alarm.AtMs, 0)) / 1000)
		if n, ok := c.Alarm.AfterSuccess(now); ok {
			next, due = &n, n.AtMs
		}
	case resultUnavailable:
		n, d := c.Alarm.AfterUnavailable(now, s.cfg.UnavailableBackoff.Milliseconds(), s.cfg.UnavailableBackoffMax.Milliseconds(), 0)
		next, due = &n, d
	default:
		n, d, isDead, keep := c.Alarm.AfterFailure(now)
		if keep {
			next, due = &n, d
		}
		if isDead {
			dead = &wire.DeadAlarm{Namespace: c.Namespace, ID: c.ID, Alarm: c.Alarm, DeadAtMs: now, Error: describe(status, err)}
			dead.Alarm.Failures++
		}
	}
	s.health(result, status, probe, now)
	ctx, cancel = context.WithTimeout(context.Background(), s.cfg.StoreTimeout)
	ok, ferr := s.st.FinishAlarm(ctx, c, next, due, dead, s.cfg.MaxDeadLetters)
	cancel()
	switch {
	case ferr != nil:
		// The alarm comes back when its claim ends: at least once.
		s.storeError("finish", ferr)
		return
	case !ok:
		s.m.stale.Inc() // set again or deleted while it was delivered
		return
	}
	if dead != nil {
		s.m.dead.Inc()
		if s.deadLog.Allow() {
			s.log.Warn("alarm dead-lettered: its last attempt failed", "namespace", c.Namespace, "instance", c.ID, "alarm", c.Alarm.Name,
				"scheduled", time.UnixMilli(c.Alarm.AtMs).UTC(), "attempts", dead.Alarm.Failures, "error", dead.Error)
		}
	}
	if next != nil {
		s.Nudge(wire.AlarmShard(wire.PlacementName(c.Namespace, c.ID)), due)
	}
}

// health updates the pause of all claims: consecutive deliveries that find
// no worker pause claiming (doubling per failed probe, up to
// UnavailableBackoffMax) and leave one probe delivery per pause; any
// answer from a worker ends the pause.
func (s *Scheduler) health(result string, status int, probe bool, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if probe {
		s.probing = false
	}
	if result != resultUnavailable {
		if status != 0 && s.pauseLen > 0 {
			s.log.Info("alarm deliveries reach workers again; claiming resumes")
		}
		if status != 0 {
			s.unavail, s.pauseLen, s.pauseUntil = 0, 0, 0
		}
		return
	}
	s.unavail++
	if s.unavail < pauseAfter {
		return
	}
	switch {
	case s.pauseLen == 0:
		s.pauseLen = s.cfg.UnavailableBackoff.Milliseconds()
		s.log.Warn("alarm deliveries find no worker; claiming paused, probing", "pause", time.Duration(s.pauseLen)*time.Millisecond)
	case probe:
		s.pauseLen = min(2*s.pauseLen, s.cfg.UnavailableBackoffMax.Milliseconds())
	}
	s.pauseUntil = max(s.pauseUntil, now+s.pauseLen)
}
