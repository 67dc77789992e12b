package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/activation"
	"github.com/pinned-go/pinned/internal/base/leaseterm"
	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/internal/store"
)

// worker is a simulated worker process with one host: the worker's lease
// (leaseterm: anchored at the send time of the acknowledged call, checked
// inline on every request), its registry calls (register, heartbeats,
// releases with bounded retries) through a random pinboard, and the host's
// directory with the real activation rule (internal/base/activation: serve,
// activate, supersede, or refuse stale, with the memory of released epochs)
// and its lifecycle (idle close, evict, abort on lease loss; a closing
// instance answers 503 closing until its release returned, then leaves
// the directory and its epoch is remembered).
type worker struct {
	w    *world
	idx  int
	name string
	addr string

	up             bool
	inc            int           // incarnation: a crash ends it (its events and calls are lost)
	frozenUntil    time.Duration // while now < it, the process runs nothing
	callsLostUntil time.Duration // while now < it, its calls to pinboards are lost

	clientID    string
	sessions    map[string]bool // every session id this process registered
	sess        string          // the current session ("" without a lease)
	term        leaseterm.Term
	ackSeq      uint64 // the heartbeat whose ack anchors the term
	callSeq     uint64
	registering bool
	nsess       int

	insts    map[string]*instance
	released activation.Released
}

// instance is one live (or closing) instance on a worker.
type instance struct {
	wk     *worker
	serial int
	id     string
	epoch  uint64
	sess   string
	active bool // false once closing
	used   time.Duration
}

func (i *instance) String() string {
	return fmt.Sprintf("inst#%d(%s on %s, session %s, epoch %d)", i.serial, i.id, i.wk.name, i.sess, i.epoch)
}

func newWorker(w *world, i int) *worker {
	return &worker{w: w, idx: i, name: fmt.Sprintf("w%d", i+1), addr: fmt.Sprintf("http://10.0.0.%d:8000", i+1)}
}

// boot starts a process: fresh identity, nothing held, register.
func (wk *worker) boot() {
	wk.up = true
	wk.inc++
	wk.clientID = fmt.Sprintf("%s.c%d", wk.name, wk.inc)
	wk.sessions = map[string]bool{}
	wk.sess, wk.registering = "", false
	wk.insts = map[string]*instance{}
	wk.released = activation.Released{}
	wk.register()
	wk.w.after(heartbeatEvery, wk, "heartbeat tick", wk.tick)
}

func (wk *worker) freeze(d time.Duration) {
	wk.frozenUntil = max(wk.frozenUntil, wk.w.now+d)
	wk.w.logf("%s freezes until %.3fs", wk.name, wk.frozenUntil.Seconds())
}

func (wk *worker) crash(d time.Duration) {
	w := wk.w
	w.logf("%s crashes (restarts in %v)", wk.name, d)
	wk.up = false
	wk.inc++ // every event and call of the dead process is lost
	wk.insts = map[string]*instance{}
	wk.sess = ""
	w.after(d, nil, "worker restarts", func() {
		if !wk.up {
			wk.restart()
		}
	})
}

func (wk *worker) restart() {
	wk.w.logf("%s restarts at %s", wk.name, wk.addr)
	wk.boot()
}

// secret is the process's proxy secret: minted once per process (every
// session it registers carries it), so another process at the same address
// does not know it.
func (wk *worker) secret() string { return "secret-" + wk.clientID }

// serves reports whether inst may serve at now: its session is the current
// one and the lease is valid (the inline check of Admit).
func (wk *worker) serves(inst *instance, now clock.Instant) bool {
	return wk.sess != "" && inst.sess == wk.sess && wk.term.Valid(now, leaseBuffer)
}

// leaseCheck is the inline check every step of the process makes: a lease
// past its local deadline is lost now, whether or not a timer fired.
func (wk *worker) leaseCheck() {
	if wk.sess != "" && !wk.term.Valid(wk.w.clk.Now(), leaseBuffer) {
		wk.lose("the lease's local deadline passed")
	}
}

