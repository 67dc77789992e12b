package loadgen

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultPath             = "/counter/{id}/"
	DefaultConnections      = 64
	DefaultDuration         = 10 * time.Second
	DefaultRequests         = 1_000_000
	DefaultTimeout          = 10 * time.Second
	DefaultConnWaitTimeout  = 10 * time.Second
	DefaultDrainTimeout     = 10 * time.Second
	DefaultIdleConnTimeout  = 5 * time.Second
	DefaultMaxLatency       = 60 * time.Second
	DefaultProgressInterval = time.Second
	DefaultKeys             = 1000
	DefaultZipfS            = 1.1
	DefaultIDPrefix         = "id"
)

// Limits on configuration values.
const (
	// MaxConnections bounds Connections and MaxWorkers. A recorder (event
	// loop or worker) owns about 160 KB of histograms once it has recorded
	// (200 KB in the open loop, plus 20 KB per scenario of a mix); an event
	// loop's connection holds a 16 KiB read buffer.
	MaxConnections = 10_000
	// MaxBodySize bounds Scenario.BodySize (request bodies and websocket
	// messages are generated, never held in memory beyond one worker's
	// 32 KiB pattern block, except small POST bodies and websocket messages,
	// which are held whole; see MaxHeldBodySize).
	MaxBodySize = 1 << 40
	// MaxHeldBodySize bounds the body size of the kinds that keep the whole
	// body in memory per worker (post and ws).
	MaxHeldBodySize = 64 << 20
	// MaxRate bounds Config.Rate (requests per second).
	MaxRate = 10_000_000
	// MaxWeight bounds Scenario.Weight, so that weights sum to a finite number.
	MaxWeight = 1_000_000_000
	// MaxStages bounds Config.Stages.
	MaxStages = 1000
	// MaxLoops bounds Config.Loops.
	MaxLoops = 256
	// MaxCoalesce bounds Config.Coalesce.
	MaxCoalesce = 10 * time.Millisecond
)

// Unbounded, as Config.Duration or Config.Requests, removes that bound. At
// least one of the two must stay bounded.
const Unbounded = -1

