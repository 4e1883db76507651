// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus JBMT transfers (docs/jbmt.md): a get or a put between a local
 * buffer and a peer's region, cut into sections of at most
 * JBMT_SECT_BYTES, each pinned on both hosts only while it moves.
 *
 * The sink of a section always maps its pages with a fast registration
 * (FRWR) and lends the source a one-time rkey; the source writes with
 * rdma_rw and ends with a SEND_WITH_INV that revokes the rkey. So a
 * region's pages are never exposed under a lasting rkey, and neither host
 * trusts the other's addresses:
 *
 *   get: initiator pins its sink, registers it, sends GET{token, off, len,
 *        rkey, iova}; the target checks the token, pins its pages, writes
 *        them and answers DONE{status} with invalidation.
 *   put: initiator sends PUT{token, off, len}; the target checks, pins and
 *        registers its pages and answers GRANT{tsid, rkey, iova} (or DONE
 *        with the reason it cannot); the initiator writes and sends
 *        FIN{tsid} with invalidation. A grant not finished within
 *        JBMT_LEASE_MS is taken back (its rkey deregistered first).
 *
 * A small section (at most jbmt_inline_bytes) needs neither: its data rides
 * in the messages, after their header (JBMT_F_INLINE). A get asks with
 * GET{token, off, len} and the target answers DONE{status} followed by the
 * data; a put sends PUT{token, off, len} followed by the data and the
 * target answers DONE{status} once it has copied them into the region.
 * Each side copies between the message and its pinned pages, so no rkey
 * is lent, no registration made, and a put takes one round trip, not two.
 *
 * A refused section (bad token, rights, range, unmapped pages) fails its
 * operation and leaves the connection up. Pins are short-term (no
 * FOLL_LONGTERM, no RLIMIT_MEMLOCK): the pages move only for as long as
 * the section is in flight.
 *
 * Contexts: an operation runs in its caller's ioctl (or an asynchronous
 * one's work item); requests from peers are served in the CQ's completion
 * work when their pages are resident, else in work items on jbmt_xfer_wq;
 * responses are handled in the completion work and only wake operations,
 * but for a direct asynchronous operation (one section, started in the
 * submitting call), which its response ends there. A section awaiting a
 * response is in its peer's xids array: whoever erases it there (the
 * response, a dead connection, a cancelling operation or a direct one's
 * watch) owns its completion. A grant
 * is in its peer's grants array: whoever erases it (FIN, the lease, a
 * dead connection) releases it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/highmem.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/version.h>
#include <rdma/mr_pool.h>
#include <rdma/rw.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"
#include "rdmaplus_jbmt.h"

/* sections one operation keeps in flight */
#define JBMT_WINDOW		4
/* the longest an operation waits without looking whether its file closes */
#define JBMT_WAIT_SLICE		(HZ / 5)

struct workqueue_struct *jbmt_xfer_wq;

static struct {
	atomic64_t gets;		/* operations, since load */
	atomic64_t puts;
	atomic64_t get_bytes;		/* moved by them */
	atomic64_t put_bytes;
	atomic64_t op_errors;		/* operations that failed */
	atomic64_t sections;		/* started by this host */
	atomic64_t sections_served;	/* served for peers */
	atomic64_t sections_refused;	/* peers' requests refused, why: */
	atomic64_t refused_noent;	/* a token this host never issued */
	atomic64_t refused_stale;	/* a revoked region's token */
	atomic64_t refused_perm;	/* the region lacks the right */
	atomic64_t refused_range;	/* outside the region */
	atomic64_t refused_fault;	/* pages not mapped, process gone */
	atomic64_t refused_nomem;	/* no memory or sink here */
	atomic64_t refused_inval;	/* a malformed request */
	atomic64_t leases_expired;	/* grants taken back */
	atomic64_t nacks_sent;		/* NOPIN: our serving budget full */
	atomic64_t nacks_received;	/* NOPIN: a peer's */
	atomic64_t budget_waits;	/* operations that waited for budget */
	atomic64_t sections_inline;	/* served in the completion handler */
	atomic64_t sections_deferred;	/* to a work item: a fault, a lock */
	atomic64_t small_sections;	/* started, their data in the messages */
} jbmt_xfer_st;

/*
 * Sections of at most this many bytes carry their data in the request (a
 * put) or the answer (a get) instead of an RDMA WRITE to a registered
 * sink; 0 turns that off. Any peer of protocol 4 takes up to
 * JBMT_INLINE_MAX.
 */
static unsigned int jbmt_inline_bytes = 4096;
module_param(jbmt_inline_bytes, uint, 0644);
MODULE_PARM_DESC(jbmt_inline_bytes, "sections of at most this many bytes carry their data in the messages, without a registration (0 to 8192, default 4096)");

static u32 jbmt_inline_max(void)
{
	return min_t(u32, READ_ONCE(jbmt_inline_bytes), JBMT_INLINE_MAX);
}

/*
 * A section this host starts spans at most this many pages (1 to
 * JBMT_SECT_PAGES): smaller sections pin less at a time and cost more
 * messages per byte. Peers serve any size up to JBMT_SECT_BYTES.
 */
static unsigned int jbmt_section_pages = JBMT_SECT_PAGES;

static int jbmt_section_set(const char *val, const struct kernel_param *kp)
{
	return param_set_uint_minmax(val, kp, 1, JBMT_SECT_PAGES);
}

static const struct kernel_param_ops jbmt_section_ops = {
	.set = jbmt_section_set,
	.get = param_get_uint,
};
module_param_cb(jbmt_section_pages, &jbmt_section_ops, &jbmt_section_pages,
		0644);
MODULE_PARM_DESC(jbmt_section_pages, "pages a section of this host's transfers spans at most (1 to 64, default 64)");

static const int jbmt_errno[JBMT_NSTATUS] = {
	[JBMT_OK] = 0,
	[JBMT_NOENT] = -ENOENT,
	[JBMT_PERM] = -EACCES,
	[JBMT_RANGE] = -ERANGE,
	[JBMT_FAULT] = -EFAULT,
	[JBMT_NOMEM] = -ENOMEM,
	[JBMT_INVAL] = -EINVAL,
	[JBMT_ABORT] = -ECONNABORTED,
	[JBMT_NOPIN] = -EAGAIN,
	[JBMT_STALE] = -ESTALE,
};

static int jbmt_status_errno(u8 status)
{
	return status < JBMT_NSTATUS ? jbmt_errno[status] : -EPROTO;
}

/* ---- sinks -------------------------------------------------------------- */

void jbmt_mr_retire(struct jbmt_peer *p, struct ib_mr *mr)
{
	struct ib_mr *fresh;

	/* dropping the MR invalidates its rkey: no write lands after */
	ib_dereg_mr(mr);
	fresh = ib_alloc_mr(p->pd, IB_MR_TYPE_MEM_REG, JBMT_SECT_SPAN);
	if (IS_ERR(fresh)) {
		p->nmrs--;	/* the pool shrinks; requests get NOMEM */
		return;
	}
	ib_mr_pool_put(p->cm->qp, &p->mrs, fresh);
}

/*
 * Map a section's pages (DMA-mapped sg) with mr for remote writes, and
 * fill reg with the WR that registers it: -EINVAL when they do not fit.
 */
static int jbmt_mr_map(struct ib_mr *mr, struct sg_table *sgt, int nents,
		       struct ib_reg_wr *reg)
{
	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	if (ib_map_mr_sg(mr, sgt->sgl, nents, NULL, PAGE_SIZE) != nents)
		return -EINVAL;
	memset(reg, 0, sizeof(*reg));
	reg->wr.opcode = IB_WR_REG_MR;
	reg->mr = mr;
	reg->key = mr->rkey;
	reg->access = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE;
	return 0;
}

/* ---- a section's pages ------------------------------------------------- */

/* a section's pages on this host, and how the device reaches them */
struct jbmt_pages {
	struct page *pages[JBMT_SECT_SPAN];	/* pinned for it alone */
	unsigned int npages;
	struct jbmt_pc_ent *pc;	/* or the cached range holding them */
	bool sink;		/* written by the device: dirtied after */
	struct sg_table sgt;
	int nents;		/* DMA-mapped (a sink) */
	struct ib_mr *mr;	/* a sink's registration */
	bool mr_invalidated;	/* its rkey revoked by the peer's SEND_WITH_INV */
	struct rdma_rw_ctx rw;	/* a source's writes */
	bool rw_ready;
};

