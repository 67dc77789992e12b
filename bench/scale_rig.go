package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/procrun"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
	"github.com/pinned-go/pinned/worker"
)

// scalePinboardEnv are the settings of every pinboard of the scale suite:
// a thousand workers register from one address with one token, so the
// registration rate limits and the per-token session cap, which guard
// against a misbehaving client, are off.
var scalePinboardEnv = []string{"PINBOARD_REGISTER_IP_RATE=off", "PINBOARD_REGISTER_TOKEN_RATE=off", "PINBOARD_MAX_SESSIONS_PER_TOKEN=off"}

// heartbeatInterval is the workers' heartbeat cadence (every worker the
// suite runs uses the default).
const heartbeatInterval = worker.DefaultHeartbeatInterval

var simReady = regexp.MustCompile(`msg="simulated workers registered"`)

// scaleRig is one point's processes: Redis (one node, or the three masters
// of a cluster), pinboards on it, and the workers the row starts.
type scaleRig struct {
	*rig
	redis     []*proc
	redisURL  string
	pinboards []*proc
}

// newScaleRig starts Redis (a three-master cluster when cluster is set)
// and n pinboards with scalePinboardEnv and env.
func (s *session) newScaleRig(cluster bool, n int, env ...string) (*scaleRig, error) {
	r, err := newRig(s.o, s.bins)
	if err != nil {
		return nil, err
	}
	sr := &scaleRig{rig: r}
	if err := sr.startRedisSet(cluster); err != nil {
		r.close()
		return nil, err
	}
	for i := range n {
		p, err := r.startPinboardURL(fmt.Sprintf("pinboard-%d", i+1), s.bins.pinboard, sr.redisURL, append(slices.Clone(scalePinboardEnv), env...)...)
		if err != nil {
			r.close()
			return nil, err
		}
		sr.pinboards = append(sr.pinboards, p)
	}
	return sr, nil
}

// startRedisSet starts one redis-server, or three cluster nodes joined into
// one cluster.
func (sr *scaleRig) startRedisSet(cluster bool) error {
	if !cluster {
		p, err := sr.startRedis()
		if err != nil {
			return err
		}
		sr.redis, sr.redisURL = []*proc{p}, "redis://"+p.addr+"/0"
		return nil
	}
	var addrs []string
	for i := range 3 {
		p, err := sr.startRedisNode(fmt.Sprintf("redis-%d", i+1), true)
		if err != nil {
			return err
		}
		sr.redis = append(sr.redis, p)
		addrs = append(addrs, p.addr)
	}
	sr.redisURL = redistest.ClusterURL(addrs)
	return redistest.FormCluster(addrs)
}

// pb returns the first pinboard.
func (sr *scaleRig) pb() *proc { return sr.pinboards[0] }

