package host

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/fasthttp/router"
	"github.com/fasthttp/websocket"
	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
)

// Type describes an object type T to New.
type Type[T any] struct {
	// New sets up the object of a new instance before its first request is
	// served (the lifespan's setup). It runs outside any lock, once per
	// activation, while concurrent first requests for the id wait for it.
	// An error fails every waiting request (an *Error with its status, any
	// other error with 500) and leaves no instance behind; tasks New started
	// are cancelled. New may keep inst and may call inst.Go; it should
	// honour inst.Context() (an abort or Close past its deadline cancels it,
	// and Close waits for New to return). Required.
	New func(inst *Instance) (T, error)
	// Teardown ends the object (the lifespan's teardown). It runs exactly
	// once per successfully set-up instance, after every handler, stream,
	// websocket and task of the instance has returned, inside the turn.
	// Optional.
	Teardown func(obj T)
	// Routes is the object's route table. Required.
	Routes *Routes[T]
	// Alarm runs when one of the instance's alarms fires (Instance.SetAlarm),
	// inside the instance's turn, after the id was activated if it was not
	// live. x says which alarm, its scheduled time and the attempt. An error
	// (or a panic, which also aborts the instance) fails the attempt: it is
	// retried with backoff and, after the alarm's last attempt,
	// dead-lettered. Delivery is at least once. Optional: without it every
	// alarm delivery fails (404).
	Alarm func(obj T, x *AlarmCtx) error
}

// Host runs the instances of one object type under one namespace. It is
// mounted on the application's fasthttp server with Handler, Wrap or
// Register. Create it with New, call Start, and Close it on shutdown.
type Host struct {
	cfg      Config
	ns       string
	nsSlash  string // ns + "/"
	w        Worker
	detach   func() // from Worker.Attach; nil in local mode
	newObj   func(*Instance) (any, error)
	teardown func(any)
	alarm    func(any, *AlarmCtx) error // Type.Alarm; nil: none
	alarms   *localAlarms               // local mode's alarms; nil in fleet mode
	am       *alarmMetrics
	table    *table
	clock    clock.Clock
	log      *slog.Logger
	met      *hostMetrics
	throttle throttle
	seed     maphash.Seed
	shards   []shard
	upgrader websocket.FastHTTPUpgrader

	retryAfter  string // Retry-After header value
	maxIDLen    int
	tooLargeMsg string // the 413's error message

	live      atomic.Int64  // instances in the directory (activating, active, closing)
	lastEpoch atomic.Uint64 // the last local-mode epoch allocated (nextEpoch)
	closing   atomic.Bool   // Close began: no new activations
	closers   closeQueue    // idle instances waiting to be closed (scheduleClose)
	wg        sync.WaitGroup
	ctxPool   sync.Pool

	// stopCtx bounds Release calls; cancelled when Close gives up waiting.
	stopCtx    context.Context
	stopCancel context.CancelFunc

	mu         sync.Mutex // guards started and the sweeper fields
	started    bool
	sweepStop  chan struct{}
	sweepDone  chan struct{}
	closeOnce  sync.Once
	closedDone chan struct{} // closed when Close finished
	closeErr   error
}

