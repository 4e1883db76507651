/*
 * sockproto: the wire protocol of rdmaplus's sockets over RDMA
 * (docs/sockets.md).
 *
 * One definition for the LD_PRELOAD shim (C) and for pkg/sockets (Go,
 * mirrored in internal/sockwire and checked against this header
 * with shared test vectors). C11 and libc only.
 *
 * Control records are fixed-size, little-endian, and start with a 16-byte
 * header carrying a magic, the protocol version, the record type, the
 * record's whole length and the connection's attachment epoch. Records
 * travel as inline SENDs on the connection's QP (SWITCH, FIN, ABORT) or
 * through rvmad, in order per connection (ATTACH_REQ, ATTACH_REP,
 * ATTACH_NACK, DEMOTE): a DEMOTE must arrive when the QP is gone. Between a process and rvmad, and between the rvmads of two hosts,
 * each of those records follows a ROUTE naming its connection; a process
 * announces the connections it owns with REGISTER and UNREGISTER, and
 * rvmad answers with RESULT (see "The broker's records" below). Every
 * field is naturally aligned, padding is explicit and must be zero, and
 * every structure's size is checked at compile time.
 *
 * The structures hold wire values: store with sockproto_put*() and load
 * with sockproto_get*() (or use the record helpers below), never by
 * assigning host integers, so the layout is the same on any host.
 *
 * Data never goes in a record: each direction of a connection has a ring
 * owned by its receiver (struct sockproto_ring, power-of-two size) into
 * which the sender RDMA-WRITEs with immediate (SOCKPROTO_IMM), and a
 * control block (struct sockproto_ctrl) on each side into which the peer
 * RDMA-WRITEs its credits.
 */
#ifndef SOCKPROTO_H
#define SOCKPROTO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SOCKPROTO_MAGIC		0x5352u	/* bytes 'R' 'S' on the wire */
#define SOCKPROTO_VERSION	1u

/* Record types. */
enum sockproto_type {
	SOCKPROTO_ATTACH_REQ	= 1,	/* rvmad: attach RDMA to this connection */
	SOCKPROTO_ATTACH_REP	= 2,	/* rvmad: accepted; the acceptor's endpoint */
	SOCKPROTO_ATTACH_NACK	= 3,	/* rvmad: refused, with a reason */
	SOCKPROTO_SWITCH	= 4,	/* QP: my bytes from offset on go by the ring */
	SOCKPROTO_FIN		= 5,	/* QP: my stream ends at offset */
	SOCKPROTO_ABORT		= 6,	/* QP: connection reset, with a reason */
	SOCKPROTO_DEMOTE	= 7,	/* rvmad: back to TCP; I consumed this much */
	/* 8 is reserved: never used again (it named a record no one sent) */
	SOCKPROTO_ROUTE		= 9,	/* rvmad: the next record is about this connection */
	SOCKPROTO_REGISTER	= 10,	/* rvmad: I own this connection; hand me its records */
	SOCKPROTO_UNREGISTER	= 11,	/* rvmad: forget this connection */
	SOCKPROTO_RESULT	= 12,	/* rvmad: the broker's answer to a request */
	SOCKPROTO_STATS		= 13,	/* rvmad: my statistics segment (a memfd passed along) */
	SOCKPROTO_LIST		= 14,	/* rvmad: list my connections (rvmad sockets) */
	SOCKPROTO_DEVICE	= 15,	/* rvmad: this RDMA device is going away */
	SOCKPROTO_TYPE_MAX	= 15,
};

/*
 * Reasons, for ATTACH_NACK, DEMOTE and ABORT. Zero is never valid.
 */
enum sockproto_reason {
	SOCKPROTO_R_VERSION		= 1,	/* the peer speaks another version */
	SOCKPROTO_R_NO_OWNER		= 2,	/* no process with the shim owns the tuple */
	SOCKPROTO_R_NO_DAEMON		= 3,	/* no rvmad (or no pairing port) at the peer */
	SOCKPROTO_R_NO_DEVICE		= 4,	/* no RDMA device or no GID reaching the peer */
	SOCKPROTO_R_NO_MEMORY		= 5,	/* ring, MR or QP could not be allocated */
	SOCKPROTO_R_SHUTDOWN		= 6,	/* the connection is closing */
	SOCKPROTO_R_DENIED		= 7,	/* the tuple's owner did not check out */
	SOCKPROTO_R_DISABLED		= 8,	/* policy: not for this socket */
	SOCKPROTO_R_BUSY		= 9,	/* an attachment is already under way */
	SOCKPROTO_R_EXEC		= 10,	/* exec into an image without the shim */
	SOCKPROTO_R_FD_PASSED		= 11,	/* the fd left by SCM_RIGHTS */
	SOCKPROTO_R_FDOPEN		= 12,	/* stdio took the fd */
	SOCKPROTO_R_SPLICE		= 13,	/* splice, tee, vmsplice, sendfile */
	SOCKPROTO_R_QP_ERROR		= 14,	/* the QP failed while the anchor lives */
	SOCKPROTO_R_TCP_AFTER_SWITCH	= 15,	/* bytes on the anchor after the switch */
	SOCKPROTO_R_PEER		= 16,	/* the peer demoted */
	SOCKPROTO_R_CLOSE_UNREAD	= 17,	/* closed with unread data */
	SOCKPROTO_R_LINGER0		= 18,	/* SO_LINGER {1, 0} */
	SOCKPROTO_R_PROTOCOL		= 19,	/* a malformed or unexpected record */
	SOCKPROTO_R_TIMEOUT		= 20,	/* the attachment took too long */
	SOCKPROTO_R_APP			= 21,	/* asked for by the program (pkg/sockets) */
	SOCKPROTO_R_LIMIT		= 22,	/* a per-user cap of rvmad's was reached */
	SOCKPROTO_R_DEVICE		= 23,	/* the RDMA device is being removed */
	SOCKPROTO_R_MAX			= 23,
};

