package verbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// PortSpace selects the rdma_cm port space: PSTCP for RC connections,
// PSUDP for UD.
type PortSpace int

// rdma_cm port spaces.
const (
	PSTCP PortSpace = 0x0106
	PSUDP PortSpace = 0x0111
)

// CMEventType is an rdma_cm event type (enum rdma_cm_event_type).
type CMEventType int

// rdma_cm events.
const (
	CMAddrResolved    CMEventType = 0
	CMAddrError       CMEventType = 1
	CMRouteResolved   CMEventType = 2
	CMRouteError      CMEventType = 3
	CMConnectRequest  CMEventType = 4
	CMConnectResponse CMEventType = 5
	CMConnectError    CMEventType = 6
	CMUnreachable     CMEventType = 7
	CMRejected        CMEventType = 8
	CMEstablished     CMEventType = 9
	CMDisconnected    CMEventType = 10
	CMDeviceRemoval   CMEventType = 11
	CMMulticastJoin   CMEventType = 12
	CMMulticastError  CMEventType = 13
	CMAddrChange      CMEventType = 14
	CMTimewaitExit    CMEventType = 15
)

var cmEventNames = [...]string{"RDMA_CM_EVENT_ADDR_RESOLVED", "RDMA_CM_EVENT_ADDR_ERROR",
	"RDMA_CM_EVENT_ROUTE_RESOLVED", "RDMA_CM_EVENT_ROUTE_ERROR", "RDMA_CM_EVENT_CONNECT_REQUEST",
	"RDMA_CM_EVENT_CONNECT_RESPONSE", "RDMA_CM_EVENT_CONNECT_ERROR", "RDMA_CM_EVENT_UNREACHABLE",
	"RDMA_CM_EVENT_REJECTED", "RDMA_CM_EVENT_ESTABLISHED", "RDMA_CM_EVENT_DISCONNECTED",
	"RDMA_CM_EVENT_DEVICE_REMOVAL", "RDMA_CM_EVENT_MULTICAST_JOIN", "RDMA_CM_EVENT_MULTICAST_ERROR",
	"RDMA_CM_EVENT_ADDR_CHANGE", "RDMA_CM_EVENT_TIMEWAIT_EXIT"}

func (t CMEventType) String() string {
	if t >= 0 && int(t) < len(cmEventNames) {
		return cmEventNames[t]
	}
	return fmt.Sprintf("RDMA_CM_EVENT(%d)", int(t))
}

// CMEvent is an rdma_cm event delivered to a CMID.
type CMEvent struct {
	Type        CMEventType
	Status      int    // 0 or a negative errno / a reject reason
	PrivateData []byte // connect request, response, reject
	// For CMConnectRequest: the parameters the peer asked for.
	ResponderResources, InitiatorDepth, RetryCount, RNRRetryCount uint8
	newID                                                         *C.struct_rdma_cm_id
}

// CMEventError reports an event other than the one an operation waited for
// (an address or route error, an unreachable peer, a connect error).
type CMEventError struct {
	Op    string
	Event CMEvent
}

func (e *CMEventError) Error() string {
	return fmt.Sprintf("verbs: %s: got %v (status %d)", e.Op, e.Event.Type, e.Event.Status)
}

// RejectError is returned by Connect (and Dial) when the connection is
// refused: by the peer's Reject (PrivateData is what it passed, padded by
// the transport with zeros to its maximum length), or because nothing
// listens at the address (NoListener; no private data). errors.Is(err,
// syscall.ECONNREFUSED) holds for both.
type RejectError struct {
	Status      int // the CM's reject reason
	PrivateData []byte
}

// rejInvalidServiceID is the InfiniBand CM's reject reason when no one
// listens on the service ID (the port) a request is for.
const rejInvalidServiceID = 8

// NoListener reports whether the request was refused because nothing
// listens at the address.
func (e *RejectError) NoListener() bool { return e.Status == rejInvalidServiceID }

