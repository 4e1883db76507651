// Package sockwire is the Go mirror of cmd/sockpreload/sockproto.h, the
// wire protocol of sockets over RDMA (docs/sockets.md): control records
// (ATTACH_REQ, ATTACH_REP, ATTACH_NACK, SWITCH, FIN, ABORT, DEMOTE,
// and rvmad's ROUTE, REGISTER, UNREGISTER, RESULT, STATS, LIST, DEVICE), the control block the peer writes credits into, the header of a
// receive ring, the immediate data of ring writes, and the layout of a
// process's statistics segment.
//
// It is internal to the module: pkg/sockets and rvmad's broker
// (cmd/rvmad/internal/sockets) speak it; it is no public API.
//
// Records are fixed-size and little-endian, with a 16-byte header (magic,
// version, type, length, flags, epoch, reserved). Decode never panics: a
// malformed record gives an *Error whose Kind says which check failed, in
// the order of the header's sockproto_check, and which wraps one of the
// sentinel errors (ErrShort, ErrMagic, ...) for errors.Is. The tests check
// the encoder and the checks against the C header, byte for byte.
package sockwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Protocol constants, as in sockproto.h.
const (
	Magic   = 0x5352 // SOCKPROTO_MAGIC
	Version = 1      // SOCKPROTO_VERSION

	HeaderSize   = 16  // struct sockproto_hdr
	OffsetSize   = 24  // SWITCH, FIN
	DemoteSize   = 32  // DEMOTE
	ReasonSize   = 24  // ATTACH_NACK, ABORT
	AttachSize   = 120 // ATTACH_REQ, ATTACH_REP
	RouteSize    = 56  // ROUTE, UNREGISTER
	RegisterSize = 64  // REGISTER
	ResultSize   = 64  // RESULT
	StatsSize    = 24  // STATS
	ListSize     = 24  // LIST
	DeviceSize   = 80  // DEVICE
	RecordMax    = AttachSize

	DeviceNameMax = 64 // a DEVICE's name field, its NUL included

	RingLog2Min = 12 // smallest ring: 4 KiB
	RingLog2Max = 30 // largest ring: 1 GiB
	QPNMax      = 0xffffff
	PSNMax      = 0xffffff
	MTUMin      = 1 // IBV_MTU_256
	MTUMax      = 5 // IBV_MTU_4096

	AFInet  = 2  // Linux's AF_INET
	AFInet6 = 10 // Linux's AF_INET6
)

// Type is a record type (enum sockproto_type).
type Type uint8

// Record types.
const (
	TypeAttachReq  Type = 1 // rvmad: attach RDMA to this connection
	TypeAttachRep  Type = 2 // rvmad: accepted, with the acceptor's endpoint
	TypeAttachNack Type = 3 // rvmad: refused, with a reason
	TypeSwitch     Type = 4 // QP: the sender's bytes from Offset on go by the ring
	TypeFin        Type = 5 // QP: the sender's stream ends at Offset
	TypeAbort      Type = 6 // QP: the connection is reset
	TypeDemote     Type = 7 // rvmad: back to TCP; the sender consumed this much
	// 8 is reserved: never used again (it named a record no one sent).
	TypeRoute      Type = 9  // rvmad: the next record is about this connection
	TypeRegister   Type = 10 // rvmad: I own this connection; hand me its records
	TypeUnregister Type = 11 // rvmad: forget this connection
	TypeResult     Type = 12 // rvmad: the broker's answer to a request
	TypeStats      Type = 13 // rvmad: my statistics segment (a memfd passed along)
	TypeList       Type = 14 // rvmad: list my connections (rvmad sockets)
	TypeDevice     Type = 15 // rvmad: this RDMA device is going away
	TypeMax             = TypeDevice
)

var typeNames = [...]string{"", "ATTACH_REQ", "ATTACH_REP", "ATTACH_NACK", "SWITCH", "FIN", "ABORT", "DEMOTE", "",
	"ROUTE", "REGISTER", "UNREGISTER", "RESULT", "STATS", "LIST", "DEVICE"}

