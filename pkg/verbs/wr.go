package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// SGE is a scatter/gather element (struct ibv_sge): Length bytes at virtual
// address Addr inside a memory region whose local key is LKey. Its layout
// matches struct ibv_sge.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

var (
	_ [unsafe.Sizeof(SGE{}) - unsafe.Sizeof(C.struct_ibv_sge{})]struct{}
	_ [unsafe.Sizeof(C.struct_ibv_sge{}) - unsafe.Sizeof(SGE{})]struct{}
)

// Opcode is the operation of a send work request (enum ibv_wr_opcode).
type Opcode uint32

// Send work request opcodes.
const (
	OpWrite     Opcode = 0
	OpWriteImm  Opcode = 1
	OpSend      Opcode = 2
	OpSendImm   Opcode = 3
	OpRead      Opcode = 4
	OpAtomicCAS Opcode = 5
	OpAtomicFAA Opcode = 6
	OpLocalInv  Opcode = 7
	OpBindMW    Opcode = 8
	OpSendInv   Opcode = 9
)

func (o Opcode) String() string {
	n := [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
		"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "LOCAL_INV", "BIND_MW", "SEND_WITH_INV"}
	if int(o) < len(n) {
		return n[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint32(o))
}

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	// SendFence waits for earlier RDMA READs and atomics to complete.
	SendFence SendFlags = 1 << 0
	// SendSignaled asks for a completion (always implied with SignalAll).
	SendSignaled SendFlags = 1 << 1
	// SendSolicited raises a solicited event at the receiver.
	SendSolicited SendFlags = 1 << 2
	// SendInline copies the data into the work request at post time: the
	// SGEs' LKey is then ignored and the buffer may be reused at once.
	SendInline SendFlags = 1 << 3
)

// SendWR is a send work request. Fields that do not apply to Op are
// ignored.
type SendWR struct {
	ID    uint64 // returned in the completion
	Op    Opcode
	Flags SendFlags
	SGL   []SGE // the local data; an atomic needs one 8-byte SGE

	Imm uint32 // OpSendImm, OpWriteImm: host byte order

	RemoteAddr uint64 // RDMA and atomics; atomics need 8-byte alignment
	RKey       uint32 // RDMA and atomics; for OpBindMW the new rkey

	CompareAdd uint64 // OpAtomicCAS: compare value; OpAtomicFAA: addend
	Swap       uint64 // OpAtomicCAS: new value

	AH         *AH    // UD
	RemoteQPN  uint32 // UD
	RemoteQKey uint32 // UD

	InvalidateRKey uint32 // OpLocalInv, OpSendInv

	MW         *MW    // OpBindMW (type 2 window)
	BindMR     *MR    // OpBindMW: the region to expose
	BindAddr   uint64 // OpBindMW: window start (inside BindMR)
	BindLen    uint64 // OpBindMW: window length
	BindAccess Access // OpBindMW: the window's remote access

	type1 bool // a type 1 bind of QP.BindMWs
}

// RecvWR is a receive work request: the buffers an incoming SEND fills.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// postScratch is C memory a QP or SRQ builds its work request chains in, so
// a chain is posted with one cgo call and C never sees Go memory.
type postScratch struct {
	cap    int // chain length the preallocated arrays hold
	maxSGE int
	swr    *C.struct_shim_swr
	rwr    *C.struct_shim_rwr
	sge    *C.struct_ibv_sge
	wrs    unsafe.Pointer // struct ibv_send_wr[] or struct ibv_recv_wr[]
}

const scratchMax = 64

func (s *postScratch) init(maxWR, maxSGE int, send bool) {
	s.cap = min(maxWR, scratchMax)
	s.maxSGE = maxSGE
	s.alloc(s.cap, send)
}

func (s *postScratch) alloc(n int, send bool) {
	if send {
		s.swr = (*C.struct_shim_swr)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.struct_shim_swr{}))))
		s.wrs = C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.struct_ibv_send_wr{})))
	} else {
		s.rwr = (*C.struct_shim_rwr)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.struct_shim_rwr{}))))
		s.wrs = C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.struct_ibv_recv_wr{})))
	}
	s.sge = (*C.struct_ibv_sge)(C.calloc(C.size_t(n*s.maxSGE), C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))))
}

func (s *postScratch) free() {
	C.free(unsafe.Pointer(s.swr))
	C.free(unsafe.Pointer(s.rwr))
	C.free(unsafe.Pointer(s.sge))
	C.free(s.wrs)
	*s = postScratch{}
}

