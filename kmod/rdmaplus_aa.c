// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus Active Access: an emulated IOMMU for rxe (docs/activeaccess.md).
 *
 * A process creates domains (the paper's IUIDs), each with an access log
 * (a ring mapped into the process), and arms 4 KiB pages of its own rxe
 * memory regions with control bits W, R, WL, WLD, RL, RLD. Five hooks
 * (ftrace callbacks, see struct aa_hook), registered only while some page
 * is armed, enforce them:
 *
 *  - rxe_mr_copy(mr, iova, addr, length, dir): every packet of an incoming
 *    RDMA WRITE (dir 0) and of an RDMA READ response (dir 1). Calls that
 *    come from copy_data() are local transfers (SGEs of the process's own
 *    work requests, incoming SENDs) and are left alone.
 *  - iova_to_vaddr(mr, iova, length): incoming atomics.
 *  - rxe_responder(qp): remembers which QP this context is serving, so
 *    that an entry can name the source.
 *  - rxe_resp_queue_pkt(qp, skb): every request packet, before the
 *    responder sees it. Only RVMA uses it: it translates writes to
 *    mailbox keys (rdmaplus_rvma_request()).
 *  - rxe_dereg_mr(ibmr, udata): forget a region being deregistered. It
 *    runs after ib_core removed the region from its resource table and
 *    waited for every reference taken there, so an arm that found the
 *    region has finished (and is forgotten here) and no later arm finds it.
 *
 * Hooks run in softirq context or inline from a poster's system call, with
 * preemption disabled: no sleeping, irqsave locks, RCU for lookups.
 *
 * The hooks are shared with the counted mailboxes (rdmaplus_rvma.c): they
 * stay registered while some page is armed or some mailbox range is gated
 * (rdmaplus_hook_get/put count RVMA's users). A write packet into a gated
 * RVMA range is RVMA's alone: rdmaplus_rvma_write() places (or refuses) it
 * before Active Access looks, and AA never sees it (no entry, W/WL bits not
 * applied). Reads are never RVMA's.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/eventfd.h>
#include <linux/fdtable.h>
#include <linux/ftrace.h>
#include <linux/file.h>
#include <linux/hashtable.h>
#include <linux/hrtimer.h>
#include <linux/idr.h>
#include <linux/kobject.h>
#include <linux/kprobes.h>
#include <linux/log2.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/sched/user.h>
#include <linux/slab.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <asm/linkage.h>
#include <rdma/ib_verbs.h>
#include <rdma/restrack.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"

#define AA_PAGE_SHIFT	12
#define AA_HDR		sizeof(struct rdmaplus_aa_entry)
#define AA_MAX_SEGS	2	/* a packet (<= 4096 bytes) spans <= 2 pages */
#define AA_WAYS		4	/* responder records per hash bucket */

/* Per-page policy word: domain id in the low 16 bits, control bits above. */
#define AA_POL_DOMAIN(p)	((p) & 0xffff)
#define AA_POL_BITS(p)		(((p) >> 16) & RDMAPLUS_AA_BITS)
#define AA_POL(d, b)		((u32)(d) | ((u32)(b) << 16))

/* Mirror of drivers/infiniband/core/restrack.h (checked at run time). */
struct aa_restrack_root {
	struct xarray xa;
	u32 next_id;
};

struct rdmaplus_aa_ctx {
	struct list_head domains;	/* under aa_mutex */
	unsigned int ndomains;		/* under aa_mutex */
	struct user_struct *user;	/* charged for the logs' pages */
	struct list_head mrs;		/* under aa_lock */
	wait_queue_head_t wq;
};

struct aa_domain {
	u32 id;
	struct rdmaplus_aa_ctx *ctx;
	struct list_head node;		/* ctx->domains */
	spinlock_t lock;		/* producers, notification state */
	struct rdmaplus_aa_ring *ring;	/* vmalloc_user: ring page + area */
	u8 *area;
	u64 size;
	unsigned long charged;		/* pages counted in ctx->user's locked_vm */
	u64 head;			/* kernel's own copy, never trusted */
	u64 seq;
	u64 unsignalled;
	struct eventfd_ctx *evt;
	u32 threshold;
	u32 flags;			/* RDMAPLUS_AA_NOTIFY_F_* */
	ktime_t interval;		/* 0: no timer */
	ktime_t signalled;		/* time of the last notification */
	struct hrtimer timer;		/* one-shot, armed by aa_commit */
	bool timer_on;			/* aa_commit may arm it */
	struct rcu_head rcu;
};

struct aa_mr {
	struct hlist_node hnode;	/* aa_mrs, keyed by rxe_mr */
	struct list_head node;		/* ctx->mrs */
	void *rxe_mr;
	struct ib_mr *ibmr;
	struct rdmaplus_aa_ctx *ctx;
	u32 lkey, rkey;
	u64 first_page;			/* iova >> 12 of pages[0] */
	u64 npages;
	u64 narmed;
	u32 *pages;
	bool dead;
	struct rcu_head rcu;
};

static unsigned int max_domains_per_file = 256;
module_param(max_domains_per_file, uint, 0644);
MODULE_PARM_DESC(max_domains_per_file,
		 "domains one open /dev/rdmaplus may hold (EMFILE beyond; the host has 1024)");

static DEFINE_MUTEX(aa_mutex);		/* configuration, hook (un)registration */
static DEFINE_SPINLOCK(aa_lock);	/* aa_mrs, ctx->mrs */
static DEFINE_HASHTABLE(aa_mrs, 8);
static struct aa_domain __rcu *aa_domains[RDMAPLUS_AA_MAX_DOMAINS + 1];
static DEFINE_IDA(aa_ida);
static unsigned long aa_nr_mrs;		/* under aa_lock */
static bool aa_hooked;			/* under aa_mutex */
static unsigned int aa_rvma_users;	/* under aa_mutex: RVMA's references */
static struct module *aa_rxe_owner;	/* referenced while hooked */
static struct work_struct aa_gc_work;

/* rxe devices, from our ib_client */
#define AA_MAX_DEVS 16
static DEFINE_SPINLOCK(aa_dev_lock);
static struct ib_device *aa_devs[AA_MAX_DEVS];

/* rxe functions resolved at load */
static unsigned long aa_copy_data_start, aa_copy_data_size;
int (*aa_rxe_mr_copy)(void *mr, u64 iova, void *addr, int length, int dir);
static void *(*aa_iova_to_vaddr)(void *mr, u64 iova, int length);
static long aa_ibmr_off = -1;		/* offsetof(struct rxe_mr, ibmr) */
static bool aa_ok;

static struct {
	atomic64_t entries, bytes, data_bytes, writes, reads, atomics;
	atomic64_t hidden_writes, zeroed_reads, refused_writes;
	atomic64_t refused_atomics, lost_reads, missed, pages;
} aa_st;

/*
 * A body that only returns: a hook that sets regs->ax and points
 * regs->ip here makes the hooked function return regs->ax at once.
 */
asm(".pushsection .text, \"ax\"\n"
	".type rdmaplus_aa_skip, @function\n"
	"rdmaplus_aa_skip:\n\t"
	ASM_RET
	".size rdmaplus_aa_skip, .-rdmaplus_aa_skip\n"
	".popsection\n");

/* ---- log ------------------------------------------------------------- */

static u32 aa_entry_len(u32 data_len)
{
	return AA_HDR + ALIGN(data_len, RDMAPLUS_AA_ENTRY_ALIGN);
}

/*
 * Bytes the producer needs to append entries of the given lengths from
 * head, counting padding at the end of the area; 0 if they do not fit in
 * what the consumer left free. Caller holds d->lock.
 */
static bool aa_fits(struct aa_domain *d, const u32 *lens, int n)
{
	/* pairs with the consumer's release of tail: its reads are done */
	u64 tail = smp_load_acquire(&d->ring->tail);
	u64 head = d->head;
	u64 used = head - tail;
	int i;

	if (used > d->size)	/* the process wrote nonsense: refuse all */
		return false;
	for (i = 0; i < n; i++) {
		u64 room = d->size - (head & (d->size - 1));

		if (!lens[i])
			continue;
		if (room < lens[i])
			head += room;
		head += lens[i];
	}
	return head - tail <= d->size;
}

/* Reserve len bytes at head (padding first if needed); d->lock held. */
static struct rdmaplus_aa_entry *aa_reserve(struct aa_domain *d, u32 len)
{
	u64 off = d->head & (d->size - 1);
	struct rdmaplus_aa_entry *e;

	if (d->size - off < len) {
		e = (struct rdmaplus_aa_entry *)(d->area + off);
		memset(e, 0, AA_HDR);
		e->len = d->size - off;
		e->op = RDMAPLUS_AA_OP_PAD;
		e->domain = d->id;
		d->head += d->size - off;
		off = 0;
	}
	e = (struct rdmaplus_aa_entry *)(d->area + off);
	memset(e, 0, AA_HDR);
	e->len = len;
	d->head += len;
	return e;
}

static void aa_signal(struct aa_domain *d)
{
	d->unsignalled = 0;
	if (d->flags & RDMAPLUS_AA_NOTIFY_F_ADAPTIVE)
		d->signalled = ktime_get();
	if (d->evt)
		eventfd_signal(d->evt, 1);
	wake_up_interruptible(&d->ctx->wq);
}

/*
 * Notify now, or make sure the timer will: the threshold, then (adaptive)
 * an entry after a quiet interval, then the interval after the first
 * pending entry (adaptive: after the last notification). d->lock held.
 */
static void aa_moderate(struct aa_domain *d)
{
	ktime_t now, due;

	if (d->threshold && d->unsignalled >= d->threshold) {
		aa_signal(d);
		return;
	}
	if (!d->timer_on) {
		if (!d->threshold)
			wake_up_interruptible(&d->ctx->wq);
		return;
	}
	if (hrtimer_is_queued(&d->timer))
		return;
	now = ktime_get();
	due = ktime_add(now, d->interval);
	if (d->flags & RDMAPLUS_AA_NOTIFY_F_ADAPTIVE) {
		due = ktime_add(d->signalled, d->interval);
		if (ktime_compare(now, due) >= 0) {
			aa_signal(d);
			return;
		}
	}
	hrtimer_start(&d->timer, due, HRTIMER_MODE_ABS_SOFT);
}

/* Publish entries written since the last commit; d->lock held. */
static void aa_commit(struct aa_domain *d, u32 n)
{
	/* entries before head_seq and head: pair with the consumer's
	 * acquire loads of head_seq and head
	 */
	smp_store_release(&d->ring->head_seq, d->seq);
	/* and head_seq before head */
	smp_store_release(&d->ring->head, d->head);
	d->unsignalled += n;
	aa_moderate(d);
}

static enum hrtimer_restart aa_timer_fn(struct hrtimer *t)
{
	struct aa_domain *d = container_of(t, struct aa_domain, timer);
	unsigned long flags;

	spin_lock_irqsave(&d->lock, flags);
	if (d->unsignalled)
		aa_signal(d);
	spin_unlock_irqrestore(&d->lock, flags);
	return HRTIMER_NORESTART;
}

/* ---- source identity ---------------------------------------------------
 *
 * rxe_mr_copy and iova_to_vaddr do not see the QP. A hook on
 * rxe_responder(qp) records which QP this context is serving; within one
 * responder call nothing else runs a responder in the same context before
 * the packet's data is copied, so the copy hook can read the record back.
 * Softirq context has one record per CPU; process context (loopback runs
 * the responder inline from the poster's system call, preemptibly) keeps
 * one per task in a small hash, so a preempted or migrated task finds its
 * own record or none. A record that does not look like a live rxe_qp is
 * ignored: the entry then says 0 (unknown).
 */
struct aa_cur {
	raw_spinlock_t lock;
	void *task[AA_WAYS];
	void *qp[AA_WAYS];
	unsigned int next;
};

static DEFINE_PER_CPU(struct aa_cur, aa_cur_soft);
#define AA_TASK_BITS 8
static struct aa_cur aa_cur_task[1 << AA_TASK_BITS];

/* Softirq: this CPU's record. Process context: the task's bucket, in
 * which each of AA_WAYS tasks keeps its own slot.
 */
static struct aa_cur *aa_cur_slot(void)
{
	if (in_serving_softirq())
		return this_cpu_ptr(&aa_cur_soft);
	return &aa_cur_task[hash_ptr(current, AA_TASK_BITS)];
}

static void notrace aa_resp_pre(struct pt_regs *regs)
{
	struct aa_cur *c = aa_cur_slot();
	unsigned long flags;
	int i;

	raw_spin_lock_irqsave(&c->lock, flags);
	for (i = 0; i < AA_WAYS; i++)
		if (c->task[i] == current)
			break;
	if (i == AA_WAYS) {
		i = c->next;
		c->next = (c->next + 1) % AA_WAYS;
	}
	c->task[i] = current;
	c->qp[i] = (void *)regs->di;
	raw_spin_unlock_irqrestore(&c->lock, flags);
}

/* struct rxe_qp starts with struct ib_qp, then struct rxe_pool_elem
 * {pool; obj; ...} whose obj points at the rxe_qp, then struct ib_qp_attr.
 */
#define AA_QP_ELEM_OFF	ALIGN(sizeof(struct ib_qp), 8)

static void aa_source(u32 *qpn, u32 *src_qpn)
{
	struct aa_cur *c = aa_cur_slot();
	struct ib_qp_attr *attr;
	unsigned long flags;
	void *qp = NULL;
	int i;

	raw_spin_lock_irqsave(&c->lock, flags);
	for (i = 0; i < AA_WAYS; i++)
		if (c->task[i] == current)
			qp = c->qp[i];
	raw_spin_unlock_irqrestore(&c->lock, flags);
	if (!qp || aa_ibmr_off < 0 ||
	    ((void **)((u8 *)qp + AA_QP_ELEM_OFF))[1] != qp)
		return;
	*qpn = ((struct ib_qp *)qp)->qp_num;
	attr = (struct ib_qp_attr *)((u8 *)qp + AA_QP_ELEM_OFF + aa_ibmr_off);
	if (attr->qp_state <= IB_QPS_ERR && attr->dest_qp_num < (1U << 24))
		*src_qpn = attr->dest_qp_num;
}

/* ---- hooks ----------------------------------------------------------- */

struct aa_seg {
	u64 iova;
	u32 off;		/* offset in the packet */
	u32 len;
	u32 bits;
	struct aa_domain *d;
	u32 elen;		/* log entry length, 0: no entry */
};

static struct aa_mr *aa_find(void *rxe_mr)
{
	struct aa_mr *m;

	hash_for_each_possible_rcu(aa_mrs, m, hnode, (unsigned long)rxe_mr)
		if (m->rxe_mr == rxe_mr && !READ_ONCE(m->dead))
			return m;
	return NULL;
}

static u32 aa_policy(struct aa_mr *m, u64 iova)
{
	u64 idx = (iova >> AA_PAGE_SHIFT) - m->first_page;

	if (idx >= m->npages)
		return 0;
	return READ_ONCE(m->pages[idx]);
}

/* Split [iova, iova+len) into page segments; returns their count or 0. */
static int aa_segments(struct aa_mr *m, u64 iova, u32 len, struct aa_seg *s)
{
	int n = 0;
	u32 off = 0;
	bool active = false;

	while (off < len) {
		u64 a = iova + off;
		u32 take = min_t(u64, len - off,
				 RDMAPLUS_AA_PAGE_SIZE - (a & (RDMAPLUS_AA_PAGE_SIZE - 1)));
		u32 pol;

		if (n == AA_MAX_SEGS)
			return -1;
		pol = aa_policy(m, a);
		s[n].iova = a;
		s[n].off = off;
		s[n].len = take;
		s[n].bits = pol ? AA_POL_BITS(pol) : RDMAPLUS_AA_W | RDMAPLUS_AA_R;
		s[n].d = pol ? rcu_dereference(aa_domains[AA_POL_DOMAIN(pol)]) : NULL;
		s[n].elen = 0;
		if (pol && !s[n].d)	/* domain going away: page inactive */
			s[n].bits = RDMAPLUS_AA_W | RDMAPLUS_AA_R;
		if (s[n].d)
			active = true;
		off += take;
		n++;
	}
	return active ? n : 0;
}

/* Lock the distinct domains of the segments, in id order. */
static void aa_lock_domains(struct aa_seg *s, int n, unsigned long *flags)
{
	struct aa_domain *a = s[0].d, *b = n > 1 ? s[1].d : NULL;

	if (a && b && a != b && a->id > b->id)
		swap(a, b);
	if (!a) {
		a = b;
		b = NULL;
	}
	local_irq_save(*flags);
	if (a)
		spin_lock(&a->lock);
	if (b && b != a)
		spin_lock_nested(&b->lock, SINGLE_DEPTH_NESTING);
}

static void aa_unlock_domains(struct aa_seg *s, int n, unsigned long flags)
{
	struct aa_domain *a = s[0].d, *b = n > 1 ? s[1].d : NULL;

	if (a)
		spin_unlock(&a->lock);
	if (b && b != a)
		spin_unlock(&b->lock);
	local_irq_restore(flags);
}

/* Do all entries of the segments fit in their logs? Domains locked. */
static bool aa_room(struct aa_seg *s, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		u32 lens[AA_MAX_SEGS] = { 0 };
		int j;

		if (!s[i].elen)
			continue;
		for (j = 0; j < n; j++)
			if (s[j].d == s[i].d)
				lens[j] = s[j].elen;
		if (!aa_fits(s[i].d, lens, n))
			return false;
	}
	return true;
}

static void aa_log(struct aa_seg *s, struct aa_mr *m, u16 op, u16 flags,
		   const u8 *data, u64 value, const u32 *src)
{
	struct aa_domain *d = s->d;
	struct rdmaplus_aa_entry *e = aa_reserve(d, s->elen);
	u32 dlen = s->elen - AA_HDR;

	e->op = op;
	e->flags = flags;
	e->seq = ++d->seq;
	e->iova = s->iova;
	e->length = s->len;
	e->domain = d->id;
	e->key = m->rkey ? m->rkey : m->lkey;
	e->qpn = src[0];
	e->src_qpn = src[1];
	e->time_ns = ktime_get_ns();
	e->value = value;
	if (dlen && data) {
		e->flags |= RDMAPLUS_AA_F_DATA;
		e->data_len = op == RDMAPLUS_AA_OP_ATOMIC ? 8 : s->len;
		memcpy(e + 1, data, e->data_len);
		atomic64_add(e->data_len, &aa_st.data_bytes);
	}
	atomic64_inc(&aa_st.entries);
	atomic64_add(s->elen, &aa_st.bytes);
}

/* Is s[i] the first logging segment of its domain? */
static bool aa_first_of_domain(struct aa_seg *s, int i)
{
	return s[i].elen && (i == 0 || s[i].d != s[0].d || !s[0].elen);
}

/* Publish the entries of the segments, once per domain. */
static void aa_commit_segs(struct aa_seg *s, int n)
{
	bool same = n > 1 && s[1].d == s[0].d;

	if (s[0].elen)
		aa_commit(s[0].d, same && s[1].elen ? 2 : 1);
	if (n > 1 && s[1].elen && (!same || !s[0].elen))
		aa_commit(s[1].d, 1);
}

/* Make the hooked rxe_mr_copy touch only [from, to) of the packet. */
static void aa_narrow(struct pt_regs *regs, u32 from, u32 to)
{
	regs->si += from;
	regs->dx += from;
	regs->cx = to - from;
}

/*
 * aa_plan sets each segment's log entry length from its logging bits (log:
 * any bit that logs, data: the bit that logs the data too) and finds the
 * span [*from, *to) of the packet that the access bit (allow) lets reach
 * memory. It returns true when every segment allows the access.
 */
static bool aa_plan(struct aa_seg *s, int n, u32 log, u32 data, u32 allow,
		    u32 *from, u32 *to, bool *any)
{
	bool all = true;
	int i;

	*any = false;
	for (i = 0; i < n; i++) {
		if (s[i].d && (s[i].bits & log))
			s[i].elen = aa_entry_len(s[i].bits & data ? s[i].len : 0);
		if (s[i].bits & allow) {
			if (!*any)
				*from = s[i].off;
			*to = s[i].off + s[i].len;
			*any = true;
		} else {
			all = false;
		}
	}
	return all;
}

static void aa_write(struct pt_regs *regs, struct aa_mr *m, struct aa_seg *s,
		     int n)
{
	const u8 *payload = (const u8 *)regs->dx;
	u32 from = 0, to = 0, src[2] = { 0, 0 };
	bool any, all;
	unsigned long flags;
	int i;

	atomic64_inc(&aa_st.writes);
	aa_source(&src[0], &src[1]);
	all = aa_plan(s, n, RDMAPLUS_AA_WL | RDMAPLUS_AA_WLD, RDMAPLUS_AA_WLD,
		      RDMAPLUS_AA_W, &from, &to, &any);

	aa_lock_domains(s, n, &flags);
	if (!aa_room(s, n)) {
		for (i = 0; i < n; i++)
			if (aa_first_of_domain(s, i))
				s[i].d->ring->refused++;
		aa_unlock_domains(s, n, flags);
		atomic64_inc(&aa_st.refused_writes);
		regs->si = ~0ULL;	/* out of range: rxe_mr_copy -EFAULT */
		return;
	}
	for (i = 0; i < n; i++)
		if (s[i].elen)
			aa_log(&s[i], m, RDMAPLUS_AA_OP_WRITE,
			       s[i].bits & RDMAPLUS_AA_W ? 0 : RDMAPLUS_AA_F_SUPPRESSED,
			       payload + s[i].off, 0, src);
	aa_commit_segs(s, n);
	aa_unlock_domains(s, n, flags);

	if (all)
		return;
	atomic64_inc(&aa_st.hidden_writes);
	if (!any)
		regs->cx = 0;		/* nothing reaches memory, success */
	else
		aa_narrow(regs, from, to);
}

static void aa_read(struct pt_regs *regs, struct aa_mr *m, struct aa_seg *s,
		    int n)
{
	u8 *payload = (u8 *)regs->dx;
	bool want_data = false, any, all;
	u32 from = 0, to = 0, src[2] = { 0, 0 };
	unsigned long flags;
	int i;

	atomic64_inc(&aa_st.reads);
	aa_source(&src[0], &src[1]);
	all = aa_plan(s, n, RDMAPLUS_AA_RL | RDMAPLUS_AA_RLD, RDMAPLUS_AA_RLD,
		      RDMAPLUS_AA_R, &from, &to, &any);
	for (i = 0; i < n; i++)
		if (s[i].d && (s[i].bits & RDMAPLUS_AA_RLD))
			want_data = true;

	aa_lock_domains(s, n, &flags);
	if (!aa_room(s, n)) {
		/* A READ cannot be failed (read_reply ignores errors): serve
		 * zeros, count it and tell the log's owner.
		 */
		for (i = 0; i < n; i++)
			if (aa_first_of_domain(s, i))
				s[i].d->ring->lost++;
		aa_unlock_domains(s, n, flags);
		atomic64_inc(&aa_st.lost_reads);
		memset(payload, 0, regs->cx);
		regs->cx = 0;
		return;
	}

	if (want_data && any) {
		/* Fill the packet now so the log sees what the reader gets. */
		if (aa_rxe_mr_copy((void *)regs->di, regs->si, payload,
				   (int)regs->cx, 1)) {
			aa_unlock_domains(s, n, flags);
			return;	/* let rxe fail it the usual way */
		}
	}
	for (i = 0; i < n; i++)
		if (!(s[i].bits & RDMAPLUS_AA_R))
			memset(payload + s[i].off, 0, s[i].len);
	for (i = 0; i < n; i++)
		if (s[i].elen)
			aa_log(&s[i], m, RDMAPLUS_AA_OP_READ,
			       s[i].bits & RDMAPLUS_AA_R ? 0 : RDMAPLUS_AA_F_SUPPRESSED,
			       payload + s[i].off, 0, src);
	aa_commit_segs(s, n);
	aa_unlock_domains(s, n, flags);

	if (!all)
		atomic64_inc(&aa_st.zeroed_reads);
	if (want_data && any)
		regs->cx = 0;		/* already copied */
	else if (!any)
		regs->cx = 0;		/* zeros only */
	else if (!all)
		aa_narrow(regs, from, to);
}

static void notrace aa_copy_pre(struct pt_regs *regs)
{
	unsigned long ret = *(unsigned long *)regs->sp;
	int len = (int)regs->cx;
	struct aa_seg s[AA_MAX_SEGS];
	struct aa_mr *m;
	int n;

	if (len <= 0 || ret - aa_copy_data_start < aa_copy_data_size)
		return;
	rcu_read_lock();
	/* a write into a gated mailbox range is RVMA's alone */
	if (!(regs->r8 & 1) && rdmaplus_rvma_write(regs))
		goto out;
	m = aa_find((void *)regs->di);
	if (!m)
		goto out;
	n = aa_segments(m, regs->si, len, s);
	if (n < 0) {
		pr_err_ratelimited("%d-byte packet spans more than %d pages\n",
				   len, AA_MAX_SEGS);
		if (!(regs->r8 & 1))
			regs->si = ~0ULL;
		goto out;
	}
	if (!n)
		goto out;
	if (regs->r8 & 1)
		aa_read(regs, m, s, n);
	else
		aa_write(regs, m, s, n);
out:
	rcu_read_unlock();
}

static void notrace aa_queue_pre(struct pt_regs *regs)
{
	rcu_read_lock();
	rdmaplus_rvma_request((struct sk_buff *)regs->si);
	rcu_read_unlock();
}

static void notrace aa_atomic_pre(struct pt_regs *regs)
{
	u32 want = RDMAPLUS_AA_W | RDMAPLUS_AA_R;
	struct aa_seg s[AA_MAX_SEGS];
	unsigned long flags;
	struct aa_mr *m;
	u64 value = 0;
	int n, refuse = 0;

	rcu_read_lock();
	m = aa_find((void *)regs->di);
	if (!m)
		goto out;
	n = aa_segments(m, regs->si, 8, s);
	if (n <= 0)		/* n < 0 cannot happen for 8 aligned bytes */
		goto out;
	atomic64_inc(&aa_st.atomics);
	if ((s[0].bits & want) != want) {
		refuse = 1;
		goto out;
	}
	if (s[0].bits & (RDMAPLUS_AA_WL | RDMAPLUS_AA_RL | RDMAPLUS_AA_WLD |
			 RDMAPLUS_AA_RLD)) {
		bool data = s[0].bits & (RDMAPLUS_AA_WLD | RDMAPLUS_AA_RLD);

		s[0].elen = aa_entry_len(data ? 8 : 0);
		if (data) {
			u64 *va;

			va = aa_iova_to_vaddr((void *)regs->di, regs->si, 8);
			if (va)
				value = READ_ONCE(*va);
		}
		aa_lock_domains(s, 1, &flags);
		if (!aa_room(s, 1)) {
			s[0].d->ring->refused++;
			aa_unlock_domains(s, 1, flags);
			refuse = 1;
			goto out;
		}
		u32 src[2] = { 0, 0 };

		aa_source(&src[0], &src[1]);
		aa_log(&s[0], m, RDMAPLUS_AA_OP_ATOMIC, 0,
		       data ? (u8 *)&value : NULL, value, src);
		aa_commit_segs(s, 1);
		aa_unlock_domains(s, 1, flags);
	}
out:
	rcu_read_unlock();
	if (!refuse)
		return;
	/* NULL from iova_to_vaddr: the requester gets a NAK (remote invalid
	 * request); nothing is printed and memory is untouched.
	 */
	atomic64_inc(&aa_st.refused_atomics);
	regs->ax = 0;
	regs->ip = (unsigned long)rdmaplus_aa_skip;
}

static void aa_mr_free_rcu(struct rcu_head *r)
{
	struct aa_mr *m = container_of(r, struct aa_mr, rcu);

	kvfree(m->pages);
	kfree(m);
}

/* Unhash m; aa_lock held. The caller frees it with call_rcu. */
static void aa_mr_unlink(struct aa_mr *m)
{
	WRITE_ONCE(m->dead, true);
	hash_del_rcu(&m->hnode);
	list_del(&m->node);
	atomic64_sub(m->narmed, &aa_st.pages);
	aa_nr_mrs--;
}

static void notrace aa_dereg_pre(struct pt_regs *regs)
{
	struct ib_mr *ibmr = (struct ib_mr *)regs->di;
	struct aa_mr *m, *found = NULL;
	unsigned long flags;

	if (aa_ibmr_off < 0)
		return;
	rdmaplus_rvma_dereg((u8 *)ibmr - aa_ibmr_off);
	spin_lock_irqsave(&aa_lock, flags);
	hash_for_each_possible(aa_mrs, m, hnode,
			       (unsigned long)((u8 *)ibmr - aa_ibmr_off))
		if (m->ibmr == ibmr && !m->dead)
			found = m;
	if (found)
		aa_mr_unlink(found);
	spin_unlock_irqrestore(&aa_lock, flags);
	if (found) {
		call_rcu(&found->rcu, aa_mr_free_rcu);
		schedule_work(&aa_gc_work);
	}
}

/*
 * The hooks are ftrace callbacks at the entry of five functions, with the
 * caller's registers (a hook may change the arguments, or make the function
 * return at once). Not kprobes: the kprobe framework lets one probe handler
 * run per CPU and skips a hit while another is running, so an incoming
 * packet handled in a softirq that interrupts a hook running inline in a
 * poster's system call would reach memory unseen. ftrace only refuses
 * recursion within one context (task, softirq, hardirq, NMI), and a hook
 * never calls a hooked function except through the module itself, which
 * the callback recognises by the return address. The callback takes
 * ftrace's recursion lock itself (which also disables preemption), as
 * livepatch's handler does, so the ops do not ask for
 * FTRACE_OPS_FL_RECURSION: ftrace then calls it straight from the ops'
 * trampoline instead of through ftrace_ops_assist_func, which would take
 * the same lock a second time on every packet.
 */
struct aa_hook {
	void (*pre)(struct pt_regs *regs);
	unsigned long addr;
	struct ftrace_ops ops;
};

static void notrace aa_hook_cb(unsigned long ip, unsigned long parent_ip,
			       struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	struct aa_hook *h = container_of(op, struct aa_hook, ops);
	struct pt_regs *regs = ftrace_get_regs(fregs);
	int bit;

	if (within_module(parent_ip, THIS_MODULE))
		return;		/* our own call into rxe */
	bit = ftrace_test_recursion_trylock(ip, parent_ip);
	if (bit < 0) {
		atomic64_inc(&aa_st.missed);
		return;
	}
	h->pre(regs);
	ftrace_test_recursion_unlock(bit);
}

#define AA_HOOK(fn) { .pre = fn, .ops = { .func = aa_hook_cb, \
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY } }
enum {
	AA_HOOK_DEREG, AA_HOOK_RESP, AA_HOOK_COPY, AA_HOOK_ATOMIC,
	AA_HOOK_QUEUE, AA_NHOOKS
};
static struct aa_hook aa_hooks[AA_NHOOKS] = {
	[AA_HOOK_DEREG] = AA_HOOK(aa_dereg_pre),
	[AA_HOOK_RESP] = AA_HOOK(aa_resp_pre),
	[AA_HOOK_COPY] = AA_HOOK(aa_copy_pre),
	[AA_HOOK_ATOMIC] = AA_HOOK(aa_atomic_pre),
	[AA_HOOK_QUEUE] = AA_HOOK(aa_queue_pre),
};

