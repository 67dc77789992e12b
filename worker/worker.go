package worker

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// ErrStarted is returned by Attach after Run has started (the pinboard learns
// the namespaces at registration: attach every host before Run) and by a
// second call of Run.
var ErrStarted = errors.New("worker already started: attach every host before Run, and call Run once")

// ErrNoHosts is returned by Run when no host is attached: create the hosts
// with this worker in their config before calling Run.
var ErrNoHosts = errors.New("no host attached to the worker: create the hosts with this worker before calling Run")

// Worker is one process's registration with the pinboard: it proves its
// advertise URL, keeps a lease alive with heartbeats, fences the attached
// hosts when the lease is lost, relays drain and wind_down, and releases
// placements. It implements host.Worker. Create it with New, attach hosts
// (host.New calls Attach), serve its challenge handler, then call Run.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	clock    clock.Clock
	clientID string
	secret   []byte // the per-process proxy secret; never logged or exposed
	pinboard *pinboardClient
	adv      string // advertise URL, normalised
	m        *workerMetrics

	// Lease state, read lock-free by Admit.
	current   atomic.Pointer[lease]
	lastSess  atomic.Pointer[string] // id of the latest session registered, kept after it ends
	deregOnce atomic.Bool            // Shutdown's deregistration was attempted
	ended     endedSessions          // sessions a later registration replaced (release.go)
	lastLease atomic.Int64           // the pinboard's last lease length (ns), 0 before the first ack

	challenges challengeSet
	giveUps    giveUpLog // aggregated "release gave up" warnings
	releases   *releaseBatcher
	later      laterReleases // releases of instances closed during a Shutdown

	drain drainState
	// shutdownBy is the deadline of the latest Shutdown (unix ns; 0: none):
	// no call to the pinboard outlasts it (callDeadline).
	shutdownBy atomic.Int64
	// shuttingDown is set by Shutdown, whose awaitEmpty closes idle
	// instances every ShutdownPollInterval: the loop's ticks then ask for
	// no pass of their own.
	shuttingDown atomic.Bool

	mu        sync.Mutex
	hosts     []host.Attached // appended until Run starts, then only shrinks (detach); replaced, never modified
	started   bool
	observers []*leaseObserver // OnLease; replaced, never modified

	kick         chan struct{} // wakes the loop to heartbeat now (drain state changed)
	closeIdleReq chan struct{} // asks Run's idle closer for a CloseIdle(wind_down) pass (closeIdleSoon)
	stopReq      chan struct{} // closed by Shutdown: final heartbeat, then Run returns
	stopped      sync.Once
	runDone      chan struct{} // closed when Run returns

	// Test seams; zero in production.
	jitter func(n int64) int64 // uniform in [0, n); rand.Int64N
	hooks  *testHooks
}

// testHooks lets the package's tests observe and drive the loop.
type testHooks struct {
	idle func(inflight int) // called by the loop just before it blocks, with its calls in flight
	poke chan struct{}      // wakes the loop for one idle pass
}

// New validates cfg and returns a worker with a fresh clientId and secret
// from crypto/rand. It does no I/O and starts no goroutine.
func New(cfg Config) (*Worker, error) {
	cfg = cfg.withDefaults()
	pb, adv, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	w := &Worker{
		cfg:          cfg,
		clock:        cfg.Clock,
		clientID:     rand.Text(),
		secret:       []byte(rand.Text()),
		pinboard:     newPinboardClient(pb, cfg),
		adv:          adv.String(),
		kick:         make(chan struct{}, 1),
		closeIdleReq: make(chan struct{}, 1),
		stopReq:      make(chan struct{}),
		runDone:      make(chan struct{}),
		jitter:       mrand.Int64N,
	}
	w.releases = newReleaseBatcher(w.pinboard, w.clientID, cfg.ReleaseBatch)
	w.log = cfg.Logger.With("logger", "pinned.worker", "client", w.clientID)
	w.m = newWorkerMetrics(cfg.Metrics, w)
	return w, nil
}

// Attach implements host.Worker. It is called by host.New; the host's
// namespace is registered with the pinboard when Run starts. It fails after
// Run has started, for an invalid namespace, and for a namespace that
// another attached host already serves. detach (called by Host.Close) lets
// go of the host: the worker stops driving it (a call under way may still
// finish) and no longer counts it for headroom, drain and Shutdown. The
// namespaces registered stay those attached when Run started, so a
// namespace whose host was detached keeps being routed here until Run
// ends; its requests reach whatever the application serves in its place.
func (w *Worker) Attach(h host.Attached) (detach func(), err error) {
	ns := h.Namespace()
	if err := wire.CheckNamespace(ns); err != wire.SegmentOK {
		return nil, fmt.Errorf("cannot attach host %q: %w", ns, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return nil, fmt.Errorf("cannot attach host %q: %w", ns, ErrStarted)
	}
	for _, o := range w.hosts {
		if o.Namespace() == ns {
			return nil, fmt.Errorf("cannot attach host %q: another host already serves that namespace", ns)
		}
	}
	w.hosts = append(w.hosts[:len(w.hosts):len(w.hosts)], h)
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.hosts = slices.DeleteFunc(slices.Clone(w.hosts), func(o host.Attached) bool { return o == h })
		})
	}, nil
}

// attached returns the attached hosts. The slice must not be modified.
func (w *Worker) attached() []host.Attached {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hosts
}

// namespaces lists the attached hosts' namespaces in attach order.
func namespaces(hosts []host.Attached) []string {
	ns := make([]string, len(hosts))
	for i, h := range hosts {
		ns[i] = h.Namespace()
	}
	return ns
}

// live sums Len over hosts.
func live(hosts []host.Attached) int {
	n := 0
	for _, h := range hosts {
		n += h.Len()
	}
	return n
}

// maxBody is the request body limit the worker registers with: the
// smallest of its hosts' (a body one host refuses may reach it through any
// namespace the session serves).
func maxBody(hosts []host.Attached) int64 {
	var m int64
	for i, h := range hosts {
		if n := int64(h.MaxRequestBodySize()); i == 0 || n < m {
			m = n
		}
	}
	return m
}

// ClientID returns the worker's clientId, minted once by New. The pinboard
// addresses pushes (drain, wind_down) to it.
func (w *Worker) ClientID() string { return w.clientID }

// AdvertiseURL returns the normalised advertise URL the worker registers.
func (w *Worker) AdvertiseURL() string { return w.adv }

// Metrics returns the metrics set the worker writes to (Config.Metrics or
// the set New created).
func (w *Worker) Metrics() *metrics.Set { return w.cfg.Metrics }
