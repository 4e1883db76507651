/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * rdmaplus: the userspace interface of the rdmaplus kernel module.
 *
 * This header is shared by the module and by userspace (Go through cgo).
 * Every ioctl structure starts with its own size (__u32 size) so that both
 * sides can check it, is a multiple of 8 bytes with explicit padding, and
 * RDMAPLUS_ABI_VERSION is bumped on any incompatible change.
 *
 * Active Access (docs/activeaccess.md): the module is an emulated IOMMU
 * for rxe. A process creates domains (the paper's IUIDs), each with an
 * access log mapped into the process, and associates 4 KiB pages of its
 * own rxe memory regions with a domain and the control bits below.
 */
#ifndef _UAPI_RDMAPLUS_H
#define _UAPI_RDMAPLUS_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define RDMAPLUS_DEVICE_NAME	"rdmaplus"
#define RDMAPLUS_ABI_VERSION	3

#define RDMAPLUS_IOC_MAGIC	0xb7

/**
 * struct rdmaplus_version - answer of RDMAPLUS_IOC_VERSION
 * @abi:	RDMAPLUS_ABI_VERSION of the running module
 * @flags:	RDMAPLUS_VERSION_F_* features of the running module
 * @release:	module release string, NUL-terminated
 */
struct rdmaplus_version {
	__u32 abi;
	__u32 flags;
	char release[32];
};

/* The module found the rxe data path it knows and can arm Active Access. */
#define RDMAPLUS_VERSION_F_AA	(1U << 0)

/* ---- Active Access ---------------------------------------------------- */

#define RDMAPLUS_AA_MAX_DOMAINS		1024	/* domain ids are 1..1024 */
#define RDMAPLUS_AA_PAGE_SIZE		4096	/* granularity of control bits */
#define RDMAPLUS_AA_ENTRY_ALIGN		64	/* every log entry is a multiple */
#define RDMAPLUS_AA_LOG_MIN		4096	/* bytes of the entry area */
#define RDMAPLUS_AA_LOG_MAX		(64U << 20)

/* Control bits of an active page (the paper's extended IOMMU PTE). */
#define RDMAPLUS_AA_W		(1U << 0) /* incoming writes change memory */
#define RDMAPLUS_AA_R		(1U << 1) /* reads are served from memory */
#define RDMAPLUS_AA_WL		(1U << 2) /* log a metadata entry per write */
#define RDMAPLUS_AA_WLD		(1U << 3) /* ... with the written data */
#define RDMAPLUS_AA_RL		(1U << 4) /* log a metadata entry per read */
#define RDMAPLUS_AA_RLD		(1U << 5) /* ... with the data served */
#define RDMAPLUS_AA_BITS	0x3fU

/**
 * struct rdmaplus_aa_domain_create - RDMAPLUS_IOC_AA_DOMAIN_CREATE
 * @size:	in: sizeof(struct rdmaplus_aa_domain_create)
 * @flags:	in: zero
 * @log_size:	in: bytes of the log's entry area, a power of two between
 *		RDMAPLUS_AA_LOG_MIN and RDMAPLUS_AA_LOG_MAX
 * @domain:	out: the domain id, 1..RDMAPLUS_AA_MAX_DOMAINS
 * @reserved:	zero
 * @mmap_offset: out: offset to pass to mmap(2) on the same descriptor
 * @mmap_size:	out: bytes to map: one page of struct rdmaplus_aa_ring,
 *		then the entry area (log_size bytes)
 */
struct rdmaplus_aa_domain_create {
	__u32 size;
	__u32 flags;
	__u64 log_size;
	__u32 domain;
	__u32 reserved;
	__u64 mmap_offset;
	__u64 mmap_size;
};

/**
 * struct rdmaplus_aa_domain - RDMAPLUS_IOC_AA_DOMAIN_DESTROY
 * @size:	sizeof(struct rdmaplus_aa_domain)
 * @domain:	domain id
 */
struct rdmaplus_aa_domain {
	__u32 size;
	__u32 domain;
};

/**
 * struct rdmaplus_aa_notify - RDMAPLUS_IOC_AA_NOTIFY
 * @size:	sizeof(struct rdmaplus_aa_notify)
 * @domain:	domain id
 * @eventfd:	an eventfd signalled (count += 1) on each notification, or -1
 *		for none (poll(2) on the device still works)
 * @threshold:	notify once this many entries were logged since the last
 *		notification (0: no count-based notification)
 * @interval_us: notify at most interval_us microseconds after the first
 *		entry logged since the last notification (0: no timer; at most
 *		RDMAPLUS_AA_INTERVAL_MAX)
 * @flags:	RDMAPLUS_AA_NOTIFY_F_*
 *
 * With neither threshold nor interval every entry notifies poll(2) (not
 * the eventfd). RDMAPLUS_AA_NOTIFY_F_ADAPTIVE (needs interval_us) is
 * interrupt moderation: an entry logged interval_us or longer after the
 * last notification notifies at once; entries that follow sooner wait
 * until interval_us after that notification (or the threshold). An idle
 * log thus wakes its consumer without delay, and a busy one at most once
 * per interval_us.
 */
struct rdmaplus_aa_notify {
	__u32 size;
	__u32 domain;
	__s32 eventfd;
	__u32 threshold;
	__u32 interval_us;
	__u32 flags;
};

#define RDMAPLUS_AA_NOTIFY_F_ADAPTIVE	(1U << 0)
#define RDMAPLUS_AA_INTERVAL_MAX	(3600U * 1000 * 1000)	/* one hour */

/**
 * struct rdmaplus_aa_arm - RDMAPLUS_IOC_AA_ARM and RDMAPLUS_IOC_AA_DISARM
 * @size:	sizeof(struct rdmaplus_aa_arm)
 * @domain:	domain id (DISARM: 0 disarms the pages whatever their domain)
 * @key:	lkey or rkey of an rxe memory region registered through a
 *		uverbs file that the calling process has open
 * @bits:	ARM: RDMAPLUS_AA_* control bits (DISARM: ignored)
 * @iova:	first byte of the range, RDMAPLUS_AA_PAGE_SIZE aligned, in the
 *		region's address space (the address remote peers use)
 * @length:	bytes, a multiple of RDMAPLUS_AA_PAGE_SIZE
 */
struct rdmaplus_aa_arm {
	__u32 size;
	__u32 domain;
	__u32 key;
	__u32 bits;
	__u64 iova;
	__u64 length;
};

/**
 * struct rdmaplus_aa_stats - RDMAPLUS_IOC_AA_STATS (module-wide counters)
 * @size:	sizeof(struct rdmaplus_aa_stats)
 * @hooks_armed: 1 while the data-path probes are registered
 * @domains:	live domains
 * @mrs:	memory regions with at least one active page
 * @pages:	active pages
 * @entries:	log entries written (all domains, since load)
 * @bytes:	bytes of log written, headers and data
 * @data_bytes:	bytes of access data copied into logs
 * @writes:	incoming RDMA WRITE chunks that touched an active page
 * @reads:	RDMA READ response chunks that touched an active page
 * @atomics:	atomics that touched an active page
 * @hidden_writes: write chunks whose data W=0 kept out of memory
 * @zeroed_reads: read chunks in which R=0 served zeros
 * @refused_writes: write chunks refused (remote access error) because the
 *		log was full
 * @refused_atomics: atomics refused (W=0, R=0 or log full)
 * @lost_reads:	read chunks served as zeros because the log was full
 * @missed:	hook hits skipped (recursion within one context); an access that
 *		escaped the module. Stays 0 in a healthy system.
 */
struct rdmaplus_aa_stats {
	__u32 size;
	__u32 hooks_armed;
	__u64 domains;
	__u64 mrs;
	__u64 pages;
	__u64 entries;
	__u64 bytes;
	__u64 data_bytes;
	__u64 writes;
	__u64 reads;
	__u64 atomics;
	__u64 hidden_writes;
	__u64 zeroed_reads;
	__u64 refused_writes;
	__u64 refused_atomics;
	__u64 lost_reads;
	__u64 missed;
};

/*
 * The first page of a domain's mapping. The module writes head and
 * head_seq (release order: entries before head); the process writes tail.
 * Positions are free-running byte counts; an entry starts at
 * data[pos % size]. Entries never wrap: the module pads the end of the
 * area with an RDMAPLUS_AA_OP_PAD entry instead.
 */
struct rdmaplus_aa_ring {
	__u64 head;		/* module: bytes produced */
	__u64 head_seq;		/* module: sequence number of the last entry */
	__u64 refused;		/* module: accesses refused, log full */
	__u64 lost;		/* module: reads served as zeros, log full */
	__u8 pad0[32];
	__u64 tail;		/* process: bytes consumed */
	__u8 pad1[56];
	__u64 size;		/* bytes of the entry area */
	__u64 data_offset;	/* offset of the entry area in the mapping */
	__u32 domain;
	__u32 entry_align;
};

/* Log entry operations. */
#define RDMAPLUS_AA_OP_PAD	1	/* filler up to the end of the area */
#define RDMAPLUS_AA_OP_WRITE	2	/* incoming RDMA WRITE (one packet) */
#define RDMAPLUS_AA_OP_READ	3	/* RDMA READ response (one packet) */
#define RDMAPLUS_AA_OP_ATOMIC	4	/* incoming compare-swap/fetch-add */

/* Log entry flags. */
#define RDMAPLUS_AA_F_DATA	(1U << 0) /* data_len bytes of data follow */
/* W=0: memory unchanged; R=0: the reader got zeros */
#define RDMAPLUS_AA_F_SUPPRESSED (1U << 1)

/**
 * struct rdmaplus_aa_entry - one access log entry (64 bytes, then data)
 * @len:	bytes the entry occupies in the area, a multiple of 64
 * @op:		RDMAPLUS_AA_OP_*
 * @flags:	RDMAPLUS_AA_F_*
 * @seq:	per-domain sequence number, from 1, without gaps
 * @iova:	target address of this piece of the access
 * @length:	bytes of the access within this page
 * @data_len:	bytes of data after the header (0 or @length; 8 for atomics)
 * @domain:	domain id
 * @key:	rkey of the memory region
 * @qpn:	local QP number that served the access (0: unknown)
 * @src_qpn:	remote QP number (0: unknown)
 * @time_ns:	ktime_get_ns() when logged
 * @value:	atomics: the 8 bytes at @iova before the operation
 */
struct rdmaplus_aa_entry {
	__u32 len;
	__u16 op;
	__u16 flags;
	__u64 seq;
	__u64 iova;
	__u32 length;
	__u32 data_len;
	__u32 domain;
	__u32 key;
	__u32 qpn;
	__u32 src_qpn;
	__u64 time_ns;
	__u64 value;
};

#define RDMAPLUS_IOC_VERSION	_IOR(RDMAPLUS_IOC_MAGIC, 0x00, struct rdmaplus_version)
#define RDMAPLUS_IOC_AA_DOMAIN_CREATE \
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x10, struct rdmaplus_aa_domain_create)
#define RDMAPLUS_IOC_AA_DOMAIN_DESTROY \
	_IOW(RDMAPLUS_IOC_MAGIC, 0x11, struct rdmaplus_aa_domain)
#define RDMAPLUS_IOC_AA_NOTIFY	_IOW(RDMAPLUS_IOC_MAGIC, 0x12, struct rdmaplus_aa_notify)
#define RDMAPLUS_IOC_AA_ARM	_IOW(RDMAPLUS_IOC_MAGIC, 0x13, struct rdmaplus_aa_arm)
#define RDMAPLUS_IOC_AA_DISARM	_IOW(RDMAPLUS_IOC_MAGIC, 0x14, struct rdmaplus_aa_arm)
#define RDMAPLUS_IOC_AA_STATS	_IOWR(RDMAPLUS_IOC_MAGIC, 0x15, struct rdmaplus_aa_stats)

#endif /* _UAPI_RDMAPLUS_H */
