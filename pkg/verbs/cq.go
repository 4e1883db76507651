package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// WCOpcode is the kind of operation a work completion reports
// (enum ibv_wc_opcode).
type WCOpcode uint32

// Work completion opcodes.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags are the flags of a work completion.
type WCFlags uint32

// Work completion flags.
const (
	WCFlagGRH      WCFlags = 1 << 0
	WCFlagWithImm  WCFlags = 1 << 1
	WCFlagIPCSumOK WCFlags = 1 << 2
	WCFlagWithInv  WCFlags = 1 << 3
)

// WC is a work completion. Its layout matches the C helper's flat
// completion record so a batch is copied with one memmove.
type WC struct {
	ID        uint64 // the work request ID
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	// Imm is the immediate data in host byte order when Flags has
	// WCFlagWithImm, the invalidated rkey when it has WCFlagWithInv.
	Imm          uint32
	QPN          uint32
	SrcQP        uint32
	Flags        WCFlags
	PKeyIndex    uint16
	SLID         uint16
	SL           uint8
	DLIDPathBits uint8
}

// Compile-time checks that WC matches struct shim_wc.
var (
	_ [unsafe.Sizeof(WC{}) - unsafe.Sizeof(C.struct_shim_wc{})]struct{}
	_ [unsafe.Sizeof(C.struct_shim_wc{}) - unsafe.Sizeof(WC{})]struct{}
	_ [unsafe.Offsetof(WC{}.Imm) - unsafe.Offsetof(C.struct_shim_wc{}.imm)]struct{}
	_ [unsafe.Offsetof(C.struct_shim_wc{}.imm) - unsafe.Offsetof(WC{}.Imm)]struct{}
	_ [unsafe.Offsetof(WC{}.PKeyIndex) - unsafe.Offsetof(C.struct_shim_wc{}.pkey_index)]struct{}
	_ [unsafe.Offsetof(C.struct_shim_wc{}.pkey_index) - unsafe.Offsetof(WC{}.PKeyIndex)]struct{}
	_ [unsafe.Offsetof(WC{}.DLIDPathBits) - unsafe.Offsetof(C.struct_shim_wc{}.dlid_path_bits)]struct{}
	_ [unsafe.Offsetof(C.struct_shim_wc{}.dlid_path_bits) - unsafe.Offsetof(WC{}.DLIDPathBits)]struct{}
)

// Err returns nil for a successful completion and a *WCError otherwise.
func (wc WC) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, VendorErr: wc.VendorErr, ID: wc.ID, Opcode: wc.Opcode, QPN: wc.QPN}
}

// HasImm reports whether the completion carries immediate data.
func (wc WC) HasImm() bool { return wc.Flags&WCFlagWithImm != 0 }

// CompChannel is a completion channel (struct ibv_comp_channel) integrated
// with Go's netpoller: CQ.Wait parks the calling goroutine, never an OS
// thread. One dispatcher goroutine per channel reads the channel's events
// and wakes the waiter of the CQ each event is for. A channel is the parent
// of the CQs that use it.
type CompChannel struct {
	n   node
	c   *C.struct_ibv_comp_channel
	ctx *Context
	p   *pollFD

	mu    sync.Mutex
	cqs   map[*C.struct_ibv_cq]*CQ
	start sync.Once
	quit  chan struct{}
}

// NewCompChannel creates a completion channel. Errors wrap ErrClosed or the
// errno of ibv_create_comp_channel.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	if err := c.n.use("Context.NewCompChannel"); err != nil {
		return nil, err
	}
	defer c.n.unuse()
	ch, errno := C.ibv_create_comp_channel(c.c)
	if ch == nil {
		return nil, &OpError{Op: "ibv_create_comp_channel", Err: errnoOr(errno)}
	}
	p, err := newPollFD(int(ch.fd), c.name+" completion channel")
	if err != nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, err
	}
	cc := &CompChannel{c: ch, ctx: c, p: p, cqs: map[*C.struct_ibv_cq]*CQ{}, quit: make(chan struct{})}
	cc.n.init("completion channel", func() error {
		if rc := C.ibv_destroy_comp_channel(ch); rc != 0 {
			return opErr("ibv_destroy_comp_channel", int(rc))
		}
		return nil
	})
	cc.n.preclose = func() {
		p.close()
		close(cc.quit)
	}
	if err := cc.n.attach(&c.n); err != nil {
		cc.n.close()
		return nil, err
	}
	return cc, nil
}