static void aa_unregister(int n)
{
	while (n-- > 0) {
		unregister_ftrace_function(&aa_hooks[n].ops);
		ftrace_set_filter_ip(&aa_hooks[n].ops, aa_hooks[n].addr, 1, 0);
	}
}

static int aa_find_rxe(struct module *owner);

/*
 * Register the hooks and pin rdma_rxe; aa_mutex held. rdma_rxe's symbols
 * are looked up again each time: rxe may have been unloaded and loaded
 * at another address while nothing was armed.
 */
static int aa_hook(struct module *owner)
{
	int ret = 0, i;

	if (aa_hooked)
		return 0;
	if (!try_module_get(owner))
		return -ENODEV;
	ret = aa_find_rxe(owner);
	if (ret) {
		module_put(owner);
		return ret;
	}
	for (i = 0; i < AA_NHOOKS; i++) {
		struct aa_hook *h = &aa_hooks[i];

		ret = ftrace_set_filter_ip(&h->ops, h->addr, 0, 0);
		if (ret)
			break;
		ret = register_ftrace_function(&h->ops);
		if (ret) {
			ftrace_set_filter_ip(&h->ops, h->addr, 1, 0);
			break;
		}
	}
	if (ret) {
		pr_err("cannot hook %ps: %d\n", (void *)aa_hooks[i].addr, ret);
		aa_unregister(i);
		module_put(owner);
		return ret;
	}
	aa_rxe_owner = owner;
	aa_hooked = true;
	return 0;
}