func (e *RejectError) Error() string {
	if e.NoListener() {
		return "verbs: connection refused: nothing listens at the address"
	}
	return fmt.Sprintf("verbs: connection rejected by the peer (reason %d)", e.Status)
}

// Unwrap returns syscall.ECONNREFUSED.
func (e *RejectError) Unwrap() error { return syscall.ECONNREFUSED }

func newRejectError(ev CMEvent) *RejectError {
	e := &RejectError{Status: ev.Status, PrivateData: ev.PrivateData}
	if e.NoListener() {
		e.PrivateData = nil
	}
	return e
}

// ConnParam carries the rdma_conn_param of Connect and Accept.
type ConnParam struct {
	// PrivateData goes with the request or the answer. InfiniBand and
	// RoCE carry at most 56 bytes with a connect (PSUDP: 180), 196 with an
	// accept (PSUDP: 136) and 148 with a reject (PSUDP: 136): the CM
	// message's room less the 36 bytes rdma_cm adds to a request. Other
	// transports (iWARP) allow up to 255 here.
	PrivateData        []byte
	ResponderResources uint8 // incoming RDMA READ/atomic depth; 0 means 1
	InitiatorDepth     uint8 // outgoing RDMA READ/atomic depth; 0 means 1
	// RetryCount is how often a request is resent before it fails with
	// WCRetryExcErr; 0 means DefaultRetryCount (see CMID.SetAckTimeout).
	RetryCount    uint8
	RNRRetryCount uint8 // 0 means 7
}

// CMID is an rdma_cm identifier (struct rdma_cm_id) with its own event
// channel on Go's netpoller: every blocking call parks the goroutine and
// honours its context. A CMID is the parent of the QP created with NewQP.
//
// The verbs context of a CMID (Context) is owned by librdmacm; the PD and
// CQs created on it are the caller's to close.
type CMID struct {
	n  node
	c  *C.struct_rdma_cm_id
	ch *C.struct_rdma_event_channel
	p  *pollFD
	ps PortSpace
	qp *QP

	acceptData []byte // the peer's Accept private data, set by Connect

	// Once connected, a goroutine (pump) reads the identifier's events,
	// acts on the end of the connection and queues them for WaitEvent.
	evMu     sync.Mutex
	pumping  bool
	evQ      []CMEvent
	evErr    error         // why the pump stopped
	evWake   chan struct{} // an event was queued
	pumpDone chan struct{} // the pump stopped

	endOnce  sync.Once
	ended    chan struct{} // closed when the connection ended
	discSent atomic.Bool   // rdma_disconnect called
	onEnd    func()        // run once when the connection ends (Conn)
}

var (
	cmCtxMu sync.Mutex
	cmCtx   = map[*C.struct_ibv_context]*Context{}
)

// NewCMID creates an identifier in port space ps. Errors wrap the errno of
// rdma_create_event_channel or rdma_create_id (ENODEV without RDMA devices).
func NewCMID(ps PortSpace) (*CMID, error) {
	ch, errno := C.rdma_create_event_channel()
	if ch == nil {
		return nil, &OpError{Op: "rdma_create_event_channel", Err: errnoOr(errno)}
	}
	var c *C.struct_rdma_cm_id
	if rc := C.rdma_create_id(ch, &c, nil, uint32(ps)); rc != 0 {
		err := opErr("rdma_create_id", int(C.shim_errno()))
		C.rdma_destroy_event_channel(ch)
		return nil, err
	}
	id, err := wrapCMID(c, ch, ps)
	if err != nil {
		C.rdma_destroy_id(c)
		C.rdma_destroy_event_channel(ch)
		return nil, err
	}
	return id, nil
}