// Close destroys the channel after closing the CQs that use it. It is
// idempotent.
func (ch *CompChannel) Close() error { return ch.n.close() }

// dispatch reads completion events until the channel closes.
func (ch *CompChannel) dispatch() {
	for {
		var cq *C.struct_ibv_cq
		err := ch.p.wait(context.Background(), func() error {
			rc := C.shim_get_cq_event(ch.c, &cq)
			if rc == C.EAGAIN {
				return errAgain
			}
			if rc != 0 {
				return opErr("ibv_get_cq_event", int(rc))
			}
			return nil
		})
		if err != nil {
			return
		}
		ch.mu.Lock()
		g := ch.cqs[cq]
		ch.mu.Unlock()
		if g != nil {
			select {
			case g.wake <- struct{}{}:
			default:
			}
		}
	}
}

// CQ is a completion queue (struct ibv_cq), a child of its context and of
// its completion channel, if any. Poll never blocks; Wait parks the
// goroutine on the completion channel; Spin busy-polls in C for the lowest
// latency.
//
// Sizing: a CQ must have room for every completion that can be waiting in
// it at once: for each QP using it, the signaled send work requests it can
// have outstanding (all of MaxSendWR with SignalAll, or when every request
// is signaled) plus, as its receive CQ, MaxRecvWR (an SRQ's MaxWR once for
// all its QPs). A CQ that overflows loses completions without a trace in
// the CQ itself; the package reads the device's IBV_EVENT_CQ_ERR for it,
// moves the QPs using the CQ to the error state and fails every later
// Poll, Wait and Spin with ErrCQOverrun. Dial and Listener.Accept size
// their CQ this way.
type CQ struct {
	n   node
	c   *C.struct_ibv_cq
	ctx *Context
	ch  *CompChannel
	cqe int

	pollMu  sync.Mutex
	yielder Yielder // shared by the CQ's spinners
	batch   int
	raw     *C.struct_ibv_wc
	out     *C.struct_shim_wc

	waitMu sync.Mutex
	armed  bool
	wake   chan struct{}
	quit   chan struct{}

	overrun   atomic.Bool  // IBV_EVENT_CQ_ERR came (Context.readAsync)
	drainLeft atomic.Int32 // a Conn's drain markers still to come (conn.go)
	gone      atomic.Bool  // a Conn's CQ: ended and drained
}

// CQOptions configure NewCQ.
type CQOptions struct {
	// Channel, if set, lets Wait sleep until a completion arrives.
	Channel *CompChannel
	// CompVector selects the completion vector (0 by default).
	CompVector int
	// Batch is the number of completions one Poll call can fetch from the
	// device in one cgo crossing (default 32); a Poll for more makes one
	// crossing per Batch.
	Batch int
}