// lose ends the session: every instance is aborted (and released), then a
// new registration starts.
func (wk *worker) lose(why string) {
	w := wk.w
	w.logf("%s loses session %s: %s", wk.name, wk.sess, why)
	wk.sess = ""
	for _, id := range w.ids {
		if inst := wk.insts[id]; inst != nil && inst.active {
			wk.close(inst, "lease lost", true)
		}
	}
	wk.register()
}

// call sends one registry call through a random pinboard: apply runs
// there (through the pinboard's link to the store), done runs back here
// with its error, or errTimeout when no answer came within callTimeout.
func (wk *worker) call(what string, apply func(l *storeLink) error, done func(err error)) {
	w := wk.w
	answered := false
	finish := func(err error) {
		if !answered {
			answered = true
			done(err)
		}
	}
	w.after(callTimeout, wk, what+" timeout", func() { finish(errTimeout) })
	p := w.pinboards[w.rng.IntN(len(w.pinboards))]
	if w.now < wk.callsLostUntil {
		return
	}
	pinc := p.inc
	w.after(w.delay(), nil, what, func() {
		if !p.up || p.inc != pinc {
			return // the pinboard is down: no answer
		}
		err := apply(p.link)
		w.after(w.delay(), wk, what+" answer", func() { finish(err) })
	})
}

var errTimeout = errors.New("no answer")

func (wk *worker) register() {
	if wk.registering || !wk.up {
		return
	}
	w := wk.w
	wk.registering = true
	wk.nsess++
	sid := fmt.Sprintf("%s.s%d.%d", wk.name, wk.inc, wk.nsess)
	sent := w.clk.Now()
	s := store.Session{ID: sid, ClientID: wk.clientID, Secret: wk.secret(), AdvertiseURL: wk.addr,
		Namespaces: []string{namespace}, Headroom: 1000, Verified: true}
	wk.call("register "+sid, func(l *storeLink) error {
		return l.write("register "+sid, func() { _, _ = l.Store.Register(bg, s, lease) })
	}, func(err error) {
		wk.registering = false
		if err != nil {
			w.after(w.between(100*time.Millisecond, time.Second), wk, "register retry", wk.register)
			return
		}
		if wk.sess != "" {
			return
		}
		wk.sessions[sid] = true
		wk.sess = sid
		wk.term = leaseterm.Anchor(sent, w.clk.Now(), lease)
		wk.ackSeq = wk.callSeq
		w.logf("%s registered session %s", wk.name, sid)
		wk.watchdog()
	})
}

// watchdog schedules the loss of the lease at its local deadline (the
// inline checks catch it earlier when a request comes first).
func (wk *worker) watchdog() {
	w := wk.w
	deadline := wk.term.Deadline(leaseBuffer).Sub(w.clk.Now())
	w.after(max(deadline, 0), wk, "watchdog", wk.leaseCheck)
}

// tick sends a heartbeat every heartbeatEvery while a session is held.
func (wk *worker) tick() {
	w := wk.w
	wk.leaseCheck()
	w.after(heartbeatEvery, wk, "heartbeat tick", wk.tick)
	if wk.sess == "" {
		wk.register()
		return
	}
	sid := wk.sess
	sent := w.clk.Now()
	wk.callSeq++
	seq := wk.callSeq
	var hbErr error
	wk.call("heartbeat "+sid, func(l *storeLink) error {
		werr := l.write("heartbeat "+sid, func() {
			_, _, hbErr = l.Store.Heartbeat(bg, sid, store.Update{Headroom: 1000, Verified: true}, lease)
		})
		return errors.Join(werr, hbErr)
	}, func(err error) {
		if wk.sess != sid {
			return
		}
		switch {
		case err == nil:
			if seq > wk.ackSeq { // never re-anchor backwards
				wk.ackSeq = seq
				wk.term = leaseterm.Anchor(sent, w.clk.Now(), lease)
				wk.watchdog()
			}
		case errors.Is(err, store.ErrUnknownSession), errors.Is(err, store.ErrSuperseded):
			wk.lose("heartbeat refused: " + err.Error())
		}
	})
}

// dataRequest is what the proxy forwards: the route's session and epoch.
type dataRequest struct {
	id, op  string
	secret  string
	session string
	epoch   uint64
}