// New creates a host for object type T. It validates cfg and compiles
// typ.Routes; it does no I/O and starts no goroutine (Start does). In fleet
// mode (cfg.Worker != nil) it calls cfg.Worker.Attach with the new host;
// Close detaches it.
func New[T any](cfg Config, typ Type[T]) (*Host, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if typ.New == nil {
		return nil, errors.New("host: Type.New is nil: provide a function that sets up an object for an *Instance")
	}
	tbl, err := compileRoutes(typ.Routes)
	if err != nil {
		return nil, err
	}
	h := &Host{
		cfg:         cfg,
		ns:          cfg.Namespace,
		nsSlash:     cfg.Namespace + "/",
		w:           cfg.Worker,
		table:       tbl,
		clock:       cfg.Clock,
		log:         cfg.Logger.With("logger", "pinned.host", "namespace", cfg.Namespace),
		met:         newHostMetrics(cfg.Metrics, cfg.Namespace),
		throttle:    throttle{clock: cfg.Clock},
		seed:        maphash.MakeSeed(),
		shards:      make([]shard, cfg.Shards),
		upgrader:    cfg.Upgrader,
		retryAfter:  strconv.FormatInt(int64((cfg.RetryAfter+time.Second-1)/time.Second), 10),
		maxIDLen:    cfg.MaxIDLen,
		closedDone:  make(chan struct{}),
		tooLargeMsg: "request body larger than " + strconv.Itoa(cfg.MaxRequestBodySize) + " bytes",
	}
	newFn := typ.New
	h.newObj = func(inst *Instance) (any, error) { return newFn(inst) }
	if td := typ.Teardown; td != nil {
		h.teardown = func(obj any) { td(obj.(T)) }
	}
	if al := typ.Alarm; al != nil {
		h.alarm = func(obj any, x *AlarmCtx) error { return al(obj.(T), x) }
	}
	pending := func() float64 { return 0 }
	if h.w == nil {
		h.alarms = newLocalAlarms(h)
		pending = h.alarms.pending
	}
	h.am = newAlarmMetrics(cfg.Metrics, cfg.Namespace, pending)
	for i := range h.shards {
		h.shards[i].m = make(map[string]*Instance)
	}
	if h.upgrader.Error == nil {
		h.upgrader.Error = h.upgradeError
	}
	h.ctxPool.New = func() any { return new(Ctx) }
	h.stopCtx, h.stopCancel = context.WithCancel(context.Background())
	if h.w != nil {
		detach, err := h.w.Attach(h)
		if err != nil {
			h.stopCancel()
			return nil, fmt.Errorf("host: cannot attach to worker: %w", err)
		}
		h.detach = detach
	}
	return h, nil
}

// Start starts the idle sweeper and, in local mode, the alarm loop.
// Requests are served with or without it, but without it no instance is
// ever evicted for idleness and no local alarm fires. Start is idempotent;
// after Close it returns ErrHostClosed.
func (h *Host) Start() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing.Load() {
		return ErrHostClosed
	}
	if h.started {
		return nil
	}
	h.started = true
	if h.cfg.IdleTimeout > 0 {
		h.sweepStop = make(chan struct{})
		h.sweepDone = make(chan struct{})
		go h.sweepLoop(h.sweepStop, h.sweepDone)
	}
	if h.alarms != nil {
		h.alarms.start()
	}
	return nil
}

// Close shuts the host down gracefully: new activations answer 503
// closing, every instance is closed as soon as its in-flight handlers,
// streams, websockets and tasks have finished, and when ctx ends first the
// remaining instances are aborted. Every teardown runs exactly once and
// Close returns only after all of them (a handler or task that ignores its
// context's cancellation keeps Close waiting). It returns ctx's error when
// it had to abort. In fleet mode it then detaches the host from its Worker.
// Close is idempotent: later calls wait for the first one (or their own
// ctx) and return its result.
func (h *Host) Close(ctx context.Context) error {
	h.closeOnce.Do(func() { h.closeErr = h.close(ctx) })
	select {
	case <-h.closedDone:
		return h.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Host) close(ctx context.Context) error {
	defer close(h.closedDone)
	h.mu.Lock()
	h.closing.Store(true)
	stop, done := h.sweepStop, h.sweepDone
	h.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	if h.alarms != nil {
		h.alarms.close() // local alarms end with the host: no delivery runs past here
	}
	n := 0
	h.forEachShard(func(sh *shard) {
		for _, inst := range sh.m {
			h.beginCloseLocked(sh, inst, EvictClose, false)
			n++
		}
	})
	h.log.Info("host closing", "instances", n)
	all := make(chan struct{})
	go func() { h.wg.Wait(); close(all) }()
	var err error
	select {
	case <-all:
	case <-ctx.Done():
		err = ctx.Err()
		h.log.Warn("host close deadline passed; aborting the remaining instances", "instances", h.live.Load())
		h.abortAll(EvictClose)
		h.stopCancel()
		<-all
	}
	h.stopCancel()
	if h.detach != nil {
		h.detach()
	}
	h.log.Info("host closed")
	return err
}

// Handler serves a request whose path is /<namespace>/<id><rest>; any
// other path answers 404. Use it when the application routes the
// namespace to the host itself (Wrap and Register do that).
func (h *Host) Handler(ctx *fasthttp.RequestCtx) {
	path := ctx.Request.URI().PathOriginal()
	if !h.owns(path) {
		h.writeError(ctx, fasthttp.StatusNotFound, "not found", "")
		return
	}
	t0 := spanNow()
	h.serve(ctx, path[len(h.nsSlash):])
	spanEnd(ctx, t0)
}

// Wrap returns a handler that serves the host's namespace and passes every
// other request to next (for example an application's router.Handler).
// Unlike Register it adds no router allocation to the host's requests.
func (h *Host) Wrap(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		path := ctx.Request.URI().PathOriginal()
		if h.owns(path) {
			t0 := spanNow()
			h.serve(ctx, path[len(h.nsSlash):])
			spanEnd(ctx, t0)
			return
		}
		next(ctx)
	}
}