// NewCQ creates a completion queue with room for at least cqe entries.
// Errors wrap ErrInvalid (cqe < 1), ErrClosed, or the errno of
// ibv_create_cq (EINVAL when cqe exceeds the device's MaxCQE).
func (c *Context) NewCQ(cqe int, opts *CQOptions) (*CQ, error) {
	if cqe < 1 {
		return nil, invalid("CQ size %d", cqe)
	}
	var o CQOptions
	if opts != nil {
		o = *opts
	}
	if o.Batch <= 0 {
		o.Batch = 32
	}
	if err := c.n.use("Context.NewCQ"); err != nil {
		return nil, err
	}
	defer c.n.unuse()
	var chc *C.struct_ibv_comp_channel
	if o.Channel != nil {
		if o.Channel.ctx != c {
			return nil, invalid("completion channel of another device")
		}
		if err := o.Channel.n.use("Context.NewCQ"); err != nil {
			return nil, err
		}
		defer o.Channel.n.unuse()
		chc = o.Channel.c
	}
	q, errno := C.ibv_create_cq(c.c, C.int(cqe), nil, chc, C.int(o.CompVector))
	if q == nil {
		return nil, &OpError{Op: fmt.Sprintf("ibv_create_cq(%d)", cqe), Err: errnoOr(errno)}
	}
	cq := &CQ{c: q, ctx: c, ch: o.Channel, cqe: int(q.cqe), batch: o.Batch,
		wake: make(chan struct{}, 1), quit: make(chan struct{})}
	cq.raw = (*C.struct_ibv_wc)(C.calloc(C.size_t(o.Batch), C.size_t(unsafe.Sizeof(C.struct_ibv_wc{}))))
	cq.out = (*C.struct_shim_wc)(C.calloc(C.size_t(o.Batch), C.size_t(unsafe.Sizeof(C.struct_shim_wc{}))))
	key := uintptr(unsafe.Pointer(q))
	cq.n.init("completion queue", func() error {
		if o.Channel != nil {
			o.Channel.mu.Lock()
			delete(o.Channel.cqs, q)
			o.Channel.mu.Unlock()
		}
		c.regMu.Lock()
		delete(c.cqs, key)
		c.regMu.Unlock()
		rc := C.ibv_destroy_cq(q)
		C.free(unsafe.Pointer(cq.raw))
		C.free(unsafe.Pointer(cq.out))
		cq.raw, cq.out = nil, nil
		if rc != 0 {
			return opErr("ibv_destroy_cq", int(rc))
		}
		return nil
	})
	cq.n.preclose = func() { close(cq.quit) }
	parents := []*node{&c.n}
	if o.Channel != nil {
		parents = append(parents, &o.Channel.n)
		o.Channel.mu.Lock()
		o.Channel.cqs[q] = cq
		o.Channel.mu.Unlock()
	}
	c.regMu.Lock()
	c.cqs[key] = cq
	c.regMu.Unlock()
	if err := cq.n.attach(parents...); err != nil {
		cq.n.close()
		return nil, err
	}
	return cq, nil
}

// Close destroys the CQ after closing the QPs that use it. A
// goroutine blocked in Wait returns ErrClosed. It is idempotent.
func (cq *CQ) Close() error { return cq.n.close() }

// signal wakes a goroutine parked in Wait, to look at the CQ again.
func (cq *CQ) signal() {
	select {
	case cq.wake <- struct{}{}:
	default:
	}
}

// Size returns the number of entries the device allocated.
func (cq *CQ) Size() int { return cq.cqe }

// CPtr returns the underlying struct ibv_cq pointer (valid until Close).
func (cq *CQ) CPtr() unsafe.Pointer { return unsafe.Pointer(cq.c) }

// Poll fetches up to len(wcs) completions without blocking and returns how
// many it stored. Completions with an error status are returned like any
// other (check WC.Err). Errors wrap ErrClosed, ErrCQOverrun (from the
// first Poll after the CQ overflowed, on every call), ErrPeerGone (a
// Conn's CQ, once it is empty after the connection ended) or the errno of
// ibv_poll_cq.
func (cq *CQ) Poll(wcs []WC) (int, error) { return cq.poll(wcs, 1) }

// poll is Poll whose first ibv_poll_cq is tried up to polls times in one
// cgo call.
func (cq *CQ) poll(wcs []WC, polls int) (int, error) {
	if err := cq.n.use("CQ.Poll"); err != nil {
		return 0, err
	}
	defer cq.n.unuse()
	if cq.overrun.Load() {
		return 0, fmt.Errorf("%w (a CQ of %d entries)", ErrCQOverrun, cq.cqe)
	}
	cq.pollMu.Lock()
	defer cq.pollMu.Unlock()
	total := 0
	for total < len(wcs) {
		want := min(len(wcs)-total, cq.batch)
		got := int(C.shim_spin_cq(handle(cq.c), C.int(want), cq.raw, cq.out, C.int(polls)))
		if got < 0 {
			return total, opErr("ibv_poll_cq", -got)
		}
		copy(wcs[total:total+got], unsafe.Slice((*WC)(unsafe.Pointer(cq.out)), got))
		total += got
		if got < want {
			break
		}
		polls = 1
	}
	if cq.drainLeft.Load() > 0 {
		total = cq.dropMarkers(wcs[:total])
	}
	if total == 0 && cq.gone.Load() {
		return 0, ErrPeerGone
	}
	return total, nil
}

// spinPolls is how many times one cgo call of Spin polls: enough that the
// C loop, not the cgo crossing, sets how soon a completion is seen, few
// enough (tens of microseconds under TCG) that the goroutine is back in Go
// often (see Spin).
const spinPolls = 64

// nopLocker is the sync.Locker of Wait and Spin: nothing to hold.
type nopLocker struct{}

func (nopLocker) Lock()   {}
func (nopLocker) Unlock() {}