/* Limits of the endpoint fields. */
#define SOCKPROTO_RING_LOG2_MIN	12	/* 4 KiB */
#define SOCKPROTO_RING_LOG2_MAX	30	/* 1 GiB */
#define SOCKPROTO_QPN_MAX	0xffffffu
#define SOCKPROTO_PSN_MAX	0xffffffu
#define SOCKPROTO_MTU_MIN	1	/* IBV_MTU_256 */
#define SOCKPROTO_MTU_MAX	5	/* IBV_MTU_4096 */
#define SOCKPROTO_AF_INET	2	/* Linux's AF_INET */
#define SOCKPROTO_AF_INET6	10	/* Linux's AF_INET6 */

/**
 * struct sockproto_hdr - the first 16 bytes of every record
 * @magic:	SOCKPROTO_MAGIC
 * @version:	SOCKPROTO_VERSION
 * @type:	enum sockproto_type
 * @length:	the whole record in bytes (each type has exactly one size)
 * @flags:	none are defined: zero
 * @epoch:	the attachment this record belongs to, from 1; a connection's
 *		every new attachment (after a demote) takes the next one
 * @reserved:	zero
 */
struct sockproto_hdr {
	uint16_t magic;
	uint8_t version;
	uint8_t type;
	uint16_t length;
	uint16_t flags;
	uint32_t epoch;
	uint32_t reserved;
};

/**
 * struct sockproto_offset_rec - SWITCH and FIN
 * @offset:	a byte offset in the sender's outgoing stream. SWITCH: the
 *		number of bytes the sender wrote to the anchor; the receiver
 *		reads the anchor up to it, then the ring. FIN: the stream's
 *		length; the receiver reports end of file once it consumed it.
 */
struct sockproto_offset_rec {
	struct sockproto_hdr hdr;
	uint64_t offset;
};

/**
 * struct sockproto_demote - DEMOTE
 * @consumed:	bytes of the peer's stream the sender of DEMOTE consumed; it
 *		reads everything beyond from the anchor, and the peer sends
 *		its bytes from max(consumed, its switch offset) there
 * @reason:	enum sockproto_reason
 * @pad:	zero
 */
struct sockproto_demote {
	struct sockproto_hdr hdr;
	uint64_t consumed;
	uint16_t reason;
	uint16_t pad[3];
};

/**
 * struct sockproto_reason_rec - ATTACH_NACK and ABORT
 * @reason:	enum sockproto_reason
 * @pad:	zero
 */
struct sockproto_reason_rec {
	struct sockproto_hdr hdr;
	uint16_t reason;
	uint16_t pad[3];
};

/**
 * struct sockproto_tuple - a TCP connection as its sender sees it
 * @family:	SOCKPROTO_AF_INET or SOCKPROTO_AF_INET6
 * @local_port:	the sender's port (a number, not network order)
 * @remote_port: the peer's port
 * @pad:	zero
 * @local_addr:	the sender's address, 16 bytes (IPv4 as ::ffff:a.b.c.d)
 * @remote_addr: the peer's address
 */
struct sockproto_tuple {
	uint16_t family;
	uint16_t local_port;
	uint16_t remote_port;
	uint16_t pad;
	uint8_t local_addr[16];
	uint8_t remote_addr[16];
};

/**
 * struct sockproto_endpoint - one side's RDMA resources for a connection
 * @gid:	the side's GID (RoCE v2)
 * @qpn:	its RC QP number (24 bits)
 * @psn:	its initial packet sequence number (24 bits)
 * @ring_addr:	address of the ring it receives into (struct sockproto_ring
 *		data, not its header)
 * @ring_rkey:	rkey of the ring (remote write)
 * @ring_log2:	ring size is 1 << ring_log2 bytes (SOCKPROTO_RING_LOG2_MIN..MAX)
 * @mtu:	path MTU, ibv_mtu value (SOCKPROTO_MTU_MIN..MAX)
 * @pad:	zero
 * @ctrl_addr:	address of its struct sockproto_ctrl
 * @ctrl_rkey:	rkey of the control block (remote write)
 * @pad2:	zero
 */