func wrapCMID(c *C.struct_rdma_cm_id, ch *C.struct_rdma_event_channel, ps PortSpace) (*CMID, error) {
	p, err := newPollFD(int(ch.fd), "rdma_cm event channel")
	if err != nil {
		return nil, err
	}
	id := &CMID{c: c, ch: ch, p: p, ps: ps, evWake: make(chan struct{}, 1), ended: make(chan struct{})}
	id.n.init("rdma_cm id", func() error {
		var err error
		if rc := C.rdma_destroy_id(c); rc != 0 {
			err = opErr("rdma_destroy_id", int(C.shim_errno()))
		}
		C.rdma_destroy_event_channel(ch)
		return err
	})
	id.n.preclose = func() { p.close() }
	return id, nil
}

// Close destroys the identifier's QP, the identifier and its event channel.
// It does not disconnect gracefully (call Disconnect first for that). It is
// idempotent.
func (id *CMID) Close() error { return id.n.close() }

// QP returns the QP created with NewQP, or nil.
func (id *CMID) QP() *QP { return id.qp }

// Context returns the verbs context the identifier is bound to (after
// ResolveAddr, or for an identifier from GetRequest). It fails with
// ErrNoDevice when the identifier is not bound to a device yet.
func (id *CMID) Context() (*Context, error) {
	if err := id.n.use("CMID.Context"); err != nil {
		return nil, err
	}
	defer id.n.unuse()
	v := id.c.verbs
	if v == nil {
		return nil, fmt.Errorf("%w: rdma_cm id not bound to a device yet", ErrNoDevice)
	}
	cmCtxMu.Lock()
	defer cmCtxMu.Unlock()
	if c := cmCtx[v]; c != nil && !c.n.isClosed() {
		return c, nil
	}
	c, err := newContext(v, C.GoString(C.ibv_get_device_name(v.device)), false)
	if err != nil {
		return nil, err
	}
	cmCtx[v] = c
	return c, nil
}

// NewQP creates the identifier's QP (rdma_create_qp) on pd, which must
// belong to id's Context; rdma_cm then drives its state machine during
// Connect and Accept. Errors wrap ErrInvalid, ErrClosed or the errno of
// rdma_create_qp.
func (id *CMID) NewQP(pd *PD, attr *QPInitAttr) (*QP, error) {
	if err := id.n.use("CMID.NewQP"); err != nil {
		return nil, err
	}
	if pd.ctx.c != id.c.verbs {
		id.n.unuse()
		return nil, invalid("PD of another device than the rdma_cm id")
	}
	id.n.unuse()
	qp, err := pd.newQP(attr, id)
	if err != nil {
		return nil, err
	}
	id.qp = qp
	return qp, nil
}

// WaitEvent returns the identifier's next rdma_cm event. Once the
// connection is established the package reads the events itself and
// keeps them for WaitEvent (the last 16, oldest first): the end of the
// connection (CMDisconnected, CMDeviceRemoval) moves the QP to the error
// state at once, so that its posted work requests flush, whether or not
// anyone calls WaitEvent. Errors wrap ErrClosed, ctx's error (at once when
// ctx is already done) or the errno of rdma_get_cm_event.
func (id *CMID) WaitEvent(ctx context.Context) (CMEvent, error) {
	if err := ctx.Err(); err != nil {
		return CMEvent{}, err
	}
	id.evMu.Lock()
	pumping := id.pumping
	id.evMu.Unlock()
	if !pumping {
		ev, err := id.readEvent(ctx)
		if err == nil {
			id.noteEvent(ev)
		}
		return ev, err
	}
	for {
		id.evMu.Lock()
		if len(id.evQ) > 0 {
			ev := id.evQ[0]
			id.evQ = append(id.evQ[:0], id.evQ[1:]...)
			id.evMu.Unlock()
			return ev, nil
		}
		id.evMu.Unlock()
		select {
		case <-id.evWake:
		case <-id.pumpDone:
			id.evMu.Lock()
			left, err := len(id.evQ), id.evErr
			id.evMu.Unlock()
			if left == 0 {
				return CMEvent{}, err
			}
		case <-ctx.Done():
			return CMEvent{}, ctx.Err()
		}
	}
}

