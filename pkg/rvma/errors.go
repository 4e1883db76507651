package rvma

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/rvma/internal/wire"
)

// Sentinel errors. Every error of this package wraps one of them, or is
// (or wraps) the error of a context the caller passed that ended; test
// with errors.Is.
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
	// ErrDevice is returned when the RDMA device, its driver or the
	// kernel refused what a call needed: Listen could not bind, listen,
	// open the device or allocate on it (also wrapped with
	// verbs.ErrNotSupported for a device without memory windows), Alloc or
	// a put or Get from memory outside Alloc could not register memory
	// (the locked-memory limit, RLIMIT_MEMLOCK, is the usual cause), a
	// send could not be posted, or the kernel module refused a counted
	// window or is not loaded for EndpointOptions.Counting CountModule.
	// The verbs or kmod error is wrapped too. The endpoint goes on: unlike
	// ErrFailed, ErrDevice does not mean that it stopped.
	ErrDevice = errors.New("rvma: the device or the kernel refused")
)

// sentinels are the errors every error of this package wraps one of.
var sentinels = [...]error{ErrClosed, ErrNoBuffer, ErrTooLarge, ErrStale, ErrMailboxClosed,
	ErrNoMailbox, ErrPeerGone, ErrInvalid, ErrFailed, ErrDevice}

// sentinelOr returns err if it wraps a sentinel of this package or a
// context's error, and otherwise err wrapped in fallback (an error from
// verbs or kmod that nothing wrapped yet). It only runs on error paths.
func sentinelOr(fallback, err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return err
		}
	}
	return fmt.Errorf("%w: %w", fallback, err)
}

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
// ErrPeerGone, ErrClosed, ErrFailed, ErrInvalid, ErrDevice) or the error
// of the put's context, so errors.Is works on a *PutError.
type PutError struct {
	Dest    string  // the destination endpoint's address
	Mailbox Mailbox // the mailbox address
	Offset  uint64  // the offset into the buffer
	Len     int     // the put's length in bytes
	// Epoch is the epoch the put last targeted, when HasEpoch says it
	// chose one: a put chooses its epoch when it is handed to the NIC,
	// and one that failed before (dialling, resolving, waiting for a
	// buffer, refused locally) has none, and Epoch 0.
	Epoch    uint64
	HasEpoch bool
	Err      error
}

// Error describes the put and its cause.
func (e *PutError) Error() string {
	epoch := "no epoch chosen"
	if e.HasEpoch {
		epoch = fmt.Sprintf("epoch %d", e.Epoch)
	}
	return fmt.Sprintf("rvma: put of %d bytes at offset %d to %v on %s (%s): %v",
		e.Len, e.Offset, e.Mailbox, e.Dest, epoch, e.Err)
}

// Unwrap returns the cause.
func (e *PutError) Unwrap() error { return e.Err }
