package pinboard

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/base/cmdline"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard/alarm"
	"github.com/pinned-go/pinned/internal/store"
)

// AlarmSettings are the alarm scheduler's settings (zero fields: the alarm
// package's defaults) and the per-instance cap of the registry.
type AlarmSettings struct {
	PollInterval, Claim, DeliveryTimeout      time.Duration
	UnavailableBackoff, UnavailableBackoffMax time.Duration
	Concurrency, Batch, MaxDeadLetters        int
	MaxAlarmsPerInstance                      int
}

// The alarm settings, each a flag and a variable (PINBOARD_ + the flag name
// in upper case with '_' for '-').
var alarmIntSettings = []struct {
	flag, usage string
	def         int
	field       func(*AlarmSettings) *int
}{
	{"alarm-concurrency", "alarm deliveries in flight per pinboard", alarm.DefaultConcurrency,
		func(a *AlarmSettings) *int { return &a.Concurrency }},
	{"alarm-batch", "most alarms one claim takes (at most 1000)", alarm.DefaultBatch,
		func(a *AlarmSettings) *int { return &a.Batch }},
	{"alarm-max-dead-letters", "dead letters kept per alarm shard (the newest)", alarm.DefaultMaxDeadLetters,
		func(a *AlarmSettings) *int { return &a.MaxDeadLetters }},
	{"max-alarms-per-instance", "alarms one instance may hold (409 beyond)", wire.DefaultMaxAlarmsPerInstance,
		func(a *AlarmSettings) *int { return &a.MaxAlarmsPerInstance }},
}

var alarmDurationSettings = []struct {
	flag, usage string
	def         time.Duration
	field       func(*AlarmSettings) *time.Duration
}{
	{"alarm-poll-interval", "longest time an alarm shard goes unclaimed (alarms set through another pinboard, or left by a dead one)", alarm.DefaultPollInterval,
		func(a *AlarmSettings) *time.Duration { return &a.PollInterval }},
	{"alarm-claim", "how long a claimed alarm is hidden from other pinboards; must exceed the delivery timeout plus 2s", alarm.DefaultClaim,
		func(a *AlarmSettings) *time.Duration { return &a.Claim }},
	{"alarm-delivery-timeout", "bound of one alarm delivery", alarm.DefaultDeliveryTimeout,
		func(a *AlarmSettings) *time.Duration { return &a.DeliveryTimeout }},
	{"alarm-unavailable-backoff", "first wait after an alarm delivery found no worker (doubled per such delivery)", alarm.DefaultUnavailableBackoff,
		func(a *AlarmSettings) *time.Duration { return &a.UnavailableBackoff }},
	{"alarm-unavailable-backoff-max", "longest such wait, and longest pause of all claims while no worker answers", alarm.DefaultUnavailableBackoffMax,
		func(a *AlarmSettings) *time.Duration { return &a.UnavailableBackoffMax }},
}

// declareAlarmSettings puts the alarm settings on set, writing into
// s.Alarms. A setting that is not given stays zero there (the default,
// which -h shows).
func declareAlarmSettings(set *cmdline.Set, s *Settings) {
	for _, l := range alarmIntSettings {
		def := l.def
		set.Var(cmdline.Parsed[int]{P: l.field(&s.Alarms), Parse: func(v string) (int, error) {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n <= 0 || n > 1<<30 {
				return 0, errors.New("want a positive number")
			}
			return n, nil
		}, Format: func(n int) string { return strconv.Itoa(cmp.Or(n, def)) }}, l.flag, limitEnv(l.flag), "int", l.usage)
	}
	for _, l := range alarmDurationSettings {
		def := l.def
		set.Var(cmdline.Parsed[time.Duration]{P: l.field(&s.Alarms), Parse: func(v string) (time.Duration, error) {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil || d <= 0 {
				return 0, errors.New("want a positive duration such as 5s")
			}
			return d, nil
		}, Format: func(d time.Duration) string { return cmp.Or(d, def).String() }}, l.flag, limitEnv(l.flag), "duration", l.usage)
	}
}

// check applies the scheduler's own checks (the claim against the
// timeouts, the batch, the backoffs), so that a bad combination is a
// configuration error before anything starts.
func (a AlarmSettings) check() error {
	if err := alarm.CheckSettings(a.config(alarm.Config{})); err != nil {
		return fmt.Errorf("alarm settings: %w", err)
	}
	return nil
}

// config fills the scheduler's settings into c.
func (a AlarmSettings) config(c alarm.Config) alarm.Config {
	c.PollInterval, c.Claim, c.DeliveryTimeout = a.PollInterval, a.Claim, a.DeliveryTimeout
	c.UnavailableBackoff, c.UnavailableBackoffMax = a.UnavailableBackoff, a.UnavailableBackoffMax
	c.Concurrency, c.Batch, c.MaxDeadLetters = a.Concurrency, a.Batch, a.MaxDeadLetters
	return c
}

// newAlarmScheduler builds the alarm scheduler when the store keeps alarms
// (both stores do); it delivers through the proxy (alarmdeliver.go), and its
// metrics go to the pinboard's own set.
func (p *Pinboard) newAlarmScheduler(root *slog.Logger) error {
	st, ok := p.st.(store.Alarms)
	if !ok {
		return nil
	}
	cfg := p.cfg.Alarms.config(alarm.Config{Store: st, Clock: p.clock, Logger: root, Metrics: p.own})
	cfg.Concurrency = cmp.Or(cfg.Concurrency, alarm.DefaultConcurrency)
	cfg.Deliverer = alarmDeliverer{px: p.dp.px}
	s, err := alarm.New(cfg)
	if err != nil {
		return fmt.Errorf("alarm settings: %w", err)
	}
	p.sched = s
	return nil
}

// nudgeAlarms is the registry's OnAlarmSet: the scheduler claims the shard
// by the alarm's due time.
func (p *Pinboard) nudgeAlarms(shard int, dueMs int64) {
	if p.sched != nil {
		p.sched.Nudge(shard, dueMs)
	}
}
