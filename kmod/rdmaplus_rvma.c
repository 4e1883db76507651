// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus counted mailboxes: RVMA's receive-side counting in the kernel,
 * as the RVMA paper's NIC does it (docs/kmod.md, "Counted mailboxes").
 *
 * A process sets up an area mapped into it (per-window state, then 64-byte
 * completion records), creates windows and posts buffers into them: byte
 * ranges of its own rxe memory regions, each with a generation, a threshold
 * and a record. Senders RDMA WRITE into the buffers. The rxe layer's
 * rxe_mr_copy hook (rdmaplus_rxe.c) hands every incoming write packet to
 * rvma_write() first; a packet into a gated range is ours alone:
 *
 *  - it lies wholly inside one buffer whose gate is open: we place it
 *    ourselves (rxe's rxe_mr_copy, called from the module, is not hooked)
 *    under the file's lock, make rxe's own call copy nothing, count its
 *    bytes and, for the last packet of a WRITE message, one op. At the
 *    threshold the gate closes and every closed buffer whose turn it is
 *    (in generation order) is published: record, then done counter, then,
 *    if a waiter armed it (RDMAPLUS_IOC_RVMA_ARM), the eventfd. A record
 *    thus never appears before its bytes, and a process that polls its
 *    records takes no wake-ups.
 *  - otherwise (gate closed, straddling a buffer's edge, or, for a buffer
 *    posted with RDMAPLUS_RVMA_POST_F_RKEY, a message written with another
 *    key) it is refused: rxe_mr_copy fails, rxe NAKs with a remote access
 *    error, memory is untouched and window_state.refused counts it.
 *
 * Mailbox keys (ABI 9): a window may have one (RDMAPLUS_RVMA_WIN_F_MBKEY).
 * A hook on rxe_resp_queue_pkt(), which rxe calls for every request packet
 * after checking its ICRC and before its responder reads the RETH, finds
 * a write message's first packet written with a mailbox key, looks up the
 * window's pending buffer of the generation its address names and
 * rewrites the RETH to that buffer and its region's rkey (see
 * rdmaplus_rvma_request()). The later packets of the message follow the
 * responder's state. The hook marks the packets it translated in the
 * BTH's six reserved bits (which the ICRC does not cover and rxe never
 * reads) and clears them in every other write's first packet, so the gate
 * of a mailbox-key window's buffer lets in only what it translated. Such
 * buffers lie in guarded regions (RDMAPLUS_IOC_RVMA_GUARD), where the gate
 * refuses every untranslated write, in a buffer or not: the region's rkey,
 * which the translation needs, grants nothing by itself.
 *
 * Last-packet detection: rxe_mr_copy does not see the opcode, but the
 * payload sits in the received skb right after the BTH (and RETH, IMMDT),
 * and the BTH right after the UDP header (see rvma_parse()). Zero-length
 * WRITEs never reach rxe_mr_copy with a length and are not counted.
 * Reads, atomics and local transfers (copy_data) are never counted.
 *
 * Keys: the RETH (first packet of a message) carries the rkey the sender
 * wrote with; the later packets carry none, but those of one queue pair's
 * message arrive in order and uninterrupted, so the key of each QP's
 * message in progress is kept (ctx->msgs, by destination QPN) from its
 * first packet to its last. Keeping a QP's first key allocates, in the
 * hook; a QP the process named (RDMAPLUS_IOC_RVMA_QP) has its entry
 * allocated beforehand, and it stays (key 0) between messages, so its
 * packets never allocate.
 *
 * Nothing is free for a user (docs/kmod.md, "Resource model"): the area,
 * every buffer and region record count against RLIMIT_MEMLOCK, and
 * mailbox keys, which the host shares, against a per-user cap.
 *
 * Locking: ctx->mutex serialises a file's configuration;
 * ctx->lock (irqsave; hooks run in softirq or inline in a poster's system
 * call) protects the file's ranges, buffers, windows' lists and counts
 * and the records; the xarray's own lock (ctx->msgs, IRQ-safe) nests
 * inside ctx->lock or is taken alone; rvma_hash_lock (inside ctx->lock)
 * protects the global hash of regions, read under RCU by the hooks. A
 * region is hashed while it has at least one range; the file holds one
 * hook reference while it has ranges.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/bitmap.h>
#include <linux/eventfd.h>
#include <linux/hashtable.h>
#include <linux/kobject.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/mutex.h>
#include <linux/random.h>
#include <linux/rbtree.h>
#include <linux/skbuff.h>
#include <linux/slab.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/workqueue.h>
#include <linux/version.h>
#include <linux/xarray.h>
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0)
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif
#include <rdma/ib_verbs.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"

/* mmap(2) page offset of the area; Active Access uses 1..1024 */
#define RVMA_PGOFF		0x100000UL
#define RVMA_MAX_RANGES		65536	/* per file, pending and closed */
#define RVMA_ROCE_PORT		4791
#define RVMA_REC_WORDS		(RDMAPLUS_RVMA_RECORD_SIZE / 8)
#define RVMA_END_FLAGS		(RDMAPLUS_RVMA_REC_PARTIAL | RDMAPLUS_RVMA_REC_CLOSED)
#define RVMA_NAMED		1UL	/* ctx->msgs: the QP was named */
/* the BTH's reserved bits (byte 4, below FECN and BECN) */
#define RVMA_TAG_MASK		0x3f
#define RVMA_TAG_PLACED		0x2a	/* translated by rdmaplus_rvma_request */
/* mailbox key ids: bits 8..27 of the key, 1..RVMA_MBKEY_MAX_ID */
#define RVMA_MBKEY_MAX_ID	0xfffffU
#define RVMA_MBVA_OFF_MASK	((1ULL << RDMAPLUS_RVMA_MBVA_OFF_BITS) - 1)

enum rvma_state {
	RVMA_OPEN,	/* pending, gate open */
	RVMA_ENDED,	/* pending, gate closed: waits for earlier generations */
	RVMA_CLOSED,	/* published; kept to refuse late writes */
};

struct rvma_win {
	u32 kind;			/* RDMAPLUS_RVMA_*, 0: free slot */
	u32 mbkey;			/* its mailbox key, 0: none (under lock) */
	struct rdmaplus_rvma_ctx *ctx;
	/* the protection domain of its buffers' regions (set at the first
	 * post): only packets of this PD's QPs count against the window
	 */
	struct ib_pd *pd;
	unsigned int nbufs;		/* under lock: ranges of the window */
	bool posted;			/* a buffer was posted since creation */
	u64 last_gen;			/* the last generation posted */
	u64 done;			/* our copy of state->done */
	u64 refused;			/* our copy of state->refused */
	struct rdmaplus_rvma_window_state *state;
	struct list_head pending;	/* OPEN and ENDED buffers, by gen */
	struct rb_root by_gen;		/* the same, for lookups by gen */
	struct list_head bufs;		/* every buffer of the window */
};

struct rvma_mr {
	struct hlist_node hnode;	/* rvma_mrs, keyed by rxe_mr */
	struct list_head node;		/* ctx->mrs */
	void *rxe_mr;
	u32 key;			/* the key it was first posted with */
	u32 rkey;			/* its rkey: mailbox translations use it */
	struct ib_pd *pd;		/* compared, never used */
	const void *ufile;		/* its uverbs file (compared, never used) */
	struct rdmaplus_rvma_ctx *ctx;
	struct rb_root ranges;		/* struct rvma_buf by iova */
	/* RDMAPLUS_IOC_RVMA_GUARD: only translated writes get in, anywhere;
	 * hashed while registered, ranges or not
	 */
	bool guarded;
	bool dead;
	struct rcu_head rcu;
};

struct rvma_buf {
	struct rb_node rb;		/* m->ranges */
	struct list_head pnode;		/* win->pending until published */
	struct rb_node gnode;		/* win->by_gen until published */
	struct list_head wnode;		/* win->bufs */
	struct rvma_mr *m;
	struct rvma_win *win;
	u64 iova, length, threshold, gen;
	u64 bytes, ops;
	u32 record, flags;
	u32 rkey;			/* with keyed: the only key let in */
	bool keyed;
	enum rvma_state state;
};

struct rdmaplus_rvma_ctx {
	struct mutex mutex;		/* configuration */
	spinlock_t lock;		/* data path, see above */
	struct rdmaplus_user *user;	/* charged for the area and records */
	bool setup;
	bool hooked;			/* under mutex: holds a hook reference */
	u32 nwin, nrec;
	void *area;			/* vmalloc_user: states, then records */
	unsigned long area_size;
	unsigned long charged;		/* the area's pages in user's locked_vm */
	/* buffer and region records: bytes now, pages accounted (their
	 * high-water mark, under mutex) and of those charged
	 */
	atomic_long_t kept;
	unsigned long kept_pages, kept_charged;
	u64 *records;
	struct rvma_win *wins;
	unsigned long *rec_busy;	/* records of pending buffers */
	struct eventfd_ctx *evt;
	bool armed;			/* under lock: signal evt at the next publication */
	struct list_head mrs;		/* under lock */
	/*
	 * QPN -> value (key << 1 | RVMA_NAMED): the key of its message in
	 * progress (0: none). Changed under lock; RVMA_NAMED only under
	 * mutex too, so the mutex alone keeps it steady.
	 */
	struct xarray msgs;
	unsigned int named;		/* under mutex: entries with RVMA_NAMED */
	unsigned int nranges;		/* under lock */
	unsigned int nguarded;		/* under lock: guarded regions */
	struct delayed_work gc;		/* drops the hook RVMA_UNHOOK_DELAY after the last range */
};