/*
 * Unregister the hooks when no page is armed and RVMA holds no reference;
 * aa_mutex held.
 */
static void aa_maybe_unhook(void)
{
	unsigned long flags, n;

	spin_lock_irqsave(&aa_lock, flags);
	n = aa_nr_mrs;
	spin_unlock_irqrestore(&aa_lock, flags);
	if (!aa_hooked || n || aa_rvma_users)
		return;
	aa_unregister(AA_NHOOKS);
	aa_hooked = false;
	module_put(aa_rxe_owner);
	aa_rxe_owner = NULL;
}

/*
 * RVMA's reference on the hooks (and on owner, rdma_rxe), taken while it
 * gates some range. May sleep.
 */
int rdmaplus_hook_get(struct module *owner)
{
	int ret;

	mutex_lock(&aa_mutex);
	ret = aa_hook(owner);
	if (!ret)
		aa_rvma_users++;
	mutex_unlock(&aa_mutex);
	return ret;
}

void rdmaplus_hook_put(void)
{
	mutex_lock(&aa_mutex);
	if (!WARN_ON_ONCE(!aa_rvma_users))
		aa_rvma_users--;
	aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
}

static void aa_gc(struct work_struct *w)
{
	mutex_lock(&aa_mutex);
	aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
}

/*
 * Is cand the start of the struct rxe_mr around ibmr? It starts with
 * struct rxe_pool_elem {pool; obj; ...; u32 index;} where obj points at
 * the rxe_mr itself and index is the key's upper 24 bits. (An empty
 * list_head inside the elem also points at itself: pool must not.)
 */
