package hotids

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// Defaults for Config fields left zero.
const (
	// DefaultWindow is the default Config.Window: what "recent" means.
	DefaultWindow = time.Minute
	// DefaultSlots is the default Config.Slots (10 s each by default).
	DefaultSlots = 6
	// DefaultStripes is the default Config.Stripes.
	DefaultStripes = 8
	// DefaultCapacity is the default Config.Capacity: counters per stripe,
	// slot and namespace (256 per namespace and slot with 8 stripes).
	DefaultCapacity = 32
	// DefaultMaxNamespaces is the default Config.MaxNamespaces.
	DefaultMaxNamespaces = 16
	// DefaultMaxHolders is the default Config.MaxHolders.
	DefaultMaxHolders = 64
	// DefaultMaxAnswers is the default Config.MaxAnswers.
	DefaultMaxAnswers = 64
	// DefaultMaxNameLen is the default Config.MaxNameLen: the longest
	// placement name the grammar allows ("/" namespace "/" id).
	DefaultMaxNameLen = 1 + wire.MaxNamespaceLen + 1 + wire.MaxIDLen
)

// OtherHolder is the session id under which Traffic reports the requests of
// holders beyond MaxHolders; OtherReason the reason of answers whose
// X-Pinned-Reason pinned does not define, and of (status, reason) pairs
// beyond MaxAnswers (with status 0).
const (
	OtherHolder = "_other"
	OtherReason = "other"
)

// Config configures a Sketch. Zero fields take the defaults above.
type Config struct {
	// Window is how far back Top and Traffic look.
	Window time.Duration
	// Slots divides the window; the window moves by Window/Slots.
	Slots int
	// Stripes is the number of independently locked tables (a power of
	// two).
	Stripes int
	// Capacity is the number of counters of each table.
	Capacity int
	// MaxNamespaces bounds the namespaces tracked at once.
	MaxNamespaces int
	// MaxHolders bounds the worker sessions counted per stripe and slot.
	MaxHolders int
	// MaxAnswers bounds the (status, reason) pairs counted per slot.
	MaxAnswers int
	// MaxNameLen bounds the placement names tracked (longer ones count
	// per holder and answer only).
	MaxNameLen int
}

// Sketch is the hot-id sketch. Make it with New; it is safe for concurrent
// use.
type Sketch struct {
	cfg     Config
	slotNs  int64
	seed    maphash.Seed
	mask    uint64
	stripes []stripe
	firstAt atomic.Int64 // unix ns of the first request recorded (0: none yet)

	ns       atomic.Pointer[map[string]nsRef]
	nsMu     sync.Mutex
	nsNames  []string       // index -> namespace ("" free); under nsMu
	nsGen    []uint32       // index -> generation; under nsMu
	nsSeen   []atomic.Int64 // index -> last slot epoch with a request
	nsFullAt atomic.Int64   // slot epoch in which a new namespace last found no room (+1)
	answers  answerTable
}

// nsRef is a tracked namespace: its table index and generation (bumped
// whenever the index is given to another namespace).
type nsRef struct {
	i   int
	gen uint32
}

type stripe struct {
	mu    sync.Mutex
	slots []slot
	_     [64]byte // keep neighbouring stripes' mutexes off one cache line
}

// slot is one stripe's share of one Window/Slots period.
type slot struct {
	epoch    int64    // unix ns / slot length of the period it holds; -1 none
	requests uint64   // every request recorded
	tables   []*table // per namespace index; nil until used
	holders  []holderCount
	other    uint64 // requests of holders beyond MaxHolders
}

type holderCount struct {
	holder string
	count  uint64
}

// table is one space-saving summary. hashes and counts are kept apart
// from the entries so that a lookup scans two small contiguous arrays.
type table struct {
	gen     uint32
	n       int
	hashes  []uint64
	counts  []uint64
	entries []entry
}

type entry struct {
	name   []byte
	err    uint64 // count inherited when the name took over the counter
	bytes  uint64
	holder string
	hist   [histBuckets]uint32
}

