package host

import (
	"cmp"
	"container/heap"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/wire"
)

// Local mode's unavailable backoff (a delivery refused with 503: the host
// at capacity, or closing): the pinboard scheduler's defaults.
const (
	localUnavailableBackoff    = 250 * time.Millisecond
	localUnavailableBackoffMax = 5 * time.Second
)

// localAlarms keeps a local-mode host's alarms in memory: per id and name,
// and a heap by due time. One loop goroutine (started by Start, stopped by
// Close) pops due alarms and delivers each on a goroutine of its own (at
// most AlarmConcurrency), through the same path as a fleet delivery
// (runAlarm); the outcomes follow the wire.Alarm state machine. A delivery
// applies its outcome only while its alarm is still the one stored under
// its name (SetAlarm and DeleteAlarm meanwhile win). Nothing survives the
// process.
type localAlarms struct {
	h     *Host
	clock clock.Clock
	max   int
	slots chan struct{}

	mu     sync.Mutex
	byID   map[string]map[string]*localAlarm
	due    alarmHeap
	dead   []DeadAlarm // ring of the newest, at most maxDead
	deadAt int         // next slot of the ring once full
	n      int         // alarms stored
	seq    uint64

	maxDead int
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup // deliveries
	started bool
}

type localAlarm struct {
	id    string
	a     wire.Alarm
	due   int64
	seq   uint64 // ties in due order
	index int    // in the heap; -1 while delivered
}

