package soak

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/testkit/proctest"
	"github.com/pinned-go/pinned/internal/testkit/redistest"
)

var (
	soakFor     = flag.Duration("soak-duration", 0, "run TestSoak this long (0: skip it)")
	killEvery   = flag.Duration("soak-kill-every", 5*time.Minute, "kill a worker (SIGKILL, restarted) this often")
	sampleEvery = flag.Duration("soak-sample", 10*time.Second, "sample every process's RSS, fds and goroutines this often")
	reportPath  = flag.String("soak-report", "", "write the result as Markdown to this file (relative to the module root)")
)

var builder proctest.Builder

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	builder.Cleanup()
	os.Exit(code)
}

const (
	token          = "soak-deployment-token-0123456789"
	keys           = 50_000 // the id space of the Zipf mix
	zipfS          = 1.1
	idleTimeout    = 20 * time.Second // the workers': cold ids are evicted
	calibrateFor   = 5 * time.Second
	calibrateConns = 64
	maxInFlight    = 512
	reqTimeout     = 10 * time.Second
	// killSettle is how long after a kill the samples are left out of the
	// flatness check: the dead worker's ids are moving to the others.
	killSettle = 60 * time.Second
)

var (
	pinboardReady = regexp.MustCompile(`msg="pinboard listening".* public=(\S+) admin=(\S+)`)
	counterReady  = regexp.MustCompile(`msg="counter demo listening".* addr=(\S+) admin=(\S+)`) // fleet mode: /metrics on the loopback admin listener
	goroutinesRE  = regexp.MustCompile(`(?m)^go_goroutines (\d+)`)
)

// sample is one reading of a process's resources.
type sample struct {
	at         time.Duration // since the soak began
	rss        int64         // bytes
	fds        int
	goroutines int // -1: not a Go process
}

// proc is one process incarnation the soak samples.
type proc struct {
	name    string
	pid     func() int
	metrics string // a /metrics URL with go_goroutines; "" for redis
	samples []sample
	done    bool // killed: no more samples
}

func (p *proc) sample(at time.Duration) error {
	pid := p.pid()
	if pid == 0 {
		return fmt.Errorf("%s: not running", p.name)
	}
	s := sample{at: at, goroutines: -1}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			s.rss = kb << 10
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return err
	}
	s.fds = len(fds)
	if p.metrics != "" {
		code, body, err := fasthttp.GetTimeout(nil, p.metrics, 5*time.Second)
		if err != nil || code != 200 {
			return fmt.Errorf("%s: GET %s = %d %v", p.name, p.metrics, code, err)
		}
		m := goroutinesRE.FindSubmatch(body)
		if m == nil {
			return fmt.Errorf("%s: no go_goroutines in %s", p.name, p.metrics)
		}
		s.goroutines, _ = strconv.Atoi(string(m[1]))
	}
	p.samples = append(p.samples, s)
	return nil
}

// tally counts the answers by class.
type tally struct {
	mu      sync.Mutex
	classes map[string]int
	lost    int
	total   int
}

// record classifies one answer: a clean one, or a lost request.
func (t *tally) record(err error, resp *fasthttp.Response) {
	class, lost := "", false
	switch {
	case err != nil && errors.Is(err, fasthttp.ErrTimeout):
		class, lost = "LOST: timeout", true
	case err != nil:
		class, lost = "LOST: connection error", true
	default:
		st := resp.StatusCode()
		ra := len(resp.Header.Peek(wire.HeaderRetryAfter)) > 0
		reason := string(resp.Header.Peek(wire.HeaderReason))
		switch {
		case st < 300:
			class = "2xx"
		case st < 500:
			class = strconv.Itoa(st)
		case (st == 503 || st == 502 || st == 504) && ra:
			class = strings.TrimSpace(fmt.Sprintf("%d %s + Retry-After", st, reason))
		default:
			class, lost = strings.TrimSpace(fmt.Sprintf("LOST: %d %s without Retry-After", st, reason)), true
		}
	}
	t.mu.Lock()
	t.classes[class]++
	t.total++
	if lost {
		t.lost++
	}
	t.mu.Unlock()
}

// worker is one counter worker process.
type worker struct {
	*proctest.Proc
	addr  string // the public listener, advertised to the pinboard
	admin string // the loopback admin listener: /metrics
	inc   int
}

