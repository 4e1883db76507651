package activeaccess

import (
	"encoding/binary"
	"fmt"
)

// The wire protocol (version 2; version 1 sent the grant as the first
// message after the accept). Everything is little endian.
//
// Connection set-up rides on rdma_cm private data, so the application
// never exchanges keys itself:
//
//	hello  (source -> target, connect request, 52 bytes):
//	  magic "AAh1" | version u16 | modes u8 | 0 u8 | name [40]byte (NUL padded) |
//	  source QP number u32
//	grant  (target -> source, accept, 64 bytes):
//	  magic "AAg1" | version u16 | mode u8 | 0 u8 | source id u32 | rkey u32 |
//	  region addr u64 | region len u64 | credit grant u64 | max entry u32 |
//	  marker window u16 | message size u16 | inbox addr u64 | inbox rkey u32 |
//	  max get u32
//	refusal (target -> source, reject, 8 bytes):
//	  magic "AAr1" | version u16 | reason u16
//
// rdma_cm pads private data with zeros up to its maximum, so decoders
// accept trailing bytes.
//
// After set-up both sides exchange SEND messages of at most msgSize bytes:
//
//	marker (source -> target, 16 bytes): type 2 | flags u8 | 0 [6] | epoch u64
//	status (target -> source): type 1 | replies u8 | 0 [6] | acked epoch u64 |
//	  processed u64 | replies x {offset u64, value u64}
//
// A status message's replies were produced before its acknowledgement:
// the source sees them before the flush they precede returns.
//
// In the library-mediated mode the source writes each active access into
// its inbox at the target (a ring of the granted size) with an RDMA
// WRITE_WITH_IMM whose immediate is the entry's position / 64:
//
//	entry (64-byte header, then a put's data):
//	  kind u8 (1 put, 2 get) | 0 [7] | offset u64 | length u32 | 0 u32 |
//	  reply addr u64 | reply rkey u32 | op u32
//
// and the target answers a get with an RDMA WRITE_WITH_IMM of the data
// served to the reply address, the immediate being the op number.
const (
	protoVersion = 2 // 2: the grant is the accept's private data, not a first message

	helloLen  = 52
	grantLen  = 64
	refuseLen = 8
	nameLen   = 40

	msgSize         = 256 // bytes of every message buffer
	msgMarker       = 2
	msgStatus       = 1
	markerLen       = 16
	statusHdrLen    = 24
	replyLen        = 16
	maxReplies      = (msgSize - statusHdrLen) / replyLen
	markerFlagFlush = 1
)

var (
	magicHello  = [4]byte{'A', 'A', 'h', '1'}
	magicGrant  = [4]byte{'A', 'A', 'g', '1'}
	magicRefuse = [4]byte{'A', 'A', 'r', '1'}
)

var le = binary.LittleEndian

// hello is what a source says in its connection request.
type hello struct {
	Version uint16
	Modes   uint8 // bit (1 << Mode) for each mode the source can use
	Name    string
	QPN     uint32
}

func (h hello) marshal() []byte {
	b := make([]byte, helloLen)
	copy(b, magicHello[:])
	le.PutUint16(b[4:], h.Version)
	b[6] = h.Modes
	copy(b[8:8+nameLen], h.Name)
	le.PutUint32(b[48:], h.QPN)
	return b
}

func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen || [4]byte(b[:4]) != magicHello {
		return hello{}, fmt.Errorf("%w: connection request without an activeaccess hello (%d bytes)", ErrProtocol, len(b))
	}
	h := hello{Version: le.Uint16(b[4:]), Modes: b[6], QPN: le.Uint32(b[48:])}
	name := b[8 : 8+nameLen]
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	h.Name = string(name)
	return h, nil
}

// grant is what a target answers when it accepts a source.
type grant struct {
	Version   uint16
	Mode      Mode
	SourceID  uint32
	RKey      uint32
	Addr      uint64 // the target memory's first byte, as remote peers address it
	Len       uint64
	Credits   uint64 // log bytes the source may have unprocessed at once
	MaxEntry  uint32 // the largest log entry one packet and page can make
	Window    uint16 // markers the source may have unacknowledged
	MsgSize   uint16
	InboxAddr uint64 // ModeMediated: the source's inbox at the target
	InboxRKey uint32
	MaxGet    uint32 // ModeMediated: the largest active get
}

