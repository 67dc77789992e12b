package registry

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
)

// Token rules.
const (
	// MinTokenLen is the shortest deployment token accepted.
	MinTokenLen = 16
	// MaxTokenLen is the longest deployment token accepted.
	MaxTokenLen = 512
	// MaxTokens is how many tokens may be valid at once (current and
	// previous, during a rotation).
	MaxTokens = 2
)

// tokenSet holds the SHA-256 digests of the valid deployment tokens. The
// tokens themselves are not kept.
type tokenSet struct {
	digests [][sha256.Size]byte
	// eq is subtle.ConstantTimeCompare; a field so that a test can observe
	// that every check goes through it with equal-length digests.
	eq func(a, b []byte) int
}

// checkToken validates one configured token and says what to change.
func checkToken(t string) error {
	switch {
	case len(t) < MinTokenLen:
		return fmt.Errorf("a token is %d bytes; use at least %d (e.g. openssl rand -hex 32)", len(t), MinTokenLen)
	case len(t) > MaxTokenLen:
		return fmt.Errorf("a token is longer than %d bytes", MaxTokenLen)
	case !headerSafe(t) || bytes.ContainsAny([]byte(t), ","):
		return errors.New("a token must be visible ASCII without commas")
	}
	return nil
}

func newTokenSet(tokens []string) (*tokenSet, error) {
	if len(tokens) == 0 {
		return nil, errors.New("no deployment token: set at least one")
	}
	if len(tokens) > MaxTokens {
		return nil, fmt.Errorf("%d deployment tokens; at most %d (the current one and the previous one during a rotation)", len(tokens), MaxTokens)
	}
	ts := &tokenSet{eq: subtle.ConstantTimeCompare}
	for _, t := range tokens {
		if err := checkToken(t); err != nil {
			return nil, err
		}
		ts.digests = append(ts.digests, sha256.Sum256([]byte(t)))
	}
	return ts, nil
}

// check reports whether presented is one of the tokens. Both sides are
// hashed first, so the comparison is between equal-length digests and
// subtle.ConstantTimeCompare cannot return early on a length mismatch; every
// configured digest is compared, so timing does not tell which one matched.
func (ts *tokenSet) check(presented []byte) bool {
	d := sha256.Sum256(presented)
	ok := 0
	for i := range ts.digests {
		ok |= ts.eq(d[:], ts.digests[i][:])
	}
	return ok == 1
}

// bearer extracts the token from an Authorization header value
// ("Bearer <token>", scheme case-insensitive, RFC 6750 §2.1).
func bearer(h []byte) ([]byte, bool) {
	const scheme = "bearer "
	if len(h) <= len(scheme) || !bytes.EqualFold(h[:len(scheme)], []byte(scheme)) {
		return nil, false
	}
	t := bytes.TrimLeft(h[len(scheme):], " ")
	return t, len(t) > 0
}