// New validates cfg and returns an empty sketch.
func New(cfg Config) (*Sketch, error) {
	for name, v := range map[string]int64{
		"Window": int64(cfg.Window), "Slots": int64(cfg.Slots), "Stripes": int64(cfg.Stripes),
		"Capacity": int64(cfg.Capacity), "MaxNamespaces": int64(cfg.MaxNamespaces),
		"MaxHolders": int64(cfg.MaxHolders), "MaxAnswers": int64(cfg.MaxAnswers), "MaxNameLen": int64(cfg.MaxNameLen),
	} {
		if v < 0 {
			return nil, fmt.Errorf("hotids: Config.%s is negative; use 0 for the default", name)
		}
	}
	cfg.Window = cmp.Or(cfg.Window, DefaultWindow)
	cfg.Slots = cmp.Or(cfg.Slots, DefaultSlots)
	cfg.Stripes = cmp.Or(cfg.Stripes, DefaultStripes)
	cfg.Capacity = cmp.Or(cfg.Capacity, DefaultCapacity)
	cfg.MaxNamespaces = cmp.Or(cfg.MaxNamespaces, DefaultMaxNamespaces)
	cfg.MaxHolders = cmp.Or(cfg.MaxHolders, DefaultMaxHolders)
	cfg.MaxAnswers = cmp.Or(cfg.MaxAnswers, DefaultMaxAnswers)
	cfg.MaxNameLen = cmp.Or(cfg.MaxNameLen, DefaultMaxNameLen)
	if bits.OnesCount(uint(cfg.Stripes)) != 1 {
		return nil, fmt.Errorf("hotids: Config.Stripes %d is not a power of two", cfg.Stripes)
	}
	if cfg.Slots < 2 || cfg.Window/time.Duration(cfg.Slots) < time.Millisecond {
		return nil, errors.New("hotids: Config.Slots must be at least 2, each at least 1ms of Window")
	}
	s := &Sketch{
		cfg:     cfg,
		slotNs:  int64(cfg.Window / time.Duration(cfg.Slots)),
		seed:    maphash.MakeSeed(),
		mask:    uint64(cfg.Stripes - 1),
		stripes: make([]stripe, cfg.Stripes),
		nsNames: make([]string, cfg.MaxNamespaces),
		nsGen:   make([]uint32, cfg.MaxNamespaces),
		nsSeen:  make([]atomic.Int64, cfg.MaxNamespaces),
	}
	for i := range s.stripes {
		st := &s.stripes[i]
		st.slots = make([]slot, cfg.Slots)
		for j := range st.slots {
			st.slots[j] = slot{epoch: -1, tables: make([]*table, cfg.MaxNamespaces), holders: make([]holderCount, 0, cfg.MaxHolders)}
		}
	}
	s.answers.slots = make([]answerSlot, cfg.Slots)
	for j := range s.answers.slots {
		s.answers.slots[j] = answerSlot{epoch: -1, rows: make([]answerRow, 0, cfg.MaxAnswers)}
	}
	empty := map[string]nsRef{}
	s.ns.Store(&empty)
	return s, nil
}

// Config returns the sketch's configuration with the defaults applied.
func (s *Sketch) Config() Config { return s.cfg }

// RegisterMetrics adds the gauge pinned_hotids_error_bound (ErrorBound at
// scrape time) to set.
func (s *Sketch) RegisterMetrics(set *metrics.Set) {
	set.NewGauge("pinned_hotids_error_bound", func() float64 { return float64(s.ErrorBound(time.Now())) })
}

