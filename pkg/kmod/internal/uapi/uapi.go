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
)