static bool aa_is_rxe_mr(struct ib_mr *ibmr, u8 *cand)
{
	void **w = (void **)cand;
	u32 *idx;

	if (w[1] != cand || w[0] == cand || !w[0])
		return false;
	for (idx = (u32 *)(cand + 16); (u8 *)idx < (u8 *)ibmr; idx++)
		if (*idx == ibmr->lkey >> 8)
			return true;
	return false;
}

/* Where the ib_mr sits in rxe's struct rxe_mr, found by a probe. */
void *aa_rxe_mr_of(struct ib_mr *ibmr)
{
	long off;

	if (aa_ibmr_off < 0) {
		for (off = 24; off <= 512; off += 8) {
			if (aa_is_rxe_mr(ibmr, (u8 *)ibmr - off)) {
				aa_ibmr_off = off;
				pr_info("rxe_mr.ibmr at offset %ld\n", off);
				break;
			}
		}
		if (aa_ibmr_off < 0) {
			pr_err("cannot find struct rxe_mr around an ib_mr: rxe layout not recognised\n");
			return NULL;
		}
	}
	if (!aa_is_rxe_mr(ibmr, (u8 *)ibmr - aa_ibmr_off)) {
		pr_err_ratelimited("rxe_mr layout check failed for key %#x\n",
				   ibmr->lkey);
		return NULL;
	}
	return (u8 *)ibmr - aa_ibmr_off;
}