// Config configures a Runner. The zero value of every field means its
// documented default; New validates the whole struct once.
type Config struct {
	// URL is the target's base URL, "http://host:port" or
	// "https://host:port" (no path, query or fragment). Required. Websocket
	// scenarios dial ws:// (wss://) on the same host.
	URL string

	// Path is the path template used by scenarios that set none; every
	// "{id}" is replaced by the request's id. Zero means DefaultPath.
	Path string

	// Scenarios is the workload: one scenario, or a weighted mix (see
	// ParseScenarioFile). Empty means a single small GET.
	Scenarios []Scenario

	// Rate > 0 selects the open loop at Rate requests per second, measured
	// from each request's intended send time. Zero (and no Stages) selects
	// the closed loop: every connection sends its next request when the
	// previous one finishes.
	Rate float64

	// Stages, instead of Rate, gives the open loop a rate schedule: each
	// stage holds a rate or ramps it linearly, and the last stage's final
	// rate holds until the run ends (the Duration and Requests bounds).
	// Warmup runs at the first stage's starting rate.
	Stages []Stage

	// Engine selects the engine. Zero means EngineAuto.
	Engine Engine

	// Loops is the number of event loops of EngineLoop, each owning its
	// share of the connections and of the schedule. Zero means
	// GOMAXPROCS−1, at least 1 (one P stays free: see the package doc); at
	// most Connections. The fasthttp engine ignores it.
	Loops int

	// Coalesce lets EngineLoop's open loop send a slot up to Coalesce after
	// its intended time, so that one wake-up sends it with the slots due
	// meanwhile: fewer wake-ups (the largest cost of an open-loop request)
	// for up to Coalesce more schedule lag and latency, both measured and
	// reported as ever. Zero means every slot is sent at its time.
	Coalesce time.Duration

	// TLS configures https (and wss) connections; its ServerName defaults
	// to the URL's host. Nil means certificates are verified against the
	// system roots.
	TLS *tls.Config

	// Connections bounds the HTTP connections to the target; in the closed
	// loop every one of them carries requests back to back. In the open loop
	// connections are opened as slots need them; a slot that finds none idle
	// waits (its latency still counts from its intended time). A websocket
	// scenario holds one socket per worker that uses it, so at most
	// Connections in the closed loop and MaxWorkers in the open loop. Zero
	// means DefaultConnections.
	Connections int

	// MaxWorkers bounds the fasthttp engine's open-loop worker pool, which
	// grows on demand; slots that find no idle worker wait in a queue. Zero
	// means Connections. The loop engine has no workers and ignores it.
	MaxWorkers int

	// Duration bounds the measured phase (after Warmup). Zero means
	// DefaultDuration; Unbounded (or any negative value) removes the bound.
	Duration time.Duration

	// Requests bounds the number of measured requests (warmup requests do
	// not count). Zero means DefaultRequests; Unbounded (or any negative
	// value) removes the bound. The run stops at whichever bound comes first.
	Requests int64

	// Warmup runs load before the measured phase; its requests are sent and
	// then discarded from every statistic. Zero means no warmup.
	Warmup time.Duration

	// IDs selects the ids substituted for "{id}".
	IDs IDConfig

	// Headers are added to every HTTP request and websocket handshake.
	Headers []Header

	// TraceFile, when set, numbers every HTTP request in a Trace-Seq field
	// and writes one CSV line per measured request to this file when the
	// run ends: its number, and when it was due, sent, received by the
	// kernel and done, in absolute CLOCK_MONOTONIC ns, so that they line
	// up with the stamps of a proxy on the same machine (the pinboard's
	// pinned_spans build). EngineLoop only. Each event loop keeps at most
	// 4 Mi records (the first measured requests; ~200 MB).
	TraceFile string

	// Timeout is the read and the write timeout of each request, including
	// streamed bodies, and the websocket handshake and round-trip timeout.
	// Zero means DefaultTimeout.
	Timeout time.Duration

	// ConnWaitTimeout is how long a request of the fasthttp engine waits
	// for a free connection when all Connections are busy; past it the
	// request fails with error class "pool". Zero means
	// DefaultConnWaitTimeout. In the loop engine a slot waits for a
	// connection as long as the schedule runs (plus DrainTimeout).
	ConnWaitTimeout time.Duration

	// DrainTimeout bounds how long the open loop waits, after its schedule
	// ends, for queued slots to be sent; slots still queued then are
	// reported as unsent. Requests already in flight always finish (bounded
	// by Timeout). Zero means DefaultDrainTimeout.
	DrainTimeout time.Duration

	// IdleConnTimeout closes keep-alive connections idle this long. Keep it
	// below the target's idle timeout, or a connection the target closed
	// shows up as a "connection" error (loadgen never retries). Zero means
	// DefaultIdleConnTimeout.
	IdleConnTimeout time.Duration

	// MaxLatency is the highest latency the histograms track; larger values
	// are clamped to it and counted in Latency.Clamped. Zero means
	// DefaultMaxLatency.
	MaxLatency time.Duration

	// Dial, when set, replaces TCP dialing for HTTP and websocket
	// connections (tests pass a fasthttputil.InmemoryListener's Dial). It
	// selects the fasthttp engine.
	Dial func(addr string) (net.Conn, error)

	// Clock times requests and the open-loop schedule of the fasthttp
	// engine. Nil means clock.Real; any other clock selects the fasthttp
	// engine (the event loops time themselves with the monotonic clock and
	// the kernel's receive timestamps).
	Clock clock.Clock

	// Progress, when set, receives a one-line progress report every
	// ProgressInterval.
	Progress io.Writer

	// ProgressInterval is the period of the progress line. Zero means
	// DefaultProgressInterval.
	ProgressInterval time.Duration

	// Label names the run in reports and plots (for example "direct" or
	// "pinboard"). Optional.
	Label string
}

// Header is one extra request header.
type Header struct {
	Name, Value string
}

// Stage is one part of an open-loop rate schedule (Config.Stages).
type Stage struct {
	// Duration of the stage. Only the last stage may have none: its rate
	// then holds from its start.
	Duration time.Duration `json:"durationNs"`
	// Rate is the rate at the start of the stage, in requests per second.
	Rate float64 `json:"rate"`
	// EndRate, when set, makes the stage a linear ramp from Rate to
	// EndRate over Duration; zero means Rate throughout.
	EndRate float64 `json:"endRate,omitempty"`
}

func (s Stage) endRate() float64 {
	if s.EndRate == 0 {
		return s.Rate
	}
	return s.EndRate
}

// Engine names a load engine.
type Engine string