// readEvent waits for and acknowledges the identifier's next event.
func (id *CMID) readEvent(ctx context.Context) (CMEvent, error) {
	if err := id.n.use("CMID.WaitEvent"); err != nil {
		return CMEvent{}, err
	}
	defer id.n.unuse()
	var raw C.struct_shim_cm_event
	err := id.p.wait(ctx, func() error {
		rc := C.shim_get_cm_event(id.ch, &raw)
		if rc == C.EAGAIN {
			return errAgain
		}
		if rc != 0 {
			return opErr("rdma_get_cm_event", int(rc))
		}
		return nil
	})
	if err == ErrClosed {
		return CMEvent{}, closedErr(id.n.kind)
	}
	if err != nil {
		return CMEvent{}, err
	}
	ev := CMEvent{Type: CMEventType(raw.event), Status: int(raw.status),
		ResponderResources: uint8(raw.responder_resources), InitiatorDepth: uint8(raw.initiator_depth),
		RetryCount: uint8(raw.retry_count), RNRRetryCount: uint8(raw.rnr_retry_count)}
	if raw.private_data_len > 0 {
		ev.PrivateData = C.GoBytes(unsafe.Pointer(&raw.private_data[0]), C.int(raw.private_data_len))
	}
	if ev.Type == CMConnectRequest {
		ev.newID = raw.id
	}
	return ev, nil
}

// cmQueueMax bounds the events a connected identifier keeps for WaitEvent.
const cmQueueMax = 16

// startPump starts reading a connected identifier's events.
func (id *CMID) startPump() {
	id.evMu.Lock()
	defer id.evMu.Unlock()
	if id.pumping {
		return
	}
	id.pumping = true
	id.pumpDone = make(chan struct{})
	go id.pump()
}

func (id *CMID) pump() {
	defer close(id.pumpDone)
	for {
		ev, err := id.readEvent(context.Background())
		if err != nil {
			id.evMu.Lock()
			id.evErr = err
			id.evMu.Unlock()
			return
		}
		id.noteEvent(ev)
		id.evMu.Lock()
		if len(id.evQ) == cmQueueMax {
			id.evQ = append(id.evQ[:0], id.evQ[1:]...)
		}
		id.evQ = append(id.evQ, ev)
		id.evMu.Unlock()
		select {
		case id.evWake <- struct{}{}:
		default:
		}
	}
}

// noteEvent acts on an event, whoever read it: the end of the connection
// ends it here too.
func (id *CMID) noteEvent(ev CMEvent) {
	if ev.Type == CMDisconnected || ev.Type == CMDeviceRemoval {
		id.end()
	}
}

// end ends the connection on this side, once: rdma_disconnect (which
// answers the peer's disconnect request at once and moves the QP to the
// error state, so that posted work requests flush), then the Conn's hook.
func (id *CMID) end() {
	id.endOnce.Do(func() {
		id.sendDisconnect()
		if qp := id.qp; qp != nil {
			qp.refreshState()
			if qp.State() != QPStateError {
				_ = qp.ToError() // a QP closing meanwhile: nothing to flush
			}
		}
		close(id.ended)
		if id.onEnd != nil {
			id.onEnd()
		}
	})
}

// sendDisconnect calls rdma_disconnect once; its error, or nil when it was
// called before.
func (id *CMID) sendDisconnect() error {
	if id.discSent.Swap(true) {
		return nil
	}
	if err := id.n.use("CMID.Disconnect"); err != nil {
		return err
	}
	defer id.n.unuse()
	if rc := C.rdma_disconnect(id.c); rc != 0 {
		return opErr("rdma_disconnect", int(C.shim_errno()))
	}
	return nil
}

// Ended returns a channel closed when the connection has ended (the peer
// disconnected or its process died, the device went away, or Disconnect);
// never closed for an identifier that was not connected.
func (id *CMID) Ended() <-chan struct{} { return id.ended }

