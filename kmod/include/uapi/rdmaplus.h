/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * rdmaplus: the userspace interface of the rdmaplus kernel module.
 *
 * This header is shared by the module and by userspace (Go through cgo).
 * Every ioctl structure starts with its own size (__u32 size), is a
 * multiple of 8 bytes with explicit padding, and only ever grows at its
 * end (ABI 10): the module takes a structure of any size from the one it
 * first had, treats fields a caller does not know as zero and refuses a
 * larger one whose bytes beyond its own are not zero (E2BIG), so an older
 * program works with a newer module and a newer one gets a clear error
 * from an older module. Outputs are written up to the caller's size.
 * RDMAPLUS_ABI_VERSION is bumped on any incompatible change.
 *
 * Active Access (docs/activeaccess.md): the module is an emulated IOMMU
 * for rxe. A process creates domains (the paper's IUIDs), each with an
 * access log mapped into the process, and associates 4 KiB pages of its
 * own rxe memory regions with a domain and the control bits below.
 *
 * Counted mailboxes (RVMA, docs/kmod.md): the module counts the RDMA
 * WRITE packets placed into buffers a process posted, closes a buffer's
 * gate at its threshold and publishes a 64-byte completion record into
 * memory mapped into the process.
 *
 * JBMT (docs/jbmt.md): registration of unpinned memory, by token.
 */
#ifndef _UAPI_RDMAPLUS_H
#define _UAPI_RDMAPLUS_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define RDMAPLUS_DEVICE_NAME	"rdmaplus"
#define RDMAPLUS_ABI_VERSION	10

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
/* The module can gate and count RVMA mailboxes (same rxe data path). */
#define RDMAPLUS_VERSION_F_RVMA	(1U << 1)
/* The module registers memory for JBMT (any RDMA device; no rxe hooks). */
#define RDMAPLUS_VERSION_F_JBMT	(1U << 2)

/*
 * JBMT (docs/jbmt.md): an RDMA service over memory that is never pinned
 * for long. Registering a range of the calling process's address space
 * pins nothing and costs the same at any size: the module keeps the range,
 * its rights and the process's address space, and answers a token that
 * peers present to reach it.
 */
#define RDMAPLUS_JBMT_READ	(1U << 0) /* peers may get from the region */
#define RDMAPLUS_JBMT_WRITE	(1U << 1) /* peers may put into it */
#define RDMAPLUS_JBMT_RIGHTS	0x3U
#define RDMAPLUS_JBMT_MAX_ID	((1U << 24) - 1) /* region ids 1..2^24-1 */

/**
 * struct rdmaplus_jbmt_token - names a registered region to any host
 * @id:		the region's id on its host, 1..RDMAPLUS_JBMT_MAX_ID
 * @gen:	the registration's number (an id is used again after its
 *		region is gone; the generation is not)
 * @key:	64 random bits: a token cannot be guessed from another
 */
struct rdmaplus_jbmt_token {
	__u32 id;
	__u32 gen;
	__u64 key;
};

/**
 * struct rdmaplus_jbmt_reg - RDMAPLUS_IOC_JBMT_REG
 * @size:	sizeof(struct rdmaplus_jbmt_reg)
 * @rights:	in: RDMAPLUS_JBMT_READ and/or RDMAPLUS_JBMT_WRITE
 * @addr:	in: the first byte, in the calling process's address space
 * @length:	in: bytes, at least 1; the range must lie in user space. It
 *		need not be mapped now: each transfer finds what is there
 * @token:	out: the region's token
 *
 * Pins nothing and charges no RLIMIT_MEMLOCK: the record (charged to the
 * memory cgroup) is all it keeps. EINVAL (rights, length, range, size),
 * EDQUOT beyond the user's max_jbmt_regions_per_user, ENOSPC when the
 * host has no free id, ENOMEM.
 */
struct rdmaplus_jbmt_reg {
	__u32 size;
	__u32 rights;
	__u64 addr;
	__u64 length;
	struct rdmaplus_jbmt_token token;
};

/**
 * struct rdmaplus_jbmt_dereg - RDMAPLUS_IOC_JBMT_DEREG
 * @size:	sizeof(struct rdmaplus_jbmt_dereg)
 * @reserved:	zero
 * @token:	a token this file registered
 *
 * Revokes the token: no transfer starts on it afterwards. ENOENT alike
 * for no such region and for another file's (tokens cannot be probed).
 */
struct rdmaplus_jbmt_dereg {
	__u32 size;
	__u32 reserved;
	struct rdmaplus_jbmt_token token;
};

#define RDMAPLUS_JBMT_CONNECT_MAX_MS	60000

/**
 * struct rdmaplus_jbmt_connect - RDMAPLUS_IOC_JBMT_CONNECT
 * @size:	sizeof(struct rdmaplus_jbmt_connect)
 * @flags:	zero
 * @addr:	the peer host's IPv4 address, network byte order
 * @port:	its JBMT port, network byte order (0: this module's
 *		jbmt_port)
 * @reserved:	zero
 * @timeout_ms:	how long to wait for a connection being made, at most
 *		RDMAPLUS_JBMT_CONNECT_MAX_MS (0: that)
 * @peer:	out: the peer's id on this host (in: zero)
 *
 * One reliable connection per peer host serves every process of this
 * host: the call returns at once when it is up, and makes it otherwise.
 * ETIMEDOUT, EHOSTUNREACH (no route or address), ECONNREFUSED (nothing
 * listens there), ECONNRESET (it went down while being made), EINTR (a
 * signal; the connection is still being made), ENOSPC (the host keeps
 * max_jbmt_peers connections), EOPNOTSUPP (this module could not
 * listen), EINVAL.
 */
struct rdmaplus_jbmt_connect {
	__u32 size;
	__u32 flags;
	__u32 addr;
	__u16 port;
	__u16 reserved;
	__u32 timeout_ms;
	__u32 peer;
};

#define RDMAPLUS_JBMT_GET	1	/* from the peer's region to here */
#define RDMAPLUS_JBMT_PUT	2	/* from here to the peer's region */
#define RDMAPLUS_JBMT_OP_MAX_MS	600000

/**
 * struct rdmaplus_jbmt_op - RDMAPLUS_IOC_JBMT_OP
 * @size:	sizeof(struct rdmaplus_jbmt_op)
 * @op:		RDMAPLUS_JBMT_GET or RDMAPLUS_JBMT_PUT
 * @peer:	a connection's id (RDMAPLUS_IOC_JBMT_CONNECT)
 * @timeout_ms:	how long to wait for the peer's answers, at most
 *		RDMAPLUS_JBMT_OP_MAX_MS (0: that)
 * @addr:	the local buffer, in the calling process's address space: it
 *		need not be registered, and is pinned a section at a time
 * @length:	bytes, at least 1
 * @token:	the peer's region
 * @offset:	where in it
 * @done:	out: bytes moved, from the start, before any error
 *
 * Moves the bytes in sections, several in flight, pinning each on both
 * hosts only while it moves; returns when all have landed (a get: here;
 * a put: in the peer's memory). The connection survives every error but
 * its own loss. ENOENT (no such region on the peer: a wrong or revoked
 * token), EACCES (the region lacks READ for a get, WRITE for a put),
 * ERANGE (outside the region), EFAULT (local pages not mapped, or the
 * peer's), ENOTCONN (no such connection, or it is down), ECONNRESET (it
 * went down meanwhile), ETIMEDOUT, EINTR (a signal; @done says how far
 * it got), ENOMEM, EINVAL. @done is written back on errors too.
 */
struct rdmaplus_jbmt_op {
	__u32 size;
	__u32 op;
	__u32 peer;
	__u32 timeout_ms;
	__u64 addr;
	__u64 length;
	struct rdmaplus_jbmt_token token;
	__u64 offset;
	__u64 done;
};

#define RDMAPLUS_JBMT_ADVISE_REGION	(1U << 0) /* @addr: in @token's region */

/**
 * struct rdmaplus_jbmt_advise - RDMAPLUS_IOC_JBMT_ADVISE
 * @size:	sizeof(struct rdmaplus_jbmt_advise)
 * @flags:	RDMAPLUS_JBMT_ADVISE_REGION: @addr is an offset in the region
 *		@token names, one of this file's, pinned to be served to peers;
 *		else @addr is a local buffer of the calling process, pinned
 *		for this file's operations
 * @rights:	a local buffer: RDMAPLUS_JBMT_WRITE when gets will write it,
 *		RDMAPLUS_JBMT_READ when puts will read it (both: either);
 *		a region: 0 (its own rights)
 * @addr:	where the range starts
 * @length:	bytes, at least 1
 * @token:	the region (RDMAPLUS_JBMT_ADVISE_REGION), else zero
 * @done:	out: bytes from @addr now in the pin cache
 *
 * Pins the range ahead of use into the pin cache, cut as an operation
 * starting at @addr cuts its sections, so that the sections of later
 * operations over it find their pages pinned. A hint: it stops without an
 * error where the pin budget (or, for a file's operations, its share) is
 * taken, or where the pin cache is off (@done says how far it got). It
 * takes no budget from others (it evicts nothing). ENOENT (no such region
 * of this file), ERANGE (outside the region), EFAULT (pages not mapped:
 * @done stops before them), EINTR (a fatal signal), ENOMEM, EINVAL.
 */
struct rdmaplus_jbmt_advise {
	__u32 size;
	__u32 flags;
	__u32 rights;
	__u32 reserved;
	__u64 addr;
	__u64 length;
	struct rdmaplus_jbmt_token token;
	__u64 done;
};

/*
 * Asynchronous operations: a completion ring per file, mapped by the
 * process; operations handed over in batches (the doorbell), each ending
 * with an entry in the ring and the eventfd signalled.
 */
#define RDMAPLUS_JBMT_MAX_CQ	65536

/**
 * struct rdmaplus_jbmt_ring - the start of the mapped completion ring
 * @cq_head:	the next entry the process will read; it advances it
 * @cq_tail:	one past the last entry the module posted (read it with
 *		acquire ordering)
 * @cq_entries:	the ring's entries, a power of two
 *
 * The entries (struct rdmaplus_jbmt_cqe) follow this header; entry i of
 * the stream is at index i & (cq_entries - 1).
 */
struct rdmaplus_jbmt_ring {
	__u32 cq_head;
	__u32 cq_tail;
	__u32 cq_entries;
	__u32 reserved[13];
};

/**
 * struct rdmaplus_jbmt_cqe - an asynchronous operation's end
 * @user_data:	the submission's
 * @status:	0, or what RDMAPLUS_IOC_JBMT_OP would return (a negative
 *		errno; -ECANCELED when the file closed first)
 * @done:	bytes moved from the start before any error
 * @t_submit:	CLOCK_MONOTONIC ns: the doorbell took the operation
 * @t_start:	a kernel worker began it
 * @t_first:	the answer to its first section came (0: none did)
 * @t_end:	it ended
 */
struct rdmaplus_jbmt_cqe {
	__u64 user_data;
	__s32 status;
	__u32 reserved;
	__u64 done;
	__u64 t_submit;
	__u64 t_start;
	__u64 t_first;
	__u64 t_end;
	__u64 reserved2;
};

/**
 * struct rdmaplus_jbmt_setup - RDMAPLUS_IOC_JBMT_SETUP
 * @size:	sizeof(struct rdmaplus_jbmt_setup)
 * @flags:	zero
 * @cq_entries:	the ring's entries, a power of two up to
 *		RDMAPLUS_JBMT_MAX_CQ; operations in flight and entries not yet
 *		read never exceed it (RDMAPLUS_IOC_JBMT_SUBMIT says EBUSY)
 * @eventfd:	an eventfd signalled after entries are posted, or -1
 * @mmap_offset: out: where to map the ring (mmap of the file)
 * @mmap_bytes:	out: how much to map
 *
 * One ring per file (EBUSY for a second). Its pages count against the
 * user's RLIMIT_MEMLOCK (ENOMEM beyond). EINVAL, EBADF (not an eventfd).
 */
struct rdmaplus_jbmt_setup {
	__u32 size;
	__u32 flags;
	__u32 cq_entries;
	__s32 eventfd;
	__u64 mmap_offset;
	__u64 mmap_bytes;
};

/**
 * struct rdmaplus_jbmt_sqe - one operation for RDMAPLUS_IOC_JBMT_SUBMIT
 * @op, @peer, @timeout_ms, @addr, @length, @token, @offset: as in struct
 *		rdmaplus_jbmt_op; the buffer must stay mapped until the
 *		operation's entry is posted
 * @user_data:	given back in the entry
 * @flags:	zero
 * @reserved:	zero
 */
struct rdmaplus_jbmt_sqe {
	__u32 op;
	__u32 peer;
	__u64 addr;
	__u64 length;
	struct rdmaplus_jbmt_token token;
	__u64 offset;
	__u64 user_data;
	__u32 timeout_ms;
	__u16 flags;
	__u16 reserved;
};

/**
 * struct rdmaplus_jbmt_submit - RDMAPLUS_IOC_JBMT_SUBMIT
 * @size:	sizeof(struct rdmaplus_jbmt_submit)
 * @count:	in: submissions at @sqes; out: how many were taken
 * @sqes:	an array of struct rdmaplus_jbmt_sqe
 *
 * Takes submissions in order until one is refused or the ring has no room
 * for more completions; returns 0 when it took any (each then ends with an
 * entry), else the first one's error: EINVAL (as RDMAPLUS_IOC_JBMT_OP, or
 * no ring), EBUSY (the ring is full: read entries first), EFAULT, ENOMEM,
 * ENXIO (no ring set up).
 */
struct rdmaplus_jbmt_submit {
	__u32 size;
	__u32 count;
	__u64 sqes;
};

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

/* ---- Counted mailboxes (RVMA) ----------------------------------------- */

#define RDMAPLUS_RVMA_MAX_WINDOWS	4096	/* window ids are 1..windows */
#define RDMAPLUS_RVMA_MAX_RECORDS	65536
#define RDMAPLUS_RVMA_RECORD_SIZE	64
#define RDMAPLUS_RVMA_MAX_LENGTH	0xffffffffULL	/* bytes of a buffer */

/* Window kinds: what a buffer's threshold counts. */
#define RDMAPLUS_RVMA_BYTES	1	/* bytes placed */
#define RDMAPLUS_RVMA_OPS	2	/* RDMA WRITE messages completed */

/* Record flags (word 6 of a record; the values of pkg/rvma's Flags). */
#define RDMAPLUS_RVMA_REC_PARTIAL	(1U << 0) /* ended before its threshold */
#define RDMAPLUS_RVMA_REC_CLOSED	(1U << 1) /* the window closed */
#define RDMAPLUS_RVMA_REC_LATE		(1U << 2) /* counted beyond the threshold */
#define RDMAPLUS_RVMA_REC_ONETIME	(1U << 3) /* posted as a one-time buffer */

/* RDMAPLUS_IOC_RVMA_END: end every pending generation >= gen. */
#define RDMAPLUS_RVMA_END_F_ALL		(1U << 16)
/* RDMAPLUS_IOC_RVMA_POST: only writes with the buffer's @rkey are let in */
#define RDMAPLUS_RVMA_POST_F_RKEY	(1U << 17)

/**
 * struct rdmaplus_rvma_setup - RDMAPLUS_IOC_RVMA_SETUP (once per open file)
 * @size:	in: sizeof(struct rdmaplus_rvma_setup)
 * @flags:	in: zero
 * @windows:	in: window slots, 1..RDMAPLUS_RVMA_MAX_WINDOWS
 * @records:	in: completion records, 1..RDMAPLUS_RVMA_MAX_RECORDS
 * @eventfd:	in: an eventfd signalled (count += 1) at the first batch of
 *		records published after RDMAPLUS_IOC_RVMA_ARM, or -1 for none
 * @reserved:	zero
 * @mmap_offset: out: offset to pass to mmap(2) on the same descriptor
 * @mmap_size:	out: bytes to map: @windows struct rdmaplus_rvma_window_state
 *		rounded up to a page, then @records records of
 *		RDMAPLUS_RVMA_RECORD_SIZE bytes (rounded up to a page)
 *
 * The mapping counts against the user's RLIMIT_MEMLOCK like the Active
 * Access logs. A second call on the same file fails with EBUSY; the other
 * RVMA requests fail with ENXIO before it.
 */
struct rdmaplus_rvma_setup {
	__u32 size;
	__u32 flags;
	__u32 windows;
	__u32 records;
	__s32 eventfd;
	__u32 reserved;
	__u64 mmap_offset;
	__u64 mmap_size;
};

/**
 * struct rdmaplus_rvma_window_state - per window, in the mapped area
 * @done:	epochs published: the next generation to publish (the
 *		module stores it with release order after the record)
 * @refused:	write packets refused because their buffer's gate was closed
 *		or they did not fit in one buffer, and (ABI 9) write messages
 *		with the window's mailbox key that could not be translated
 */
struct rdmaplus_rvma_window_state {
	__u64 done;
	__u64 refused;
};

/* RDMAPLUS_IOC_RVMA_WIN_CREATE: give the window a mailbox key (ABI 9) */
#define RDMAPLUS_RVMA_WIN_F_MBKEY	(1U << 0)

/*
 * Mailbox addressing (ABI 9). A sender writes to a window with a mailbox
 * key at a remote address that names a generation and an offset in its
 * buffer; the module translates it to that buffer before rxe looks at
 * the key. The generation is taken modulo 2^24.
 */
#define RDMAPLUS_RVMA_MBVA_OFF_BITS	40
#define RDMAPLUS_RVMA_MBVA_GEN_MASK	0xffffffULL
#define RDMAPLUS_RVMA_MBVA(gen, off) \
	(((__u64)(gen) & RDMAPLUS_RVMA_MBVA_GEN_MASK) << \
	 RDMAPLUS_RVMA_MBVA_OFF_BITS | (off))
/* Every mailbox key has these bits: rxe has no region or memory window
 * with such a key, so a write the module does not translate is refused.
 * The other 28 bits are drawn at random (ABI 10).
 */
#define RDMAPLUS_RVMA_MBKEY_MASK	0xf0000000U
#define RDMAPLUS_RVMA_MBKEY_BITS	0xf0000000U

/**
 * struct rdmaplus_rvma_guard - RDMAPLUS_IOC_RVMA_GUARD (ABI 9)
 * @size:	sizeof(struct rdmaplus_rvma_guard)
 * @key:	lkey or rkey of an rxe memory region with remote write access,
 *		registered through a uverbs file the calling process has open
 *
 * From now until the region is deregistered or this file is closed, the
 * module refuses every write into the region that it did not translate
 * from a mailbox key (struct rdmaplus_rvma_win), wherever it lands: the
 * region's own rkey, which a translation needs, lets nothing in by
 * itself. The buffers of windows with a mailbox key must lie in guarded
 * regions, and those of other windows outside them (EACCES otherwise).
 * Guarding a region twice is not an error. EBUSY if another file gates
 * the region or this file gates it for windows without a mailbox key,
 * EINVAL if it has no remote access.
 */
struct rdmaplus_rvma_guard {
	__u32 size;
	__u32 key;
};

/**
 * struct rdmaplus_rvma_win - RDMAPLUS_IOC_RVMA_WIN_CREATE
 * @size:	in: sizeof(struct rdmaplus_rvma_win)
 * @kind:	in: RDMAPLUS_RVMA_BYTES or RDMAPLUS_RVMA_OPS
 * @id:		out: window id, 1..windows; it uses window_state[id - 1]
 * @flags:	in: 0 or RDMAPLUS_RVMA_WIN_F_MBKEY (ABI 9)
 * @mbkey:	out: with RDMAPLUS_RVMA_WIN_F_MBKEY, the window's mailbox key
 *		(unique among the live windows of every file and device);
 *		0 otherwise
 * @reserved:	zero
 *
 * A window with a mailbox key (the RVMA paper's mailbox, with the NIC's
 * translation done here) is written to without any key of its buffers: a
 * sender RDMA WRITEs (RC or UC, with or without immediate) with rkey
 * @mbkey at remote address RDMAPLUS_RVMA_MBVA(gen, offset). On arrival,
 * before rxe checks the key, the module finds the window's pending buffer
 * of that generation. If its gate is open and the whole message fits at
 * @offset, the RETH is rewritten to the buffer's address and its region's
 * rkey, and rxe places the message there, through the gate, which counts
 * it as for any buffer. Otherwise (no such generation pending, its gate
 * closed, or the message does not fit) the key stays, rxe refuses the
 * write with a remote access error (the sender's work request fails,
 * memory is untouched) and window_state.refused counts it. So senders
 * need neither a buffer's address nor a key of their own per buffer, and
 * the receiver binds no memory window.
 *
 * The buffers of such a window must lie in regions guarded with
 * RDMAPLUS_IOC_RVMA_GUARD (so with remote write), in the PD of the queue
 * pairs that write to them (rxe checks that after the translation), and
 * are posted without RDMAPLUS_RVMA_POST_F_RKEY. Only messages the module
 * translated get into those regions: a write with a region's own rkey is
 * refused. Reads,
 * atomics and zero-length writes with a mailbox key are not translated
 * (rxe refuses the first two; a zero-length write touches no memory).
 *
 * A message translated just before its window's generation ended or the
 * window was destroyed may still be queued at rxe's responder. The gate
 * refuses it if the buffer is still known (closed); after
 * RDMAPLUS_IOC_RVMA_WIN_DESTROY it is not, so end the window's
 * generations (RDMAPLUS_IOC_RVMA_END with RDMAPLUS_RVMA_END_F_ALL) and
 * let the queue pairs that write to it drain before destroying it and
 * reusing the memory.
 */
struct rdmaplus_rvma_win {
	__u32 size;
	__u32 kind;
	__u32 id;
	__u32 flags;
	__u32 mbkey;
	__u32 reserved;
};

/**
 * struct rdmaplus_rvma_win_destroy - RDMAPLUS_IOC_RVMA_WIN_DESTROY
 * @size:	sizeof(struct rdmaplus_rvma_win_destroy)
 * @id:		window id. Its ranges are forgotten (writes to them are no
 *		longer gated: invalidate their keys first) and the id is free.
 */
struct rdmaplus_rvma_win_destroy {
	__u32 size;
	__u32 id;
};

/**
 * struct rdmaplus_rvma_post - RDMAPLUS_IOC_RVMA_POST
 * @size:	sizeof(struct rdmaplus_rvma_post)
 * @win:	window id
 * @key:	lkey or rkey of an rxe memory region registered through a
 *		uverbs file that the calling process has open
 * @flags:	RDMAPLUS_RVMA_REC_ONETIME (ORed into this buffer's record)
 *		and RDMAPLUS_RVMA_POST_F_RKEY
 * @iova:	first byte of the buffer, in the region's address space
 * @length:	bytes, 1..RDMAPLUS_RVMA_MAX_LENGTH, inside the region
 * @threshold:	bytes window: 1..@length bytes; ops window: >= 1 messages
 * @gen:	generation (epoch): greater than the window's last posted one
 *		and not below its done counter; in a window with a mailbox
 *		key, less than 2^24 past its oldest pending one (a mailbox
 *		address names the low 24 bits)
 * @record:	index of the record to publish, 0..records-1, not used by
 *		another pending buffer of this file
 * @rkey:	(ABI 7) with RDMAPLUS_RVMA_POST_F_RKEY, the remote key senders
 *		of this generation write with (0: none, the buffer lets no
 *		write in: one registered only to be ended); zero otherwise
 *
 * The buffer is pending with an open gate. A buffer overlapping a pending
 * one of this file in the same region is refused (EBUSY); published ones
 * it overlaps (kept to refuse late writes) are replaced.
 *
 * With RDMAPLUS_RVMA_POST_F_RKEY the gate also refuses every write message
 * whose RETH carried another key (the key of an earlier generation's
 * memory window, still bound), and every packet whose headers it cannot
 * parse: a buffer can then keep several memory windows bound and use one
 * per generation, without re-binding between epochs. The later packets
 * of a message carry no RETH; the module remembers the key of each
 * queue pair's message in progress from its first packet.
 */
struct rdmaplus_rvma_post {
	__u32 size;
	__u32 win;
	__u32 key;
	__u32 flags;
	__u64 iova;
	__u64 length;
	__u64 threshold;
	__u64 gen;
	__u32 record;
	__u32 rkey;
};

#define RDMAPLUS_RVMA_MAX_POSTV	64	/* buffers of one RDMAPLUS_IOC_RVMA_POSTV */

/**
 * struct rdmaplus_rvma_postv - RDMAPLUS_IOC_RVMA_POSTV (ABI 6)
 * @size:	sizeof(struct rdmaplus_rvma_postv)
 * @count:	posts in @posts, 1..RDMAPLUS_RVMA_MAX_POSTV
 * @posts:	user address of @count struct rdmaplus_rvma_post, each
 *		checked and registered as RDMAPLUS_IOC_RVMA_POST would, in order
 * @done:	out: how many were registered. The call stops at the first
 *		post that fails and returns its error; the ones before it stay
 *		registered.
 * @reserved:	zero
 *
 * One system call for the buffers a process re-posts together.
 */
struct rdmaplus_rvma_postv {
	__u32 size;
	__u32 count;
	__u64 posts;
	__u32 done;
	__u32 reserved;
};

/**
 * struct rdmaplus_rvma_end - RDMAPLUS_IOC_RVMA_END
 * @size:	sizeof(struct rdmaplus_rvma_end)
 * @win:	window id
 * @flags:	RDMAPLUS_RVMA_REC_PARTIAL and/or RDMAPLUS_RVMA_REC_CLOSED to OR
 *		into the record, and RDMAPLUS_RVMA_END_F_ALL
 * @reserved:	zero
 * @gen:	the pending generation to end (END_F_ALL: every pending one
 *		from @gen on). Its gate closes now; it is published once
 *		every earlier generation is. ENOENT if none is pending.
 */
struct rdmaplus_rvma_end {
	__u32 size;
	__u32 win;
	__u32 flags;
	__u32 reserved;
	__u64 gen;
};

#define RDMAPLUS_RVMA_QP_F_FORGET	(1U << 0)
#define RDMAPLUS_RVMA_MAX_QPS		65536	/* named QPs per file */

/**
 * struct rdmaplus_rvma_qp - RDMAPLUS_IOC_RVMA_QP (ABI 8)
 * @size:	sizeof(struct rdmaplus_rvma_qp)
 * @qpn:	a local queue pair number, 0..0xffffff
 * @flags:	0 to name the QP, RDMAPLUS_RVMA_QP_F_FORGET to forget it
 * @reserved:	zero
 *
 * For buffers posted with RDMAPLUS_RVMA_POST_F_RKEY the module keeps the
 * key of each queue pair's message in progress (see struct
 * rdmaplus_rvma_post), and keeping a key for a QP it has not seen before
 * takes memory, allocated while the packet is placed: if that fails, the
 * packet is refused. Naming a QP that may receive writes into this
 * file's buffers allocates its entry now, so that its messages never
 * need memory on their way in. Naming a named QP does nothing; ENOSPC
 * beyond RDMAPLUS_RVMA_MAX_QPS named. Forgetting an unnamed QP does
 * nothing. Forget a QP before destroying it (its number is reused); a
 * message still in progress on it keeps its key until its last packet.
 * The file's names go with the file.
 */
struct rdmaplus_rvma_qp {
	__u32 size;
	__u32 qpn;
	__u32 flags;
	__u32 reserved;
};

/*
 * A completion record: eight little-endian 64-bit words, the layout of
 * pkg/rvma's Completion. Word 0 (seq) is odd while the module writes the
 * record and grows by 2 with each publication; word 7 repeats it.
 */
#define RDMAPLUS_RVMA_REC_SEQ	0
#define RDMAPLUS_RVMA_REC_EPOCH	1	/* the buffer's gen */
#define RDMAPLUS_RVMA_REC_ADDR	2	/* its iova */
#define RDMAPLUS_RVMA_REC_LEN	3	/* bytes counted */
#define RDMAPLUS_RVMA_REC_OPS	4	/* messages counted */
#define RDMAPLUS_RVMA_REC_CAP	5	/* its length */
#define RDMAPLUS_RVMA_REC_FLAGS	6	/* RDMAPLUS_RVMA_REC_* */
#define RDMAPLUS_RVMA_REC_SEQ2	7

#define RDMAPLUS_IOC_VERSION	_IOR(RDMAPLUS_IOC_MAGIC, 0x00, struct rdmaplus_version)
#define RDMAPLUS_IOC_AA_DOMAIN_CREATE \
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x10, struct rdmaplus_aa_domain_create)
#define RDMAPLUS_IOC_AA_DOMAIN_DESTROY \
	_IOW(RDMAPLUS_IOC_MAGIC, 0x11, struct rdmaplus_aa_domain)
