package verbs

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// PD is a protection domain (struct ibv_pd). It is the parent of the memory
// regions, memory windows, address handles, shared receive queues and queue
// pairs created from it: Close closes them first.
type PD struct {
	n   node
	c   *C.struct_ibv_pd
	ctx *Context
}

// AllocPD allocates a protection domain. Errors wrap ErrClosed or the errno
// of ibv_alloc_pd.
func (c *Context) AllocPD() (*PD, error) {
	if err := c.n.use("Context.AllocPD"); err != nil {
		return nil, err
	}
	defer c.n.unuse()
	p, errno := C.ibv_alloc_pd(c.c)
	if p == nil {
		return nil, &OpError{Op: "ibv_alloc_pd", Err: errnoOr(errno)}
	}
	pd := &PD{c: p, ctx: c}
	pd.n.init("protection domain", func() error {
		if rc := C.ibv_dealloc_pd(p); rc != 0 {
			return opErr("ibv_dealloc_pd", int(rc))
		}
		return nil
	})
	if err := pd.n.attach(&c.n); err != nil {
		pd.n.close()
		return nil, err
	}
	return pd, nil
}

// Close closes the PD's children and deallocates it. It is idempotent.
func (pd *PD) Close() error { return pd.n.close() }

// Context returns the device context the PD belongs to.
func (pd *PD) Context() *Context { return pd.ctx }

// CPtr returns the underlying struct ibv_pd pointer (valid until Close).
func (pd *PD) CPtr() unsafe.Pointer { return unsafe.Pointer(pd.c) }
