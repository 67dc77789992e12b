package registry

import (
	"bytes"
	"crypto/pbkdf2"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
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

// tokenSet holds the SHA-256 digests of the valid deployment tokens and
// their ids. The tokens themselves are not kept.
type tokenSet struct {
	digests [][sha256.Size]byte
	ids     []string // tokenID of each token
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
		ts.ids = append(ts.ids, tokenID(t))
	}
	return ts, nil
}

// TokenIDLen is the length of a token id: 12 base64url characters.
const TokenIDLen = 12

// tokenID is the id of a deployment token: what the registry stores with a
// session (the session cap and the registration limit count per token id)
// and what it logs, never the token. It is the same on every pinboard
// (nothing random goes into it) and derived with PBKDF2-HMAC-SHA-256, 4096
// rounds, 72 bits kept, so that someone who can read Redis or the logs gains
// no practical way to test guesses of a weak token.
func tokenID(t string) string {
	k, err := pbkdf2.Key(sha256.New, t, []byte("pinned/token-id/v1"), 4096, TokenIDLen*3/4)
	if err != nil { // only for an invalid key length
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(k)
}

// check reports whether presented is one of the tokens, and which (its
// id). Both sides are hashed first, so the comparison is between
// equal-length digests and subtle.ConstantTimeCompare cannot return early
// on a length mismatch; every configured digest is compared and the match
// is selected in constant time, so timing does not tell which one matched.
func (ts *tokenSet) check(presented []byte) (id string, ok bool) {
	d := sha256.Sum256(presented)
	match, idx := 0, 0
	for i := range ts.digests {
		eq := ts.eq(d[:], ts.digests[i][:])
		match |= eq
		idx = subtle.ConstantTimeSelect(eq, i, idx)
	}
	if match != 1 {
		return "", false
	}
	return ts.ids[idx], true
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
