package registry

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/base/wire"
)

// DefaultChallengeTimeout is the default Config.ChallengeTimeout.
const DefaultChallengeTimeout = 2 * time.Second

// Challenge failure reasons: stable, short, used as metric labels and in
// error messages. The fetched body is never part of any of them.
const (
	challengeUnreachable = "unreachable"
	challengeTimeout     = "timeout"
	challengeNetwork     = "network_not_allowed"
	challengeRedirect    = "redirect"
	challengeStatus      = "status"
	challengeTooLarge    = "too_large"
	challengeMalformed   = "malformed"
	challengeMismatch    = "mismatch"
	// challengeReplay: the challenge was used before (within NonceTTL).
	challengeReplay = "replay"
)

var challengeReasons = []string{challengeUnreachable, challengeTimeout, challengeNetwork, challengeRedirect,
	challengeStatus, challengeTooLarge, challengeMalformed, challengeMismatch, challengeReplay}

// challengeError is a failed proof. msg is ours alone (never the fetched
// body), fit for the 422 body and the log.
type challengeError struct {
	reason string
	msg    string
}

func (e *challengeError) Error() string { return "challenge failed: " + e.msg }

// verifier proves that the process at an advertise URL knows the worker's
// secret and the challenge it is proving: GET <url>/_pinned/challenge?challenge=…
// with the secret header, answered {"value": challengeValue}.
type verifier struct {
	timeout time.Duration
	policy  *addrPolicy
	resolve resolver // host name -> addresses; a seam for rebinding tests
}

// dial connects to addr ("host:port"): it resolves the host itself and
// dials each address in turn through a net.Dialer whose Control hook applies
// the address policy to the exact address being connected, so what DNS
// answers (now or, rebinding, on a later fetch) can never lead it to a
// refused one. An address refused by the policy is reported in preference
// to other dial errors.
func (v *verifier) dial(ctx context.Context, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("invalid port %q", portStr)
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = v.resolve(ctx, host); err != nil {
		return nil, err
	}
	d := &net.Dialer{Control: v.policy.control}
	var refused, first error
	for _, ip := range ips {
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(ip, uint16(port)).String())
		if err == nil {
			return c, nil
		}
		switch {
		case errors.Is(err, errNetworkNotAllowed):
			refused = cmp.Or(refused, err)
		case first == nil:
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err := cmp.Or(refused, first); err != nil {
		return nil, err
	}
	return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
}

// verify fetches the challenge and compares the value in constant time.
func (v *verifier) verify(ctx context.Context, advertiseURL, secret, challenge, value string) error {
	deadline := time.Now().Add(v.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	addr, tls := hostPort(advertiseURL)
	// A HostClient per fetch, with Connection: close: nothing is pooled, so
	// no connection or cleaner goroutine outlives the call, and a worker
	// address is never dialled except during a proof.
	hc := &fasthttp.HostClient{
		Addr:  addr,
		IsTLS: tls,
		Dial: func(a string) (net.Conn, error) {
			dctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			return v.dial(dctx, a)
		},
		MaxConns:                  1,
		MaxIdemponentCallAttempts: 1,
		MaxResponseBodySize:       wire.MaxChallengeResponseBytes,
		ReadBufferSize:            wire.MaxChallengeResponseBytes,
		NoDefaultUserAgentHeader:  true,
		DisablePathNormalizing:    true,
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(advertiseURL + wire.PathChallenge + "?" + wire.QueryChallenge + "=" + url.QueryEscape(challenge))
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set(wire.HeaderProxySecret, secret)
	req.Header.SetUserAgent("pinned-pinboard")
	req.SetConnectionClose()
	err := hc.DoDeadline(req, resp, deadline)
	switch {
	case err == nil:
	case errors.Is(err, errNetworkNotAllowed):
		return &challengeError{challengeNetwork, "the advertise URL resolves to an address the pinboard refuses: " + policyReason(err)}
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return &challengeError{challengeTooLarge, fmt.Sprintf("challenge response larger than %d bytes", wire.MaxChallengeResponseBytes)}
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout), errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return &challengeError{challengeTimeout, fmt.Sprintf("no challenge response within %v", v.timeout)}
	default:
		return &challengeError{challengeUnreachable, "cannot reach the advertise URL: " + dialReason(err)}
	}
	code := resp.StatusCode()
	switch {
	case code >= 300 && code < 400:
		return &challengeError{challengeRedirect, fmt.Sprintf("the worker answered %d; redirects are not followed", code)}
	case code != fasthttp.StatusOK:
		return &challengeError{challengeStatus, fmt.Sprintf("the worker answered %d, not 200", code)}
	}
	var cr wire.ChallengeResponse
	if json.Unmarshal(resp.Body(), &cr) != nil {
		return &challengeError{challengeMalformed, `the challenge response is not {"value": "..."}`}
	}
	got, want := sha256.Sum256([]byte(cr.Value)), sha256.Sum256([]byte(value))
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
		return &challengeError{challengeMismatch, "the worker's value does not match challengeValue"}
	}
	return nil
}

// policyReason is the policy's own message (an address and a rule, never
// anything the peer sent) without the dialer's wrapping.
func policyReason(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, errNetworkNotAllowed.Error()); i >= 0 {
		return msg[i:]
	}
	return errNetworkNotAllowed.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dialReason describes a connection error without anything the peer sent.
func dialReason(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return "connection refused"
		}
		return oe.Op + " failed"
	}
	var de *net.DNSError
	if errors.As(err, &de) {
		return "cannot resolve the host"
	}
	return "connection failed"
}