// startSimworkers starts n simulated workers registered with the first
// pinboard; it returns once every one holds a lease.
func (sr *scaleRig) startSimworkers(n int) (*proc, error) {
	p, err := sr.start("simworkers", sr.o.PinBackend, procrun.Spec{
		Bin:          sr.bins.simworkers,
		Args:         []string{"-workers", strconv.Itoa(n), "-max-instances", "1000000"},
		Env:          []string{"PINNED_PINBOARD_URL=http://" + sr.pb().addr, "PINNED_TOKEN=" + token},
		Ready:        simReady,
		ReadyTimeout: time.Minute + time.Duration(n)*100*time.Millisecond,
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// redisSnap is what Redis reported at one instant, summed over its nodes.
type redisSnap struct {
	at       time.Time
	commands map[string]int64 // calls per command (INFO commandstats)
	total    int64            // total_commands_processed
	cpu      float64          // used_cpu_sys + used_cpu_user, seconds
	memory   int64            // used_memory, bytes
	keys     int64            // keys of db0
}

// snapRedis reads INFO of every node.
func snapRedis(nodes []*proc) (redisSnap, error) {
	sn := redisSnap{at: time.Now(), commands: map[string]int64{}}
	for _, n := range nodes {
		body, err := redisInfo(n.addr, "all")
		if err != nil {
			return sn, fmt.Errorf("INFO on %s: %w", n.addr, err)
		}
		for k, v := range parseCommandStats(body) {
			sn.commands[k] += v
		}
		f := parseInfo(body)
		sn.total += atoi(f["total_commands_processed"])
		sys, _ := strconv.ParseFloat(f["used_cpu_sys"], 64)
		user, _ := strconv.ParseFloat(f["used_cpu_user"], 64)
		sn.cpu += sys + user
		sn.memory += atoi(f["used_memory"])
		for _, kv := range strings.Split(f["db0"], ",") {
			if v, ok := strings.CutPrefix(kv, "keys="); ok {
				sn.keys += atoi(v)
			}
		}
	}
	return sn, nil
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return n
}

// rigSnap is the first pinboard's /metrics and Redis at one instant.
type rigSnap struct {
	metrics []byte
	redis   redisSnap
}

func (sr *scaleRig) snap() (rigSnap, error) {
	m, err := metrics(sr.pb().admin)
	if err != nil {
		return rigSnap{}, err
	}
	r, err := snapRedis(sr.redis)
	return rigSnap{m, r}, err
}

// diff returns how much a pinboard series grew from a to b.
func (a rigSnap) diff(b rigSnap, series string) float64 {
	return metricValue(b.metrics, series) - metricValue(a.metrics, series)
}

// redisDelta is what Redis did between two snapshots.
type redisDelta struct {
	secs     float64
	commands int64 // INFO excluded
	cpu      float64
	byName   map[string]int64
}

func (a redisSnap) to(b redisSnap) redisDelta {
	d := delta(a.commands, b.commands)
	return redisDelta{secs: b.at.Sub(a.at).Seconds(), commands: sum(d), cpu: b.cpu - a.cpu, byName: d}
}

// net returns the commands and CPU seconds of d above the background rate
// of idle (another window with no load).
func (d redisDelta) net(idle redisDelta) (commands, cpu float64) {
	if idle.secs <= 0 {
		return float64(d.commands), d.cpu
	}
	return math.Max(0, float64(d.commands)-float64(idle.commands)/idle.secs*d.secs), math.Max(0, d.cpu-idle.cpu/idle.secs*d.secs)
}

// quietWindow watches Redis (and the CPU of ps) for the suite's idle
// window with no load from the bench: the background of what follows.
func (s *session) quietWindow(ctx context.Context, sr *scaleRig, ps ...*proc) (redisDelta, map[*proc]float64, error) {
	cpu := snapshotCPU(ps...)
	r0, err := snapRedis(sr.redis)
	if err != nil {
		return redisDelta{}, nil, err
	}
	if err := sleepCtx(ctx, s.idleWindow()); err != nil {
		return redisDelta{}, nil, err
	}
	r1, err := snapRedis(sr.redis)
	if err != nil {
		return redisDelta{}, nil, err
	}
	return r0.to(r1), cpu.since(), nil
}

// measurePoints measures every point of row, once per variant ("" for
// none), logging each under label.
func (s *session) measurePoints(label, id string, variants []string, measure func(n int, variant string) (scalePoint, error)) ([]scalePoint, error) {
	var pts []scalePoint
	dim := row(id).dim
	for _, n := range s.pointsOf(id) {
		for _, vr := range variants {
			at := strings.TrimSpace(fmt.Sprintf("%s = %d %s", dim, n, vr))
			s.logf("  scale %s: %s", label, at)
			p, err := measure(n, vr)
			if err != nil {
				return nil, fmt.Errorf("%s at %s: %w", label, at, err)
			}
			p.variant = vr
			pts = append(pts, p)
		}
	}
	return pts, nil
}

// handover is the rig of S5 and S8: one pinboard (with env), worker A
// holding n new ids (named by idPrefix and runID), then worker B
// registered beside it.
func (s *session) handover(ctx context.Context, label string, n int, cluster bool, idPrefix, runID string, env ...string) (sr *scaleRig, a, b *proc, f *fillResult, err error) {
	if sr, err = s.newScaleRig(cluster, 1, env...); err != nil {
		return nil, nil, nil, nil, err
	}
	defer func() {
		if err != nil {
			sr.close()
		}
	}()
	if a, err = sr.startCounter("worker-a", sr.pb().addr); err != nil {
		return
	}
	if f, err = sr.fill(ctx, sr.pb().addr, idPrefix, runID, n); err != nil {
		return
	}
	if f.errors > 0 {
		s.note("%s at %d: %d activations of the fill failed: %s", label, n, f.errors, f.detail)
	}
	b, err = sr.startCounter("worker-b", sr.pb().addr)
	return
}

// metrics returns the admin /metrics text of a pinboard (or a counter's
// admin listener).
func metrics(admin string) ([]byte, error) {
	code, body := httpGet("http://"+admin+"/metrics", 10*time.Second)
	if code != 200 {
		return nil, fmt.Errorf("GET %s/metrics: status %d", admin, code)
	}
	return body, nil
}

// metricSum returns the sum of series over the /metrics of every admin
// listener (a missing series counts 0).
func metricSum(admins []string, series ...string) (float64, error) {
	var t float64
	for _, a := range admins {
		body, err := metrics(a)
		if err != nil {
			return 0, err
		}
		for _, sr := range series {
			t += math.Max(0, metricValue(body, sr))
		}
	}
	return t, nil
}

func admins(ps []*proc) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.admin
	}
	return out
}

// histBuckets returns the cumulative counts by upper bound of one
// Prometheus histogram series in body: name_bucket lines whose labels
// contain labels (`endpoint="heartbeat"`).
func histBuckets(body []byte, name, labels string) map[float64]float64 {
	out := map[float64]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name+"_bucket{") || !strings.Contains(l, labels) {
			continue
		}
		_, after, ok := strings.Cut(l, `le="`)
		if !ok {
			continue
		}
		le, rest, _ := strings.Cut(after, `"`)
		bound, err := strconv.ParseFloat(le, 64)
		if le == "+Inf" {
			bound, err = math.Inf(1), nil
		}
		_, val, _ := strings.Cut(rest, " ")
		n, err2 := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err == nil && err2 == nil {
			out[bound] = n
		}
	}
	return out
}