// Register mounts the host on r as "<namespace>/{pinned_rest:*}" for every
// method, next to the application's own routes. fasthttp/router copies the
// catch-all value on every request (an allocation per request); use Wrap
// for the zero-allocation path.
func (h *Host) Register(r *router.Router) {
	r.ANY(h.nsSlash+"{pinned_rest:*}", h.Handler)
}

func (h *Host) owns(path []byte) bool {
	return len(path) > len(h.nsSlash) && string(path[:len(h.nsSlash)]) == h.nsSlash
}

// Metrics returns the metric set the host writes to (Config.Metrics or the
// set New created). Serve it with set.WritePrometheus.
func (h *Host) Metrics() *metrics.Set { return h.met.set }

// Namespace returns the host's namespace, "/name".
func (h *Host) Namespace() string { return h.ns }

// Len returns the number of live instances (activating and closing ones
// included).
func (h *Host) Len() int { return int(h.live.Load()) }

// MaxRequestBodySize returns the largest request body the host accepts
// (Config.MaxRequestBodySize).
func (h *Host) MaxRequestBodySize() int { return h.cfg.MaxRequestBodySize }

// Headroom returns how many more instances the host can activate now:
// MaxInstances minus Len, never negative.
func (h *Host) Headroom() int { return max(0, h.cfg.MaxInstances-h.Len()) }

// AbortAll aborts every instance with the given eviction reason (see
// Instance.Abort) without waiting for the teardowns.
func (h *Host) AbortAll(reason string) {
	n := h.abortAll(reason)
	if n > 0 {
		h.log.Info("aborted all instances", "reason", reason, "instances", n)
	}
}

func (h *Host) abortAll(reason string) int {
	n := 0
	h.forEachShard(func(sh *shard) {
		for _, inst := range sh.m {
			h.beginCloseLocked(sh, inst, reason, true)
			n++
		}
	})
	return n
}

// Evict aborts the instance of id, if any, with the given eviction reason
// (see Instance.Abort) without waiting for its teardown, and reports whether
// there was one. The release of its placement follows the teardown, as for
// every closed instance; until then requests for id answer 503 closing
// (fleet mode), after it the next request activates a fresh instance.
func (h *Host) Evict(id, reason string) bool {
	sh := &h.shards[h.shardIndex([]byte(id))]
	sh.mu.Lock()
	inst := sh.m[id]
	if inst != nil {
		h.beginCloseLocked(sh, inst, reason, true)
	}
	sh.mu.Unlock()
	if inst != nil {
		h.log.Info("instance evicted", "instance", id, "reason", reason)
	}
	return inst != nil
}

// CloseIdle closes, with the given eviction reason, every instance that has
// no in-flight request, open stream or websocket, or running task. It does
// not wait for the teardowns.
func (h *Host) CloseIdle(reason string) {
	n := 0
	h.forEachShard(func(sh *shard) {
		for sh.head != nil {
			h.beginCloseLocked(sh, sh.head, reason, false)
			n++
		}
	})
	if n > 0 {
		h.log.Info("closed idle instances", "reason", reason, "instances", n)
	}
}

var _ Attached = (*Host)(nil)