/*
 * Pin the pages of [addr, addr + len) in mm (the caller's when NULL) and
 * build their scatterlist: -EFAULT, -EAGAIN (nofault: a fault or a lock
 * to wait for), -ENOMEM. With m->pc set they are that cached range's.
 * Else, with cache (and not nofault) and the pin cache on, they become a
 * cached range of side for owner (ctx charged, on the op side), which
 * takes over their pages of the *charged the caller holds.
 */
static int jbmt_pages_pin(struct jbmt_pages *m, struct mm_struct *mm,
			  enum jbmt_side side, const void *owner,
			  struct rdmaplus_jbmt_ctx *ctx, u64 addr, u32 len,
			  bool nofault, bool cache, unsigned int *charged)
{
	unsigned int n = jbmt_span(addr, len);
	int ret;

	if (!m->pc && cache && !nofault && jbmt_pc_enabled()) {
		m->pc = jbmt_pc_fill(mm ?: current->mm, side, owner, ctx, addr,
				     n, m->sink, &ret);
		if (m->pc)
			*charged -= n;
		else if (ret == -EFAULT)
			return ret;
	}
	if (m->pc)
		return sg_alloc_table_from_pages(&m->sgt,
						 jbmt_pc_pages(m->pc, addr), n,
						 offset_in_page(addr), len,
						 GFP_KERNEL);
	ret = jbmt_pin(mm, addr & PAGE_MASK, n, m->sink, nofault, m->pages);
	if (ret)
		return ret;
	m->npages = n;
	return sg_alloc_table_from_pages(&m->sgt, m->pages, n,
					 offset_in_page(addr), len, GFP_KERNEL);
}

/*
 * Whether every page of m is anonymous: marking those dirty takes no page
 * lock, so a completion handler may write them.
 */
static bool jbmt_pages_anon(struct jbmt_pages *m)
{
	struct sg_page_iter it;

	for_each_sgtable_page(&m->sgt, &it, 0)
		if (!PageAnon(sg_page_iter_page(&it)))
			return false;
	return true;
}

/*
 * Mark a sink's pages dirty: an anonymous page's flag is set without its
 * lock (its mapping, if any, is the swap cache's, whose dirtying is only
 * the flag), so unpinning finds it dirty and locks nothing.
 */
static void jbmt_pages_dirty(struct jbmt_pages *m)
{
	struct sg_page_iter it;

	for_each_sgtable_page(&m->sgt, &it, 0) {
		struct page *pg = sg_page_iter_page(&it);

		if (PageAnon(pg))
			folio_mark_dirty(page_folio(pg));
		else
			set_page_dirty_lock(pg);
	}
}

/* Release what m holds; the device is done with it. */
static void jbmt_pages_release(struct jbmt_peer *p, struct jbmt_pages *m)
{
	if (m->mr) {
		if (m->mr_invalidated)
			ib_mr_pool_put(p->cm->qp, &p->mrs, m->mr);
		else
			jbmt_mr_retire(p, m->mr);
	}
	if (m->nents)
		ib_dma_unmap_sg(p->pd->device, m->sgt.sgl, m->sgt.orig_nents,
				DMA_FROM_DEVICE);
	if (m->rw_ready)
		rdma_rw_ctx_destroy(&m->rw, p->cm->qp, p->cm->port_num,
				    m->sgt.sgl, m->sgt.orig_nents,
				    DMA_TO_DEVICE);
	/* a cached range stays pinned: its pages are dirtied now */
	if (m->sink && m->sgt.sgl)
		jbmt_pages_dirty(m);
	if (m->pc)
		jbmt_pc_put(m->pc);
	if (m->sgt.sgl)
		sg_free_table(&m->sgt);
	if (m->npages)
		jbmt_unpin(m->pages, m->npages, m->sink);
}

/* ---- sections we start -------------------------------------------------- */

struct jbmt_direct;
static void jbmt_direct_answered(struct jbmt_direct *d);

enum jbmt_isect_stage {
	JBMT_WAIT_RESP,		/* in p->xids, awaiting GRANT or DONE */
	JBMT_WAIT_RETRY,	/* NACKed: asks again at retry_at */
	JBMT_WAIT_SENT,		/* a put's writes and FIN posted */
	JBMT_ENDED,		/* status final; resources to release */
};

struct jbmt_isect {
	struct jbmt_peer *p;
	struct rdmaplus_jbmt_ctx *ctx;	/* charged for its pages */
	struct mm_struct *mm;		/* its pages' (NULL: the caller's) */
	u32 xid;
	u32 op;
	u64 addr;		/* local */
	u32 len;
	u64 roff;		/* in the region */
	struct rdmaplus_jbmt_token token;
	enum jbmt_isect_stage stage;
	int status;
	unsigned int nacks;
	unsigned long retry_at;
	unsigned int budget;	/* pages taken from the ops' budget */
	bool inl;		/* its data in the messages (JBMT_F_INLINE) */
	struct jbmt_pages mem;	/* a get's sink, a put's source */
	struct completion done;	/* the response */
	struct completion sent;	/* the FIN (put) */
	wait_queue_head_t *opwq;	/* its operation waits here */
	struct jbmt_direct *direct;	/* or it is one, ended by its answer */
	/* from the response */
	u8 resp_type, resp_status;
	u32 tsid, rkey, inv_rkey, resp_budget;
	u64 iova;
};

/*
 * Complete c, an event of s, and wake s's operation. Both under the
 * operation's wait queue lock: the operation may see c done and return
 * at once, and its wait queue lives on its stack, so it takes that lock
 * once before it returns (jbmt_op_run), which waits for a waker still
 * inside. Without an operation waiting (an asynchronous one), only the
 * completion.
 */
static void jbmt_isect_signal(struct jbmt_isect *s, struct completion *c)
{
	wait_queue_head_t *wq = s->opwq;
	unsigned long flags;

	if (!wq) {
		complete(c);
		return;
	}
	spin_lock_irqsave(&wq->lock, flags);
	complete(c);
	wake_up_locked(wq);
	spin_unlock_irqrestore(&wq->lock, flags);
}

/*
 * The data an answer to s carries, checked against what s asked for and
 * copied into its pages: false if the peer broke the protocol.
 */
static bool jbmt_response_data(struct jbmt_isect *s, struct jbmt_rx *rx)
{
	const struct jbmt_msg *m = &rx->msg;
	bool with = be16_to_cpu(m->flags) & JBMT_F_INLINE;

	/* only a small get's successful DONE carries data: all of it */
	if (!(s->inl && s->op == RDMAPLUS_JBMT_GET &&
	      m->type == JBMT_MSG_DONE && m->status == JBMT_OK))
		return !rx->data_len && !with;
	if (!with || rx->data_len != s->len || be32_to_cpu(m->len) != s->len)
		return false;
	return sg_copy_from_buffer(s->mem.sgt.sgl, s->mem.sgt.orig_nents,
				   rx->data, s->len) == s->len;
}

void jbmt_xfer_response(struct jbmt_peer *p, struct jbmt_rx *rx)
{
	const struct jbmt_msg *m = &rx->msg;
	struct jbmt_isect *s = xa_erase(&p->xids, be32_to_cpu(m->xid));

	if (!s)
		return;		/* it gave up, or a stray answer */
	if (!jbmt_response_data(s, rx)) {
		pr_warn_ratelimited("JBMT: %pI4: an answer of %u bytes of data for a %u-byte section\n",
				    &p->addr, rx->data_len, s->len);
		jbmt_peer_down(p, -EPROTO);
		s->resp_type = 0;	/* failed with the connection */
		goto answered;
	}
	s->resp_type = m->type;
	s->resp_status = m->status;
	s->tsid = be32_to_cpu(m->tsid);
	s->rkey = be32_to_cpu(m->rkey);
	s->iova = be64_to_cpu(m->iova);
	s->resp_budget = be32_to_cpu(m->budget);
	s->inv_rkey = rx->inv_rkey;
answered:
	if (s->direct) {
		jbmt_direct_answered(s->direct);
		return;
	}
	jbmt_isect_signal(s, &s->done);
}

void jbmt_xfer_fail_peer(struct jbmt_peer *p)
{
	struct jbmt_isect *s;
	unsigned long i;

	xa_for_each(&p->xids, i, s) {
		if (xa_erase(&p->xids, i) != s)
			continue;
		s->resp_type = 0;	/* none came */
		if (s->direct) {
			jbmt_direct_answered(s->direct);
			continue;
		}
		jbmt_isect_signal(s, &s->done);
	}
}