#define RDMAPLUS_IOC_AA_NOTIFY	_IOW(RDMAPLUS_IOC_MAGIC, 0x12, struct rdmaplus_aa_notify)
#define RDMAPLUS_IOC_AA_ARM	_IOW(RDMAPLUS_IOC_MAGIC, 0x13, struct rdmaplus_aa_arm)
#define RDMAPLUS_IOC_AA_DISARM	_IOW(RDMAPLUS_IOC_MAGIC, 0x14, struct rdmaplus_aa_arm)
#define RDMAPLUS_IOC_AA_STATS	_IOWR(RDMAPLUS_IOC_MAGIC, 0x15, struct rdmaplus_aa_stats)
#define RDMAPLUS_IOC_RVMA_SETUP \
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x20, struct rdmaplus_rvma_setup)
#define RDMAPLUS_IOC_RVMA_WIN_CREATE \
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x21, struct rdmaplus_rvma_win)
#define RDMAPLUS_IOC_RVMA_WIN_DESTROY \
	_IOW(RDMAPLUS_IOC_MAGIC, 0x22, struct rdmaplus_rvma_win_destroy)
#define RDMAPLUS_IOC_RVMA_POST	_IOW(RDMAPLUS_IOC_MAGIC, 0x23, struct rdmaplus_rvma_post)
#define RDMAPLUS_IOC_RVMA_END	_IOW(RDMAPLUS_IOC_MAGIC, 0x24, struct rdmaplus_rvma_end)
/*
 * RDMAPLUS_IOC_RVMA_ARM (argument 0): signal the eventfd once, at the next
 * publication. A waiter arms, then reads the done counters, then sleeps on
 * the eventfd: a publication before the arm shows in the counters, one
 * after it signals. Unarmed publications signal nothing, so a process that
 * polls its records (and does not arm) takes no wake-ups. EINVAL without
 * an eventfd or with a non-zero argument.
 */