/*
 * How long a file keeps its hook reference after its last range went.
 * Registering and unregistering the ftrace hooks each wait for RCU grace
 * periods (about 60 ms and 0.5 s on a TCG guest): a program that closes its
 * only counted window and opens another, or re-registers its memory, would
 * otherwise pay both every time.
 */
#define RVMA_UNHOOK_DELAY	HZ

static DEFINE_SPINLOCK(rvma_hash_lock);
static DEFINE_HASHTABLE(rvma_mrs, 8);
static atomic_t rvma_nr_mrs = ATOMIC_INIT(0);
/*
 * Mailbox key id -> struct rvma_win. Read under RCU by the hook; changed
 * in process context only (the xarray's own lock, inside ctx->lock on
 * erase). A window's slot outlives its id (until the file's release,
 * after an RCU grace period), and the hook checks w->mbkey under the
 * file's lock.
 */
static DEFINE_XARRAY_ALLOC(rvma_mbkeys);

static unsigned int max_ranges_per_window = RVMA_MAX_RANGES;
module_param(max_ranges_per_window, uint, 0644);
MODULE_PARM_DESC(max_ranges_per_window,
		 "buffers, pending and published, one counted window may hold (ENOSPC beyond; a file holds at most 65536)");

static struct {
	atomic64_t packets, bytes, published, refused, unparsed, nomem;
	atomic64_t windows, ranges, mrs;
	atomic64_t translated, untranslated;
} rvma_st;

/*
 * For tests of the path no test could otherwise reach (the stock kernel
 * has no fault injection): while positive, each first packet of a keyed
 * multi-packet message whose QP has no entry (not named) fails to keep
 * its key as an allocation failure would, and the count goes down by one.
 */
static unsigned int rvma_fail_key_stores;
module_param(rvma_fail_key_stores, uint, 0644);
MODULE_PARM_DESC(rvma_fail_key_stores,
		 "testing: fail the next N key stores that need memory as GFP_ATOMIC would (the packets are refused)");

static bool rvma_fail_key_store(void)
{
	unsigned int n = READ_ONCE(rvma_fail_key_stores), old;

	while (n) {
		old = cmpxchg(&rvma_fail_key_stores, n, n - 1);
		if (old == n)
			return true;
		n = old;
	}
	return false;
}

/* ---- data path -------------------------------------------------------- */

static struct rvma_mr *rvma_find(void *rxe_mr)
{
	struct rvma_mr *m;

	hash_for_each_possible_rcu(rvma_mrs, m, hnode, (unsigned long)rxe_mr)
		if (m->rxe_mr == rxe_mr && !READ_ONCE(m->dead))
			return m;
	return NULL;
}

/*
 * The buffer whose range contains iova, or else the first one after it;
 * NULL if none ends after iova. Ranges never overlap, so both their starts
 * and their ends are sorted. ctx->lock held.
 */
static struct rvma_buf *rvma_range_at(struct rvma_mr *m, u64 iova)
{
	struct rb_node *n = m->ranges.rb_node;
	struct rvma_buf *best = NULL;

	while (n) {
		struct rvma_buf *b = rb_entry(n, struct rvma_buf, rb);

		if (iova - b->iova < b->length || iova < b->iova) {
			best = b;
			n = n->rb_left;
		} else {
			n = n->rb_right;
		}
	}
	return best;
}

static struct rvma_buf *rvma_next(struct rvma_buf *b)
{
	struct rb_node *n = rb_next(&b->rb);

	return n ? rb_entry(n, struct rvma_buf, rb) : NULL;
}

static void rvma_range_insert(struct rvma_mr *m, struct rvma_buf *nb)
{
	struct rb_node **p = &m->ranges.rb_node, *parent = NULL;

	while (*p) {
		struct rvma_buf *b = rb_entry(*p, struct rvma_buf, rb);

		parent = *p;
		p = nb->iova < b->iova ? &(*p)->rb_left : &(*p)->rb_right;
	}
	rb_link_node(&nb->rb, parent, p);
	rb_insert_color(&nb->rb, &m->ranges);
}

/* w's pending buffer of generation gen, in O(log n); ctx->lock held. */
static struct rvma_buf *rvma_pending_at(struct rvma_win *w, u64 gen)
{
	struct rb_node *n = w->by_gen.rb_node;

	while (n) {
		struct rvma_buf *b = rb_entry(n, struct rvma_buf, gnode);

		if (gen == b->gen)
			return b;
		n = gen < b->gen ? n->rb_left : n->rb_right;
	}
	return NULL;
}

/* Make nb, of the newest generation, pending in w; ctx->lock held. */
static void rvma_pending_add(struct rvma_win *w, struct rvma_buf *nb)
{
	struct rb_node **p = &w->by_gen.rb_node, *parent = NULL;

	while (*p) {
		parent = *p;
		p = &(*p)->rb_right;	/* gens only grow */
	}
	rb_link_node(&nb->gnode, parent, p);
	rb_insert_color(&nb->gnode, &w->by_gen);
	list_add_tail(&nb->pnode, &w->pending);
}

static void rvma_pending_del(struct rvma_buf *b)
{
	rb_erase(&b->gnode, &b->win->by_gen);
	list_del_init(&b->pnode);
}

/*
 * Walks over many buffers (a window's, a region's, a file's: up to
 * RVMA_MAX_RANGES) let interrupts in every RVMA_RELAX_EVERY steps: drop
 * ctx->lock and take it again. Callers re-read what they walk after it.
 */
#define RVMA_RELAX_EVERY	64

static void rvma_relax(struct rdmaplus_rvma_ctx *ctx, unsigned long *flags,
		       unsigned int *steps)
{
	if (++*steps % RVMA_RELAX_EVERY)
		return;
	spin_unlock_irqrestore(&ctx->lock, *flags);
	spin_lock_irqsave(&ctx->lock, *flags);
}

/* What a write packet's transport headers say (rvma_parse()). */
struct rvma_hdr {
	bool last;	/* the last packet of its message (LAST or ONLY) */
	bool reth;	/* the first packet (FIRST or ONLY): @rkey is set */
	u32 rkey;
	u32 qpn;	/* destination queue pair */
	u8 tag;		/* the BTH's reserved bits (RVMA_TAG_PLACED) */
};

/*
 * Parse the headers of a write packet: 0, or -1 if they are not found.
 * rxe passes rxe_mr_copy payload_addr(pkt): the skb's (linear) data right
 * after the transport headers, which follow the UDP header
 * (rxe_udp_encap_recv sets pkt->hdr = udp_hdr + 1; a loopback packet keeps
 * the headers its requester pushed). Each candidate BTH offset admits only
 * the write opcodes whose headers have that length: BTH 12 (MIDDLE, LAST),
 * + IMMDT 16 (LAST_WITH_IMMEDIATE), + RETH 28 (FIRST, ONLY), + RETH +
 * IMMDT 32 (ONLY_WITH_IMMEDIATE); RC and UC. The UDP header before it must
 * have the RoCE v2 port and the length rxe derived the payload size from:
 * 8 + headers + len + pad + 4 (ICRC).
 */
static int rvma_parse(const u8 *payload, u32 len, struct rvma_hdr *h)
{
	static const struct {
		u8 off, op1, op2;
	} cand[] = {
		{ 12, 0x07, 0x08 }, { 16, 0x09, 0x09 },
		{ 28, 0x06, 0x0a }, { 32, 0x0b, 0x0b },
	};
	u8 hdr[40];	/* UDP header + the longest transport headers */
	int i;

	if (copy_from_kernel_nofault(hdr, payload - sizeof(hdr), sizeof(hdr)))
		return -1;
	for (i = 0; i < ARRAY_SIZE(cand); i++) {
		const u8 *bth = hdr + sizeof(hdr) - cand[i].off;
		const u8 *udp = bth - 8;
		u8 op = bth[0] & 0x1f;

		if (bth[0] >> 5 > 1 || (op != cand[i].op1 && op != cand[i].op2))
			continue;
		if (get_unaligned_be16(udp + 2) != RVMA_ROCE_PORT)
			continue;
		if (get_unaligned_be16(udp + 4) !=
		    8 + cand[i].off + len + ((bth[1] >> 4) & 3) + 4)
			continue;
		h->last = op >= 0x08;
		h->reth = cand[i].off >= 28;
		/* RETH: virtual address 8, rkey 4, length 4 */
		h->rkey = h->reth ? get_unaligned_be32(bth + 12 + 8) : 0;
		h->qpn = get_unaligned_be32(bth + 4) & 0xffffff;
		h->tag = bth[4] & RVMA_TAG_MASK;
		return 0;
	}
	return -1;
}

/*
 * Keep key for qpn's message in progress, in ctx->msgs, whose entry for
 * qpn is ent. An entry that is there takes no memory; a new one is
 * allocated here, and if that fails the packet is refused. ctx->lock held.
 */