// expect waits for event want; any other event becomes an error.
func (id *CMID) expect(ctx context.Context, op string, want CMEventType) (CMEvent, error) {
	ev, err := id.WaitEvent(ctx)
	if err != nil {
		return ev, fmt.Errorf("verbs: %s: %w", op, err)
	}
	if ev.Type == want {
		return ev, nil
	}
	if ev.Type == CMRejected {
		return ev, newRejectError(ev)
	}
	return ev, &CMEventError{Op: op, Event: ev}
}

// sockaddr builds a sockaddr_in or sockaddr_in6 in C memory (nil for the
// zero AddrPort); free it with C.free.
func sockaddr(ap netip.AddrPort) *C.struct_sockaddr {
	if !ap.IsValid() {
		return nil
	}
	b := make([]byte, 28)
	a := ap.Addr().Unmap()
	if a.Is4() {
		binary.NativeEndian.PutUint16(b[0:], C.AF_INET)
		binary.BigEndian.PutUint16(b[2:], ap.Port())
		v := a.As4()
		copy(b[4:], v[:])
		b = b[:16]
	} else {
		binary.NativeEndian.PutUint16(b[0:], C.AF_INET6)
		binary.BigEndian.PutUint16(b[2:], ap.Port())
		v := a.As16()
		copy(b[8:], v[:])
	}
	return (*C.struct_sockaddr)(C.CBytes(b))
}

// addrPort reads a sockaddr_in or sockaddr_in6 in C memory; the zero
// AddrPort for any other family (not bound, not resolved).
func addrPort(sa *C.struct_sockaddr) netip.AddrPort {
	if sa == nil {
		return netip.AddrPort{}
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(sa)), 28)
	port := binary.BigEndian.Uint16(b[2:])
	switch binary.NativeEndian.Uint16(b[0:]) {
	case C.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port)
	case C.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), port)
	}
	return netip.AddrPort{}
}

// LocalAddr is the address the identifier is bound to (after Listen,
// ResolveAddr or, for one from GetRequest, the address the peer
// connected to); the zero AddrPort before. Errors wrap ErrClosed.
func (id *CMID) LocalAddr() (netip.AddrPort, error) {
	if err := id.n.use("CMID.LocalAddr"); err != nil {
		return netip.AddrPort{}, err
	}
	defer id.n.unuse()
	return addrPort(C.rdma_get_local_addr(id.c)), nil
}

// PeerAddr is the remote address: the destination after ResolveAddr, the
// connecting peer for an identifier from GetRequest; the zero AddrPort
// before (and on a listener). Errors wrap ErrClosed.
func (id *CMID) PeerAddr() (netip.AddrPort, error) {
	if err := id.n.use("CMID.PeerAddr"); err != nil {
		return netip.AddrPort{}, err
	}
	defer id.n.unuse()
	return addrPort(C.rdma_get_peer_addr(id.c)), nil
}

// ResolveAddr resolves dst (and binds to src if valid) to an RDMA device
// and waits for CMAddrResolved. Errors: a *CMEventError for
// CMAddrError, ctx's error, ErrClosed, or the errno of rdma_resolve_addr.
func (id *CMID) ResolveAddr(ctx context.Context, src, dst netip.AddrPort) error {
	if err := id.n.use("CMID.ResolveAddr"); err != nil {
		return err
	}
	s, d := sockaddr(src), sockaddr(dst)
	defer C.free(unsafe.Pointer(s))
	defer C.free(unsafe.Pointer(d))
	timeout := 2000
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(int(time.Until(dl)/time.Millisecond), 1)
	}
	rc := C.rdma_resolve_addr(id.c, s, d, C.int(timeout))
	id.n.unuse()
	if rc != 0 {
		return opErr("rdma_resolve_addr "+dst.String(), int(C.shim_errno()))
	}
	_, err := id.expect(ctx, "rdma_resolve_addr "+dst.String(), CMAddrResolved)
	return err
}