struct sockproto_endpoint {
	uint8_t gid[16];
	uint32_t qpn;
	uint32_t psn;
	uint64_t ring_addr;
	uint32_t ring_rkey;
	uint8_t ring_log2;
	uint8_t mtu;
	uint16_t pad;
	uint64_t ctrl_addr;
	uint32_t ctrl_rkey;
	uint32_t pad2;
};

/**
 * struct sockproto_attach - ATTACH_REQ and ATTACH_REP
 * @tuple:	the connection as the record's sender sees it
 * @incarnation: the sender's process incarnation (pid and start time
 *		folded by rvmad), so a re-used pid is told apart
 * @ep:		the sender's endpoint
 */
struct sockproto_attach {
	struct sockproto_hdr hdr;
	struct sockproto_tuple tuple;
	uint64_t incarnation;
	struct sockproto_endpoint ep;
};

/*
 * The broker's records. rvmad's Unix socket (default
 * /run/rvmad/sockets.sock) is SOCK_SEQPACKET: each message is one record
 * or a ROUTE followed by one record, never more. The pairing port between
 * two rvmads (TCP, default 7473) carries the same messages back to back.
 *
 * - REGISTER: the process owns the connection and proves it: the message
 *   carries the connection's socket as SCM_RIGHTS ancillary data, exactly
 *   one descriptor. rvmad checks that it is a socket whose addresses
 *   (getsockname, getpeername) are @tuple and that sock_diag finds
 *   @tuple's TCP socket with its inode, closes its copy at once, and
 *   answers RESULT. No descriptor, several, or another file or socket get
 *   SOCKPROTO_R_DENIED, as a connection that does not exist does. A
 *   connection must be registered before any record about it; the latest
 *   process to register it (after fork or exec) gets its records.
 *   Descriptors passed with any other message: rvmad disconnects.
 * - UNREGISTER: forget it (at close); RESULT answers. A disconnect from
 *   rvmad's socket unregisters everything the process had registered.
 * - ROUTE, then ATTACH_REQ, ATTACH_REP, ATTACH_NACK or DEMOTE: the record
 *   is about the connection @tuple; both have the same epoch.
 * - RESULT: rvmad's answer to REGISTER and UNREGISTER (@reason 0: done),
 *   and to a routed record it could not take or deliver (@reason:
 *   SOCKPROTO_R_DENIED, not registered by this process;
 *   SOCKPROTO_R_NO_DAEMON, the peer's rvmad cannot be reached;
 *   SOCKPROTO_R_NO_OWNER, for a DEMOTE: no process owns the connection on
 *   the peer any more, so nothing will answer it). An ATTACH_REQ is
 *   answered with ROUTE and ATTACH_NACK instead. Between two rvmads, a
 *   RESULT about a DEMOTE travels behind a ROUTE, as the DEMOTE did.
 *
 * A tuple in these records is the connection as the host sending the
 * message sees it (local: that host's end): rvmad turns the peer host's
 * view into its process's view, so a process always finds its own.
 * REGISTER's and UNREGISTER's epoch is the caller's (any but 0) and
 * RESULT echoes the epoch of the record it answers.
 *
 * - STATS: the process's statistics segment (struct sockproto_stats
 *   below), a sealed memfd passed as SCM_RIGHTS, exactly one descriptor;
 *   sent once per broker connection, before the first REGISTER. rvmad maps
 *   it read-only and never answers; a segment it refuses (not a sealed
 *   memfd of @size bytes, a bad header, the user's cap) is ignored, and
 *   the process's connections attach all the same.
 * - LIST: asked by `rvmad sockets` on a connection of its own: rvmad
 *   answers with the connections of the asking user's processes (every
 *   process for root), as text (rvmad's own format, not a record) in one
 *   or more messages, then closes the connection.
 * - DEVICE: rvmad to every process, unasked: the RDMA device @name is
 *   being removed (`rdma link delete`, a driver unbound). The kernel waits
 *   for every process to close the device before the removal ends, so a
 *   process demotes the connections attached through it
 *   (SOCKPROTO_R_DEVICE) and closes it once they are released. The
 *   epoch is rvmad's count of such notices, from 1.
 */

/**
 * struct sockproto_route - ROUTE and UNREGISTER
 * @tuple:	the connection, as the host sending the message sees it
 */
struct sockproto_route {
	struct sockproto_hdr hdr;
	struct sockproto_tuple tuple;
};

/**
 * struct sockproto_register - REGISTER
 * @tuple:	the connection, as the registering process sees it
 * @fd:		the process's number of the descriptor it passes (0 to
 *		INT32_MAX), informative only (rvmad's logs): the socket
 *		passed with the message proves ownership, not this number
 * @pad:	zero
 */
struct sockproto_register {
	struct sockproto_hdr hdr;
	struct sockproto_tuple tuple;
	uint32_t fd;
	uint32_t pad;
};

/**
 * struct sockproto_result - RESULT
 * @tuple:	the connection the answered record named
 * @request:	the type of the answered record
 * @pad:	zero
 * @reason:	0: done; else enum sockproto_reason (SOCKPROTO_R_DENIED: not
 *		yours or no such connection, the same answer for both;
 *		SOCKPROTO_R_LIMIT: the user's cap of registrations reached;
 *		SOCKPROTO_R_NO_DAEMON: the peer's rvmad cannot be reached)
 * @pad2:	zero
 */