/*
 * Sections this host keeps in flight to one peer, all its operations
 * together: JBMT_CREDITS, what the peer's receives are sized for, or
 * fewer.
 */
static unsigned int jbmt_credits = JBMT_CREDITS;
module_param(jbmt_credits, uint, 0644);
MODULE_PARM_DESC(jbmt_credits, "sections this host keeps in flight to one peer, 1 to 16 (default 16)");

static bool jbmt_credit_take(struct jbmt_peer *p)
{
	int max = clamp_t(int, READ_ONCE(jbmt_credits), 1, JBMT_CREDITS);
	bool ok;

	spin_lock_irq(&p->lock);
	ok = p->inflight < max;
	if (ok)
		p->inflight++;
	spin_unlock_irq(&p->lock);
	return ok;
}

static void jbmt_credit_give(struct jbmt_peer *p)
{
	spin_lock_irq(&p->lock);
	p->inflight--;
	spin_unlock_irq(&p->lock);
	wake_up_all(&p->wq);
}

/* Release what s holds; its WRs are complete or were never posted. */
static void jbmt_isect_release(struct jbmt_isect *s)
{
	struct jbmt_peer *p = s->p;

	jbmt_pages_release(p, &s->mem);
	jbmt_budget_give(s->ctx, s->budget);
	jbmt_credit_give(p);
}

static void jbmt_fin_sent(struct jbmt_tx *tx, struct ib_wc *wc)
{
	struct jbmt_isect *s = tx->arg;

	if (wc->status != IB_WC_SUCCESS)
		s->status = -ECONNRESET;
	jbmt_isect_signal(s, &s->sent);
}

/*
 * Ask the target for s (again, after a NACK): register a get's sink and
 * send the request. On error s is not in p->xids.
 */
static int jbmt_isect_request(struct jbmt_isect *s)
{
	struct jbmt_peer *p = s->p;
	bool get = s->op == RDMAPLUS_JBMT_GET;
	struct ib_reg_wr reg;
	struct jbmt_tx *tx;
	int ret;

	reinit_completion(&s->done);
	s->stage = JBMT_WAIT_RESP;
	tx = jbmt_tx_alloc_data(p, s->inl && !get ? s->len : 0, GFP_KERNEL);
	if (!tx)
		return -ENOMEM;
	tx->msg.type = get ? JBMT_MSG_GET : JBMT_MSG_PUT;
	tx->msg.len = cpu_to_be32(s->len);
	tx->msg.token_id = cpu_to_be32(s->token.id);
	tx->msg.token_gen = cpu_to_be32(s->token.gen);
	tx->msg.token_key = cpu_to_be64(s->token.key);
	tx->msg.off = cpu_to_be64(s->roff);
	if (s->inl) {
		/* a small put's data go with it; a get's come with DONE */
		tx->msg.flags = cpu_to_be16(JBMT_F_INLINE);
		if (!get && sg_copy_to_buffer(s->mem.sgt.sgl,
					      s->mem.sgt.orig_nents, tx->data,
					      s->len) != s->len) {
			ret = -EFAULT;
			goto err;
		}
	} else if (get) {
		if (s->mem.mr && !s->mem.mr_invalidated) {	/* not revoked: drop it */
			jbmt_mr_retire(p, s->mem.mr);
			s->mem.mr = NULL;
		}
		if (!s->mem.mr)
			s->mem.mr = ib_mr_pool_get(p->cm->qp, &p->mrs);
		if (!s->mem.mr) {
			ret = -ENOMEM;
			goto err;
		}
		s->mem.mr_invalidated = false;
		ret = jbmt_mr_map(s->mem.mr, &s->mem.sgt, s->mem.nents, &reg);
		if (ret)
			goto err;
		tx->msg.rkey = cpu_to_be32(s->mem.mr->rkey);
		tx->msg.iova = cpu_to_be64(s->mem.mr->iova);
	}
	ret = xa_alloc_cyclic(&p->xids, &s->xid, s, xa_limit_32b,
			      &p->next_xid, GFP_KERNEL);
	if (ret < 0)
		goto err;
	tx->msg.xid = cpu_to_be32(s->xid);
	ret = jbmt_tx_prepare(tx, 0);	/* the message is whole now */
	if (ret)
		goto err_xid;
	/* a connection dying now either sees s in xids or is seen here */
	smp_mb();
	if (READ_ONCE(p->dead)) {
		ret = -ECONNRESET;
		goto err_xid;
	}
	/* a get's request goes once its sink is registered */
	ret = get && !s->inl ? jbmt_post_reg_then(p, &reg, tx) :
			       jbmt_post_send(p->cm->qp, &tx->wr);
	if (ret)
		goto err_xid;
	return 0;

err_xid:
	if (xa_erase(&p->xids, s->xid) != s) {
		/* failed by a dying peer, which ends a direct section */
		if (s->direct) {
			jbmt_tx_free(tx);
			return -EINPROGRESS;
		}
		wait_for_completion(&s->done);
	}
err:
	jbmt_tx_free(tx);
	return ret;
}

/*
 * Start a section of op a at pos, of at most len bytes and pages pages,
 * taken from the budget or (pc) a cached range: pin, map, request. A
 * credit is held. It returns the bytes the section covers, or an error,
 * s then holding nothing.
 */
static long jbmt_isect_start(struct jbmt_peer *p, struct jbmt_isect *s,
			     wait_queue_head_t *opwq,
			     struct rdmaplus_jbmt_ctx *ctx, struct mm_struct *mm,
			     const struct rdmaplus_jbmt_op *a, u64 pos, u64 len,
			     unsigned int pages, struct jbmt_pc_ent *pc)
{
	bool get = a->op == RDMAPLUS_JBMT_GET;
	struct jbmt_direct *direct = s->direct;
	int ret;

	memset(s, 0, sizeof(*s));
	s->direct = direct;
	s->p = p;
	s->ctx = ctx;
	s->mm = mm;
	s->budget = pc ? 0 : pages;
	s->mem.pc = pc;
	s->op = a->op;
	s->addr = a->addr + pos;
	s->len = min_t(u64, len, pages * PAGE_SIZE - offset_in_page(s->addr));
	s->roff = a->offset + pos;
	s->token = a->token;
	s->opwq = opwq;
	init_completion(&s->done);
	init_completion(&s->sent);
	s->inl = s->len <= jbmt_inline_max();
	/* a direct put is a small one (jbmt_inline_bytes may have changed) */
	if (direct && !get && !s->inl) {
		ret = -EAGAIN;
		goto err;
	}

	s->mem.sink = get;
	ret = jbmt_pages_pin(&s->mem, mm, JBMT_SIDE_OP, ctx, ctx, s->addr,
			     s->len, false, true, &s->budget);
	if (ret)
		goto err;
	/* a direct get's sink is released by the answer's handler */
	if (s->direct && get && !jbmt_pages_anon(&s->mem)) {
		ret = -EAGAIN;
		goto err;
	}
	if (get && !s->inl) {
		s->mem.nents = ib_dma_map_sg(p->pd->device, s->mem.sgt.sgl,
					 s->mem.sgt.orig_nents, DMA_FROM_DEVICE);
		if (!s->mem.nents) {
			ret = -ENOMEM;
			goto err;
		}
	}
	/* a direct section may be answered and gone before the request returns */
	atomic64_inc(&jbmt_xfer_st.sections);
	if (s->inl)
		atomic64_inc(&jbmt_xfer_st.small_sections);
	len = s->len;
	ret = jbmt_isect_request(s);
	if (ret == -EINPROGRESS)
		return len;	/* ended already, by the connection's end */
	if (ret) {
		atomic64_dec(&jbmt_xfer_st.sections);
		if (s->inl)
			atomic64_dec(&jbmt_xfer_st.small_sections);
		goto err;
	}
	return len;

err:
	jbmt_isect_release(s);
	return ret;
}

/*
 * s's response has come (or its connection went): decide its status and,
 * for a granted put, post the writes and the FIN; a NACK sets a retry.
 */
