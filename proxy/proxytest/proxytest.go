// Package proxytest provides a static proxy.Resolver for tests and local
// experiments: placements are set by hand, nothing is placed on a miss, and
// every Resolve and Refused call is counted.
//
// A Static resolver is safe for concurrent use. Lookup takes a read lock and
// does not allocate, like the real placement resolver's.
package proxytest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pinned-go/pinned/proxy"
)

// Static maps placement names ("/<ns>/<id>") and namespaces ("/<ns>") to
// routes. An exact name wins over its namespace.
type Static struct {
	mu         sync.RWMutex
	names      map[string]proxy.Route
	namespaces map[string]proxy.Route
	err        error // returned by every Resolve when set (SetError)

	resolves atomic.Int64
	refusals atomic.Int64
	// OnRefused, when set before use (or through SetOnRefused), is called
	// by Refused (after the
	// placement was dropped) with the name and route it was given.
	OnRefused func(name string, r proxy.Route)
}

// NewStatic returns an empty resolver.
func NewStatic() *Static {
	return &Static{names: map[string]proxy.Route{}, namespaces: map[string]proxy.Route{}}
}

// Place routes the placement name ("/<ns>/<id>") to s (epoch 0).
func (st *Static) Place(name string, s *proxy.Session) { st.PlaceRoute(name, proxy.Route{Session: s}) }

// PlaceRoute routes the placement name ("/<ns>/<id>") to r.
func (st *Static) PlaceRoute(name string, r proxy.Route) {
	st.mu.Lock()
	st.names[name] = r
	st.mu.Unlock()
}

// PlaceNamespace routes every id of a namespace ("/<ns>") without a placement
// of its own to s.
func (st *Static) PlaceNamespace(ns string, s *proxy.Session) {
	st.mu.Lock()
	st.namespaces[ns] = proxy.Route{Session: s}
	st.mu.Unlock()
}

// SetError makes every Resolve fail with err, and every Lookup miss (nil
// restores placements).
func (st *Static) SetError(err error) {
	st.mu.Lock()
	st.err = err
	st.mu.Unlock()
}

// Lookup implements proxy.Resolver: the route of name, exact or by
// namespace.
func (st *Static) Lookup(name []byte, _ time.Time) (proxy.Route, bool) {
	st.mu.RLock()
	defer st.mu.RUnlock()
	if st.err != nil {
		return proxy.Route{}, false
	}
	return st.lookupLocked(name)
}

func (st *Static) lookupLocked(name []byte) (proxy.Route, bool) {
	if r, ok := st.names[string(name)]; ok {
		return r, true
	}
	for i := 1; i < len(name); i++ {
		if name[i] == '/' {
			r, ok := st.namespaces[string(name[:i])]
			return r, ok
		}
	}
	return proxy.Route{}, false
}

// Resolve implements proxy.Resolver. A name without a placement, exact or by
// namespace, fails with proxy.ErrNoWorker.
func (st *Static) Resolve(_ context.Context, name []byte) (proxy.Route, error) {
	st.resolves.Add(1)
	st.mu.RLock()
	defer st.mu.RUnlock()
	if st.err != nil {
		return proxy.Route{}, st.err
	}
	if r, ok := st.lookupLocked(name); ok {
		return r, nil
	}
	return proxy.Route{}, proxy.ErrNoWorker
}

// Refused implements proxy.Resolver: it drops the exact placement of name if
// it is still on r's session (a namespace route stays).
func (st *Static) Refused(name []byte, r proxy.Route, reason string) {
	st.refusals.Add(1)
	st.mu.Lock()
	if cur, ok := st.names[string(name)]; ok && cur.Session == r.Session {
		delete(st.names, string(name))
	}
	f := st.OnRefused
	st.mu.Unlock()
	if f != nil {
		f(string(name), r)
	}
}

// SetOnRefused replaces OnRefused while the resolver is in use. The proxy
// calls Refused from its own goroutines, and a test that learns a request's
// outcome through a socket has no happens-before edge with them: setting the
// field directly would race.
func (st *Static) SetOnRefused(f func(name string, r proxy.Route)) {
	st.mu.Lock()
	st.OnRefused = f
	st.mu.Unlock()
}

// Resolves returns the number of Resolve calls.
func (st *Static) Resolves() int64 { return st.resolves.Load() }

// Refusals returns the number of Refused calls.
func (st *Static) Refusals() int64 { return st.refusals.Load() }
