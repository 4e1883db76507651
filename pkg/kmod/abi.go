package kmod

import "unsafe"

// Mirrors of kmod/include/uapi/rdmaplus.h; abi_test.go checks the sizes and
// the ioctl numbers against the header.

const (
	iocMagic = 0xb7

	iocNone  = 0
	iocWrite = 1
	iocRead  = 2

	versionFlagAA   = 1
	versionFlagRVMA = 2
	versionFlagJBMT = 4
	notifyAdaptive  = 1
	opPad           = 1

	rvmaEndAll    = 1 << 16
	rvmaPostKeyed = 1 << 17
	rvmaQPForget  = 1
	rvmaWinMBKey  = 1
)

func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | iocMagic<<8 | nr
}

type rawVersion struct {
	ABI     uint32
	Flags   uint32
	Release [32]byte
}

type rawCreate struct {
	Size       uint32
	Flags      uint32
	LogSize    uint64
	Domain     uint32
	Reserved   uint32
	MmapOffset uint64
	MmapSize   uint64
}

type rawDomain struct {
	Size   uint32
	Domain uint32
}

type rawNotify struct {
	Size       uint32
	Domain     uint32
	Eventfd    int32
	Threshold  uint32
	IntervalUS uint32
	Flags      uint32
}

type rawArm struct {
	Size   uint32
	Domain uint32
	Key    uint32
	Bits   uint32
	IOVA   uint64
	Length uint64
}

type rawStats struct {
	Size           uint32
	HooksArmed     uint32
	Domains        uint64
	MRs            uint64
	Pages          uint64
	Entries        uint64
	Bytes          uint64
	DataBytes      uint64
	Writes         uint64
	Reads          uint64
	Atomics        uint64
	HiddenWrites   uint64
	ZeroedReads    uint64
	RefusedWrites  uint64
	RefusedAtomics uint64
	LostReads      uint64
	Missed         uint64
}

type rawEntry struct {
	Len     uint32
	Op      uint16
	Flags   uint16
	Seq     uint64
	IOVA    uint64
	Length  uint32
	DataLen uint32
	Domain  uint32
	Key     uint32
	QPN     uint32
	SrcQPN  uint32
	TimeNS  uint64
	Value   uint64
}

type rawRVMASetup struct {
	Size       uint32
	Flags      uint32
	Windows    uint32
	Records    uint32
	Eventfd    int32
	Reserved   uint32
	MmapOffset uint64
	MmapSize   uint64
}

type rawWindowState struct {
	Done    uint64
	Refused uint64
}

type rawRVMAWin struct {
	Size     uint32
	Kind     uint32
	ID       uint32
	Flags    uint32
	MBKey    uint32
	Reserved uint32
}

type rawRVMAWinDestroy struct {
	Size uint32
	ID   uint32
}

type rawRVMAPost struct {
	Size      uint32
	Win       uint32
	Key       uint32
	Flags     uint32
	IOVA      uint64
	Length    uint64
	Threshold uint64
	Gen       uint64
	Record    uint32
	RKey      uint32
}

type rawRVMAPostV struct {
	Size     uint32
	Count    uint32
	Posts    uint64
	Done     uint32
	Reserved uint32
}

type rawRVMAGuard struct {
	Size uint32
	Key  uint32
}

type rawRVMAQP struct {
	Size     uint32
	QPN      uint32
	Flags    uint32
	Reserved uint32
}

type rawRVMAEnd struct {
	Size     uint32
	Win      uint32
	Flags    uint32
	Reserved uint32
	Gen      uint64
}

// Offsets in struct rdmaplus_aa_ring.
const (
	offHead    = 0
	offHeadSeq = 8
	offRefused = 16
	offLost    = 24
	offTail    = 64
)

var (
	iocVersion        = ioc(iocRead, 0x00, unsafe.Sizeof(rawVersion{}))
	iocDomainCreate   = ioc(iocRead|iocWrite, 0x10, unsafe.Sizeof(rawCreate{}))
	iocDomainDestroy  = ioc(iocWrite, 0x11, unsafe.Sizeof(rawDomain{}))
	iocNotify         = ioc(iocWrite, 0x12, unsafe.Sizeof(rawNotify{}))
	iocArm            = ioc(iocWrite, 0x13, unsafe.Sizeof(rawArm{}))
	iocDisarm         = ioc(iocWrite, 0x14, unsafe.Sizeof(rawArm{}))
	iocStats          = ioc(iocRead|iocWrite, 0x15, unsafe.Sizeof(rawStats{}))
	iocRVMASetup      = ioc(iocRead|iocWrite, 0x20, unsafe.Sizeof(rawRVMASetup{}))
	iocRVMAWinCreate  = ioc(iocRead|iocWrite, 0x21, unsafe.Sizeof(rawRVMAWin{}))
	iocRVMAWinDestroy = ioc(iocWrite, 0x22, unsafe.Sizeof(rawRVMAWinDestroy{}))
	iocRVMAPost       = ioc(iocWrite, 0x23, unsafe.Sizeof(rawRVMAPost{}))
	iocRVMAEnd        = ioc(iocWrite, 0x24, unsafe.Sizeof(rawRVMAEnd{}))
	iocRVMAArm        = ioc(iocNone, 0x25, 0)
	iocRVMAPostV      = ioc(iocRead|iocWrite, 0x26, unsafe.Sizeof(rawRVMAPostV{}))
	iocRVMAQP         = ioc(iocWrite, 0x27, unsafe.Sizeof(rawRVMAQP{}))
	iocRVMAGuard      = ioc(iocWrite, 0x28, unsafe.Sizeof(rawRVMAGuard{}))
	iocJBMTReg        = ioc(iocRead|iocWrite, 0x30, unsafe.Sizeof(rawJBMTReg{}))
	iocJBMTDereg      = ioc(iocWrite, 0x31, unsafe.Sizeof(rawJBMTDereg{}))
	iocJBMTConnect    = ioc(iocRead|iocWrite, 0x32, unsafe.Sizeof(rawJBMTConnect{}))
	iocJBMTOp         = ioc(iocRead|iocWrite, 0x33, unsafe.Sizeof(rawJBMTOp{}))
	iocJBMTSetup      = ioc(iocRead|iocWrite, 0x34, unsafe.Sizeof(rawJBMTSetup{}))
	iocJBMTSubmit     = ioc(iocRead|iocWrite, 0x35, unsafe.Sizeof(rawJBMTSubmit{}))
	iocJBMTAdvise     = ioc(iocRead|iocWrite, 0x36, unsafe.Sizeof(rawJBMTAdvise{}))
)

type rawJBMTAdvise struct {
	Size     uint32
	Flags    uint32
	Rights   uint32
	Reserved uint32
	Addr     uint64
	Length   uint64
	Token    JBMTToken
	Done     uint64
}

const jbmtAdviseRegion uint32 = 1 << 0

type rawJBMTOp struct {
	Size      uint32
	Op        uint32
	Peer      uint32
	TimeoutMS uint32
	Addr      uint64
	Length    uint64
	Token     JBMTToken
	Offset    uint64
	Done      uint64
}

type rawJBMTConnect struct {
	Size      uint32
	Flags     uint32
	Addr      [4]byte // network byte order
	Port      [2]byte // network byte order
	Reserved  uint16
	TimeoutMS uint32
	Peer      uint32
}

type rawJBMTReg struct {
	Size   uint32
	Rights uint32
	Addr   uint64
	Length uint64
	Token  JBMTToken
}

type rawJBMTDereg struct {
	Size     uint32
	Reserved uint32
	Token    JBMTToken
}