func newLocalAlarms(h *Host) *localAlarms {
	return &localAlarms{
		h: h, clock: h.clock, max: h.cfg.MaxAlarmsPerInstance, maxDead: h.cfg.MaxDeadAlarms,
		slots: make(chan struct{}, h.cfg.AlarmConcurrency),
		byID:  map[string]map[string]*localAlarm{},
		wake:  make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

func (l *localAlarms) nowMs() int64 { return l.clock.Now().UnixMilli() }

func (l *localAlarms) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// pending is the pinned_local_alarms gauge.
func (l *localAlarms) pending() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return float64(l.n)
}

func (l *localAlarms) set(id string, a wire.Alarm) error {
	a = a.Normalized("")
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.byID[id][a.Name]
	if old == nil && len(l.byID[id]) >= l.max {
		return ErrTooManyAlarms
	}
	if old != nil {
		l.dropLocked(old)
	}
	names := l.byID[id]
	if names == nil {
		names = map[string]*localAlarm{}
		l.byID[id] = names
	}
	l.seq++
	la := &localAlarm{id: id, a: a, due: a.AtMs, seq: l.seq}
	names[a.Name] = la
	l.n++
	heap.Push(&l.due, la)
	l.poke()
	return nil
}

// dropLocked forgets la (its delivery, if one is in flight, becomes stale).
func (l *localAlarms) dropLocked(la *localAlarm) {
	if la.index >= 0 {
		heap.Remove(&l.due, la.index)
	}
	if names := l.byID[la.id]; names[la.a.Name] == la {
		delete(names, la.a.Name)
		if len(names) == 0 {
			delete(l.byID, la.id)
		}
		l.n--
	}
}

func (l *localAlarms) delete(id, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if la := l.byID[id][name]; la != nil {
		l.dropLocked(la)
	}
}

func (l *localAlarms) list(id string) []Alarm {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Alarm, 0, len(l.byID[id]))
	for _, la := range l.byID[id] {
		w := la.a
		w.DueMs = la.due
		out = append(out, alarmOf(w))
	}
	slices.SortFunc(out, func(a, b Alarm) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func (l *localAlarms) deadLetters() []DeadAlarm {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.dead)
	slices.SortStableFunc(out, func(a, b DeadAlarm) int { return b.DeadAt.Compare(a.DeadAt) })
	return out
}

// start starts the loop; it is called once, by Host.Start.
func (l *localAlarms) start() {
	l.started = true
	go l.loop()
}

// close stops the loop and waits for it and every delivery in flight.
func (l *localAlarms) close() {
	if !l.started {
		return
	}
	close(l.stop)
	<-l.done
}

func (l *localAlarms) loop() {
	defer close(l.done)
	defer l.wg.Wait()
	for {
		wait, ok := l.pass()
		if clock.Sleep(l.clock, wait, ok, l.wake, l.stop) {
			return
		}
	}
}

// pass starts the deliveries of every due alarm a slot is free for and
// returns how long to sleep (ok false: until woken).
func (l *localAlarms) pass() (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.nowMs()
	for len(l.due) > 0 && l.due[0].due <= now {
		select {
		case l.slots <- struct{}{}:
		default:
			return 0, false // a finished delivery pokes the loop
		}
		la := heap.Pop(&l.due).(*localAlarm)
		l.wg.Go(func() { l.deliver(la) })
	}
	if len(l.due) == 0 {
		return 0, false
	}
	return time.Duration(l.due[0].due-now) * time.Millisecond, true
}

// deliver runs one alarm through the host, as the pinboard's delivery would,
// and applies the outcome.
func (l *localAlarms) deliver(la *localAlarm) {
	defer func() {
		<-l.slots
		l.poke()
	}()
	status, body := l.h.deliverLocal(la.id, la.a.Delivery())
	now := l.nowMs()
	var (
		next    wire.Alarm
		due     int64
		keep    bool
		deadErr string
	)
	switch {
	case status >= 200 && status < 300:
		next, keep = la.a.AfterSuccess(now)
		due = next.AtMs
	case status == fasthttp.StatusServiceUnavailable:
		next, due = la.a.AfterUnavailable(now, localUnavailableBackoff.Milliseconds(), localUnavailableBackoffMax.Milliseconds(), 0)
		keep = true
	default:
		var dead bool
		next, due, dead, keep = la.a.AfterFailure(now)
		if dead {
			deadErr = "HTTP " + strconv.Itoa(status) + ": " + body
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byID[la.id][la.a.Name] != la {
		return // set again or deleted while it was delivered
	}
	if deadErr != "" {
		l.h.am.dead.Inc()
		a := la.a
		a.Failures++
		l.addDeadLocked(DeadAlarm{ID: la.id, Alarm: alarmOf(a), DeadAt: time.UnixMilli(now), Error: deadErr})
		l.h.logThrottled(slog.LevelWarn, "alarm dead-lettered: its last attempt failed", "instance", la.id, "alarm", la.a.Name,
			"scheduled", time.UnixMilli(la.a.AtMs).UTC(), "attempts", a.Failures, "error", deadErr)
	}
	if !keep {
		l.dropLocked(la)
		return
	}
	la.a, la.due = next, due
	l.seq++
	la.seq = l.seq
	heap.Push(&l.due, la)
}

func (l *localAlarms) addDeadLocked(d DeadAlarm) {
	if len(l.dead) < l.maxDead {
		l.dead = append(l.dead, d)
		return
	}
	l.dead[l.deadAt] = d
	l.deadAt = (l.deadAt + 1) % l.maxDead
}

// deliverLocal runs an alarm delivery through runAlarm on a request of its
// own (local mode has no proxy: the host is its own pinboard) and returns
// the status and the error message of the answer.
func (h *Host) deliverLocal(id string, d wire.AlarmDelivery) (int, string) {
	var req fasthttp.Request
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(h.nsSlash + id + wire.PathAlarm)
	req.Header.Set(wire.HeaderAlarm, d.Header())
	var rc fasthttp.RequestCtx
	rc.Init(&req, nil, nil)
	h.runAlarm(&rc, []byte(id), nil, 0, d)
	return rc.Response.StatusCode(), wire.ErrorText(rc.Response.Body())
}

// alarmHeap orders alarms by due time, then by the order they were set.
type alarmHeap []*localAlarm

func (q alarmHeap) Len() int { return len(q) }
func (q alarmHeap) Less(i, j int) bool {
	return q[i].due < q[j].due || q[i].due == q[j].due && q[i].seq < q[j].seq
}
func (q alarmHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *alarmHeap) Push(x any) {
	la := x.(*localAlarm)
	la.index = len(*q)
	*q = append(*q, la)
}
func (q *alarmHeap) Pop() any {
	old := *q
	la := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	la.index = -1
	return la
}