static void jbmt_isect_respond(struct jbmt_isect *s)
{
	struct jbmt_peer *p = s->p;
	struct jbmt_tx *fin;
	int ret;

	s->stage = JBMT_ENDED;
	if (s->resp_budget)	/* every answer tells the target's budget */
		WRITE_ONCE(p->remote_budget, s->resp_budget);
	switch (s->resp_type) {
	case 0:
		s->status = -ECONNRESET;
		return;
	case JBMT_MSG_DONE:
		if (s->mem.mr && s->inv_rkey == s->mem.mr->rkey)
			s->mem.mr_invalidated = true;
		if (s->resp_status == JBMT_NOPIN) {
			/* the target's budget is full: ask again later */
			atomic64_inc(&jbmt_xfer_st.nacks_received);
			s->retry_at = jiffies + msecs_to_jiffies(1U <<
						min(s->nacks, 6U));
			s->nacks++;
			s->stage = JBMT_WAIT_RETRY;
			return;
		}
		s->status = jbmt_status_errno(s->resp_status);
		if (!s->status && s->op != RDMAPLUS_JBMT_GET && !s->inl)
			s->status = -EPROTO;	/* a put ends by our FIN */
		return;
	case JBMT_MSG_GRANT:
		if (s->op == RDMAPLUS_JBMT_PUT && !s->inl)
			break;
		fallthrough;
	default:
		s->status = -EPROTO;
		return;
	}

	/* a put granted: write, then FIN with the rkey revoked */
	fin = jbmt_tx_alloc(p, GFP_KERNEL);
	if (!fin) {
		s->status = -ENOMEM;
		goto abort;
	}
	fin->msg.type = JBMT_MSG_FIN;
	fin->msg.xid = cpu_to_be32(s->xid);
	fin->msg.tsid = cpu_to_be32(s->tsid);
	fin->done = jbmt_fin_sent;
	fin->arg = s;
	ret = jbmt_tx_prepare(fin, s->rkey);
	if (!ret) {
		ret = rdma_rw_ctx_init(&s->mem.rw, p->cm->qp, p->cm->port_num,
				       s->mem.sgt.sgl, s->mem.sgt.orig_nents, 0,
				       s->iova, s->rkey, DMA_TO_DEVICE);
		s->mem.rw_ready = ret > 0;
	}
	if (ret >= 0)
		ret = rdma_rw_ctx_post(&s->mem.rw, p->cm->qp, p->cm->port_num,
				       NULL, &fin->wr);
	if (ret) {
		jbmt_tx_free(fin);
		s->status = ret;
		goto abort;
	}
	s->stage = JBMT_WAIT_SENT;
	return;

abort:	/* tell the target to take its grant back now */
	{
		struct jbmt_msg m = {
			.type = JBMT_MSG_FIN,
			.status = JBMT_ABORT,
			.xid = cpu_to_be32(s->xid),
			.tsid = cpu_to_be32(s->tsid),
		};

		jbmt_send(p, &m, s->rkey);
	}
}

/* Ask again for a NACKed s whose time has come; on error it ends. */
static void jbmt_isect_retry(struct jbmt_isect *s)
{
	int ret = jbmt_isect_request(s);

	if (ret) {
		s->stage = JBMT_ENDED;
		s->status = ret;
	}
}

/*
 * Give s up: its response may still come within a lease, else it must not
 * touch s after. A get's sink is deregistered then, so a write that comes
 * later fails the connection (docs/jbmt.md).
 */
static void jbmt_isect_cancel(struct jbmt_isect *s, int err)
{
	if (s->stage == JBMT_WAIT_RETRY) {
		s->stage = JBMT_ENDED;
		s->status = err;
		return;
	}
	if (!wait_for_completion_timeout(&s->done,
					 msecs_to_jiffies(JBMT_LEASE_MS))) {
		if (xa_erase(&s->p->xids, s->xid) == s) {
			/* no response will come: a get's sink is retired */
			s->stage = JBMT_ENDED;
			s->status = err;
			return;
		}
		wait_for_completion(&s->done);	/* being answered now */
	}
	jbmt_isect_respond(s);
	if (s->stage == JBMT_WAIT_SENT) {
		wait_for_completion(&s->sent);
		s->stage = JBMT_ENDED;
	}
	s->stage = JBMT_ENDED;
	s->status = err;
}

/*
 * The pages the next section at addr may take, len bytes left: no more
 * than a section, the peer's budget or ours allows.
 */
static unsigned int jbmt_want_pages(struct jbmt_peer *p, u64 addr, u64 len)
{
	u64 sect = (u64)READ_ONCE(jbmt_section_pages) << PAGE_SHIFT;
	u64 bytes = min_t(u64, len, sect - offset_in_page(addr));

	return min3(jbmt_span(addr, bytes), max(READ_ONCE(p->remote_budget), 1U),
		    jbmt_pin_budget());
}

/*
 * Whether a section of the window has an event to act on (an ended one
 * waits for its turn at the head, which is not waited on).
 */
static bool jbmt_op_event(struct jbmt_isect *win, unsigned int head,
			  unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		struct jbmt_isect *s = &win[(head + i) % JBMT_WINDOW];

		if ((s->stage == JBMT_WAIT_RESP && completion_done(&s->done)) ||
		    (s->stage == JBMT_WAIT_SENT && completion_done(&s->sent)) ||
		    (s->stage == JBMT_WAIT_RETRY &&
		     time_after_eq(jiffies, s->retry_at)))
			return true;
	}
	return false;
}

/*
 * The cached range holding the want pages of the section of a at addr,
 * in mm (the caller's when NULL), or NULL; a credit is held.
 */
static struct jbmt_pc_ent *jbmt_isect_cached(struct rdmaplus_jbmt_ctx *ctx,
					     struct mm_struct *mm,
					     const struct rdmaplus_jbmt_op *a,
					     u64 addr, unsigned int want)
{
	return jbmt_pc_get(mm ?: current->mm, JBMT_SIDE_OP, ctx, addr, want,
			   a->op == RDMAPLUS_JBMT_GET);
}

/*
 * Wait for a credit and then for a cached range (*pc) or budget (*got
 * pages, at least one) for the section at addr of an operation with none
 * in flight: 0, -EINTR, -ETIMEDOUT or -ECONNRESET.
 */
static long jbmt_wait_slot(struct jbmt_peer *p, struct rdmaplus_jbmt_ctx *ctx,
			   struct mm_struct *mm,
			   const struct rdmaplus_jbmt_op *a, u64 addr,
			   unsigned int want, unsigned long deadline,
			   unsigned int *got, struct jbmt_pc_ent **pc)
{
	bool credit = false;
	long ret = 1;

	*got = 0;
	/* in slices: a closing file ends the wait (jbmt_op_aborted) */
	while (!credit && !READ_ONCE(p->dead) && !jbmt_op_aborted(ctx)) {
		long left = (long)(deadline - jiffies);

		if (left <= 0)
			return -ETIMEDOUT;
		ret = wait_event_interruptible_timeout(p->wq,
				READ_ONCE(p->dead) || (credit = jbmt_credit_take(p)),
				min(left, JBMT_WAIT_SLICE));
		if (ret < 0)
			return -EINTR;
	}
	if (!credit)
		return jbmt_op_aborted(ctx) ? -ECANCELED : -ECONNRESET;
	*pc = jbmt_isect_cached(ctx, mm, a, addr, want);
	if (*pc) {
		*got = want;
		return 0;
	}
	*got = jbmt_budget_take(ctx, want);
	if (!*got)
		atomic64_inc(&jbmt_xfer_st.budget_waits);
	while (!*got && !READ_ONCE(p->dead) && !jbmt_op_aborted(ctx)) {
		long left = (long)(deadline - jiffies);

		if (left <= 0) {
			ret = -ETIMEDOUT;
			break;
		}
		ret = wait_event_interruptible_timeout(jbmt_budget_wq,
				READ_ONCE(p->dead) ||
				(*got = jbmt_budget_take(ctx, want)),
				min(left, JBMT_WAIT_SLICE));
		if (ret < 0) {
			ret = -EINTR;
			break;
		}
	}
	if (*got && !READ_ONCE(p->dead) && !jbmt_op_aborted(ctx))
		return 0;
	if (*got)
		jbmt_budget_give(ctx, *got);
	*got = 0;
	jbmt_credit_give(p);
	if (ret < 0)
		return ret;
	return jbmt_op_aborted(ctx) ? -ECANCELED : -ECONNRESET;
}

