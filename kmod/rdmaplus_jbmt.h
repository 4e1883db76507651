/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the JBMT files share (docs/jbmt.md): regions (rdmaplus_jbmt.c),
 * peers and their message transport (rdmaplus_jbmt_net.c), and transfers
 * (rdmaplus_jbmt_xfer.c).
 */
#ifndef RDMAPLUS_JBMT_H
#define RDMAPLUS_JBMT_H

#include <linux/build_bug.h>
#include <linux/completion.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/mm_types.h>
#include <linux/refcount.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

/* ---- files and regions -------------------------------------------------- */

/* what a file of /dev/rdmaplus keeps for JBMT */
struct rdmaplus_jbmt_ctx {
	struct rdmaplus_user *user;
	struct mutex mutex;		/* regions; held across a registration */
	struct list_head regions;
	long pinned;			/* pages its operations hold */
	bool closing;			/* released: operations end */
	struct jbmt_ring *ring;		/* asynchronous operations */
};

struct jbmt_ring;

/* whether the file of an operation is closing (it ends -ECANCELED) */
static inline bool jbmt_op_aborted(struct rdmaplus_jbmt_ctx *ctx)
{
	return READ_ONCE(ctx->closing);
}

struct jbmt_region {
	struct rdmaplus_jbmt_ctx *ctx;	/* the file that registered it */
	struct mm_struct *mm;		/* mmgrab()bed */
	u64 addr, length, key;
	u32 id, gen, rights;
	refcount_t ref;			/* the table's, one per section on it */
	struct list_head node;		/* ctx->regions, under ctx->mutex */
	struct rcu_head rcu;
};

/* The region a token names, held, or NULL (no such region, or revoked). */
struct jbmt_region *jbmt_region_get(u32 id, u32 gen, u64 key);
bool jbmt_token_issued(u32 id, u32 gen, u64 key);
void jbmt_region_put(struct jbmt_region *r);

/* ---- the wire ----------------------------------------------------------- */

#define JBMT_MAGIC		0x4a424d54	/* "JBMT" */
#define JBMT_PROTO		6
/* sections one host has in flight to a peer (and the peer to it) */
#define JBMT_CREDITS		16
/* registrations in flight: our gets' sinks, and the peer's puts' */
#define JBMT_REG_DEPTH		(2 * JBMT_CREDITS)
/*
 * Receives each side keeps posted: per credit the peer's request and its
 * FIN (a FIN may arrive before the request's buffer is posted again),
 * and the response to one of ours; and the peer's probe.
 */
#define JBMT_RECV_DEPTH		(3 * JBMT_CREDITS + 1)
#define JBMT_SECT_PAGES		64
#define JBMT_SECT_BYTES		(JBMT_SECT_PAGES * PAGE_SIZE)
/* a section's pages: one more when it does not start on a page */
#define JBMT_SECT_SPAN		(JBMT_SECT_PAGES + 1)
/*
 * The most data a message carries after its 64-byte header (a small
 * section's, inline): what every receive buffer holds.
 */
#define JBMT_INLINE_MAX		8192
/* how long a peer may hold a sink section granted to it */
#define JBMT_LEASE_MS		2000
/*
 * How often a connection with our sections in flight checks that the
 * peer said something: one silent for a whole period gets a PING, whose
 * retries fail the QP when the peer is unreachable (rdmaplus_jbmt_net.c).
 */
#define JBMT_PROBE_MS		500

enum jbmt_msg_type {
	JBMT_MSG_GET = 1,	/* initiator: write this section to my sink */
	JBMT_MSG_PUT,		/* initiator: give me a sink for this section */
	JBMT_MSG_GRANT,		/* target: here is the sink (rkey, iova) */
	JBMT_MSG_DONE,		/* target: the section ended (status) */
	JBMT_MSG_FIN,		/* initiator: written to the granted sink */
	JBMT_MSG_PING,		/* either: are you there? (dropped on receipt) */
};

/* why a section failed, on the wire (jbmt_status_errno()) */
enum jbmt_status {
	JBMT_OK,
	JBMT_NOENT,		/* no such region: a token never issued */
	JBMT_PERM,		/* the region lacks the right */
	JBMT_RANGE,		/* outside the region */
	JBMT_FAULT,		/* its pages are not mapped, or its process is gone */
	JBMT_NOMEM,		/* the target is out of memory or sinks */
	JBMT_INVAL,		/* a malformed request */
	JBMT_ABORT,		/* the initiator gave up */
	JBMT_NOPIN,		/* NACK: the target's pin budget is full; retry */
	JBMT_STALE,		/* the token was issued, its region revoked */
	JBMT_NSTATUS,
};

/* jbmt_msg.flags */
#define JBMT_F_INLINE		0x0001	/* the section's data rides in messages */