static bool rvma_keep(struct rdmaplus_rvma_ctx *ctx, u32 qpn, void *ent,
		      u32 key)
{
	unsigned long named = ent ? xa_to_value(ent) & RVMA_NAMED : 0;

	if (!ent && rvma_fail_key_store())
		ent = XA_ERROR(-ENOMEM);
	else
		ent = xa_store(&ctx->msgs, qpn,
			       xa_mk_value((unsigned long)key << 1 | named),
			       GFP_ATOMIC | __GFP_NOWARN);
	if (xa_is_err(ent)) {
		atomic64_inc(&rvma_st.nomem);
		return false;
	}
	return true;
}

/*
 * Was the message of this packet into keyed buffer b written with b's
 * key (none for key 0)? For a buffer of a window with a mailbox key, that
 * is its region's rkey, and only in a message the module translated. A
 * first packet's key is kept for the message's later packets, until its
 * last: then a named QP's entry stays, with key 0, and another's goes.
 * ctx->lock held.
 */
static bool rvma_key_ok(struct rdmaplus_rvma_ctx *ctx, struct rvma_buf *b,
			int parsed, const struct rvma_hdr *h)
{
	void *ent;
	unsigned long v;

	if (parsed || !b->rkey)
		return false;
	if (h->reth) {	/* an only packet keeps nothing: no lookup */
		if (h->rkey != b->rkey ||
		    (b->win->mbkey && h->tag != RVMA_TAG_PLACED))
			return false;
		return h->last ||
		       rvma_keep(ctx, h->qpn, xa_load(&ctx->msgs, h->qpn), h->rkey);
	}
	ent = xa_load(&ctx->msgs, h->qpn);
	if (!ent)
		return false;
	v = xa_to_value(ent);
	if (h->last) {
		if (v & RVMA_NAMED)
			xa_store(&ctx->msgs, h->qpn, xa_mk_value(RVMA_NAMED),
				 GFP_ATOMIC);	/* there: takes no memory */
		else
			xa_erase(&ctx->msgs, h->qpn);
	}
	return v >> 1 == b->rkey;
}

static void rvma_record(struct rdmaplus_rvma_ctx *ctx, struct rvma_buf *b)
{
	u64 *r = ctx->records + (size_t)b->record * RVMA_REC_WORDS;
	u64 count = b->win->kind == RDMAPLUS_RVMA_OPS ? b->ops : b->bytes;
	u64 flags = b->flags;
	u64 s;

	if (count > b->threshold)
		flags |= RDMAPLUS_RVMA_REC_LATE;
	/* seqlock: odd while written, +2 per publication */
	s = (READ_ONCE(r[RDMAPLUS_RVMA_REC_SEQ]) + 1) & ~1ULL;
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_SEQ], s + 1);
	smp_wmb();	/* odd sequence before the fields: pairs with smp_rmb */
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_EPOCH], b->gen);
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_ADDR], b->iova);
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_LEN], b->bytes);
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_OPS], b->ops);
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_CAP], b->length);
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_FLAGS], flags);
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_SEQ2], s + 2);
	smp_wmb();	/* the fields before the even sequence */
	WRITE_ONCE(r[RDMAPLUS_RVMA_REC_SEQ], s + 2);
}

/*
 * Publish the window's closed buffers whose turn it is: the oldest pending
 * generation, while it is ENDED. Returns how many; ctx->lock held.
 */
static unsigned int rvma_publish(struct rdmaplus_rvma_ctx *ctx,
				 struct rvma_win *w)
{
	struct rvma_buf *b;
	unsigned int n = 0;

	while ((b = list_first_entry_or_null(&w->pending, struct rvma_buf,
					     pnode)) &&
	       b->state == RVMA_ENDED) {
		rvma_record(ctx, b);
		rvma_pending_del(b);
		b->state = RVMA_CLOSED;
		__clear_bit(b->record, ctx->rec_busy);
		w->done = b->gen + 1;
		/* the record before done: pairs with the reader's acquire */
		smp_store_release(&w->state->done, w->done);
		n++;
	}
	if (n)
		atomic64_add(n, &rvma_st.published);
	return n;
}

/*
 * Whether @published records call for the eventfd: only when a waiter
 * armed it (RDMAPLUS_IOC_RVMA_ARM), which this disarms. ctx->lock held;
 * the caller signals after unlocking.
 */
static bool rvma_wake(struct rdmaplus_rvma_ctx *ctx, unsigned int published)
{
	if (!published || !ctx->armed)
		return false;
	ctx->armed = false;
	return true;
}

static void rvma_refuse(struct pt_regs *regs, struct rvma_win *w)
{
	WRITE_ONCE(w->state->refused, ++w->refused);
	atomic64_inc(&rvma_st.refused);
	regs->si = ~0ULL;	/* out of range: rxe_mr_copy -EFAULT, NAK */
}

/*
 * The rxe_mr_copy hook (len > 0, not from copy_data), rcu_read_lock held.
 * Returns true if the packet is a write that touches a gated range: then
 * it is placed, or refused, here. Reads are never ours.
 */
static bool rvma_write(struct pt_regs *regs)
{
	void *rxe_mr = (void *)regs->di;
	u64 iova = regs->si;
	u8 *payload = (u8 *)regs->dx;
	u32 len = (u32)regs->cx;
	struct rdmaplus_rvma_ctx *ctx;
	unsigned int published = 0;
	bool wake;
	struct rvma_mr *m;
	struct rvma_buf *b;
	struct rvma_hdr h;
	unsigned long flags;
	bool reached;
	int parsed;

	if (regs->r8 & 1 || !atomic_read(&rvma_nr_mrs))
		return false;
	m = rvma_find(rxe_mr);
	if (!m)
		return false;
	ctx = m->ctx;
	parsed = rvma_parse(payload, len, &h);

	spin_lock_irqsave(&ctx->lock, flags);
	if (m->dead)
		goto pass;
	b = rvma_range_at(m, iova);
	if (!b || (b->iova > iova && b->iova - iova >= len)) {
		if (!m->guarded)
			goto pass;	/* touches no range */
		atomic64_inc(&rvma_st.refused);	/* no window's */
		regs->si = ~0ULL;
		goto out;
	}
	if (b->state != RVMA_OPEN || b->iova > iova ||
	    len > b->length - (iova - b->iova) ||
	    (b->keyed && !rvma_key_ok(ctx, b, parsed, &h))) {
		rvma_refuse(regs, b->win);
		goto out;
	}
	if (rdmaplus_rxe_mr_copy(rxe_mr, iova, payload, len, 0))
		goto out;	/* rxe's own call fails the same way */
	regs->cx = 0;		/* placed: rxe's call copies nothing */

	b->bytes += len;
	atomic64_inc(&rvma_st.packets);
	atomic64_add(len, &rvma_st.bytes);
	if (parsed)
		atomic64_inc(&rvma_st.unparsed);
	else if (h.last)
		b->ops++;
	if (b->win->kind == RDMAPLUS_RVMA_OPS)
		reached = !parsed && h.last && b->ops >= b->threshold;
	else
		reached = b->bytes >= b->threshold;
	if (reached) {
		b->state = RVMA_ENDED;
		published = rvma_publish(ctx, b->win);
	}
out:
	wake = rvma_wake(ctx, published);
	spin_unlock_irqrestore(&ctx->lock, flags);
	if (wake)
		rdmaplus_eventfd_signal(ctx->evt);
	return true;
pass:
	spin_unlock_irqrestore(&ctx->lock, flags);
	return false;
}

/*
 * A write's first packet (RC or UC WRITE FIRST, ONLY, ONLY WITH
 * IMMEDIATE) that rxe received or looped back: skb->data is its BTH, right
 * after the UDP header (rxe_udp_encap_recv() and rxe_loopback() pull it),
 * and the BTH and RETH lie in the linear data. Returns the BTH or NULL.
 */
static const u8 *rvma_reth_bth(struct sk_buff *skb)
{
	const u8 *bth = skb->data, *udp;
	u8 op;

	if (!skb_transport_header_was_set(skb))
		return NULL;
	udp = skb_transport_header(skb);
	if (udp + 8 != bth || skb_headlen(skb) < 28 ||
	    get_unaligned_be16(udp + 2) != RVMA_ROCE_PORT)
		return NULL;
	op = bth[0];
	if (op >> 5 > 1)
		return NULL;	/* neither RC nor UC */
	op &= 0x1f;
	return op == 0x06 || op == 0x0a || op == 0x0b ? bth : NULL;
}

/*
 * w's pending buffer of generation gen mod 2^24 (a mailbox address names
 * no more); ctx->lock held. Its pending generations span less than 2^24
 * (rvma_post_check), so only one can have these low bits: the first at or
 * after the oldest.
 */
static struct rvma_buf *rvma_pending_gen(struct rvma_win *w, u64 gen)
{
	struct rvma_buf *oldest;

	oldest = list_first_entry_or_null(&w->pending, struct rvma_buf, pnode);
	if (!oldest)
		return NULL;
	return rvma_pending_at(w, oldest->gen +
			       ((gen - oldest->gen) & RDMAPLUS_RVMA_MBVA_GEN_MASK));
}

/*
 * Clear the BTH's reserved bits of a packet. Should it not be made
 * writable (no memory for a copy of a cloned packet), the shared bytes are
 * changed all the same: a forged tag must never reach the gate.
 */