static long jbmt_op_run(struct jbmt_peer *p, struct rdmaplus_jbmt_ctx *ctx,
			struct mm_struct *mm, struct rdmaplus_jbmt_op *a,
			struct jbmt_op_times *times)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(a->timeout_ms ?
				 a->timeout_ms : RDMAPLUS_JBMT_OP_MAX_MS);
	DECLARE_WAIT_QUEUE_HEAD_ONSTACK(opwq);
	struct jbmt_isect *win;
	unsigned int head = 0, n = 0, i, got;
	unsigned long next;
	u64 pos = 0;
	long err = 0, ret;

	win = kvcalloc(JBMT_WINDOW, sizeof(*win), GFP_KERNEL_ACCOUNT);
	if (!win)
		return -ENOMEM;
	a->done = 0;
	for (;;) {
		struct jbmt_isect *s;

		/*
		 * Start sections while the window has room. With sections
		 * in flight only what is free now is taken: this thread
		 * must go on answering them (a put's writes are posted
		 * here), or credits and budget held by waiting operations
		 * could all wait on one another.
		 */
		while (!err && n < JBMT_WINDOW && pos < a->length) {
			u64 addr = a->addr + pos;
			unsigned int want = jbmt_want_pages(p, addr,
							    a->length - pos);
			struct jbmt_pc_ent *pc = NULL;

			got = 0;
			if (n) {
				if (!jbmt_credit_take(p))
					break;
				pc = jbmt_isect_cached(ctx, mm, a, addr, want);
				got = pc ? want : jbmt_budget_take(ctx, want);
				if (!got) {
					jbmt_credit_give(p);
					break;
				}
			} else {
				err = jbmt_wait_slot(p, ctx, mm, a, addr, want,
						     deadline, &got, &pc);
				if (err)
					break;
			}
			s = &win[(head + n) % JBMT_WINDOW];
			ret = jbmt_isect_start(p, s, &opwq, ctx, mm, a, pos,
					       a->length - pos, got, pc);
			if (ret < 0) {
				err = ret;
				break;
			}
			n++;
			pos += ret;
		}
		if (!n)
			break;

		/* move every section on whose event has come */
		next = deadline;
		for (i = 0; i < n; i++) {
			s = &win[(head + i) % JBMT_WINDOW];
			if (s->stage == JBMT_WAIT_RESP &&
			    try_wait_for_completion(&s->done)) {
				if (times && !times->first)
					times->first = ktime_get_ns();
				jbmt_isect_respond(s);
			}
			if (s->stage == JBMT_WAIT_RETRY && !err &&
			    time_after_eq(jiffies, s->retry_at))
				jbmt_isect_retry(s);
			if (s->stage == JBMT_WAIT_RETRY &&
			    time_before(s->retry_at, next))
				next = s->retry_at;
			if (s->stage == JBMT_WAIT_SENT &&
			    try_wait_for_completion(&s->sent))
				s->stage = JBMT_ENDED;
		}
		s = &win[head];
		if (s->stage != JBMT_ENDED && err) {
			if (s->stage == JBMT_WAIT_SENT)	/* the device reads */
				wait_for_completion(&s->sent);	/* our pages */
			else
				jbmt_isect_cancel(s, err);
			s->stage = JBMT_ENDED;
		}
		if (s->stage != JBMT_ENDED) {
			/*
			 * Wait for any section's event, the first retry due,
			 * or a slice (a closing file ends the operation).
			 */
			long nap = clamp_t(long, (long)(next - jiffies), 1,
					   JBMT_WAIT_SLICE);

			ret = wait_event_interruptible_timeout(opwq,
				jbmt_op_event(win, head, n), nap);
			if (ret < 0)
				err = -EINTR;
			else if (time_after_eq(jiffies, deadline))
				err = -ETIMEDOUT;
			else if (jbmt_op_aborted(ctx))
				err = -ECANCELED;
			continue;
		}
		if (s->status && !err)
			err = s->status;
		if (!err)
			a->done += s->len;
		jbmt_isect_release(s);
		head = (head + 1) % JBMT_WINDOW;
		n--;
	}
	/* a waker that completed our last event may still be inside opwq's lock */
	spin_lock_irq(&opwq.lock);
	spin_unlock_irq(&opwq.lock);
	kvfree(win);
	return err;
}

/* Check an operation's arguments (from the ioctl or a submission). */
int jbmt_op_check(const struct rdmaplus_jbmt_op *a)
{
	if ((a->op != RDMAPLUS_JBMT_GET && a->op != RDMAPLUS_JBMT_PUT) ||
	    !a->length || a->addr + a->length < a->addr ||
	    !access_ok(u64_to_user_ptr(a->addr), a->length) ||
	    a->offset + a->length < a->offset || a->done ||
	    a->timeout_ms > RDMAPLUS_JBMT_OP_MAX_MS)
		return -EINVAL;
	return 0;
}

long jbmt_op_exec(struct rdmaplus_jbmt_ctx *ctx, struct mm_struct *mm,
		  struct rdmaplus_jbmt_op *a, struct jbmt_op_times *times)
{
	struct jbmt_peer *p;
	long ret;

	a->done = 0;
	p = jbmt_peer_get(a->peer);
	if (!p)
		return -ENOTCONN;
	if (READ_ONCE(p->state) != JBMT_PEER_UP || !jbmt_peer_enter(p)) {
		jbmt_peer_put(p);
		return -ENOTCONN;
	}
	ret = jbmt_op_run(p, ctx, mm, a, times);
	jbmt_peer_leave(p);
	jbmt_peer_put(p);

	atomic64_inc(a->op == RDMAPLUS_JBMT_GET ? &jbmt_xfer_st.gets :
		     &jbmt_xfer_st.puts);
	atomic64_add(a->done, a->op == RDMAPLUS_JBMT_GET ?
		     &jbmt_xfer_st.get_bytes : &jbmt_xfer_st.put_bytes);
	if (ret)
		atomic64_inc(&jbmt_xfer_st.op_errors);
	return ret;
}

/*
 * An asynchronous operation of one section, started in the submitting
 * call and ended by its answer's handler, so that no kernel worker waits
 * for it: a get of one section, or a small put. Two references: the
 * starter's, and the section's until it ends (jbmt_direct_end).
 */
struct jbmt_direct {
	struct jbmt_isect s;
	refcount_t ref;
	struct rdmaplus_jbmt_ctx *ctx;
	struct rdmaplus_jbmt_op *a;
	struct jbmt_op_times *times;
	unsigned long deadline;
	bool posted;		/* the watch may give it up */
	bool cancelled;		/* the file closes, or the deadline passed */
	unsigned long give_up;	/* then: no answer by now ends it */
	int err;		/* and with this */
	struct delayed_work watch;
	void (*end)(void *arg, long ret, bool again);
	void *arg;
};

static void jbmt_direct_put(struct jbmt_direct *d)
{
	if (refcount_dec_and_test(&d->ref))
		kfree(d);
}

/*
 * d's section is answered (or given up, or its connection gone), and no
 * longer in its peer's xids: settle it, release it and report. A NACK
 * hands the operation to a worker, which runs it whole (nothing moved).
 */
static void jbmt_direct_end(struct jbmt_direct *d, bool from_watch)
{
	struct jbmt_isect *s = &d->s;
	struct jbmt_peer *p = s->p;
	bool again, get = s->op == RDMAPLUS_JBMT_GET;
	long ret;

	if (!from_watch)
		cancel_delayed_work_sync(&d->watch);
	if (d->times && s->resp_type)
		d->times->first = ktime_get_ns();
	jbmt_isect_respond(s);	/* a get, a small put: nothing to post */
	again = s->stage == JBMT_WAIT_RETRY && !d->err;
	ret = d->err ?: s->status;
	d->a->done = !ret && !again ? s->len : 0;
	jbmt_isect_release(s);
	jbmt_peer_leave(p);
	jbmt_peer_put(p);
	if (!again) {
		atomic64_inc(get ? &jbmt_xfer_st.gets : &jbmt_xfer_st.puts);
		atomic64_add(d->a->done, get ? &jbmt_xfer_st.get_bytes :
			     &jbmt_xfer_st.put_bytes);
		if (ret)
			atomic64_inc(&jbmt_xfer_st.op_errors);
	}
	d->end(d->arg, ret, again);
	jbmt_direct_put(d);
}

static void jbmt_direct_answered(struct jbmt_direct *d)
{
	jbmt_direct_end(d, false);
}

/*
 * Every slice: a closing file or a passed deadline cancels d, which still
 * waits a lease for its answer (as a blocking operation's sections do),
 * and then gives it up (a get's sink, if any, deregistered).
 */
