// Package uapi exposes the sizes, offsets and ioctl numbers of
// kmod/include/uapi/rdmaplus.h as the C compiler sees them, so that the
// tests of package kmod can check its Go mirrors against the header.
package uapi

/*
#cgo CFLAGS: -I${SRCDIR}/../../../../kmod/include
#include <stddef.h>
#include "uapi/rdmaplus.h"

#define OFF(t, f) ((unsigned long)offsetof(struct t, f))
static unsigned long off_head(void) { return OFF(rdmaplus_aa_ring, head); }
static unsigned long off_head_seq(void) { return OFF(rdmaplus_aa_ring, head_seq); }
static unsigned long off_refused(void) { return OFF(rdmaplus_aa_ring, refused); }
static unsigned long off_lost(void) { return OFF(rdmaplus_aa_ring, lost); }
static unsigned long off_tail(void) { return OFF(rdmaplus_aa_ring, tail); }
static unsigned long off_data_len(void) { return OFF(rdmaplus_aa_entry, data_len); }
static unsigned long off_value(void) { return OFF(rdmaplus_aa_entry, value); }
static unsigned long off_ws_refused(void) { return OFF(rdmaplus_rvma_window_state, refused); }
static unsigned long off_post_gen(void) { return OFF(rdmaplus_rvma_post, gen); }
static unsigned long off_jbmt_cqe_t_end(void) { return OFF(rdmaplus_jbmt_cqe, t_end); }
static unsigned long off_jbmt_sqe_user_data(void) { return OFF(rdmaplus_jbmt_sqe, user_data); }
static unsigned long off_post_rkey(void) { return OFF(rdmaplus_rvma_post, rkey); }
static unsigned long off_post_record(void) { return OFF(rdmaplus_rvma_post, record); }
static unsigned long off_setup_mmap_offset(void) { return OFF(rdmaplus_rvma_setup, mmap_offset); }
*/
import "C"

