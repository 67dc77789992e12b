package loadgen

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strconv"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"

	"github.com/pinned-go/pinned/clock"
)

// ReportVersion is the version of the JSON report schema. It changes only
// when a field changes meaning or disappears; new fields may appear.
// Version 2: histogram is HdrHistogram's standard compressed encoding
// (version 1 wrapped it in base64 once more); scheduleLagUs has percentiles.
// Version 3: achievedRate counts successful responses, not sent requests
// (ReadReport recomputes it for older reports).
const ReportVersion = 3

// Report is the result of a run, and the -json output (field names are the
// JSON keys). Latencies are in microseconds. Statistics cover the measured
// phase only: warmup requests are never counted.
type Report struct {
	Version int    `json:"version"`
	Label   string `json:"label,omitempty"`
	// RunID prefixes DistNew ids.
	RunID string `json:"runId"`
	// Start is the wall-clock start of the run (of the warmup, if any).
	Start  time.Time    `json:"start"`
	Config ReportConfig `json:"config"`
	// StoppedBy is "duration", "requests" or "canceled".
	StoppedBy string `json:"stoppedBy"`
	// ElapsedSeconds is the measured phase: from its first intended (open
	// loop) or possible (closed loop) send to the last completion.
	ElapsedSeconds float64       `json:"elapsedSeconds"`
	Requests       RequestCounts `json:"requests"`
	// TargetRate is the open loop's constant rate; 0 in the closed loop
	// and for a rate schedule (Config.Stages).
	TargetRate float64 `json:"targetRate,omitempty"`
	// AchievedRate is the rate of successful responses (Requests.Sent −
	// Errors.Total: a 2xx status or a websocket echo) over the measured
	// phase: ElapsedSeconds (to the last completion), and in the open loop
	// at least the schedule's length (one period per measured slot), so
	// that it is TargetRate when every request succeeded and the last ones
	// took no time. Failed requests never count: a target that refuses
	// connections achieves 0, however fast loadgen sends.
	AchievedRate float64 `json:"achievedRate"`
	// ErrorRate is (Errors.Total + Requests.Unsent) / (Requests.Sent +
	// Requests.Unsent): a slot the open loop could not send counts as failed.
	ErrorRate float64 `json:"errorRate"`
	// Latency is measured from the intended send time in the open loop
	// (coordinated-omission free) and from the actual send in the closed
	// loop, to the last byte of the response or to the websocket echo. It
	// covers every request that got a response, whatever its status;
	// transport errors have no latency.
	Latency Latency `json:"latencyUs"`
	// Service is the open loop's service time, from the actual send to
	// completion: Latency minus the time a slot waited for a worker or a
	// connection. Nil in the closed loop, where Latency is the service time.
	Service *Latency `json:"serviceUs,omitempty"`
	// ScheduleLag is how late the open loop sent requests relative to their
	// intended times (generator timer slop, and queueing when every
	// connection was busy). Nil in the closed loop.
	ScheduleLag *Lag `json:"scheduleLagUs,omitempty"`
	// Distribution is Latency's percentile curve (HdrHistogram ticks, 5 per
	// half distance), the data of the percentile plot.
	Distribution []Point `json:"distribution"`
	// Histogram is Latency's HdrHistogram in HdrHistogram's standard
	// compressed encoding (V2, deflate, base64), the form its tools and
	// hdrhistogram.Decode read: runs can be merged later without loss.
	Histogram string `json:"histogram"`
	// Series is the run second by second: requests completed in each
	// second of the measured phase, their latency percentiles, errors.
	Series []SeriesPoint `json:"series"`
	Bytes  Bytes         `json:"bytes"`
	// Statuses counts responses by HTTP status code.
	Statuses  map[string]int64 `json:"statuses"`
	Errors    Errors           `json:"errors"`
	Scenarios []ScenarioReport `json:"scenarios"`
	Generator Generator        `json:"generator"`
}

