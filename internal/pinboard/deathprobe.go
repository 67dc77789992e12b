package pinboard

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
	"github.com/pinned-go/pinned/proxy"
)

// The death probe of fast failover (placement.Config.ConfirmDeath).
const (
	// probeAttempts is how many attempts in a row must find the process
	// gone.
	probeAttempts = 3
	// probeMaxAttempts bounds the attempts of one probe: a process that is
	// still exiting accepts a connection and resets it, which proves
	// nothing either way, and the probe tries again.
	probeMaxAttempts = 8
	// probeSpacing separates the attempts, so that a transient refusal (a
	// listener being replaced within the same process) is not taken for a
	// death.
	probeSpacing = 50 * time.Millisecond
	// probeTimeout bounds each dial and each answer.
	probeTimeout = 250 * time.Millisecond
)

// probeOutcome is what one attempt found at a session's advertise address.
type probeOutcome uint8

const (
	probeUndecided probeOutcome = iota // a timeout, an unreachable network: the lease stands
	probeRefused                       // the kernel refused the connection: nothing listens there
	probeStranger                      // a process answered that does not know the session's secret (403 forbidden)
	probeAlive                         // the session's process answered (it knows the secret)
	probeDropped                       // connected, then closed or reset before any answer: try again
)

// deathProbe decides whether a session's process is gone, on evidence only
// the kernel of a dead process (or a process that took its port) gives.
type deathProbe struct {
	// dial connects as the proxy does (the registry's address policy).
	dial func(addr string, timeout time.Duration) (net.Conn, error)
}

// confirm implements placement.Config.ConfirmDeath: dead when probeAttempts
// attempts in a row, probeSpacing apart, find the address refusing
// connections or answered by a process that does not know the session's
// secret. A timeout or an answer of the session's own process ends the probe:
// the lease stands (false). A connection accepted and then dropped without
// an answer (a process still exiting) proves nothing and breaks the row;
// after probeMaxAttempts attempts without a row the lease stands too.
func (d deathProbe) confirm(ctx context.Context, s *proxy.Session) (bool, error) {
	addr, prefix, err := wire.ParseAdvertiseURL(s.AdvertiseURL)
	if err != nil {
		return false, err
	}
	row := 0
	for i := range probeMaxAttempts {
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
			if row++; row == probeAttempts {
				return true, nil
			}
		case probeDropped:
			row = 0
		default:
			return false, nil
		}
	}
	return false, nil
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
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return probeUndecided // nobody takes the bytes: a frozen process
		}
		return probeDropped // reset while the request went out
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.SkipBody = true
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return probeUndecided // accepted, no answer: a frozen process
		}
		return probeDropped
	}
	if resp.StatusCode() == fasthttp.StatusForbidden && string(resp.Header.Peek(wire.HeaderReason)) == wire.ReasonForbidden {
		return probeStranger
	}
	return probeAlive
}