// histQuantile returns the upper bound of the bucket holding quantile q of
// the observations made between two readings of a histogram (NaN when
// there were none).
func histQuantile(before, after map[float64]float64, q float64) float64 {
	bounds := make([]float64, 0, len(after))
	for b := range after {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 {
		return math.NaN()
	}
	total := after[bounds[len(bounds)-1]] - before[bounds[len(bounds)-1]]
	if total <= 0 {
		return math.NaN()
	}
	for _, b := range bounds {
		if after[b]-before[b] >= q*total {
			return b
		}
	}
	return math.Inf(1)
}

// registryCall sends an authenticated registry request to a pinboard and
// returns the status and body (status 0 on a transport error).
func registryCall(pinboard, method, path string, body any) (int, []byte) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + pinboard + path)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		b, _ := json.Marshal(body)
		req.Header.SetContentType("application/json")
		req.SetBody(b)
	}
	if err := httpClient.DoTimeout(req, resp, 10*time.Second); err != nil {
		return 0, nil
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...)
}

// workersOf lists the sessions a pinboard's Redis holds.
func workersOf(pinboard string) ([]wire.WorkerInfo, error) {
	code, body := registryCall(pinboard, fasthttp.MethodGet, wire.PathWorkers, nil)
	var list wire.WorkersResponse
	if code != 200 {
		return nil, fmt.Errorf("GET %s: status %d %s", wire.PathWorkers, code, body)
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET %s: %w", wire.PathWorkers, err)
	}
	return list.Workers, nil
}

// sessionAt returns the session of the worker advertised at addr.
func sessionAt(pinboard, addr string) (wire.WorkerInfo, bool, error) {
	ws, err := workersOf(pinboard)
	if err != nil {
		return wire.WorkerInfo{}, false, err
	}
	for _, w := range ws {
		if w.AdvertiseURL == "http://"+addr {
			return w, true, nil
		}
	}
	return wire.WorkerInfo{}, false, nil
}

// fill places n new ids through the pinboard at addr (closed loop, 64
// connections): loadgen's -dist new names them <idPrefix><runID>-<k>, k
// from 0 to n-1, so fillIDs(idPrefix, runID) draws them again.
func (sr *scaleRig) fill(ctx context.Context, addr, idPrefix, runID string, n int) (*fillResult, error) {
	rep, _, err := sr.runLoadgen(ctx, "fill-"+runID, "-url", "http://"+addr, "-path", "/counter/{id}/", "-dist", "new",
		"-id-prefix", idPrefix, "-run-id", runID, "-c", "64", "-requests", strconv.Itoa(n),
		"-duration", (10*time.Minute + time.Duration(n)*time.Millisecond).String(), "-timeout", "30s")
	if err != nil {
		return nil, err
	}
	smp := sampleOf(rep)
	return &fillResult{placed: rep.Requests.Sent - rep.Requests.Errors, errors: rep.Requests.Errors, rate: smp.Goodput, p99: smp.P99,
		detail: smp.ErrorDetail}, nil
}

// fillResult is what a fill did.
type fillResult struct {
	placed, errors int64
	rate, p99      float64 // successful activations/s, ms
	detail         string
}