struct sockproto_result {
	struct sockproto_hdr hdr;
	struct sockproto_tuple tuple;
	uint8_t request;
	uint8_t pad;
	uint16_t reason;
	uint32_t pad2;
};

/**
 * struct sockproto_stats_rec - STATS
 * @size:	the segment's size in bytes (SOCKPROTO_STATS_MIN to
 *		SOCKPROTO_STATS_MAX), which is the memfd's size
 * @pad:	zero
 */
struct sockproto_stats_rec {
	struct sockproto_hdr hdr;
	uint32_t size;
	uint32_t pad;
};

/**
 * struct sockproto_list - LIST
 * @reserved:	zero
 */
struct sockproto_list {
	struct sockproto_hdr hdr;
	uint64_t reserved;
};

#define SOCKPROTO_DEVICE_NAME_MAX 64	/* IB_DEVICE_NAME_MAX, its NUL included */

/**
 * struct sockproto_device - DEVICE
 * @name:	the device's name, as ibv_get_device_name() gives it: at
 *		least one byte, NUL-terminated, every byte after the first
 *		NUL zero
 */
struct sockproto_device {
	struct sockproto_hdr hdr;
	char name[SOCKPROTO_DEVICE_NAME_MAX];
};

/*
 * The statistics segment: a process's counters and a table of its
 * attachable connections, in a memfd the process writes and rvmad maps
 * read-only (docs/sockets.md, "Statistics"). It never leaves the host:
 * counters are host-order 64-bit words, written with relaxed atomics,
 * that only grow (live is a gauge); a tuple is in wire order, as in the
 * records. The memfd is sealed against shrinking and growing
 * (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL), so a mapping of it never
 * faults; rvmad still treats every byte as the process's to scribble on.
 */
#define SOCKPROTO_STATS_MAGIC	0x54535352u	/* "RSST" in memory, little-endian */
#define SOCKPROTO_STATS_VERSION	1u
#define SOCKPROTO_STATS_REASONS	32	/* entries of the by-reason arrays (> SOCKPROTO_R_MAX) */
#define SOCKPROTO_STATS_SLOTS_MAX 65536

/* Indices of struct sockproto_stats_counters.conns: how connections were established. */
enum sockproto_stats_role {
	SOCKPROTO_STATS_CLIENT	= 3,	/* connect() */
	SOCKPROTO_STATS_SERVER	= 4,	/* accept() */
	SOCKPROTO_STATS_ADOPTED	= 5,	/* found open (inherited across exec, received) */
};

/**
 * struct sockproto_stats_counters - a process's totals
 * @conns:	sockets followed, by role (the shim's enum conn_role: new,
 *		listener, connecting, client, server, adopted)
 * @connect_failed: failed connects
 * @inherited:	connections inherited by fork (a child's)
 * @live:	gauge: tracked sockets open now
 * @bytes_in:	bytes the program read from its connections, all paths
 * @bytes_out:	bytes the program wrote, all paths
 * @rdma_in:	of @bytes_in, read from rings (RDMA)
 * @rdma_out:	of @bytes_out, written into the peers' rings
 * @rdma_writes: RDMA WRITEs of data posted
 * @attachable:	connections registered with rvmad
 * @attached:	attachments made (upgrades)
 * @demoted:	demotes (this side's and answers to the peer's)
 * @fd_passed:	tracked fds sent away with SCM_RIGHTS
 * @fdopen:	fdopen() of tracked fds
 * @splice:	sendfile, splice, tee, vmsplice of tracked fds
 * @execs:	exec calls
 * @spawns:	posix_spawn calls
 * @demotes:	demotes by enum sockproto_reason (peer: the peer asked)
 * @fallbacks:	attachable connections that stayed on TCP, by the reason
 *		of the attachment's refusal or failure
 */
struct sockproto_stats_counters {
	uint64_t conns[8];
	uint64_t connect_failed;
	uint64_t inherited;
	uint64_t live;
	uint64_t bytes_in;
	uint64_t bytes_out;
	uint64_t rdma_in;
	uint64_t rdma_out;
	uint64_t rdma_writes;
	uint64_t attachable;
	uint64_t attached;
	uint64_t demoted;
	uint64_t fd_passed;
	uint64_t fdopen;
	uint64_t splice;
	uint64_t execs;
	uint64_t spawns;
	uint64_t demotes[SOCKPROTO_STATS_REASONS];
	uint64_t fallbacks[SOCKPROTO_STATS_REASONS];
};

/**
 * struct sockproto_stats - the segment's header, at its start
 * @magic:	SOCKPROTO_STATS_MAGIC
 * @version:	SOCKPROTO_STATS_VERSION
 * @hdr_size:	sizeof(struct sockproto_stats): the first slot's offset
 * @slot_size:	sizeof(struct sockproto_stats_slot)
 * @nslots:	slots in the segment (1 to SOCKPROTO_STATS_SLOTS_MAX)
 * @used:	slots [0, used) may be in use (a high-water mark)
 * @pid:	the process, informative (rvmad trusts SO_PEERCRED)
 * @reserved:	zero
 * @c:		the process's counters
 */