// ReportConfig echoes the run's settings (header values redacted).
type ReportConfig struct {
	Mode            string     `json:"mode"` // "open" or "closed"
	URL             string     `json:"url"`
	Rate            float64    `json:"rate,omitempty"`
	Stages          []Stage    `json:"stages,omitempty"`
	Connections     int        `json:"connections"`
	Loops           int        `json:"loops,omitempty"`
	CoalesceUs      int64      `json:"coalesceUs,omitempty"`
	MaxWorkers      int        `json:"maxWorkers,omitempty"`
	DurationSeconds float64    `json:"durationSeconds"` // 0: unbounded
	Requests        int64      `json:"requests"`        // 0: unbounded
	WarmupSeconds   float64    `json:"warmupSeconds"`
	TimeoutSeconds  float64    `json:"timeoutSeconds"`
	IDs             IDReport   `json:"ids"`
	Scenarios       []Scenario `json:"scenarios"`
}

// IDReport echoes the id settings.
type IDReport struct {
	Dist   Dist    `json:"dist"`
	Keys   int     `json:"keys,omitempty"`
	ZipfS  float64 `json:"zipfS,omitempty"`
	Prefix string  `json:"prefix"`
	Seed   uint64  `json:"seed"`
}

// RequestCounts counts the measured requests.
type RequestCounts struct {
	// Sent requests all completed, with a response or an error.
	Sent int64 `json:"sent"`
	// Responses got an HTTP response (any status) or a websocket echo.
	Responses int64 `json:"responses"`
	// Errors is Errors.Total.
	Errors int64 `json:"errors"`
	// Unsent open-loop slots were still queued when the drain timeout
	// expired or the run was cancelled.
	Unsent int64 `json:"unsent"`
	// WSSkipped counts websocket messages that were not the awaited echo.
	WSSkipped int64 `json:"wsSkippedMessages,omitempty"`
}

// Latency summarises a latency histogram, in microseconds.
type Latency struct {
	Count int64 `json:"count"`
	// Clamped counts values above the histogram's range (MaxLatency),
	// recorded as MaxLatency.
	Clamped int64   `json:"clamped"`
	Min     int64   `json:"min"`
	Mean    float64 `json:"mean"`
	StdDev  float64 `json:"stddev"`
	P50     int64   `json:"p50"`
	P90     int64   `json:"p90"`
	P99     int64   `json:"p99"`
	P999    int64   `json:"p99_9"`
	P9999   int64   `json:"p99_99"`
	Max     int64   `json:"max"`
}

// Lag summarises the open loop's schedule lag (actual send − intended send
// time), in microseconds, at 2 significant digits (exact below 256µs).
type Lag struct {
	// Count is the number of requests that left (a request that could not
	// connect never did).
	Count int64   `json:"count"`
	Mean  float64 `json:"mean"`
	P50   int64   `json:"p50"`
	P90   int64   `json:"p90"`
	P99   int64   `json:"p99"`
	P999  int64   `json:"p99_9"`
	Max   int64   `json:"max"`
}

// SeriesPoint is one second of the measured phase: the requests that
// completed (or failed) in it. Latencies are in microseconds, at 2
// significant digits, over the responses of that second (none: 0).
type SeriesPoint struct {
	// Second counts from the start of the measured phase (0 is the first).
	Second   int64 `json:"second"`
	Requests int64 `json:"requests"`
	Errors   int64 `json:"errors"`
	// Rate is Requests per second (the last second may be partial).
	Rate float64 `json:"rate"`
	P50  int64   `json:"p50"`
	P99  int64   `json:"p99"`
	P999 int64   `json:"p99_9"`
	Max  int64   `json:"max"`
}

// Point is one point of a percentile curve.
type Point struct {
	Percentile float64 `json:"percentile"` // 0..100
	Us         int64   `json:"us"`         // latency at that percentile
	Count      int64   `json:"count"`      // values at or below it
}

// Bytes counts body bytes (and websocket message bytes), not headers.
type Bytes struct {
	Sent     int64 `json:"sent"`
	Received int64 `json:"received"`
}

