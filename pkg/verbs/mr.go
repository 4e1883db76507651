package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Access is a set of memory access flags (enum ibv_access_flags).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
	AccessMWBind       Access = 1 << 4
	AccessZeroBased    Access = 1 << 5
	AccessOnDemand     Access = 1 << 6
	AccessRelaxedOrder Access = 1 << 20

	// AccessAll is local write plus remote read, write and atomic.
	AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

func (a Access) String() string {
	names := []struct {
		f Access
		s string
	}{{AccessLocalWrite, "LOCAL_WRITE"}, {AccessRemoteWrite, "REMOTE_WRITE"}, {AccessRemoteRead, "REMOTE_READ"},
		{AccessRemoteAtomic, "REMOTE_ATOMIC"}, {AccessMWBind, "MW_BIND"}, {AccessZeroBased, "ZERO_BASED"},
		{AccessOnDemand, "ON_DEMAND"}, {AccessRelaxedOrder, "RELAXED_ORDERING"}}
	s := ""
	for _, n := range names {
		if a&n.f != 0 {
			if s != "" {
				s += "|"
			}
			s += n.s
			a &^= n.f
		}
	}
	if a != 0 || s == "" {
		if s != "" {
			s += "|"
		}
		s += fmt.Sprintf("%#x", uint32(a))
	}
	return s
}

// checkAccess enforces the verbs rule that remote write and remote atomic
// need local write.
func checkAccess(a Access) error {
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return invalid("access %v: remote write or atomic needs LOCAL_WRITE", a)
	}
	return nil
}

// MR is a registered memory region (struct ibv_mr). It is a child of its PD
// and of the Buffer it covers.
type MR struct {
	n      node
	c      *C.struct_ibv_mr
	pd     *PD
	mem    []byte
	owned  *Buffer // buffer allocated by AllocMR, closed with the MR
	access Access
	lkey   uint32
	rkey   uint32
}

// RegMR registers mem, which must lie inside a Buffer from Alloc (Go heap
// memory is refused: C must never keep a Go pointer). Errors wrap
// ErrInvalid (empty or Go-heap memory, bad access flags), ErrNotSupported
// (AccessOnDemand on a device without ODP, such as rxe), ErrClosed, or
// the errno of ibv_reg_mr.
func (pd *PD) RegMR(mem []byte, access Access) (*MR, error) {
	if len(mem) == 0 {
		return nil, invalid("zero-length memory region")
	}
	buf := bufferOf(mem)
	if buf == nil {
		return nil, invalid("memory at %#x is not inside a verbs.Buffer", addrOf(mem))
	}
	return pd.regMR(buf, mem, access, nil)
}

// AllocMR allocates a Buffer of size bytes and registers it; the buffer is
// unmapped when the MR is closed. Errors are those of Alloc and RegMR.
func (pd *PD) AllocMR(size int, access Access) (*MR, error) {
	buf, err := Alloc(size)
	if err != nil {
		return nil, err
	}
	mr, err := pd.regMR(buf, buf.Bytes(), access, buf)
	if err != nil {
		buf.Close()
		return nil, err
	}
	return mr, nil
}

func (pd *PD) regMR(buf *Buffer, mem []byte, access Access, owned *Buffer) (*MR, error) {
	if err := checkAccess(access); err != nil {
		return nil, err
	}
	if access&AccessOnDemand != 0 {
		if attr, err := pd.ctx.QueryDevice(); err == nil && !attr.HasODP() {
			return nil, fmt.Errorf("%w: on-demand paging (device %s reports no ODP)", ErrNotSupported, pd.ctx.name)
		}
	}
	if err := buf.n.use("PD.RegMR"); err != nil {
		return nil, err
	}
	defer buf.n.unuse()
	if err := pd.n.use("PD.RegMR"); err != nil {
		return nil, err
	}
	defer pd.n.unuse()
	m, errno := C.ibv_reg_mr(pd.c, unsafe.Pointer(unsafe.SliceData(mem)), C.size_t(len(mem)), C.int(access))
	if m == nil {
		err := &OpError{Op: "ibv_reg_mr", Err: errnoOr(errno)}
		if access&AccessOnDemand != 0 && (errors.Is(errno, syscall.EINVAL) || errors.Is(errno, syscall.EOPNOTSUPP)) {
			return nil, fmt.Errorf("%w: on-demand paging: %w", ErrNotSupported, err)
		}
		return nil, err
	}
	mr := &MR{c: m, pd: pd, mem: mem, owned: owned, access: access, lkey: uint32(m.lkey), rkey: uint32(m.rkey)}
	mr.n.init("memory region", func() error {
		if rc := C.ibv_dereg_mr(m); rc != 0 {
			return opErr("ibv_dereg_mr", int(rc))
		}
		if owned != nil {
			return owned.n.close()
		}
		return nil
	})
	parents := []*node{&pd.n, &buf.n}
	if owned != nil {
		parents = parents[:1] // the MR owns its buffer instead
	}
	if err := mr.n.attach(parents...); err != nil {
		mr.n.close()
		return nil, err
	}
	return mr, nil
}