// forChain returns scratch big enough for n work requests: the preallocated
// one, or a temporary one the caller frees.
func (s *postScratch) forChain(n int, send bool) (*postScratch, bool) {
	if n <= s.cap {
		return s, false
	}
	t := &postScratch{cap: n, maxSGE: s.maxSGE}
	t.alloc(n, send)
	return t, true
}

func sumLen(sgl []SGE) (n uint64) {
	for _, s := range sgl {
		n += uint64(s.Length)
	}
	return n
}

// checkSend validates a send work request against the verbs rules.
func checkSend(i int, w *SendWR, typ QPType, c QPCap) error {
	if len(w.SGL) > c.MaxSendSGE {
		return invalid("work request %d: %d SGEs, QP allows %d", i, len(w.SGL), c.MaxSendSGE)
	}
	for j, s := range w.SGL {
		if s.Length == 0 {
			return invalid("work request %d: SGE %d has zero length (post no SGE for a zero-byte message)", i, j)
		}
	}
	if w.Flags&SendInline != 0 && sumLen(w.SGL) > uint64(c.MaxInlineData) {
		return invalid("work request %d: %d bytes inline, QP allows %d", i, sumLen(w.SGL), c.MaxInlineData)
	}
	switch w.Op {
	case OpSend, OpSendImm:
	case OpWrite, OpWriteImm, OpRead:
		if typ == QPTypeUD {
			return invalid("work request %d: %v on a UD QP", i, w.Op)
		}
		if w.Op == OpRead && typ != QPTypeRC {
			return invalid("work request %d: RDMA READ needs an RC QP", i)
		}
	case OpAtomicCAS, OpAtomicFAA:
		if typ != QPTypeRC {
			return invalid("work request %d: atomics need an RC QP", i)
		}
		if len(w.SGL) != 1 || w.SGL[0].Length != 8 {
			return invalid("work request %d: an atomic needs exactly one 8-byte SGE", i)
		}
		if w.RemoteAddr%8 != 0 {
			return invalid("work request %d: atomic remote address %#x is not 8-byte aligned", i, w.RemoteAddr)
		}
		if w.SGL[0].Addr%8 != 0 {
			return invalid("work request %d: atomic local address %#x is not 8-byte aligned", i, w.SGL[0].Addr)
		}
		if w.Flags&SendInline != 0 {
			return invalid("work request %d: atomics cannot be inline", i)
		}
	case OpBindMW:
		if typ == QPTypeUD {
			return invalid("work request %d: BIND_MW on a UD QP", i)
		}
		if w.MW == nil || w.BindMR == nil {
			return invalid("work request %d: BIND_MW needs MW and BindMR", i)
		}
		if w.MW.typ != MWType2 && !w.type1 {
			return invalid("work request %d: BIND_MW posts only bind type 2 windows; use QP.BindMW or QP.BindMWs for type 1", i)
		}
	case OpLocalInv, OpSendInv:
		if typ == QPTypeUD {
			return invalid("work request %d: %v on a UD QP", i, w.Op)
		}
	default:
		return invalid("work request %d: opcode %v", i, w.Op)
	}
	if typ == QPTypeUD && w.AH == nil {
		return invalid("work request %d: a UD send needs an AH", i)
	}
	return nil
}

// PostSend posts the work requests as one chain with one call into the
// provider. Before posting it checks what verbs forbid and fails with
// ErrInvalid (zero-length SGE, misaligned or wrongly sized atomic, too many
// SGEs, inline data beyond MaxInlineData, an opcode the QP type does not
// support), ErrWrongState (the QP is not in RTS, SQD, SQE or ERR),
// ErrQueueFull (the chain is longer than the send queue), or ErrClosed.
// When the provider rejects a request the error is a *PostError whose Index
// is the first request not posted (ENOMEM, a full queue, matches
// ErrQueueFull).
func (qp *QP) PostSend(wrs ...SendWR) error {
	for i := range wrs {
		wrs[i].type1 = false // only BindMWs posts type 1 binds
	}
	return qp.postSend(wrs)
}