// Errors counts failed measured requests by class. A request fails with a
// non-2xx status or with one transport class (timeout, connect, connection,
// pool, other).
type Errors struct {
	Total int64 `json:"total"`
	// Status counts non-2xx responses by status code.
	Status map[string]int64 `json:"status"`
	// Reason counts non-2xx responses by their X-Pinned-Reason value
	// (responses without the header are not counted here).
	Reason map[string]int64 `json:"reason"`
	// Timeout: read, write or round-trip timeout.
	Timeout int64 `json:"timeout"`
	// Connect: no connection (refused, dial timeout, unresolvable, TLS
	// handshake failed).
	Connect int64 `json:"connect"`
	// Connection: an established connection failed (reset, closed before
	// the response, truncated body).
	Connection int64 `json:"connection"`
	// Pool: no free connection within ConnWaitTimeout (raise Connections).
	Pool int64 `json:"pool"`
	// Other: anything else (protocol errors, ...).
	Other int64 `json:"other"`
	// Samples holds the first error text seen per transport class.
	Samples map[string]string `json:"samples,omitempty"`
}

// ScenarioReport is one scenario's share of the run.
type ScenarioReport struct {
	Name    string  `json:"name"`
	Kind    Kind    `json:"kind"`
	Sent    int64   `json:"sent"`
	Errors  int64   `json:"errors"`
	Rate    float64 `json:"rate"` // its successful responses per second, over AchievedRate's span
	Latency Latency `json:"latencyUs"`
	Bytes   Bytes   `json:"bytes"`
}

// Generator describes the load generator during the run, so that its own
// cost and slop can be told from the target's: with ScheduleLag, it is the
// instrument stating its accuracy.
type Generator struct {
	// Engine is the engine that ran: "loop" or "fasthttp".
	Engine     Engine `json:"engine"`
	GoVersion  string `json:"goVersion"`
	GoMaxProcs int    `json:"gomaxprocs"`
	// Loops is the number of event loops (loop engine).
	Loops int `json:"loops,omitempty"`
	// Workers is the number of worker goroutines (fasthttp engine).
	Workers int `json:"workers,omitempty"`
	// CPUSeconds is the process's CPU time (user + system, all threads)
	// during Run, warmup included.
	CPUSeconds float64 `json:"cpuSeconds"`
	// CPUPerRequestUs is CPUSeconds per request completed during Run,
	// warmup requests included, in microseconds.
	CPUPerRequestUs float64 `json:"cpuPerRequestUs"`
	GCCount         uint32  `json:"gcCount"`
	GCPauseTotalUs  int64   `json:"gcPauseTotalUs"`
	GCPauseMaxUs    int64   `json:"gcPauseMaxUs"`
}

type reportTimes struct {
	wallStart    time.Time
	measureStart clock.Instant
	// schedule is the open loop's measured schedule length (0: closed loop
	// or a cancelled run): the least span AchievedRate is computed over.
	schedule time.Duration
}

// percentiles reported in Latency.
var percentiles = []float64{50, 90, 99, 99.9, 99.99}

func summarize(h *hdrhistogram.Histogram, clamped int64) Latency {
	if h == nil || h.TotalCount() == 0 {
		return Latency{Clamped: clamped}
	}
	// ValueAtPercentile takes 0..100 (as does ValueAtQuantile, despite its name).
	v := h.ValueAtPercentiles(append([]float64(nil), percentiles...))
	return Latency{
		Count:   h.TotalCount(),
		Clamped: clamped,
		Min:     h.Min(),
		Mean:    h.Mean(),
		StdDev:  h.StdDev(),
		P50:     v[50],
		P90:     v[90],
		P99:     v[99],
		P999:    v[99.9],
		P9999:   v[99.99],
		Max:     h.Max(),
	}
}