// ResolveRoute resolves the route to the resolved address and waits for
// CMRouteResolved. Errors as for ResolveAddr.
func (id *CMID) ResolveRoute(ctx context.Context) error {
	if err := id.n.use("CMID.ResolveRoute"); err != nil {
		return err
	}
	timeout := 2000
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(int(time.Until(dl)/time.Millisecond), 1)
	}
	rc := C.rdma_resolve_route(id.c, C.int(timeout))
	id.n.unuse()
	if rc != 0 {
		return opErr("rdma_resolve_route", int(C.shim_errno()))
	}
	_, err := id.expect(ctx, "rdma_resolve_route", CMRouteResolved)
	return err
}

// DefaultRetryCount is the transport retry count a connection gets when
// ConnParam.RetryCount is 0: 6, not rdma-core's customary 7, because rxe
// (Linux 6.1) resends forever with 7 and a peer whose host vanished would
// never be noticed. With 6 a work request to it fails with WCRetryExcErr
// after 7 ACK timeouts (CMID.SetAckTimeout; rdma_cm's default on RoCE is
// 2.1 s). QPs set up by hand (RTSAttr) keep 7 unless told otherwise.
const DefaultRetryCount = 6

func (p *ConnParam) defaults() ConnParam {
	var o ConnParam
	if p != nil {
		o = *p
	}
	if o.ResponderResources == 0 {
		o.ResponderResources = 1
	}
	if o.InitiatorDepth == 0 {
		o.InitiatorDepth = 1
	}
	if o.RetryCount == 0 {
		o.RetryCount = DefaultRetryCount
	}
	if o.RNRRetryCount == 0 {
		o.RNRRetryCount = 7
	}
	return o
}

// Connect sends a connection request (after ResolveRoute and NewQP) and
// waits until the connection is established. Errors: *RejectError when the
// peer rejects, *CMEventError for CMUnreachable or CMConnectError, ErrInvalid
// for more private data than the transport carries (see ConnParam), ctx's
// error, ErrClosed, or the errno of rdma_connect.
func (id *CMID) Connect(ctx context.Context, p *ConnParam) error {
	o := p.defaults()
	if err := id.n.use("CMID.Connect"); err != nil {
		return err
	}
	if err := id.checkPrivateData("connect", len(o.PrivateData)); err != nil {
		id.n.unuse()
		return err
	}
	pd := cbytes(o.PrivateData)
	rc := C.shim_cm_connect(id.c, pd, C.uint8_t(len(o.PrivateData)), C.uint8_t(o.ResponderResources),
		C.uint8_t(o.InitiatorDepth), C.uint8_t(o.RetryCount), C.uint8_t(o.RNRRetryCount))
	C.free(pd)
	id.n.unuse()
	if rc != 0 {
		return opErr("rdma_connect", int(rc))
	}
	ev, err := id.expect(ctx, "rdma_connect", CMEstablished)
	if err == nil {
		id.acceptData = ev.PrivateData
		if id.qp != nil {
			id.qp.refreshState()
		}
		id.startPump()
	}
	return err
}

// SetAckTimeout sets how long the connection's QP waits for an
// acknowledgement before it sends a request again (rdma_cm's
// RDMA_OPTION_ID_ACK_TIMEOUT, applied to this side only). After
// ConnParam.RetryCount resends the work request fails with
// WCRetryExcErr, so this bounds how long a peer whose host vanished goes
// unnoticed: about (RetryCount+1) × d. d is rounded up to the transport's
// steps of 4.096 µs × 2^n; rdma_cm's default on RoCE is 2^19 steps
// (2.1 s: about 15 s with DefaultRetryCount). Call it before Connect or Accept.
// Errors: ErrInvalid for d ≤ 0 or beyond 2^31 steps (about 2.4 hours),
// ErrClosed, or the errno of rdma_set_option (EINVAL on an identifier
// that is not for RC, PSUDP).
func (id *CMID) SetAckTimeout(d time.Duration) error {
	n, ok := ackTimeoutExp(d)
	if !ok {
		return fmt.Errorf("%w: ACK timeout %v (from 1 ns to %v)", ErrInvalid, d, ackStep<<31)
	}
	if err := id.n.use("CMID.SetAckTimeout"); err != nil {
		return err
	}
	rc := C.shim_cm_set_ack_timeout(id.c, C.uint8_t(n))
	id.n.unuse()
	if rc != 0 {
		return opErr("rdma_set_option ACK timeout", int(rc))
	}
	return nil
}

