package bench

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/pinboard"
)

// ---- failover: a worker killed under load ----

// The failover suite kills (SIGKILL) a worker that holds N ids while every
// one of them is asked through the pinboard at a steady rate, and measures
// how long each id takes to be served again, what the clients got meanwhile
// and what Redis did. Two fleets, one per pinboard configuration (fast
// failover, the default, and lease-only: PINBOARD_FAST_FAILOVER=off), each
// with its own redis-server, pinboard and surviving worker, take turns in
// every round (fast, lease-only, fast, …); each turn starts a fresh victim
// process, places N new ids on it, and kills it under the load.

// FailoverOptions size the failover suite. A zero field takes its default.
type FailoverOptions struct {
	// IDs are the numbers of ids the killed worker holds, one measurement
	// each (default 100 and 10 000; smoke 20).
	IDs []int
	// Interval is how often each victim id is asked (default 100 ms),
	// unless Rate needs a longer one.
	Interval time.Duration
	// Rate caps the requests per second over all victim ids (default
	// 5 000): with N ids, each is asked every max(Interval, N ÷ Rate).
	Rate int
	// Within bounds one recovery, counted from the kill (default 1 min). It
	// must exceed the pinboard's lease, which bounds a lease-only recovery.
	Within time.Duration
	// InFlight bounds the measuring client's requests in flight and its
	// connections to the pinboard (default 1 024); a request due while all
	// are busy leaves late, and its schedule lag shows it.
	InFlight int
	// Timeout bounds one request of the measuring client (default 10 s).
	Timeout time.Duration
}

// The failover suite's defaults (FailoverOptions).
const (
	failoverInterval = 100 * time.Millisecond
	failoverRate     = 5000
	failoverWithin   = time.Minute
	failoverInFlight = 1024
	failoverTimeout  = 10 * time.Second
	// failoverSmokeIDs is the one size of a smoke run.
	failoverSmokeIDs = 20
)

func (f *FailoverOptions) defaults(smoke bool) {
	if len(f.IDs) == 0 {
		f.IDs = []int{100, 10_000}
		if smoke {
			f.IDs = []int{failoverSmokeIDs}
		}
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&f.Interval, failoverInterval)
	def(&f.Within, failoverWithin)
	def(&f.Timeout, failoverTimeout)
	if f.Rate == 0 {
		f.Rate = failoverRate
	}
	if f.InFlight == 0 {
		f.InFlight = failoverInFlight
	}
}

// Check names the first field that cannot work (Run calls it).
func (f *FailoverOptions) Check() error {
	for _, n := range f.IDs {
		if n < 1 {
			return fmt.Errorf("failover ids %d: want at least 1", n)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"interval", f.Interval}, {"within", f.Within}, {"timeout", f.Timeout}} {
		if d.v < 0 {
			return fmt.Errorf("failover %s %v: want a positive duration (0: the default)", d.name, d.v)
		}
	}
	for _, x := range []struct {
		name string
		v    int
	}{{"rate", f.Rate}, {"in flight", f.InFlight}} {
		if x.v < 0 {
			return fmt.Errorf("failover %s %d: want a positive number (0: the default)", x.name, x.v)
		}
	}
	return nil
}

// interval is how often each of n victim ids is asked.
func (f *FailoverOptions) interval(n int) time.Duration {
	return max(f.Interval, time.Duration(n)*time.Second/time.Duration(f.Rate))
}

// preKill is how long the load runs before the kill: every id is asked
// (and answered 200, which the report checks) at least once.
func preKill(interval time.Duration) time.Duration { return max(interval, time.Second) }

