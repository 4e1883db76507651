package rvma

import (
	"errors"
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// Sentinel errors. Every error of this package wraps one of them; test with
// errors.Is.
var (
	// ErrClosed is returned when an endpoint or window is used after Close,
	// and by waits that were pending when the window closed.
	ErrClosed = errors.New("rvma: use of closed window or endpoint")
	// ErrNoBuffer is returned when a window has no posted buffer for an
	// epoch: by a put that waited for one until its deadline, by IncEpoch
	// on a window with nothing posted, and by Get of an epoch that has not
	// completed.
	ErrNoBuffer = errors.New("rvma: no buffer posted to the mailbox")
	// ErrTooLarge is returned by a put whose offset plus length exceeds the
	// target buffer, by Post when a threshold exceeds the buffer, and by
	// Get at an offset beyond the epoch's length.
	ErrTooLarge = errors.New("rvma: put does not fit the posted buffer")
	// ErrStale is returned by a put that targeted an epoch that completed
	// before the put landed: its bytes were refused and changed no buffer
	// already handed to the receiving application. Get returns it for an
	// epoch the window no longer keeps.
	ErrStale = errors.New("rvma: put targeted an epoch that already completed")
	// ErrMailboxClosed is the NACK of a put to a closed mailbox.
	ErrMailboxClosed = errors.New("rvma: mailbox closed (NACK)")
	// ErrNoMailbox is returned when the destination has no window with the
	// mailbox address.
	ErrNoMailbox = errors.New("rvma: no such mailbox at the destination")
	// ErrPeerGone is returned for operations pending on a link that failed
	// (the peer died, disconnected or became unreachable).
	ErrPeerGone = errors.New("rvma: peer unreachable")
	// ErrInvalid is returned for arguments the API forbids and for
	// malformed wire data.
	ErrInvalid = errors.New("rvma: invalid argument")
	// ErrFailed is returned by every call on an endpoint whose receiving
	// machinery failed (a memory window bind or unbind, or a receive
	// queue post, failed: the device or its driver is broken). Its links
	// are down, and every window handed its pending buffers over with
	// FlagFailed. Only Close is left to do; Endpoint.Err says why.
	ErrFailed = errors.New("rvma: endpoint failed")
)

// invalidf returns an error wrapping ErrInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// wireErr wraps ErrInvalid around an error of package wire (which wraps
// wire.ErrInvalid), so that it wraps a sentinel of this package.
func wireErr(err error) error { return fmt.Errorf("%w: %w", ErrInvalid, err) }

// nackErr returns the sentinel error a NACK reason stands for (ErrInvalid
// for an unknown reason).
func nackErr(r wire.NackReason) error {
	switch r {
	case wire.NackNoMailbox:
		return ErrNoMailbox
	case wire.NackClosed:
		return ErrMailboxClosed
	case wire.NackStale:
		return ErrStale
	case wire.NackTooLarge:
		return ErrTooLarge
	case wire.NackNoBuffer:
		return ErrNoBuffer
	}
	return invalidf("unknown NACK reason %d", r)
}

// PutError describes a failed put: where it went and which epoch it
// targeted. Err is the cause; it wraps one of the sentinel errors
// (ErrStale, ErrTooLarge, ErrNoBuffer, ErrMailboxClosed, ErrNoMailbox,
// ErrPeerGone, ErrClosed), so errors.Is works on a *PutError.
type PutError struct {
	Dest    string  // the destination endpoint's address
	Mailbox Mailbox // the mailbox address
	Offset  uint64  // the offset into the buffer
	Len     int     // the put's length in bytes
	Epoch   uint64  // the epoch the put targeted (0 if none was chosen)
	Err     error
}

// Error describes the put and its cause.
func (e *PutError) Error() string {
	return fmt.Sprintf("rvma: put of %d bytes at offset %d to %v on %s (epoch %d): %v",
		e.Len, e.Offset, e.Mailbox, e.Dest, e.Epoch, e.Err)
}

// Unwrap returns the cause.
func (e *PutError) Unwrap() error { return e.Err }
