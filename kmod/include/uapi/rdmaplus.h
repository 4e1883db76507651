/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * rdmaplus: the userspace interface of the rdmaplus kernel module.
 *
 * This header is shared by the module and by userspace (Go through cgo).
 * Every structure carries its own size so that both sides can check it,
 * and RDMAPLUS_ABI_VERSION is bumped on any incompatible change.
 */
#ifndef _UAPI_RDMAPLUS_H
#define _UAPI_RDMAPLUS_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define RDMAPLUS_DEVICE_NAME	"rdmaplus"
#define RDMAPLUS_ABI_VERSION	1

#define RDMAPLUS_IOC_MAGIC	0xb7

/**
 * struct rdmaplus_version - answer of RDMAPLUS_IOC_VERSION
 * @abi:	RDMAPLUS_ABI_VERSION of the running module
 * @flags:	reserved, zero
 * @release:	module release string, NUL-terminated
 */
struct rdmaplus_version {
	__u32 abi;
	__u32 flags;
	char release[32];
};

#define RDMAPLUS_IOC_VERSION	_IOR(RDMAPLUS_IOC_MAGIC, 0x00, struct rdmaplus_version)

#endif /* _UAPI_RDMAPLUS_H */
