package registry

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pinned-go/pinned/internal/wire"
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
)

var challengeReasons = []string{challengeUnreachable, challengeTimeout, challengeNetwork, challengeRedirect,
	challengeStatus, challengeTooLarge, challengeMalformed, challengeMismatch}

// challengeError is a failed proof. msg is ours alone (never the fetched
// body), fit for the 422 body and the log.
type challengeError struct {
	reason string
	msg    string
}

func (e *challengeError) Error() string { return "challenge failed: " + e.msg }

// errNetworkNotAllowed is returned by the dialer's Control hook.
var errNetworkNotAllowed = errors.New("address not in the allowed advertise networks")

// verifier proves that the process at an advertise URL knows the worker's
// secret and the challenge it is proving: GET <url>/_pinned/challenge?challenge=…
// with the secret header, answered {"value": challengeValue}.
type verifier struct {
	timeout time.Duration
	allow   []netip.Prefix // empty: any
}

// control runs after DNS resolution for every address the dialer tries, so
// the allow-list also holds against DNS rebinding.
func (v *verifier) control(_, address string, _ syscall.RawConn) error {
	if len(v.allow) == 0 {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return errNetworkNotAllowed
	}
	ip := ap.Addr().Unmap()
	for _, p := range v.allow {
		if p.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s", errNetworkNotAllowed, ip)
}

// verify fetches the challenge and compares the value in constant time.
func (v *verifier) verify(ctx context.Context, advertiseURL, secret, challenge, value string) error {
	deadline := time.Now().Add(v.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	addr, tls := hostPort(advertiseURL)
	dialer := &net.Dialer{Control: v.control}
	// A HostClient per fetch, with Connection: close: nothing is pooled, so
	// no connection or cleaner goroutine outlives the call, and a worker
	// address is never dialled except during a proof.
	hc := &fasthttp.HostClient{
		Addr:  addr,
		IsTLS: tls,
		Dial: func(a string) (net.Conn, error) {
			dctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			return dialer.DialContext(dctx, "tcp", a)
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
		return &challengeError{challengeNetwork, "the advertise address is outside the allowed advertise networks"}
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