func (t Type) String() string {
	if t >= 1 && t <= TypeMax && typeNames[t] != "" {
		return typeNames[t]
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

// Size is the one size of records of type t, 0 for an unknown type.
func (t Type) Size() int {
	switch t {
	case TypeAttachReq, TypeAttachRep:
		return AttachSize
	case TypeAttachNack, TypeAbort:
		return ReasonSize
	case TypeSwitch, TypeFin:
		return OffsetSize
	case TypeDemote:
		return DemoteSize
	case TypeRoute, TypeUnregister:
		return RouteSize
	case TypeRegister:
		return RegisterSize
	case TypeResult:
		return ResultSize
	case TypeStats:
		return StatsSize
	case TypeList:
		return ListSize
	case TypeDevice:
		return DeviceSize
	}
	return 0
}

// Reason says why an attachment was refused, a connection demoted or
// aborted (enum sockproto_reason). Zero is never valid.
type Reason uint16

// Reasons.
const (
	ReasonVersion        Reason = 1  // the peer speaks another version
	ReasonNoOwner        Reason = 2  // no process with the shim owns the tuple
	ReasonNoDaemon       Reason = 3  // no rvmad at the peer
	ReasonNoDevice       Reason = 4  // no RDMA device or GID reaching the peer
	ReasonNoMemory       Reason = 5  // ring, MR or QP could not be allocated
	ReasonShutdown       Reason = 6  // the connection is closing
	ReasonDenied         Reason = 7  // the tuple's owner did not check out
	ReasonDisabled       Reason = 8  // policy: not for this socket
	ReasonBusy           Reason = 9  // an attachment is already under way
	ReasonExec           Reason = 10 // exec into an image without the shim
	ReasonFDPassed       Reason = 11 // the fd left by SCM_RIGHTS
	ReasonFdopen         Reason = 12 // stdio took the fd
	ReasonSplice         Reason = 13 // splice, tee, vmsplice, sendfile
	ReasonQPError        Reason = 14 // the QP failed while the anchor lives
	ReasonTCPAfterSwitch Reason = 15 // bytes on the anchor after the switch
	ReasonPeer           Reason = 16 // the peer demoted
	ReasonCloseUnread    Reason = 17 // closed with unread data
	ReasonLinger0        Reason = 18 // SO_LINGER {1, 0}
	ReasonProtocol       Reason = 19 // a malformed or unexpected record
	ReasonTimeout        Reason = 20 // the attachment took too long
	ReasonApp            Reason = 21 // asked for by the program
	ReasonLimit          Reason = 22 // a per-user cap of rvmad's was reached
	ReasonDevice         Reason = 23 // the RDMA device is being removed
	ReasonMax                   = ReasonDevice
)

var reasonNames = [...]string{"", "version", "no_owner", "no_daemon", "no_device", "no_memory",
	"shutdown", "denied", "disabled", "busy", "exec", "fd_passed", "fdopen", "splice", "qp_error",
	"tcp_after_switch", "peer", "close_unread", "linger0", "protocol", "timeout", "app", "limit", "device"}

// String is the reason's metric label (rdmaplus_sockets_fallback_total{reason}).
func (r Reason) String() string {
	if r.Valid() {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint16(r))
}

// Valid reports whether r is one of the reasons above.
func (r Reason) Valid() bool { return r >= 1 && r <= ReasonMax }

// Kind says which check a malformed record failed (enum sockproto_err).
type Kind int

// Kinds, in the order the checks run.
const (
	KindShort    Kind = 1 // fewer bytes than a header or than its length
	KindMagic    Kind = 2 // not a sockproto record
	KindVersion  Kind = 3 // another protocol version
	KindType     Kind = 4 // unknown record type
	KindLength   Kind = 5 // length is not the type's size, or bytes left over
	KindReserved Kind = 6 // flags, reserved or padding not zero
	KindField    Kind = 7 // a field out of its range
)

// Sentinel errors, one per Kind; every *Error wraps one.
var (
	ErrShort    = errors.New("sockproto: record too short")
	ErrMagic    = errors.New("sockproto: bad magic")
	ErrVersion  = errors.New("sockproto: unsupported version")
	ErrType     = errors.New("sockproto: unknown record type")
	ErrLength   = errors.New("sockproto: bad record length")
	ErrReserved = errors.New("sockproto: reserved bits set")
	ErrField    = errors.New("sockproto: field out of range")
)

var kindErrs = [...]error{nil, ErrShort, ErrMagic, ErrVersion, ErrType, ErrLength, ErrReserved, ErrField}

// Error is a malformed record or an invalid value to encode.
type Error struct {
	Kind   Kind
	Type   Type   // the record's type, when the header got that far
	Detail string // which field or what was wrong
}

func (e *Error) Error() string {
	msg := e.Unwrap().Error()
	if e.Type != 0 {
		msg += " in " + e.Type.String()
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// Unwrap gives the Kind's sentinel error.
func (e *Error) Unwrap() error {
	if e.Kind >= 1 && int(e.Kind) < len(kindErrs) {
		return kindErrs[e.Kind]
	}
	return ErrField
}

func errf(k Kind, t Type, format string, args ...any) *Error {
	return &Error{Kind: k, Type: t, Detail: fmt.Sprintf(format, args...)}
}

var le = binary.LittleEndian

// Header is the decoded header of a record.
type Header struct {
	Type   Type
	Length int
	Epoch  uint32
}

// PeekHeader checks the first HeaderSize bytes of b (magic, version,
// type, length) and returns the header, so that a stream reader knows how
// many bytes the record takes. It fails with an *Error of KindShort,
// KindMagic, KindVersion, KindType or KindLength.
func PeekHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, errf(KindShort, 0, "%d bytes, header is %d", len(b), HeaderSize)
	}
	if m := le.Uint16(b[0:]); m != Magic {
		return Header{}, errf(KindMagic, 0, "%#04x", m)
	}
	if v := b[2]; v != Version {
		return Header{}, errf(KindVersion, 0, "version %d, want %d", v, Version)
	}
	t := Type(b[3])
	n := t.Size()
	if n == 0 {
		return Header{}, errf(KindType, 0, "%d", uint8(t))
	}
	if l := int(le.Uint16(b[4:])); l != n {
		return Header{}, errf(KindLength, t, "length %d, want %d", l, n)
	}
	return Header{Type: t, Length: n, Epoch: le.Uint32(b[8:])}, nil
}

// Record is one control record. Its Epoch is the attachment it belongs
// to (from 1).
type Record interface {
	// Type is the record's type.
	Type() Type
	// Epoch is the attachment the record belongs to.
	RecordEpoch() uint32
	// appendBody appends the bytes after the header; it fails on a value
	// the wire cannot carry.
	appendBody(dst []byte) ([]byte, error)
}

// Switch is SWITCH: the sender wrote Offset bytes of its stream to the
// anchor; the receiver reads the anchor up to Offset, then the ring.
type Switch struct {
	Epoch  uint32
	Offset uint64
}

// Fin is FIN: the sender's stream ends at Offset; the receiver reports
// end of file once it consumed Offset bytes.
type Fin struct {
	Epoch  uint32
	Offset uint64
}

// Demote is DEMOTE: the sender goes back to TCP for this connection. It
// consumed Consumed bytes of the peer's stream and reads the rest from
// the anchor, where the peer sends from max(Consumed, its switch offset).
type Demote struct {
	Epoch    uint32
	Consumed uint64
	Reason   Reason
}

// Nack is ATTACH_NACK: the attachment of Epoch was refused.
type Nack struct {
	Epoch  uint32
	Reason Reason
}

// Abort is ABORT: the sender reset the connection (closed with unread
// data, SO_LINGER {1, 0}, a protocol error).
type Abort struct {
	Epoch  uint32
	Reason Reason
}

// Tuple is a TCP connection as the record's sender sees it. Addresses are
// 16 bytes; an IPv4 address is ::ffff:a.b.c.d.
type Tuple struct {
	Family     uint16 // AFInet or AFInet6
	LocalPort  uint16
	RemotePort uint16
	Local      [16]byte
	Remote     [16]byte
}

// Endpoint is one side's RDMA resources for a connection.
type Endpoint struct {
	GID      [16]byte
	QPN      uint32 // 24 bits
	PSN      uint32 // 24 bits
	RingAddr uint64 // where the side receives (ring data, not its header)
	RingRKey uint32
	RingLog2 uint8  // ring size is 1 << RingLog2, RingLog2Min..RingLog2Max
	MTU      uint8  // ibv_mtu, MTUMin..MTUMax
	CtrlAddr uint64 // the side's control block
	CtrlRKey uint32
}

// RingSize is the ring's size in bytes.
func (e Endpoint) RingSize() uint64 { return 1 << e.RingLog2 }

// Attach is ATTACH_REQ (Reply false) or ATTACH_REP (Reply true).
type Attach struct {
	Reply       bool
	Epoch       uint32
	Tuple       Tuple
	Incarnation uint64
	Endpoint    Endpoint
}

// Type implements Record.
func (Switch) Type() Type { return TypeSwitch }

// Type implements Record.
func (Fin) Type() Type { return TypeFin }

// Type implements Record.
func (Demote) Type() Type { return TypeDemote }

// Type implements Record.
func (Nack) Type() Type { return TypeAttachNack }

// Type implements Record.
func (Abort) Type() Type { return TypeAbort }

// Type implements Record.
func (a Attach) Type() Type {
	if a.Reply {
		return TypeAttachRep
	}
	return TypeAttachReq
}

// RecordEpoch implements Record.
func (r Switch) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Fin) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Demote) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Nack) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Abort) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Attach) RecordEpoch() uint32 { return r.Epoch }