// postSend is PostSend; BindMWs marks its requests as type 1 binds.
func (qp *QP) postSend(wrs []SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if err := qp.n.use("QP.PostSend"); err != nil {
		return err
	}
	defer qp.n.unuse()
	if st := qp.postState(QPState.canSend); !st.canSend() {
		return &PostError{Op: "ibv_post_send", Index: 0, Err: fmt.Errorf("%w: %v", ErrWrongState, st)}
	}
	if len(wrs) > qp.cap.MaxSendWR {
		return &PostError{Op: "ibv_post_send", Index: qp.cap.MaxSendWR,
			Err: fmt.Errorf("%w: chain of %d, send queue holds %d", ErrQueueFull, len(wrs), qp.cap.MaxSendWR)}
	}
	// Check each request, and keep the AHs, MWs and MRs it points to in C
	// from being destroyed by a concurrent Close until the provider has
	// read them.
	var h holds
	defer h.release()
	for i := range wrs {
		if err := checkSend(i, &wrs[i], qp.typ, qp.cap); err != nil {
			return err
		}
		if err := h.add(&wrs[i]); err != nil {
			return &PostError{Op: "ibv_post_send", Index: i, Err: err}
		}
	}
	qp.sendMu.Lock()
	defer qp.sendMu.Unlock()
	s, tmp := qp.sq.forChain(len(wrs), true)
	if tmp {
		defer s.free()
	}
	sw := unsafe.Slice(s.swr, len(wrs))
	sges := unsafe.Slice((*SGE)(unsafe.Pointer(s.sge)), len(wrs)*s.maxSGE)
	off := 0
	for i := range wrs {
		off += fillSend(&sw[i], &wrs[i], sges, off)
	}
	var bad C.int
	rc := C.shim_post_send(handle(qp.c), s.swr, C.int(len(wrs)), s.sge, C.uintptr_t(uintptr(s.wrs)), &bad)
	posted := wrs
	if rc != 0 {
		posted = wrs[:max(0, min(int(bad), len(wrs)))]
	}
	for i := range posted { // the binds posted have their new keys
		if posted[i].Op == OpBindMW {
			posted[i].MW.bound(posted[i].RKey, posted[i].BindMR)
		}
	}
	if rc != 0 {
		return &PostError{Op: "ibv_post_send", Index: int(bad), Err: errnoOf(int(rc))}
	}
	return nil
}

// holds is the set of objects a chain's work requests point to in C (an
// AH; a bind's MW and MR), each held once (node.use) while it is posted.
type holds struct {
	fixed [4]*node
	n     int
	more  []*node // beyond fixed (a chain naming many AHs)
}

// add holds what w points to; ErrClosed if one of them is closed.
func (h *holds) add(w *SendWR) error {
	if w.AH != nil {
		if err := h.hold(&w.AH.n); err != nil {
			return err
		}
	}
	if w.Op == OpBindMW {
		if err := h.hold(&w.MW.n); err != nil {
			return err
		}
		return h.hold(&w.BindMR.n)
	}
	return nil
}

func (h *holds) hold(n *node) error {
	for _, m := range h.fixed[:h.n] {
		if m == n {
			return nil
		}
	}
	for _, m := range h.more {
		if m == n {
			return nil
		}
	}
	if err := n.use("QP.PostSend"); err != nil {
		return err
	}
	if h.n < len(h.fixed) {
		h.fixed[h.n] = n
		h.n++
	} else {
		h.more = append(h.more, n)
	}
	return nil
}

func (h *holds) release() {
	for _, n := range h.fixed[:h.n] {
		n.unuse()
	}
	for _, n := range h.more {
		n.unuse()
	}
}

// fillSend writes w into d, its SGEs into sges from index off on, and
// returns how many SGEs it wrote.
func fillSend(d *C.struct_shim_swr, w *SendWR, sges []SGE, off int) int {
	d.wr_id = C.uint64_t(w.ID)
	d.opcode = C.uint32_t(w.Op)
	d.flags = C.uint32_t(w.Flags)
	d.num_sge = C.uint32_t(len(w.SGL))
	d.sge_off = C.uint32_t(off)
	n := copy(sges[off:], w.SGL)
	d.imm = C.uint32_t(w.Imm)
	d.remote_addr = C.uint64_t(w.RemoteAddr)
	d.rkey = C.uint32_t(w.RKey)
	d.compare_add = C.uint64_t(w.CompareAdd)
	d.swap = C.uint64_t(w.Swap)
	d.ah = 0
	if w.AH != nil {
		d.ah = handle(w.AH.c)
		d.remote_qpn = C.uint32_t(w.RemoteQPN)
		d.remote_qkey = C.uint32_t(w.RemoteQKey)
	}
	d.invalidate_rkey = C.uint32_t(w.InvalidateRKey)
	d.mw, d.bind_mr = 0, 0
	if w.Op == OpBindMW {
		d.mw = handle(w.MW.c)
		d.bind_mr = handle(w.BindMR.c)
		d.bind_addr = C.uint64_t(w.BindAddr)
		d.bind_len = C.uint64_t(w.BindLen)
		d.bind_access = C.uint32_t(w.BindAccess)
	}
	return n
}