func startWorker(t *testing.T, n, inc int, addr, pinboard string) *worker {
	t.Helper()
	p := proctest.Start(t, proctest.Spec{
		Name: fmt.Sprintf("w%d.%d", n, inc),
		Bin:  builder.Build(t, "github.com/pinned-go/pinned/examples/counter"),
		Args: []string{"-idle-timeout", idleTimeout.String(), "-max-instances", "200000", "-shutdown-timeout", "3s"},
		Env: []string{"PINNED_LISTEN=" + addr, "PINNED_PINBOARD_URL=http://" + pinboard,
			"PINNED_TOKEN=" + token, "PINNED_ADVERTISE_URL=http://" + addr},
		Ready: counterReady,
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _, err := fasthttp.GetTimeout(nil, "http://"+addr+"/healthz", time.Second)
		if err == nil && code == 200 {
			return &worker{Proc: p, addr: addr, admin: p.Ready()[2], inc: inc}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not registered within 20 s:\n%s", p.Spec.Name, p.Log())
		}
		time.Sleep(50 * time.Millisecond) // polling another process's readiness
	}
}

// ids draws ids from the Zipf mix.
type ids struct {
	mu sync.Mutex
	z  *rand.Zipf
}

func newIDs(seed uint64) *ids {
	r := rand.New(rand.NewPCG(seed, 0x50a4))
	return &ids{z: rand.NewZipf(r, zipfS, 1, keys-1)}
}

func (g *ids) next() string {
	g.mu.Lock()
	k := g.z.Uint64()
	g.mu.Unlock()
	return "k" + strconv.FormatUint(k, 10)
}

// send makes one request: GET /counter/<id>/ (four in five) or POST
// /counter/<id>/incr.
func send(hc *fasthttp.Client, base, id string, post bool, tl *tally) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	if post {
		req.Header.SetMethod("POST")
		req.SetRequestURI(base + "/counter/" + id + "/incr")
	} else {
		req.SetRequestURI(base + "/counter/" + id + "/")
	}
	err := hc.DoTimeout(req, resp, reqTimeout)
	if tl != nil {
		tl.record(err, resp)
	}
}

// calibrate measures the pinboard's throughput: a closed loop of
// calibrateConns connections for calibrateFor, after as long a warm-up
// (the id mix's instances activated, a steady state of churn).
func calibrate(hc *fasthttp.Client, base string, g *ids) float64 {
	closedLoop(hc, base, g, idleTimeout)
	return float64(closedLoop(hc, base, g, calibrateFor)) / calibrateFor.Seconds()
}

