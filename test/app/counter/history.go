package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/pinned-go/pinned/examples/counter/counterapp"
	"github.com/pinned-go/pinned/host"
	"github.com/pinned-go/pinned/internal/testkit/history"
	"github.com/pinned-go/pinned/worker"
)

// EnvHistory names the file the fixture appends its chaos-history events
// to (internal/testkit/history): instance activations and teardowns, every
// request served, task effects, alarm runs, and the worker's lease events.
// Unset: no history. It costs one write per event.
const EnvHistory = "PINNED_HISTORY"

// recorder writes the counter's history; its zero value records nothing.
type recorder struct {
	w    *history.Writer
	proc string
}

func openRecorder(path string) (*recorder, error) {
	if path == "" {
		return &recorder{}, nil
	}
	w, err := history.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvHistory, err)
	}
	r := &recorder{w: w, proc: strings.TrimSuffix(filepath.Base(path), ".jsonl")}
	r.w.Write(history.Event{Kind: history.KindStart, Proc: r.proc})
	return r, nil
}

func (r *recorder) close() error {
	if r.w == nil {
		return nil
	}
	return r.w.Close()
}

func (r *recorder) instance(kind string, c *counterapp.Counter) history.Event {
	inst := c.Instance()
	sess, _ := worker.SessionOf(inst.Context())
	return history.Event{Kind: kind, Proc: r.proc, ID: inst.ID(), Inst: c.Nonce(), Session: sess, Epoch: inst.Epoch()}
}

// hooks returns the counter hooks that record into the history.
func (r *recorder) hooks() counterapp.Hooks {
	if r.w == nil {
		return counterapp.Hooks{}
	}
	return counterapp.Hooks{
		Activated: func(c *counterapp.Counter) { r.w.Write(r.instance(history.KindActivate, c)) },
		TornDown:  func(c *counterapp.Counter) { r.w.Write(r.instance(history.KindTeardown, c)) },
		Effect:    func(c *counterapp.Counter) { r.w.Write(r.instance(history.KindEffect, c)) },
		Alarm: func(c *counterapp.Counter, x *host.AlarmCtx) {
			e := r.instance(history.KindAlarm, c)
			e.Alarm, e.Sched, e.Wall, e.Attempt = x.Name(), x.Scheduled().UnixMilli(), time.Now().UnixMilli(), x.Attempt()
			r.w.Write(e)
		},
		Served: func(c *counterapp.Counter, x *host.Ctx) {
			e := r.instance(history.KindServe, c)
			e.Recv = history.At(x.RequestCtx().Time())
			r.w.Write(e)
		},
	}
}

// onLease records the worker's lease events with their raw send times.
func (r *recorder) onLease() func(worker.LeaseEvent) {
	if r.w == nil {
		return nil
	}
	return func(e worker.LeaseEvent) {
		ev := history.Event{Proc: r.proc, Session: e.Session}
		switch e.Kind {
		case worker.LeaseLost:
			ev.Kind = history.KindLost
			if e.Cause != nil {
				ev.Cause = e.Cause.Error()
			}
		default:
			ev.Kind = history.KindLease
			now := history.Now()
			ev.T = now - int64(e.HandledAgo) // when the worker checked its lease and took the ack
			ev.Sent = now - int64(e.SentAgo)
			ev.ExpiresMs = e.ExpiresIn.Milliseconds()
			ev.Cause = string(e.Kind)
		}
		r.w.Write(ev)
	}
}