// Record counts one routed request. It is meant for the proxy's
// per-request path: it does not allocate (see the package doc), takes one
// stripe mutex for a few dozen instructions, and keeps no reference to
// name. Its parameters are plain values, so the proxy can declare the
// method in an interface of its own and a call through it allocates
// nothing either.
//
//   - name is the placement name "/<namespace>/<id>" (the raw path's first
//     two segments), nil when the request had none; it is copied.
//   - holder is the session id of the worker that served it, "" when no
//     worker was reached. It is kept as is, so it must not change
//     afterwards (the endpoint's session id string).
//   - status is the status code the client got; reason its X-Pinned-Reason
//     ("" none; only pinned's own Reason* values are kept, any other counts
//     as OtherReason).
//   - bytes is the request and response body bytes; latency the time from
//     receiving the request to its answer's head.
//   - at is when the request was received (fasthttp's RequestCtx.Time);
//     the zero time means now.
func (s *Sketch) Record(name []byte, holder string, status int, reason string, bytes int64, latency time.Duration, at time.Time) {
	atNs := at.UnixNano()
	if at.IsZero() {
		atNs = time.Now().UnixNano()
	}
	if s.firstAt.Load() == 0 {
		s.firstAt.CompareAndSwap(0, atNs)
	}
	epoch := atNs / s.slotNs
	ref := nsRef{i: -1}
	var h uint64
	if ns, ok := splitName(name); ok && len(name) <= s.cfg.MaxNameLen {
		ref = s.namespace(ns, epoch)
		h = maphash.Bytes(s.seed, name)
	} else {
		h = uint64(atNs) // no name: any stripe will do
	}
	st := &s.stripes[h&s.mask]
	st.mu.Lock()
	sl := &st.slots[epoch%int64(len(st.slots))]
	if sl.epoch != epoch {
		if epoch < sl.epoch { // older than what the slot holds: out of the window
			st.mu.Unlock()
			return
		}
		sl.reset(epoch)
	}
	sl.requests++
	if holder != "" {
		sl.countHolder(holder)
	}
	if ref.i >= 0 {
		s.tableOf(sl, ref).record(h, name, holder, bytes, latency)
	}
	st.mu.Unlock()
	if status < 200 || status > 299 {
		s.answers.record(epoch, status, canonicalReason(reason))
	}
}

// splitName returns the namespace "/name" of a placement name
// "/name/id", and whether name has that shape.
func splitName(name []byte) ([]byte, bool) {
	if len(name) < 4 || name[0] != '/' {
		return nil, false
	}
	i := bytes.IndexByte(name[1:], '/') + 1
	if i <= 1 || i == len(name)-1 {
		return nil, false
	}
	return name[:i], true
}

// namespace returns the tracked namespace ns, adding it when there is
// room; i is -1 when it is not tracked.
func (s *Sketch) namespace(ns []byte, epoch int64) nsRef {
	if ref, ok := (*s.ns.Load())[string(ns)]; ok {
		if s.nsSeen[ref.i].Load() != epoch {
			s.nsSeen[ref.i].Store(epoch)
		}
		return ref
	}
	if s.nsFullAt.Load() == epoch+1 {
		return nsRef{i: -1} // no room was found in this slot: do not look again
	}
	return s.addNamespace(ns, epoch)
}

func (s *Sketch) addNamespace(ns []byte, epoch int64) nsRef {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	old := *s.ns.Load()
	if ref, ok := old[string(ns)]; ok {
		return ref
	}
	free := -1
	for i, name := range s.nsNames {
		if name == "" {
			free = i
			break
		}
	}
	if free < 0 {
		// Reuse the index of a namespace without traffic in the window.
		for i := range s.nsNames {
			if s.nsSeen[i].Load() <= epoch-int64(s.cfg.Slots) {
				free = i
				break
			}
		}
	}
	if free < 0 {
		s.nsFullAt.Store(epoch + 1)
		return nsRef{i: -1}
	}
	m := make(map[string]nsRef, len(old)+1)
	for k, v := range old {
		if k != s.nsNames[free] {
			m[k] = v
		}
	}
	s.nsGen[free]++
	ref := nsRef{i: free, gen: s.nsGen[free]}
	s.nsNames[free] = string(ns)
	s.nsSeen[free].Store(epoch)
	m[s.nsNames[free]] = ref
	s.ns.Store(&m)
	return ref
}

func (sl *slot) reset(epoch int64) {
	sl.epoch, sl.requests, sl.other = epoch, 0, 0
	sl.holders = sl.holders[:0]
	for _, t := range sl.tables {
		if t != nil {
			t.n = 0
		}
	}
}

func (sl *slot) countHolder(holder string) {
	for i := range sl.holders {
		if sl.holders[i].holder == holder {
			sl.holders[i].count++
			return
		}
	}
	if len(sl.holders) < cap(sl.holders) {
		sl.holders = append(sl.holders, holderCount{holder, 1})
		return
	}
	sl.other++
}

// tableOf returns the slot's table of a namespace, made on first use and
// emptied when the namespace's index changed hands.
func (s *Sketch) tableOf(sl *slot, ref nsRef) *table {
	t := sl.tables[ref.i]
	if t == nil {
		c := s.cfg.Capacity
		t = &table{gen: ref.gen, hashes: make([]uint64, c), counts: make([]uint64, c), entries: make([]entry, c)}
		sl.tables[ref.i] = t
	}
	if t.gen != ref.gen {
		t.gen, t.n = ref.gen, 0
	}
	return t
}

