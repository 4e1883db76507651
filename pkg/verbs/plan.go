package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// SendPlan is a chain of send work requests that is validated and written
// into C memory once and then posted any number of times, each time with
// one cgo call and nothing else: no validation, no conversion, no lock
// shared with other posts. It is the fast path for a loop that posts the
// same shape again and again (a ping-pong, a stream into a ring); the Set
// methods change a field between posts at the cost of checking that one
// field.
//
// A plan belongs to its QP (and to the AH of a UD work request): closing
// either closes the plan. Post, the Set methods and Close may be called
// from any goroutine, but Post and the Set methods of one plan must not run
// concurrently with each other (as with a bufio.Writer); different plans,
// and PostSend, may post on one QP at the same time. Memory window binds
// (OpBindMW) cannot be planned: post them with PostSend or QP.BindMW.
type SendPlan struct {
	n   node
	qp  *QP
	s   postScratch
	wrs []SendWR // what is in C memory, each with its own SGL copy
	sw  []C.struct_shim_swr
	sge []SGE
}

// NewSendPlan validates wrs as PostSend does and writes them into C memory
// owned by the plan; it does not post them. Errors wrap ErrInvalid (an
// empty chain, OpBindMW, or any work request PostSend would refuse),
// ErrQueueFull (a chain longer than the send queue) or ErrClosed.
func (qp *QP) NewSendPlan(wrs ...SendWR) (*SendPlan, error) {
	if len(wrs) == 0 {
		return nil, invalid("a send plan needs at least one work request")
	}
	if err := qp.n.use("QP.NewSendPlan"); err != nil {
		return nil, err
	}
	defer qp.n.unuse()
	if len(wrs) > qp.cap.MaxSendWR {
		return nil, fmt.Errorf("%w: chain of %d, send queue holds %d", ErrQueueFull, len(wrs), qp.cap.MaxSendWR)
	}
	p := &SendPlan{qp: qp, wrs: make([]SendWR, len(wrs))}
	parents := []*node{&qp.n}
	for i := range wrs {
		if err := p.check(i, &wrs[i]); err != nil {
			return nil, err
		}
		p.wrs[i] = wrs[i]
		p.wrs[i].SGL = append(make([]SGE, 0, qp.cap.MaxSendSGE), wrs[i].SGL...)
		if ah := wrs[i].AH; ah != nil {
			parents = append(parents, &ah.n)
		}
	}
	p.s.maxSGE = max(qp.cap.MaxSendSGE, 1)
	p.s.cap = len(wrs)
	p.s.alloc(len(wrs), true)
	p.sw = unsafe.Slice(p.s.swr, len(wrs))
	p.sge = unsafe.Slice((*SGE)(unsafe.Pointer(p.s.sge)), len(wrs)*p.s.maxSGE)
	for i := range p.wrs {
		fillSend(&p.sw[i], &p.wrs[i], p.sge, i*p.s.maxSGE)
	}
	p.n.init("send plan", func() error { p.s.free(); return nil })
	if err := p.n.attach(parents...); err != nil {
		p.n.close()
		return nil, err
	}
	return p, nil
}

func (p *SendPlan) check(i int, w *SendWR) error {
	if w.Op == OpBindMW {
		return invalid("work request %d: a send plan cannot hold BIND_MW; post it with PostSend", i)
	}
	return checkSend(i, w, p.qp.typ, p.qp.cap)
}

// Len returns the number of work requests in the plan.
func (p *SendPlan) Len() int { return len(p.wrs) }

