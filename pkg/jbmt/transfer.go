package jbmt

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// Get copies len(dst) bytes from offset off of the peer's region src into
// dst, and returns how many arrived (from the start of dst) before an
// error. dst is any memory of this process (a Go slice, Alloc's memory):
// the module pins it a section at a time while Get runs, never for long,
// and charges no RLIMIT_MEMLOCK; the peer does the same with its region.
// ctx bounds the wait for the peer's answers and cancels the transfer.
//
// Errors wrap ErrBadToken, ErrStale (src was revoked), ErrPermission (src
// lacks Read), ErrRange, ErrFault, ErrPeerGone, ErrInvalid (an empty dst),
// ErrClosed, ErrNotSupported, ctx's error, or the module's errno (syscall.ETIMEDOUT:
// no answer within the module's longest wait, ten minutes, when ctx has
// no deadline; syscall.ENOMEM). Only ErrPeerGone means the connection is
// down. A host short of pin budget (its own or the peer's) makes Get
// wait, never fail.
func (p *Peer) Get(ctx context.Context, dst []byte, src Token, off uint64) (int, error) {
	return p.transfer(ctx, kmod.JBMTGet, dst, src, off)
}

// Put copies src to offset off of the peer's region dst, and returns how
// many bytes landed there (from the start of src) before an error; when
// it returns nil, all are in the peer's memory. Memory and errors as for
// Get (dst must grant Write).
func (p *Peer) Put(ctx context.Context, src []byte, dst Token, off uint64) (int, error) {
	return p.transfer(ctx, kmod.JBMTPut, src, dst, off)
}

func (p *Peer) transfer(ctx context.Context, op uint32, buf []byte, t Token, off uint64) (int, error) {
	name := "get"
	if op == kmod.JBMTPut {
		name = "put"
	}
	if len(buf) == 0 {
		return 0, fmt.Errorf("jbmt: %s: %w: an empty buffer", name, ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("jbmt: %s: %w", name, err)
	}
	p.svc.mu.Lock()
	closed := p.svc.closed
	p.svc.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("jbmt: %s: %w", name, ErrClosed)
	}

	// The call blocks in the module; a cancelled ctx interrupts it with
	// a signal to this thread (the runtime's own SIGURG, which it
	// ignores), repeated until the call returns. A context that cannot
	// be cancelled costs nothing: no thread locked, no goroutine (a
	// small transfer's round trip is a few of their wake-ups long).
	if ctx.Done() != nil {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid := unix.Gettid()
		returned := make(chan struct{})
		defer close(returned) // after stop: ends a signalling loop
		stop := context.AfterFunc(ctx, func() {
			for {
				_ = unix.Tgkill(unix.Getpid(), tid, unix.SIGURG)
				select {
				case <-returned:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
		defer stop()
	}

	defer runtime.KeepAlive(buf) // the module reads or writes it until then
	tok := kmod.JBMTToken{ID: t.ID, Gen: t.Gen, Key: t.Key}
	var done uint64
	for done < uint64(len(buf)) {
		timeout := time.Duration(0)
		if d, ok := ctx.Deadline(); ok {
			timeout = max(time.Until(d), time.Millisecond)
		}
		n, err := p.svc.dev.JBMTOp(op, p.id, uintptr(unsafe.Pointer(&buf[done])), uint64(len(buf))-done, tok, off+done, timeout)
		done += n
		switch {
		case err == nil:
		case errors.Is(err, syscall.EINTR) && ctx.Err() == nil:
			// another signal: go on from where it stopped
		case ctx.Err() != nil && (errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.ETIMEDOUT)):
			return int(done), fmt.Errorf("jbmt: %s: %w", name, ctx.Err())
		case errors.Is(err, syscall.ETIMEDOUT) && hasDeadline(ctx):
			// the module's timeout was the context's deadline, which
			// its clock saw pass first
			return int(done), fmt.Errorf("jbmt: %s: %w", name, context.DeadlineExceeded)
		default:
			return int(done), wrapTransfer(name, err)
		}
	}
	return int(done), nil
}

func hasDeadline(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok
}

// wrapTransfer maps a transfer's errno onto this package's sentinels.
func wrapTransfer(op string, err error) error {
	var s error
	switch {
	case errors.Is(err, syscall.ENOENT):
		s = ErrBadToken
	case errors.Is(err, syscall.ESTALE):
		s = ErrStale
	case errors.Is(err, syscall.EACCES):
		s = ErrPermission
	case errors.Is(err, syscall.ERANGE):
		s = ErrRange
	case errors.Is(err, syscall.EFAULT):
		s = ErrFault
	case errors.Is(err, syscall.ENOTCONN), errors.Is(err, syscall.ECONNRESET):
		s = ErrPeerGone
	default:
		return wrap(op, err)
	}
	return fmt.Errorf("%w: %w", s, err) // err names the call
}