struct sockproto_stats {
	uint32_t magic;
	uint16_t version;
	uint16_t hdr_size;
	uint32_t slot_size;
	uint32_t nslots;
	uint32_t used;
	uint32_t pid;
	uint64_t reserved[5];
	struct sockproto_stats_counters c;
};

/* Slot states: 0 is free; otherwise the attachment's phase, + closing. */
enum sockproto_stats_state {
	SOCKPROTO_SLOT_FREE	= 0,
	SOCKPROTO_SLOT_TCP	= 1,	/* registered, no attachment (never, refused, demoted) */
	SOCKPROTO_SLOT_ATTACHING = 2,
	SOCKPROTO_SLOT_ATTACHED	= 3,
	SOCKPROTO_SLOT_DEMOTING	= 4,
	SOCKPROTO_SLOT_CLOSING	= 5,	/* the program closed it; the shim finishes it */
	SOCKPROTO_SLOT_STATE_MAX = 5,
};

/**
 * struct sockproto_stats_slot - one attachable connection
 * @gen:	odd while the process fills the slot for a new connection;
 *		a reader that sees it odd, or changed across its copy, skips it
 * @state:	enum sockproto_stats_state
 * @path:	0: both directions on TCP; 1: a direction is on RDMA
 * @last_reason: the last demote's or fallback's enum sockproto_reason (0: none)
 * @epoch:	the attachment's epoch (0: never asked)
 * @fd:		the process's fd number when registered, informative
 * @tuple:	the connection as the process sees it (wire order)
 * @bytes_in:	bytes the program read, all paths, since the connection began
 * @bytes_out:	bytes the program wrote, all paths
 * @rdma_in:	of @bytes_in, read from the ring
 * @rdma_out:	of @bytes_out, written into the peer's ring
 * @rdma_writes: RDMA WRITEs of data posted
 */
struct sockproto_stats_slot {
	uint32_t gen;
	uint8_t state;
	uint8_t path;
	uint16_t last_reason;
	uint32_t epoch;
	uint32_t fd;
	struct sockproto_tuple tuple;
	uint64_t bytes_in;
	uint64_t bytes_out;
	uint64_t rdma_in;
	uint64_t rdma_out;
	uint64_t rdma_writes;
};

#define SOCKPROTO_STATS_HDR_SIZE	768
#define SOCKPROTO_STATS_SLOT_SIZE	96
#define SOCKPROTO_STATS_MIN		(SOCKPROTO_STATS_HDR_SIZE + SOCKPROTO_STATS_SLOT_SIZE)
#define SOCKPROTO_STATS_MAX		(SOCKPROTO_STATS_HDR_SIZE + \
					 SOCKPROTO_STATS_SLOTS_MAX * SOCKPROTO_STATS_SLOT_SIZE)

/**
 * struct sockproto_ctrl - a side's control block, written by the peer
 * @credit:	bytes of this side's outgoing stream the peer consumed
 *		(monotonic; written every quarter ring, at FIN, or at once when
 *		this side said it is blocked)
 * @blocked:	offset of the peer's outgoing stream at which the peer is
 *		blocked for credits (monotonic; 0 while never blocked)
 * @epoch:	the attachment the values belong to
 * @reserved:	zero
 * @pad:	zero; one cache line in all
 *
 * The peer writes each 8-byte field with its own aligned RDMA WRITE;
 * values only grow, so a reader takes the largest it saw.
 */
struct sockproto_ctrl {
	uint64_t credit;
	uint64_t blocked;
	uint32_t epoch;
	uint32_t reserved;
	uint64_t pad[5];
};

#define SOCKPROTO_RING_MAGIC	0x52534f4bu	/* "KOSR" in memory, little-endian */
#define SOCKPROTO_NO_FIN	UINT64_MAX

/**
 * struct sockproto_ring - header of a receive ring in the shared memfd
 * @magic:	SOCKPROTO_RING_MAGIC
 * @version:	SOCKPROTO_VERSION
 * @log2size:	the ring's data is 1 << log2size bytes, right after the header
 * @flags:	zero
 * @epoch:	the attachment writing into the ring
 * @reserved:	zero
 * @base:	the stream offset of the sender's SWITCH: the ring's first byte
 * @prod:	stream offset up to which data arrived (advanced by the
 *		receiver on each WRITE_WITH_IMM completion)
 * @cons:	stream offset the program consumed
 * @fin:	the FIN offset, SOCKPROTO_NO_FIN before FIN
 * @credited:	the last @cons written into the sender's control block
 * @pad:	zero; 64 bytes in all
 *
 * The byte at stream offset o is data[o & ((1 << log2size) - 1)]. Only
 * the receiver writes the header; it lives in memory shared with forked
 * and exec'd incarnations of the owner.
 */