func (r *Runner) report(agg *stats, t reportTimes, stoppedBy string) *Report {
	cfg := &r.cfg
	rep := &Report{
		Version:   ReportVersion,
		Label:     cfg.Label,
		RunID:     r.runID,
		Start:     t.wallStart.UTC(),
		StoppedBy: stoppedBy,
		Statuses:  map[string]int64{},
		Errors:    Errors{Status: map[string]int64{}, Reason: map[string]int64{}},
	}
	rep.Config = ReportConfig{
		Mode:           "closed",
		URL:            cfg.URL,
		Connections:    cfg.Connections,
		WarmupSeconds:  cfg.Warmup.Seconds(),
		TimeoutSeconds: cfg.Timeout.Seconds(),
		IDs:            IDReport{Dist: cfg.IDs.Dist, Prefix: cfg.IDs.Prefix, Seed: r.seed},
		Scenarios:      redactedScenarios(cfg.Scenarios),
	}
	if cfg.IDs.Dist != DistNew {
		rep.Config.IDs.Keys = cfg.IDs.Keys
	}
	if cfg.IDs.Dist == DistZipf {
		rep.Config.IDs.ZipfS = cfg.IDs.ZipfS
	}
	if cfg.Duration != Unbounded {
		rep.Config.DurationSeconds = cfg.Duration.Seconds()
	}
	if cfg.Requests != Unbounded {
		rep.Config.Requests = cfg.Requests
	}
	if cfg.IsOpenLoop() {
		rep.Config.Mode, rep.Config.Rate, rep.Config.Stages = "open", cfg.Rate, cfg.Stages
		if cfg.Engine == EngineFastHTTP {
			rep.Config.MaxWorkers = cfg.MaxWorkers
		}
		rep.TargetRate = cfg.Rate
	}
	if cfg.Engine == EngineLoop {
		rep.Config.Loops = cfg.Loops
		if cfg.IsOpenLoop() {
			rep.Config.CoalesceUs = cfg.Coalesce.Microseconds()
		}
	}

	if !agg.lastDone.IsZero() {
		rep.ElapsedSeconds = max(0, agg.lastDone.Sub(t.measureStart).Seconds())
	}
	// The span the rates are over: the measured phase, and in the open loop
	// at least its schedule (N slots take N periods, the last one included).
	rateSpan := max(rep.ElapsedSeconds, t.schedule.Seconds())
	total := agg.total()
	rep.Latency = summarize(total, agg.clamped)
	for _, b := range total.CumulativeDistributionWithTicks(5) {
		if total.TotalCount() == 0 {
			break
		}
		rep.Distribution = append(rep.Distribution, Point{Percentile: b.Quantile, Us: b.ValueAt, Count: b.Count})
	}
	if enc, err := total.Encode(hdrhistogram.V2CompressedEncodingCookieBase); err == nil {
		rep.Histogram = string(enc) // Encode's output is already the base64 text form
	}
	if cfg.IsOpenLoop() {
		svc := summarize(agg.svc, 0)
		rep.Service = &svc
		l := summarize(agg.lag, 0)
		rep.ScheduleLag = &Lag{Count: l.Count, Mean: l.Mean, P50: l.P50, P90: l.P90, P99: l.P99, P999: l.P999, Max: l.Max}
	}

	for i := range agg.sc {
		s := &agg.sc[i]
		sr := ScenarioReport{
			Name:    cfg.Scenarios[i].Name,
			Kind:    cfg.Scenarios[i].Kind,
			Sent:    s.sent,
			Errors:  s.errors,
			Latency: summarize(agg.scenarioHist(i), 0),
			Bytes:   Bytes{Sent: s.bytesSent, Received: s.bytesRecv},
		}
		if rateSpan > 0 {
			sr.Rate = float64(s.sent-s.errors) / rateSpan
		}
		rep.Scenarios = append(rep.Scenarios, sr)
		rep.Requests.Sent += s.sent
		rep.Requests.Errors += s.errors
		rep.Bytes.Sent += s.bytesSent
		rep.Bytes.Received += s.bytesRecv
	}
	rep.Requests.Responses = rep.Latency.Count
	rep.Requests.Unsent = agg.unsent
	rep.Requests.WSSkipped = agg.wsOther
	if rateSpan > 0 {
		rep.AchievedRate = float64(rep.Requests.Sent-rep.Requests.Errors) / rateSpan
	}

	for code, n := range agg.statuses {
		rep.Statuses[strconv.Itoa(code)] = n
		if code < 200 || code > 299 {
			rep.Errors.Status[strconv.Itoa(code)] = n
		}
	}
	for k, p := range agg.reasons {
		rep.Errors.Reason[k] = *p
	}
	e := &rep.Errors
	e.Total = rep.Requests.Errors
	e.Timeout, e.Connect, e.Connection = agg.classes[classTimeout], agg.classes[classConnect], agg.classes[classConnection]
	e.Pool, e.Other = agg.classes[classPool], agg.classes[classOther]
	for c, s := range agg.samples {
		if s != "" {
			if e.Samples == nil {
				e.Samples = map[string]string{}
			}
			e.Samples[errClass(c).String()] = s
		}
	}
	if n := rep.Requests.Sent + rep.Requests.Unsent; n > 0 {
		rep.ErrorRate = float64(e.Total+rep.Requests.Unsent) / float64(n)
	}
	return rep
}

