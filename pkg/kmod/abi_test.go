package kmod

import (
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/rdmaplus/rdmaplus/pkg/kmod/internal/uapi"
)

// The Go mirrors must match the C header byte for byte.
func TestABIMatchesHeader(t *testing.T) {
	eq := func(name string, got, want uintptr) {
		t.Helper()
		if got != want {
			t.Errorf("%s: Go %d (%#x), header %d (%#x)", name, got, got, want, want)
		}
	}
	if uapi.ABIVersion != ABIVersion {
		t.Errorf("ABI: Go %d, header %d", ABIVersion, uapi.ABIVersion)
	}
	if uapi.MaxDomains != MaxDomains || uapi.Bits != 0x3f {
		t.Errorf("limits: %d domains, bits %#x", uapi.MaxDomains, uapi.Bits)
	}
	if uapi.Adaptive != notifyAdaptive || uint64(uapi.IntervalMax) != uint64(time.Hour/time.Microsecond) {
		t.Errorf("notify: adaptive flag %#x, interval max %d µs", uapi.Adaptive, uapi.IntervalMax)
	}
	eq("sizeof version", unsafe.Sizeof(rawVersion{}), uapi.SizeVersion)
	eq("sizeof create", unsafe.Sizeof(rawCreate{}), uapi.SizeCreate)
	eq("sizeof domain", unsafe.Sizeof(rawDomain{}), uapi.SizeDomain)
	eq("sizeof notify", unsafe.Sizeof(rawNotify{}), uapi.SizeNotify)
	eq("sizeof arm", unsafe.Sizeof(rawArm{}), uapi.SizeArm)
	eq("sizeof stats", unsafe.Sizeof(rawStats{}), uapi.SizeStats)
	eq("sizeof entry", unsafe.Sizeof(rawEntry{}), uapi.SizeEntry)
	eq("entry header", EntryHeader, uapi.SizeEntry)
	eq("ioc version", iocVersion, uapi.IocVersion)
	eq("ioc create", iocDomainCreate, uapi.IocCreate)
	eq("ioc destroy", iocDomainDestroy, uapi.IocDestroy)
	eq("ioc notify", iocNotify, uapi.IocNotify)
	eq("ioc arm", iocArm, uapi.IocArm)
	eq("ioc disarm", iocDisarm, uapi.IocDisarm)
	eq("ioc stats", iocStats, uapi.IocStats)
	eq("ring head", offHead, uapi.OffHead)
	eq("ring head_seq", offHeadSeq, uapi.OffHeadSeq)
	eq("ring refused", offRefused, uapi.OffRefused)
	eq("ring lost", offLost, uapi.OffLost)
	eq("ring tail", offTail, uapi.OffTail)
	eq("entry data_len", unsafe.Offsetof(rawEntry{}.DataLen), uapi.EntryDataLen)

	// Counted mailboxes.
	if uapi.VersionFlagAA != versionFlagAA || uapi.VersionFlagRVMA != versionFlagRVMA {
		t.Errorf("version flags: AA %#x, RVMA %#x", uapi.VersionFlagAA, uapi.VersionFlagRVMA)
	}
	if uapi.RVMAMaxWindows != MaxWindows || uapi.RVMAMaxRecords != MaxRecords ||
		uapi.RVMARecordSize != RecordSize || uapi.RVMAMaxLength != MaxMailboxLength {
		t.Errorf("mailbox limits: %d windows, %d records, %d-byte records, %d bytes",
			uapi.RVMAMaxWindows, uapi.RVMAMaxRecords, uapi.RVMARecordSize, uapi.RVMAMaxLength)
	}
	if uapi.RVMABytes != uint32(CountBytes) || uapi.RVMAOps != uint32(CountOps) {
		t.Errorf("window kinds: bytes %d, ops %d", uapi.RVMABytes, uapi.RVMAOps)
	}
	if uapi.RVMARecPartial != uint32(RecordPartial) || uapi.RVMARecClosed != uint32(RecordClosed) ||
		uapi.RVMARecLate != uint32(RecordLate) || uapi.RVMARecOneTime != uint32(RecordOneTime) ||
		uapi.RVMAEndAll != rvmaEndAll || uapi.RVMAPostKeyed != rvmaPostKeyed {
		t.Errorf("record flags: %#x %#x %#x %#x, end all %#x", uapi.RVMARecPartial, uapi.RVMARecClosed,
			uapi.RVMARecLate, uapi.RVMARecOneTime, uapi.RVMAEndAll)
	}
	// pkg/rvma's Flags: partial, closed, late, one-time are 1, 2, 4, 8.
	if RecordPartial != 1 || RecordClosed != 2 || RecordLate != 4 || RecordOneTime != 8 {
		t.Errorf("record flags differ from pkg/rvma's")
	}
	if uapi.RVMARecWords != [8]int{0, 1, 2, 3, 4, 5, 6, 7} {
		t.Errorf("record words %v", uapi.RVMARecWords)
	}
	eq("sizeof rvma setup", unsafe.Sizeof(rawRVMASetup{}), uapi.SizeRVMASetup)
	eq("sizeof window state", unsafe.Sizeof(rawWindowState{}), uapi.SizeWindowState)
	eq("sizeof rvma win", unsafe.Sizeof(rawRVMAWin{}), uapi.SizeRVMAWin)
	eq("sizeof rvma win destroy", unsafe.Sizeof(rawRVMAWinDestroy{}), uapi.SizeRVMAWinDestroy)
	eq("sizeof rvma post", unsafe.Sizeof(rawRVMAPost{}), uapi.SizeRVMAPost)
	eq("sizeof rvma end", unsafe.Sizeof(rawRVMAEnd{}), uapi.SizeRVMAEnd)
	eq("rvma post rkey", unsafe.Offsetof(rawRVMAPost{}.RKey), uapi.RVMAPostRKey)
	eq("ioc rvma setup", iocRVMASetup, uapi.IocRVMASetup)
	eq("ioc rvma win create", iocRVMAWinCreate, uapi.IocRVMAWinCreate)
	eq("ioc rvma win destroy", iocRVMAWinDestroy, uapi.IocRVMAWinDestroy)
	eq("ioc rvma post", iocRVMAPost, uapi.IocRVMAPost)
	eq("ioc rvma end", iocRVMAEnd, uapi.IocRVMAEnd)
	eq("ioc rvma arm", iocRVMAArm, uapi.IocRVMAArm)
	eq("sizeof rvma postv", unsafe.Sizeof(rawRVMAPostV{}), uapi.SizeRVMAPostV)
	eq("ioc rvma postv", iocRVMAPostV, uapi.IocRVMAPostV)
	eq("max postv", uintptr(MaxPostMany), uintptr(uapi.RVMAMaxPostV))
	eq("sizeof rvma qp", unsafe.Sizeof(rawRVMAQP{}), uapi.SizeRVMAQP)
	eq("ioc rvma qp", iocRVMAQP, uapi.IocRVMAQP)
	eq("qp forget", uintptr(rvmaQPForget), uintptr(uapi.RVMAQPForget))
	eq("max named qps", uintptr(MaxNamedQPs), uintptr(uapi.RVMAMaxQPs))
	eq("sizeof rvma guard", unsafe.Sizeof(rawRVMAGuard{}), uapi.SizeRVMAGuard)
	eq("ioc rvma guard", iocRVMAGuard, uapi.IocRVMAGuard)
	eq("version flag jbmt", uintptr(versionFlagJBMT), uintptr(uapi.VersionFlagJBMT))
	eq("jbmt read", uintptr(JBMTRead), uintptr(uapi.JBMTRead))
	eq("jbmt write", uintptr(JBMTWrite), uintptr(uapi.JBMTWrite))
	eq("jbmt max id", uintptr(JBMTMaxID), uintptr(uapi.JBMTMaxID))
	eq("sizeof jbmt reg", unsafe.Sizeof(rawJBMTReg{}), uapi.SizeJBMTReg)
	eq("sizeof jbmt dereg", unsafe.Sizeof(rawJBMTDereg{}), uapi.SizeJBMTDereg)
	eq("ioc jbmt reg", iocJBMTReg, uapi.IocJBMTReg)
	eq("ioc jbmt dereg", iocJBMTDereg, uapi.IocJBMTDereg)
	eq("sizeof jbmt connect", unsafe.Sizeof(rawJBMTConnect{}), uapi.SizeJBMTConnect)
	eq("ioc jbmt connect", iocJBMTConnect, uapi.IocJBMTConnect)
	eq("sizeof jbmt op", unsafe.Sizeof(rawJBMTOp{}), uapi.SizeJBMTOp)
	eq("ioc jbmt op", iocJBMTOp, uapi.IocJBMTOp)
	eq("sizeof jbmt advise", unsafe.Sizeof(rawJBMTAdvise{}), uapi.SizeJBMTAdvise)
	eq("ioc jbmt advise", iocJBMTAdvise, uapi.IocJBMTAdvise)
	eq("jbmt advise region", uintptr(jbmtAdviseRegion), uintptr(uapi.JBMTAdviseRegion))
	eq("jbmt get", uintptr(JBMTGet), uintptr(uapi.JBMTGet))
	eq("jbmt put", uintptr(JBMTPut), uintptr(uapi.JBMTPut))
	eq("jbmt op max", uintptr(JBMTOpMax/time.Millisecond), uintptr(uapi.JBMTOpMaxMS))
	eq("jbmt max ring", uintptr(JBMTMaxRing), uintptr(uapi.JBMTMaxCQ))
	eq("sizeof jbmt ring", unsafe.Sizeof(rawJBMTRingHdr{}), uapi.SizeJBMTRing)
	eq("sizeof jbmt cqe", unsafe.Sizeof(JBMTCQE{}), uapi.SizeJBMTCQE)
	eq("sizeof jbmt sqe", unsafe.Sizeof(JBMTSQE{}), uapi.SizeJBMTSQE)
	eq("sizeof jbmt setup", unsafe.Sizeof(rawJBMTSetup{}), uapi.SizeJBMTSetup)
	eq("sizeof jbmt submit", unsafe.Sizeof(rawJBMTSubmit{}), uapi.SizeJBMTSubmit)
	eq("jbmt cqe t_end", unsafe.Offsetof(JBMTCQE{}.TEnd), uapi.OffJBMTCQETEnd)
	eq("jbmt sqe user_data", unsafe.Offsetof(JBMTSQE{}.UserData), uapi.OffJBMTSQEUserData)
	eq("ioc jbmt setup", iocJBMTSetup, uapi.IocJBMTSetup)
	eq("ioc jbmt submit", iocJBMTSubmit, uapi.IocJBMTSubmit)
	eq("jbmt connect max", uintptr(JBMTConnectMax/time.Millisecond), uintptr(uapi.JBMTConnectMaxMS))
	eq("win mbkey flag", uintptr(rvmaWinMBKey), uintptr(uapi.RVMAWinMBKey))
	eq("mailbox offset bits", uintptr(MailboxOffsetBits), uintptr(uapi.RVMAMBVAOffBits))
	if a, err := MailboxAddr(1<<24|0x123456, 0x789); err != nil || a != 0x123456<<40|0x789 ||
		uapi.RVMAMBVAGenMask != 1<<24-1 {
		t.Errorf("MailboxAddr: %#x, %v (gen mask %#x)", a, err, uapi.RVMAMBVAGenMask)
	}
	if _, err := MailboxAddr(0, 1<<MailboxOffsetBits); !errors.Is(err, ErrInvalid) {
		t.Errorf("MailboxAddr beyond the offset bits: %v", err)
	}
	if uapi.RVMAMBKeyMask != 0xf0000000 || uapi.RVMAMBKeyBits != 0xf0000000 {
		t.Errorf("mailbox key bits %#x/%#x", uapi.RVMAMBKeyBits, uapi.RVMAMBKeyMask)
	}
	eq("window state refused", unsafe.Offsetof(rawWindowState{}.Refused), uapi.OffWSRefused)
	eq("post gen", unsafe.Offsetof(rawRVMAPost{}.Gen), uapi.OffPostGen)
	eq("post record", unsafe.Offsetof(rawRVMAPost{}.Record), uapi.OffPostRecord)
	eq("setup mmap_offset", unsafe.Offsetof(rawRVMASetup{}.MmapOffset), uapi.OffSetupMmapOffset)
	eq("entry value", unsafe.Offsetof(rawEntry{}.Value), uapi.EntryValue)
}

func TestBitsString(t *testing.T) {
	for b, want := range map[Bits]string{W | R: "W|R", WL | WLD: "WL|WLD", 0: "0x0", R | RLD | 0x40: "R|RLD|0x40"} {
		if got := b.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint32(b), got, want)
		}
	}
}

func TestOpenWithoutModule(t *testing.T) {
	d, err := Open()
	if err == nil {
		d.Close()
		t.Skip("the module is loaded here")
	}
	if !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Open without the module: %v, want ErrNotLoaded", err)
	}
}