// FailoverRun is one kill of the failover suite: one configuration, one
// number of ids, one round. Times are milliseconds from the kill; a
// percentile is -1 when it falls on ids that were never served again
// within FailoverOptions.Within.
type FailoverRun struct {
	Config string `json:"config"` // "fast" or "lease-only"
	IDs    int    `json:"ids"`
	Round  int    `json:"round"`
	// IntervalMs is how often each id was asked.
	IntervalMs float64 `json:"intervalMs"`
	// Recovered counts the ids answered 200 to a request sent after the
	// kill; the recovery of an id is the time from the kill to the end of
	// that first 200.
	Recovered     int     `json:"recovered"`
	RecoveryP50Ms float64 `json:"recoveryP50Ms"`
	RecoveryP99Ms float64 `json:"recoveryP99Ms"`
	RecoveryMaxMs float64 `json:"recoveryMaxMs"`
	// FirstAskP50Ms and FirstAskMaxMs: when each id's first request after
	// the kill left, the floor under its recovery that the schedule sets.
	FirstAskP50Ms float64 `json:"firstAskP50Ms"`
	FirstAskMaxMs float64 `json:"firstAskMaxMs"`
	// Requests ended after the kill (in flight at the kill, or sent after
	// it); NotOK counts their non-2xx answers by "status reason"
	// (X-Pinned-Reason, "-" when none), NoAnswer those that got no HTTP
	// answer (by error in NoAnswerBy).
	Requests   int64            `json:"requests"`
	NotOK      map[string]int64 `json:"notOk,omitempty"`
	NoAnswer   int64            `json:"noAnswer"`
	NoAnswerBy map[string]int64 `json:"noAnswerBy,omitempty"`
	// PreKillNotOK counts requests that ended before the kill and were not
	// answered 200 (a fleet that was not serving every id).
	PreKillNotOK int64 `json:"preKillNotOk"`
	// RedisCommands is the INFO commandstats delta (INFO excluded) from just
	// before the kill to the end of the load, WindowSeconds long.
	RedisCommands  int64            `json:"redisCommands"`
	RedisByCommand map[string]int64 `json:"redisByCommand,omitempty"`
	WindowSeconds  float64          `json:"windowSeconds"`
	// DeathsProven and FastFailovers are the pinboard's
	// pinned_placement_death_probes_total{result="dead"} and
	// pinned_placement_fast_failovers_total over the window.
	DeathsProven  float64 `json:"deathsProven"`
	FastFailovers float64 `json:"fastFailovers"`
	// PinboardCPUMs is the pinboard's CPU over the window.
	PinboardCPUMs float64 `json:"pinboardCpuMs"`
	// The measuring client's own accuracy: how late its requests left
	// (every request of the load), its CPU per request and the cores it
	// kept busy over the load.
	LagP50Ms          float64 `json:"lagP50Ms"`
	LagP99Ms          float64 `json:"lagP99Ms"`
	LagMaxMs          float64 `json:"lagMaxMs"`
	ClientCPUUsPerReq float64 `json:"clientCpuUsPerRequest"`
	ClientCores       float64 `json:"clientCores"`
}

// failoverConfig is one pinboard configuration the suite compares.
type failoverConfig struct {
	name string // as reported
	env  string // the pinboard's setting
}

// failoverConfigs returns the configurations in the order of a round.
func failoverConfigs() []failoverConfig {
	return []failoverConfig{
		{"fast", pinboard.EnvFastFailover + "=on"},
		{"lease-only", pinboard.EnvFastFailover + "=off"},
	}
}

// failoverFleet is one configuration's processes: its own redis-server,
// pinboard and surviving worker, and the victim of the next kill.
type failoverFleet struct {
	cfg                               failoverConfig
	redis, pinboard, survivor, victim *proc
	victims                           int           // victims started so far
	lease                             time.Duration // the pinboard's, from its overview
	idleRate                          float64       // Redis commands per second without load
}

// failoverSuite starts both fleets, measures their idle Redis traffic, and
// kills a victim in each, alternately, for every size and round.
func (s *session) failoverSuite(ctx context.Context) error {
	fo := &s.o.Failover
	r, err := newRig(s.o, s.bins)
	if err != nil {
		return err
	}
	defer r.close()
	var fleets []*failoverFleet
	for _, c := range failoverConfigs() {
		f, err := startFailoverFleet(r, c)
		if err != nil {
			return err
		}
		if fo.Within <= f.lease {
			return fmt.Errorf("failover: the bound on a recovery (%v) must exceed the pinboard's lease (%v)", fo.Within, f.lease)
		}
		fleets = append(fleets, f)
	}
	// One lease of idle: a window that sees every periodic caller of Redis
	// (the workers' heartbeats, the janitor, the alarm scheduler's polls).
	idle := fleets[0].lease
	if s.o.Smoke {
		idle = time.Second
	}
	if err := measureIdle(ctx, fleets, idle); err != nil {
		return err
	}
	if s.o.Smoke {
		s.note("smoke: %d ids, one round; not the 100 and 10 000 ids of the full run", failoverSmokeIDs)
	}
	for _, n := range fo.IDs {
		for round := 1; round <= s.o.Rounds; round++ {
			for _, f := range fleets {
				run, err := s.failoverRun(ctx, r, f, n, round)
				if err != nil {
					return fmt.Errorf("%d ids %s round %d: %w", n, f.cfg.name, round, err)
				}
				s.res.Failover = append(s.res.Failover, run)
				s.logf("  failover %5d ids %-10s round %d: %d recovered, p50 %.0f ms p99 %.0f ms max %.0f ms; %d not ok, %d no answer; %d Redis commands; lag p99 %.1f ms",
					n, f.cfg.name, round, run.Recovered, run.RecoveryP50Ms, run.RecoveryP99Ms, run.RecoveryMaxMs,
					sum(run.NotOK), run.NoAnswer, run.RedisCommands, run.LagP99Ms)
			}
		}
	}
	s.failoverReport(fleets)
	return nil
}

