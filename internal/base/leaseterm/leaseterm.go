// Package leaseterm is the arithmetic of a worker's lease, shared by the
// worker (package worker) and the protocol's simulation (test/sim): a
// lease is anchored at the SEND time of the call the pinboard acknowledged,
// and is usable until expiresIn − buffer has elapsed since, on a clock that
// counts machine suspend (clock.Instant.Sub).
//
// # Invariants
//
//   - Anchor never anchors at a receive time: the pinboard refreshed the
//     session's expiry some time after the call was sent, so sent +
//     expiresIn is a lower bound of when it may re-place the worker's ids,
//     whereas receive time + expiresIn would overshoot it by up to one
//     network delay (the planted fault receive_anchor does exactly that).
//   - Valid depends only on its arguments: no timer has to have fired.
package leaseterm

import (
	"time"

	"github.com/pinned-go/pinned/clock"
	"github.com/pinned-go/pinned/internal/base/faults"
)

// Term is an acknowledged lease: the send time of the call whose ack
// granted it, and the length the ack granted.
type Term struct {
	Sent      clock.Instant
	ExpiresIn time.Duration
}

// Anchor is the term granted by an ack of a call sent at sent and received
// at received, for expiresIn. received is used only by the planted fault
// faults.ReceiveAnchor (binaries built with the pinned_faults tag).
func Anchor(sent, received clock.Instant, expiresIn time.Duration) Term {
	if faults.Has(faults.ReceiveAnchor) {
		sent = received
	}
	return Term{Sent: sent, ExpiresIn: expiresIn}
}

// Valid reports whether the term is usable at now: fewer than ExpiresIn −
// buffer have elapsed since Sent.
func (t Term) Valid(now clock.Instant, buffer time.Duration) bool {
	return !now.Elapsed(t.Sent, t.ExpiresIn-buffer)
}

// Deadline is the instant the term stops being usable: Sent + ExpiresIn −
// buffer.
func (t Term) Deadline(buffer time.Duration) clock.Instant {
	return t.Sent.Add(t.ExpiresIn - buffer)
}

// Expires is when the pinboard may re-place the worker's ids at the
// earliest: Sent + ExpiresIn.
func (t Term) Expires() clock.Instant { return t.Sent.Add(t.ExpiresIn) }