static void rvma_untag(struct sk_buff *skb)
{
	u8 *bth = rdmaplus_rxe_pkt_writable(skb, 28);

	if (!bth) {
		atomic64_inc(&rvma_st.nomem);
		bth = skb->data;
	}
	bth[4] &= ~RVMA_TAG_MASK;
}

/*
 * The rxe_resp_queue_pkt hook, for every request packet to local QP
 * rxe_qp, rcu_read_lock held: translate a write's first packet written
 * with a mailbox key (see struct rdmaplus_rvma_win), and clear the
 * reserved bits of every other so that no sender can pass for translated.
 * Only a QP of the protection domain of the window's buffers can write
 * there (rxe checks it as for any key), so only such QPs' packets count
 * against the window. The packet is changed in place only once it is
 * writable (a clone, e.g. a capture, keeps its bytes). Never takes it:
 * rxe goes on with it.
 */
static bool rvma_request(void *rxe_qp, struct sk_buff *skb)
{
	struct ib_pd *pd = ((struct ib_qp *)rxe_qp)->pd;
	struct rdmaplus_rvma_ctx *ctx;
	struct rvma_win *w;
	struct rvma_buf *b;
	unsigned long flags;
	const u8 *bth;
	u8 *wbth;
	u64 va, off;
	u32 rkey, len;

	bth = rvma_reth_bth(skb);
	if (!bth)
		return false;
	if (bth[4] & RVMA_TAG_MASK) {
		rvma_untag(skb);
		bth = skb->data;	/* it may have moved */
	}
	rkey = get_unaligned_be32(bth + 20);
	len = get_unaligned_be32(bth + 24);
	if ((rkey & RDMAPLUS_RVMA_MBKEY_MASK) != RDMAPLUS_RVMA_MBKEY_BITS ||
	    !len)
		return false;
	w = xa_load(&rvma_mbkeys, (rkey >> 8) & RVMA_MBKEY_MAX_ID);
	if (!w)
		return false;	/* rxe refuses the key */
	ctx = w->ctx;
	va = get_unaligned_be64(bth + 8 + 4);
	off = va & RVMA_MBVA_OFF_MASK;

	spin_lock_irqsave(&ctx->lock, flags);
	if (w->mbkey != rkey || w->pd != pd)
		goto foreign;	/* destroyed meanwhile, or not the window's */
	b = rvma_pending_gen(w, va >> RDMAPLUS_RVMA_MBVA_OFF_BITS);
	if (!b || b->state != RVMA_OPEN || off > b->length ||
	    len > b->length - off)
		goto refuse;
	wbth = rdmaplus_rxe_pkt_writable(skb, 28);
	if (!wbth) {
		atomic64_inc(&rvma_st.nomem);
		goto refuse;
	}
	put_unaligned_be64(b->iova + off, wbth + 12);
	put_unaligned_be32(b->m->rkey, wbth + 20);
	wbth[4] |= RVMA_TAG_PLACED;
	atomic64_inc(&rvma_st.translated);
	spin_unlock_irqrestore(&ctx->lock, flags);
	return false;
refuse:
	WRITE_ONCE(w->state->refused, ++w->refused);
foreign:
	atomic64_inc(&rvma_st.untranslated);
	spin_unlock_irqrestore(&ctx->lock, flags);
	return false;	/* the key stays: rxe refuses it */
}

static void rvma_mr_free_rcu(struct rcu_head *r)
{
	kfree(container_of(r, struct rvma_mr, rcu));
}

/* Unhash an MR without ranges and free it after RCU; ctx->lock held. */
static void rvma_mr_unlink(struct rvma_mr *m)
{
	WRITE_ONCE(m->dead, true);
	spin_lock(&rvma_hash_lock);
	hash_del_rcu(&m->hnode);
	spin_unlock(&rvma_hash_lock);
	list_del(&m->node);
	atomic_dec(&rvma_nr_mrs);
	atomic64_dec(&rvma_st.mrs);
	atomic_long_sub(sizeof(*m), &m->ctx->kept);
	call_rcu(&m->rcu, rvma_mr_free_rcu);
}

/*
 * Forget one buffer (pending ones vanish without a record), leaving its
 * MR hashed even if it has no range left. ctx->lock held.
 */
static void rvma_buf_drop(struct rdmaplus_rvma_ctx *ctx, struct rvma_buf *b)
{
	rb_erase(&b->rb, &b->m->ranges);
	list_del(&b->wnode);
	if (b->state != RVMA_CLOSED) {
		rvma_pending_del(b);
		__clear_bit(b->record, ctx->rec_busy);
	}
	ctx->nranges--;
	b->win->nbufs--;
	atomic64_dec(&rvma_st.ranges);
	atomic_long_sub(sizeof(*b), &ctx->kept);
	kfree(b);
}

/*
 * Forget one buffer; frees its MR when it was the last range there.
 * ctx->lock held.
 */
static void rvma_buf_forget(struct rdmaplus_rvma_ctx *ctx, struct rvma_buf *b)
{
	struct rvma_mr *m = b->m;

	rvma_buf_drop(ctx, b);
	if (RB_EMPTY_ROOT(&m->ranges) && !m->dead && !m->guarded)
		rvma_mr_unlink(m);
}

/*
 * The rxe_dereg_mr hook (rdmaplus_rxe.c): forget the region's ranges.
 * Pending buffers there are dropped without a record; later generations
 * of their windows that are closed get published.
 */
static void rvma_dereg(void *rxe_mr, struct ib_mr *ibmr)
{
	struct rdmaplus_rvma_ctx *ctx;
	unsigned int published = 0;
	bool wake;
	struct rvma_mr *m;
	unsigned long flags;
	unsigned int steps = 0;

	if (!atomic_read(&rvma_nr_mrs))
		return;
	rcu_read_lock();
	m = rvma_find(rxe_mr);
	if (!m)
		goto out;
	ctx = m->ctx;
	spin_lock_irqsave(&ctx->lock, flags);
	/* the last forget unlinks m (RCU keeps it while the lock is dropped) */
	while (!m->dead && !RB_EMPTY_ROOT(&m->ranges)) {
		struct rvma_buf *b = rb_entry(rb_first(&m->ranges),
					      struct rvma_buf, rb);
		struct rvma_win *w = b->win;

		rvma_buf_forget(ctx, b);
		published += rvma_publish(ctx, w);
		rvma_relax(ctx, &flags, &steps);
	}
	if (!m->dead) {	/* guarded: it stays without ranges */
		ctx->nguarded--;
		rvma_mr_unlink(m);
	}
	if (!ctx->nranges && !ctx->nguarded)
		mod_delayed_work(rdmaplus_wq, &ctx->gc, RVMA_UNHOOK_DELAY);
	wake = rvma_wake(ctx, published);
	spin_unlock_irqrestore(&ctx->lock, flags);
	if (wake)
		rdmaplus_eventfd_signal(ctx->evt);
out:
	rcu_read_unlock();
}

static const struct rdmaplus_rxe_consumer rvma_consumer = {
	.copy = rvma_write,
	.request = rvma_request,
	.dereg = rvma_dereg,
};

/* ---- configuration ---------------------------------------------------- */

/*
 * Account bytes more of kernel memory kept for the file (buffer and region
 * records): the pages they need beyond what was accounted are charged to
 * the user's RLIMIT_MEMLOCK (-ENOMEM beyond it). ctx->mutex held.
 */
static int rvma_account(struct rdmaplus_rvma_ctx *ctx, size_t bytes)
{
	unsigned long need;
	long charged;

	need = DIV_ROUND_UP(atomic_long_read(&ctx->kept) + bytes, PAGE_SIZE);
	if (need > ctx->kept_pages) {
		charged = rdmaplus_charge(ctx->user, need - ctx->kept_pages);
		if (charged < 0)
			return charged;
		ctx->kept_charged += charged;
		ctx->kept_pages = need;
	}
	atomic_long_add(bytes, &ctx->kept);
	return 0;
}

/* Does the file hold the hook while it gates nothing? ctx->mutex held. */
static bool rvma_hook_idle(struct rdmaplus_rvma_ctx *ctx)
{
	unsigned long flags;
	unsigned int n;

	spin_lock_irqsave(&ctx->lock, flags);
	n = ctx->nranges + ctx->nguarded;
	spin_unlock_irqrestore(&ctx->lock, flags);
	return ctx->hooked && !n;
}

/* Drop the hook reference once the file gates nothing; ctx->mutex held. */
static void rvma_maybe_unhook(struct rdmaplus_rvma_ctx *ctx)
{
	if (!rvma_hook_idle(ctx))
		return;
	ctx->hooked = false;
	rdmaplus_rxe_hook_put();
}

/* Drop the hook later if the file gates nothing now; ctx->mutex held. */
static void rvma_unhook_later(struct rdmaplus_rvma_ctx *ctx)
{
	if (rvma_hook_idle(ctx))
		mod_delayed_work(rdmaplus_wq, &ctx->gc, RVMA_UNHOOK_DELAY);
}