// Engines.
const (
	// EngineAuto picks EngineLoop when it can run the workload (Linux,
	// plain http, no websocket scenario, no Dial or Clock set) and
	// EngineFastHTTP otherwise.
	EngineAuto Engine = "auto"
	// EngineLoop runs Loops event loops over non-blocking sockets and
	// epoll, each owning its connections, its share of the schedule and its
	// statistics: no goroutine, channel or allocation per request.
	EngineLoop Engine = "loop"
	// EngineFastHTTP runs workers (goroutines) on fasthttp's client: https,
	// websockets, custom dialers and injected clocks.
	EngineFastHTTP Engine = "fasthttp"
)

// Dist is an id distribution.
type Dist string

// Id distributions.
const (
	// DistUniform draws uniformly from Keys fixed ids.
	DistUniform Dist = "uniform"
	// DistZipf draws from Keys fixed ids with Zipf(ZipfS) popularity: the id
	// of rank k (ids are numbered by rank from 0) is drawn with probability
	// proportional to 1/(k+1)^s.
	DistZipf Dist = "zipf"
	// DistNew makes every request's id new: "<prefix><runID>-<n>", unique
	// within the run and, through the random RunID, across runs. It turns a
	// run into an activation storm.
	DistNew Dist = "new"
)

// IDConfig selects the ids substituted for "{id}".
type IDConfig struct {
	// Dist is the distribution. Zero means DistUniform.
	Dist Dist
	// Keys is the number of fixed ids for DistUniform and DistZipf. Zero
	// means DefaultKeys.
	Keys int
	// ZipfS is the Zipf exponent s > 0 for DistZipf (s = 1 is classic Zipf;
	// larger is more skewed). Zero means DefaultZipfS.
	ZipfS float64
	// Prefix starts every id; together with the suffix it must satisfy
	// pinned's id grammar (wire.CheckSegment). Zero means DefaultIDPrefix.
	Prefix string
	// RunID makes DistNew ids unique across runs. Empty means a random
	// 8-character id drawn at New.
	RunID string
	// Seed seeds the id and scenario choices; runs with the same seed and
	// the same worker interleaving draw the same ids. Zero means a random seed.
	Seed uint64
}

// Kind is what a scenario does.
type Kind string

// Scenario kinds.
const (
	// KindGet sends a small request without a body (method GET unless set).
	KindGet Kind = "get"
	// KindPost sends a small request with Body, or a generated
	// BodySize-byte body (method POST unless set).
	KindPost Kind = "post"
	// KindDownload sends a GET and streams the response body, reading and
	// discarding it; latency runs to the last body byte.
	KindDownload Kind = "download"
	// KindUpload streams a generated BodySize-byte request body (method
	// POST unless set).
	KindUpload Kind = "upload"
	// KindWS keeps one websocket per worker (dialled on first use, to an id
	// drawn then) and measures round trips: send a unique BodySize-byte text
	// message, wait for the same bytes to come back, skipping any other
	// message the server pushes meanwhile.
	KindWS Kind = "ws"
)

// Default body sizes by kind, used when Scenario.BodySize is zero.
const (
	DefaultPostBodySize   = 64
	DefaultUploadBodySize = 1 << 20
	DefaultWSMessageSize  = 32
)

// Scenario is one kind of request in a workload. In a scenario file it is a
// JSON object with these camelCase fields.
type Scenario struct {
	// Name labels the scenario in reports. Empty means the kind's name.
	Name string `json:"name"`
	// Weight is the relative share of requests in a mix. Zero means 1.
	Weight float64 `json:"weight"`
	// Kind is what the scenario does. Empty means KindGet.
	Kind Kind `json:"kind"`
	// Method overrides the HTTP method (ignored for KindWS); every "{id}"
	// is replaced by the id.
	Method string `json:"method"`
	// Path is the path template; every "{id}" is replaced by the id.
	// Empty means Config.Path.
	Path string `json:"path"`
	// Body is the request body template of a post scenario; every "{id}" is
	// replaced by the id. Empty means a generated BodySize-byte body.
	Body string `json:"body,omitempty"`
	// BodySize is the generated request body size for post and upload, the
	// message size for ws. Zero means the kind's default.
	BodySize int64 `json:"bodySize"`
	// Headers are added to this scenario's requests, after Config.Headers.
	Headers map[string]string `json:"headers"`
}