/* ---- devices and regions --------------------------------------------- */

static bool aa_layout_bad;

/*
 * Check rxe's struct rxe_mr layout on a memory region of our own, so that
 * an rxe the module does not know is refused when it appears (at load
 * for the devices that exist then) rather than when a page is armed.
 */
static void aa_probe_layout(struct ib_device *dev)
{
	struct ib_pd *pd;
	struct ib_mr *mr;

	pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(pd)) {
		pr_warn("%s: cannot allocate a PD to check rxe's layout: %ld\n",
			dev_name(&dev->dev), PTR_ERR(pd));
		return;
	}
	mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, 1);
	if (IS_ERR(mr)) {
		pr_warn("%s: cannot allocate an MR to check rxe's layout: %ld\n",
			dev_name(&dev->dev), PTR_ERR(mr));
		goto out_pd;
	}
	if (!aa_rxe_mr_of(mr)) {
		pr_err("%s: struct rxe_mr layout not recognised: active access disabled\n",
		       dev_name(&dev->dev));
		aa_layout_bad = true;
	}
	ib_dereg_mr(mr);
out_pd:
	ib_dealloc_pd(pd);
}

static int aa_client_add(struct ib_device *dev)
{
	unsigned long flags;
	int i;

	if (dev->ops.driver_id != RDMA_DRIVER_RXE)
		return -EOPNOTSUPP;
	aa_probe_layout(dev);
	spin_lock_irqsave(&aa_dev_lock, flags);
	for (i = 0; i < AA_MAX_DEVS; i++) {
		if (!aa_devs[i]) {
			aa_devs[i] = dev;
			break;
		}
	}
	spin_unlock_irqrestore(&aa_dev_lock, flags);
	if (i == AA_MAX_DEVS)
		pr_warn("more than %d rxe devices: %s not managed\n",
			AA_MAX_DEVS, dev_name(&dev->dev));
	return 0;
}

static void aa_client_remove(struct ib_device *dev, void *data)
{
	unsigned long flags;
	int i;

	spin_lock_irqsave(&aa_dev_lock, flags);
	for (i = 0; i < AA_MAX_DEVS; i++)
		if (aa_devs[i] == dev)
			aa_devs[i] = NULL;
	spin_unlock_irqrestore(&aa_dev_lock, flags);
}

static struct ib_client aa_client = {
	.name = "rdmaplus_aa",
	.add = aa_client_add,
	.remove = aa_client_remove,
};

static int aa_is_ufile(const void *ufile, struct file *f, unsigned int fd)
{
	return f->private_data == ufile && f->f_op && f->f_op->owner &&
	       !strcmp(module_name(f->f_op->owner), "ib_uverbs");
}

bool aa_holds_ufile(const void *ufile)
{
	return iterate_fd(current->files, 0, aa_is_ufile, ufile) != 0;
}

/*
 * Find the rxe user MR with this key that the calling process registered
 * (its uverbs file is open here) and take a restrack reference on it.
 * Keys are per device, so another device may have a region with the same
 * key: that one is skipped. Returns the MR, ERR_PTR(-EPERM) when only
 * other processes' regions have the key, or ERR_PTR(-ENOENT).
 */
struct ib_mr *aa_lookup_mr(u32 key)
{
	struct ib_mr *found = NULL;
	unsigned long flags, id;
	bool foreign = false;
	int i;

	spin_lock_irqsave(&aa_dev_lock, flags);
	for (i = 0; i < AA_MAX_DEVS && !found; i++) {
		struct ib_device *dev = aa_devs[i];
		struct aa_restrack_root *rt;
		struct rdma_restrack_entry *res;

		if (!dev || !dev->res)
			continue;
		rt = &((struct aa_restrack_root *)dev->res)[RDMA_RESTRACK_MR];
		/* restrack's xarrays are XA_FLAGS_ALLOC (the free mark's flag
		 * bit comes and goes with the contents; TRACK_FREE stays).
		 */
		if (!(rt->xa.xa_flags & XA_FLAGS_TRACK_FREE) ||
		    rt->xa.xa_flags & XA_FLAGS_ZERO_BUSY) {
			pr_err_once("restrack layout of %s not recognised\n",
				    dev_name(&dev->dev));
			spin_unlock_irqrestore(&aa_dev_lock, flags);
			return ERR_PTR(-EOPNOTSUPP);
		}
		xa_lock(&rt->xa);
		xa_for_each(&rt->xa, id, res) {
			struct ib_mr *mr = container_of(res, struct ib_mr, res);

			if (res->type != RDMA_RESTRACK_MR || !res->valid)
				continue;
			if (mr->lkey != key && mr->rkey != key)
				continue;
			if (mr->type != IB_MR_TYPE_USER || !mr->uobject ||
			    !aa_holds_ufile(mr->uobject->ufile)) {
				foreign = true;
				continue;
			}
			if (rdma_restrack_get(res))
				found = mr;
			break;
		}
		xa_unlock(&rt->xa);
	}
	spin_unlock_irqrestore(&aa_dev_lock, flags);
	if (found)
		return found;
	return ERR_PTR(foreign ? -EPERM : -ENOENT);
}

/* ---- domains ---------------------------------------------------------- */

/*
 * A log's pages are kernel memory mapped into the process for as long as
 * the domain lives, like locked memory: they count against the user's
 * RLIMIT_MEMLOCK (as io_uring's rings do), unless the caller has
 * CAP_IPC_LOCK. Returns -ENOMEM beyond the limit.
 */
int aa_charge(struct user_struct *user, unsigned long pages)
{
	unsigned long limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	unsigned long cur = atomic_long_read(&user->locked_vm), new;

	do {
		new = cur + pages;
		if (new > limit || new < cur)
			return -ENOMEM;
	} while (!atomic_long_try_cmpxchg(&user->locked_vm, &cur, new));
	return 0;
}

void aa_uncharge(struct user_struct *user, unsigned long pages)
{
	if (pages)
		atomic_long_sub(pages, &user->locked_vm);
}

static struct aa_domain *aa_domain_get(struct rdmaplus_aa_ctx *ctx, u32 id)
{
	struct aa_domain *d;