func appendOffset(dst []byte, t Type, off uint64) ([]byte, error) {
	if off > math.MaxInt64 {
		return dst, errf(KindField, t, "offset %d", off)
	}
	return le.AppendUint64(dst, off), nil
}

func appendReason(dst []byte, t Type, r Reason) ([]byte, error) {
	if !r.Valid() {
		return dst, errf(KindField, t, "reason %d", uint16(r))
	}
	dst = le.AppendUint16(dst, uint16(r))
	return append(dst, 0, 0, 0, 0, 0, 0), nil
}

func (r Switch) appendBody(dst []byte) ([]byte, error) {
	return appendOffset(dst, TypeSwitch, r.Offset)
}
func (r Fin) appendBody(dst []byte) ([]byte, error) { return appendOffset(dst, TypeFin, r.Offset) }
func (r Nack) appendBody(dst []byte) ([]byte, error) {
	return appendReason(dst, TypeAttachNack, r.Reason)
}
func (r Abort) appendBody(dst []byte) ([]byte, error) { return appendReason(dst, TypeAbort, r.Reason) }

func (r Demote) appendBody(dst []byte) ([]byte, error) {
	if r.Consumed > math.MaxInt64 {
		return dst, errf(KindField, TypeDemote, "consumed %d", r.Consumed)
	}
	dst = le.AppendUint64(dst, r.Consumed)
	return appendReason(dst, TypeDemote, r.Reason)
}