static void jbmt_direct_watch(struct work_struct *w)
{
	struct jbmt_direct *d = container_of(to_delayed_work(w),
					     struct jbmt_direct, watch);
	struct jbmt_isect *s = &d->s;

	if (!d->cancelled && (jbmt_op_aborted(d->ctx) ||
			      time_after_eq(jiffies, d->deadline))) {
		d->cancelled = true;
		d->err = jbmt_op_aborted(d->ctx) ? -ECANCELED : -ETIMEDOUT;
		d->give_up = jiffies + msecs_to_jiffies(JBMT_LEASE_MS);
	}
	if (!READ_ONCE(d->posted) || !d->cancelled ||
	    time_before(jiffies, d->give_up)) {
		queue_delayed_work(jbmt_xfer_wq, &d->watch, JBMT_WAIT_SLICE);
		return;
	}
	if (xa_erase(&s->p->xids, s->xid) != s)
		return;		/* being answered: the answer ends it */
	s->resp_type = 0;
	jbmt_direct_end(d, true);
}

int jbmt_op_start_direct(struct rdmaplus_jbmt_ctx *ctx,
			 struct rdmaplus_jbmt_op *a,
			 struct jbmt_op_times *times,
			 void (*end)(void *arg, long ret, bool again), void *arg)
{
	bool get = a->op == RDMAPLUS_JBMT_GET;
	struct jbmt_pc_ent *pc = NULL;
	struct jbmt_direct *d;
	struct jbmt_peer *p;
	unsigned int want, got;
	long ret;

	if (a->length > (get ? JBMT_SECT_BYTES : jbmt_inline_max()))
		return -EAGAIN;
	p = jbmt_peer_get(a->peer);
	if (!p)
		return -EAGAIN;
	if (READ_ONCE(p->state) != JBMT_PEER_UP || !jbmt_peer_enter(p)) {
		jbmt_peer_put(p);
		return -EAGAIN;
	}
	ret = -EAGAIN;
	/* one section, with what is free now: else a worker waits for it */
	want = jbmt_want_pages(p, a->addr, a->length);
	if (want != jbmt_span(a->addr, a->length))
		goto out;
	d = kzalloc(sizeof(*d), GFP_KERNEL_ACCOUNT);
	if (!d)
		goto out;
	if (!jbmt_credit_take(p))
		goto out_free;
	pc = jbmt_isect_cached(ctx, NULL, a, a->addr, want);
	got = pc ? want : jbmt_budget_take(ctx, want);
	if (got != want) {
		if (got)
			jbmt_budget_give(ctx, got);
		jbmt_credit_give(p);
		goto out_free;
	}
	refcount_set(&d->ref, 2);
	d->ctx = ctx;
	d->a = a;
	d->times = times;
	d->deadline = jiffies + msecs_to_jiffies(a->timeout_ms ?
			a->timeout_ms : RDMAPLUS_JBMT_OP_MAX_MS);
	d->end = end;
	d->arg = arg;
	INIT_DELAYED_WORK(&d->watch, jbmt_direct_watch);
	d->s.direct = d;
	a->done = 0;
	if (times)
		times->start = ktime_get_ns();
	queue_delayed_work(jbmt_xfer_wq, &d->watch, JBMT_WAIT_SLICE);
	ret = jbmt_isect_start(p, &d->s, NULL, ctx, NULL, a, 0, a->length,
			       got, pc);
	if (ret < 0) {
		/* nothing in flight: s released, credit and budget back */
		cancel_delayed_work_sync(&d->watch);
		goto out_free;
	}
	WRITE_ONCE(d->posted, true);
	jbmt_direct_put(d);	/* the section holds p until it ends */
	return 0;

out_free:
	kfree(d);
out:
	jbmt_peer_leave(p);
	jbmt_peer_put(p);
	return -EAGAIN;
}

long rdmaplus_jbmt_op(struct rdmaplus_jbmt_ctx *ctx, void __user *arg)
{
	struct rdmaplus_jbmt_op a;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	ret = jbmt_op_check(&a);
	if (ret)
		return ret;
	ret = jbmt_op_exec(ctx, NULL, &a, NULL);
	if (rdmaplus_copy_out(arg, &a, sizeof(a)) && !ret)
		ret = -EFAULT;
	return ret;
}

/* ---- sections we serve -------------------------------------------------- */

struct jbmt_tsect {
	struct jbmt_peer *p;
	struct jbmt_region *r;
	unsigned int served;	/* pages of the serving budget */
	u32 xid, tsid;
	struct jbmt_pages mem;	/* a put's sink (granted, awaiting FIN), a
				 * get's source */
	struct delayed_work lease;
};

static void jbmt_tsect_free(struct jbmt_tsect *t, bool invalidated)
{
	t->mem.mr_invalidated = invalidated;
	jbmt_pages_release(t->p, &t->mem);
	if (t->served)
		jbmt_serve_give(t->served);
	if (t->r)
		jbmt_region_put(t->r);
	kfree(t);
}

/* a get's writes and DONE have completed (or flushed) */
static void jbmt_source_sent(struct jbmt_tx *tx, struct ib_wc *wc)
{
	struct jbmt_tsect *t = tx->arg;
	struct jbmt_peer *p = t->p;

	jbmt_tsect_free(t, false);
	jbmt_peer_leave(p);
}

static void jbmt_lease_expired(struct work_struct *w)
{
	struct jbmt_tsect *t = container_of(to_delayed_work(w),
					    struct jbmt_tsect, lease);
	struct jbmt_peer *p = t->p;

	if (!jbmt_peer_enter(p))
		return;		/* the dying connection takes it back */
	if (xa_erase(&p->grants, t->tsid) == t) {
		atomic64_inc(&jbmt_xfer_st.leases_expired);
		jbmt_tsect_free(t, false);
	}
	jbmt_peer_leave(p);
}

void jbmt_xfer_release_grants(struct jbmt_peer *p)
{
	struct jbmt_tsect *t;
	unsigned long i;

	xa_for_each(&p->grants, i, t) {
		if (xa_erase(&p->grants, i) != t)
			continue;
		cancel_delayed_work_sync(&t->lease);
		jbmt_tsect_free(t, false);
	}
}

/*
 * Check a request against the region its token names, hold the region
 * and pin the section's pages: a JBMT_* status.
 */
/* not on the wire: serve it from a work item, where faults may block */
#define JBMT_DEFER	0xff

static u8 jbmt_tsect_pin(struct jbmt_tsect *t, const struct jbmt_msg *m,
			 u32 right, bool nofault)
{
	u64 off = be64_to_cpu(m->off), addr;
	u32 len = be32_to_cpu(m->len);
	struct jbmt_region *r;
	bool cache = false;
	unsigned int n;
	int ret;

	if (!len || len > JBMT_SECT_BYTES)
		return JBMT_INVAL;
	r = jbmt_region_get(be32_to_cpu(m->token_id), be32_to_cpu(m->token_gen),
			    be64_to_cpu(m->token_key));
	if (!r)
		return jbmt_token_issued(be32_to_cpu(m->token_id),
					 be32_to_cpu(m->token_gen),
					 be64_to_cpu(m->token_key)) ?
		       JBMT_STALE : JBMT_NOENT;
	t->r = r;
	if (!(r->rights & right))
		return JBMT_PERM;
	if (off > r->length || len > r->length - off)
		return JBMT_RANGE;
	addr = r->addr + off;
	n = jbmt_span(addr, len);
	if (n > JBMT_SECT_SPAN)
		return JBMT_INVAL;
	t->mem.pc = jbmt_pc_get(r->mm, JBMT_SIDE_SERVE, NULL, addr, n,
				t->mem.sink);
	if (!t->mem.pc) {
		/* served again: the work caches it; else pinned for once */
		cache = jbmt_pc_enabled() &&
			jbmt_pc_seen(r->mm, addr, n, t->mem.sink);
		if (nofault && cache)
			return JBMT_DEFER;
		if (!jbmt_serve_take(n))
			return JBMT_NOPIN;
		t->served = n;
	}
	ret = jbmt_pages_pin(&t->mem, r->mm, JBMT_SIDE_SERVE, r, NULL, addr,
			     len, nofault, cache, &t->served);
	if (ret)
		return ret == -EAGAIN ? JBMT_DEFER : ret == -EFAULT ?
		       JBMT_FAULT : JBMT_NOMEM;
	if (!t->mem.pc)
		jbmt_pc_note(r->mm, addr, n, t->mem.sink);
	return JBMT_OK;
}

