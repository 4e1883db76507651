package sockwire

import "math"

// The control block (struct sockproto_ctrl): one per side, written by the
// peer with 8-byte aligned RDMA WRITEs; values only grow.
const (
	CtrlSize       = 64
	CtrlCreditOff  = 0  // the peer consumed this much of my stream
	CtrlBlockedOff = 8  // the peer's stream is blocked for credits at this offset
	CtrlEpochOff   = 16 // the attachment the values belong to
)

// Ctrl is a decoded control block.
type Ctrl struct {
	Credit  uint64
	Blocked uint64
	Epoch   uint32
}

// AppendCtrl appends the 64 bytes of c.
func AppendCtrl(dst []byte, c Ctrl) []byte {
	dst = le.AppendUint64(dst, c.Credit)
	dst = le.AppendUint64(dst, c.Blocked)
	dst = le.AppendUint32(dst, c.Epoch)
	return append(dst, make([]byte, CtrlSize-20)...)
}

// DecodeCtrl reads a control block. It fails with an *Error of KindShort
// below CtrlSize bytes and of KindReserved when reserved bytes are set
// (memory someone else wrote into).
func DecodeCtrl(b []byte) (Ctrl, error) {
	if len(b) < CtrlSize {
		return Ctrl{}, errf(KindShort, 0, "control block of %d bytes", len(b))
	}
	if !zero(b[20:CtrlSize]) {
		return Ctrl{}, errf(KindReserved, 0, "control block padding")
	}
	return Ctrl{Credit: le.Uint64(b), Blocked: le.Uint64(b[8:]), Epoch: le.Uint32(b[16:])}, nil
}

// The header of a receive ring in the shared memfd (struct sockproto_ring).
const (
	RingMagic      = 0x52534f4b // SOCKPROTO_RING_MAGIC
	RingHeaderSize = 64
	NoFin          = math.MaxUint64 // SOCKPROTO_NO_FIN
)

// RingHeader is a decoded ring header. The byte at stream offset o is the
// ring's data[o & (1<<Log2Size - 1)].
type RingHeader struct {
	Log2Size uint8
	Epoch    uint32
	Base     uint64 // the sender's SWITCH offset: the ring's first byte
	Prod     uint64 // data arrived up to here
	Cons     uint64 // the program consumed up to here
	Fin      uint64 // the FIN offset, NoFin before FIN
	Credited uint64 // the last Cons written to the sender
}

// AppendRingHeader appends the 64 bytes of h.
func AppendRingHeader(dst []byte, h RingHeader) []byte {
	dst = le.AppendUint32(dst, RingMagic)
	dst = le.AppendUint16(dst, Version)
	dst = append(dst, h.Log2Size, 0)
	dst = le.AppendUint32(dst, h.Epoch)
	dst = le.AppendUint32(dst, 0)
	for _, v := range [...]uint64{h.Base, h.Prod, h.Cons, h.Fin, h.Credited, 0} {
		dst = le.AppendUint64(dst, v)
	}
	return dst
}

// DecodeRingHeader reads a ring header. It fails with an *Error:
// KindShort, KindMagic, KindVersion, KindReserved, or KindField for a
// size out of RingLog2Min..RingLog2Max or offsets out of order
// (Base <= Cons <= Prod, Credited <= Cons, Fin >= Prod unless NoFin).
func DecodeRingHeader(b []byte) (RingHeader, error) {
	if len(b) < RingHeaderSize {
		return RingHeader{}, errf(KindShort, 0, "ring header of %d bytes", len(b))
	}
	if m := le.Uint32(b); m != RingMagic {
		return RingHeader{}, errf(KindMagic, 0, "ring magic %#x", m)
	}
	if v := le.Uint16(b[4:]); v != Version {
		return RingHeader{}, errf(KindVersion, 0, "ring version %d", v)
	}
	if b[7] != 0 || le.Uint32(b[12:]) != 0 || !zero(b[56:64]) {
		return RingHeader{}, errf(KindReserved, 0, "ring header")
	}
	h := RingHeader{Log2Size: b[6], Epoch: le.Uint32(b[8:]), Base: le.Uint64(b[16:]),
		Prod: le.Uint64(b[24:]), Cons: le.Uint64(b[32:]), Fin: le.Uint64(b[40:]),
		Credited: le.Uint64(b[48:])}
	if h.Log2Size < RingLog2Min || h.Log2Size > RingLog2Max {
		return RingHeader{}, errf(KindField, 0, "ring log2 %d", h.Log2Size)
	}
	if h.Base > h.Cons || h.Cons > h.Prod || h.Credited > h.Cons ||
		h.Prod-h.Cons > 1<<h.Log2Size || (h.Fin != NoFin && h.Fin < h.Prod) {
		return RingHeader{}, errf(KindField, 0, "ring offsets base %d cons %d prod %d credited %d fin %d",
			h.Base, h.Cons, h.Prod, h.Credited, h.Fin)
	}
	return h, nil
}