func (t Tuple) check(rt Type) error {
	if t.Family != AFInet && t.Family != AFInet6 {
		return errf(KindField, rt, "address family %d", t.Family)
	}
	return nil
}

func (t Tuple) appendTo(dst []byte) []byte {
	dst = le.AppendUint16(dst, t.Family)
	dst = le.AppendUint16(dst, t.LocalPort)
	dst = le.AppendUint16(dst, t.RemotePort)
	dst = append(dst, 0, 0)
	dst = append(dst, t.Local[:]...)
	return append(dst, t.Remote[:]...)
}

func (e Endpoint) check(rt Type) error {
	switch {
	case e.QPN > QPNMax:
		return errf(KindField, rt, "QPN %#x", e.QPN)
	case e.PSN > PSNMax:
		return errf(KindField, rt, "PSN %#x", e.PSN)
	case e.RingLog2 < RingLog2Min || e.RingLog2 > RingLog2Max:
		return errf(KindField, rt, "ring log2 %d", e.RingLog2)
	case e.MTU < MTUMin || e.MTU > MTUMax:
		return errf(KindField, rt, "MTU %d", e.MTU)
	}
	return nil
}

func (e Endpoint) appendTo(dst []byte) []byte {
	dst = append(dst, e.GID[:]...)
	dst = le.AppendUint32(dst, e.QPN)
	dst = le.AppendUint32(dst, e.PSN)
	dst = le.AppendUint64(dst, e.RingAddr)
	dst = le.AppendUint32(dst, e.RingRKey)
	dst = append(dst, e.RingLog2, e.MTU, 0, 0)
	dst = le.AppendUint64(dst, e.CtrlAddr)
	dst = le.AppendUint32(dst, e.CtrlRKey)
	return le.AppendUint32(dst, 0)
}