	if (!id || id > RDMAPLUS_AA_MAX_DOMAINS)
		return NULL;
	d = rcu_dereference_protected(aa_domains[id],
				      lockdep_is_held(&aa_mutex));
	return d && d->ctx == ctx ? d : NULL;
}

static long aa_domain_create(struct rdmaplus_aa_ctx *ctx, void __user *arg)
{
	struct rdmaplus_aa_domain_create c;
	struct aa_domain *d;
	unsigned long pages;
	int id, ret;

	if (copy_from_user(&c, arg, sizeof(c)))
		return -EFAULT;
	if (c.size != sizeof(c) || c.flags || c.reserved)
		return -EINVAL;
	if (c.log_size < RDMAPLUS_AA_LOG_MIN || c.log_size > RDMAPLUS_AA_LOG_MAX ||
	    !is_power_of_2(c.log_size))
		return -EINVAL;

	mutex_lock(&aa_mutex);
	if (ctx->ndomains >= READ_ONCE(max_domains_per_file)) {
		mutex_unlock(&aa_mutex);
		return -EMFILE;
	}
	ctx->ndomains++;	/* reserved; given back on error */
	mutex_unlock(&aa_mutex);

	ret = -ENOMEM;
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		goto err_count;
	pages = (PAGE_SIZE + c.log_size) >> PAGE_SHIFT;
	if (!capable(CAP_IPC_LOCK)) {
		ret = aa_charge(ctx->user, pages);
		if (ret)
			goto err_free;
		d->charged = pages;
	}
	ret = -ENOMEM;
	d->ring = vmalloc_user(PAGE_SIZE + c.log_size);
	if (!d->ring)
		goto err_uncharge;
	id = ida_alloc_range(&aa_ida, 1, RDMAPLUS_AA_MAX_DOMAINS, GFP_KERNEL);
	if (id < 0) {
		ret = id == -ENOSPC ? -ENFILE : id;
		goto err_ring;
	}
	d->id = id;
	d->ctx = ctx;
	d->area = (u8 *)d->ring + PAGE_SIZE;
	d->size = c.log_size;
	spin_lock_init(&d->lock);
	hrtimer_init(&d->timer, CLOCK_MONOTONIC, HRTIMER_MODE_ABS_SOFT);
	d->timer.function = aa_timer_fn;
	d->ring->size = c.log_size;
	d->ring->data_offset = PAGE_SIZE;
	d->ring->domain = id;
	d->ring->entry_align = RDMAPLUS_AA_ENTRY_ALIGN;
	d->threshold = 1;

	c.domain = id;
	c.mmap_offset = (u64)id << PAGE_SHIFT;
	c.mmap_size = PAGE_SIZE + c.log_size;
	if (copy_to_user(arg, &c, sizeof(c))) {
		ret = -EFAULT;
		goto err_id;
	}
	mutex_lock(&aa_mutex);
	list_add_tail(&d->node, &ctx->domains);
	rcu_assign_pointer(aa_domains[id], d);
	mutex_unlock(&aa_mutex);
	return 0;

err_id:
	ida_free(&aa_ida, id);
err_ring:
	vfree(d->ring);
err_uncharge:
	aa_uncharge(ctx->user, d->charged);
err_free:
	kfree(d);
err_count:
	mutex_lock(&aa_mutex);
	ctx->ndomains--;
	mutex_unlock(&aa_mutex);
	return ret;
}

/* Disarm every page of domain id (0: all) in [first, last) of ctx's MRs. */
static void aa_disarm_pages(struct rdmaplus_aa_ctx *ctx, struct aa_mr *only,
			    u32 id, u64 first, u64 last)
{
	struct aa_mr *m, *tmp;
	unsigned long flags;
	u64 i;

	spin_lock_irqsave(&aa_lock, flags);
	list_for_each_entry_safe(m, tmp, &ctx->mrs, node) {
		if (only && m != only)
			continue;
		for (i = 0; i < m->npages; i++) {
			u64 pg = m->first_page + i;
			u32 pol = m->pages[i];

			if (!pol || pg < first || pg >= last)
				continue;
			if (id && AA_POL_DOMAIN(pol) != id)
				continue;
			WRITE_ONCE(m->pages[i], 0);
			m->narmed--;
			atomic64_dec(&aa_st.pages);
		}
		if (!m->narmed) {
			aa_mr_unlink(m);
			call_rcu(&m->rcu, aa_mr_free_rcu);
		}
	}
	spin_unlock_irqrestore(&aa_lock, flags);
}

/* aa_mutex held; frees d after every hook is done with it. */
static void aa_domain_destroy(struct aa_domain *d)
{
	unsigned long flags;

	aa_disarm_pages(d->ctx, NULL, d->id, 0, U64_MAX);
	list_del(&d->node);
	RCU_INIT_POINTER(aa_domains[d->id], NULL);
	spin_lock_irqsave(&d->lock, flags);
	d->timer_on = false;
	spin_unlock_irqrestore(&d->lock, flags);
	hrtimer_cancel(&d->timer);
	synchronize_rcu();
	if (d->evt)
		eventfd_ctx_put(d->evt);
	ida_free(&aa_ida, d->id);
	vfree(d->ring);	/* pages stay while a process still maps them */
	aa_uncharge(d->ctx->user, d->charged);
	d->ctx->ndomains--;
	kfree(d);
	aa_maybe_unhook();
}

static long aa_domain_destroy_ioctl(struct rdmaplus_aa_ctx *ctx,
				    void __user *arg)
{
	struct rdmaplus_aa_domain a;
	struct aa_domain *d;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.size != sizeof(a))
		return -EINVAL;
	mutex_lock(&aa_mutex);
	d = aa_domain_get(ctx, a.domain);
	if (d)
		aa_domain_destroy(d);
	mutex_unlock(&aa_mutex);
	return d ? 0 : -ENOENT;
}

static long aa_notify(struct rdmaplus_aa_ctx *ctx, void __user *arg)
{
	struct eventfd_ctx *evt = NULL, *old;
	struct rdmaplus_aa_notify a;
	struct aa_domain *d;
	unsigned long flags;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.size != sizeof(a) || a.flags & ~RDMAPLUS_AA_NOTIFY_F_ADAPTIVE ||
	    a.interval_us > RDMAPLUS_AA_INTERVAL_MAX ||
	    (a.flags & RDMAPLUS_AA_NOTIFY_F_ADAPTIVE && !a.interval_us))
		return -EINVAL;
	if (a.eventfd >= 0) {
		evt = eventfd_ctx_fdget(a.eventfd);
		if (IS_ERR(evt))
			return PTR_ERR(evt);
	}
	mutex_lock(&aa_mutex);
	d = aa_domain_get(ctx, a.domain);
	if (!d) {
		mutex_unlock(&aa_mutex);
		if (evt)
			eventfd_ctx_put(evt);
		return -ENOENT;
	}
	spin_lock_irqsave(&d->lock, flags);
	old = d->evt;
	d->evt = evt;
	d->timer_on = false;	/* no new arming while the old timer goes */
	spin_unlock_irqrestore(&d->lock, flags);
	hrtimer_cancel(&d->timer);
	spin_lock_irqsave(&d->lock, flags);
	d->threshold = a.threshold;
	d->flags = a.flags;
	d->interval = ns_to_ktime((u64)a.interval_us * NSEC_PER_USEC);
	d->signalled = 0;
	d->timer_on = a.interval_us != 0;
	if (d->unsignalled)	/* entries pending under the old policy */
		aa_moderate(d);
	spin_unlock_irqrestore(&d->lock, flags);
	mutex_unlock(&aa_mutex);
	if (old) {
		synchronize_rcu();	/* hooks signal under rcu_read_lock */
		eventfd_ctx_put(old);
	}
	return 0;
}