func buildRecv(s *postScratch, wrs []RecvWR, maxSGE int) error {
	rw := unsafe.Slice(s.rwr, len(wrs))
	sges := unsafe.Slice((*SGE)(unsafe.Pointer(s.sge)), len(wrs)*s.maxSGE)
	off := 0
	for i := range wrs {
		w := &wrs[i]
		if len(w.SGL) > maxSGE {
			return invalid("receive request %d: %d SGEs, queue allows %d", i, len(w.SGL), maxSGE)
		}
		for j, g := range w.SGL {
			if g.Length == 0 {
				return invalid("receive request %d: SGE %d has zero length", i, j)
			}
		}
		rw[i].wr_id = C.uint64_t(w.ID)
		rw[i].num_sge = C.uint32_t(len(w.SGL))
		rw[i].sge_off = C.uint32_t(off)
		off += copy(sges[off:], w.SGL)
	}
	return nil
}

// PostRecv posts receive work requests as one chain. It fails with
// ErrInvalid (a QP attached to an SRQ, zero-length SGE, too many SGEs),
// ErrWrongState (QP in RESET), ErrQueueFull (chain longer than the receive
// queue), ErrClosed, or a *PostError from the provider.
func (qp *QP) PostRecv(wrs ...RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if qp.srq != nil {
		return invalid("QP %d receives from an SRQ; post to the SRQ", qp.qpn)
	}
	if err := qp.n.use("QP.PostRecv"); err != nil {
		return err
	}
	defer qp.n.unuse()
	if st := qp.postState(QPState.canRecv); !st.canRecv() {
		return &PostError{Op: "ibv_post_recv", Err: fmt.Errorf("%w: %v", ErrWrongState, st)}
	}
	if len(wrs) > qp.cap.MaxRecvWR {
		return &PostError{Op: "ibv_post_recv", Index: qp.cap.MaxRecvWR,
			Err: fmt.Errorf("%w: chain of %d, receive queue holds %d", ErrQueueFull, len(wrs), qp.cap.MaxRecvWR)}
	}
	qp.recvMu.Lock()
	defer qp.recvMu.Unlock()
	s, tmp := qp.rq.forChain(len(wrs), false)
	if tmp {
		defer s.free()
	}
	if err := buildRecv(s, wrs, qp.cap.MaxRecvSGE); err != nil {
		return err
	}
	var bad C.int
	rc := C.shim_post_recv(handle(qp.c), s.rwr, C.int(len(wrs)), s.sge, C.uintptr_t(uintptr(s.wrs)), &bad)
	if rc != 0 {
		return &PostError{Op: "ibv_post_recv", Index: int(bad), Err: errnoOf(int(rc))}
	}
	return nil
}

// BindMW binds a type 1 memory window to length bytes at addr of mr with
// the given remote access, through the QP's send queue (ibv_bind_mw). It
// returns the window's new rkey; the bind completes with a WCBindMW
// completion when signaled. Errors wrap ErrInvalid (type 2 window), ErrClosed
// or the errno of ibv_bind_mw.
func (qp *QP) BindMW(mw *MW, mr *MR, addr, length uint64, access Access, id uint64, flags SendFlags) (uint32, error) {
	if mw.typ != MWType1 {
		return 0, invalid("QP.BindMW binds type 1 windows; post OpBindMW for type 2")
	}
	return qp.bindMW(mw, mr, addr, length, access, id, flags)
}

// UnbindMW unbinds a type 1 memory window through the QP's send queue
// (ibv_bind_mw with length 0, over the region of the window's last bind,
// which rdma-core's rxe provider requires): once it completes, every
// remote access with the window's old rkey fails at the requester with
// WCRemAccessErr. It returns the window's rkey (it names no memory now).
// Errors wrap ErrInvalid (type 2 window, or never bound), ErrClosed (the
// QP, the window or that region closed) or the errno of ibv_bind_mw.
func (qp *QP) UnbindMW(mw *MW, id uint64, flags SendFlags) (uint32, error) {
	if mw.typ != MWType1 {
		return 0, invalid("QP.UnbindMW unbinds type 1 windows; post OpLocalInv for type 2")
	}
	mr := mw.mr.Load()
	if mr == nil {
		return 0, invalid("QP.UnbindMW: the window was never bound")
	}
	return qp.bindMW(mw, mr, 0, 0, 0, id, flags)
}