func (a Attach) appendBody(dst []byte) ([]byte, error) {
	if err := a.Tuple.check(a.Type()); err != nil {
		return dst, err
	}
	if err := a.Endpoint.check(a.Type()); err != nil {
		return dst, err
	}
	dst = a.Tuple.appendTo(dst)
	dst = le.AppendUint64(dst, a.Incarnation)
	return a.Endpoint.appendTo(dst), nil
}

// Append appends the encoding of r to dst. It fails, appending nothing,
// with an *Error of KindField when r holds a value the wire cannot carry
// (epoch 0, an invalid reason, an offset beyond 2^63-1, an endpoint or
// tuple field out of range) and of KindType for a nil record.
func Append(dst []byte, r Record) ([]byte, error) {
	if r == nil {
		return dst, errf(KindType, 0, "nil record")
	}
	t := r.Type()
	if r.RecordEpoch() == 0 {
		return dst, errf(KindField, t, "epoch 0")
	}
	start := len(dst)
	dst = le.AppendUint16(dst, Magic)
	dst = append(dst, Version, byte(t))
	dst = le.AppendUint16(dst, uint16(t.Size()))
	dst = le.AppendUint16(dst, 0)
	dst = le.AppendUint32(dst, r.RecordEpoch())
	dst = le.AppendUint32(dst, 0)
	dst, err := r.appendBody(dst)
	if err != nil {
		return dst[:start], err
	}
	if len(dst)-start != t.Size() {
		panic(fmt.Sprintf("sockproto: %v encoded in %d bytes", t, len(dst)-start))
	}
	return dst, nil
}

// Marshal is Append to a new slice.
func Marshal(r Record) ([]byte, error) { return Append(make([]byte, 0, RecordMax), r) }

func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func decodeReason(b []byte, t Type) (Reason, error) {
	if !zero(b[2:8]) {
		return 0, errf(KindReserved, t, "padding")
	}
	r := Reason(le.Uint16(b))
	if !r.Valid() {
		return 0, errf(KindField, t, "reason %d", uint16(r))
	}
	return r, nil
}

func decodeTuple(b []byte, t Type) (Tuple, error) {
	var tu Tuple
	if !zero(b[6:8]) {
		return tu, errf(KindReserved, t, "tuple padding")
	}
	tu.Family = le.Uint16(b)
	tu.LocalPort = le.Uint16(b[2:])
	tu.RemotePort = le.Uint16(b[4:])
	copy(tu.Local[:], b[8:24])
	copy(tu.Remote[:], b[24:40])
	return tu, tu.check(t)
}

