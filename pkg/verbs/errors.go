package verbs

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors. Errors returned by this package wrap one of these (test
// with errors.Is) or a syscall.Errno from the failing verb, or both.
var (
	// ErrClosed is returned when an object is used after Close, or after a
	// parent's Close closed it.
	ErrClosed = errors.New("verbs: use of closed object")
	// ErrNotSupported is returned when the device or the installed
	// libraries lack a feature (for example on-demand paging on rxe).
	ErrNotSupported = errors.New("verbs: not supported by this device")
	// ErrInvalid is returned for arguments that verbs forbid, detected
	// before any call into the library (zero lengths, misaligned atomics,
	// memory not allocated with Alloc, ...).
	ErrInvalid = errors.New("verbs: invalid argument")
	// ErrQueueFull is returned when a post would exceed the queue depth.
	ErrQueueFull = errors.New("verbs: work queue full")
	// ErrWrongState is returned when a QP is not in a state that allows
	// the operation (posting sends before RTS, for example).
	ErrWrongState = errors.New("verbs: queue pair in wrong state")
	// ErrNoDevice is returned when no RDMA device, or none with the
	// requested name, exists.
	ErrNoDevice = errors.New("verbs: no such RDMA device")
	// ErrCQOverrun is returned by every Poll, Wait and Spin of a CQ that
	// overflowed: more completions arrived than it has entries, the
	// device dropped some (IBV_EVENT_CQ_ERR) and the QPs using it were
	// moved to the error state. Nothing the CQ returns can be trusted any
	// more: close the QPs and the CQ. Size a CQ for every work request its
	// QPs can have outstanding at once (see CQ).
	ErrCQOverrun = errors.New("verbs: completion queue overrun, completions lost")
	// ErrPeerGone is returned by the waits of a Conn (and the Poll, Wait
	// and Spin of its CQ) once the connection ended (the peer
	// disconnected, its process died, the device went away, or Close) and
	// every work request posted before has completed: the io.EOF of verbs.
	ErrPeerGone = errors.New("verbs: peer gone, connection ended")
)

// OpError records a failed verb: Op names the libibverbs or librdmacm call
// ("ibv_reg_mr"), Err is usually a syscall.Errno. errors.Is(err,
// ErrNotSupported) holds for EOPNOTSUPP and ENOSYS. (A failed post is a
// *PostError, which matches ErrQueueFull for ENOMEM.)
type OpError struct {
	Op  string
	Err error
}

func (e *OpError) Error() string { return "verbs: " + e.Op + ": " + e.Err.Error() }

// Unwrap returns the underlying error (typically a syscall.Errno).
func (e *OpError) Unwrap() error { return e.Err }

// Is makes OpError match ErrNotSupported for EOPNOTSUPP/ENOSYS/EPROTONOSUPPORT.
func (e *OpError) Is(target error) bool {
	if target == ErrNotSupported {
		var n syscall.Errno
		if errors.As(e.Err, &n) {
			return n == syscall.EOPNOTSUPP || n == syscall.ENOSYS || n == syscall.EPROTONOSUPPORT
		}
	}
	return false
}

func opErr(op string, errno int) error {
	if errno == 0 {
		errno = int(syscall.EIO)
	}
	if errno < 0 {
		errno = -errno
	}
	return &OpError{Op: op, Err: syscall.Errno(errno)}
}

// PostError reports a rejected post. Index is the position in the chain of
// the first work request that was not posted; the ones before it were
// posted and will complete.
type PostError struct {
	Op    string // "ibv_post_send", "ibv_post_recv" or "ibv_post_srq_recv"
	Index int
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("verbs: %s: work request %d: %v", e.Op, e.Index, e.Err)
}

// Unwrap returns the cause (a syscall.Errno or a sentinel error).
func (e *PostError) Unwrap() error { return e.Err }

// Is lets ENOMEM from a post match ErrQueueFull.
func (e *PostError) Is(target error) bool {
	if target == ErrQueueFull {
		var n syscall.Errno
		return errors.As(e.Err, &n) && n == syscall.ENOMEM
	}
	return false
}

// WCStatus is the status of a work completion (enum ibv_wc_status).
type WCStatus uint32

// Work completion statuses.
const (
	WCSuccess          WCStatus = 0
	WCLocLenErr        WCStatus = 1
	WCLocQPOpErr       WCStatus = 2
	WCLocEECOpErr      WCStatus = 3
	WCLocProtErr       WCStatus = 4
	WCWRFlushErr       WCStatus = 5
	WCMWBindErr        WCStatus = 6
	WCBadRespErr       WCStatus = 7
	WCLocAccessErr     WCStatus = 8
	WCRemInvReqErr     WCStatus = 9
	WCRemAccessErr     WCStatus = 10
	WCRemOpErr         WCStatus = 11
	WCRetryExcErr      WCStatus = 12
	WCRNRRetryExcErr   WCStatus = 13
	WCLocRDDViolErr    WCStatus = 14
	WCRemInvRdReqErr   WCStatus = 15
	WCRemAbortErr      WCStatus = 16
	WCInvEECNErr       WCStatus = 17
	WCInvEECStateErr   WCStatus = 18
	WCFatalErr         WCStatus = 19
	WCRespTimeoutErr   WCStatus = 20
	WCGeneralErr       WCStatus = 21
	WCTMErr            WCStatus = 22
	WCTMRndvIncomplete WCStatus = 23
)

var wcStatusInfo = [...]struct{ name, msg string }{
	{"IBV_WC_SUCCESS", "success"},
	{"IBV_WC_LOC_LEN_ERR", "local length error"},
	{"IBV_WC_LOC_QP_OP_ERR", "local QP operation error"},
	{"IBV_WC_LOC_EEC_OP_ERR", "local EE context operation error"},
	{"IBV_WC_LOC_PROT_ERR", "local protection error"},
	{"IBV_WC_WR_FLUSH_ERR", "work request flushed"},
	{"IBV_WC_MW_BIND_ERR", "memory window bind error"},
	{"IBV_WC_BAD_RESP_ERR", "bad response error"},
	{"IBV_WC_LOC_ACCESS_ERR", "local access error"},
	{"IBV_WC_REM_INV_REQ_ERR", "remote invalid request error"},
	{"IBV_WC_REM_ACCESS_ERR", "remote access error"},
	{"IBV_WC_REM_OP_ERR", "remote operation error"},
	{"IBV_WC_RETRY_EXC_ERR", "transport retry counter exceeded"},
	{"IBV_WC_RNR_RETRY_EXC_ERR", "RNR retry counter exceeded"},
	{"IBV_WC_LOC_RDD_VIOL_ERR", "local RDD violation error"},
	{"IBV_WC_REM_INV_RD_REQ_ERR", "remote invalid RD request"},
	{"IBV_WC_REM_ABORT_ERR", "aborted error"},
	{"IBV_WC_INV_EECN_ERR", "invalid EE context number"},
	{"IBV_WC_INV_EEC_STATE_ERR", "invalid EE context state"},
	{"IBV_WC_FATAL_ERR", "fatal error"},
	{"IBV_WC_RESP_TIMEOUT_ERR", "response timeout error"},
	{"IBV_WC_GENERAL_ERR", "general error"},
	{"IBV_WC_TM_ERR", "tag matching error"},
	{"IBV_WC_TM_RNDV_INCOMPLETE", "tag matching rendezvous incomplete"},
}

// Name returns the verbs name of the status, e.g. "IBV_WC_REM_ACCESS_ERR".
func (s WCStatus) Name() string {
	if int(s) < len(wcStatusInfo) {
		return wcStatusInfo[s].name
	}
	return fmt.Sprintf("IBV_WC_STATUS(%d)", uint32(s))
}

// String returns the readable message, as ibv_wc_status_str does.
func (s WCStatus) String() string {
	if int(s) < len(wcStatusInfo) {
		return wcStatusInfo[s].msg
	}
	return fmt.Sprintf("unknown completion status %d", uint32(s))
}

// Error makes a WCStatus usable as an error value (errors.Is(err,
// verbs.WCRemAccessErr) works on a *WCError).
func (s WCStatus) Error() string { return s.Name() + ": " + s.String() }

// WCError is the error form of a failed work completion.
type WCError struct {
	Status    WCStatus
	VendorErr uint32
	ID        uint64   // the work request ID
	Opcode    WCOpcode // valid only for some statuses
	QPN       uint32
}

func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: work request %d on QP %d completed with %s (%s), vendor error %#x",
		e.ID, e.QPN, e.Status.Name(), e.Status.String(), e.VendorErr)
}

// Unwrap returns the status so errors.Is(err, WCRemAccessErr) works.
func (e *WCError) Unwrap() error { return e.Status }

// closedErr builds an ErrClosed error naming the object kind.
func closedErr(what string) error { return &closedError{kind: what} }

// closedError is a call (op) on a closed object of kind; it matches
// ErrClosed.
type closedError struct{ op, kind string }

func (e *closedError) Error() string {
	if e.op == "" {
		return "verbs: use of closed " + e.kind
	}
	return "verbs: " + e.op + ": use of closed " + e.kind
}

func (e *closedError) Is(target error) bool { return target == ErrClosed }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func errnoOf(rc int) error {
	if rc < 0 {
		rc = -rc
	}
	if rc == 0 {
		return nil
	}
	return syscall.Errno(rc)
}