// MWBind is one bind of a type 1 memory window in QP.BindMWs: Length
// bytes at Addr of MR with Access, or, with Length 0, an unbind (MR nil:
// the region of the window's last bind). RKey is set to the window's new
// rkey when the bind is posted.
type MWBind struct {
	MW     *MW
	MR     *MR
	Addr   uint64
	Length uint64
	Access Access
	ID     uint64
	Flags  SendFlags
	RKey   uint32
}

// BindMWs posts binds and unbinds of type 1 memory windows as one chain of
// BIND_MW work requests: one call into the provider, and on SoftRoCE one
// system call, where QP.BindMW makes one each. Each completes as a
// QP.BindMW would. Verbs leave the posting of type 1 binds as work requests
// to the provider: BindMWs works where ibv_bind_mw is itself such a post
// (rdma_rxe) and fails with an error wrapping ErrNotSupported elsewhere
// (Context.ChainsType1Binds; bind one by one there). Other errors: ErrInvalid
// (a type 2 window, a window twice in the chain, an unbind of a window
// never bound), ErrClosed, or a *PostError whose Index is the first bind
// not posted (the binds before it were posted and have their new keys).
// As with ibv_bind_mw, a bind that completes in error leaves MW.RKey at
// the key it would have had: the caller must not reuse that window.
func (qp *QP) BindMWs(binds []MWBind) error {
	if len(binds) == 0 {
		return nil
	}
	if !qp.pd.ctx.ChainsType1Binds() {
		return fmt.Errorf("%w: chained type 1 binds on device %s", ErrNotSupported, qp.pd.ctx.Name())
	}
	wrs := make([]SendWR, len(binds))
	for i := range binds {
		b := &binds[i]
		if b.MW == nil || b.MW.typ != MWType1 {
			return invalid("bind %d: QP.BindMWs binds type 1 windows", i)
		}
		for j := range binds[:i] {
			if binds[j].MW == b.MW {
				return invalid("bind %d: the window of bind %d again (its key would be stale)", i, j)
			}
		}
		mr := b.MR
		if mr == nil && b.Length == 0 {
			mr = b.MW.mr.Load()
		}
		if mr == nil {
			return invalid("bind %d: no region (an unbind of a window never bound)", i)
		}
		wrs[i] = SendWR{ID: b.ID, Op: OpBindMW, Flags: b.Flags, RKey: IncRKey(b.MW.RKey()), MW: b.MW,
			BindMR: mr, BindLen: b.Length, type1: true}
		if b.Length > 0 { // an unbind names no range and grants nothing
			wrs[i].BindAddr, wrs[i].BindAccess = b.Addr, b.Access
		}
	}
	err := qp.postSend(wrs)
	n := len(wrs)
	var pe *PostError
	if errors.As(err, &pe) {
		n = max(0, min(pe.Index, n))
	} else if err != nil {
		n = 0
	}
	for i := range binds[:n] {
		binds[i].RKey = wrs[i].RKey
	}
	return err
}

// bindMW posts ibv_bind_mw for a type 1 window (length 0: an unbind).
func (qp *QP) bindMW(mw *MW, mr *MR, addr, length uint64, access Access, id uint64, flags SendFlags) (uint32, error) {
	for _, n := range []*node{&qp.n, &mw.n, &mr.n} {
		if err := n.use("QP.BindMW"); err != nil {
			return 0, err
		}
		defer n.unuse()
	}
	qp.sendMu.Lock()
	defer qp.sendMu.Unlock()
	var rkey C.uint32_t
	if rc := C.shim_bind_mw(qp.c, mw.c, mr.c, C.uint64_t(id), C.uint32_t(flags), C.uint64_t(addr),
		C.uint64_t(length), C.uint32_t(access), &rkey); rc != 0 {
		return 0, &OpError{Op: "ibv_bind_mw", Err: errnoOf(int(rc))}
	}
	mw.rkey.Store(uint32(rkey))
	mw.mr.Store(mr)
	return uint32(rkey), nil
}
