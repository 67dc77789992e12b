package pinboard

import (
	"cmp"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/pinned-go/pinned/internal/alarm"
	"github.com/pinned-go/pinned/internal/placement"
	"github.com/pinned-go/pinned/internal/store"
	"github.com/pinned-go/pinned/internal/wire"
	"github.com/pinned-go/pinned/proxy"
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

// addAlarmFlags registers the alarm settings on fs; the returned function
// parses them into s.Alarms after fs.Parse. Only settings that were set
// are written.
func addAlarmFlags(fs *flag.FlagSet, getenv func(string) string, s *Settings) func() error {
	ints := make([]*string, len(alarmIntSettings))
	for i, l := range alarmIntSettings {
		name := limitEnv(l.flag)
		ints[i] = fs.String(l.flag, getenv(name), fmt.Sprintf("%s (default %d) (%s)", l.usage, l.def, name))
	}
	durs := make([]*string, len(alarmDurationSettings))
	for i, l := range alarmDurationSettings {
		name := limitEnv(l.flag)
		durs[i] = fs.String(l.flag, getenv(name), fmt.Sprintf("%s (default %v) (%s)", l.usage, l.def, name))
	}
	return func() error {
		for i, l := range alarmIntSettings {
			if v := strings.TrimSpace(*ints[i]); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n <= 0 || n > 1<<30 {
					return fmt.Errorf("%s=%q: want a positive number", limitEnv(l.flag), v)
				}
				*l.field(&s.Alarms) = n
			}
		}
		for i, l := range alarmDurationSettings {
			if v := strings.TrimSpace(*durs[i]); v != "" {
				d, err := time.ParseDuration(v)
				if err != nil || d <= 0 {
					return fmt.Errorf("%s=%q: want a positive duration such as 5s", limitEnv(l.flag), v)
				}
				*l.field(&s.Alarms) = d
			}
		}
		// The scheduler's own checks (claim vs timeouts, batch, backoffs),
		// reported as a configuration error before anything starts.
		if err := alarm.CheckSettings(s.Alarms.config(alarm.Config{})); err != nil {
			return fmt.Errorf("alarm settings: %w", err)
		}
		return nil
	}
}

// config fills the scheduler's settings into c.
func (a AlarmSettings) config(c alarm.Config) alarm.Config {
	c.PollInterval, c.Claim, c.DeliveryTimeout = a.PollInterval, a.Claim, a.DeliveryTimeout
	c.UnavailableBackoff, c.UnavailableBackoffMax = a.UnavailableBackoff, a.UnavailableBackoffMax
	c.Concurrency, c.Batch, c.MaxDeadLetters = a.Concurrency, a.Batch, a.MaxDeadLetters
	return c
}

// newAlarmScheduler builds the alarm scheduler when the store keeps alarms
// and the data plane has a placement resolver to deliver them through
// (alarmdeliver.go); its metrics go to the pinboard's own set.
func (p *Pinboard) newAlarmScheduler(root *slog.Logger) error {
	st, ok := p.st.(store.Alarms)
	rp, hasRes := p.dp.(interface{ Resolver() *placement.Resolver })
	if !ok || !hasRes {
		return nil
	}
	cfg := p.cfg.Alarms.config(alarm.Config{Store: st, Clock: p.clock, Logger: root, Metrics: p.own})
	cfg.Concurrency = cmp.Or(cfg.Concurrency, alarm.DefaultConcurrency)
	p.deliv = newAlarmDeliverer(rp.Resolver(), p.st, p.reg.DialControl, cfg.Concurrency, cmp.Or(p.cfg.Endpoint.DialTimeout, proxy.DefaultDialTimeout))
	cfg.Deliverer = p.deliv
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