func (g grant) marshal() []byte {
	b := make([]byte, grantLen)
	copy(b, magicGrant[:])
	le.PutUint16(b[4:], g.Version)
	b[6] = uint8(g.Mode)
	le.PutUint32(b[8:], g.SourceID)
	le.PutUint32(b[12:], g.RKey)
	le.PutUint64(b[16:], g.Addr)
	le.PutUint64(b[24:], g.Len)
	le.PutUint64(b[32:], g.Credits)
	le.PutUint32(b[40:], g.MaxEntry)
	le.PutUint16(b[44:], g.Window)
	le.PutUint16(b[46:], g.MsgSize)
	le.PutUint64(b[48:], g.InboxAddr)
	le.PutUint32(b[56:], g.InboxRKey)
	le.PutUint32(b[60:], g.MaxGet)
	return b
}

func parseGrant(b []byte) (grant, error) {
	if len(b) < grantLen || [4]byte(b[:4]) != magicGrant {
		return grant{}, fmt.Errorf("%w: accept without an activeaccess grant (%d bytes): not an activeaccess target", ErrProtocol, len(b))
	}
	g := grant{Version: le.Uint16(b[4:]), Mode: Mode(b[6]), SourceID: le.Uint32(b[8:]), RKey: le.Uint32(b[12:]),
		Addr: le.Uint64(b[16:]), Len: le.Uint64(b[24:]), Credits: le.Uint64(b[32:]), MaxEntry: le.Uint32(b[40:]),
		Window: le.Uint16(b[44:]), MsgSize: le.Uint16(b[46:]), InboxAddr: le.Uint64(b[48:]), InboxRKey: le.Uint32(b[56:]),
		MaxGet: le.Uint32(b[60:])}
	switch {
	case g.Version != protoVersion:
		return g, fmt.Errorf("%w: target speaks protocol version %d, this package %d", ErrProtocol, g.Version, protoVersion)
	case g.Mode != ModeTransparent && g.Mode != ModeMediated:
		return g, fmt.Errorf("%w: target offers %v", ErrProtocol, g.Mode)
	case g.Mode == ModeMediated && (g.InboxAddr == 0 || g.Credits < entryHeader || g.Credits > 1<<32 || g.MaxGet == 0):
		return g, fmt.Errorf("%w: mediated grant with inbox %#x of %d bytes, gets up to %d", ErrProtocol, g.InboxAddr, g.Credits, g.MaxGet)
	case g.Len == 0 || g.Addr+g.Len < g.Addr:
		return g, fmt.Errorf("%w: target memory [%#x, +%d) invalid", ErrProtocol, g.Addr, g.Len)
	case g.Window == 0 || g.MsgSize < markerLen || g.MsgSize > msgSize:
		return g, fmt.Errorf("%w: marker window %d, message size %d", ErrProtocol, g.Window, g.MsgSize)
	case g.Mode == ModeTransparent && (g.MaxEntry < entryHeader || g.Credits < uint64(g.MaxEntry)):
		return g, fmt.Errorf("%w: %d credits for entries of up to %d bytes", ErrProtocol, g.Credits, g.MaxEntry)
	}
	return g, nil
}

func marshalRefusal(r RejectReason) []byte {
	b := make([]byte, refuseLen)
	copy(b, magicRefuse[:])
	le.PutUint16(b[4:], protoVersion)
	le.PutUint16(b[6:], uint16(r))
	return b
}

// parseRefusal returns the reason in a reject's private data, 0 if it is
// not an activeaccess refusal.
func parseRefusal(b []byte) RejectReason {
	if len(b) < refuseLen || [4]byte(b[:4]) != magicRefuse {
		return 0
	}
	r := RejectReason(le.Uint16(b[6:]))
	if r == 0 || r > rejectReasonLast {
		return 0
	}
	return r
}

// marker asks the target to acknowledge epoch once its handlers processed
// every entry logged before the marker arrived.
type marker struct {
	Epoch uint64
	Flush bool
}

func (m marker) put(b []byte) int {
	clear(b[:markerLen])
	b[0] = msgMarker
	if m.Flush {
		b[1] = markerFlagFlush
	}
	le.PutUint64(b[8:], m.Epoch)
	return markerLen
}