static long aa_arm(struct rdmaplus_aa_ctx *ctx, void __user *arg)
{
	struct rdmaplus_aa_arm a;
	struct aa_mr *m = NULL, *fresh = NULL, *it;
	struct ib_mr *ibmr;
	unsigned long flags;
	u64 first, last, mfirst, mlast, i;
	void *rmr;
	int ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.size != sizeof(a) || a.bits & ~RDMAPLUS_AA_BITS || !a.length ||
	    !a.key ||
	    (a.iova | a.length) & (RDMAPLUS_AA_PAGE_SIZE - 1) ||
	    a.iova + a.length < a.iova)
		return -EINVAL;
	if (!aa_ok || aa_layout_bad)
		return -EOPNOTSUPP;
	first = a.iova >> AA_PAGE_SHIFT;
	last = (a.iova + a.length) >> AA_PAGE_SHIFT;

	mutex_lock(&aa_mutex);
	if (!aa_domain_get(ctx, a.domain)) {
		ret = -ENOENT;
		goto out;
	}
	/*
	 * The reference taken here holds off the region's deregistration
	 * (rdma_restrack_del waits for it) until the region is hashed below,
	 * where the dereg hook will find it.
	 */
	ibmr = aa_lookup_mr(a.key);
	if (IS_ERR(ibmr)) {
		ret = PTR_ERR(ibmr);
		goto out;
	}
	ret = -EOPNOTSUPP;
	rmr = aa_rxe_mr_of(ibmr);
	if (!rmr)
		goto put;
	ret = aa_hook(ibmr->device->ops.owner);
	if (ret)
		goto put;
	ret = -ERANGE;
	mfirst = ibmr->iova >> AA_PAGE_SHIFT;
	mlast = (ibmr->iova + ibmr->length + RDMAPLUS_AA_PAGE_SIZE - 1) >>
		AA_PAGE_SHIFT;
	if (first < mfirst || last > mlast)
		goto put;

	ret = -ENOMEM;
	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL);
	if (!fresh)
		goto put;
	fresh->npages = mlast - mfirst;
	fresh->pages = kvcalloc(fresh->npages, sizeof(u32), GFP_KERNEL);
	if (!fresh->pages)
		goto put;
	fresh->rxe_mr = rmr;
	fresh->ibmr = ibmr;
	fresh->ctx = ctx;
	fresh->lkey = ibmr->lkey;
	fresh->rkey = ibmr->rkey;
	fresh->first_page = mfirst;

	spin_lock_irqsave(&aa_lock, flags);
	hash_for_each_possible(aa_mrs, it, hnode, (unsigned long)rmr)
		if (it->rxe_mr == rmr && !it->dead)
			m = it;
	if (m && m->ctx != ctx) {
		spin_unlock_irqrestore(&aa_lock, flags);
		ret = -EBUSY;
		goto put;
	}
	if (!m) {
		m = fresh;
		fresh = NULL;
		hash_add_rcu(aa_mrs, &m->hnode, (unsigned long)rmr);
		list_add_tail(&m->node, &ctx->mrs);
		aa_nr_mrs++;
	}
	for (i = first; i < last; i++) {
		u32 *pg = &m->pages[i - m->first_page];

		if (!*pg) {
			m->narmed++;
			atomic64_inc(&aa_st.pages);
		}
		WRITE_ONCE(*pg, AA_POL(a.domain, a.bits));
	}
	spin_unlock_irqrestore(&aa_lock, flags);
	ret = 0;
put:
	rdma_restrack_put(&ibmr->res);
out:
	if (fresh) {
		kvfree(fresh->pages);
		kfree(fresh);
	}
	if (ret)
		aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
	return ret;
}

static long aa_disarm(struct rdmaplus_aa_ctx *ctx, void __user *arg)
{
	struct rdmaplus_aa_arm a;
	struct aa_mr *m, *found = NULL;
	unsigned long flags;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.size != sizeof(a) || !a.length ||
	    (a.iova | a.length) & (RDMAPLUS_AA_PAGE_SIZE - 1) ||
	    a.iova + a.length < a.iova)
		return -EINVAL;
	mutex_lock(&aa_mutex);
	spin_lock_irqsave(&aa_lock, flags);
	list_for_each_entry(m, &ctx->mrs, node)
		if (m->lkey == a.key || (a.key && m->rkey == a.key))
			found = m;
	spin_unlock_irqrestore(&aa_lock, flags);
	if (found)
		aa_disarm_pages(ctx, found, a.domain, a.iova >> AA_PAGE_SHIFT,
				(a.iova + a.length) >> AA_PAGE_SHIFT);
	aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
	return found ? 0 : -ENOENT;
}

static void aa_stats_fill(struct rdmaplus_aa_stats *s)
{
	unsigned long flags;
	int i;

	memset(s, 0, sizeof(*s));
	s->size = sizeof(*s);
	mutex_lock(&aa_mutex);
	s->hooks_armed = aa_hooked;
	for (i = 1; i <= RDMAPLUS_AA_MAX_DOMAINS; i++)
		if (rcu_access_pointer(aa_domains[i]))
			s->domains++;
	mutex_unlock(&aa_mutex);
	spin_lock_irqsave(&aa_lock, flags);
	s->mrs = aa_nr_mrs;
	spin_unlock_irqrestore(&aa_lock, flags);
	s->pages = atomic64_read(&aa_st.pages);
	s->entries = atomic64_read(&aa_st.entries);
	s->bytes = atomic64_read(&aa_st.bytes);
	s->data_bytes = atomic64_read(&aa_st.data_bytes);
	s->writes = atomic64_read(&aa_st.writes);
	s->reads = atomic64_read(&aa_st.reads);
	s->atomics = atomic64_read(&aa_st.atomics);
	s->hidden_writes = atomic64_read(&aa_st.hidden_writes);
	s->zeroed_reads = atomic64_read(&aa_st.zeroed_reads);
	s->refused_writes = atomic64_read(&aa_st.refused_writes);
	s->refused_atomics = atomic64_read(&aa_st.refused_atomics);
	s->lost_reads = atomic64_read(&aa_st.lost_reads);
	s->missed = atomic64_read(&aa_st.missed);
}

static long aa_stats(void __user *arg)
{
	struct rdmaplus_aa_stats s;
	u32 size;

	if (get_user(size, (u32 __user *)arg))
		return -EFAULT;
	if (size != sizeof(s))
		return -EINVAL;
	aa_stats_fill(&s);
	if (copy_to_user(arg, &s, sizeof(s)))
		return -EFAULT;
	return 0;
}

/*
 * The same counters in sysfs, one decimal file each, for daemons:
 * /sys/kernel/rdmaplus/aa/<name>.
 */
struct aa_attr {
	struct kobj_attribute kattr;
	size_t off;
	size_t len;
};

static ssize_t aa_attr_show(struct kobject *kobj, struct kobj_attribute *ka,
			    char *buf)
{
	struct aa_attr *a = container_of(ka, struct aa_attr, kattr);
	struct rdmaplus_aa_stats s;
	u64 v;

	aa_stats_fill(&s);
	if (a->len == sizeof(u32))
		v = *(u32 *)((u8 *)&s + a->off);
	else
		v = *(u64 *)((u8 *)&s + a->off);
	return sysfs_emit(buf, "%llu\n", v);
}

#define AA_ATTR(name) \
	static struct aa_attr aa_attr_##name = { \
		.kattr = __ATTR(name, 0444, aa_attr_show, NULL), \
		.off = offsetof(struct rdmaplus_aa_stats, name), \
		.len = sizeof_field(struct rdmaplus_aa_stats, name), \
	}

AA_ATTR(hooks_armed);
AA_ATTR(domains);
AA_ATTR(mrs);
AA_ATTR(pages);
AA_ATTR(entries);
AA_ATTR(bytes);
AA_ATTR(data_bytes);
AA_ATTR(writes);
AA_ATTR(reads);
AA_ATTR(atomics);
AA_ATTR(hidden_writes);
AA_ATTR(zeroed_reads);
AA_ATTR(refused_writes);
AA_ATTR(refused_atomics);
AA_ATTR(lost_reads);
AA_ATTR(missed);

static struct attribute *aa_attrs[] = {
	&aa_attr_hooks_armed.kattr.attr,
	&aa_attr_domains.kattr.attr,
	&aa_attr_mrs.kattr.attr,
	&aa_attr_pages.kattr.attr,
	&aa_attr_entries.kattr.attr,
	&aa_attr_bytes.kattr.attr,
	&aa_attr_data_bytes.kattr.attr,
	&aa_attr_writes.kattr.attr,
	&aa_attr_reads.kattr.attr,
	&aa_attr_atomics.kattr.attr,
	&aa_attr_hidden_writes.kattr.attr,
	&aa_attr_zeroed_reads.kattr.attr,
	&aa_attr_refused_writes.kattr.attr,
	&aa_attr_refused_atomics.kattr.attr,
	&aa_attr_lost_reads.kattr.attr,
	&aa_attr_missed.kattr.attr,
	NULL,
};

static const struct attribute_group aa_attr_group = {
	.name = "aa",
	.attrs = aa_attrs,
};

static struct kobject *aa_kobj;

