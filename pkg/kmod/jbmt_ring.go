package kmod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// JBMTMaxRing is the most entries a JBMT completion ring may have.
const JBMTMaxRing = 65536

// JBMTSQE is one asynchronous JBMT operation (JBMTRing.Submit): the
// arguments of JBMTOp, and a tag given back in its completion.
type JBMTSQE struct {
	Op        uint32 // JBMTGet or JBMTPut
	Peer      uint32
	Addr      uint64 // must stay mapped until the completion is posted
	Length    uint64
	Token     JBMTToken
	Offset    uint64
	UserData  uint64
	TimeoutMS uint32
	Flags     uint16
	Reserved  uint16
}

// JBMTCQE is an asynchronous operation's end, as the module posts it.
type JBMTCQE struct {
	UserData  uint64
	Status    int32 // 0 or a negative errno
	Reserved  uint32
	Done      uint64 // bytes moved from the start
	TSubmit   uint64 // CLOCK_MONOTONIC ns: submitted
	TStart    uint64 // a kernel worker began it
	TFirst    uint64 // its first section's answer came (0: none)
	TEnd      uint64 // it ended
	Reserved2 uint64
}

type rawJBMTRingHdr struct {
	CQHead    uint32
	CQTail    uint32
	CQEntries uint32
	Reserved  [13]uint32
}

type rawJBMTSetup struct {
	Size       uint32
	Flags      uint32
	CQEntries  uint32
	Eventfd    int32
	MmapOffset uint64
	MmapBytes  uint64
}

type rawJBMTSubmit struct {
	Size  uint32
	Count uint32
	SQEs  uint64
}

// JBMTRing is a Device's completion ring for asynchronous JBMT
// operations: the module posts an entry per operation into memory mapped
// here and signals an eventfd, which Wait reads through Go's netpoller (no
// thread per wait). Submit is safe for concurrent use; Poll and Wait are
// meant for one consumer at a time.
type JBMTRing struct {
	dev     *Device
	mem     []byte
	hdr     *rawJBMTRingHdr
	cqes    unsafe.Pointer
	entries uint32
	evt     *os.File

	mu     sync.Mutex // closed, and Poll's head
	closed bool
}

// JBMTRing sets up the Device's completion ring with entries (a power of
// two, 1..JBMTMaxRing), which also bounds the operations in flight plus
// the completions not yet polled. One per Device. Errors wrap ErrInvalid,
// ErrBusy (the Device has one), ErrNoMemory (beyond RLIMIT_MEMLOCK),
// ErrClosed, ErrNotSupported, or the errno of eventfd or mmap.
func (d *Device) JBMTRing(entries uint32) (*JBMTRing, error) {
	if !d.ver.JBMT {
		return nil, &Error{Op: "jbmt setup", Err: syscall.EOPNOTSUPP}
	}
	if entries == 0 || entries > JBMTMaxRing || entries&(entries-1) != 0 {
		return nil, fmt.Errorf("%w: %d ring entries (a power of two up to %d)", ErrInvalid, entries, JBMTMaxRing)
	}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, &Error{Op: "eventfd", Err: err}
	}
	evt := os.NewFile(uintptr(fd), "rdmaplus-jbmt-eventfd")
	s := rawJBMTSetup{Size: uint32(unsafe.Sizeof(rawJBMTSetup{})), CQEntries: entries, Eventfd: int32(fd)}
	if err := d.ioctl("jbmt setup", iocJBMTSetup, unsafe.Pointer(&s)); err != nil {
		evt.Close()
		return nil, err
	}
	mem, err := unix.Mmap(int(d.f.Fd()), int64(s.MmapOffset), int(s.MmapBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		evt.Close()
		return nil, &Error{Op: "mmap", Err: err}
	}
	return &JBMTRing{dev: d, mem: mem, hdr: (*rawJBMTRingHdr)(unsafe.Pointer(&mem[0])),
		cqes: unsafe.Pointer(&mem[unsafe.Sizeof(rawJBMTRingHdr{})]), entries: entries, evt: evt}, nil
}

// Entries is the ring's size.
func (r *JBMTRing) Entries() int { return int(r.entries) }

// Submit hands operations to the module in one call and returns how many
// it took, in order: all of them, or those before the first it refused
// (that one's error is returned when it took none). Each taken operation
// ends with one completion. Errors wrap ErrInvalid (as JBMTOp's), ErrBusy
// (operations in flight and completions not yet polled fill the ring:
// Poll first), ErrClosed, ErrNoMemory.
func (r *JBMTRing) Submit(sqes []JBMTSQE) (int, error) {
	if len(sqes) == 0 {
		return 0, nil
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	a := rawJBMTSubmit{Size: uint32(unsafe.Sizeof(rawJBMTSubmit{})), Count: uint32(len(sqes)),
		SQEs: uint64(uintptr(unsafe.Pointer(&sqes[0])))}
	err := r.dev.ioctl("jbmt submit", iocJBMTSubmit, unsafe.Pointer(&a))
	if err != nil {
		return 0, err
	}
	return int(a.Count), nil
}

// Poll copies up to len(out) posted completions into out, oldest first,
// and returns how many; it never blocks. After Close it returns 0.
func (r *JBMTRing) Poll(out []JBMTCQE) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return 0
	}
	head := atomic.LoadUint32(&r.hdr.CQHead)
	tail := atomic.LoadUint32(&r.hdr.CQTail) // acquire: the entries are whole
	n := 0
	for ; head != tail && n < len(out); n++ {
		e := (*JBMTCQE)(unsafe.Add(r.cqes, uintptr(head&(r.entries-1))*unsafe.Sizeof(JBMTCQE{})))
		out[n] = *e
		head++
	}
	atomic.StoreUint32(&r.hdr.CQHead, head) // release: the slots are free
	return n
}

// Pending reports whether a completion waits to be polled.
func (r *JBMTRing) Pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.closed && atomic.LoadUint32(&r.hdr.CQHead) != atomic.LoadUint32(&r.hdr.CQTail)
}

// Wait blocks until the module signals new completions (or one is
// already pending), ctx ends, or the ring is closed. Errors: ctx's error,
// ErrClosed.
func (r *JBMTRing) Wait(ctx context.Context) error {
	for {
		if r.Pending() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		dl, ok := ctx.Deadline()
		if !ok {
			dl = time.Now().Add(time.Second) // look at ctx again each second
		}
		_ = r.evt.SetReadDeadline(dl)
		var b [8]byte
		_, err := r.evt.Read(b[:])
		switch {
		case err == nil, errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, os.ErrClosed):
			return ErrClosed
		default:
			return &Error{Op: "jbmt wait", Err: err}
		}
	}
}

// Close unmaps the ring and closes its eventfd; the module frees it, and
// cancels the operations still in flight, when the Device is closed. It
// is safe to call twice.
func (r *JBMTRing) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	err := unix.Munmap(r.mem)
	if cerr := r.evt.Close(); err == nil {
		err = cerr
	}
	return err
}
