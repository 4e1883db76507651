package verbs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pollFD parks goroutines on a file descriptor owned by libibverbs or
// librdmacm (a completion channel, the async event fd, the rdma_cm event
// channel) through Go's netpoller. The descriptor is made non-blocking (the
// flag lives in the shared open file description, so the library's own reads
// become non-blocking too) and a duplicate is handed to os.NewFile, so
// closing the os.File never closes the library's descriptor.
type pollFD struct {
	f  *os.File
	rc syscall.RawConn
	mu sync.Mutex // one waiter at a time

	closed atomic.Bool
}

var errAgain = errors.New("again")

func newPollFD(fd int, name string) (*pollFD, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, &OpError{Op: "fcntl O_NONBLOCK " + name, Err: err}
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, &OpError{Op: "dup " + name, Err: err}
	}
	f := os.NewFile(uintptr(dup), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, &OpError{Op: "SyscallConn " + name, Err: err}
	}
	return &pollFD{f: f, rc: rc}, nil
}

var longAgo = time.Unix(1, 0)

// wait calls try until it reports done or an error, parking the goroutine
// in the netpoller while try returns errAgain. It returns ctx's error when
// ctx ends first and ErrClosed when the pollFD is closed meanwhile.
func (p *pollFD) wait(ctx context.Context, try func() error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	var fired chan struct{}
	var stop func() bool
	if ctx.Done() != nil {
		fired = make(chan struct{})
		stop = context.AfterFunc(ctx, func() {
			p.f.SetReadDeadline(longAgo)
			close(fired)
		})
	}
	var terr error
	err := p.rc.Read(func(uintptr) bool {
		terr = try()
		return terr != errAgain
	})
	if stop != nil && !stop() {
		<-fired
		p.f.SetReadDeadline(time.Time{})
	}
	switch {
	case err == nil:
		return terr
	case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
		return ctx.Err()
	case p.closed.Load() || errors.Is(err, os.ErrClosed):
		return ErrClosed
	}
	return fmt.Errorf("verbs: waiting on %s: %w", p.f.Name(), err)
}

func (p *pollFD) close() error {
	p.closed.Store(true)
	return p.f.Close()
}