/* a small GET: answer DONE with the section's data after it */
static u8 jbmt_serve_get_inline(struct jbmt_peer *p, const struct jbmt_msg *m,
				bool nofault)
{
	u32 len = be32_to_cpu(m->len);
	struct jbmt_tsect *t;
	struct jbmt_tx *tx;
	u8 st;

	if (!len || len > JBMT_INLINE_MAX)
		return JBMT_INVAL;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	tx = jbmt_tx_alloc_data(p, len, GFP_KERNEL);
	if (!t || !tx) {
		kfree(t);
		kfree(tx);
		return JBMT_NOMEM;
	}
	t->p = p;
	st = jbmt_tsect_pin(t, m, RDMAPLUS_JBMT_READ, nofault);
	if (st)
		goto out;
	st = JBMT_FAULT;
	if (sg_copy_to_buffer(t->mem.sgt.sgl, t->mem.sgt.orig_nents, tx->data,
			      len) != len)
		goto out;
	/* copied: the pages go back before the answer leaves */
	jbmt_tsect_free(t, false);
	t = NULL;
	tx->msg.type = JBMT_MSG_DONE;
	tx->msg.status = JBMT_OK;
	tx->msg.flags = cpu_to_be16(JBMT_F_INLINE);
	tx->msg.xid = m->xid;
	tx->msg.len = cpu_to_be32(len);
	tx->msg.budget = cpu_to_be32(jbmt_pin_budget());
	st = JBMT_NOMEM;
	if (jbmt_tx_prepare(tx, 0) || jbmt_post_send(p->cm->qp, &tx->wr))
		goto out;
	return JBMT_OK;

out:
	jbmt_tx_free(tx);
	if (t)
		jbmt_tsect_free(t, false);
	return st;
}

/* GET: write the section to the initiator's sink, then DONE. */
static u8 jbmt_serve_get(struct jbmt_peer *p, const struct jbmt_msg *m,
			 bool nofault)
{
	u32 rkey = be32_to_cpu(m->rkey);
	struct jbmt_tsect *t;
	struct jbmt_tx *tx;
	u8 st;
	int ret;

	if (be16_to_cpu(m->flags) & JBMT_F_INLINE)
		return jbmt_serve_get_inline(p, m, nofault);
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	tx = jbmt_tx_alloc(p, GFP_KERNEL);
	if (!t || !tx) {
		kfree(t);
		kfree(tx);
		return JBMT_NOMEM;
	}
	t->p = p;
	st = jbmt_tsect_pin(t, m, RDMAPLUS_JBMT_READ, nofault);
	if (st)
		goto err;
	st = JBMT_NOMEM;
	tx->msg.type = JBMT_MSG_DONE;
	tx->msg.xid = m->xid;
	tx->msg.budget = cpu_to_be32(jbmt_pin_budget());
	tx->done = jbmt_source_sent;
	tx->arg = t;
	if (jbmt_tx_prepare(tx, rkey))
		goto err;
	ret = rdma_rw_ctx_init(&t->mem.rw, p->cm->qp, p->cm->port_num, t->mem.sgt.sgl,
			       t->mem.sgt.orig_nents, 0, be64_to_cpu(m->iova), rkey,
			       DMA_TO_DEVICE);
	if (ret <= 0)
		goto err;
	t->mem.rw_ready = true;
	if (!jbmt_peer_enter(p))	/* the section's own, till sent */
		goto err;
	if (rdma_rw_ctx_post(&t->mem.rw, p->cm->qp, p->cm->port_num, NULL,
			     &tx->wr)) {
		jbmt_peer_leave(p);
		goto err;
	}
	return JBMT_OK;

err:
	jbmt_tx_free(tx);
	jbmt_tsect_free(t, false);
	return st;
}

/*
 * A small PUT: copy the data after the request into the region's pages
 * (jbmt_serve() checked their length), then DONE. A completion handler
 * writes only anonymous pages, whose dirtying takes no lock.
 */
static u8 jbmt_serve_put_inline(struct jbmt_peer *p, struct jbmt_rx *rx,
				bool nofault)
{
	const struct jbmt_msg *m = &rx->msg;
	u32 len = be32_to_cpu(m->len);
	struct jbmt_tsect *t;
	u8 st;

	if (!len || len > JBMT_INLINE_MAX || len != rx->data_len)
		return JBMT_INVAL;
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return JBMT_NOMEM;
	t->p = p;
	t->mem.sink = true;
	st = jbmt_tsect_pin(t, m, RDMAPLUS_JBMT_WRITE, nofault);
	if (!st && nofault && !jbmt_pages_anon(&t->mem))
		st = JBMT_DEFER;
	if (!st && sg_copy_from_buffer(t->mem.sgt.sgl, t->mem.sgt.orig_nents,
				       rx->data, len) != len)
		st = JBMT_FAULT;
	if (st)
		t->mem.sink = false;	/* nothing written: nothing to dirty */
	jbmt_tsect_free(t, false);
	if (st)
		return st;
	{
		struct jbmt_msg done = {
			.type = JBMT_MSG_DONE,
			.status = JBMT_OK,
			.xid = m->xid,
			.budget = cpu_to_be32(jbmt_pin_budget()),
		};

		/* landed: a lost answer fails the connection, not the data */
		jbmt_send(p, &done, 0);
	}
	return JBMT_OK;
}

/* PUT: register a sink for the section and grant it. */
static u8 jbmt_serve_put(struct jbmt_peer *p, struct jbmt_rx *rx,
			 bool nofault)
{
	const struct jbmt_msg *m = &rx->msg;
	struct ib_reg_wr reg;
	struct jbmt_tsect *t;
	struct jbmt_tx *tx;
	u8 st;

	if (be16_to_cpu(m->flags) & JBMT_F_INLINE)
		return jbmt_serve_put_inline(p, rx, nofault);
	t = kzalloc(sizeof(*t), GFP_KERNEL);
	tx = jbmt_tx_alloc(p, GFP_KERNEL);
	if (!t || !tx) {
		kfree(t);
		kfree(tx);
		return JBMT_NOMEM;
	}
	t->p = p;
	t->mem.sink = true;
	INIT_DELAYED_WORK(&t->lease, jbmt_lease_expired);
	st = jbmt_tsect_pin(t, m, RDMAPLUS_JBMT_WRITE, nofault);
	if (st)
		goto err;
	st = JBMT_NOMEM;
	t->mem.nents = ib_dma_map_sg(p->pd->device, t->mem.sgt.sgl, t->mem.sgt.orig_nents,
				 DMA_FROM_DEVICE);
	if (!t->mem.nents)
		goto err;
	t->mem.mr = ib_mr_pool_get(p->cm->qp, &p->mrs);
	if (!t->mem.mr) {
		/*
		 * Every sink is granted: the FINs that give them back wait
		 * for their work item while the peer, its sections ended,
		 * asks for more. Ask again later, as for the budget.
		 */
		st = JBMT_NOPIN;
		goto err;
	}
	if (jbmt_mr_map(t->mem.mr, &t->mem.sgt, t->mem.nents, &reg))
		goto err;
	if (xa_alloc_cyclic(&p->grants, &t->tsid, t, xa_limit_32b,
			    &p->next_grant, GFP_KERNEL) < 0)
		goto err;
	tx->msg.type = JBMT_MSG_GRANT;
	tx->msg.xid = m->xid;
	tx->msg.budget = cpu_to_be32(jbmt_pin_budget());
	tx->msg.tsid = cpu_to_be32(t->tsid);
	tx->msg.rkey = cpu_to_be32(t->mem.mr->rkey);
	tx->msg.iova = cpu_to_be64(t->mem.mr->iova);
	if (jbmt_tx_prepare(tx, 0))
		goto err_grant;
	queue_delayed_work(jbmt_xfer_wq, &t->lease,
			   msecs_to_jiffies(JBMT_LEASE_MS));
	if (jbmt_post_reg_then(p, &reg, tx)) {
		jbmt_tx_free(tx);
		if (xa_erase(&p->grants, t->tsid) == t) {
			cancel_delayed_work_sync(&t->lease);
			jbmt_tsect_free(t, false);
		}
		return JBMT_NOMEM;
	}
	return JBMT_OK;

err_grant:
	xa_erase(&p->grants, t->tsid);
err:
	jbmt_tx_free(tx);
	jbmt_tsect_free(t, false);
	return st;
}