#define RDMAPLUS_IOC_RVMA_ARM	_IO(RDMAPLUS_IOC_MAGIC, 0x25)
#define RDMAPLUS_IOC_RVMA_POSTV	\
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x26, struct rdmaplus_rvma_postv)
#define RDMAPLUS_IOC_RVMA_QP	_IOW(RDMAPLUS_IOC_MAGIC, 0x27, struct rdmaplus_rvma_qp)
#define RDMAPLUS_IOC_RVMA_GUARD	\
	_IOW(RDMAPLUS_IOC_MAGIC, 0x28, struct rdmaplus_rvma_guard)
#define RDMAPLUS_IOC_JBMT_REG	\
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x30, struct rdmaplus_jbmt_reg)
#define RDMAPLUS_IOC_JBMT_DEREG	\
	_IOW(RDMAPLUS_IOC_MAGIC, 0x31, struct rdmaplus_jbmt_dereg)
#define RDMAPLUS_IOC_JBMT_CONNECT	\
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x32, struct rdmaplus_jbmt_connect)
#define RDMAPLUS_IOC_JBMT_OP	\
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x33, struct rdmaplus_jbmt_op)
#define RDMAPLUS_IOC_JBMT_SETUP	\
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x34, struct rdmaplus_jbmt_setup)
#define RDMAPLUS_IOC_JBMT_SUBMIT	\
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x35, struct rdmaplus_jbmt_submit)
#define RDMAPLUS_IOC_JBMT_ADVISE	\
	_IOWR(RDMAPLUS_IOC_MAGIC, 0x36, struct rdmaplus_jbmt_advise)

#endif /* _UAPI_RDMAPLUS_H */