static void rvma_gc(struct work_struct *work)
{
	struct rdmaplus_rvma_ctx *ctx = container_of(to_delayed_work(work),
						     typeof(*ctx), gc);

	mutex_lock(&ctx->mutex);
	rvma_maybe_unhook(ctx);
	mutex_unlock(&ctx->mutex);
}

/*
 * Find window @id of a set-up file: -ENXIO before SETUP, -ENOENT for no
 * such window. ctx->mutex held.
 */
static long rvma_win_get(struct rdmaplus_rvma_ctx *ctx, u32 id,
			 struct rvma_win **w)
{
	if (!ctx->setup)
		return -ENXIO;
	if (!id || id > ctx->nwin || !ctx->wins[id - 1].kind)
		return -ENOENT;
	*w = &ctx->wins[id - 1];
	return 0;
}

static long rvma_setup(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_setup c;
	struct eventfd_ctx *evt = NULL;
	unsigned long sbytes, size, pages;
	struct rvma_win *wins = NULL;
	unsigned long *busy = NULL;
	void *area = NULL;
	long charged;
	u32 i;
	int ret;

	ret = rdmaplus_copy_in(&c, sizeof(c), sizeof(c), arg);
	if (ret)
		return ret;
	if (c.flags || c.reserved || c.mmap_offset || c.mmap_size ||
	    !c.windows || c.windows > RDMAPLUS_RVMA_MAX_WINDOWS ||
	    !c.records || c.records > RDMAPLUS_RVMA_MAX_RECORDS ||
	    c.eventfd < -1)
		return -EINVAL;
	if (!rdmaplus_rxe_supported())
		return -EOPNOTSUPP;
	if (c.eventfd >= 0) {
		evt = eventfd_ctx_fdget(c.eventfd);
		if (IS_ERR(evt))
			return PTR_ERR(evt);
	}
	sbytes = PAGE_ALIGN(c.windows * sizeof(struct rdmaplus_rvma_window_state));
	size = sbytes + PAGE_ALIGN((unsigned long)c.records *
				   RDMAPLUS_RVMA_RECORD_SIZE);
	/* the mapped area, and the windows and record bitmap beside it */
	pages = (size + PAGE_ALIGN(c.windows * sizeof(*wins) +
				   BITS_TO_LONGS(c.records) * sizeof(long))) >>
		PAGE_SHIFT;

	mutex_lock(&ctx->mutex);
	ret = -EBUSY;
	if (ctx->setup)
		goto err;
	charged = rdmaplus_charge(ctx->user, pages);
	if (charged < 0) {
		ret = charged;
		goto err;
	}
	ctx->charged = charged;
	ret = -ENOMEM;
	area = vmalloc_user(size);
	wins = kvcalloc(c.windows, sizeof(*wins), GFP_KERNEL_ACCOUNT);
	busy = bitmap_zalloc(c.records, GFP_KERNEL_ACCOUNT);
	if (!area || !wins || !busy)
		goto err_uncharge;
	for (i = 0; i < c.windows; i++) {
		wins[i].state = (struct rdmaplus_rvma_window_state *)area + i;
		wins[i].ctx = ctx;
		INIT_LIST_HEAD(&wins[i].pending);
		wins[i].by_gen = RB_ROOT;
		INIT_LIST_HEAD(&wins[i].bufs);
	}
	c.mmap_offset = (u64)RVMA_PGOFF << PAGE_SHIFT;
	c.mmap_size = size;
	ret = rdmaplus_copy_out(arg, &c, sizeof(c));
	if (ret)
		goto err_uncharge;
	ctx->area = area;
	ctx->area_size = size;
	ctx->records = (u64 *)((u8 *)area + sbytes);
	ctx->wins = wins;
	ctx->rec_busy = busy;
	ctx->nwin = c.windows;
	ctx->nrec = c.records;
	ctx->evt = evt;
	ctx->setup = true;
	mutex_unlock(&ctx->mutex);
	return 0;

err_uncharge:
	bitmap_free(busy);
	kvfree(wins);
	vfree(area);
	rdmaplus_uncharge(ctx->user, ctx->charged);
	ctx->charged = 0;
err:
	mutex_unlock(&ctx->mutex);
	if (evt)
		eventfd_ctx_put(evt);
	return ret;
}

/*
 * A mailbox key for w that no one can guess: a free id drawn at random and
 * a random low byte (28 random bits in all). The user's cap is taken.
 */
static int rvma_mbkey_alloc(struct rdmaplus_rvma_ctx *ctx,
			    struct rvma_win *w, u32 *key)
{
	u32 id = 0;
	int i, ret;

	ret = rdmaplus_user_take(ctx->user, RDMAPLUS_RES_MBKEY);
	if (ret)
		return ret;
	for (i = 0, ret = -EBUSY; i < 32 && ret == -EBUSY; i++) {
		id = get_random_u32() % RVMA_MBKEY_MAX_ID + 1;
		ret = xa_insert(&rvma_mbkeys, id, w, GFP_KERNEL_ACCOUNT);
	}
	if (ret == -EBUSY)	/* crowded: any free id */
		ret = xa_alloc(&rvma_mbkeys, &id, w,
			       XA_LIMIT(1, RVMA_MBKEY_MAX_ID),
			       GFP_KERNEL_ACCOUNT);
	if (ret) {
		rdmaplus_user_give(ctx->user, RDMAPLUS_RES_MBKEY);
		return ret == -EBUSY ? -ENOSPC : ret;
	}
	*key = RDMAPLUS_RVMA_MBKEY_BITS | id << 8 | (get_random_u32() & 0xff);
	return 0;
}

static void rvma_mbkey_free(struct rdmaplus_rvma_ctx *ctx, u32 key)
{
	xa_erase(&rvma_mbkeys, (key >> 8) & RVMA_MBKEY_MAX_ID);
	rdmaplus_user_give(ctx->user, RDMAPLUS_RES_MBKEY);
}

static long rvma_win_create(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_win c;
	struct rvma_win *w = NULL;
	unsigned long flags;
	u32 i;
	long ret;

	ret = rdmaplus_copy_in(&c, sizeof(c), sizeof(c), arg);
	if (ret)
		return ret;
	if (c.reserved || c.mbkey || c.id ||
	    c.flags & ~RDMAPLUS_RVMA_WIN_F_MBKEY ||
	    (c.kind != RDMAPLUS_RVMA_BYTES && c.kind != RDMAPLUS_RVMA_OPS))
		return -EINVAL;
	mutex_lock(&ctx->mutex);
	ret = -ENXIO;
	if (!ctx->setup)
		goto out;
	ret = -ENOSPC;
	for (i = 0; i < ctx->nwin && !w; i++)
		if (!ctx->wins[i].kind)
			w = &ctx->wins[i];
	if (!w)
		goto out;
	if (c.flags & RDMAPLUS_RVMA_WIN_F_MBKEY) {
		/* the hook finds w only once w->mbkey is set, under lock */
		ret = rvma_mbkey_alloc(ctx, w, &c.mbkey);
		if (ret)
			goto out;
	}
	c.id = w - ctx->wins + 1;
	ret = rdmaplus_copy_out(arg, &c, sizeof(c));
	if (ret) {
		if (c.mbkey)
			rvma_mbkey_free(ctx, c.mbkey);
		goto out;
	}
	spin_lock_irqsave(&ctx->lock, flags);
	w->kind = c.kind;
	w->mbkey = c.mbkey;
	w->pd = NULL;
	w->posted = false;
	w->last_gen = 0;
	w->done = 0;
	w->refused = 0;
	WRITE_ONCE(w->state->refused, 0);
	/* a reader that acquires done sees the reset refused count */
	smp_store_release(&w->state->done, 0);
	spin_unlock_irqrestore(&ctx->lock, flags);
	atomic64_inc(&rvma_st.windows);
	ret = 0;
out:
	mutex_unlock(&ctx->mutex);
	return ret;
}

/*
 * Forget every range of w and free its slot; ctx->lock held (taken with
 * *flags, and dropped now and then), ctx->mutex too (nothing is posted
 * meanwhile).
 */
static void rvma_win_forget(struct rdmaplus_rvma_ctx *ctx, struct rvma_win *w,
			    unsigned long *flags, unsigned int *steps)
{
	struct rvma_buf *b;

	while ((b = list_first_entry_or_null(&w->bufs, struct rvma_buf,
					     wnode))) {
		rvma_buf_forget(ctx, b);
		rvma_relax(ctx, flags, steps);
	}
	if (w->mbkey) {
		rvma_mbkey_free(ctx, w->mbkey);
		w->mbkey = 0;
	}
	w->kind = 0;
	atomic64_dec(&rvma_st.windows);
}

static long rvma_win_destroy(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_win_destroy a;
	unsigned int steps = 0;
	struct rvma_win *w;
	unsigned long flags;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	mutex_lock(&ctx->mutex);
	ret = rvma_win_get(ctx, a.id, &w);
	if (ret)
		goto out;
	spin_lock_irqsave(&ctx->lock, flags);
	rvma_win_forget(ctx, w, &flags, &steps);
	spin_unlock_irqrestore(&ctx->lock, flags);
	rvma_unhook_later(ctx);
out:
	mutex_unlock(&ctx->mutex);
	return ret;
}

/* The MR of rxe_mr in the hash, any file's; rvma_hash_lock held. */
static struct rvma_mr *rvma_hashed(void *rxe_mr)
{
	struct rvma_mr *m;