// Spin busy-polls until at least one completion arrives, then returns the
// completions available (up to len(wcs)). It costs one CPU while it waits.
// Errors wrap ErrInvalid (empty wcs), ErrClosed, ctx's error or the errno
// of ibv_poll_cq.
//
// Each cgo call polls at most spinPolls times, and the CQ's spinners pass
// through the scheduler once every YieldEvery (runtime.Gosched; see
// Yielder). A goroutine that instead spins inside one long C call, or runs
// 10 ms without being scheduled, has its P taken away by the Go runtime's
// monitor thread, which then wakes every 20 µs for a while and hands the
// P back through other threads: measured between two one-CPU guests, 22
// to 26 context switches per send_lat round trip and 3.1 to 3.3x
// perftest's latency, against 2 to 3 and 1.15 to 1.40x this way
// (docs/benchmarks.md).
func (cq *CQ) Spin(ctx context.Context, wcs []WC) (int, error) {
	return cq.SpinWith(ctx, wcs, nopLocker{})
}

// SpinWith is Spin for a CQ that several goroutines poll and whose
// completions must be handled in the order they were polled: every poll
// holds mu, and a call that returns completions (n > 0, nil error) returns
// with mu still held, so that the caller handles them before anyone polls
// the next ones, then unlocks it. On an error mu is not held.
func (cq *CQ) SpinWith(ctx context.Context, wcs []WC, mu sync.Locker) (int, error) {
	if len(wcs) == 0 {
		return 0, invalid("empty completion slice")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	for i := 1; ; i++ {
		mu.Lock()
		n, err := cq.poll(wcs, spinPolls)
		if n != 0 {
			return n, nil // an error after them comes again at the next poll
		}
		mu.Unlock()
		if err != nil {
			return 0, err
		}
		if i%4 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			cq.yielder.Maybe()
		}
	}
}

// ReqNotify arms the CQ so that the next completion (the next solicited one
// if solicitedOnly) raises an event on its channel. Wait does this itself.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if err := cq.n.use("CQ.ReqNotify"); err != nil {
		return err
	}
	defer cq.n.unuse()
	s := 0
	if solicitedOnly {
		s = 1
	}
	if rc := C.shim_req_notify(handle(cq.c), C.int(s)); rc != 0 {
		return opErr("ibv_req_notify_cq", int(rc))
	}
	return nil
}

// Wait returns at least one completion, parking the goroutine on the
// completion channel (in the netpoller) while the CQ is empty. It fails with
// ErrInvalid when the CQ has no channel, ErrClosed when the CQ or channel is
// closed meanwhile, ctx's error (at once when ctx is already done: the
// completions stay in the CQ for the next call), or Poll's errors
// (ErrCQOverrun, ErrPeerGone).
func (cq *CQ) Wait(ctx context.Context, wcs []WC) (int, error) {
	return cq.WaitWith(ctx, wcs, nopLocker{})
}

// WaitWith is Wait for a CQ that several goroutines poll and whose
// completions must be handled in the order they were polled: every poll
// holds mu (never the wait for an event), and a call that returns
// completions (n > 0, nil error) returns with mu still held, so that the
// caller handles them before anyone polls the next ones, then unlocks it.
// On an error mu is not held.
func (cq *CQ) WaitWith(ctx context.Context, wcs []WC, mu sync.Locker) (int, error) {
	if len(wcs) == 0 {
		return 0, invalid("empty completion slice")
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if cq.ch == nil {
		return 0, invalid("CQ has no completion channel; use Poll or Spin")
	}
	cq.ch.start.Do(func() { go cq.ch.dispatch() })
	cq.waitMu.Lock()
	defer cq.waitMu.Unlock()
	for {
		mu.Lock()
		n, err := cq.Poll(wcs)
		if n > 0 {
			return n, nil // an error after them comes again at the next poll
		}
		mu.Unlock()
		if err != nil {
			return 0, err
		}
		if !cq.armed {
			if err := cq.ReqNotify(false); err != nil {
				return 0, err
			}
			cq.armed = true
			// A completion may have arrived before arming.
			continue
		}
		select {
		case <-cq.wake:
			cq.armed = false
		case <-cq.quit:
			return 0, closedErr(cq.n.kind)
		case <-cq.ch.quit:
			return 0, closedErr(cq.ch.n.kind)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}
