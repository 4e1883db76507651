// Package wire holds the formats the two sides of package rvma exchange
// over the network or through a NIC: the 32-bit immediate, the descriptor
// table entry and the control messages. All multi-byte integers are little
// endian: both ends run this library and the NIC never interprets them.
// See docs/rvma.md, section 5. Applications never see these formats.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/rdmaplus/rdmaplus/pkg/kmod"
)

// ErrInvalid is wrapped by every error of this package: a field out of
// range when encoding, malformed data when decoding. Package rvma wraps
// its own ErrInvalid around it where such an error reaches a caller.
var ErrInvalid = errors.New("rvma wire: invalid")

// invalidf returns an error wrapping ErrInvalid.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// ImmKind is the kind of an immediate, its two top bits.
type ImmKind uint8

// Immediate kinds.
const (
	// KindData: an RDMA WRITE WITH IMMEDIATE of a zero-copy put into the
	// buffer of generation Gen of window Slot.
	KindData ImmKind = 0
	// Kind 1 is reserved (an eager put, a SEND WITH IMMEDIATE carrying
	// the data, is designed but not built: docs/rvma.md).
	// KindNotice: an RDMA WRITE WITH IMMEDIATE of an Entry into the
	// sender's view slot Slot.
	KindNotice ImmKind = 2
	// KindCtrl: a SEND WITH IMMEDIATE of a control message (Slot and Gen
	// are 0), or a zero-length RDMA WRITE WITH IMMEDIATE, a knock, that
	// reports a put refused by the sender's library against window Slot,
	// with the KnockReason and the window's incarnation in Gen (KnockGen).
	KindCtrl ImmKind = 3
)

// String names the kind.
func (k ImmKind) String() string {
	switch k {
	case KindData:
		return "data"
	case KindNotice:
		return "notice"
	case KindCtrl:
		return "ctrl"
	}
	return fmt.Sprintf("ImmKind(%d)", uint8(k))
}

// MaxSlots bounds the slots an immediate can name: windows of a
// receiver, view slots of a sender.
const MaxSlots = 1 << SlotBits

const (
	SlotBits = 20
	GenBits  = 10
	GenMod   = 1 << GenBits
	SlotMask = 1<<SlotBits - 1
	GenMask  = GenMod - 1
)

// Imm is a decoded immediate: kind (2 bits), slot (20 bits), generation
// modulo 1024 (10 bits).
type Imm struct {
	Kind ImmKind
	Slot uint32
	Gen  uint16
}

// Encode packs the immediate. It fails with ErrInvalid when a field does
// not fit its bits.
func (i Imm) Encode() (uint32, error) {
	if i.Kind > KindCtrl || i.Slot > SlotMask || i.Gen > GenMask {
		return 0, invalidf("immediate out of range: kind %d slot %d gen %d", i.Kind, i.Slot, i.Gen)
	}
	return uint32(i.Kind)<<(SlotBits+GenBits) | i.Slot<<GenBits | uint32(i.Gen), nil
}

// ParseImm unpacks an immediate. Every 32-bit value is a valid encoding;
// whether the slot exists is the caller's to check.
func ParseImm(v uint32) Imm {
	return Imm{Kind: ImmKind(v >> (SlotBits + GenBits)), Slot: v >> GenBits & SlotMask, Gen: uint16(v & GenMask)}
}

// GenLow returns the bits of a generation that an immediate carries.
func GenLow(gen uint64) uint16 { return uint16(gen & GenMask) }

// ExpandGen recovers a full generation from its low bits: the unique G with
// G ≡ low (mod 1024) in [head-512, head+512), clamped so that no result is
// negative (for head < 512 the range is [0, 1024)).
func ExpandGen(head uint64, low uint16) uint64 {
	base := uint64(0)
	if head >= GenMod/2 {
		base = head - GenMod/2
	}
	// the first G >= base with G ≡ low (mod GenMod)
	g := base - base%GenMod + uint64(low&GenMask)
	if g < base {
		g += GenMod
	}
	return g
}

// KnockReason says why a sender's library refused a put locally (carried
// in the generation bits of a KindCtrl knock).
type KnockReason uint16

