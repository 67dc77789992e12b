package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
)

// Values of Report.StoppedBy.
const (
	StopDuration = "duration" // the Duration bound ended the run
	StopRequests = "requests" // the Requests bound ended the run
	StopCanceled = "canceled" // Run's context was cancelled
)

// ErrAlreadyRun is returned by a second call to Run: a Runner runs once.
var ErrAlreadyRun = errors.New("loadgen: Runner already ran; make a new one with New")

// Errors of Probe.
var (
	// ErrUnresolvable: the URL's host does not resolve (the URL is wrong).
	ErrUnresolvable = errors.New("the target's host does not resolve")
	// ErrUnreachable: no connection to the target could be opened (refused,
	// unreachable, timed out).
	ErrUnreachable = errors.New("cannot connect to the target")
)

// Runner runs one load test. Make it with New, call Run once.
type Runner struct {
	cfg      Config
	runID    string
	seed     uint64
	ids      idSource
	cum      []float64 // cumulative scenario weights
	hc       *fasthttp.HostClient
	wsd      *websocket.Dialer
	httpBase string
	wsBase   string
	host     string // the Host field: the URL's host[:port]
	hostPort string // host:port to dial
	maxUs    int64
	ran      atomic.Bool
	live     []liveCounters // one per event loop; the fasthttp workers share the first

	// Test hooks, set before Run.
	newExec func(w *worker, sc int) executor               // replaces the real executors
	observe func(slot int64, intended, done clock.Instant) // sees every open-loop slot
}

// liveCounters feed the progress line; they count warmup requests too.
// Padded to a cache line: each event loop writes its own.
type liveCounters struct {
	sent, done, errs atomic.Int64
	_                [40]byte
}

// engineResult is what an engine hands back to Run.
type engineResult struct {
	stats        []*stats // one per recorder (event loop or worker)
	recorders    int
	stoppedBy    string
	measureStart clock.Instant
}

// New validates cfg, applies its defaults and prepares a Runner. It does no
// I/O and starts no goroutines. Errors wrap ErrConfig.
func New(cfg Config) (*Runner, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: c, runID: c.IDs.RunID, seed: c.IDs.Seed, maxUs: c.MaxLatency.Microseconds()}
	if r.runID == "" {
		r.runID = randomRunID()
	}
	if r.seed == 0 {
		r.seed = rand.Uint64()
	}
	r.ids = newIDSource(c.IDs, r.runID)
	sum := 0.0
	for _, s := range c.Scenarios {
		sum += s.Weight
		r.cum = append(r.cum, sum)
	}
	r.live = make([]liveCounters, max(1, c.Loops))
	u, _ := url.Parse(c.URL) // validated by withDefaults
	tlsOn := u.Scheme == "https"
	r.host, r.hostPort = u.Host, u.Host
	if u.Port() == "" {
		port := "80"
		if tlsOn {
			port = "443"
		}
		r.hostPort = net.JoinHostPort(u.Hostname(), port)
	}
	r.httpBase, r.wsBase = u.Scheme+"://"+u.Host, "ws://"+u.Host
	if tlsOn {
		r.wsBase = "wss://" + u.Host
	}
	if c.Engine != EngineFastHTTP {
		return r, nil
	}
	for _, s := range c.Scenarios {
		if s.Kind == KindWS {
			if r.wsd == nil {
				r.wsd = newWSDialer(&r.cfg, u.Hostname())
			}
		} else if r.hc == nil {
			r.hc = &fasthttp.HostClient{
				Addr:                      r.hostPort,
				IsTLS:                     tlsOn,
				TLSConfig:                 tlsConfig(c.TLS, u.Hostname()),
				MaxConns:                  c.Connections,
				MaxConnWaitTimeout:        c.ConnWaitTimeout,
				MaxIdleConnDuration:       c.IdleConnTimeout,
				ReadTimeout:               c.Timeout,
				WriteTimeout:              c.Timeout,
				ReadBufferSize:            8 << 10,
				NoDefaultUserAgentHeader:  true,
				DisablePathNormalizing:    true,
				DialDualStack:             true,
				MaxIdemponentCallAttempts: 1, // never retry: a retry would hide an error and its latency
			}
			if c.Dial != nil {
				r.hc.Dial = c.Dial
			}
		}
	}
	return r, nil
}

// tlsConfig returns a copy of cfg (nil: the defaults) naming the server.
func tlsConfig(cfg *tls.Config, serverName string) *tls.Config {
	if cfg == nil {
		cfg = &tls.Config{}
	}
	c := cfg.Clone()
	if c.ServerName == "" {
		c.ServerName = serverName
	}
	return c
}

// RunID returns the run's id (the prefix of DistNew ids).
func (r *Runner) RunID() string { return r.runID }

// Engine returns the engine the run uses (EngineAuto resolved).
func (r *Runner) Engine() Engine { return r.cfg.Engine }

func randomRunID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	var b [8]byte
	v := rand.Uint64()
	for i := range b {
		b[i] = alphabet[v&31]
		v >>= 5
	}
	return string(b[:])
}