// Close deregisters the region (and unmaps its buffer if AllocMR made it).
// It is idempotent.
func (mr *MR) Close() error { return mr.n.close() }

// Bytes returns the registered memory.
func (mr *MR) Bytes() []byte { return mr.mem }

// Addr returns the virtual address of the region's first byte.
func (mr *MR) Addr() uint64 { return addrOf(mr.mem) }

// Len returns the region's length in bytes.
func (mr *MR) Len() int { return len(mr.mem) }

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey returns the remote key.
func (mr *MR) RKey() uint32 { return mr.rkey }

// Access returns the access flags the region was registered with.
func (mr *MR) Access() Access { return mr.access }

// PD returns the protection domain.
func (mr *MR) PD() *PD { return mr.pd }

// SGE returns a scatter/gather element for length bytes at offset off of the
// region. It panics when the range is outside the region, like slicing.
func (mr *MR) SGE(off, length int) SGE {
	_ = mr.mem[off : off+length]
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(length), LKey: mr.lkey}
}

// Remote describes a remote memory range: what a peer needs to RDMA
// read, write or run atomics on it.
type Remote struct {
	Addr uint64
	RKey uint32
	Len  uint32
}

// Remote returns the description of the whole region for a peer.
func (mr *MR) Remote() Remote {
	return Remote{Addr: mr.Addr(), RKey: mr.rkey, Len: uint32(len(mr.mem))}
}

// MWType is a memory window type.
type MWType int

// Memory window types.
const (
	MWType1 MWType = 1
	MWType2 MWType = 2
)

// MW is a memory window (struct ibv_mw), a child of its PD. Type 1 windows
// are bound with QP.BindMW, type 2 windows with a SendWR of kind OpBindMW
// and invalidated with OpLocalInv (or a remote SEND_WITH_INV).
type MW struct {
	n    node
	c    *C.struct_ibv_mw
	pd   *PD
	typ  MWType
	rkey atomic.Uint32
	// mr is the region of the last type 1 bind (QP.BindMW): rdma-core's
	// rxe provider needs one for an unbind too (QP.UnbindMW).
	mr atomic.Pointer[MR]
}

// AllocMW allocates a memory window. Errors wrap ErrNotSupported when the
// device has no memory windows, ErrClosed, or the errno of ibv_alloc_mw.
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if typ != MWType1 && typ != MWType2 {
		return nil, invalid("memory window type %d", typ)
	}
	if err := pd.n.use("PD.AllocMW"); err != nil {
		return nil, err
	}
	defer pd.n.unuse()
	m, errno := C.shim_alloc_mw(pd.c, C.int(typ))
	if m == nil {
		err := &OpError{Op: "ibv_alloc_mw", Err: errnoOr(errno)}
		if errors.Is(errno, syscall.EOPNOTSUPP) || errors.Is(errno, syscall.ENOSYS) {
			return nil, fmt.Errorf("%w: memory windows: %w", ErrNotSupported, err)
		}
		return nil, err
	}
	mw := &MW{c: m, pd: pd, typ: typ}
	mw.rkey.Store(uint32(m.rkey))
	mw.n.init("memory window", func() error {
		if rc := C.shim_dealloc_mw(m); rc != 0 {
			return opErr("ibv_dealloc_mw", int(rc))
		}
		return nil
	})
	if err := mw.n.attach(&pd.n); err != nil {
		mw.n.close()
		return nil, err
	}
	return mw, nil
}

// bound records a posted bind's new key and region. For a type 1 window
// it also sets the key in struct ibv_mw, as ibv_bind_mw does: the
// provider reads it as the window's current key in the next bind.
func (mw *MW) bound(rkey uint32, mr *MR) {
	mw.rkey.Store(rkey)
	if mw.typ == MWType1 {
		mw.c.rkey = C.uint32_t(rkey)
		mw.mr.Store(mr)
	}
}

// Close deallocates the window. It is idempotent.
func (mw *MW) Close() error { return mw.n.close() }

// RKey returns the window's current rkey: the one from the last successful
// QP.BindMW for type 1, the one given to the last posted OpBindMW for type 2.
func (mw *MW) RKey() uint32 { return mw.rkey.Load() }

// NextRKey returns the rkey to use for the next type 2 bind: the current one
// with its low 8 bits (the key part) incremented, as ibv_inc_rkey does.
func (mw *MW) NextRKey() uint32 { return IncRKey(mw.RKey()) }

// IncRKey increments the key byte of an rkey (ibv_inc_rkey).
func IncRKey(rkey uint32) uint32 { return rkey&0xffffff00 | (rkey+1)&0xff }

// Type returns the window's type.
func (mw *MW) Type() MWType { return mw.typ }

func errnoOr(err error) error {
	if err == nil {
		return syscall.EIO
	}
	return err
}