// Values from the header.
var (
	ABIVersion   = uint32(C.RDMAPLUS_ABI_VERSION)
	MaxDomains   = int(C.RDMAPLUS_AA_MAX_DOMAINS)
	SizeVersion  = uintptr(C.sizeof_struct_rdmaplus_version)
	SizeCreate   = uintptr(C.sizeof_struct_rdmaplus_aa_domain_create)
	SizeDomain   = uintptr(C.sizeof_struct_rdmaplus_aa_domain)
	SizeNotify   = uintptr(C.sizeof_struct_rdmaplus_aa_notify)
	SizeArm      = uintptr(C.sizeof_struct_rdmaplus_aa_arm)
	SizeStats    = uintptr(C.sizeof_struct_rdmaplus_aa_stats)
	SizeEntry    = uintptr(C.sizeof_struct_rdmaplus_aa_entry)
	IocVersion   = uintptr(C.RDMAPLUS_IOC_VERSION)
	IocCreate    = uintptr(C.RDMAPLUS_IOC_AA_DOMAIN_CREATE)
	IocDestroy   = uintptr(C.RDMAPLUS_IOC_AA_DOMAIN_DESTROY)
	IocNotify    = uintptr(C.RDMAPLUS_IOC_AA_NOTIFY)
	IocArm       = uintptr(C.RDMAPLUS_IOC_AA_ARM)
	IocDisarm    = uintptr(C.RDMAPLUS_IOC_AA_DISARM)
	IocStats     = uintptr(C.RDMAPLUS_IOC_AA_STATS)
	OffHead      = uintptr(C.off_head())
	OffHeadSeq   = uintptr(C.off_head_seq())
	OffRefused   = uintptr(C.off_refused())
	OffLost      = uintptr(C.off_lost())
	OffTail      = uintptr(C.off_tail())
	EntryDataLen = uintptr(C.off_data_len())
	EntryValue   = uintptr(C.off_value())
	Bits         = uint32(C.RDMAPLUS_AA_BITS)
	Adaptive     = uint32(C.RDMAPLUS_AA_NOTIFY_F_ADAPTIVE)
	IntervalMax  = uint32(C.RDMAPLUS_AA_INTERVAL_MAX)

	// Counted mailboxes (RVMA).
	VersionFlagAA      = uint32(C.RDMAPLUS_VERSION_F_AA)
	VersionFlagRVMA    = uint32(C.RDMAPLUS_VERSION_F_RVMA)
	VersionFlagJBMT    = uint32(C.RDMAPLUS_VERSION_F_JBMT)
	JBMTRead           = uint32(C.RDMAPLUS_JBMT_READ)
	JBMTWrite          = uint32(C.RDMAPLUS_JBMT_WRITE)
	JBMTMaxID          = uint32(C.RDMAPLUS_JBMT_MAX_ID)
	SizeJBMTReg        = uintptr(C.sizeof_struct_rdmaplus_jbmt_reg)
	SizeJBMTDereg      = uintptr(C.sizeof_struct_rdmaplus_jbmt_dereg)
	IocJBMTReg         = uintptr(C.RDMAPLUS_IOC_JBMT_REG)
	IocJBMTDereg       = uintptr(C.RDMAPLUS_IOC_JBMT_DEREG)
	SizeJBMTConnect    = uintptr(C.sizeof_struct_rdmaplus_jbmt_connect)
	IocJBMTConnect     = uintptr(C.RDMAPLUS_IOC_JBMT_CONNECT)
	JBMTConnectMaxMS   = uint32(C.RDMAPLUS_JBMT_CONNECT_MAX_MS)
	SizeJBMTOp         = uintptr(C.sizeof_struct_rdmaplus_jbmt_op)
	IocJBMTOp          = uintptr(C.RDMAPLUS_IOC_JBMT_OP)
	SizeJBMTAdvise     = uintptr(C.sizeof_struct_rdmaplus_jbmt_advise)
	IocJBMTAdvise      = uintptr(C.RDMAPLUS_IOC_JBMT_ADVISE)
	JBMTAdviseRegion   = uint32(C.RDMAPLUS_JBMT_ADVISE_REGION)
	JBMTGet            = uint32(C.RDMAPLUS_JBMT_GET)
	JBMTPut            = uint32(C.RDMAPLUS_JBMT_PUT)
	JBMTOpMaxMS        = uint32(C.RDMAPLUS_JBMT_OP_MAX_MS)
	JBMTMaxCQ          = uint32(C.RDMAPLUS_JBMT_MAX_CQ)
	SizeJBMTRing       = uintptr(C.sizeof_struct_rdmaplus_jbmt_ring)
	SizeJBMTCQE        = uintptr(C.sizeof_struct_rdmaplus_jbmt_cqe)
	SizeJBMTSQE        = uintptr(C.sizeof_struct_rdmaplus_jbmt_sqe)
	SizeJBMTSetup      = uintptr(C.sizeof_struct_rdmaplus_jbmt_setup)
	SizeJBMTSubmit     = uintptr(C.sizeof_struct_rdmaplus_jbmt_submit)
	OffJBMTCQETEnd     = uintptr(C.off_jbmt_cqe_t_end())
	OffJBMTSQEUserData = uintptr(C.off_jbmt_sqe_user_data())
	IocJBMTSetup       = uintptr(C.RDMAPLUS_IOC_JBMT_SETUP)
	IocJBMTSubmit      = uintptr(C.RDMAPLUS_IOC_JBMT_SUBMIT)
	RVMAMaxWindows     = int(C.RDMAPLUS_RVMA_MAX_WINDOWS)
	RVMAMaxRecords     = int(C.RDMAPLUS_RVMA_MAX_RECORDS)
	RVMARecordSize     = int(C.RDMAPLUS_RVMA_RECORD_SIZE)
	RVMAMaxLength      = uint64(C.RDMAPLUS_RVMA_MAX_LENGTH)
	RVMABytes          = uint32(C.RDMAPLUS_RVMA_BYTES)
	RVMAOps            = uint32(C.RDMAPLUS_RVMA_OPS)
	RVMARecPartial     = uint32(C.RDMAPLUS_RVMA_REC_PARTIAL)
	RVMARecClosed      = uint32(C.RDMAPLUS_RVMA_REC_CLOSED)
	RVMARecLate        = uint32(C.RDMAPLUS_RVMA_REC_LATE)
	RVMARecOneTime     = uint32(C.RDMAPLUS_RVMA_REC_ONETIME)
	RVMAEndAll         = uint32(C.RDMAPLUS_RVMA_END_F_ALL)
	RVMAPostKeyed      = uint32(C.RDMAPLUS_RVMA_POST_F_RKEY)
	RVMAWinMBKey       = uint32(C.RDMAPLUS_RVMA_WIN_F_MBKEY)
	RVMAMBVAOffBits    = int(C.RDMAPLUS_RVMA_MBVA_OFF_BITS)
	RVMAMBVAGenMask    = uint64(C.RDMAPLUS_RVMA_MBVA_GEN_MASK)
	RVMAMBKeyMask      = uint32(C.RDMAPLUS_RVMA_MBKEY_MASK)
	RVMAMBKeyBits      = uint32(C.RDMAPLUS_RVMA_MBKEY_BITS)
	RVMARecWords       = [8]int{C.RDMAPLUS_RVMA_REC_SEQ, C.RDMAPLUS_RVMA_REC_EPOCH, C.RDMAPLUS_RVMA_REC_ADDR, C.RDMAPLUS_RVMA_REC_LEN, C.RDMAPLUS_RVMA_REC_OPS, C.RDMAPLUS_RVMA_REC_CAP, C.RDMAPLUS_RVMA_REC_FLAGS, C.RDMAPLUS_RVMA_REC_SEQ2}
	SizeRVMASetup      = uintptr(C.sizeof_struct_rdmaplus_rvma_setup)
	SizeWindowState    = uintptr(C.sizeof_struct_rdmaplus_rvma_window_state)
	SizeRVMAWin        = uintptr(C.sizeof_struct_rdmaplus_rvma_win)
	SizeRVMAWinDestroy = uintptr(C.sizeof_struct_rdmaplus_rvma_win_destroy)
	SizeRVMAPost       = uintptr(C.sizeof_struct_rdmaplus_rvma_post)
	SizeRVMAEnd        = uintptr(C.sizeof_struct_rdmaplus_rvma_end)
	SizeRVMAPostV      = uintptr(C.sizeof_struct_rdmaplus_rvma_postv)
	RVMAMaxPostV       = int(C.RDMAPLUS_RVMA_MAX_POSTV)
	IocRVMAPostV       = uintptr(C.RDMAPLUS_IOC_RVMA_POSTV)
	SizeRVMAQP         = uintptr(C.sizeof_struct_rdmaplus_rvma_qp)
	IocRVMAQP          = uintptr(C.RDMAPLUS_IOC_RVMA_QP)
	SizeRVMAGuard      = uintptr(C.sizeof_struct_rdmaplus_rvma_guard)
	IocRVMAGuard       = uintptr(C.RDMAPLUS_IOC_RVMA_GUARD)
	RVMAQPForget       = uint32(C.RDMAPLUS_RVMA_QP_F_FORGET)
	RVMAMaxQPs         = int(C.RDMAPLUS_RVMA_MAX_QPS)
	IocRVMASetup       = uintptr(C.RDMAPLUS_IOC_RVMA_SETUP)
	IocRVMAWinCreate   = uintptr(C.RDMAPLUS_IOC_RVMA_WIN_CREATE)
	IocRVMAWinDestroy  = uintptr(C.RDMAPLUS_IOC_RVMA_WIN_DESTROY)
	IocRVMAPost        = uintptr(C.RDMAPLUS_IOC_RVMA_POST)
	IocRVMAEnd         = uintptr(C.RDMAPLUS_IOC_RVMA_END)
	IocRVMAArm         = uintptr(C.RDMAPLUS_IOC_RVMA_ARM)
	OffWSRefused       = uintptr(C.off_ws_refused())
	OffPostGen         = uintptr(C.off_post_gen())
	RVMAPostRKey       = uintptr(C.off_post_rkey())
	OffPostRecord      = uintptr(C.off_post_record())
	OffSetupMmapOffset = uintptr(C.off_setup_mmap_offset())
)