// Immediate data of a WRITE_WITH_IMM (SOCKPROTO_IMM): the type in the top
// 4 bits, the length below. Verbs carries it in network order. ImmData:
// bytes written into the target's ring; ImmCtrl: an 8-byte field of the
// target's control block written (length 8).
const (
	ImmData   = 1
	ImmCtrl   = 2
	ImmLenMax = 0x0fffffff
)

// Imm is the immediate of a ring write of n bytes; n above ImmLenMax is
// the caller's bug (split the write) and is masked as the C macro does.
func Imm(typ uint32, n uint32) uint32 { return typ<<28 | n&ImmLenMax }

// ImmType is the type of an immediate.
func ImmType(imm uint32) uint32 { return imm >> 28 }

// ImmLen is the length of an immediate.
func ImmLen(imm uint32) uint32 { return imm & ImmLenMax }

// The statistics segment (struct sockproto_stats and its slots): a
// process's counters and a table of its attachable connections, in a
// sealed memfd the process writes and rvmad maps read-only. Counters are
// host-order 64-bit words that only grow (Live is a gauge); a slot's
// tuple is in wire order. The parser is rvmad's
// (cmd/rvmad/internal/sockets, segment.go); these are the offsets.
const (
	StatsMagic    = 0x54535352 // SOCKPROTO_STATS_MAGIC
	StatsVersion  = 1          // SOCKPROTO_STATS_VERSION
	StatsReasons  = 32         // entries of the by-reason arrays
	StatsSlotsMax = 65536
	StatsHdrSize  = 768 // sizeof(struct sockproto_stats): the first slot
	StatsSlotSize = 96  // sizeof(struct sockproto_stats_slot)
	StatsMin      = StatsHdrSize + StatsSlotSize
	StatsMax      = StatsHdrSize + StatsSlotsMax*StatsSlotSize

	// Header fields.
	StatsMagicOff    = 0  // u32
	StatsVersionOff  = 4  // u16
	StatsHdrSizeOff  = 6  // u16
	StatsSlotSizeOff = 8  // u32
	StatsNSlotsOff   = 12 // u32
	StatsUsedOff     = 16 // u32: slots [0, used) may be in use
	StatsPIDOff      = 20 // u32, informative
	StatsCountersOff = 64 // struct sockproto_stats_counters

	// Counters, from StatsCountersOff (u64 each).
	StatsConnsOff       = 0 // [8], by role; StatsClient, StatsServer, StatsAdopted
	StatsConnectFailOff = 64
	StatsInheritedOff   = 72
	StatsLiveOff        = 80
	StatsBytesInOff     = 88
	StatsBytesOutOff    = 96
	StatsRDMAInOff      = 104
	StatsRDMAOutOff     = 112
	StatsRDMAWritesOff  = 120
	StatsAttachableOff  = 128
	StatsAttachedOff    = 136
	StatsDemotedOff     = 144
	StatsFDPassedOff    = 152
	StatsFdopenOff      = 160
	StatsSpliceOff      = 168
	StatsExecsOff       = 176
	StatsSpawnsOff      = 184
	StatsDemotesOff     = 192 // [StatsReasons], by Reason
	StatsFallbacksOff   = 448 // [StatsReasons], by Reason
	StatsCountersSize   = 704

	// Roles, indices of the conns counters.
	StatsClient  = 3
	StatsServer  = 4
	StatsAdopted = 5

	// Slot fields.
	SlotGenOff        = 0 // u32: odd while filled for a new connection
	SlotStateOff      = 4 // u8: SlotFree ... SlotClosing
	SlotPathOff       = 5 // u8: 0 tcp, 1 rdma
	SlotReasonOff     = 6 // u16: the last demote's or fallback's Reason
	SlotEpochOff      = 8 // u32
	SlotFDOff         = 12
	SlotTupleOff      = 16 // 40 bytes, as in records
	SlotBytesInOff    = 56
	SlotBytesOutOff   = 64
	SlotRDMAInOff     = 72
	SlotRDMAOutOff    = 80
	SlotRDMAWritesOff = 88

	// Slot states (enum sockproto_stats_state).
	SlotFree      = 0
	SlotTCP       = 1
	SlotAttaching = 2
	SlotAttached  = 3
	SlotDemoting  = 4
	SlotClosing   = 5
	SlotStateMax  = 5
)

// DecodeTuple reads a tuple of 40 bytes in wire order (as in a record or
// a statistics slot). It fails with an *Error of KindShort, KindReserved
// (padding) or KindField (family).
func DecodeTuple(b []byte) (Tuple, error) {
	if len(b) < 40 {
		return Tuple{}, errf(KindShort, 0, "tuple of %d bytes", len(b))
	}
	return decodeTuple(b, 0)
}