	hash_for_each_possible(rvma_mrs, m, hnode, (unsigned long)rxe_mr)
		if (m->rxe_mr == rxe_mr && !m->dead)
			return m;
	return NULL;
}

/*
 * The generation, record, protection domain and guard checks of every
 * post into region m (NULL: not hashed yet) of protection domain pd;
 * ctx->lock held.
 */
static long rvma_post_check(struct rdmaplus_rvma_ctx *ctx,
			    const struct rdmaplus_rvma_post *a,
			    const struct rvma_win *w, const struct rvma_mr *m,
			    const struct ib_pd *pd)
{
	const struct rvma_buf *oldest;

	if ((w->posted && a->gen <= w->last_gen) || a->gen < w->done)
		return -EINVAL;
	/* a mailbox address names a pending generation by its low 24 bits */
	oldest = list_empty(&w->pending) ? NULL :
		 list_first_entry(&w->pending, struct rvma_buf, pnode);
	if (w->mbkey && oldest &&
	    a->gen - oldest->gen > RDMAPLUS_RVMA_MBVA_GEN_MASK)
		return -EINVAL;
	if (w->pd && w->pd != pd)
		return -EINVAL;	/* a window's buffers share one PD */
	if (test_bit(a->record, ctx->rec_busy))
		return -EBUSY;
	if (!w->mbkey != !(m && m->guarded))
		return -EACCES;
	return 0;
}

/* Open nb, a buffer in the ranges of its region, for a; ctx->lock held. */
static void rvma_buf_open(struct rdmaplus_rvma_ctx *ctx,
			  const struct rdmaplus_rvma_post *a,
			  struct rvma_win *w, struct rvma_buf *nb)
{
	nb->win = w;
	nb->threshold = a->threshold;
	nb->gen = a->gen;
	nb->bytes = 0;
	nb->ops = 0;
	nb->record = a->record;
	nb->flags = a->flags & RDMAPLUS_RVMA_REC_ONETIME;
	nb->keyed = a->flags & RDMAPLUS_RVMA_POST_F_RKEY || w->mbkey;
	nb->rkey = w->mbkey ? nb->m->rkey : a->rkey;
	nb->state = RVMA_OPEN;
	list_add_tail(&nb->wnode, &w->bufs);
	rvma_pending_add(w, nb);
	__set_bit(a->record, ctx->rec_busy);
	w->nbufs++;
	w->pd = nb->m->pd;
	w->posted = true;
	w->last_gen = a->gen;
}

/*
 * The closed buffer that a re-posts: the same range of a region this file
 * gates under the same key. A window's buffers rotate this way, and then
 * the post needs neither the lookup nor an allocation, once the caller
 * checked (outside the lock) that the process still has the region's
 * uverbs file open, as the region lookup of a first post demands. NULL
 * otherwise. ctx->lock held.
 */
static struct rvma_buf *rvma_reposted(struct rdmaplus_rvma_ctx *ctx,
				      const struct rdmaplus_rvma_post *a)
{
	struct rvma_mr *m;

	list_for_each_entry(m, &ctx->mrs, node) {
		struct rvma_buf *b;

		if (m->dead || m->key != a->key)
			continue;
		b = rvma_range_at(m, a->iova);
		if (b && b->iova == a->iova && b->length == a->length &&
		    b->state == RVMA_CLOSED)
			return b;
	}
	return NULL;
}

/* Hash *fresh as region rmr of ctx and take it; ctx->lock held. */
static struct rvma_mr *rvma_mr_add(struct rdmaplus_rvma_ctx *ctx, void *rmr,
				   struct rvma_mr **fresh)
{
	struct rvma_mr *m = *fresh;

	*fresh = NULL;
	m->rxe_mr = rmr;
	m->ctx = ctx;
	m->ranges = RB_ROOT;
	spin_lock(&rvma_hash_lock);
	hash_add_rcu(rvma_mrs, &m->hnode, (unsigned long)rmr);
	spin_unlock(&rvma_hash_lock);
	list_add_tail(&m->node, &ctx->mrs);
	atomic_inc(&rvma_nr_mrs);
	atomic64_inc(&rvma_st.mrs);
	return m;
}

/*
 * Register the buffer under ctx->lock: the checks that depend on the
 * file's data-path state, then the insertion. fresh is used if the region
 * has no struct rvma_mr yet (*fresh is then cleared).
 */
static long rvma_post_locked(struct rdmaplus_rvma_ctx *ctx,
			     struct rdmaplus_rvma_post *a, struct rvma_win *w,
			     void *rmr, struct rvma_mr **fresh,
			     struct rvma_buf *nb)
{
	unsigned int replaced = 0, in_w = 0;
	struct rvma_buf *b, *next;
	struct rvma_mr *m;
	u64 end = a->iova + a->length;
	long ret;

	spin_lock(&rvma_hash_lock);
	m = rvma_hashed(rmr);
	spin_unlock(&rvma_hash_lock);
	if (m && m->ctx != ctx)
		return -EBUSY;	/* another file gates this region */
	ret = rvma_post_check(ctx, a, w, m, (*fresh)->pd);
	if (ret)
		return ret;
	if (m) {
		for (b = rvma_range_at(m, a->iova); b && b->iova < end;
		     b = rvma_next(b)) {
			if (b->state != RVMA_CLOSED)
				return -EBUSY;
			replaced++;
			in_w += b->win == w;
		}
	}
	if (ctx->nranges - replaced >= RVMA_MAX_RANGES ||
	    w->nbufs - in_w >= READ_ONCE(max_ranges_per_window))
		return -ENOSPC;
	if (!m)
		m = rvma_mr_add(ctx, rmr, fresh);
	for (b = rvma_range_at(m, a->iova); b && b->iova < end; b = next) {
		next = rvma_next(b);
		rvma_buf_drop(ctx, b);	/* closed; m stays hashed for nb */
	}
	nb->m = m;
	nb->iova = a->iova;
	nb->length = a->length;
	rvma_range_insert(m, nb);
	rvma_buf_open(ctx, a, w, nb);
	ctx->nranges++;
	atomic64_inc(&rvma_st.ranges);
	return 0;
}

/*
 * The calling process's rxe region with key, with a restrack reference
 * (which holds off its deregistration until it is hashed, where the dereg
 * hook, registered first, finds it), and its struct rxe_mr in *rmr.
 */
static struct ib_mr *rvma_region(u32 key, void **rmr)
{
	struct ib_mr *ibmr = rdmaplus_rxe_lookup_mr(key);

	if (IS_ERR(ibmr))
		return ibmr;
	*rmr = rdmaplus_rxe_mr_of(ibmr);
	if (!*rmr) {
		rdmaplus_rxe_put_mr(ibmr);
		return ERR_PTR(-EOPNOTSUPP);
	}
	return ibmr;
}

/*
 * Take the file's hook reference and allocate *fresh for region ibmr,
 * posted or guarded under key, in case it is not hashed yet (accounted:
 * free it with rvma_mr_put_fresh). ctx->mutex held.
 */
static long rvma_prepare(struct rdmaplus_rvma_ctx *ctx, struct ib_mr *ibmr,
			 u32 key, struct rvma_mr **fresh)
{
	long ret;

	if (!ctx->hooked) {
		ret = rdmaplus_rxe_hook_get(ibmr->device->ops.owner);
		if (ret)
			return ret;
		ctx->hooked = true;
	}
	ret = rvma_account(ctx, sizeof(**fresh));
	if (ret)
		return ret;
	*fresh = kzalloc(sizeof(**fresh), GFP_KERNEL_ACCOUNT);
	if (!*fresh) {
		atomic_long_sub(sizeof(**fresh), &ctx->kept);
		return -ENOMEM;
	}
	(*fresh)->key = key;
	(*fresh)->rkey = ibmr->rkey;
	(*fresh)->pd = ibmr->pd;
	(*fresh)->ufile = ibmr->uobject->ufile;
	return 0;
}

/* Free what rvma_prepare allocated if it was not used. */
static void rvma_mr_put_fresh(struct rdmaplus_rvma_ctx *ctx,
			      struct rvma_mr *fresh)
{
	if (!fresh)
		return;
	atomic_long_sub(sizeof(*fresh), &ctx->kept);
	kfree(fresh);
}

/* Re-post closed buffer old as a (rvma_reposted); ctx->lock held. */
static long rvma_repost_locked(struct rdmaplus_rvma_ctx *ctx,
			       const struct rdmaplus_rvma_post *a,
			       struct rvma_win *w, struct rvma_buf *old)
{
	long ret;

	ret = rvma_post_check(ctx, a, w, old->m, old->m->pd);
	if (ret)
		return ret;
	if (old->win != w &&
	    w->nbufs >= READ_ONCE(max_ranges_per_window))
		return -ENOSPC;
	list_del(&old->wnode);	/* from its last window's */
	old->win->nbufs--;
	rvma_buf_open(ctx, a, w, old);
	return 0;
}

/*
 * Re-post a closed buffer (rvma_reposted) if a is one: 0 or an error if
 * it was, 1 if it was not. The uverbs file check walks the descriptor
 * table, so it runs outside ctx->lock (which the data path takes in
 * softirq: a thread copying the table, as fork does, interrupted by a
 * packet for this file, would otherwise deadlock with us), and the buffer
 * is looked up again after it. ctx->mutex held.
 */