// record is the space-saving update for one request.
func (t *table) record(h uint64, name []byte, holder string, bytes int64, latency time.Duration) {
	i := -1
	for j, x := range t.hashes[:t.n] {
		if x == h && string(t.entries[j].name) == string(name) {
			i = j
			break
		}
	}
	if i < 0 {
		var inherited uint64
		if t.n < len(t.hashes) {
			i = t.n
			t.n++
			t.counts[i] = 0
		} else {
			i = 0
			for j, c := range t.counts {
				if c < t.counts[i] {
					i = j
				}
			}
			inherited = t.counts[i]
		}
		e := &t.entries[i]
		e.name = append(e.name[:0], name...)
		e.err, e.bytes = inherited, 0
		clear(e.hist[:])
		t.hashes[i] = h
	}
	t.counts[i]++
	e := &t.entries[i]
	if bytes > 0 {
		e.bytes += uint64(bytes)
	}
	e.holder = holder
	e.hist[bucketOf(latency)]++
}

// minCount is the table's smallest count when it is full (an absent name
// may have had that many requests), 0 otherwise.
func (t *table) minCount() uint64 {
	if t.n < len(t.counts) {
		return 0
	}
	return slices.Min(t.counts)
}

// Latency histogram: 4 buckets per octave of microseconds from 32 µs
// (everything faster counts in the first) to 2^27 µs (134 s; everything
// slower counts in the last).
const (
	histMinShift = 5
	histOctaves  = 22
	histSub      = 4
	histBuckets  = histOctaves * histSub
)

func bucketOf(d time.Duration) int {
	us := uint64(max(d, 0) / time.Microsecond)
	if us < 1<<histMinShift {
		return 0
	}
	o := bits.Len64(us) - 1
	i := (o-histMinShift)*histSub + int(us>>(o-2))&(histSub-1)
	return min(i, histBuckets-1)
}

// bucketUpper is the upper bound of bucket i.
func bucketUpper(i int) time.Duration {
	o, sub := i/histSub+histMinShift, i%histSub
	us := (uint64(1) << o) * uint64(histSub+sub+1) / histSub
	return time.Duration(us) * time.Microsecond
}

// quantile returns the upper bound of the bucket holding quantile q.
func quantile(h *[histBuckets]uint64, q float64) time.Duration {
	var total uint64
	for _, c := range h {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := uint64(float64(total)*q + 0.999999)
	var cum uint64
	for i, c := range h {
		if cum += c; cum >= rank {
			return bucketUpper(i)
		}
	}
	return bucketUpper(histBuckets - 1)
}

// knownReasons are the X-Pinned-Reason values pinned defines.
var knownReasons = [...]string{
	wire.ReasonCapacity, wire.ReasonDraining, wire.ReasonClosing, wire.ReasonLease, wire.ReasonForbidden,
	wire.ReasonAborted, wire.ReasonNoWorker, wire.ReasonUnreachable, wire.ReasonOverloaded, wire.ReasonStore,
}

// canonicalReason maps a reason to pinned's own constant (a static string,
// so nothing the caller owns is kept), "" or OtherReason.
func canonicalReason(r string) string {
	if r == "" {
		return ""
	}
	for _, known := range knownReasons {
		if r == known {
			return known
		}
	}
	return OtherReason
}

// answerTable counts non-2xx answers by (status, reason) per slot.
type answerTable struct {
	mu    sync.Mutex
	slots []answerSlot
}

type answerSlot struct {
	epoch int64
	rows  []answerRow
	other uint64
}

type answerRow struct {
	status int
	reason string
	count  uint64
}

func (a *answerTable) record(epoch int64, status int, reason string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sl := &a.slots[epoch%int64(len(a.slots))]
	if sl.epoch != epoch {
		if epoch < sl.epoch {
			return
		}
		sl.epoch, sl.rows, sl.other = epoch, sl.rows[:0], 0
	}
	for i := range sl.rows {
		if sl.rows[i].status == status && sl.rows[i].reason == reason {
			sl.rows[i].count++
			return
		}
	}
	if len(sl.rows) < cap(sl.rows) {
		sl.rows = append(sl.rows, answerRow{status, reason, 1})
		return
	}
	sl.other++
}