/*
 * A control message: one SEND, 64 bytes, big-endian; with JBMT_F_INLINE
 * a put's request and a get's answer are followed by len bytes of data.
 */
struct jbmt_msg {
	u8 type;
	u8 status;
	__be16 flags;
	__be32 xid;		/* the initiator's section */
	__be32 tsid;		/* the target's grant (GRANT, FIN) */
	__be32 len;		/* bytes, at most JBMT_SECT_BYTES */
	__be32 token_id;
	__be32 token_gen;
	__be64 token_key;
	__be64 off;		/* in the region */
	__be64 iova;		/* the sink (GET: the initiator's; GRANT) */
	__be32 rkey;
	__be32 budget;		/* the target's pin budget, pages (answers) */
	u8 pad[8];
};

static_assert(sizeof(struct jbmt_msg) == 64);

/* ---- peers -------------------------------------------------------------- */

enum jbmt_peer_state {
	JBMT_PEER_CONNECTING,
	JBMT_PEER_UP,
	JBMT_PEER_DOWN,
};

struct jbmt_peer;

/* a posted receive; a request stays here until its work has run */
struct jbmt_rx {
	struct ib_cqe cqe;
	struct jbmt_peer *p;
	u64 dma;
	struct jbmt_msg buf;		/* the device writes here */
	struct jbmt_msg msg;		/* the copy the work reads */
	void *data;			/* and the data after (JBMT_INLINE_MAX) */
	u64 data_dma;
	u32 data_len;			/* bytes received after the header */
	int wc_flags;
	u32 inv_rkey;			/* with IB_WC_WITH_INVALIDATE */
	struct work_struct work;
};

/* a send of one message, freed when it completes */
struct jbmt_tx {
	struct ib_cqe cqe;
	struct ib_cqe reg_cqe;		/* the registration it follows */
	struct jbmt_peer *p;
	struct ib_send_wr wr;
	struct ib_sge sge;
	u64 dma;
	/* called in completion context (may sleep), before the tx is freed */
	void (*done)(struct jbmt_tx *tx, struct ib_wc *wc);
	void *arg;
	u32 data_len;			/* bytes of data after msg */
	struct jbmt_msg msg;
	u8 data[];			/* sent with msg: one buffer, one SGE */
};

static_assert(offsetof(struct jbmt_tx, data) ==
	      offsetof(struct jbmt_tx, msg) + sizeof(struct jbmt_msg));

struct jbmt_peer {
	struct list_head node;		/* jbmt_peers_list */
	u32 id;				/* in jbmt_peers */
	__be32 addr;			/* the peer host (IPv4) */
	__be16 port;
	bool inbound;			/* it connected to us */
	spinlock_t lock;		/* state, err, torn, dead, inflight */
	enum jbmt_peer_state state;
	int err;			/* why it is down */
	bool torn;			/* resources freed (or being freed) */
	bool dead;			/* verbs resources going: no new user */
	int inflight;			/* our sections in flight to it */
	atomic_t users;			/* ops, works: the QP stays meanwhile */
	wait_queue_head_t wq;		/* credits, users, dead */
	struct completion done;		/* CONNECTING ended */
	struct rdma_cm_id *cm;
	struct ib_pd *pd;
	struct ib_cq *cq;
	/*
	 * Fast registrations go on a QP of their own that never sends, so
	 * that they are never queued behind a request rxe may retransmit:
	 * rxe executes such registrations again, and the second fails.
	 */
	struct ib_qp *regqp;
	bool regqp_ready;		/* in RTS: drained before it goes */
	u32 max_sge;			/* per RDMA WRITE */
	u32 remote_budget;		/* the peer's pin budget, pages */
	struct jbmt_rx *rx;		/* JBMT_RECV_DEPTH */
	struct list_head mrs;		/* FRWR sinks (ib_mr_pool) */
	int nmrs;			/* in the pool or out */
	struct xarray xids;		/* our sections awaiting a response */
	u32 next_xid;
	struct xarray grants;		/* sinks granted to the peer */
	u32 next_grant;
	struct work_struct teardown;
	/*
	 * The probe: every JBMT_PROBE_MS while up, a PING when our sections
	 * are in flight and nothing came from the peer since the last tick.
	 * An RC QP notices an unreachable peer only by a send's retries, and
	 * an operation waiting for answers sends nothing.
	 */
	struct delayed_work probe;
	unsigned int rx_count;		/* messages received (the CQ's work) */
	unsigned int probe_seen;	/* rx_count at the last tick; lock */
	bool probing;			/* a PING in flight; lock */
	/*
	 * A connection that goes while its port is down keeps its rdma_cm id
	 * until the port is up again: destroying the id makes the CM send a
	 * DREQ (a DREP, a REJ), and rxe fails its QP1 for good on a MAD it
	 * cannot send (docs/jbmt.md, "Connections"). Under jbmt_net_mutex.
	 */
	struct list_head park_node;	/* jbmt_parked, while kept */
	bool kept;			/* on jbmt_parked */
	bool removed;			/* its device went before it was kept */
	bool cm_talked;			/* its id sent or took a REQ: its end sends */
	unsigned int park_active;	/* ticks that saw its port ACTIVE */
	struct rdma_cm_id *park_cm;	/* the id kept */
	refcount_t ref;
};