// ackStep is the unit of the transport's ACK timeout: 4.096 µs.
const ackStep = 4096 * time.Nanosecond

// ackTimeoutExp is the smallest n with 4.096 µs × 2^n ≥ d, at least 1
// (0 would disable the timer), and whether d is in range.
func ackTimeoutExp(d time.Duration) (uint8, bool) {
	if d <= 0 || d > ackStep<<31 {
		return 0, false
	}
	n := uint8(1)
	for ackStep<<n < d {
		n++
	}
	return n, true
}

// AcceptData returns the private data the peer passed to Accept, once
// Connect has returned nil (nil before). On RoCE the transport pads it
// with zeros to its maximum length: a format that needs its own length
// must carry it.
func (id *CMID) AcceptData() []byte { return id.acceptData }

// Listen binds the identifier to addr (a zero address means all) and
// listens with the given backlog. Errors wrap ErrClosed or the errno of
// rdma_bind_addr (EADDRINUSE) or rdma_listen.
func (id *CMID) Listen(addr netip.AddrPort, backlog int) error {
	if err := id.n.use("CMID.Listen"); err != nil {
		return err
	}
	defer id.n.unuse()
	if !addr.Addr().IsValid() {
		addr = netip.AddrPortFrom(netip.IPv4Unspecified(), addr.Port())
	}
	s := sockaddr(addr)
	defer C.free(unsafe.Pointer(s))
	if rc := C.rdma_bind_addr(id.c, s); rc != 0 {
		return opErr("rdma_bind_addr "+addr.String(), int(C.shim_errno()))
	}
	if rc := C.rdma_listen(id.c, C.int(backlog)); rc != 0 {
		return opErr("rdma_listen", int(C.shim_errno()))
	}
	return nil
}

// GetRequest waits for a connection request on a listening identifier and
// returns a new identifier for it (with its own event channel) and the
// request event carrying the peer's private data. The new identifier is the
// caller's to Accept or Reject and to Close. Errors as for WaitEvent, plus
// a *CMEventError for other events.
func (id *CMID) GetRequest(ctx context.Context) (*CMID, CMEvent, error) {
	ev, err := id.expect(ctx, "get connection request", CMConnectRequest)
	if err != nil {
		return nil, ev, err
	}
	ch, errno := C.rdma_create_event_channel()
	if ch == nil {
		C.rdma_reject(ev.newID, nil, 0)
		C.rdma_destroy_id(ev.newID)
		return nil, ev, &OpError{Op: "rdma_create_event_channel", Err: errnoOr(errno)}
	}
	if rc := C.rdma_migrate_id(ev.newID, ch); rc != 0 {
		err := opErr("rdma_migrate_id", int(C.shim_errno()))
		C.rdma_reject(ev.newID, nil, 0)
		C.rdma_destroy_id(ev.newID)
		C.rdma_destroy_event_channel(ch)
		return nil, ev, err
	}
	nid, err := wrapCMID(ev.newID, ch, id.ps)
	if err != nil {
		C.rdma_destroy_id(ev.newID)
		C.rdma_destroy_event_channel(ch)
		return nil, ev, err
	}
	return nid, ev, nil
}