// Knock reasons.
const (
	KnockNack KnockReason = 1 // the window is closed with NACK: the put failed with rvma.ErrMailboxClosed
	KnockDrop KnockReason = 2 // the window is closed silently: the put was dropped
	// KnockStale: a put to a window the receiver's module counts was
	// refused as stale (rvma.ErrStale, or retried). A refused plain WRITE leaves
	// nothing at the receiver to count, so the sender reports it, in a
	// REFUSED control message rather than a knock: a knock is lost when
	// no stripe works, as after the refusal that broke one (a knock with
	// this reason is still counted).
	KnockStale KnockReason = 3
)

// KnockReasonBits is how many of a knock's generation bits hold the
// reason; the rest hold the window's incarnation modulo 256, so that a
// knock that arrives after its slot was freed and reused is not counted
// against the new window.
const KnockReasonBits = 2

// KnockGen packs a knock's reason and the incarnation of the window the
// sender saw into an immediate's generation bits.
func KnockGen(r KnockReason, incarnation uint32) uint16 {
	return uint16(r)&(1<<KnockReasonBits-1) | uint16(incarnation)<<KnockReasonBits&GenMask
}

// ParseKnock unpacks KnockGen: the reason and the incarnation's low bits.
func ParseKnock(gen uint16) (KnockReason, uint8) {
	return KnockReason(gen & (1<<KnockReasonBits - 1)), uint8(gen >> KnockReasonBits)
}

// EpochKind says whether a window's threshold counts bytes or operations
// (the values of rvma.EpochKind).
type EpochKind uint8

// Epoch kinds.
const (
	EpochBytes EpochKind = 1
	EpochOps   EpochKind = 2
)

// EntryState is the state of a window as its descriptor entry publishes it.
type EntryState uint8

// Entry states.
const (
	StateOpen         EntryState = 1
	StateClosedNack   EntryState = 2 // closed; puts fail with rvma.ErrMailboxClosed
	StateClosedSilent EntryState = 3 // closed; puts are dropped and counted
	// StateGone is the last entry of a window whose mailbox was freed
	// (its linger after Close ended, or a new window took the mailbox):
	// the sender must resolve the mailbox again.
	StateGone EntryState = 4
)

// String names the state.
func (s EntryState) String() string {
	switch s {
	case StateOpen:
		return "open"
	case StateClosedNack:
		return "closed (nack)"
	case StateClosedSilent:
		return "closed (silent)"
	case StateGone:
		return "gone"
	}
	return fmt.Sprintf("EntryState(%d)", uint8(s))
}

// Desc describes one posted buffer to senders: where the NIC writes (a
// type 1 memory window's address and rkey, or in a counted window the
// window's mailbox key at the generation's mailbox address), how long it
// is and the threshold of its epoch. It is library-internal: applications
// never see it.
type Desc struct {
	Addr      uint64
	RKey      uint32
	Len       uint32
	Threshold uint64
}

// MaxDescs is the number of descriptors an entry lists: the head and the
// six after it. A sender that fills epochs alone is pushed a new entry
// only when it is down to its last described generation (rvma's senderKeepsUp),
// so with MaxDescs+1 buffers posted it is pushed one entry per MaxDescs-1
// epochs; a counted window describes more (Entry.Through).
const MaxDescs = 7

// MaxThrough bounds the generations one entry describes (Entry.Through):
// far fewer than the 2^24 generations a mailbox address tells apart.
const MaxThrough = 1 << 16

// EntrySize is the length of an encoded Entry.
const EntrySize = 256

// Entry is one slot of a receiver's descriptor table, and what the
// receiver pushes into its subscribers' view slots.
type Entry struct {
	Seq         uint64 // even; bumped by 2 on every change
	Mailbox     uint64
	Incarnation uint32
	State       EntryState
	Kind        EpochKind
	NDesc       uint16 // valid descriptors in Descs, 0..MaxDescs
	Head        uint64 // the generation of Descs[0]
	Descs       [MaxDescs]Desc
	Flags       EntryFlags
	// Share is the window's rvma.WindowOptions.Share: what each sender puts
	// into every epoch (bytes or puts, as Kind counts), 0 if the window
	// makes no such promise.
	Share uint64
	// Through, when not 0, is the last generation the entry describes,
	// beyond its descriptors (a counted window, whose descriptors follow
	// from the generation): each generation after the last descriptor's
	// up to Through has a buffer of the last descriptor's length and
	// threshold, written with its key at the generation's mailbox address
	// (kmod.MailboxAddr). Through-Head is below MaxThrough.
	Through uint64
}

// EntryFlags tell senders how the receiver counts a window.
type EntryFlags uint8