struct sockproto_ring {
	uint32_t magic;
	uint16_t version;
	uint8_t log2size;
	uint8_t flags;
	uint32_t epoch;
	uint32_t reserved;
	uint64_t base;
	uint64_t prod;
	uint64_t cons;
	uint64_t fin;
	uint64_t credited;
	uint64_t pad;
};

/*
 * Immediate data of a WRITE_WITH_IMM: type in the top 4 bits, length
 * below. The value goes through htonl() into ibv_send_wr.imm_data, as
 * verbs carries immediates in network order. Each consumes one receive
 * of the target's QP, so each is a completion there:
 * - SOCKPROTO_IMM_DATA: bytes written into the target's ring at the
 *   writer's stream offset (mod the ring's size); the target advances its
 *   producer offset by the length, in completion order.
 * - SOCKPROTO_IMM_CTRL: one 8-byte field of the target's control block
 *   (credit or blocked) written; length 8. The target reads its control
 *   block again. A control write that needs no wake-up may be a plain
 *   RDMA WRITE instead.
 */
#define SOCKPROTO_IMM_DATA	1u
#define SOCKPROTO_IMM_CTRL	2u
#define SOCKPROTO_IMM_LEN_MAX	0x0fffffffu
#define SOCKPROTO_IMM(type, len)	(((uint32_t)(type) << 28) | ((uint32_t)(len) & SOCKPROTO_IMM_LEN_MAX))
#define SOCKPROTO_IMM_TYPE(imm)	((uint32_t)(imm) >> 28)
#define SOCKPROTO_IMM_LEN(imm)	((uint32_t)(imm) & SOCKPROTO_IMM_LEN_MAX)

/* Record sizes. */
#define SOCKPROTO_HDR_SIZE	16
#define SOCKPROTO_OFFSET_SIZE	24
#define SOCKPROTO_DEMOTE_SIZE	32
#define SOCKPROTO_REASON_SIZE	24
#define SOCKPROTO_ATTACH_SIZE	120
#define SOCKPROTO_ROUTE_SIZE	56	/* ROUTE, UNREGISTER */
#define SOCKPROTO_REGISTER_SIZE	64
#define SOCKPROTO_RESULT_SIZE	64
#define SOCKPROTO_STATS_REC_SIZE 24
#define SOCKPROTO_LIST_SIZE	24
#define SOCKPROTO_DEVICE_SIZE	80
#define SOCKPROTO_RECORD_MAX	SOCKPROTO_ATTACH_SIZE

_Static_assert(sizeof(struct sockproto_hdr) == SOCKPROTO_HDR_SIZE, "hdr");
_Static_assert(sizeof(struct sockproto_offset_rec) == SOCKPROTO_OFFSET_SIZE, "offset");
_Static_assert(sizeof(struct sockproto_demote) == SOCKPROTO_DEMOTE_SIZE, "demote");
_Static_assert(sizeof(struct sockproto_reason_rec) == SOCKPROTO_REASON_SIZE, "reason");
_Static_assert(sizeof(struct sockproto_tuple) == 40, "tuple");
_Static_assert(sizeof(struct sockproto_endpoint) == 56, "endpoint");
_Static_assert(sizeof(struct sockproto_attach) == SOCKPROTO_ATTACH_SIZE, "attach");
_Static_assert(sizeof(struct sockproto_route) == SOCKPROTO_ROUTE_SIZE, "route");
_Static_assert(sizeof(struct sockproto_register) == SOCKPROTO_REGISTER_SIZE, "register");
_Static_assert(sizeof(struct sockproto_result) == SOCKPROTO_RESULT_SIZE, "result");
_Static_assert(sizeof(struct sockproto_stats_rec) == SOCKPROTO_STATS_REC_SIZE, "stats rec");
_Static_assert(sizeof(struct sockproto_list) == SOCKPROTO_LIST_SIZE, "list");
_Static_assert(sizeof(struct sockproto_device) == SOCKPROTO_DEVICE_SIZE, "device");
_Static_assert(sizeof(struct sockproto_stats) == SOCKPROTO_STATS_HDR_SIZE, "stats");
_Static_assert(sizeof(struct sockproto_stats_slot) == SOCKPROTO_STATS_SLOT_SIZE, "stats slot");
_Static_assert(offsetof(struct sockproto_stats, c) == 64, "stats counters");
_Static_assert(SOCKPROTO_STATS_REASONS > SOCKPROTO_R_MAX, "stats reasons");
_Static_assert(sizeof(struct sockproto_ctrl) == 64, "ctrl");
_Static_assert(sizeof(struct sockproto_ring) == 64, "ring");
_Static_assert(offsetof(struct sockproto_attach, ep) == 64, "attach ep");

/* Little-endian stores and loads, whatever the host's byte order. */
static inline void sockproto_put16(uint16_t *p, uint16_t v)
{
	uint8_t b[2] = { (uint8_t)v, (uint8_t)(v >> 8) };

	memcpy(p, b, sizeof(b));
}