func decodeEndpoint(b []byte, t Type) (Endpoint, error) {
	var e Endpoint
	if !zero(b[38:40]) || !zero(b[52:56]) {
		return e, errf(KindReserved, t, "endpoint padding")
	}
	copy(e.GID[:], b[:16])
	e.QPN = le.Uint32(b[16:])
	e.PSN = le.Uint32(b[20:])
	e.RingAddr = le.Uint64(b[24:])
	e.RingRKey = le.Uint32(b[32:])
	e.RingLog2 = b[36]
	e.MTU = b[37]
	e.CtrlAddr = le.Uint64(b[40:])
	e.CtrlRKey = le.Uint32(b[48:])
	return e, e.check(t)
}

// Decode decodes exactly one record, which must fill b. It never panics;
// a malformed record gives an *Error: KindShort (fewer bytes than the
// header or its length), KindMagic, KindVersion, KindType, KindLength
// (the length is not the type's size, or bytes are left over),
// KindReserved (flags, reserved or padding not zero) or KindField (epoch
// 0, an unknown reason, an offset beyond 2^63-1, an address family, QPN,
// PSN, ring size or MTU out of range) — the checks and their order of
// sockproto_check in sockproto.h.
func Decode(b []byte) (Record, error) {
	h, err := PeekHeader(b)
	if err != nil {
		return nil, err
	}
	t := h.Type
	if len(b) < h.Length {
		return nil, errf(KindShort, t, "%d bytes, record is %d", len(b), h.Length)
	}
	if len(b) > h.Length {
		return nil, errf(KindLength, t, "%d bytes left over", len(b)-h.Length)
	}
	if le.Uint16(b[6:]) != 0 || le.Uint32(b[12:]) != 0 {
		return nil, errf(KindReserved, t, "header flags or reserved")
	}
	if h.Epoch == 0 {
		return nil, errf(KindField, t, "epoch 0")
	}
	body := b[HeaderSize:]
	switch t {
	case TypeAttachNack, TypeAbort:
		r, err := decodeReason(body, t)
		if err != nil {
			return nil, err
		}
		if t == TypeAbort {
			return Abort{Epoch: h.Epoch, Reason: r}, nil
		}
		return Nack{Epoch: h.Epoch, Reason: r}, nil
	case TypeDemote:
		r, err := decodeReason(body[8:], t)
		if err != nil {
			return nil, err
		}
		c := le.Uint64(body)
		if c > math.MaxInt64 {
			return nil, errf(KindField, t, "consumed %d", c)
		}
		return Demote{Epoch: h.Epoch, Consumed: c, Reason: r}, nil
	case TypeAttachReq, TypeAttachRep:
		tu, err := decodeTuple(body, t)
		if err != nil {
			return nil, err
		}
		ep, err := decodeEndpoint(body[48:], t)
		if err != nil {
			return nil, err
		}
		return Attach{Reply: t == TypeAttachRep, Epoch: h.Epoch, Tuple: tu,
			Incarnation: le.Uint64(body[40:]), Endpoint: ep}, nil
	case TypeSwitch, TypeFin:
		off := le.Uint64(body)
		if off > math.MaxInt64 {
			return nil, errf(KindField, t, "offset %d", off)
		}
		if t == TypeFin {
			return Fin{Epoch: h.Epoch, Offset: off}, nil
		}
		return Switch{Epoch: h.Epoch, Offset: off}, nil
	case TypeRoute, TypeUnregister, TypeRegister, TypeResult:
		return decodeBroker(h, body)
	case TypeStats, TypeList:
		return decodeStats(h, body)
	case TypeDevice:
		return decodeDevice(h, body)
	}
	return nil, errf(KindType, t, "no decoder")
}

// Check validates b as Decode does, without keeping the record.
func Check(b []byte) error {
	_, err := Decode(b)
	return err
}