func parseMarker(b []byte) (marker, error) {
	if len(b) < markerLen || b[0] != msgMarker {
		return marker{}, fmt.Errorf("%w: bad marker message (%d bytes, type %d)", ErrProtocol, len(b), firstByte(b))
	}
	m := marker{Epoch: le.Uint64(b[8:]), Flush: b[1]&markerFlagFlush != 0}
	if m.Epoch == 0 {
		return m, fmt.Errorf("%w: marker for epoch 0", ErrProtocol)
	}
	return m, nil
}

// Reply is a value a target's handler sent back to the source whose
// access it processed (Access.Reply).
type Reply struct {
	Offset uint64 // the offset of the access the handler replied to
	Value  uint64
}

// status carries replies, then acknowledges markers up to Acked (0: none)
// and reports how many of the source's log entries were processed.
type status struct {
	Acked     uint64
	Processed uint64
	Replies   []Reply
}

func (s status) put(b []byte) int {
	n := statusHdrLen + len(s.Replies)*replyLen
	clear(b[:statusHdrLen])
	b[0] = msgStatus
	b[1] = uint8(len(s.Replies))
	le.PutUint64(b[8:], s.Acked)
	le.PutUint64(b[16:], s.Processed)
	for i, r := range s.Replies {
		o := statusHdrLen + i*replyLen
		le.PutUint64(b[o:], r.Offset)
		le.PutUint64(b[o+8:], r.Value)
	}
	return n
}

func parseStatus(b []byte, dst []Reply) (status, []Reply, error) {
	if len(b) < statusHdrLen || b[0] != msgStatus {
		return status{}, dst, fmt.Errorf("%w: bad status message (%d bytes, type %d)", ErrProtocol, len(b), firstByte(b))
	}
	n := int(b[1])
	if n > maxReplies || len(b) < statusHdrLen+n*replyLen {
		return status{}, dst, fmt.Errorf("%w: status message of %d bytes claims %d replies", ErrProtocol, len(b), n)
	}
	s := status{Acked: le.Uint64(b[8:]), Processed: le.Uint64(b[16:])}
	for i := 0; i < n; i++ {
		o := statusHdrLen + i*replyLen
		dst = append(dst, Reply{Offset: le.Uint64(b[o:]), Value: le.Uint64(b[o+8:])})
	}
	return s, dst, nil
}

func firstByte(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}

// Inbox entry kinds (ModeMediated).
const (
	entryPut = 1
	entryGet = 2
)

// entry is the header of an access a mediated source writes into its
// inbox.
type entry struct {
	Kind      uint8
	Off       uint64
	Len       uint32
	ReplyAddr uint64 // get: where the data served goes
	ReplyRKey uint32
	Op        uint32 // get: the immediate of the answer
}

func (e entry) put(b []byte) {
	clear(b[:entryHeader])
	b[0] = e.Kind
	le.PutUint64(b[8:], e.Off)
	le.PutUint32(b[16:], e.Len)
	le.PutUint64(b[24:], e.ReplyAddr)
	le.PutUint32(b[32:], e.ReplyRKey)
	le.PutUint32(b[36:], e.Op)
}

// parseEntry decodes the entry at b, which holds the rest of the inbox
// from the entry on, and checks it against a target memory of size bytes.
func parseEntry(b []byte, size uint64) (entry, error) {
	if len(b) < entryHeader {
		return entry{}, fmt.Errorf("%w: inbox entry at %d bytes from the end", ErrProtocol, len(b))
	}
	e := entry{Kind: b[0], Off: le.Uint64(b[8:]), Len: le.Uint32(b[16:]), ReplyAddr: le.Uint64(b[24:]),
		ReplyRKey: le.Uint32(b[32:]), Op: le.Uint32(b[36:])}
	switch {
	case e.Kind != entryPut && e.Kind != entryGet:
		return e, fmt.Errorf("%w: inbox entry of kind %d", ErrProtocol, e.Kind)
	case e.Len == 0 || e.Off > size || uint64(e.Len) > size-e.Off:
		return e, fmt.Errorf("%w: inbox entry for [%d, +%d) of %d bytes", ErrProtocol, e.Off, e.Len, size)
	case e.Kind == entryPut && uint64(e.Len) > uint64(len(b)-entryHeader):
		return e, fmt.Errorf("%w: inbox entry of %d data bytes, %d left in the inbox", ErrProtocol, e.Len, len(b)-entryHeader)
	}
	return e, nil
}

// inboxCost is the inbox bytes a mediated access takes.
func inboxCost(put bool, n int) int64 {
	if put {
		return entryHeader + round64(int64(n))
	}
	return entryHeader
}