// Entry flags.
const (
	// EntryCounted: the receiver's kernel module counts the bytes and
	// puts of this window as they are placed (docs/rvma.md, section 6), so
	// a put is a plain RDMA WRITE, without an immediate.
	EntryCounted EntryFlags = 1 << 0

	entryFlagsKnown = EntryCounted
)

// Desc returns the descriptor of generation gen and whether the entry has
// it.
func (e *Entry) Desc(gen uint64) (Desc, bool) {
	if gen < e.Head {
		return Desc{}, false
	}
	if gen-e.Head < uint64(e.NDesc) {
		return e.Descs[gen-e.Head], true
	}
	if e.Through == 0 || gen > e.Through || e.NDesc == 0 {
		return Desc{}, false
	}
	d := e.Descs[e.NDesc-1]
	d.Addr = MailboxAddr(gen)
	return d, true
}

// End is the generation after the last one the entry describes.
func (e *Entry) End() uint64 {
	if e.Through != 0 {
		return e.Through + 1
	}
	return e.Head + uint64(e.NDesc)
}

// checkThrough validates Through: it extends descriptors that end with a
// mailbox descriptor, by 1 to MaxThrough-NDesc generations.
func (e *Entry) checkThrough() error {
	if e.Through == 0 {
		return nil
	}
	last := e.Head + uint64(e.NDesc) - 1
	if e.NDesc == 0 || e.Through <= last || e.Through-e.Head >= MaxThrough ||
		e.Descs[e.NDesc-1].Addr != MailboxAddr(last) {
		return invalidf("entry through generation %d after %d descriptors from %d", e.Through, e.NDesc, e.Head)
	}
	return nil
}

// MailboxAddr is the remote address of generation gen's buffer in a
// window with a mailbox key: kmod.MailboxAddr at offset 0. A put adds its
// offset, which the buffer's length (below 4 GiB) keeps within the
// address's offset bits.
func MailboxAddr(gen uint64) uint64 {
	a, _ := kmod.MailboxAddr(gen, 0) // offset 0 always fits
	return a
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Entry layout offsets.
const (
	entSeq   = 0
	entMbox  = 8
	entInc   = 16
	entState = 20
	entKind  = 21
	entNDesc = 22
	entHead  = 24
	entDescs = 32  // MaxDescs × 24 bytes
	entFlags = 200 // EntryFlags
	entRsvd  = 201 // 7 reserved bytes, zero
	entShare = 208 // Share
	entThru  = 216 // Through
	entRsvd2 = 224 // 24 reserved bytes, zero
	entCRC   = 248
	entSeqLo = 252
	descSize = 24
)

// MarshalEntry encodes e into b (at least EntrySize bytes) as a stable
// entry: the checksum covers bytes 0..247 and the low half of Seq is
// repeated at the end. It fails with ErrInvalid for an odd Seq, too many
// descriptors or a short b.
func MarshalEntry(b []byte, e *Entry) error {
	if len(b) < EntrySize {
		return invalidf("entry buffer of %d bytes, need %d", len(b), EntrySize)
	}
	if e.Seq&1 != 0 {
		return invalidf("entry sequence %d is odd", e.Seq)
	}
	if e.NDesc > MaxDescs {
		return invalidf("entry with %d descriptors, at most %d", e.NDesc, MaxDescs)
	}
	if err := e.checkThrough(); err != nil {
		return err
	}
	le := binary.LittleEndian
	le.PutUint64(b[entSeq:], e.Seq)
	le.PutUint64(b[entMbox:], e.Mailbox)
	le.PutUint32(b[entInc:], e.Incarnation)
	b[entState] = byte(e.State)
	b[entKind] = byte(e.Kind)
	le.PutUint16(b[entNDesc:], e.NDesc)
	le.PutUint64(b[entHead:], e.Head)
	for i := 0; i < MaxDescs; i++ {
		putDesc(b[entDescs+i*descSize:], e.Descs[i])
	}
	if e.Flags&^entryFlagsKnown != 0 {
		return invalidf("entry flags %#x", uint8(e.Flags))
	}
	b[entFlags] = byte(e.Flags)
	clear(b[entRsvd:entShare])
	le.PutUint64(b[entShare:], e.Share)
	le.PutUint64(b[entThru:], e.Through)
	clear(b[entRsvd2:entCRC])
	le.PutUint32(b[entCRC:], crc32.Checksum(b[:entCRC], castagnoli))
	le.PutUint32(b[entSeqLo:], uint32(e.Seq))
	return nil
}

func putDesc(b []byte, d Desc) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], d.Addr)
	le.PutUint32(b[8:], d.RKey)
	le.PutUint32(b[12:], d.Len)
	le.PutUint64(b[16:], d.Threshold)
}

