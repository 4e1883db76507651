package activeaccess

import (
	"errors"
	"fmt"

	"github.com/rdmaplus/rdmaplus/pkg/verbs"
)

// Sentinel errors. Every error this package returns wraps one of these, a
// context error, or an error of pkg/verbs or pkg/kmod (test
// with errors.Is).
var (
	// ErrClosed: the Target, Domain, Source or PlainQP was closed (by the
	// caller, or, for a Target's Domains and PlainQPs, by closing the
	// Target), or, for Access.Reply, the source's connection is gone.
	// Errors after Close wrap it and name the call.
	ErrClosed = errors.New("activeaccess: closed")
	// ErrInvalid: an argument or option the package refuses (a nil
	// handler, an unaligned page range, a size of 0 or less, an option out
	// of range, a listen address that is not a specific IP and port).
	ErrInvalid = errors.New("activeaccess: invalid argument")
	// ErrRange: an offset and length outside the target's memory.
	ErrRange = errors.New("activeaccess: outside the target's memory")
	// ErrTooLarge: one access needs more staging memory or more credits
	// than the connection can ever grant; split it.
	ErrTooLarge = errors.New("activeaccess: access too large for this connection")
	// ErrDisconnected: the connection to the target (or from the source)
	// ended: the peer disconnected, died or became unreachable. Every
	// pending and later operation of that Source fails with it.
	ErrDisconnected = errors.New("activeaccess: disconnected")
	// ErrRefused: the target refused an access (its log was full, so the
	// module NAKed the write, or the address was not accessible); the
	// connection is broken after it. A source that only uses Put and Get
	// within its credits never sees it, unless plain accesses or other
	// RDMA peers filled the same log.
	ErrRefused = errors.New("activeaccess: access refused by the target")
	// ErrRejected: the target refused the connection (too many sources,
	// an unsupported protocol version or mode, or it is closing), or
	// nothing listens at the address. The error is a *RejectError.
	ErrRejected = errors.New("activeaccess: connection rejected")
	// ErrProtocol: the peer sent something this package does not
	// understand (not an activeaccess peer, or another version).
	ErrProtocol = errors.New("activeaccess: protocol error")
	// ErrNoSource: Access.Reply on an access whose source is not a
	// connected Source of this package (the log entry named a QP the
	// runtime does not know, for example a plain verbs peer).
	ErrNoSource = errors.New("activeaccess: access has no known source")
)

// RejectReason says why a target refused a connection.
type RejectReason uint16

// Reasons a target rejects a connection.
const (
	RejectVersion    RejectReason = 1 // the source speaks another protocol version
	RejectTooMany    RejectReason = 2 // MaxSources sources are connected
	RejectClosing    RejectReason = 3 // the target is closing
	RejectMode       RejectReason = 4 // the source cannot use the target's mode
	RejectResources  RejectReason = 5 // the target could not set the connection up
	RejectNotAAPeer  RejectReason = 6 // the request carried no activeaccess hello
	rejectReasonLast              = RejectNotAAPeer
)

// String names the reason.
func (r RejectReason) String() string {
	switch r {
	case RejectVersion:
		return "protocol version"
	case RejectTooMany:
		return "too many sources"
	case RejectClosing:
		return "target closing"
	case RejectMode:
		return "unsupported mode"
	case RejectResources:
		return "target out of resources"
	case RejectNotAAPeer:
		return "not an activeaccess source"
	}
	return fmt.Sprintf("RejectReason(%d)", uint16(r))
}

// RejectError is returned by Dial when the target refused the connection,
// or when nothing listens at the address (Reason 0); errors.Is(err,
// ErrRejected) holds.
type RejectError struct {
	Reason RejectReason // 0 when the peer sent no activeaccess reason
	Status int          // the connection manager's reject status
}

// Error describes the rejection.
func (e *RejectError) Error() string {
	if e.Reason == 0 {
		return fmt.Sprintf("activeaccess: connection rejected by the connection manager (status %d): no activeaccess target listens there", e.Status)
	}
	return "activeaccess: connection rejected: " + e.Reason.String()
}

// Is makes errors.Is(err, ErrRejected) true.
func (e *RejectError) Is(target error) bool { return target == ErrRejected }

// wcError maps a failed work completion onto this package's errors: a
// remote access error is a refusal, a retry or RNR timeout means the
// target is unreachable, a flush follows an earlier failure (cause).
func wcError(err error, cause error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, verbs.WCRemAccessErr), errors.Is(err, verbs.WCRemInvReqErr):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	case errors.Is(err, verbs.WCRetryExcErr), errors.Is(err, verbs.WCRNRRetryExcErr):
		return fmt.Errorf("%w: target unreachable: %w", ErrDisconnected, err)
	case errors.Is(err, verbs.WCWRFlushErr):
		if cause != nil {
			return cause
		}
		return fmt.Errorf("%w: %w", ErrDisconnected, err)
	}
	return fmt.Errorf("%w: %w", ErrDisconnected, err)
}