// Probe checks that the target can be reached before a run: it resolves
// the URL's host and opens one TCP connection to it (through Config.Dial
// when set), which it closes at once without sending a byte, bounded by
// ctx and Config.Timeout. Its errors wrap ErrUnresolvable or
// ErrUnreachable and name the host. Run does not probe: cmd/loadgen calls
// Probe first, so that a wrong URL or a target that is not there fails at
// once instead of a run that counts every request as a connect error.
func (r *Runner) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var (
		c   net.Conn
		err error
	)
	if r.cfg.Dial != nil {
		c, err = r.cfg.Dial(r.hostPort)
	} else {
		host, _, _ := net.SplitHostPort(r.hostPort)
		if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrUnresolvable, host, err)
		}
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", r.hostPort)
	}
	if err != nil {
		return fmt.Errorf("%w %s: %v", ErrUnreachable, r.hostPort, err)
	}
	return c.Close()
}

// Run runs the load test and returns its report. Cancelling ctx ends the
// run early (StoppedBy = "canceled") and still returns a report of what was
// measured. Run returns only after every goroutine it started has exited
// and every connection it opened is closed (or idle in the fasthttp
// engine's HostClient, closed before Run returns). Request failures are
// results, not errors: the error is non-nil only for ErrAlreadyRun and when
// the event loops cannot be set up (epoll, eventfd).
func (r *Runner) Run(ctx context.Context) (*Report, error) {
	if r.ran.Swap(true) {
		return nil, ErrAlreadyRun
	}
	var ms0 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	cpu0 := processCPU()
	clk := r.cfg.Clock
	wallStart := time.Now()
	t0 := clk.Now()
	if r.cfg.Engine == EngineLoop {
		t0 = clock.FromTime(wallStart)
	}

	var (
		sch          *schedule
		stoppedBy    string
		measureStart = t0.Add(r.cfg.Warmup)
		window       = r.cfg.Duration
	)
	if r.cfg.IsOpenLoop() {
		s, by := newSchedule(t0, &r.cfg)
		sch, stoppedBy, measureStart = &s, by, s.intended(s.warmup)
		if by == StopRequests {
			window = s.offset(s.total) - s.offset(s.warmup)
		}
	}
	ser := newSeries(r.maxUs, r.cfg.Timeout, window)

	progStop := make(chan struct{})
	var progDone sync.WaitGroup
	if r.cfg.Progress != nil {
		progDone.Go(func() { r.progress(progStop, t0) })
	}
	var (
		res engineResult
		err error
	)
	if r.cfg.Engine == EngineLoop {
		res, err = r.runLoops(ctx, wallStart, sch, ser, measureStart)
	} else {
		res = r.runFastHTTP(ctx, t0, sch, ser, measureStart)
	}
	close(progStop)
	progDone.Wait()
	if err != nil {
		return nil, err
	}
	if sch != nil {
		res.stoppedBy = stoppedBy
	}
	if ctx.Err() != nil {
		res.stoppedBy = StopCanceled
	}
	if r.hc != nil {
		r.hc.CloseIdleConnections()
	}
	cpu := processCPU() - cpu0
	var ms1 runtime.MemStats
	runtime.ReadMemStats(&ms1)

	agg := newStats(len(r.cfg.Scenarios), r.maxUs, nil, measureStart)
	for _, st := range res.stats {
		st.iv.flush()
		agg.merge(st)
	}
	times := reportTimes{wallStart: wallStart, measureStart: measureStart}
	if sch != nil && res.stoppedBy != StopCanceled {
		times.schedule = window
	}
	rep := r.report(&agg, times, res.stoppedBy)
	// The series ends with the schedule or the Duration when one ended the
	// run (completions after it count in its last second), else with the
	// last completion.
	seriesEnd := time.Duration(rep.ElapsedSeconds * 1e9)
	if window > 0 && (res.stoppedBy == StopDuration || (sch != nil && res.stoppedBy == StopRequests)) {
		seriesEnd = window
	}
	rep.Series = ser.finish(seriesEnd)
	rep.Generator = generatorStats(&ms0, &ms1)
	rep.Generator.Engine = r.cfg.Engine
	if r.cfg.Engine == EngineLoop {
		rep.Generator.Loops = res.recorders
	} else {
		rep.Generator.Workers = res.recorders
	}
	rep.Generator.CPUSeconds = cpu.Seconds()
	var all int64
	for i := range r.live {
		all += r.live[i].done.Load()
	}
	if all > 0 {
		rep.Generator.CPUPerRequestUs = float64(cpu.Nanoseconds()) / 1e3 / float64(all)
	}
	return rep, nil
}

// picker chooses each request's scenario and id for one recorder.
type picker struct {
	r   *Runner
	rng *rand.Rand
	id  []byte
}

func (r *Runner) newPicker(idx int) picker {
	return picker{r: r, rng: rand.New(rand.NewPCG(r.seed, uint64(idx))), id: make([]byte, 0, 64)}
}

// next picks a scenario and an id; the id is valid until the next call.
func (p *picker) next() (sc int, id []byte) {
	cum := p.r.cum
	if len(cum) > 1 {
		u := p.rng.Float64() * cum[len(cum)-1]
		for sc < len(cum)-1 && u >= cum[sc] {
			sc++
		}
	}
	p.id = p.r.ids.appendID(p.id[:0], p.rng)
	return sc, p.id
}