// IsOpenLoop reports whether c selects the open loop.
func (c *Config) IsOpenLoop() bool { return c.Rate > 0 || len(c.Stages) > 0 }

// stages returns the open loop's rate schedule: Stages, or Rate held.
func (c *Config) stages() []Stage {
	if len(c.Stages) > 0 {
		return c.Stages
	}
	return []Stage{{Rate: c.Rate}}
}

// ErrConfig wraps every configuration error New returns; the message says
// which field to change.
var ErrConfig = errors.New("invalid loadgen config")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// withDefaults returns a copy of c with defaults applied, validated.
func (c Config) withDefaults() (Config, error) {
	if c.URL == "" {
		return c, configErr("URL is required (e.g. http://127.0.0.1:8080)")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return c, configErr("URL %q: %v", c.URL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return c, configErr("URL %q: scheme must be http or https", c.URL)
	}
	if u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return c, configErr("URL %q: want http[s]://host[:port] with no path, user, query or fragment (the path goes in Path)", c.URL)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.ParseUint(p, 10, 16); err != nil || n == 0 {
			return c, configErr("URL %q: port %s is out of range; want 1 to 65535", c.URL, p)
		}
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if err := checkPath(c.Path); err != nil {
		return c, configErr("Path: %v", err)
	}
	if math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) || c.Rate < 0 || c.Rate > MaxRate {
		return c, configErr("Rate = %v; want 0 (closed loop) or a rate in (0, %d] requests per second", c.Rate, MaxRate)
	}
	if err := checkStages(c.Rate, c.Stages); err != nil {
		return c, err
	}
	if c.Connections == 0 {
		c.Connections = DefaultConnections
	}
	if c.Connections < 0 || c.Connections > MaxConnections {
		return c, configErr("Connections = %d; want 1..%d", c.Connections, MaxConnections)
	}
	if c.MaxWorkers == 0 {
		c.MaxWorkers = c.Connections
	}
	if c.MaxWorkers < 0 || c.MaxWorkers > MaxConnections {
		return c, configErr("MaxWorkers = %d; want 1..%d", c.MaxWorkers, MaxConnections)
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Requests == 0 {
		c.Requests = DefaultRequests
	}
	if c.Duration < 0 {
		c.Duration = Unbounded
	}
	if c.Requests < 0 {
		c.Requests = Unbounded
	}
	if c.Duration == Unbounded && c.Requests == Unbounded {
		return c, configErr("Duration and Requests are both unbounded; bound the run by at least one of them")
	}
	if c.Warmup < 0 {
		return c, configErr("Warmup = %v; want ≥ 0", c.Warmup)
	}
	if err := c.IDs.withDefaults(); err != nil {
		return c, err
	}
	for _, h := range c.Headers {
		if err := checkHeader(h.Name, h.Value); err != nil {
			return c, configErr("Headers: %v", err)
		}
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Timeout", &c.Timeout, DefaultTimeout},
		{"ConnWaitTimeout", &c.ConnWaitTimeout, DefaultConnWaitTimeout},
		{"DrainTimeout", &c.DrainTimeout, DefaultDrainTimeout},
		{"IdleConnTimeout", &c.IdleConnTimeout, DefaultIdleConnTimeout},
		{"MaxLatency", &c.MaxLatency, DefaultMaxLatency},
		{"ProgressInterval", &c.ProgressInterval, DefaultProgressInterval},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return c, configErr("%s = %v; want > 0 (0 means %v)", d.name, *d.v, d.def)
		}
	}
	if c.MaxLatency < time.Millisecond {
		return c, configErr("MaxLatency = %v; want ≥ 1ms", c.MaxLatency)
	}
	if len(c.Scenarios) == 0 {
		c.Scenarios = []Scenario{{Kind: KindGet}}
	}
	scs := make([]Scenario, len(c.Scenarios))
	seen := make(map[string]bool, len(scs))
	for i, s := range c.Scenarios {
		if err := s.normalize(c.Path); err != nil {
			return c, configErr("Scenarios[%d]: %v", i, err)
		}
		if seen[s.Name] {
			return c, configErr("Scenarios[%d]: duplicate name %q", i, s.Name)
		}
		seen[s.Name] = true
		scs[i] = s
	}
	c.Scenarios = scs
	if err := c.pickEngine(); err != nil {
		return c, err
	}
	if c.Coalesce < 0 || c.Coalesce > MaxCoalesce {
		return c, configErr("Coalesce = %v; want 0..%v", c.Coalesce, MaxCoalesce)
	}
	if c.Loops < 0 || c.Loops > MaxLoops {
		return c, configErr("Loops = %d; want 0 (GOMAXPROCS) or 1..%d", c.Loops, MaxLoops)
	}
	if c.Loops == 0 {
		// One P stays free for the rest of the process (see Config.Loops).
		c.Loops = max(1, runtime.GOMAXPROCS(0)-1)
	}
	c.Loops = min(c.Loops, c.Connections)
	c.Clock = clock.Or(c.Clock)
	return c, nil
}

