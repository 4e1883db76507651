package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"
)

// QPType is a queue pair transport type.
type QPType int

// Queue pair types.
const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", int(t))
}

// QPState is a queue pair state (enum ibv_qp_state).
type QPState int

// Queue pair states.
const (
	QPStateReset QPState = 0
	QPStateInit  QPState = 1
	QPStateRTR   QPState = 2
	QPStateRTS   QPState = 3
	QPStateSQD   QPState = 4
	QPStateSQE   QPState = 5
	QPStateError QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPStateReset:
		return "RESET"
	case QPStateInit:
		return "INIT"
	case QPStateRTR:
		return "RTR"
	case QPStateRTS:
		return "RTS"
	case QPStateSQD:
		return "SQD"
	case QPStateSQE:
		return "SQE"
	case QPStateError:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", int(s))
}

// canSend reports whether verbs accept send work requests in state s.
func (s QPState) canSend() bool {
	return s == QPStateRTS || s == QPStateSQD || s == QPStateSQE || s == QPStateError
}

// canRecv reports whether verbs accept receive work requests in state s.
func (s QPState) canRecv() bool { return s != QPStateReset }

// QPCap sizes a queue pair's work queues.
type QPCap struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// QPInitAttr describes a queue pair to create.
type QPInitAttr struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ // receives come from this SRQ instead of the QP's own queue
	Cap    QPCap
	// SignalAll makes every send work request generate a completion.
	SignalAll bool
}

// QP is a queue pair (struct ibv_qp). It is a child of its PD, of its CQs
// and of its SRQ: closing any of them closes the QP first.
type QP struct {
	n     node
	c     *C.struct_ibv_qp
	pd    *PD
	typ   QPType
	cap   QPCap
	qpn   uint32
	state atomic.Int32
	cm    bool // created by rdma_create_qp: destroyed with rdma_destroy_qp
	srq   *SRQ
	scq   *CQ
	rcq   *CQ

	sendMu sync.Mutex
	sq     postScratch
	recvMu sync.Mutex
	rq     postScratch
}

// NewQP creates a queue pair in the RESET state. Errors wrap ErrInvalid
// (missing CQ, zero-sized queues, objects of another device), ErrClosed,
// or the errno of ibv_create_qp (EINVAL or ENOMEM when the capabilities
// exceed the device's limits).
func (pd *PD) NewQP(attr *QPInitAttr) (*QP, error) {
	return pd.newQP(attr, nil)
}