// startFailoverFleet starts one configuration's redis-server, pinboard and
// surviving worker, and reads the pinboard's lease.
func startFailoverFleet(r *rig, c failoverConfig) (*failoverFleet, error) {
	f := &failoverFleet{cfg: c}
	var err error
	if f.redis, err = r.startRedis(); err != nil {
		return nil, err
	}
	if f.pinboard, err = r.startPinboardEnv("pinboard-"+c.name, r.bins.pinboard, f.redis.addr, c.env); err != nil {
		return nil, err
	}
	if f.survivor, err = r.startCounter("survivor-"+c.name, f.pinboard.addr); err != nil {
		return nil, err
	}
	var ov wire.OverviewResponse
	if err := registryGet(f.pinboard.addr, wire.PathOverview, &ov); err != nil {
		return nil, err
	}
	f.lease = time.Duration(ov.LeaseMs) * time.Millisecond
	return f, nil
}

// measureIdle measures every fleet's Redis commands per second without
// load (heartbeats, the janitor, the alarm scheduler), over the same d.
func measureIdle(ctx context.Context, fleets []*failoverFleet, d time.Duration) error {
	before := make([]map[string]int64, len(fleets))
	for i, f := range fleets {
		var err error
		if before[i], err = redisCommandStats(f.redis.addr); err != nil {
			return err
		}
	}
	t0 := time.Now()
	if err := sleepCtx(ctx, d); err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	for i, f := range fleets {
		after, err := redisCommandStats(f.redis.addr)
		if err != nil {
			return err
		}
		f.idleRate = float64(sumDelta(before[i], after)) / secs
	}
	return nil
}

// failoverRun starts a fresh victim in f when the last one was killed,
// places n new ids on it, and kills it under load.
func (s *session) failoverRun(ctx context.Context, r *rig, f *failoverFleet, n, round int) (FailoverRun, error) {
	fo := &s.o.Failover
	if f.victim == nil || exited(f.victim) {
		f.victims++
		v, err := r.startCounter(fmt.Sprintf("victim-%s.%d", f.cfg.name, f.victims), f.pinboard.addr)
		if err != nil {
			return FailoverRun{}, err
		}
		f.victim = v
	}
	client := &fasthttp.HostClient{Addr: f.pinboard.addr, MaxConns: fo.InFlight, MaxIdemponentCallAttempts: 1,
		ReadTimeout: fo.Timeout, WriteTimeout: fo.Timeout, MaxIdleConnDuration: 10 * time.Second, NoDefaultUserAgentHeader: true}
	defer client.CloseIdleConnections()
	base := "http://" + f.pinboard.addr
	ids, err := placeOnVictim(ctx, client, base, f, fmt.Sprintf("fo%d-r%d-", n, round), n)
	if err != nil {
		return FailoverRun{}, err
	}
	interval := fo.interval(n)
	load := failoverLoad{client: client, base: base, ids: ids, interval: interval, preKill: preKill(interval),
		within: fo.Within, timeout: fo.Timeout, inFlight: fo.InFlight}
	var (
		before     map[string]int64
		m0         failoverCounters
		cpu        cpuWindow
		windowFrom time.Time
	)
	tr, err := load.run(ctx, func() error {
		var err error
		if before, err = redisCommandStats(f.redis.addr); err != nil {
			return err
		}
		if m0, err = readFailoverCounters(f.pinboard.admin); err != nil {
			return err
		}
		cpu, windowFrom = snapshotCPU(f.pinboard), time.Now()
		return nil
	}, f.victim.Kill)
	if err != nil {
		return FailoverRun{}, err
	}
	after, err := redisCommandStats(f.redis.addr)
	if err != nil {
		return FailoverRun{}, err
	}
	m1, err := readFailoverCounters(f.pinboard.admin)
	if err != nil {
		return FailoverRun{}, err
	}
	run := tr.summary()
	run.Config, run.Round = f.cfg.name, round
	run.WindowSeconds = time.Since(windowFrom).Seconds()
	run.PinboardCPUMs = cpu.since()[f.pinboard] * 1000
	run.RedisByCommand = delta(before, after)
	run.RedisCommands = sum(run.RedisByCommand)
	run.DeathsProven, run.FastFailovers = m1.deaths-m0.deaths, m1.failovers-m0.failovers
	return run, nil
}