func getDesc(b []byte) Desc {
	le := binary.LittleEndian
	return Desc{Addr: le.Uint64(b[0:]), RKey: le.Uint32(b[8:]), Len: le.Uint32(b[12:]), Threshold: le.Uint64(b[16:])}
}

// ErrTorn is wrapped (with ErrInvalid) by UnmarshalEntry for an entry that
// is being written or was read torn: read it again.
var ErrTorn = fmt.Errorf("%w: entry torn or being written", ErrInvalid)

// UnmarshalEntry decodes an entry read from a descriptor table or a view
// slot. It fails with ErrTorn when the entry is being written or was read
// while it changed (odd sequence, sequence halves that differ, or a
// checksum mismatch: RDMA gives no atomicity beyond a byte, so the checksum
// is what detects a torn read whatever order the NIC read the bytes in),
// and with ErrInvalid for a short buffer or fields out of range.
func UnmarshalEntry(b []byte) (Entry, error) {
	var e Entry
	if len(b) < EntrySize {
		return e, invalidf("entry of %d bytes, need %d", len(b), EntrySize)
	}
	le := binary.LittleEndian
	e.Seq = le.Uint64(b[entSeq:])
	if e.Seq&1 != 0 || uint32(e.Seq) != le.Uint32(b[entSeqLo:]) ||
		le.Uint32(b[entCRC:]) != crc32.Checksum(b[:entCRC], castagnoli) {
		return e, ErrTorn
	}
	e.Mailbox = le.Uint64(b[entMbox:])
	e.Incarnation = le.Uint32(b[entInc:])
	e.State = EntryState(b[entState])
	e.Kind = EpochKind(b[entKind])
	e.NDesc = le.Uint16(b[entNDesc:])
	e.Head = le.Uint64(b[entHead:])
	e.Flags = EntryFlags(b[entFlags])
	e.Share = le.Uint64(b[entShare:])
	e.Through = le.Uint64(b[entThru:])
	if e.Seq == 0 {
		return e, invalidf("entry never written")
	}
	if e.State < StateOpen || e.State > StateGone {
		return e, invalidf("entry state %d", e.State)
	}
	if e.Kind != EpochBytes && e.Kind != EpochOps {
		return e, invalidf("entry epoch kind %d", e.Kind)
	}
	if e.NDesc > MaxDescs {
		return e, invalidf("entry with %d descriptors", e.NDesc)
	}
	for i := 0; i < MaxDescs; i++ {
		e.Descs[i] = getDesc(b[entDescs+i*descSize:])
	}
	if e.Flags&^entryFlagsKnown != 0 {
		return e, invalidf("entry flags %#x", uint8(e.Flags))
	}
	if !zero(b[entRsvd:entShare]) || !zero(b[entRsvd2:entCRC]) {
		return e, invalidf("entry with reserved bytes set")
	}
	if err := e.checkThrough(); err != nil {
		return e, err
	}
	return e, nil
}

// zero reports whether every byte of b is 0.
func zero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// CtrlType is the type of a control message.
type CtrlType uint8

// Control message types.
const (
	CtrlResolve  CtrlType = 1 // sender → receiver: Mailbox, ViewSlot
	CtrlResolved CtrlType = 2 // receiver → sender: Slot, Incarnation (Seq echoes the request)
	CtrlNack     CtrlType = 3 // receiver → sender: Reason (Seq echoes a RESOLVE or a GET)
	// Type 4 is reserved (EAGERACK of the eager path, not built).
	CtrlGet      CtrlType = 5 // sender → receiver: Slot, Incarnation, Epoch (Seq has GetSeqBit)
	CtrlGetReply CtrlType = 6 // receiver → sender: Epoch, Addr, RKey, Len of a kept buffer, read-only (Seq echoes the request)
	CtrlLate     CtrlType = 7 // receiver → sender: ViewSlot, Slot, Epoch, Count, Len, Stale of puts that arrived late
	CtrlRefused  CtrlType = 8 // sender → receiver: Slot, Incarnation, Count, Len of puts the receiver's kernel module refused as stale
)