struct jbmt_peer *jbmt_peer_get(u32 id);
void jbmt_peer_put(struct jbmt_peer *p);
void jbmt_peer_down(struct jbmt_peer *p, int err);
/* Become a user of p's verbs resources: false once they are going. */
bool jbmt_peer_enter(struct jbmt_peer *p);
void jbmt_peer_leave(struct jbmt_peer *p);

struct jbmt_tx *jbmt_tx_alloc(struct jbmt_peer *p, gfp_t gfp);
/* A tx whose message carries len bytes of data (tx->data) after it. */
struct jbmt_tx *jbmt_tx_alloc_data(struct jbmt_peer *p, u32 len, gfp_t gfp);
void jbmt_tx_free(struct jbmt_tx *tx);
/*
 * Map tx's message and make its WR a signaled SEND (SEND_WITH_INV when
 * inv_rkey is not 0); p entered. -ENOMEM.
 */
int jbmt_tx_prepare(struct jbmt_tx *tx, u32 inv_rkey);
/*
 * Post reg (a fast registration) on p's registration QP and, once it has
 * been executed, tx (prepared) on the connection; p entered. An error:
 * nothing posted, tx still the caller's. A registration that fails later
 * takes p down and frees tx unsent.
 */
int jbmt_post_reg_then(struct jbmt_peer *p, struct ib_reg_wr *reg,
		       struct jbmt_tx *tx);
/* ib_post_send() with bottom halves off; process context (rdmaplus_jbmt_net.c). */
int jbmt_post_send(struct ib_qp *qp, const struct ib_send_wr *wr);
/* Send a message and forget it; p entered. */
int jbmt_send(struct jbmt_peer *p, const struct jbmt_msg *m, u32 inv_rkey);
/* A WR of p failed: say why (unless flushed) and take p down. */
void jbmt_wc_error(struct jbmt_peer *p, struct ib_wc *wc, const char *what);
/* Give rx back to the device once its work is done; p entered. */
void jbmt_rx_repost(struct jbmt_rx *rx);

/* ---- pins, the pin budget, the pin cache (rdmaplus_jbmt_pin.c) -------- */

/* the pages a section [addr, addr + len) spans */
static inline unsigned int jbmt_span(u64 addr, u64 len)
{
	return (PAGE_ALIGN(addr + len) - (addr & PAGE_MASK)) >> PAGE_SHIFT;
}

/*
 * Pin n pages from addr in mm (the calling process's when NULL): -EFAULT
 * unless all are there, none left pinned. With nofault (mm's pages, from
 * a completion handler) it neither faults nor waits for mm's lock:
 * -EAGAIN when it would have to.
 */
int jbmt_pin(struct mm_struct *mm, u64 addr, unsigned int n, bool write,
	     bool nofault, struct page **pages);
void jbmt_unpin(struct page **pages, unsigned int n, bool dirty);

/* the pin budget each side of this host has (what hellos announce) */
u32 jbmt_pin_budget(void);
/* budget freed (operations wait here for it) */
extern wait_queue_head_t jbmt_budget_wq;
/*
 * Take up to want pages of the operations' budget for ctx (idle cached
 * ranges are evicted for it): 0 if none.
 */
unsigned int jbmt_budget_take(struct rdmaplus_jbmt_ctx *ctx,
			      unsigned int want);
void jbmt_budget_give(struct rdmaplus_jbmt_ctx *ctx, unsigned int n);
/* Take n pages of the serving budget, all or none. */
bool jbmt_serve_take(unsigned int n);
void jbmt_serve_give(unsigned int n);

enum jbmt_side {
	JBMT_SIDE_OP,		/* this host's operations' local pages */
	JBMT_SIDE_SERVE,	/* regions' pages, served to peers */
};

struct jbmt_pc_ent;

bool jbmt_pc_enabled(void);
/*
 * A cached range covering the n pages from addr of mm (writable when
 * write; owner's, unless NULL), held for a section; NULL when none. It
 * never sleeps.
 */
struct jbmt_pc_ent *jbmt_pc_get(struct mm_struct *mm, enum jbmt_side side,
				const void *owner, u64 addr, unsigned int n,
				bool write);