/* /sys/kernel/rdmaplus, the parent of the counter directories */
struct kobject *rdmaplus_kobj(void)
{
	return aa_kobj;
}

/* ---- file ------------------------------------------------------------- */

struct rdmaplus_aa_ctx *rdmaplus_aa_open(void)
{
	struct rdmaplus_aa_ctx *ctx = kzalloc(sizeof(*ctx), GFP_KERNEL);

	if (!ctx)
		return ERR_PTR(-ENOMEM);
	INIT_LIST_HEAD(&ctx->domains);
	INIT_LIST_HEAD(&ctx->mrs);
	init_waitqueue_head(&ctx->wq);
	ctx->user = get_uid(current_user());
	return ctx;
}

void rdmaplus_aa_release(struct rdmaplus_aa_ctx *ctx)
{
	struct aa_domain *d, *tmp;

	mutex_lock(&aa_mutex);
	list_for_each_entry_safe(d, tmp, &ctx->domains, node)
		aa_domain_destroy(d);
	aa_disarm_pages(ctx, NULL, 0, 0, U64_MAX);	/* nothing left */
	aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
	free_uid(ctx->user);
	kfree(ctx);
}

long rdmaplus_aa_ioctl(struct rdmaplus_aa_ctx *ctx, unsigned int cmd,
		       void __user *arg)
{
	switch (cmd) {
	case RDMAPLUS_IOC_AA_DOMAIN_CREATE:
		return aa_domain_create(ctx, arg);
	case RDMAPLUS_IOC_AA_DOMAIN_DESTROY:
		return aa_domain_destroy_ioctl(ctx, arg);
	case RDMAPLUS_IOC_AA_NOTIFY:
		return aa_notify(ctx, arg);
	case RDMAPLUS_IOC_AA_ARM:
		return aa_arm(ctx, arg);
	case RDMAPLUS_IOC_AA_DISARM:
		return aa_disarm(ctx, arg);
	case RDMAPLUS_IOC_AA_STATS:
		return aa_stats(arg);
	default:
		return -ENOTTY;
	}
}

int rdmaplus_aa_mmap(struct rdmaplus_aa_ctx *ctx, struct vm_area_struct *vma)
{
	unsigned long len = vma->vm_end - vma->vm_start;
	struct aa_domain *d;
	int ret;

	if (vma->vm_pgoff > RDMAPLUS_AA_MAX_DOMAINS)
		return -EINVAL;
	mutex_lock(&aa_mutex);
	d = aa_domain_get(ctx, vma->vm_pgoff);
	if (!d)
		ret = -ENOENT;
	else if (len != PAGE_SIZE + d->size)
		ret = -EINVAL;
	else
		ret = remap_vmalloc_range(vma, d->ring, 0);
	mutex_unlock(&aa_mutex);
	return ret;
}

__poll_t rdmaplus_aa_poll(struct rdmaplus_aa_ctx *ctx, struct file *file,
			  poll_table *wait)
{
	__poll_t mask = 0;
	struct aa_domain *d;

	poll_wait(file, &ctx->wq, wait);
	mutex_lock(&aa_mutex);
	list_for_each_entry(d, &ctx->domains, node)
		/* pairs with aa_commit's release */
		if (smp_load_acquire(&d->ring->head) !=
		    READ_ONCE(d->ring->tail))
			mask |= EPOLLIN | EPOLLRDNORM;
	mutex_unlock(&aa_mutex);
	return mask;
}

/* ---- load ------------------------------------------------------------- */

static unsigned long aa_kallsyms(const char *name)
{
	static unsigned long (*lookup)(const char *name);

	if (!lookup) {
		struct kprobe kp = { .symbol_name = "kallsyms_lookup_name" };

		if (register_kprobe(&kp))
			return 0;
		lookup = (void *)kp.addr;
		unregister_kprobe(&kp);
	}
	return lookup ? lookup(name) : 0;
}

bool rdmaplus_aa_supported(void)
{
	return aa_ok && !aa_layout_bad;
}

/*
 * Look up the rdma_rxe functions the hooks need and, with
 * owner (the rxe module pinned by aa_hook), check that they lie in it.
 * Only called while no hook is registered: the callbacks read these.
 */
static int aa_find_rxe(struct module *owner)
{
	int (*size_offset)(unsigned long addr, unsigned long *size,
			   unsigned long *off);
	unsigned long copy, iova, data, dereg, resp, queue, size = 0, off = 0;

	copy = aa_kallsyms("rdma_rxe:rxe_mr_copy");
	iova = aa_kallsyms("rdma_rxe:iova_to_vaddr");
	data = aa_kallsyms("rdma_rxe:copy_data");
	dereg = aa_kallsyms("rdma_rxe:rxe_dereg_mr");
	resp = aa_kallsyms("rdma_rxe:rxe_responder");
	queue = aa_kallsyms("rdma_rxe:rxe_resp_queue_pkt");
	size_offset = (void *)aa_kallsyms("kallsyms_lookup_size_offset");
	if (!copy || !iova || !data || !dereg || !resp || !queue ||
	    !size_offset) {
		pr_err("rdma_rxe not loaded or not recognised: rxe_mr_copy %s, iova_to_vaddr %s, copy_data %s, rxe_responder %s, rxe_resp_queue_pkt %s, rxe_dereg_mr %s (load rdma_rxe first; this module knows the rxe of Linux 6.1)\n",
		       copy ? "found" : "missing", iova ? "found" : "missing",
		       data ? "found" : "missing",
		       resp ? "found" : "missing",
		       queue ? "found" : "missing",
		       dereg ? "found" : "missing");
		return -ENOENT;
	}
	if (!size_offset(data, &size, &off) || off || !size || size > 65536) {
		pr_err("rdma_rxe not recognised: copy_data has no sane extent\n");
		return -ENOENT;
	}
	if (owner && !(within_module(copy, owner) &&
		       within_module(iova, owner) &&
		       within_module(data, owner) &&
		       within_module(resp, owner) &&
		       within_module(queue, owner) &&
		       within_module(dereg, owner))) {
		pr_err("the device's driver %s is not the rdma_rxe whose functions were found\n",
		       module_name(owner));
		return -ENOENT;
	}
	aa_copy_data_start = data;
	aa_copy_data_size = size;
	aa_rxe_mr_copy = (void *)copy;
	aa_iova_to_vaddr = (void *)iova;
	aa_hooks[AA_HOOK_COPY].addr = copy;
	aa_hooks[AA_HOOK_ATOMIC].addr = iova;
	aa_hooks[AA_HOOK_DEREG].addr = dereg;
	aa_hooks[AA_HOOK_RESP].addr = resp;
	aa_hooks[AA_HOOK_QUEUE].addr = queue;
	return 0;
}

int rdmaplus_aa_init(void)
{
	int ret, i;

	INIT_WORK(&aa_gc_work, aa_gc);
	ret = aa_find_rxe(NULL);
	if (ret)
		return ret;
	for (i = 0; i < ARRAY_SIZE(aa_cur_task); i++)
		raw_spin_lock_init(&aa_cur_task[i].lock);
	for_each_possible_cpu(i)
		raw_spin_lock_init(&per_cpu_ptr(&aa_cur_soft, i)->lock);

	aa_kobj = kobject_create_and_add("rdmaplus", kernel_kobj);
	if (!aa_kobj)
		return -ENOMEM;
	ret = sysfs_create_group(aa_kobj, &aa_attr_group);
	if (ret) {
		pr_err("cannot create /sys/kernel/rdmaplus/aa: %d\n", ret);
		goto err_kobj;
	}
	ret = ib_register_client(&aa_client);
	if (ret) {
		pr_err("cannot register the ib client: %d\n", ret);
		goto err_group;
	}
	if (aa_layout_bad) {
		pr_err("rdma_rxe not recognised: refusing to load\n");
		ret = -ENOENT;
		goto err_client;
	}
	aa_ok = true;
	return 0;

err_client:
	ib_unregister_client(&aa_client);

err_group:
	sysfs_remove_group(aa_kobj, &aa_attr_group);
err_kobj:
	kobject_put(aa_kobj);
	return ret;
}

void rdmaplus_aa_exit(void)
{
	/* Every file is closed: nothing is armed, the hooks are gone. */
	flush_work(&aa_gc_work);
	mutex_lock(&aa_mutex);
	aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
	ib_unregister_client(&aa_client);
	sysfs_remove_group(aa_kobj, &aa_attr_group);
	kobject_put(aa_kobj);
	rcu_barrier();		/* aa_mr_free_rcu callbacks */
	aa_ok = false;
}