// GetSeqBit marks the Seq of a GET and of the NACK answering it, so that a
// sender tells them from the answers to its RESOLVEs (whose Seq is a view
// slot, below 2^20).
const GetSeqBit = 1 << 31

// String names the type.
func (t CtrlType) String() string {
	switch t {
	case CtrlResolve:
		return "RESOLVE"
	case CtrlResolved:
		return "RESOLVED"
	case CtrlNack:
		return "NACK"
	case CtrlGet:
		return "GET"
	case CtrlGetReply:
		return "GETREPLY"
	case CtrlLate:
		return "LATE"
	case CtrlRefused:
		return "REFUSED"
	}
	return fmt.Sprintf("CtrlType(%d)", uint8(t))
}

// NackReason says why a receiver refused a RESOLVE or a GET.
type NackReason uint8

// NACK reasons.
const (
	NackNoMailbox NackReason = 1
	NackClosed    NackReason = 2
	NackStale     NackReason = 3
	NackTooLarge  NackReason = 4
	NackNoBuffer  NackReason = 5
)

// Ctrl is a control message. Which fields are meaningful depends on Type.
type Ctrl struct {
	Type        CtrlType
	Seq         uint32
	Mailbox     uint64     // RESOLVE
	ViewSlot    uint32     // RESOLVE, LATE (the sender's view slot of the window)
	Slot        uint32     // RESOLVED, GET, LATE, REFUSED
	Incarnation uint32     // RESOLVED, GET, REFUSED
	Reason      NackReason // NACK
	Epoch       uint64     // GET (rvma.LastEpoch, all ones: the newest kept), GETREPLY, LATE
	Addr        uint64     // GETREPLY: the read-only memory window's address
	RKey        uint32     // GETREPLY: its key
	Len         uint32     // GETREPLY: the epoch's length (bytes placed; the window's length); LATE, REFUSED: the puts' bytes
	Count       uint16     // LATE, REFUSED: the puts reported (at least 1)
	Stale       bool       // LATE: the epoch had been handed over already (a GuardNone window), not only reached its threshold
}

const ctrlHeader = 8

func ctrlLen(t CtrlType) int {
	switch t {
	case CtrlResolve:
		return ctrlHeader + 12
	case CtrlResolved:
		return ctrlHeader + 8
	case CtrlNack:
		return ctrlHeader + 4
	case CtrlGet, CtrlRefused:
		return ctrlHeader + 16
	case CtrlGetReply, CtrlLate:
		return ctrlHeader + 24
	}
	return -1
}

// MaxCtrlSize is the length of the longest control message.
const MaxCtrlSize = ctrlHeader + 24

// AppendCtrl appends the encoding of m to b. It fails with ErrInvalid for
// an unknown type or a field out of range.
func AppendCtrl(b []byte, m Ctrl) ([]byte, error) {
	n := ctrlLen(m.Type)
	if n < 0 {
		return b, invalidf("control message type %d", m.Type)
	}
	if m.Type == CtrlResolve && m.ViewSlot > SlotMask {
		return b, invalidf("view slot %d out of range", m.ViewSlot)
	}
	if (m.Type == CtrlResolved || m.Type == CtrlGet || m.Type == CtrlLate || m.Type == CtrlRefused) && m.Slot > SlotMask {
		return b, invalidf("slot %d out of range", m.Slot)
	}
	if m.Type == CtrlRefused && m.Count == 0 {
		return b, invalidf("REFUSED with no puts")
	}
	if m.Type == CtrlLate && (m.ViewSlot > SlotMask || m.Count == 0) {
		return b, invalidf("LATE for view slot %d with %d puts", m.ViewSlot, m.Count)
	}
	if m.Type == CtrlNack {
		if m.Reason < NackNoMailbox || m.Reason > NackNoBuffer {
			return b, invalidf("NACK reason %d", m.Reason)
		}
	}
	out := make([]byte, n)
	le := binary.LittleEndian
	out[0] = byte(m.Type)
	le.PutUint32(out[4:], m.Seq)
	switch m.Type {
	case CtrlResolve:
		le.PutUint64(out[8:], m.Mailbox)
		le.PutUint32(out[16:], m.ViewSlot)
	case CtrlResolved:
		le.PutUint32(out[8:], m.Slot)
		le.PutUint32(out[12:], m.Incarnation)
	case CtrlNack:
		out[8] = byte(m.Reason)
	case CtrlGet:
		le.PutUint32(out[8:], m.Slot)
		le.PutUint32(out[12:], m.Incarnation)
		le.PutUint64(out[16:], m.Epoch)
	case CtrlGetReply:
		le.PutUint64(out[8:], m.Epoch)
		le.PutUint64(out[16:], m.Addr)
		le.PutUint32(out[24:], m.RKey)
		le.PutUint32(out[28:], m.Len)
	case CtrlLate:
		le.PutUint32(out[8:], m.ViewSlot)
		le.PutUint32(out[12:], m.Slot)
		le.PutUint64(out[16:], m.Epoch)
		le.PutUint32(out[24:], m.Len)
		if m.Stale {
			out[28] = 1
		}
		le.PutUint16(out[30:], m.Count)
	case CtrlRefused:
		le.PutUint32(out[8:], m.Slot)
		le.PutUint32(out[12:], m.Incarnation)
		le.PutUint32(out[16:], m.Len)
		le.PutUint16(out[20:], m.Count)
	}
	return append(b, out...), nil
}