static long rvma_repost(struct rdmaplus_rvma_ctx *ctx,
			const struct rdmaplus_rvma_post *a, struct rvma_win *w)
{
	const void *ufile = NULL;
	struct rvma_buf *old;
	unsigned long flags;
	long ret = 1;

	spin_lock_irqsave(&ctx->lock, flags);
	old = rvma_reposted(ctx, a);
	if (old)
		ufile = old->m->ufile;
	spin_unlock_irqrestore(&ctx->lock, flags);
	if (!old || !rdmaplus_rxe_holds_ufile(ufile))
		return 1;
	spin_lock_irqsave(&ctx->lock, flags);
	old = rvma_reposted(ctx, a);	/* a deregistration may have won */
	if (old && old->m->ufile == ufile)
		ret = rvma_repost_locked(ctx, a, w, old);
	spin_unlock_irqrestore(&ctx->lock, flags);
	return ret;
}

/* Register one buffer (RDMAPLUS_IOC_RVMA_POST, or one of a POSTV). */
static long rvma_post_one(struct rdmaplus_rvma_ctx *ctx,
			  const struct rdmaplus_rvma_post *ap)
{
	struct rdmaplus_rvma_post a = *ap;
	struct rvma_mr *fresh = NULL;
	struct rvma_buf *nb = NULL;
	struct rvma_win *w;
	struct ib_mr *ibmr;
	unsigned long flags;
	void *rmr;
	long ret;

	if (a.flags & ~(RDMAPLUS_RVMA_REC_ONETIME | RDMAPLUS_RVMA_POST_F_RKEY) ||
	    (a.rkey && !(a.flags & RDMAPLUS_RVMA_POST_F_RKEY)) ||
	    !a.length || a.length > RDMAPLUS_RVMA_MAX_LENGTH ||
	    a.iova + a.length < a.iova || !a.threshold)
		return -EINVAL;
	if (!rdmaplus_rxe_supported())
		return -EOPNOTSUPP;

	mutex_lock(&ctx->mutex);
	ret = rvma_win_get(ctx, a.win, &w);
	if (ret)
		goto out;
	ret = -EINVAL;
	if ((w->kind == RDMAPLUS_RVMA_BYTES && a.threshold > a.length) ||
	    a.record >= ctx->nrec ||
	    (w->mbkey && a.flags & RDMAPLUS_RVMA_POST_F_RKEY))
		goto out;
	ret = rvma_repost(ctx, &a, w);
	if (ret <= 0)
		goto out;
	ibmr = rvma_region(a.key, &rmr);
	if (IS_ERR(ibmr)) {
		ret = PTR_ERR(ibmr);
		goto out;
	}
	ret = -ERANGE;
	if (a.iova < ibmr->iova ||
	    a.iova + a.length > ibmr->iova + ibmr->length)
		goto put;
	ret = rvma_prepare(ctx, ibmr, a.key, &fresh);
	if (ret)
		goto put;
	ret = rvma_account(ctx, sizeof(*nb));
	if (ret)
		goto put;
	nb = kzalloc(sizeof(*nb), GFP_KERNEL_ACCOUNT);
	if (!nb) {
		atomic_long_sub(sizeof(*nb), &ctx->kept);
		ret = -ENOMEM;
		goto put;
	}
	spin_lock_irqsave(&ctx->lock, flags);
	ret = rvma_post_locked(ctx, &a, w, rmr, &fresh, nb);
	spin_unlock_irqrestore(&ctx->lock, flags);
	if (!ret)
		nb = NULL;
put:
	rdmaplus_rxe_put_mr(ibmr);
out:
	rvma_mr_put_fresh(ctx, fresh);
	if (nb) {
		atomic_long_sub(sizeof(*nb), &ctx->kept);
		kfree(nb);
	}
	if (ret)
		rvma_unhook_later(ctx);
	mutex_unlock(&ctx->mutex);
	return ret;
}

static long rvma_post(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_post a;
	int ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	return rvma_post_one(ctx, &a);
}

static long rvma_postv(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_postv v;
	struct rdmaplus_rvma_post a;
	const void __user *src;
	long ret = 0;
	u32 i;

	ret = rdmaplus_copy_in(&v, sizeof(v), sizeof(v), arg);
	if (ret)
		return ret;
	if (v.reserved || v.done || !v.count || v.count > RDMAPLUS_RVMA_MAX_POSTV)
		return -EINVAL;
	src = u64_to_user_ptr(v.posts);
	for (i = 0; i < v.count; i++) {
		/* the array's stride is the module's structure */
		if (copy_from_user(&a, src + i * sizeof(a), sizeof(a))) {
			ret = -EFAULT;
			break;
		}
		ret = a.size == sizeof(a) ? rvma_post_one(ctx, &a) : -EINVAL;
		if (ret)
			break;
	}
	if (put_user(i, (u32 __user *)(arg +
			offsetof(struct rdmaplus_rvma_postv, done))))
		return -EFAULT;
	return ret;
}

static long rvma_end(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_end a;
	unsigned int ended = 0, published = 0;
	bool wake;
	bool all = false;
	struct rvma_buf *b;
	struct rvma_win *w;
	unsigned long flags;
	long ret = 0;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (a.reserved || a.flags & ~(RVMA_END_FLAGS | RDMAPLUS_RVMA_END_F_ALL))
		return -EINVAL;
	all = a.flags & RDMAPLUS_RVMA_END_F_ALL;
	mutex_lock(&ctx->mutex);
	ret = rvma_win_get(ctx, a.win, &w);
	if (ret)
		goto out;
	spin_lock_irqsave(&ctx->lock, flags);
	if (!all) {
		b = rvma_pending_at(w, a.gen);
		if (b && b->state == RVMA_OPEN) {
			b->state = RVMA_ENDED;
			b->flags |= a.flags & RVMA_END_FLAGS;
			ended++;
		}
	} else {
		/* every pending one from a.gen on: the list is by gen */
		list_for_each_entry_reverse(b, &w->pending, pnode) {
			if (b->gen < a.gen)
				break;
			if (b->state != RVMA_OPEN)
				continue;
			b->state = RVMA_ENDED;
			b->flags |= a.flags & RVMA_END_FLAGS;
			ended++;
		}
	}
	if (ended)
		published = rvma_publish(ctx, w);
	wake = rvma_wake(ctx, published);
	spin_unlock_irqrestore(&ctx->lock, flags);
	if (wake)
		rdmaplus_eventfd_signal(ctx->evt);
	if (!ended)
		ret = -ENOENT;
out:
	mutex_unlock(&ctx->mutex);
	return ret;
}

/* ---- counters ----------------------------------------------------------
 *
 * Module-wide, in sysfs next to Active Access's:
 * /sys/kernel/rdmaplus/rvma/<name>, one decimal value each.
 */
#define RVMA_ATTR(name) \
	RDMAPLUS_COUNTER(rvma_attr_##name, name, &rvma_st.name)

RVMA_ATTR(packets);	/* write packets placed into open buffers */
RVMA_ATTR(bytes);	/* bytes placed */
RVMA_ATTR(published);	/* records published */
RVMA_ATTR(refused);	/* write packets refused: gate closed, wrong key */
RVMA_ATTR(unparsed);	/* placed packets whose opcode was not found */
RVMA_ATTR(nomem);	/* refused: no memory to keep their message's key */
RVMA_ATTR(windows);	/* live windows */
RVMA_ATTR(ranges);	/* gated ranges, pending and closed */
RVMA_ATTR(mrs);		/* memory regions with a gated range */
RVMA_ATTR(translated);	/* write messages to a mailbox key translated */
RVMA_ATTR(untranslated); /* ... refused: no open buffer of their gen, too long */

static struct attribute *rvma_attrs[] = {
	&rvma_attr_packets.kattr.attr,
	&rvma_attr_bytes.kattr.attr,
	&rvma_attr_published.kattr.attr,
	&rvma_attr_refused.kattr.attr,
	&rvma_attr_unparsed.kattr.attr,
	&rvma_attr_nomem.kattr.attr,
	&rvma_attr_windows.kattr.attr,
	&rvma_attr_ranges.kattr.attr,
	&rvma_attr_mrs.kattr.attr,
	&rvma_attr_translated.kattr.attr,
	&rvma_attr_untranslated.kattr.attr,
	NULL,
};

static const struct attribute_group rvma_attr_group = {
	.name = "rvma",
	.attrs = rvma_attrs,
};

/* ---- file ------------------------------------------------------------- */

struct rdmaplus_rvma_ctx *rdmaplus_rvma_open(struct rdmaplus_user *u)
{
	struct rdmaplus_rvma_ctx *ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);

	if (!ctx)
		return ERR_PTR(-ENOMEM);
	mutex_init(&ctx->mutex);
	spin_lock_init(&ctx->lock);
	INIT_LIST_HEAD(&ctx->mrs);
	xa_init_flags(&ctx->msgs, XA_FLAGS_LOCK_IRQ);
	INIT_DELAYED_WORK(&ctx->gc, rvma_gc);
	ctx->user = u;
	return ctx;
}

