package jbmt

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// DefaultRingEntries is the completion ring's size when Options leave it
// zero: the most asynchronous transfers in flight plus completions not
// yet polled.
const DefaultRingEntries = 256

// Completion is the end of an asynchronous transfer (StartGet, StartPut).
type Completion struct {
	Tag uint64 // the caller's, from the Start call
	N   int    // bytes moved, from the start of the buffer, before any error
	// Err is nil, or what Get or Put would have returned but a context's
	// error (the module's timeout is syscall.ETIMEDOUT here).
	Err error
	// When its stages happened, on the CLOCK_MONOTONIC clock (zero when a
	// stage was not reached): the module took it, it began (in the
	// submitting call for a get of one section or a small put whose
	// credit and pin budget were free, else in a kernel worker), the
	// answer to its first section came, it ended.
	Submitted, Started, FirstAnswer, Ended time.Duration
}

type pending struct {
	tag  uint64
	put  bool
	buf  []byte // kept reachable while the module uses it
	peer *Peer
}

// StartGet begins a get of len(dst) bytes from offset off of the peer's
// region src, and returns once the module has taken it: its Completion,
// with tag, comes from Poll. dst must not be read or changed until then
// (the Service keeps it reachable). Errors wrap ErrInvalid (an empty dst),
// ErrBusy (the ring holds as many transfers in flight and completions not
// yet polled as it has entries: Poll first), ErrClosed, ErrNotSupported;
// errors of the transfer itself come with its Completion.
func (p *Peer) StartGet(dst []byte, src Token, off uint64, tag uint64) error {
	return p.start(kmod.JBMTGet, dst, src, off, tag)
}

// StartPut begins a put of src to offset off of the peer's region dst
// (src must not change until its Completion); as StartGet.
func (p *Peer) StartPut(src []byte, dst Token, off uint64, tag uint64) error {
	return p.start(kmod.JBMTPut, src, dst, off, tag)
}

func (p *Peer) start(op uint32, buf []byte, t Token, off uint64, tag uint64) error {
	name := "start get"
	if op == kmod.JBMTPut {
		name = "start put"
	}
	if len(buf) == 0 {
		return fmt.Errorf("jbmt: %s: %w: an empty buffer", name, ErrInvalid)
	}
	s := p.svc
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("jbmt: %s: %w", name, ErrClosed)
	}
	if s.ring == nil {
		r, err := s.dev.JBMTRing(uint32(s.ringEntries))
		if err != nil {
			return wrap(name, err)
		}
		s.ring = r
		s.pending = map[uint64]pending{}
	}
	s.nextID++
	id := s.nextID
	sqe := []kmod.JBMTSQE{{Op: op, Peer: p.id, Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))),
		Length: uint64(len(buf)), Token: kmod.JBMTToken{ID: t.ID, Gen: t.Gen, Key: t.Key},
		Offset: off, UserData: id}}
	// registered before the module can finish it (Poll takes s.mu too)
	s.pending[id] = pending{tag: tag, put: op == kmod.JBMTPut, buf: buf, peer: p}
	if _, err := s.ring.Submit(sqe); err != nil {
		delete(s.pending, id)
		if errors.Is(err, kmod.ErrBusy) {
			return fmt.Errorf("jbmt: %s: %w", name, ErrBusy)
		}
		return wrap(name, err)
	}
	return nil
}

// Poll fills c with completions of asynchronous transfers, oldest first,
// and returns how many; it never blocks. It returns 0 before any Start
// and after Close.
func (s *Service) Poll(c []Completion) int {
	if len(c) == 0 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ring == nil || s.closed {
		return 0
	}
	if cap(s.cqes) < len(c) {
		s.cqes = make([]kmod.JBMTCQE, len(c))
	}
	n := s.ring.Poll(s.cqes[:len(c)])
	for i, e := range s.cqes[:n] {
		pd := s.pending[e.UserData]
		delete(s.pending, e.UserData)
		c[i] = Completion{Tag: pd.tag, N: int(e.Done), Submitted: time.Duration(e.TSubmit),
			Started: time.Duration(e.TStart), FirstAnswer: time.Duration(e.TFirst), Ended: time.Duration(e.TEnd)}
		if e.Status != 0 {
			name := "get"
			if pd.put {
				name = "put"
			}
			c[i].Err = wrapTransfer(name, &kmod.Error{Op: "jbmt " + name, Err: syscall.Errno(-e.Status)})
		}
	}
	return n
}

// Wait blocks until a completion can be polled, ctx ends, or the Service
// is closed (then it returns ErrClosed); it parks the goroutine in Go's
// netpoller, on the eventfd the module signals. Before any Start it waits
// for ctx.
func (s *Service) Wait(ctx context.Context) error {
	s.mu.Lock()
	r, closed := s.ring, s.closed
	s.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("jbmt: wait: %w", ErrClosed)
	case r == nil:
		<-ctx.Done()
		return fmt.Errorf("jbmt: wait: %w", ctx.Err())
	}
	if err := r.Wait(ctx); err != nil {
		if errors.Is(err, kmod.ErrClosed) {
			return fmt.Errorf("jbmt: wait: %w", ErrClosed)
		}
		return fmt.Errorf("jbmt: wait: %w", err)
	}
	return nil
}