/* FIN: the initiator has written the granted sink (or gave up). */
static void jbmt_serve_fin(struct jbmt_peer *p, struct jbmt_rx *rx)
{
	struct jbmt_tsect *t = xa_erase(&p->grants, be32_to_cpu(rx->msg.tsid));

	if (!t)
		return;		/* the lease took it back */
	cancel_delayed_work_sync(&t->lease);
	jbmt_tsect_free(t, rx->inv_rkey && rx->inv_rkey == t->mem.mr->rkey);
}

/* A peer's section refused with status st: counted, and by why. */
static void jbmt_count_refusal(u8 st)
{
	static atomic64_t *const why[JBMT_NSTATUS] = {
		[JBMT_NOENT] = &jbmt_xfer_st.refused_noent,
		[JBMT_STALE] = &jbmt_xfer_st.refused_stale,
		[JBMT_PERM] = &jbmt_xfer_st.refused_perm,
		[JBMT_RANGE] = &jbmt_xfer_st.refused_range,
		[JBMT_FAULT] = &jbmt_xfer_st.refused_fault,
		[JBMT_NOMEM] = &jbmt_xfer_st.refused_nomem,
		[JBMT_INVAL] = &jbmt_xfer_st.refused_inval,
	};

	atomic64_inc(&jbmt_xfer_st.sections_refused);
	if (st < JBMT_NSTATUS && why[st])
		atomic64_inc(why[st]);
}

/*
 * Serve a request; with nofault (in the completion handler) only if its
 * pages are resident and nothing else would block: false when it must go
 * to a work item instead.
 */
static bool jbmt_serve(struct jbmt_peer *p, struct jbmt_rx *rx, bool nofault)
{
	const struct jbmt_msg *m = &rx->msg;
	u16 flags = be16_to_cpu(m->flags);
	u8 st;

	/* data only after a small put's request, as long as it says */
	if (flags & ~JBMT_F_INLINE ||
	    rx->data_len != (m->type == JBMT_MSG_PUT && flags & JBMT_F_INLINE ?
			     be32_to_cpu(m->len) : 0)) {
		pr_warn_ratelimited("JBMT: %pI4: a request (type %u, flags %#x) with %u bytes of data\n",
				    &p->addr, m->type, flags, rx->data_len);
		jbmt_peer_down(p, -EPROTO);
		return true;
	}
	switch (m->type) {
	case JBMT_MSG_GET:
	case JBMT_MSG_PUT:
		st = m->type == JBMT_MSG_GET ? jbmt_serve_get(p, m, nofault) :
		     jbmt_serve_put(p, rx, nofault);
		if (st == JBMT_DEFER)
			return false;
		if (st == JBMT_OK) {
			atomic64_inc(&jbmt_xfer_st.sections_served);
			if (nofault)
				atomic64_inc(&jbmt_xfer_st.sections_inline);
			break;
		}
		if (st == JBMT_NOPIN)
			atomic64_inc(&jbmt_xfer_st.nacks_sent);
		else
			jbmt_count_refusal(st);
		{
			struct jbmt_msg done = {
				.type = JBMT_MSG_DONE,
				.status = st,
				.xid = m->xid,
				.budget = cpu_to_be32(jbmt_pin_budget()),
			};

			/* a get's sink is revoked with the answer */
			jbmt_send(p, &done, m->type == JBMT_MSG_GET &&
				  !(flags & JBMT_F_INLINE) ?
				  be32_to_cpu(m->rkey) : 0);
		}
		break;
	case JBMT_MSG_FIN:
		if (nofault)
			return false;	/* unpinning dirty pages may block */
		jbmt_serve_fin(p, rx);
		break;
	default:
		pr_warn_ratelimited("JBMT: %pI4: message type %u\n", &p->addr,
				    m->type);
		break;
	}
	return true;
}

bool jbmt_xfer_serve_inline(struct jbmt_peer *p, struct jbmt_rx *rx)
{
	if (jbmt_serve(p, rx, true))
		return true;
	if (rx->msg.type != JBMT_MSG_FIN)
		atomic64_inc(&jbmt_xfer_st.sections_deferred);
	return false;
}

void jbmt_xfer_request(struct work_struct *w)
{
	struct jbmt_rx *rx = container_of(w, struct jbmt_rx, work);
	struct jbmt_peer *p = rx->p;

	jbmt_serve(p, rx, false);
	jbmt_rx_repost(rx);
	jbmt_peer_leave(p);
}

/* ---- sysfs and load ----------------------------------------------------- */

#define JBMT_XFER_ATTR(name) \
	RDMAPLUS_COUNTER(jbmt_xfer_attr_##name, name, &jbmt_xfer_st.name)

JBMT_XFER_ATTR(gets);
JBMT_XFER_ATTR(puts);
JBMT_XFER_ATTR(get_bytes);
JBMT_XFER_ATTR(put_bytes);
JBMT_XFER_ATTR(op_errors);
JBMT_XFER_ATTR(sections);
JBMT_XFER_ATTR(sections_served);
JBMT_XFER_ATTR(sections_refused);
JBMT_XFER_ATTR(refused_noent);
JBMT_XFER_ATTR(refused_stale);
JBMT_XFER_ATTR(refused_perm);
JBMT_XFER_ATTR(refused_range);
JBMT_XFER_ATTR(refused_fault);
JBMT_XFER_ATTR(refused_nomem);
JBMT_XFER_ATTR(refused_inval);
JBMT_XFER_ATTR(leases_expired);
JBMT_XFER_ATTR(nacks_sent);
JBMT_XFER_ATTR(nacks_received);
JBMT_XFER_ATTR(budget_waits);
JBMT_XFER_ATTR(sections_inline);
JBMT_XFER_ATTR(sections_deferred);
JBMT_XFER_ATTR(small_sections);

static struct attribute *jbmt_xfer_attrs[] = {
	&jbmt_xfer_attr_gets.kattr.attr,
	&jbmt_xfer_attr_puts.kattr.attr,
	&jbmt_xfer_attr_get_bytes.kattr.attr,
	&jbmt_xfer_attr_put_bytes.kattr.attr,
	&jbmt_xfer_attr_op_errors.kattr.attr,
	&jbmt_xfer_attr_sections.kattr.attr,
	&jbmt_xfer_attr_sections_served.kattr.attr,
	&jbmt_xfer_attr_sections_refused.kattr.attr,
	&jbmt_xfer_attr_refused_noent.kattr.attr,
	&jbmt_xfer_attr_refused_stale.kattr.attr,
	&jbmt_xfer_attr_refused_perm.kattr.attr,
	&jbmt_xfer_attr_refused_range.kattr.attr,
	&jbmt_xfer_attr_refused_fault.kattr.attr,
	&jbmt_xfer_attr_refused_nomem.kattr.attr,
	&jbmt_xfer_attr_refused_inval.kattr.attr,
	&jbmt_xfer_attr_leases_expired.kattr.attr,
	&jbmt_xfer_attr_nacks_sent.kattr.attr,
	&jbmt_xfer_attr_nacks_received.kattr.attr,
	&jbmt_xfer_attr_budget_waits.kattr.attr,
	&jbmt_xfer_attr_sections_inline.kattr.attr,
	&jbmt_xfer_attr_sections_deferred.kattr.attr,
	&jbmt_xfer_attr_small_sections.kattr.attr,
	NULL,
};

/* merged into registration's /sys/kernel/rdmaplus/jbmt */
static const struct attribute_group jbmt_xfer_group = {
	.name = "jbmt",
	.attrs = jbmt_xfer_attrs,
};

int jbmt_xfer_init(void)
{
	int ret;

	jbmt_xfer_wq = alloc_workqueue("rdmaplus_jbmt_xfer", WQ_UNBOUND, 0);
	if (!jbmt_xfer_wq)
		return -ENOMEM;
	ret = sysfs_merge_group(rdmaplus_kobj(), &jbmt_xfer_group);
	if (ret)
		destroy_workqueue(jbmt_xfer_wq);
	return ret;
}

/* Every connection is gone: no work is left to queue. */
void jbmt_xfer_exit(void)
{
	destroy_workqueue(jbmt_xfer_wq);
	sysfs_unmerge_group(rdmaplus_kobj(), &jbmt_xfer_group);
}