func (pd *PD) newQP(attr *QPInitAttr, cmid *CMID) (*QP, error) {
	if attr == nil || attr.SendCQ == nil || attr.RecvCQ == nil {
		return nil, invalid("QP needs a send CQ and a receive CQ")
	}
	if attr.Type != QPTypeRC && attr.Type != QPTypeUC && attr.Type != QPTypeUD {
		return nil, invalid("QP type %v", attr.Type)
	}
	c := attr.Cap
	if c.MaxSendWR < 1 || (attr.SRQ == nil && c.MaxRecvWR < 1) {
		return nil, invalid("QP queue sizes send=%d recv=%d", c.MaxSendWR, c.MaxRecvWR)
	}
	if c.MaxSendSGE < 1 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE < 1 {
		c.MaxRecvSGE = 1
	}
	for _, q := range []*CQ{attr.SendCQ, attr.RecvCQ} {
		if q.ctx != pd.ctx {
			return nil, invalid("CQ of another device")
		}
	}
	users := []*node{&pd.n, &attr.SendCQ.n, &attr.RecvCQ.n}
	if attr.SRQ != nil {
		users = append(users, &attr.SRQ.n)
	}
	for i, u := range users {
		if err := u.use("PD.NewQP"); err != nil {
			for _, v := range users[:i] {
				v.unuse()
			}
			return nil, err
		}
	}
	defer func() {
		for _, u := range users {
			u.unuse()
		}
	}()
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq = attr.SendCQ.c
	ia.recv_cq = attr.RecvCQ.c
	if attr.SRQ != nil {
		ia.srq = attr.SRQ.c
	}
	ia.qp_type = uint32(attr.Type)
	ia.cap.max_send_wr = C.uint32_t(c.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(c.MaxSendSGE)
	ia.cap.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(c.MaxInlineData)
	if attr.SignalAll {
		ia.sq_sig_all = 1
	}
	var q *C.struct_ibv_qp
	if cmid != nil {
		if rc := C.rdma_create_qp(cmid.c, pd.c, &ia); rc != 0 {
			return nil, opErr("rdma_create_qp", int(C.shim_errno()))
		}
		q = cmid.c.qp
	} else {
		var errno error
		q, errno = C.ibv_create_qp(pd.c, &ia)
		if q == nil {
			return nil, &OpError{Op: "ibv_create_qp", Err: errnoOr(errno)}
		}
	}
	qp := &QP{c: q, pd: pd, typ: attr.Type, qpn: uint32(q.qp_num), cm: cmid != nil, srq: attr.SRQ,
		scq: attr.SendCQ, rcq: attr.RecvCQ,
		cap: QPCap{MaxSendWR: int(ia.cap.max_send_wr), MaxRecvWR: int(ia.cap.max_recv_wr),
			MaxSendSGE: int(ia.cap.max_send_sge), MaxRecvSGE: int(ia.cap.max_recv_sge),
			MaxInlineData: int(ia.cap.max_inline_data)}}
	if cmid != nil {
		// rdma_create_qp moves the QP to INIT (RC) or RTS (UD).
		qp.refreshState()
	}
	qp.sq.init(qp.cap.MaxSendWR, qp.cap.MaxSendSGE, true)
	qp.rq.init(qp.cap.MaxRecvWR, qp.cap.MaxRecvSGE, false)
	ctx := pd.ctx
	key := uintptr(unsafe.Pointer(q))
	qp.n.init("queue pair", func() error {
		qp.state.Store(int32(QPStateError))
		ctx.regMu.Lock()
		delete(ctx.qps, key)
		ctx.regMu.Unlock()
		var rc C.int
		if qp.cm {
			C.rdma_destroy_qp(cmid.c)
		} else {
			rc = C.ibv_destroy_qp(q)
		}
		qp.sq.free()
		qp.rq.free()
		if rc != 0 {
			return opErr("ibv_destroy_qp", int(rc))
		}
		return nil
	})
	parents := []*node{&pd.n, &attr.SendCQ.n}
	if attr.RecvCQ != attr.SendCQ {
		parents = append(parents, &attr.RecvCQ.n)
	}
	if attr.SRQ != nil {
		parents = append(parents, &attr.SRQ.n)
	}
	if cmid != nil {
		parents = append(parents, &cmid.n)
	}
	ctx.regMu.Lock()
	ctx.qps[key] = qp
	ctx.regMu.Unlock()
	if err := qp.n.attach(parents...); err != nil {
		qp.n.close()
		return nil, err
	}
	return qp, nil
}

// Close destroys the queue pair. Outstanding work requests are discarded
// without completions. It is idempotent.
func (qp *QP) Close() error { return qp.n.close() }

// QPN returns the queue pair number.
func (qp *QP) QPN() uint32 { return qp.qpn }

// Type returns the transport type.
func (qp *QP) Type() QPType { return qp.typ }

// Cap returns the capabilities the device granted (at least those asked for).
func (qp *QP) Cap() QPCap { return qp.cap }

// PD returns the QP's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// CPtr returns the underlying struct ibv_qp pointer (valid until Close).
func (qp *QP) CPtr() unsafe.Pointer { return unsafe.Pointer(qp.c) }

// State returns the state the QP was last moved to by this package. A QP
// can also enter the error state by itself; Query reports the device's view.
//
// After Close it returns QPStateError: the QP is gone, and nothing posted
// on it completes.
func (qp *QP) State() QPState { return QPState(qp.state.Load()) }

// AHAttr is an address vector: where a QP (RC) or a UD send goes.
type AHAttr struct {
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	Port        int  // local port, 1-based
	IsGlobal    bool // a GRH is needed; always true on RoCE
	DGID        GID
	FlowLabel   uint32
	SGIDIndex   int // local GID index: 1 is the RoCE v2 IPv4 GID on rxe
	HopLimit    uint8
	TClass      uint8
}

func (a *AHAttr) toC(o *C.struct_ibv_ah_attr) {
	o.dlid = C.uint16_t(a.DLID)
	o.sl = C.uint8_t(a.SL)
	o.src_path_bits = C.uint8_t(a.SrcPathBits)
	o.static_rate = C.uint8_t(a.StaticRate)
	o.port_num = C.uint8_t(a.Port)
	if a.IsGlobal {
		o.is_global = 1
		copy((*[16]byte)(unsafe.Pointer(&o.grh.dgid))[:], a.DGID[:])
		o.grh.flow_label = C.uint32_t(a.FlowLabel)
		o.grh.sgid_index = C.uint8_t(a.SGIDIndex)
		hl := a.HopLimit
		if hl == 0 {
			hl = 64
		}
		o.grh.hop_limit = C.uint8_t(hl)
		o.grh.traffic_class = C.uint8_t(a.TClass)
	}
}

// InitAttr moves a QP from RESET to INIT.
type InitAttr struct {
	Port      int // 1-based; 0 means 1
	PKeyIndex int
	Access    Access // remote access allowed on the QP (RC, UC)
	QKey      uint32 // UD only
}

// RTRAttr moves a connected QP from INIT to RTR. A UD QP needs none of it.
type RTRAttr struct {
	PathMTU         MTU // 0 means MTU1024
	DestQPN         uint32
	RQPSN           uint32
	MaxDestRdAtomic int // incoming RDMA READ/atomic depth; 0 means 1
	MinRNRTimer     int // encoded as in verbs; 0 means 12 (0.64 ms)
	AH              AHAttr
}

// RTSAttr moves a QP from RTR to RTS.
type RTSAttr struct {
	SQPSN       uint32
	Timeout     int // local ACK timeout, 4.096 µs * 2^Timeout; 0 means 14
	RetryCount  int // 0..7; -1 means 0, 0 means 7 (rxe then resends forever: see DefaultRetryCount)
	RNRRetry    int // 0..7 (7 = infinite); -1 means 0, 0 means 7
	MaxRdAtomic int // outgoing RDMA READ/atomic depth; 0 means 1
}

// Modify masks (enum ibv_qp_attr_mask), for RawModify.
const (
	QPAttrState           = 1 << 0
	QPAttrAccessFlags     = 1 << 3
	QPAttrPKeyIndex       = 1 << 4
	QPAttrPort            = 1 << 5
	QPAttrQKey            = 1 << 6
	QPAttrAV              = 1 << 7
	QPAttrPathMTU         = 1 << 8
	QPAttrTimeout         = 1 << 9
	QPAttrRetryCnt        = 1 << 10
	QPAttrRNRRetry        = 1 << 11
	QPAttrRQPSN           = 1 << 12
	QPAttrMaxQPRdAtomic   = 1 << 13
	QPAttrMinRNRTimer     = 1 << 15
	QPAttrSQPSN           = 1 << 16
	QPAttrMaxDestRdAtomic = 1 << 17
	QPAttrDestQPN         = 1 << 20
)

func (qp *QP) modify(to QPState, a *C.struct_ibv_qp_attr, mask C.int) error {
	if err := qp.n.use("ibv_modify_qp"); err != nil {
		return err
	}
	defer qp.n.unuse()
	a.qp_state = uint32(to)
	if rc := C.ibv_modify_qp(qp.c, a, mask|QPAttrState); rc != 0 {
		return &OpError{Op: fmt.Sprintf("ibv_modify_qp %v->%v", qp.State(), to), Err: errnoOr(errnoOf(int(rc)))}
	}
	qp.state.Store(int32(to))
	return nil
}

// ToInit moves the QP from RESET to INIT; a nil a means port 1, P_Key
// index 0, no remote access (RC, UC) or Q_Key 0 (UD). Errors wrap
// ErrInvalid (access flags), ErrClosed or the errno of ibv_modify_qp
// (EINVAL from the wrong state or a bad port).
func (qp *QP) ToInit(a *InitAttr) error {
	if a == nil {
		a = &InitAttr{}
	}
	var ca C.struct_ibv_qp_attr
	port := a.Port
	if port == 0 {
		port = 1
	}
	ca.port_num = C.uint8_t(port)
	ca.pkey_index = C.uint16_t(a.PKeyIndex)
	mask := C.int(QPAttrPKeyIndex | QPAttrPort)
	if qp.typ == QPTypeUD {
		ca.qkey = C.uint32_t(a.QKey)
		mask |= QPAttrQKey
	} else {
		if err := checkAccess(a.Access); err != nil {
			return err
		}
		ca.qp_access_flags = C.uint(a.Access)
		mask |= QPAttrAccessFlags
	}
	return qp.modify(QPStateInit, &ca, mask)
}

// ToRTR moves the QP from INIT to RTR. For RC and UC it sets the remote
// QP, the path and the receive PSN (a is required); for UD only the state
// changes (a may be nil). Errors wrap ErrInvalid (no a for RC or UC),
// ErrClosed or the errno of ibv_modify_qp.
func (qp *QP) ToRTR(a *RTRAttr) error {
	if a == nil {
		if qp.typ != QPTypeUD {
			return invalid("ToRTR of a %v QP needs the remote QP (RTRAttr)", qp.typ)
		}
		a = &RTRAttr{}
	}
	var ca C.struct_ibv_qp_attr
	mask := C.int(0)
	if qp.typ != QPTypeUD {
		mtu := a.PathMTU
		if mtu == 0 {
			mtu = MTU1024
		}
		ca.path_mtu = uint32(mtu)
		ca.dest_qp_num = C.uint32_t(a.DestQPN)
		ca.rq_psn = C.uint32_t(a.RQPSN & 0xffffff)
		a.AH.toC(&ca.ah_attr)
		if a.AH.Port == 0 {
			ca.ah_attr.port_num = 1
		}
		mask |= QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN
		if qp.typ == QPTypeRC {
			rd := a.MaxDestRdAtomic
			if rd == 0 {
				rd = 1
			}
			rnr := a.MinRNRTimer
			if rnr == 0 {
				rnr = 12
			}
			ca.max_dest_rd_atomic = C.uint8_t(rd)
			ca.min_rnr_timer = C.uint8_t(rnr)
			mask |= QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer
		}
	}
	return qp.modify(QPStateRTR, &ca, mask)
}

// ToRTS moves the QP from RTR to RTS, after which sends may be posted; a
// nil a means send PSN 0 and the defaults RTSAttr gives its zero fields.
// Errors wrap ErrClosed or the errno of ibv_modify_qp.
func (qp *QP) ToRTS(a *RTSAttr) error {
	if a == nil {
		a = &RTSAttr{}
	}
	var ca C.struct_ibv_qp_attr
	ca.sq_psn = C.uint32_t(a.SQPSN & 0xffffff)
	mask := C.int(QPAttrSQPSN)
	if qp.typ == QPTypeRC {
		t, r, rnr, rd := a.Timeout, a.RetryCount, a.RNRRetry, a.MaxRdAtomic
		if t == 0 {
			t = 14
		}
		r = defaulted(r, 7)
		rnr = defaulted(rnr, 7)
		if rd == 0 {
			rd = 1
		}
		ca.timeout = C.uint8_t(t)
		ca.retry_cnt = C.uint8_t(r)
		ca.rnr_retry = C.uint8_t(rnr)
		ca.max_rd_atomic = C.uint8_t(rd)
		mask |= QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrMaxQPRdAtomic
	}
	return qp.modify(QPStateRTS, &ca, mask)
}

func defaulted(v, def int) int {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

// ToError moves the QP to the error state: outstanding and later work
// requests complete with WCWRFlushErr.
func (qp *QP) ToError() error {
	var ca C.struct_ibv_qp_attr
	return qp.modify(QPStateError, &ca, 0)
}

// Reset moves the QP to RESET from any state, discarding its work queues.
func (qp *QP) Reset() error {
	var ca C.struct_ibv_qp_attr
	return qp.modify(QPStateReset, &ca, 0)
}

// queryMask asks ibv_query_qp for every attribute QPAttr reports (rxe
// refuses unknown bits with EOPNOTSUPP).
const queryMask = QPAttrState | QPAttrAccessFlags | QPAttrPKeyIndex | QPAttrPort | QPAttrQKey |
	QPAttrAV | QPAttrPathMTU | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrRQPSN |
	QPAttrMaxQPRdAtomic | QPAttrMinRNRTimer | QPAttrSQPSN | QPAttrMaxDestRdAtomic | QPAttrDestQPN |
	1<<19 // IBV_QP_CAP

// QPAttr is what Query reports about a QP.
type QPAttr struct {
	State       QPState
	PathMTU     MTU
	QKey        uint32
	RQPSN       uint32
	SQPSN       uint32
	DestQPN     uint32
	Access      Access
	Port        int
	Timeout     int
	RetryCount  int
	RNRRetry    int
	MaxRdAtomic int
	Cap         QPCap
}

// Query asks the device for the QP's current attributes, and refreshes the
// state State reports. Errors wrap ErrClosed or the errno of ibv_query_qp.
func (qp *QP) Query() (*QPAttr, error) {
	if err := qp.n.use("QP.Query"); err != nil {
		return nil, err
	}
	defer qp.n.unuse()
	var a C.struct_ibv_qp_attr
	var ia C.struct_ibv_qp_init_attr
	if rc := C.ibv_query_qp(qp.c, &a, queryMask, &ia); rc != 0 {
		return nil, opErr("ibv_query_qp", int(rc))
	}
	qp.state.Store(int32(a.qp_state))
	return &QPAttr{State: QPState(a.qp_state), PathMTU: MTU(a.path_mtu), QKey: uint32(a.qkey),
		RQPSN: uint32(a.rq_psn), SQPSN: uint32(a.sq_psn), DestQPN: uint32(a.dest_qp_num),
		Access: Access(a.qp_access_flags), Port: int(a.port_num), Timeout: int(a.timeout),
		RetryCount: int(a.retry_cnt), RNRRetry: int(a.rnr_retry), MaxRdAtomic: int(a.max_rd_atomic),
		Cap: QPCap{MaxSendWR: int(a.cap.max_send_wr), MaxRecvWR: int(a.cap.max_recv_wr),
			MaxSendSGE: int(a.cap.max_send_sge), MaxRecvSGE: int(a.cap.max_recv_sge),
			MaxInlineData: int(a.cap.max_inline_data)}}, nil
}

// postState returns the QP's state for a post: the cached one when it
// allows the post, else the device's. The cache can be behind: rdma_cm
// moves a CMID's QP to RTR and RTS inside rdma_accept and when the
// connection response arrives, before the events that refresh it, and a
// peer's requests can be served (and answered) in between.
func (qp *QP) postState(allows func(QPState) bool) QPState {
	if st := qp.State(); allows(st) {
		return st
	}
	qp.refreshState()
	return qp.State()
}

func (qp *QP) refreshState() {
	if qp.n.use("QP.refreshState") != nil {
		return
	}
	defer qp.n.unuse()
	var a C.struct_ibv_qp_attr
	var ia C.struct_ibv_qp_init_attr
	if C.ibv_query_qp(qp.c, &a, QPAttrState, &ia) == 0 {
		qp.state.Store(int32(a.qp_state))
	}
}

// QPInfo is what a peer needs to connect to a QP: exchange it out of band
// (a TCP socket, a file) and pass it to Connect.
type QPInfo struct {
	QPN uint32
	PSN uint32
	LID uint16
	GID GID
}

// QPInfoSize is the length of QPInfo's binary encoding.
const QPInfoSize = 4 + 4 + 2 + 16

// MarshalBinary encodes the info in QPInfoSize bytes (big endian).
func (i QPInfo) MarshalBinary() ([]byte, error) {
	b := make([]byte, QPInfoSize)
	binary.BigEndian.PutUint32(b[0:], i.QPN)
	binary.BigEndian.PutUint32(b[4:], i.PSN)
	binary.BigEndian.PutUint16(b[8:], i.LID)
	copy(b[10:], i.GID[:])
	return b, nil
}

// UnmarshalBinary decodes MarshalBinary's output; it fails with ErrInvalid
// on a short buffer.
func (i *QPInfo) UnmarshalBinary(b []byte) error {
	if len(b) < QPInfoSize {
		return invalid("QPInfo needs %d bytes, got %d", QPInfoSize, len(b))
	}
	i.QPN = binary.BigEndian.Uint32(b[0:])
	i.PSN = binary.BigEndian.Uint32(b[4:])
	i.LID = binary.BigEndian.Uint16(b[8:])
	copy(i.GID[:], b[10:26])
	return nil
}

// ConnectOptions tune Connect. The zero value suits RoCE: port 1, the
// port's RoCE v2 GID with an IPv4 address (index 1 on rxe), MTU 1024, all
// remote access.
type ConnectOptions struct {
	Port int
	// GIDIndex is the local GID index for the GRH. 0 picks the RoCE v2
	// GID carrying an IPv4 address (Context.RoCEv2GID, falling back to
	// index 1); -1 forces index 0.
	GIDIndex    int
	PathMTU     MTU
	Access      Access // 0 means AccessAll
	Timeout     int
	RetryCount  int
	RNRRetry    int
	MaxRdAtomic int // both directions; 0 means 16
	MinRNRTimer int
	QKey        uint32 // UD
}

// Connect moves a fresh QP through INIT, RTR and RTS towards the remote QP
// described by remote; local is this side's info (its PSN is used as the
// send PSN). For UD it ignores remote and only needs opts.QKey. Errors are
// those of ToInit, ToRTR and ToRTS.
func (qp *QP) Connect(local, remote QPInfo, opts *ConnectOptions) error {
	var o ConnectOptions
	if opts != nil {
		o = *opts
	}
	if o.Port == 0 {
		o.Port = 1
	}
	gidx := o.GIDIndex
	switch {
	case gidx < 0:
		gidx = 0
	case gidx == 0:
		gidx = 1
		if e, err := qp.pd.ctx.RoCEv2GID(o.Port, nil); err == nil {
			gidx = e.Index
		}
	}
	if o.Access == 0 {
		o.Access = AccessAll
	}
	if o.MaxRdAtomic == 0 {
		o.MaxRdAtomic = 16
	}
	if err := qp.ToInit(&InitAttr{Port: o.Port, Access: o.Access, QKey: o.QKey}); err != nil {
		return err
	}
	if err := qp.ToRTR(&RTRAttr{PathMTU: o.PathMTU, DestQPN: remote.QPN, RQPSN: remote.PSN,
		MaxDestRdAtomic: o.MaxRdAtomic, MinRNRTimer: o.MinRNRTimer,
		AH: AHAttr{DLID: remote.LID, Port: o.Port, IsGlobal: !remote.GID.IsZero(), DGID: remote.GID, SGIDIndex: gidx}}); err != nil {
		return err
	}
	return qp.ToRTS(&RTSAttr{SQPSN: local.PSN, Timeout: o.Timeout, RetryCount: o.RetryCount,
		RNRRetry: o.RNRRetry, MaxRdAtomic: o.MaxRdAtomic})
}

// AH is an address handle (struct ibv_ah) for UD sends, a child of its PD.
type AH struct {
	n  node
	c  *C.struct_ibv_ah
	pd *PD
}

// NewAH creates an address handle. Errors wrap ErrInvalid (a nil a),
// ErrClosed or the errno of ibv_create_ah (for RoCE, a missing GRH or an
// unreachable GID gives EINVAL or ENETUNREACH).
func (pd *PD) NewAH(a *AHAttr) (*AH, error) {
	if a == nil {
		return nil, invalid("NewAH needs an address (AHAttr)")
	}
	if err := pd.n.use("PD.NewAH"); err != nil {
		return nil, err
	}
	defer pd.n.unuse()
	var ca C.struct_ibv_ah_attr
	if a.Port == 0 {
		a.Port = 1
	}
	a.toC(&ca)
	h, errno := C.ibv_create_ah(pd.c, &ca)
	if h == nil {
		return nil, &OpError{Op: "ibv_create_ah", Err: errnoOr(errno)}
	}
	ah := &AH{c: h, pd: pd}
	ah.n.init("address handle", func() error {
		if rc := C.ibv_destroy_ah(h); rc != 0 {
			return opErr("ibv_destroy_ah", int(rc))
		}
		return nil
	})
	if err := ah.n.attach(&pd.n); err != nil {
		ah.n.close()
		return nil, err
	}
	return ah, nil
}

// Close destroys the address handle. It is idempotent.
func (ah *AH) Close() error { return ah.n.close() }