// checkPrivateData refuses more private data than the identifier's
// transport carries in a message of kind (connect, accept, reject).
func (id *CMID) checkPrivateData(kind string, n int) error {
	limit := 255 // the uint8 length of struct rdma_conn_param
	if id.c.verbs != nil && id.c.verbs.device.transport_type == C.IBV_TRANSPORT_IB {
		switch {
		case id.ps == PSUDP && kind == "connect":
			limit = 180 // SIDR REQ
		case id.ps == PSUDP:
			limit = 136 // SIDR REP
		case kind == "connect":
			limit = 56 // REQ
		case kind == "accept":
			limit = 196 // REP
		default:
			limit = 148 // REJ
		}
	}
	if n > limit {
		return invalid("%d bytes of private data in a %s (this transport carries at most %d)", n, kind, limit)
	}
	return nil
}

// Accept accepts the connection request this identifier came from (after
// NewQP) and waits until it is established. Errors as for Connect.
func (id *CMID) Accept(ctx context.Context, p *ConnParam) error {
	o := p.defaults()
	if err := id.n.use("CMID.Accept"); err != nil {
		return err
	}
	if err := id.checkPrivateData("accept", len(o.PrivateData)); err != nil {
		id.n.unuse()
		return err
	}
	pd := cbytes(o.PrivateData)
	rc := C.shim_cm_accept(id.c, pd, C.uint8_t(len(o.PrivateData)), C.uint8_t(o.ResponderResources),
		C.uint8_t(o.InitiatorDepth), C.uint8_t(o.RNRRetryCount))
	C.free(pd)
	id.n.unuse()
	if rc != 0 {
		return opErr("rdma_accept", int(rc))
	}
	_, err := id.expect(ctx, "rdma_accept", CMEstablished)
	if err == nil {
		if id.qp != nil {
			id.qp.refreshState()
		}
		id.startPump()
	}
	return err
}

// Reject refuses the connection request this identifier came from; the peer's
// Connect returns a *RejectError carrying privateData. Errors wrap
// ErrInvalid (more private data than the transport carries, see
// ConnParam), ErrClosed or the errno of rdma_reject.
func (id *CMID) Reject(privateData []byte) error {
	if err := id.n.use("CMID.Reject"); err != nil {
		return err
	}
	defer id.n.unuse()
	if err := id.checkPrivateData("reject", len(privateData)); err != nil {
		return err
	}
	pd := cbytes(privateData)
	defer C.free(pd)
	if rc := C.rdma_reject(id.c, pd, C.uint8_t(len(privateData))); rc != 0 {
		return opErr("rdma_reject", int(C.shim_errno()))
	}
	return nil
}

// DisconnectWait bounds how long Disconnect waits for the peer to answer
// (a peer whose host vanished never does; the connection is torn down on
// this side regardless).
const DisconnectWait = 3 * time.Second

// Disconnect ends the connection: the QP moves to the error state (posted
// work requests flush) and the peer is told; it then waits for the peer's
// answer, at most DisconnectWait or until ctx ends. It is correct whoever
// ended the connection first and whether or not WaitEvent already
// returned CMDisconnected (it then returns nil at once), and a second
// call returns nil. Errors wrap ErrClosed, ctx's error, or the errno of
// rdma_disconnect (EINVAL for an identifier that was never connected).
func (id *CMID) Disconnect(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("verbs: rdma_disconnect: %w", err)
	}
	id.evMu.Lock()
	pumping := id.pumping
	id.evMu.Unlock()
	if !pumping { // never connected (or still connecting)
		if err := id.sendDisconnect(); err != nil {
			return err
		}
		if id.qp != nil {
			id.qp.refreshState()
		}
		return nil
	}
	select {
	case <-id.ended:
		return nil
	default:
	}
	if err := id.sendDisconnect(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return err
	}
	t := time.NewTimer(DisconnectWait)
	defer t.Stop()
	select {
	case <-id.ended:
	case <-id.pumpDone: // closed meanwhile
		id.end()
	case <-t.C: // no answer: ended on this side
		id.end()
	case <-ctx.Done():
		id.end()
		return fmt.Errorf("verbs: rdma_disconnect: %w", ctx.Err())
	}
	return nil
}
