package sockwire

import (
	"bytes"
	"math"
)

// The broker's records (sockproto.h, "The broker's records"): what a
// process and rvmad, and the rvmads of two hosts, say to each other about
// connections besides the relayed ATTACH_* and DEMOTE.
//
// rvmad's Unix socket is SOCK_SEQPACKET: a message is one record, or a
// Route followed by one relayed record of the same epoch. The pairing
// port between two rvmads carries the same messages back to back. A
// tuple is the connection as the host sending the message sees it.

// Route is ROUTE: the record that follows in the same message is about
// the connection Tuple. Epoch is that record's.
type Route struct {
	Epoch uint32
	Tuple Tuple
}

// Register is REGISTER: the sending process owns the connection Tuple
// and proves it by passing the connection's socket with the message
// (SCM_RIGHTS on rvmad's Unix socket, exactly one descriptor); rvmad
// checks that socket, closes its copy and answers Result. FD is the
// sender's number of that descriptor, informative only (rvmad's logs):
// rvmad never looks it up. Epoch is the caller's (not 0), echoed by the
// Result.
type Register struct {
	Epoch uint32
	Tuple Tuple
	FD    int32 // 0 to MaxInt32, informative
}

// Unregister is UNREGISTER: rvmad forgets the sender's registration of
// Tuple and answers Result.
type Unregister struct {
	Epoch uint32
	Tuple Tuple
}

// Result is RESULT: rvmad's answer to a Register or Unregister (Reason 0:
// done), or to a routed record it could not take or deliver (Request is
// that record's type; Reason ReasonDenied, ReasonNoDaemon, or
// ReasonNoOwner for a DEMOTE that no process on the peer owns any more).
// Epoch is the answered record's. Between two rvmads a Result about a
// DEMOTE travels behind a Route, as the DEMOTE did.
type Result struct {
	Epoch   uint32
	Tuple   Tuple
	Request Type
	Reason  Reason // 0: done
}

// Stats is STATS: the sending process's statistics segment, a sealed
// memfd of Size bytes passed with the message (SCM_RIGHTS, exactly one
// descriptor). rvmad maps it read-only and does not answer.
type Stats struct {
	Epoch uint32
	Size  uint32 // StatsMin to StatsMax
}

// List is LIST: `rvmad sockets` asks for the connections of its user's
// processes. rvmad answers in text of its own, not in records, then
// closes the connection.
type List struct {
	Epoch uint32
}

// Device is DEVICE: rvmad tells every process, unasked, that the RDMA
// device Name (as libibverbs names it) is being removed. The kernel
// waits for every process to close the device, so a process demotes the
// connections attached through it (ReasonDevice) and closes it once they
// are released. Epoch is rvmad's count of such notices, from 1.
type Device struct {
	Epoch uint32
	Name  string // 1 to DeviceNameMax-1 bytes, no NUL
}

// Type implements Record.
func (Device) Type() Type { return TypeDevice }

// RecordEpoch implements Record.
func (r Device) RecordEpoch() uint32 { return r.Epoch }

func (r Device) appendBody(dst []byte) ([]byte, error) {
	if r.Name == "" || len(r.Name) >= DeviceNameMax || bytes.IndexByte([]byte(r.Name), 0) >= 0 {
		return dst, errf(KindField, TypeDevice, "device name %q", r.Name)
	}
	dst = append(dst, r.Name...)
	return append(dst, make([]byte, DeviceNameMax-len(r.Name))...), nil
}

// decodeDevice decodes the body of a DEVICE whose header Decode checked:
// the bytes after the name's NUL, then the name, as sockproto_check.
func decodeDevice(h Header, body []byte) (Record, error) {
	name := body[:DeviceNameMax]
	n := bytes.IndexByte(name, 0)
	if n >= 0 && !zero(name[n:]) {
		return nil, errf(KindReserved, h.Type, "bytes after the name")
	}
	if n <= 0 {
		return nil, errf(KindField, h.Type, "device name without a NUL, or empty")
	}
	return Device{Epoch: h.Epoch, Name: string(name[:n])}, nil
}

// Type implements Record.
func (Stats) Type() Type { return TypeStats }

// Type implements Record.
func (List) Type() Type { return TypeList }

// RecordEpoch implements Record.
func (r Stats) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r List) RecordEpoch() uint32 { return r.Epoch }

func (r Stats) appendBody(dst []byte) ([]byte, error) {
	if r.Size < StatsMin || r.Size > StatsMax {
		return dst, errf(KindField, TypeStats, "segment of %d bytes", r.Size)
	}
	dst = le.AppendUint32(dst, r.Size)
	return le.AppendUint32(dst, 0), nil
}

