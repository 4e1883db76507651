package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// SRQ is a shared receive queue (struct ibv_srq): several QPs take their
// receive buffers from it. It is a child of its PD and the parent of the
// QPs that use it.
type SRQ struct {
	n      node
	c      *C.struct_ibv_srq
	pd     *PD
	maxWR  int
	maxSGE int

	mu sync.Mutex
	rq postScratch
}

// SRQAttr sizes a shared receive queue. Limit, if not 0, arms the SRQ
// limit event: an async event EventSRQLimitReached fires once fewer than
// Limit receive requests remain.
type SRQAttr struct {
	MaxWR  int
	MaxSGE int
	Limit  int
}

// NewSRQ creates a shared receive queue. Errors wrap ErrInvalid (a nil a,
// MaxWR < 1), ErrClosed or the errno of ibv_create_srq.
func (pd *PD) NewSRQ(a *SRQAttr) (*SRQ, error) {
	if a == nil {
		return nil, invalid("NewSRQ needs its size (SRQAttr)")
	}
	c := *a
	a = &c
	if a.MaxWR < 1 {
		return nil, invalid("SRQ size %d", a.MaxWR)
	}
	if a.MaxSGE < 1 {
		a.MaxSGE = 1
	}
	if err := pd.n.use("PD.NewSRQ"); err != nil {
		return nil, err
	}
	defer pd.n.unuse()
	var ia C.struct_ibv_srq_init_attr
	ia.attr.max_wr = C.uint32_t(a.MaxWR)
	ia.attr.max_sge = C.uint32_t(a.MaxSGE)
	ia.attr.srq_limit = C.uint32_t(a.Limit)
	s, errno := C.ibv_create_srq(pd.c, &ia)
	if s == nil {
		return nil, &OpError{Op: "ibv_create_srq", Err: errnoOr(errno)}
	}
	srq := &SRQ{c: s, pd: pd, maxWR: int(ia.attr.max_wr), maxSGE: int(ia.attr.max_sge)}
	srq.rq.init(srq.maxWR, srq.maxSGE, false)
	ctx := pd.ctx
	key := uintptr(unsafe.Pointer(s))
	srq.n.init("shared receive queue", func() error {
		ctx.regMu.Lock()
		delete(ctx.srqs, key)
		ctx.regMu.Unlock()
		rc := C.ibv_destroy_srq(s)
		srq.rq.free()
		if rc != 0 {
			return opErr("ibv_destroy_srq", int(rc))
		}
		return nil
	})
	ctx.regMu.Lock()
	ctx.srqs[key] = srq
	ctx.regMu.Unlock()
	if err := srq.n.attach(&pd.n); err != nil {
		srq.n.close()
		return nil, err
	}
	if a.Limit > 0 {
		if err := srq.Arm(a.Limit); err != nil {
			srq.Close()
			return nil, err
		}
	}
	return srq, nil
}

// Close closes the QPs using the SRQ, then destroys it. It is idempotent.
func (srq *SRQ) Close() error { return srq.n.close() }

// MaxWR returns the queue's capacity as granted by the device.
func (srq *SRQ) MaxWR() int { return srq.maxWR }

// Arm sets the SRQ limit: the device raises EventSRQLimitReached (once)
// when fewer than limit receive requests remain. Errors wrap ErrClosed or
// the errno of ibv_modify_srq.
func (srq *SRQ) Arm(limit int) error {
	if err := srq.n.use("SRQ.Arm"); err != nil {
		return err
	}
	defer srq.n.unuse()
	var a C.struct_ibv_srq_attr
	a.srq_limit = C.uint32_t(limit)
	if rc := C.ibv_modify_srq(srq.c, &a, C.IBV_SRQ_LIMIT); rc != 0 {
		return opErr(fmt.Sprintf("ibv_modify_srq limit=%d", limit), int(rc))
	}
	return nil
}

// PostRecv posts receive work requests to the SRQ as one chain. Errors are
// as for QP.PostRecv.
func (srq *SRQ) PostRecv(wrs ...RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if err := srq.n.use("SRQ.PostRecv"); err != nil {
		return err
	}
	defer srq.n.unuse()
	if len(wrs) > srq.maxWR {
		return &PostError{Op: "ibv_post_srq_recv", Index: srq.maxWR,
			Err: fmt.Errorf("%w: chain of %d, SRQ holds %d", ErrQueueFull, len(wrs), srq.maxWR)}
	}
	srq.mu.Lock()
	defer srq.mu.Unlock()
	s, tmp := srq.rq.forChain(len(wrs), false)
	if tmp {
		defer s.free()
	}
	if err := buildRecv(s, wrs, srq.maxSGE); err != nil {
		return err
	}
	var bad C.int
	rc := C.shim_post_srq_recv(handle(srq.c), s.rwr, C.int(len(wrs)), s.sge, C.uintptr_t(uintptr(s.wrs)), &bad)
	if rc != 0 {
		return &PostError{Op: "ibv_post_srq_recv", Index: int(bad), Err: errnoOf(int(rc))}
	}
	return nil
}
