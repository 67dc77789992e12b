// Package proxytest provides a static proxy.Resolver for tests and local
// experiments: placements are set by hand, nothing is placed on a miss, and
// every call is recorded.
//
// A Static resolver is safe for concurrent use. Resolve takes a read lock
// and does not allocate on a hit, like the real placement cache must.
package proxytest

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/pinned-go/pinned/proxy"
)

// Static maps placement names ("/<ns>/<id>") and namespaces ("/<ns>") to
// endpoints. An exact name wins over its namespace.
type Static struct {
	mu         sync.RWMutex
	names      map[string]*proxy.Endpoint
	namespaces map[string]*proxy.Endpoint
	err        error // returned by every Resolve when set (SetError)

	resolves      atomic.Int64
	invalidations atomic.Int64
	// OnInvalidate, when set before use, is called by Invalidate (after the
	// placement was dropped) with the name and endpoint it was given.
	OnInvalidate func(name string, ep *proxy.Endpoint)
}

// NewStatic returns an empty resolver.
func NewStatic() *Static {
	return &Static{names: map[string]*proxy.Endpoint{}, namespaces: map[string]*proxy.Endpoint{}}
}

// Place routes the placement name ("/<ns>/<id>") to ep.
func (s *Static) Place(name string, ep *proxy.Endpoint) {
	s.mu.Lock()
	s.names[name] = ep
	s.mu.Unlock()
}

// PlaceNamespace routes every id of a namespace ("/<ns>") without a placement
// of its own to ep.
func (s *Static) PlaceNamespace(ns string, ep *proxy.Endpoint) {
	s.mu.Lock()
	s.namespaces[ns] = ep
	s.mu.Unlock()
}

// SetError makes every Resolve fail with err (nil restores placements).
func (s *Static) SetError(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// Resolve implements proxy.Resolver. A name without a placement, exact or by
// namespace, fails with proxy.ErrNoWorker.
func (s *Static) Resolve(_ context.Context, name []byte) (*proxy.Endpoint, error) {
	s.resolves.Add(1)
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.err != nil {
		return nil, s.err
	}
	if ep, ok := s.names[string(name)]; ok {
		return ep, nil
	}
	if len(name) > 1 {
		for i := 1; i < len(name); i++ {
			if name[i] == '/' {
				if ep, ok := s.namespaces[string(name[:i])]; ok {
					return ep, nil
				}
				break
			}
		}
	}
	return nil, proxy.ErrNoWorker
}

// Invalidate implements proxy.Resolver: it drops the exact placement of name
// if it points at ep (a namespace route stays).
func (s *Static) Invalidate(name []byte, ep *proxy.Endpoint) {
	s.invalidations.Add(1)
	s.mu.Lock()
	if cur, ok := s.names[string(name)]; ok && cur == ep {
		delete(s.names, string(name))
	}
	f := s.OnInvalidate
	s.mu.Unlock()
	if f != nil {
		f(string(name), ep)
	}
}

// Resolves returns the number of Resolve calls.
func (s *Static) Resolves() int64 { return s.resolves.Load() }

// Invalidations returns the number of Invalidate calls.
func (s *Static) Invalidations() int64 { return s.invalidations.Load() }