func (r List) appendBody(dst []byte) ([]byte, error) { return le.AppendUint64(dst, 0), nil }

// decodeStats decodes the body of a STATS or LIST whose header Decode
// checked: padding, then fields, as sockproto_check.
func decodeStats(h Header, body []byte) (Record, error) {
	if h.Type == TypeList {
		if !zero(body[:8]) {
			return nil, errf(KindReserved, h.Type, "reserved")
		}
		return List{Epoch: h.Epoch}, nil
	}
	if !zero(body[4:8]) {
		return nil, errf(KindReserved, h.Type, "padding")
	}
	size := le.Uint32(body)
	if size < StatsMin || size > StatsMax {
		return nil, errf(KindField, h.Type, "segment of %d bytes", size)
	}
	return Stats{Epoch: h.Epoch, Size: size}, nil
}

// Type implements Record.
func (Route) Type() Type { return TypeRoute }

// Type implements Record.
func (Register) Type() Type { return TypeRegister }

// Type implements Record.
func (Unregister) Type() Type { return TypeUnregister }

// Type implements Record.
func (Result) Type() Type { return TypeResult }

// RecordEpoch implements Record.
func (r Route) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Register) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Unregister) RecordEpoch() uint32 { return r.Epoch }

// RecordEpoch implements Record.
func (r Result) RecordEpoch() uint32 { return r.Epoch }

func (r Route) appendBody(dst []byte) ([]byte, error) {
	if err := r.Tuple.check(TypeRoute); err != nil {
		return dst, err
	}
	return r.Tuple.appendTo(dst), nil
}

func (r Unregister) appendBody(dst []byte) ([]byte, error) {
	if err := r.Tuple.check(TypeUnregister); err != nil {
		return dst, err
	}
	return r.Tuple.appendTo(dst), nil
}

func (r Register) appendBody(dst []byte) ([]byte, error) {
	if err := r.Tuple.check(TypeRegister); err != nil {
		return dst, err
	}
	if r.FD < 0 {
		return dst, errf(KindField, TypeRegister, "fd %d", r.FD)
	}
	dst = r.Tuple.appendTo(dst)
	dst = le.AppendUint32(dst, uint32(r.FD))
	return le.AppendUint32(dst, 0), nil
}

func (r Result) appendBody(dst []byte) ([]byte, error) {
	if err := r.Tuple.check(TypeResult); err != nil {
		return dst, err
	}
	if r.Request < 1 || r.Request > TypeMax || r.Reason > ReasonMax {
		return dst, errf(KindField, TypeResult, "request %d, reason %d", uint8(r.Request), uint16(r.Reason))
	}
	dst = r.Tuple.appendTo(dst)
	dst = append(dst, byte(r.Request), 0)
	dst = le.AppendUint16(dst, uint16(r.Reason))
	return le.AppendUint32(dst, 0), nil
}

// decodeBroker decodes the body of a ROUTE, REGISTER, UNREGISTER or
// RESULT whose header Decode checked, in sockproto_check's order: the
// tuple (its padding, then its family), then padding, then fields.
func decodeBroker(h Header, body []byte) (Record, error) {
	t := h.Type
	tu, err := decodeTuple(body, t)
	if err != nil {
		return nil, err
	}
	switch t {
	case TypeRoute:
		return Route{Epoch: h.Epoch, Tuple: tu}, nil
	case TypeUnregister:
		return Unregister{Epoch: h.Epoch, Tuple: tu}, nil
	case TypeRegister:
		if !zero(body[44:48]) {
			return nil, errf(KindReserved, t, "padding")
		}
		fd := le.Uint32(body[40:])
		if fd > math.MaxInt32 {
			return nil, errf(KindField, t, "fd %d", fd)
		}
		return Register{Epoch: h.Epoch, Tuple: tu, FD: int32(fd)}, nil
	case TypeResult:
		if body[41] != 0 || !zero(body[44:48]) {
			return nil, errf(KindReserved, t, "padding")
		}
		req, r := Type(body[40]), Reason(le.Uint16(body[42:]))
		if req < 1 || req > TypeMax || r > ReasonMax {
			return nil, errf(KindField, t, "request %d, reason %d", uint8(req), uint16(r))
		}
		return Result{Epoch: h.Epoch, Tuple: tu, Request: req, Reason: r}, nil
	}
	return nil, errf(KindType, t, "no decoder")
}