// Post posts the whole chain. Errors are those of PostSend: ErrClosed (the
// plan or its QP closed), ErrWrongState, or a *PostError from the provider
// (ENOMEM, a full send queue, matches ErrQueueFull).
func (p *SendPlan) Post() error {
	if err := p.n.use("SendPlan.Post"); err != nil {
		return err
	}
	if st := p.qp.postState(QPState.canSend); !st.canSend() {
		p.n.unuse()
		return &PostError{Op: "ibv_post_send", Index: 0, Err: fmt.Errorf("%w: %v", ErrWrongState, st)}
	}
	var bad C.int
	rc := C.shim_post_send(handle(p.qp.c), p.s.swr, C.int(len(p.wrs)), p.s.sge, C.uintptr_t(uintptr(p.s.wrs)), &bad)
	p.n.unuse()
	if rc != 0 {
		return &PostError{Op: "ibv_post_send", Index: int(bad), Err: errnoOf(int(rc))}
	}
	return nil
}

// Set replaces work request i. It is checked like a work request of
// NewSendPlan; it may not bring an AH the plan was not made with. Errors
// wrap ErrInvalid (i out of range, or a bad work request: the plan is then
// unchanged) or ErrClosed.
func (p *SendPlan) Set(i int, w SendWR) error {
	if w.AH != nil && !p.hasAH(w.AH) {
		return invalid("work request %d: a send plan's AHs are fixed when it is made", i)
	}
	return p.modify(i, func(old *SendWR) { *old = w })
}

// SetFlags changes the flags of work request i (signaled every n-th post,
// for example). Errors wrap ErrInvalid (i out of range, or inline data the
// QP cannot take) or ErrClosed.
func (p *SendPlan) SetFlags(i int, f SendFlags) error {
	return p.modify(i, func(w *SendWR) { w.Flags = f })
}

// SetID changes the ID work request i returns in its completion. Errors
// wrap ErrInvalid (i out of range) or ErrClosed.
func (p *SendPlan) SetID(i int, id uint64) error {
	if err := p.use(i); err != nil {
		return err
	}
	defer p.n.unuse()
	p.wrs[i].ID = id
	p.sw[i].wr_id = C.uint64_t(id)
	return nil
}

// SetImm changes the immediate data of work request i. Errors wrap
// ErrInvalid (i out of range) or ErrClosed.
func (p *SendPlan) SetImm(i int, imm uint32) error {
	if err := p.use(i); err != nil {
		return err
	}
	defer p.n.unuse()
	p.wrs[i].Imm = imm
	p.sw[i].imm = C.uint32_t(imm)
	return nil
}

// SetRemote changes the remote address and key of work request i (RDMA and
// atomics). Errors wrap ErrInvalid (i out of range, a misaligned atomic) or
// ErrClosed.
func (p *SendPlan) SetRemote(i int, addr uint64, rkey uint32) error {
	return p.modify(i, func(w *SendWR) { w.RemoteAddr, w.RKey = addr, rkey })
}

// modify applies change to a copy of work request i and, if the result
// passes the checks of NewSendPlan, writes it into the plan.
func (p *SendPlan) modify(i int, change func(*SendWR)) error {
	if err := p.use(i); err != nil {
		return err
	}
	defer p.n.unuse()
	w := p.wrs[i]
	change(&w)
	if err := p.check(i, &w); err != nil {
		return err
	}
	w.SGL = append(p.wrs[i].SGL[:0], w.SGL...)
	p.wrs[i] = w
	fillSend(&p.sw[i], &p.wrs[i], p.sge, i*p.s.maxSGE)
	return nil
}

// Close frees the plan's C memory. It is idempotent; Post after Close fails
// with ErrClosed.
func (p *SendPlan) Close() error { return p.n.close() }

// use locks the plan's C memory for a Set method (the caller unlocks it)
// and checks i.
func (p *SendPlan) use(i int) error {
	if err := p.n.use("SendPlan.Set"); err != nil {
		return err
	}
	if i < 0 || i >= len(p.wrs) {
		p.n.unuse()
		return invalid("work request %d: the plan holds %d", i, len(p.wrs))
	}
	return nil
}

func (p *SendPlan) hasAH(ah *AH) bool {
	for i := range p.wrs {
		if p.wrs[i].AH == ah {
			return true
		}
	}
	return false
}