// serve is the host's dispatch in fleet mode: Admit (session and lease,
// inline), then the activation rule.
func (wk *worker) serve(m dataRequest) reply {
	w := wk.w
	wk.leaseCheck()
	if m.secret != wk.secret() {
		return reply{status: 403, reason: wire.ReasonForbidden} // another process's secret
	}
	if !wk.sessions[m.session] {
		return reply{status: 503, reason: wire.ReasonLease} // not (yet) a session of ours
	}
	if m.session != wk.sess {
		return reply{status: 503, reason: wire.ReasonLease}
	}
	now := w.clk.Now()
	inst := wk.insts[m.id]
	if inst != nil && !inst.active {
		return reply{status: 503, reason: wire.ReasonClosing}
	}
	var liveEpoch uint64
	if inst != nil {
		liveEpoch = inst.epoch
	}
	floor, ok := wk.released.Floor([]byte(m.id), now, staleWindow)
	switch activation.Decide(m.epoch, inst != nil, liveEpoch, floor, ok) {
	case activation.Stale:
		if inst == nil {
			w.stats.StaleRefusals++
			w.logf("%s refuses %s@%d: an instance of it closed here under epoch %d", wk.name, m.id, m.epoch, floor)
		}
		return reply{status: 503, reason: wire.ReasonStale}
	case activation.Supersede:
		w.logf("%s: %s superseded by epoch %d", wk.name, inst, m.epoch)
		inst.active = false
		wk.finish(inst) // closes without a release: the placement is the newer one's
		inst = wk.activate(m)
	case activation.Activate:
		inst = wk.activate(m)
	}
	inst.used = w.now
	id := m.id
	w.after(w.swarm.idle, wk, "idle check", func() {
		if cur := wk.insts[id]; cur == inst && inst.active && w.now-inst.used >= w.swarm.idle {
			wk.close(inst, "idle", true)
		}
	})
	return reply{status: 200, inst: inst}
}

func (wk *worker) activate(m dataRequest) *instance {
	w := wk.w
	w.instances++
	w.stats.Activations++
	inst := &instance{wk: wk, serial: w.instances, id: m.id, epoch: m.epoch, sess: wk.sess, active: true}
	wk.insts[m.id] = inst
	w.logf("%s activates %s", wk.name, inst)
	return inst
}

// close closes inst (idle, evict, abort on lease loss): it answers 503
// closing while its release is in flight, then leaves the directory.
func (wk *worker) close(inst *instance, why string, release bool) {
	inst.active = false
	wk.w.logf("%s closes %s: %s", wk.name, inst, why)
	if !release {
		wk.finish(inst)
		return
	}
	wk.release(inst, 1)
}

// release is Worker.Release: POST /registry/release {session, epoch},
// retried, then given up; the instance leaves the directory either way.
func (wk *worker) release(inst *instance, attempt int) {
	w := wk.w
	name := wire.PlacementName(namespace, inst.id)
	var relErr error
	wk.call("release "+name, func(l *storeLink) error {
		werr := l.write(fmt.Sprintf("release of %s@%d", name, inst.epoch), func() {
			_, relErr = l.Store.Release(bg, namespace, inst.id, inst.sess, inst.epoch)
		})
		return errors.Join(werr, relErr)
	}, func(err error) {
		if err != nil && attempt < releaseTries {
			w.after(time.Duration(attempt)*100*time.Millisecond, wk, "release retry", func() { wk.release(inst, attempt+1) })
			return
		}
		if err != nil {
			w.logf("%s gives up releasing %s: %v", wk.name, inst, err)
		}
		wk.finish(inst)
	})
}

// finish removes a closed instance from the directory and remembers its
// epoch, in one step (the host does both under the shard lock).
func (wk *worker) finish(inst *instance) {
	if wk.insts[inst.id] == inst {
		delete(wk.insts, inst.id)
	}
	if inst.epoch != 0 {
		now := wk.w.clk.Now()
		wk.released.Add(inst.id, inst.epoch, now)
		wk.released.Expire(now, staleWindow)
	}
}