void rdmaplus_rvma_release(struct rdmaplus_rvma_ctx *ctx)
{
	struct rvma_mr *m;
	unsigned int steps = 0;
	unsigned long flags;
	u32 i;

	mutex_lock(&ctx->mutex);
	spin_lock_irqsave(&ctx->lock, flags);
	for (i = 0; i < ctx->nwin; i++)
		if (ctx->wins[i].kind)
			rvma_win_forget(ctx, &ctx->wins[i], &flags, &steps);
	while ((m = list_first_entry_or_null(&ctx->mrs, struct rvma_mr,
					     node))) {
		if (!WARN_ON_ONCE(!m->guarded))
			ctx->nguarded--;
		rvma_mr_unlink(m);
		rvma_relax(ctx, &flags, &steps);
	}
	WARN_ON_ONCE(ctx->nranges || ctx->nguarded);
	spin_unlock_irqrestore(&ctx->lock, flags);
	mutex_unlock(&ctx->mutex);
	synchronize_rcu();	/* no hook uses ctx any more */
	cancel_delayed_work_sync(&ctx->gc);
	if (ctx->hooked)
		rdmaplus_rxe_hook_put();
	if (ctx->evt)
		eventfd_ctx_put(ctx->evt);
	vfree(ctx->area);	/* no mapping is left: it holds the file */
	rdmaplus_uncharge(ctx->user, ctx->charged + ctx->kept_charged);
	WARN_ON_ONCE(atomic_long_read(&ctx->kept));
	kvfree(ctx->wins);
	bitmap_free(ctx->rec_busy);
	xa_destroy(&ctx->msgs);
	kfree(ctx);
}

/*
 * Name a QP: its entry in msgs is allocated here, where allocating may
 * sleep, and marked so that the hook keeps it between messages. The
 * reservation makes the slot; the store under the lock then takes no
 * memory. ctx->mutex held.
 */
static long rvma_qp_name(struct rdmaplus_rvma_ctx *ctx, u32 qpn)
{
	unsigned long flags, v;
	void *ent;
	int ret;

	ent = xa_load(&ctx->msgs, qpn);
	if (ent && xa_to_value(ent) & RVMA_NAMED)
		return 0;
	if (ctx->named >= RDMAPLUS_RVMA_MAX_QPS)
		return -ENOSPC;
	ret = xa_reserve_irq(&ctx->msgs, qpn, GFP_KERNEL_ACCOUNT);
	if (ret)
		return ret;
	spin_lock_irqsave(&ctx->lock, flags);
	ent = xa_load(&ctx->msgs, qpn);
	v = ent ? xa_to_value(ent) : 0;
	ent = xa_store(&ctx->msgs, qpn, xa_mk_value(v | RVMA_NAMED),
		       GFP_ATOMIC | __GFP_NOWARN);
	spin_unlock_irqrestore(&ctx->lock, flags);
	if (xa_is_err(ent))
		return xa_err(ent);
	ctx->named++;
	return 0;
}

/*
 * Forget a QP: its entry goes, or, with a message still in progress,
 * stays unnamed so that the message's last packet drops it. ctx->mutex
 * held.
 */
static void rvma_qp_forget(struct rdmaplus_rvma_ctx *ctx, u32 qpn)
{
	unsigned long flags, v;
	void *ent;

	spin_lock_irqsave(&ctx->lock, flags);
	ent = xa_load(&ctx->msgs, qpn);
	v = ent ? xa_to_value(ent) : 0;
	if (v & RVMA_NAMED) {
		ctx->named--;
		if (v >> 1)
			xa_store(&ctx->msgs, qpn, xa_mk_value(v & ~RVMA_NAMED),
				 GFP_ATOMIC);	/* there: takes no memory */
		else
			xa_erase(&ctx->msgs, qpn);
	}
	spin_unlock_irqrestore(&ctx->lock, flags);
}

static long rvma_qp(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_qp a;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (a.qpn > 0xffffff || a.reserved ||
	    a.flags & ~RDMAPLUS_RVMA_QP_F_FORGET)
		return -EINVAL;
	mutex_lock(&ctx->mutex);
	if (a.flags & RDMAPLUS_RVMA_QP_F_FORGET)
		rvma_qp_forget(ctx, a.qpn);
	else
		ret = rvma_qp_name(ctx, a.qpn);
	mutex_unlock(&ctx->mutex);
	return ret;
}

/* RDMAPLUS_IOC_RVMA_GUARD: see struct rdmaplus_rvma_guard. */
static long rvma_guard(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	struct rdmaplus_rvma_guard a;
	struct rvma_mr *fresh = NULL, *m;
	struct ib_mr *ibmr;
	unsigned long flags;
	void *rmr;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (!rdmaplus_rxe_supported())
		return -EOPNOTSUPP;
	mutex_lock(&ctx->mutex);
	ret = -ENXIO;
	if (!ctx->setup)
		goto out;
	ibmr = rvma_region(a.key, &rmr);
	if (IS_ERR(ibmr)) {
		ret = PTR_ERR(ibmr);
		goto out;
	}
	ret = -EINVAL;
	if (!rdmaplus_rxe_remote_write(ibmr))
		goto put;	/* no remote write: nothing to guard */
	ret = rvma_prepare(ctx, ibmr, a.key, &fresh);
	if (ret)
		goto put;
	spin_lock_irqsave(&ctx->lock, flags);
	spin_lock(&rvma_hash_lock);
	m = rvma_hashed(rmr);
	spin_unlock(&rvma_hash_lock);
	if (m && m->ctx != ctx) {
		ret = -EBUSY;	/* another file gates it */
	} else if (m) {	/* guarded already, or gated for other windows */
		ret = m->guarded ? 0 : -EBUSY;
	} else {
		m = rvma_mr_add(ctx, rmr, &fresh);
		m->guarded = true;
		ctx->nguarded++;
		ret = 0;
	}
	spin_unlock_irqrestore(&ctx->lock, flags);
put:
	rdmaplus_rxe_put_mr(ibmr);
out:
	rvma_mr_put_fresh(ctx, fresh);
	if (ret)
		rvma_unhook_later(ctx);
	mutex_unlock(&ctx->mutex);
	return ret;
}

static long rvma_arm(struct rdmaplus_rvma_ctx *ctx, void __user *arg)
{
	unsigned long flags;
	long ret = 0;

	if (arg)
		return -EINVAL;
	mutex_lock(&ctx->mutex);
	if (!ctx->setup) {
		ret = -ENXIO;
		goto out;
	}
	if (!ctx->evt) {
		ret = -EINVAL;
		goto out;
	}
	spin_lock_irqsave(&ctx->lock, flags);
	ctx->armed = true;
	spin_unlock_irqrestore(&ctx->lock, flags);
out:
	mutex_unlock(&ctx->mutex);
	return ret;
}

long rdmaplus_rvma_ioctl(struct rdmaplus_rvma_ctx *ctx, unsigned int cmd,
			 void __user *arg)
{
	switch (cmd) {
	case RDMAPLUS_IOC_RVMA_SETUP:
		return rvma_setup(ctx, arg);
	case RDMAPLUS_IOC_RVMA_WIN_CREATE:
		return rvma_win_create(ctx, arg);
	case RDMAPLUS_IOC_RVMA_WIN_DESTROY:
		return rvma_win_destroy(ctx, arg);
	case RDMAPLUS_IOC_RVMA_POST:
		return rvma_post(ctx, arg);
	case RDMAPLUS_IOC_RVMA_POSTV:
		return rvma_postv(ctx, arg);
	case RDMAPLUS_IOC_RVMA_END:
		return rvma_end(ctx, arg);
	case RDMAPLUS_IOC_RVMA_ARM:
		return rvma_arm(ctx, arg);
	case RDMAPLUS_IOC_RVMA_QP:
		return rvma_qp(ctx, arg);
	case RDMAPLUS_IOC_RVMA_GUARD:
		return rvma_guard(ctx, arg);
	default:
		return -ENOIOCTLCMD;	/* not an RVMA request */
	}
}

bool rdmaplus_rvma_owns_pgoff(unsigned long pgoff)
{
	return pgoff == RVMA_PGOFF;
}

int rdmaplus_rvma_mmap(struct rdmaplus_rvma_ctx *ctx,
		       struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start;
	int ret;

	mutex_lock(&ctx->mutex);
	if (!ctx->setup)
		ret = -ENXIO;
	else if (len != ctx->area_size)
		ret = -EINVAL;
	else
		ret = remap_vmalloc_range(vma, ctx->area, 0);
	mutex_unlock(&ctx->mutex);
	return ret;
}

/* ---- load ------------------------------------------------------------- */

int rdmaplus_rvma_init(void)
{
	int ret;

	ret = sysfs_create_group(rdmaplus_kobj(), &rvma_attr_group);
	if (ret) {
		pr_err("cannot create /sys/kernel/rdmaplus/rvma: %d\n", ret);
		return ret;
	}
	rdmaplus_rxe_add_consumer(&rvma_consumer);
	return 0;
}

void rdmaplus_rvma_exit(void)
{
	/* Every file is closed: no range is left, no reference held. */
	sysfs_remove_group(rdmaplus_kobj(), &rvma_attr_group);
	rcu_barrier();		/* rvma_mr_free_rcu callbacks */
}