static inline void sockproto_put32(uint32_t *p, uint32_t v)
{
	uint8_t b[4];
	int i;

	for (i = 0; i < 4; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	memcpy(p, b, sizeof(b));
}

static inline void sockproto_put64(uint64_t *p, uint64_t v)
{
	uint8_t b[8];
	int i;

	for (i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	memcpy(p, b, sizeof(b));
}

static inline uint16_t sockproto_get16(const void *p)
{
	const uint8_t *b = p;

	return (uint16_t)(b[0] | b[1] << 8);
}

static inline uint32_t sockproto_get32(const void *p)
{
	const uint8_t *b = p;

	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

static inline uint64_t sockproto_get64(const void *p)
{
	const uint8_t *b = p;

	return (uint64_t)sockproto_get32(b) | (uint64_t)sockproto_get32(b + 4) << 32;
}

/* The one size of each record type, 0 for an unknown type. */
static inline size_t sockproto_size(unsigned int type)
{
	switch (type) {
	case SOCKPROTO_ATTACH_REQ:
	case SOCKPROTO_ATTACH_REP:
		return SOCKPROTO_ATTACH_SIZE;
	case SOCKPROTO_ATTACH_NACK:
	case SOCKPROTO_ABORT:
		return SOCKPROTO_REASON_SIZE;
	case SOCKPROTO_SWITCH:
	case SOCKPROTO_FIN:
		return SOCKPROTO_OFFSET_SIZE;
	case SOCKPROTO_DEMOTE:
		return SOCKPROTO_DEMOTE_SIZE;
	case SOCKPROTO_ROUTE:
	case SOCKPROTO_UNREGISTER:
		return SOCKPROTO_ROUTE_SIZE;
	case SOCKPROTO_REGISTER:
		return SOCKPROTO_REGISTER_SIZE;
	case SOCKPROTO_RESULT:
		return SOCKPROTO_RESULT_SIZE;
	case SOCKPROTO_STATS:
		return SOCKPROTO_STATS_REC_SIZE;
	case SOCKPROTO_LIST:
		return SOCKPROTO_LIST_SIZE;
	case SOCKPROTO_DEVICE:
		return SOCKPROTO_DEVICE_SIZE;
	}
	return 0;
}

/* Zeroes a record of @type and fills its header; returns its size (0: unknown type). */
static inline size_t sockproto_init(void *rec, unsigned int type, uint32_t epoch)
{
	struct sockproto_hdr *h = rec;
	size_t n = sockproto_size(type);

	if (!n)
		return 0;
	memset(rec, 0, n);
	sockproto_put16(&h->magic, SOCKPROTO_MAGIC);
	h->version = SOCKPROTO_VERSION;
	h->type = (uint8_t)type;
	sockproto_put16(&h->length, (uint16_t)n);
	sockproto_put32(&h->epoch, epoch);
	return n;
}

/* Errors of sockproto_check(), negated; internal/sockwire has the same numbers. */
enum sockproto_err {
	SOCKPROTO_E_SHORT	= 1,	/* fewer bytes than a header or than its length */
	SOCKPROTO_E_MAGIC	= 2,	/* not a sockproto record */
	SOCKPROTO_E_VERSION	= 3,	/* another protocol version */
	SOCKPROTO_E_TYPE	= 4,	/* unknown record type */
	SOCKPROTO_E_LENGTH	= 5,	/* length is not the type's size, or bytes are left over */
	SOCKPROTO_E_RESERVED	= 6,	/* flags, reserved or padding not zero */
	SOCKPROTO_E_FIELD	= 7,	/* a field out of its range */
};

static inline int sockproto_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	size_t i;

	for (i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

static inline int sockproto_reason_ok(const void *p)
{
	uint16_t r = sockproto_get16(p);

	return r >= 1 && r <= SOCKPROTO_R_MAX;
}

static inline int sockproto_check_tuple(const struct sockproto_tuple *t)
{
	uint16_t fam = sockproto_get16(&t->family);

	if (!sockproto_zero(&t->pad, sizeof(t->pad)))
		return -SOCKPROTO_E_RESERVED;
	if (fam != SOCKPROTO_AF_INET && fam != SOCKPROTO_AF_INET6)
		return -SOCKPROTO_E_FIELD;
	return 0;
}

static inline int sockproto_check_endpoint(const struct sockproto_endpoint *e)
{
	if (!sockproto_zero(&e->pad, sizeof(e->pad)) ||
	    !sockproto_zero(&e->pad2, sizeof(e->pad2)))
		return -SOCKPROTO_E_RESERVED;
	if (sockproto_get32(&e->qpn) > SOCKPROTO_QPN_MAX ||
	    sockproto_get32(&e->psn) > SOCKPROTO_PSN_MAX ||
	    e->ring_log2 < SOCKPROTO_RING_LOG2_MIN ||
	    e->ring_log2 > SOCKPROTO_RING_LOG2_MAX ||
	    e->mtu < SOCKPROTO_MTU_MIN || e->mtu > SOCKPROTO_MTU_MAX)
		return -SOCKPROTO_E_FIELD;
	return 0;
}

/*
 * sockproto_check - validates one whole record of @len bytes
 *
 * Returns 0 if @buf holds exactly one well-formed record, else the
 * negated enum sockproto_err of the first check that failed, in this
 * order: short, magic, version, type, length, reserved bits, fields.
 */
static inline int sockproto_check(const void *buf, size_t len)
{
	const struct sockproto_hdr *h = buf;
	const uint8_t *b = buf;
	size_t n;
	int err;

	if (len < SOCKPROTO_HDR_SIZE)
		return -SOCKPROTO_E_SHORT;
	if (sockproto_get16(&h->magic) != SOCKPROTO_MAGIC)
		return -SOCKPROTO_E_MAGIC;
	if (h->version != SOCKPROTO_VERSION)
		return -SOCKPROTO_E_VERSION;
	n = sockproto_size(h->type);
	if (!n)
		return -SOCKPROTO_E_TYPE;
	if (sockproto_get16(&h->length) != n)
		return -SOCKPROTO_E_LENGTH;
	if (len < n)
		return -SOCKPROTO_E_SHORT;
	if (len > n)
		return -SOCKPROTO_E_LENGTH;
	if (sockproto_get16(&h->flags) || sockproto_get32(&h->reserved))
		return -SOCKPROTO_E_RESERVED;
	if (sockproto_get32(&h->epoch) == 0)
		return -SOCKPROTO_E_FIELD;

	switch (h->type) {
	case SOCKPROTO_ATTACH_NACK:
	case SOCKPROTO_ABORT:
		if (!sockproto_zero(b + offsetof(struct sockproto_reason_rec, pad), 6))
			return -SOCKPROTO_E_RESERVED;
		if (!sockproto_reason_ok(b + offsetof(struct sockproto_reason_rec, reason)))
			return -SOCKPROTO_E_FIELD;
		return 0;
	case SOCKPROTO_DEMOTE:
		if (!sockproto_zero(b + offsetof(struct sockproto_demote, pad), 6))
			return -SOCKPROTO_E_RESERVED;
		if (!sockproto_reason_ok(b + offsetof(struct sockproto_demote, reason)) ||
		    sockproto_get64(b + offsetof(struct sockproto_demote, consumed)) > INT64_MAX)
			return -SOCKPROTO_E_FIELD;
		return 0;
	case SOCKPROTO_ATTACH_REQ:
	case SOCKPROTO_ATTACH_REP: {
		const struct sockproto_attach *a = buf;

		err = sockproto_check_tuple(&a->tuple);
		if (err)
			return err;
		return sockproto_check_endpoint(&a->ep);
	}
	case SOCKPROTO_SWITCH:
	case SOCKPROTO_FIN:
		if (sockproto_get64(b + offsetof(struct sockproto_offset_rec, offset)) > INT64_MAX)
			return -SOCKPROTO_E_FIELD;
		return 0;
	case SOCKPROTO_ROUTE:
	case SOCKPROTO_UNREGISTER:
		return sockproto_check_tuple(&((const struct sockproto_route *)buf)->tuple);
	case SOCKPROTO_REGISTER: {
		const struct sockproto_register *g = buf;

		err = sockproto_check_tuple(&g->tuple);
		if (err)
			return err;
		if (!sockproto_zero(&g->pad, sizeof(g->pad)))
			return -SOCKPROTO_E_RESERVED;
		if (sockproto_get32(&g->fd) > INT32_MAX)
			return -SOCKPROTO_E_FIELD;
		return 0;
	}
	case SOCKPROTO_RESULT: {
		const struct sockproto_result *s = buf;
		uint16_t r = sockproto_get16(&s->reason);

		err = sockproto_check_tuple(&s->tuple);
		if (err)
			return err;
		if (s->pad || !sockproto_zero(&s->pad2, sizeof(s->pad2)))
			return -SOCKPROTO_E_RESERVED;
		if (s->request < 1 || s->request > SOCKPROTO_TYPE_MAX || r > SOCKPROTO_R_MAX)
			return -SOCKPROTO_E_FIELD;
		return 0;
	}
	case SOCKPROTO_STATS: {
		const struct sockproto_stats_rec *st = buf;
		uint32_t size = sockproto_get32(&st->size);

		if (!sockproto_zero(&st->pad, sizeof(st->pad)))
			return -SOCKPROTO_E_RESERVED;
		if (size < SOCKPROTO_STATS_MIN || size > SOCKPROTO_STATS_MAX)
			return -SOCKPROTO_E_FIELD;
		return 0;
	}
	case SOCKPROTO_LIST:
		if (!sockproto_zero(b + SOCKPROTO_HDR_SIZE, 8))
			return -SOCKPROTO_E_RESERVED;
		return 0;
	case SOCKPROTO_DEVICE: {
		const char *name = ((const struct sockproto_device *)buf)->name;
		const char *nul = memchr(name, 0, SOCKPROTO_DEVICE_NAME_MAX);

		if (nul && !sockproto_zero(nul, (size_t)(name + SOCKPROTO_DEVICE_NAME_MAX - nul)))
			return -SOCKPROTO_E_RESERVED;
		if (!nul || nul == name)
			return -SOCKPROTO_E_FIELD;
		return 0;
	}
	}
	return -SOCKPROTO_E_TYPE;
}

#endif /* SOCKPROTO_H */