/*
 * Whether the n pages from addr of mm were served uncached lately (then
 * worth caching: jbmt_pc_note says they were).
 */
bool jbmt_pc_seen(struct mm_struct *mm, u64 addr, unsigned int n, bool write);
void jbmt_pc_note(struct mm_struct *mm, u64 addr, unsigned int n, bool write);
/* the range's page array from addr's page */
struct page **jbmt_pc_pages(struct jbmt_pc_ent *e, u64 addr);
/*
 * Pin the n pages from addr of mm (alive, or -EFAULT) as a cached range,
 * held for a section, taking over n pages of budget the caller took (to
 * ctx, on the op side); owner (the file or the region) drops it with
 * jbmt_pc_drop_owner. NULL and *err on failure (the caller keeps its
 * budget). It may sleep and fault.
 */
struct jbmt_pc_ent *jbmt_pc_fill(struct mm_struct *mm, enum jbmt_side side,
				 const void *owner,
				 struct rdmaplus_jbmt_ctx *ctx, u64 addr,
				 unsigned int n, bool write, int *err);
/*
 * Pin [addr, addr + len) of mm ahead of use into the cache, cut as an
 * operation from addr cuts it, with free budget only (ctx's, on the op
 * side): 0 when it is all there or it stopped for budget, *done saying
 * how far; -EFAULT (a page not mapped), -ENOMEM, -EINTR.
 */
int jbmt_pc_advise(struct mm_struct *mm, enum jbmt_side side,
		   const void *owner, struct rdmaplus_jbmt_ctx *ctx, u64 addr,
		   u64 len, bool write, u64 *done);
/* A section is done with e (having dirtied the pages it wrote). */
void jbmt_pc_put(struct jbmt_pc_ent *e);
/* Release owner's ranges (those in use when their section ends). */
void jbmt_pc_drop_owner(const void *owner);

int jbmt_pin_init(void);
void jbmt_pin_exit(void);

/* ---- transfers (rdmaplus_jbmt_xfer.c) ---------------------------------- */

extern struct workqueue_struct *jbmt_xfer_wq;

/* A response to one of our sections, in completion context. */
void jbmt_xfer_response(struct jbmt_peer *p, struct jbmt_rx *rx);
/*
 * Serve a request from the peer in the completion handler if it needs no
 * fault and no lock that may wait; false: queue rx->work for it.
 */
bool jbmt_xfer_serve_inline(struct jbmt_peer *p, struct jbmt_rx *rx);
/* A request from the peer (rx->work); p entered for it. */
void jbmt_xfer_request(struct work_struct *w);
/* p is dead and drained: fail our sections waiting on it. */
void jbmt_xfer_fail_peer(struct jbmt_peer *p);
/* p has no user left: take back what is granted to it. */
void jbmt_xfer_release_grants(struct jbmt_peer *p);
/* a sink whose rkey may still be valid: deregister it, and replace it */
void jbmt_mr_retire(struct jbmt_peer *p, struct ib_mr *mr);

int jbmt_xfer_init(void);
void jbmt_xfer_exit(void);

/* when an operation's stages happened, CLOCK_MONOTONIC ns (0: not yet) */
struct jbmt_op_times {
	u64 submit, start, first, end;
};

/* Check an operation's arguments: -EINVAL. */
int jbmt_op_check(const struct rdmaplus_jbmt_op *a);
/* Run a checked operation, its local pages in mm (NULL: the caller's). */
long jbmt_op_exec(struct rdmaplus_jbmt_ctx *ctx, struct mm_struct *mm,
		  struct rdmaplus_jbmt_op *a, struct jbmt_op_times *times);

/*
 * Start a checked asynchronous operation of one section (a get, or a small
 * put) in the submitting call, its pages the caller's, if credits and
 * budget are free now: 0, and end(arg, ret, again) is called once from
 * completion context (again: hand it to a worker, it moved nothing);
 * -EAGAIN, and nothing was done: run it in a worker.
 */
int jbmt_op_start_direct(struct rdmaplus_jbmt_ctx *ctx,
			 struct rdmaplus_jbmt_op *a,
			 struct jbmt_op_times *times,
			 void (*end)(void *arg, long ret, bool again), void *arg);

/* ---- asynchronous operations (rdmaplus_jbmt_ring.c) -------------------- */

long jbmt_ring_setup(struct rdmaplus_jbmt_ctx *ctx, void __user *arg);
long jbmt_ring_submit(struct rdmaplus_jbmt_ctx *ctx, void __user *arg);
/* The file is closing: cancel and wait for its operations, free the ring. */
void jbmt_ring_release(struct rdmaplus_jbmt_ctx *ctx);
int jbmt_ring_init(void);
void jbmt_ring_exit(void);

#endif /* RDMAPLUS_JBMT_H */
