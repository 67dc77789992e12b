package pinboard

import (
	"bufio"
	"context"
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/proxy"
)

// The death probe of fast failover (placement.Config.ConfirmDeath).
const (
	// probeAttempts dials the probe makes; every one must find the process
	// gone.
	probeAttempts = 3
	// probeSpacing separates them, so that a transient refusal (a listener
	// being replaced within the same process) is not taken for a death.
	probeSpacing = 50 * time.Millisecond
	// probeTimeout bounds each dial and each answer.
	probeTimeout = 250 * time.Millisecond
)

// probeOutcome is what one attempt found at a session's advertise address.
type probeOutcome uint8

const (
	probeUndecided probeOutcome = iota // timeout, unreachable network, an answer that proves nothing
	probeRefused                       // the kernel refused the connection: nothing listens there
	probeStranger                      // a process answered that does not know the session's secret (403 forbidden)
	probeAlive                         // the session's process answered (it knows the secret)
)

// deathProbe decides whether a session's process is gone, on evidence only
// the kernel of a dead process (or a process that took its port) gives.
type deathProbe struct {
	// dial connects as the proxy does (the registry's address policy).
	dial func(addr string, timeout time.Duration) (net.Conn, error)
}

// confirm implements placement.Config.ConfirmDeath: dead when every one of
// probeAttempts attempts, probeSpacing apart, finds the address refusing
// connections or answered by a process that does not know the session's
// secret. A timeout or any other answer keeps the lease (false).
func (d deathProbe) confirm(ctx context.Context, s *proxy.Session) (bool, error) {
	addr, prefix, err := wire.ParseAdvertiseURL(s.AdvertiseURL)
	if err != nil {
		return false, err
	}
	for i := range probeAttempts {
		if i > 0 {
			t := time.NewTimer(probeSpacing)
			select {
			case <-ctx.Done():
				t.Stop()
				return false, ctx.Err()
			case <-t.C:
			}
		}
		switch d.once(addr, prefix, s.Secret) {
		case probeRefused, probeStranger:
		default:
			return false, nil
		}
	}
	return true, nil
}

// once makes one attempt: a connection, and when it is accepted, a
// challenge fetch with the session's secret (a worker that knows the secret
// answers 404 for an unknown challenge, another pinned process 403
// forbidden).
func (d deathProbe) once(addr, prefix, secret string) probeOutcome {
	c, err := d.dial(addr, probeTimeout)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return probeRefused
		}
		return probeUndecided
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(probeTimeout))
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI(prefix + wire.PathChallenge + "?" + wire.QueryChallenge + "=probe")
	req.Header.SetHost(addr)
	req.Header.Set(wire.HeaderProxySecret, secret)
	req.SetConnectionClose()
	bw := bufio.NewWriter(c)
	if err := req.Write(bw); err != nil || bw.Flush() != nil {
		return probeUndecided
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.SkipBody = true
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		return probeUndecided
	}
	if resp.StatusCode() == fasthttp.StatusForbidden && string(resp.Header.Peek(wire.HeaderReason)) == wire.ReasonForbidden {
		return probeStranger
	}
	return probeAlive
}