// fillIDs returns the -id-prefix under which -dist uniform draws the ids
// of a fill (ids <prefix><k>).
func fillIDs(idPrefix, runID string) string { return idPrefix + runID + "-" }

// probe runs an open-loop workload rounds times against one target (the
// rig's pinboard in front of backend) and returns the samples, which also
// go into the suite's results.
func (s *session) probe(ctx context.Context, sr *scaleRig, w workload, backend *proc) ([]Sample, error) {
	t := target{name: "pinboard", url: "http://" + sr.pb().addr, proxy: sr.pb(), backend: backend, redis: sr.redis[0]}
	var out []Sample
	for round := 1; round <= s.o.Rounds; round++ {
		smp, err := s.measure(ctx, sr.rig, w, t, round)
		if err != nil {
			return nil, err
		}
		out = append(out, smp)
		s.res.Samples = append(s.res.Samples, smp)
	}
	return out, nil
}

// medianSample returns the median over samples of f.
func medianSample(xs []Sample, f func(Sample) float64) float64 {
	m := map[int]Sample{}
	for i, x := range xs {
		m[i] = x
	}
	return medianOf(m, f)
}

// probeFigures records a probe's medians under prefix: p99 and lag p99
// (ms), the proxy's and backend's CPU per request (µs), and errors.
func probeFigures(v map[string]float64, prefix string, xs []Sample) {
	v[prefix+" p99 ms"] = medianSample(xs, p99Of)
	v[prefix+" p50 ms"] = medianSample(xs, func(x Sample) float64 { return x.P50 })
	v[prefix+" lag p99 ms"] = medianSample(xs, func(x Sample) float64 { return x.ScheduleLagP99Ms })
	v[prefix+" pinboard cpu us"] = medianSample(xs, func(x Sample) float64 { return nanIfMissing(x.CPUus, "proxy") })
	v[prefix+" backend cpu us"] = medianSample(xs, func(x Sample) float64 { return nanIfMissing(x.CPUus, "backend") })
	v[prefix+" loadgen cpu us"] = medianSample(xs, func(x Sample) float64 { return nanIfMissing(x.CPUus, "loadgen") })
	var errs float64
	for _, x := range xs {
		errs += float64(x.Errors + x.Unsent)
	}
	v[prefix+" errors"] = errs
}

// openLoop is an open-loop workload of GET /counter/{id}/ at rate.
func openLoop(name string, rate int, ids ...string) workload {
	args := append([]string{"-rate", strconv.Itoa(rate), "-c", "64", "-max-workers", "512", "-path", "/counter/{id}/"}, ids...)
	return workload{name: name, desc: name, args: args, open: true}
}

// redisSampler samples Redis's total commands every interval, to find the
// peak rate of a window.
type redisSampler struct {
	stop chan struct{}
	wg   sync.WaitGroup
	peak float64 // commands/s over the busiest interval; read after end
}

// sampleRedis starts a sampler of nodes; end stops it.
func sampleRedis(nodes []*proc, interval time.Duration) *redisSampler {
	rs := &redisSampler{stop: make(chan struct{})}
	rs.wg.Go(func() { // owned by rs: end stops it and waits
		t := time.NewTicker(interval)
		defer t.Stop()
		last, err := snapTotal(nodes)
		lastAt := time.Now()
		for {
			select {
			case <-rs.stop:
				return
			case <-t.C:
			}
			n, err2 := snapTotal(nodes)
			now := time.Now()
			if err == nil && err2 == nil && now.After(lastAt) {
				rs.peak = math.Max(rs.peak, float64(n-last)/now.Sub(lastAt).Seconds())
			}
			last, lastAt, err = n, now, err2
		}
	})
	return rs
}

// end stops the sampler and returns the peak commands/s it saw.
func (rs *redisSampler) end() float64 {
	close(rs.stop)
	rs.wg.Wait()
	return rs.peak
}

// snapTotal sums total_commands_processed over nodes.
func snapTotal(nodes []*proc) (int64, error) {
	var t int64
	for _, n := range nodes {
		body, err := redisInfo(n.addr, "stats")
		if err != nil {
			return 0, err
		}
		t += atoi(parseInfo(body)["total_commands_processed"])
	}
	return t, nil
}

// perOrNaN returns a ÷ b, NaN when b is not positive.
func perOrNaN(a, b float64) float64 {
	if b <= 0 {
		return math.NaN()
	}
	return a / b
}