// failoverCounters are the pinboard's fast failover counters.
type failoverCounters struct{ deaths, failovers float64 }

// readFailoverCounters reads them from the pinboard's admin /metrics (a
// series not yet created counts 0).
func readFailoverCounters(admin string) (failoverCounters, error) {
	code, body := httpGet("http://"+admin+"/metrics", 5*time.Second)
	if code != 200 {
		return failoverCounters{}, fmt.Errorf("pinboard /metrics on %s: status %d", admin, code)
	}
	return failoverCounters{
		deaths:    max(0, metricValue(body, `pinned_placement_death_probes_total{result="dead"}`)),
		failovers: max(0, metricValue(body, "pinned_placement_fast_failovers_total")),
	}, nil
}

// maxPlaceBatches bounds placeOnVictim: a batch puts about half of its ids
// on the victim when the pinboard splits them evenly between two workers,
// so 10 000 ids take about 15 batches.
const maxPlaceBatches = 64

// placeConcurrency is how many placing requests placeOnVictim has in
// flight.
const placeConcurrency = 64

// placeOnVictim places n new ids (named prefix, batch, index) on f's victim
// and returns them. It asks the pinboard for new ids in batches of as many
// as the victim still lacks, so that it never holds more than n (the
// pinboard chooses, and the survivor takes some), and lists the victim's
// placements after each batch (GET /registry/instances: the victim is a
// fresh process, so everything it holds was placed here).
func placeOnVictim(ctx context.Context, c *fasthttp.HostClient, base string, f *failoverFleet, prefix string, n int) ([]string, error) {
	var ws wire.WorkersResponse
	if err := registryGet(f.pinboard.addr, wire.PathWorkers, &ws); err != nil {
		return nil, err
	}
	clientID := ""
	for _, w := range ws.Workers {
		if w.AdvertiseURL == "http://"+f.victim.addr {
			clientID = w.ClientID
		}
	}
	if clientID == "" {
		return nil, fmt.Errorf("the pinboard lists no worker at http://%s", f.victim.addr)
	}
	var held []string
	for batch := 0; len(held) < n; batch++ {
		if batch == maxPlaceBatches {
			return nil, fmt.Errorf("%d batches of new ids placed %d of %d on the victim", batch, len(held), n)
		}
		need := n - len(held)
		err := parallel(ctx, need, placeConcurrency, func(i int) error {
			return getOK(ctx, c, fmt.Sprintf("%s/counter/%sb%d-%d/", base, prefix, batch, i))
		})
		if err != nil {
			return nil, err
		}
		if held, err = listPlacements(f.pinboard.addr, clientID, n); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// listPage is the ids per page of GET /registry/instances that
// listPlacements asks for (the registry's largest).
const listPage = 1000

// listPlacements returns the ids of /counter that the worker clientID
// holds, every page of GET /registry/instances; a worker holding more than
// most is an error.
func listPlacements(pinboardAddr, clientID string, most int) ([]string, error) {
	var ids []string
	cursor := ""
	for page := 0; ; page++ {
		switch {
		case len(ids) > most:
			return nil, fmt.Errorf("GET /registry/instances: the worker holds more than %d ids", most)
		case page > 2*(most/listPage)+8: // pages come back full but for the odd short one
			return nil, fmt.Errorf("GET /registry/instances: %d pages for at most %d ids", page, most)
		}
		q := url.Values{"namespace": {"/counter"}, "worker": {clientID}, "limit": {strconv.Itoa(listPage)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var ir wire.InstancesResponse
		if err := registryGet(pinboardAddr, wire.PathInstances+"?"+q.Encode(), &ir); err != nil {
			return nil, err
		}
		for _, in := range ir.Instances {
			ids = append(ids, in.ID)
		}
		if cursor = ir.Cursor; cursor == "" {
			if len(ids) > most {
				return nil, fmt.Errorf("GET /registry/instances: the worker holds %d ids, more than %d", len(ids), most)
			}
			return ids, nil
		}
	}
}