// checkStages validates a rate schedule.
func checkStages(rate float64, stages []Stage) error {
	if len(stages) == 0 {
		return nil
	}
	if rate != 0 {
		return configErr("Rate = %v and Stages are both set; Stages replace Rate", rate)
	}
	if len(stages) > MaxStages {
		return configErr("%d Stages; at most %d", len(stages), MaxStages)
	}
	okRate := func(r float64) bool { return r > 0 && r <= MaxRate }
	for i, st := range stages {
		if !okRate(st.Rate) || (st.EndRate != 0 && !okRate(st.EndRate)) {
			return configErr("Stages[%d]: rates %v → %v; want rates in (0, %d] requests per second", i, st.Rate, st.EndRate, MaxRate)
		}
		if st.Duration < 0 || (st.Duration == 0 && i < len(stages)-1) {
			return configErr("Stages[%d]: Duration = %v; want > 0 (only the last stage may be open-ended)", i, st.Duration)
		}
	}
	return nil
}

// pickEngine resolves EngineAuto and checks that an explicit engine can run
// the workload.
func (c *Config) pickEngine() error {
	var why string // why the loop engine cannot run this workload
	switch {
	case !loopEngineSupported:
		why = "it needs Linux (epoll)"
	case strings.HasPrefix(c.URL, "https:"):
		why = "it speaks plain http only"
	case c.Dial != nil:
		why = "it dials TCP itself (Dial is set)"
	case c.Clock != nil && c.Clock != clock.Clock(clock.Real{}):
		why = "it times with the monotonic clock (Clock is set)"
	}
	for _, s := range c.Scenarios {
		if s.Kind == KindWS && why == "" {
			why = "it has no websocket client (scenario " + s.Name + ")"
		}
	}
	switch c.Engine {
	case "", EngineAuto:
		c.Engine = EngineLoop
		if why != "" {
			c.Engine = EngineFastHTTP
		}
	case EngineLoop:
		if why != "" {
			return configErr("Engine %q cannot run this workload: %s", c.Engine, why)
		}
	case EngineFastHTTP:
	default:
		return configErr("Engine = %q; want %q, %q or %q", c.Engine, EngineAuto, EngineLoop, EngineFastHTTP)
	}
	if c.TraceFile != "" && c.Engine != EngineLoop {
		return configErr("TraceFile needs Engine %q, which cannot run this workload: %s", EngineLoop, why)
	}
	return nil
}

func (ic *IDConfig) withDefaults() error {
	if ic.Dist == "" {
		ic.Dist = DistUniform
	}
	switch ic.Dist {
	case DistUniform, DistZipf, DistNew:
	default:
		return configErr("IDs.Dist = %q; want %q, %q or %q", ic.Dist, DistUniform, DistZipf, DistNew)
	}
	if ic.Keys == 0 {
		ic.Keys = DefaultKeys
	}
	if ic.Keys < 0 {
		return configErr("IDs.Keys = %d; want > 0", ic.Keys)
	}
	if ic.ZipfS == 0 {
		ic.ZipfS = DefaultZipfS
	}
	if !(ic.ZipfS > 0) || math.IsInf(ic.ZipfS, 0) || ic.ZipfS > 100 {
		return configErr("IDs.ZipfS = %v; want an exponent in (0, 100]", ic.ZipfS)
	}
	if ic.Prefix == "" {
		ic.Prefix = DefaultIDPrefix
	}
	if e := wire.CheckSegment([]byte(ic.Prefix), wire.MaxIDLen-48); e != wire.SegmentOK {
		return configErr("IDs.Prefix %q: %v", ic.Prefix, e)
	}
	if ic.RunID != "" {
		if e := wire.CheckSegment([]byte(ic.RunID), 32); e != wire.SegmentOK {
			return configErr("IDs.RunID %q: %v (at most 32 bytes)", ic.RunID, e)
		}
	}
	return nil
}