// ParseCtrl decodes a control message. It fails with ErrInvalid for an
// unknown type, a length that does not match the type, non-zero reserved
// bytes or fields out of range.
func ParseCtrl(b []byte) (Ctrl, error) {
	if len(b) < ctrlHeader {
		return Ctrl{}, invalidf("control message of %d bytes", len(b))
	}
	m := Ctrl{Type: CtrlType(b[0])}
	n := ctrlLen(m.Type)
	if n < 0 {
		return Ctrl{}, invalidf("control message type %d", b[0])
	}
	if len(b) != n {
		return Ctrl{}, invalidf("%v of %d bytes, want %d", m.Type, len(b), n)
	}
	if b[1]|b[2]|b[3] != 0 {
		return Ctrl{}, invalidf("%v with reserved bytes set", m.Type)
	}
	le := binary.LittleEndian
	m.Seq = le.Uint32(b[4:])
	switch m.Type {
	case CtrlResolve:
		m.Mailbox = le.Uint64(b[8:])
		m.ViewSlot = le.Uint32(b[16:])
		if m.ViewSlot > SlotMask {
			return Ctrl{}, invalidf("RESOLVE view slot %d out of range", m.ViewSlot)
		}
	case CtrlResolved:
		m.Slot = le.Uint32(b[8:])
		m.Incarnation = le.Uint32(b[12:])
		if m.Slot > SlotMask {
			return Ctrl{}, invalidf("RESOLVED slot %d out of range", m.Slot)
		}
	case CtrlNack:
		m.Reason = NackReason(b[8])
		if m.Reason < NackNoMailbox || m.Reason > NackNoBuffer || b[9]|b[10]|b[11] != 0 {
			return Ctrl{}, invalidf("NACK reason %d", b[8])
		}
	case CtrlGet:
		m.Slot = le.Uint32(b[8:])
		m.Incarnation = le.Uint32(b[12:])
		m.Epoch = le.Uint64(b[16:])
		if m.Slot > SlotMask {
			return Ctrl{}, invalidf("GET slot %d out of range", m.Slot)
		}
	case CtrlGetReply:
		m.Epoch = le.Uint64(b[8:])
		m.Addr = le.Uint64(b[16:])
		m.RKey = le.Uint32(b[24:])
		m.Len = le.Uint32(b[28:])
	case CtrlLate:
		m.ViewSlot = le.Uint32(b[8:])
		m.Slot = le.Uint32(b[12:])
		m.Epoch = le.Uint64(b[16:])
		m.Len = le.Uint32(b[24:])
		m.Stale = b[28] == 1
		m.Count = le.Uint16(b[30:])
		if m.ViewSlot > SlotMask || m.Slot > SlotMask || b[28] > 1 || b[29] != 0 || m.Count == 0 {
			return Ctrl{}, invalidf("LATE with a slot out of range, no puts or reserved bits set")
		}
	case CtrlRefused:
		m.Slot = le.Uint32(b[8:])
		m.Incarnation = le.Uint32(b[12:])
		m.Len = le.Uint32(b[16:])
		m.Count = le.Uint16(b[20:])
		if m.Slot > SlotMask || m.Count == 0 || b[22]|b[23] != 0 {
			return Ctrl{}, invalidf("REFUSED with a slot out of range, no puts or reserved bits set")
		}
	}
	return m, nil
}