// redactedScenarios copies scs with header values replaced: headers may
// carry credentials, and reports are shared.
func redactedScenarios(scs []Scenario) []Scenario {
	out := append([]Scenario(nil), scs...)
	for i := range out {
		if len(out[i].Headers) == 0 {
			continue
		}
		h := make(map[string]string, len(out[i].Headers))
		for k := range out[i].Headers {
			h[k] = "(redacted)"
		}
		out[i].Headers = h
	}
	return out
}

func generatorStats(ms0, ms1 *runtime.MemStats) Generator {
	g := Generator{GoVersion: runtime.Version(), GoMaxProcs: runtime.GOMAXPROCS(0)}
	g.GCCount = ms1.NumGC - ms0.NumGC
	g.GCPauseTotalUs = int64(ms1.PauseTotalNs-ms0.PauseTotalNs) / 1e3
	for i := uint32(0); i < min(g.GCCount, uint32(len(ms1.PauseNs))); i++ {
		p := ms1.PauseNs[(ms1.NumGC-1-i)%uint32(len(ms1.PauseNs))]
		g.GCPauseMaxUs = max(g.GCPauseMaxUs, int64(p/1e3))
	}
	return g
}

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// ReadReport decodes a report written by WriteJSON, of this version or of
// version 1 (its histogram is unwrapped; it has no series).
func ReadReport(r io.Reader) (*Report, error) {
	var rep Report
	if err := json.NewDecoder(r).Decode(&rep); err != nil {
		return nil, fmt.Errorf("cannot read loadgen report: %w", err)
	}
	switch rep.Version {
	case ReportVersion:
	case 1, 2:
		if rep.Version == 1 {
			enc, err := base64.StdEncoding.DecodeString(rep.Histogram)
			if err != nil {
				return nil, fmt.Errorf("cannot read loadgen report: version 1 histogram: %w", err)
			}
			rep.Histogram = string(enc)
		}
		// Their achievedRate counted every sent request; the successful
		// ones over the measured phase come as close as they can.
		rep.AchievedRate = 0
		if rep.ElapsedSeconds > 0 {
			rep.AchievedRate = float64(rep.Requests.Sent-rep.Requests.Errors) / rep.ElapsedSeconds
		}
		rep.Version = ReportVersion
	default:
		return nil, fmt.Errorf("cannot read loadgen report: version %d; want %d (or 1, 2)", rep.Version, ReportVersion)
	}
	return &rep, nil
}

// fmtUs formats a latency in microseconds with a readable unit.
func fmtUs(us float64) string {
	switch {
	case us < 1000:
		return strconv.FormatFloat(us, 'f', 0, 64) + "µs"
	case us < 1e6:
		return strconv.FormatFloat(us/1e3, 'f', 2, 64) + "ms"
	default:
		return strconv.FormatFloat(us/1e6, 'f', 2, 64) + "s"
	}
}

// fmtBytes formats a byte count with a binary unit.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	f, u := float64(n), 0
	for f >= unit && u < 4 {
		f /= unit
		u++
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + " " + [...]string{"B", "KiB", "MiB", "GiB", "TiB"}[u]
}

// sortedKeys returns m's keys, numeric ones in numeric order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, errA := strconv.Atoi(keys[i])
		b, errB := strconv.Atoi(keys[j])
		if errA == nil && errB == nil {
			return a < b
		}
		return keys[i] < keys[j]
	})
	return keys
}