// normalize applies the scenario defaults and validates s.
func (s *Scenario) normalize(defaultPath string) error {
	if s.Kind == "" {
		s.Kind = KindGet
	}
	switch s.Kind {
	case KindGet, KindPost, KindDownload, KindUpload, KindWS:
	default:
		return fmt.Errorf("kind %q: want get, post, download, upload or ws", s.Kind)
	}
	if s.Name == "" {
		s.Name = string(s.Kind)
	}
	if len(s.Name) > 64 || strings.ContainsFunc(s.Name, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("name %q: want at most 64 printable characters", s.Name)
	}
	if s.Weight == 0 {
		s.Weight = 1
	}
	if !(s.Weight > 0) || s.Weight > MaxWeight {
		return fmt.Errorf("%s: weight %v; want a number in (0, %g]", s.Name, s.Weight, float64(MaxWeight))
	}
	if s.Method == "" {
		switch s.Kind {
		case KindPost, KindUpload:
			s.Method = "POST"
		default:
			s.Method = "GET"
		}
	}
	if !isToken(strings.ReplaceAll(s.Method, idPlaceholder, "id")) {
		return fmt.Errorf("%s: method %q is not an HTTP token (with {id} placeholders)", s.Name, s.Method)
	}
	if s.Body != "" {
		if s.Kind != KindPost {
			return fmt.Errorf("%s: body is only for kind post (kind %s)", s.Name, s.Kind)
		}
		if s.BodySize != 0 {
			return fmt.Errorf("%s: body and bodySize are both set; a body's size is its length", s.Name)
		}
		if len(s.Body) > MaxHeldBodySize {
			return fmt.Errorf("%s: body of %d bytes; at most %d", s.Name, len(s.Body), MaxHeldBodySize)
		}
	}
	if s.Path == "" {
		s.Path = defaultPath
	}
	if err := checkPath(s.Path); err != nil {
		return fmt.Errorf("%s: path: %v", s.Name, err)
	}
	if s.BodySize == 0 && s.Body == "" {
		switch s.Kind {
		case KindPost:
			s.BodySize = DefaultPostBodySize
		case KindUpload:
			s.BodySize = DefaultUploadBodySize
		case KindWS:
			s.BodySize = DefaultWSMessageSize
		}
	}
	limit := int64(MaxBodySize)
	if s.Kind == KindPost || s.Kind == KindWS {
		limit = MaxHeldBodySize
	}
	if s.BodySize < 0 || s.BodySize > limit {
		return fmt.Errorf("%s: bodySize %d; want 0..%d for kind %s", s.Name, s.BodySize, limit, s.Kind)
	}
	if s.Kind == KindWS && s.BodySize < minWSMessage {
		return fmt.Errorf("%s: bodySize %d; a ws message needs at least %d bytes to carry its unique tag", s.Name, s.BodySize, minWSMessage)
	}
	if (s.Kind == KindGet || s.Kind == KindDownload) && s.BodySize != 0 {
		return fmt.Errorf("%s: bodySize is only for post, upload and ws (kind %s sends no body)", s.Name, s.Kind)
	}
	for k, v := range s.Headers {
		if err := checkHeader(k, v); err != nil {
			return fmt.Errorf("%s: headers: %v", s.Name, err)
		}
	}
	return nil
}

// checkPath validates a path template: it starts with '/', has no bytes
// that would break the request line, and every '{' starts "{id}".
func checkPath(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%q must start with '/'", p)
	}
	if len(p) > 4096 {
		return fmt.Errorf("%q is longer than 4096 bytes", p[:32]+"...")
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c <= ' ' || c >= 0x7f || c == '#' {
			return fmt.Errorf("%q has a byte (%q) not allowed in a request path", p, c)
		}
		if c == '{' && !strings.HasPrefix(p[i:], idPlaceholder) {
			return fmt.Errorf("%q: '{' must start the placeholder %s", p, idPlaceholder)
		}
	}
	return nil
}

func checkHeader(name, value string) error {
	if !isToken(name) {
		return fmt.Errorf("header name %q is not an HTTP token", name)
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return fmt.Errorf("header %s: value contains CR, LF or NUL", name)
	}
	return nil
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