// closedLoop sends requests on calibrateConns connections for d and
// returns how many completed.
func closedLoop(hc *fasthttp.Client, base string, g *ids, d time.Duration) int64 {
	var n atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range calibrateConns {
		wg.Go(func() {
			for k := 0; time.Now().Before(end); k++ {
				send(hc, base, g.next(), (i+k)%5 == 0, nil)
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return n.Load()
}

// openLoop sends rate requests per second until stop is closed: slot i is
// due at start + i/rate and goes to a pool of maxInFlight senders; a slot
// that finds them all busy and the queue full waits (counted late), it is
// never dropped.
func openLoop(hc *fasthttp.Client, base string, g *ids, rate float64, tl *tally, stop <-chan struct{}, late *atomic.Int64) {
	type slot struct {
		id   string
		post bool
	}
	q := make(chan slot, maxInFlight)
	var wg sync.WaitGroup
	for range maxInFlight {
		wg.Go(func() {
			for sl := range q {
				send(hc, base, sl.id, sl.post, tl)
			}
		})
	}
	defer wg.Wait()
	defer close(q)
	start := time.Now()
	for sent := int64(0); ; {
		select {
		case <-stop:
			return
		default:
		}
		for due := int64(time.Since(start).Seconds() * rate); sent < due; sent++ {
			sl := slot{g.next(), sent%5 == 0}
			select {
			case q <- sl:
			default:
				late.Add(1)
				q <- sl
			}
		}
		time.Sleep(time.Millisecond) // the schedule's tick: slots due meanwhile go out together
	}
}

// settled drops the samples taken within killSettle after a kill.
func settled(ss []sample, kills []time.Duration) []sample {
	return slices.DeleteFunc(slices.Clone(ss), func(s sample) bool {
		for _, k := range kills {
			if s.at >= k && s.at < k+killSettle {
				return true
			}
		}
		return false
	})
}

// workerTotals sums the samples of the worker incarnations taken in the
// same sampling round (by time).
func workerTotals(procs []*proc) []sample {
	byAt := map[time.Duration]*sample{}
	for _, p := range procs {
		if !strings.HasPrefix(p.name, "w") {
			continue
		}
		for _, s := range p.samples {
			t := byAt[s.at]
			if t == nil {
				t = &sample{at: s.at}
				byAt[s.at] = t
			}
			t.rss += s.rss
			t.fds += s.fds
			t.goroutines += s.goroutines
		}
	}
	var out []sample
	for _, at := range slices.Sorted(maps.Keys(byAt)) {
		out = append(out, *byAt[at])
	}
	return out
}

// minJudged is the fewest samples (after the warm-up and the settle
// windows) a series needs to be judged flat or not; a shorter run only
// reports them.
const minJudged = 30

// flat reports whether a series stayed flat (see the package doc), with
// its first-third and last-third medians; judged is false when the series
// is too short to tell.
func flat(xs []float64, mul, add float64) (ok, judged bool, first, last float64) {
	xs = xs[len(xs)/5:] // warm-up
	if len(xs) < 3 {
		return true, false, 0, 0
	}
	judged = len(xs) >= minJudged
	third := len(xs) / 3
	first, last = median(xs[:third]), median(xs[len(xs)-third:])
	return last <= first*mul+add, judged, first, last
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func TestSoak(t *testing.T) {
	if *soakFor <= 0 {
		t.Skip("the soak runs only with -soak-duration (see the package doc)")
	}
	rs := redistest.Start(t)
	pb := proctest.Start(t, proctest.Spec{
		Name: "pinboard",
		Bin:  builder.Build(t, "github.com/pinned-go/pinned/cmd/pinboard"),
		Env: []string{"PINBOARD_LISTEN=127.0.0.1:0", "PINBOARD_ADMIN_LISTEN=127.0.0.1:0",
			"PINBOARD_REDIS_URL=" + rs.URL, "PINBOARD_TOKEN=" + token, "PINBOARD_RESTART_FENCE=0s"},
		Ready: pinboardReady,
	})
	public, admin := pb.Ready()[1], pb.Ready()[2]
	base := "http://" + public
	procs := []*proc{
		{name: "redis-server", pid: rs.Pid},
		{name: "pinboard", pid: pb.Pid, metrics: "http://" + admin + "/metrics"},
	}
	var ws []*worker
	for n := 1; n <= 3; n++ {
		w := startWorker(t, n, 1, proctest.FreeAddr(t), public)
		ws = append(ws, w)
		procs = append(procs, &proc{name: w.Spec.Name, pid: w.Pid, metrics: "http://" + w.admin + "/metrics"})
	}
	// A soak that cannot sample a process fails now, not after its whole duration.
	for _, p := range procs {
		if p.metrics == "" {
			continue
		}
		if code, _, err := fasthttp.GetTimeout(nil, p.metrics, 5*time.Second); err != nil || code != 200 {
			t.Fatalf("%s: GET %s = %d %v: the soak could not sample it", p.name, p.metrics, code, err)
		}
	}
	hc := &fasthttp.Client{MaxConnsPerHost: maxInFlight + calibrateConns, MaxIdemponentCallAttempts: 1,
		ReadTimeout: reqTimeout, WriteTimeout: reqTimeout, MaxIdleConnDuration: 30 * time.Second}
	defer hc.CloseIdleConnections()
	g := newIDs(uint64(time.Now().UnixNano()))
	capacity := calibrate(hc, base, g)
	rate := capacity / 2
	t.Logf("capacity %.0f req/s (closed loop, %d connections); soak at %.0f req/s for %v, a worker killed every %v",
		capacity, calibrateConns, rate, *soakFor, *killEvery)

	tl := &tally{classes: map[string]int{}}
	var late atomic.Int64
	stop := make(chan struct{})
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); openLoop(hc, base, g, rate, tl, stop, &late) }()
	began := time.Now()
	end := began.Add(*soakFor)
	nextKill, nextSample := began.Add(*killEvery), began
	kills := 0
	var killedAt []time.Duration
	var sampleErrs []string
	for now := time.Now(); now.Before(end); now = time.Now() {
		if !now.Before(nextSample) {
			for _, p := range procs {
				if !p.done {
					if err := p.sample(now.Sub(began)); err != nil {
						sampleErrs = append(sampleErrs, err.Error())
					}
				}
			}
			nextSample = nextSample.Add(*sampleEvery)
		}
		if !now.Before(nextKill) {
			n := kills % 3
			old := ws[n]
			for _, p := range procs {
				if p.name == old.Spec.Name {
					p.done = true
				}
			}
			old.Kill()
			<-old.Exited()
			w := startWorker(t, n+1, old.inc+1, old.addr, public)
			ws[n] = w
			procs = append(procs, &proc{name: w.Spec.Name, pid: w.Pid, metrics: "http://" + w.admin + "/metrics"})
			kills++
			killedAt = append(killedAt, now.Sub(began))
			t.Logf("%v: killed %s, %s registered", now.Sub(began).Round(time.Second), old.Spec.Name, w.Spec.Name)
			nextKill = nextKill.Add(*killEvery)
		}
		time.Sleep(min(time.Until(nextSample), time.Until(nextKill), time.Until(end), time.Second))
	}
	close(stop)
	<-loadDone
	elapsed := time.Since(began)

	var b strings.Builder
	fmt.Fprintf(&b, "# Soak run %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "Command: `go test ./test/soak -run TestSoak -v -timeout %v -soak-duration %v -soak-kill-every %v -soak-report docs/soak.md`\n\n",
		(*soakFor + 10*time.Minute).Round(time.Minute), *soakFor, *killEvery)
	b.WriteString("Written by `TestSoak` in `test/soak` (see its package doc for the method and the criteria).\n\n")
	fmt.Fprintf(&b, "| | |\n|---|---|\n| duration | %v |\n| capacity (closed loop, %d connections, %v after %v of warm-up) | %.0f req/s |\n| soak rate (half) | %.0f req/s |\n",
		elapsed.Round(time.Second), calibrateConns, calibrateFor, idleTimeout, capacity, rate)
	fmt.Fprintf(&b, "| ids | Zipf s=%.1f over %d, idle timeout %v |\n| workers killed (SIGKILL, restarted) | %d |\n| requests | %d |\n| slots sent late (%d senders busy) | %d |\n| lost without a clean answer | %d |\n\n",
		zipfS, keys, idleTimeout, kills, tl.total, maxInFlight, late.Load(), tl.lost)
	b.WriteString("Answers:\n\n| class | count |\n|---|---|\n")
	for _, k := range slices.Sorted(maps.Keys(tl.classes)) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, tl.classes[k])
	}
	fmt.Fprintf(&b, "\nResources (after the first fifth of the samples, leaving out %v after each kill: median of the first third → median of the last third; max). The workers are judged by their sum over the live incarnations, since a kill moves the dead worker's ids to the others; each incarnation is listed for reference.\n\n", killSettle)
	b.WriteString("| process | samples | RSS MiB | goroutines | open fds | flat |\n|---|---|---|---|---|---|\n")
	var notFlat []string
	unjudged := false
	row := func(name string, ss []sample, goProc, judged bool) {
		ss = settled(ss, killedAt)
		var rss, gor, fds []float64
		maxRSS, maxG, maxF := 0.0, 0.0, 0.0
		for _, s := range ss {
			rss = append(rss, float64(s.rss)/(1<<20))
			fds = append(fds, float64(s.fds))
			gor = append(gor, float64(s.goroutines))
			maxRSS, maxG, maxF = max(maxRSS, float64(s.rss)/(1<<20)), max(maxG, float64(s.goroutines)), max(maxF, float64(s.fds))
		}
		okR, enough, r0, r1 := flat(rss, 1.25, 32)
		okF, _, f0, f1 := flat(fds, 1.2, 10)
		okG, gs := true, "n/a"
		if goProc {
			var g0, g1 float64
			okG, _, g0, g1 = flat(gor, 1.2, 20)
			gs = fmt.Sprintf("%.0f → %.0f (max %.0f)", g0, g1, maxG)
		}
		verdict := "yes"
		switch {
		case !judged:
			verdict = "(see the sum)"
		case !enough:
			verdict = fmt.Sprintf("not judged (< %d samples)", minJudged)
			unjudged = true
		case !(okR && okF && okG):
			verdict = "**no**"
			notFlat = append(notFlat, name)
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f → %.0f (max %.0f) | %s | %.0f → %.0f (max %.0f) | %s |\n",
			name, len(ss), r0, r1, maxRSS, gs, f0, f1, maxF, verdict)
	}
	for _, p := range procs {
		worker := strings.HasPrefix(p.name, "w")
		row(p.name, p.samples, p.metrics != "", !worker)
	}
	row("workers (sum)", workerTotals(procs), true, true)
	verdict := "PASS"
	if tl.lost > 0 || len(notFlat) > 0 || len(sampleErrs) > 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "\nVerdict: **%s**", verdict)
	if len(notFlat) > 0 {
		fmt.Fprintf(&b, "; not flat: %s", strings.Join(notFlat, ", "))
	}
	if len(sampleErrs) > 0 {
		fmt.Fprintf(&b, "; sampling errors: %d (first: %s)", len(sampleErrs), sampleErrs[0])
	}
	if unjudged {
		fmt.Fprintf(&b, "; flatness not judged: too short a run (%d samples needed after the warm-up and the settle windows)", minJudged)
	}
	b.WriteString("\n")
	t.Log("\n" + b.String())
	if *reportPath != "" {
		path, err := proctest.FromModuleRoot(*reportPath)
		if err == nil {
			err = os.WriteFile(path, []byte(b.String()), 0o644)
		}
		if err != nil {
			t.Error(err)
		}
	}
	if tl.lost > 0 {
		t.Errorf("%d of %d requests lost without a clean answer", tl.lost, tl.total)
	}
	if len(notFlat) > 0 {
		t.Errorf("resources not flat: %v", notFlat)
	}
	if len(sampleErrs) > 0 {
		t.Errorf("sampling failed: %v", sampleErrs)
	}
	for _, w := range ws {
		_ = w.Signal(syscall.SIGKILL)
	}
}
