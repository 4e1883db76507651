// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus Active Access: an emulated IOMMU for rxe (docs/activeaccess.md).
 *
 * A process creates domains (the paper's IUIDs), each with an access log
 * (a ring mapped into the process), and arms 4 KiB pages of its own rxe
 * memory regions with control bits W, R, WL, WLD, RL, RLD. The rxe layer's
 * hooks (rdmaplus_rxe.c), held registered while some page is armed, hand
 * Active Access every packet of an incoming RDMA WRITE and of an RDMA READ
 * response (aa_copy), incoming atomics (aa_atomic) and deregistrations
 * (aa_dereg), after the counted mailboxes: a write into a gated mailbox
 * range is RVMA's alone and never reaches Active Access.
 *
 * Hooks run in softirq context, in a work item or inline from a poster's
 * system call, with preemption disabled: no sleeping, irqsave locks, RCU
 * for lookups.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/eventfd.h>
#include <linux/hashtable.h>
#include <linux/hrtimer.h>
#include <linux/idr.h>
#include <linux/kobject.h>
#include <linux/kref.h>
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
#include <rdma/ib_verbs.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"

#define AA_PAGE_SHIFT	12
#define AA_HDR		sizeof(struct rdmaplus_aa_entry)
#define AA_MAX_SEGS	2	/* a packet (<= 4096 bytes) spans <= 2 pages */

/* Per-page policy word: domain id in the low 16 bits, control bits above. */
#define AA_POL_DOMAIN(p)	((p) & 0xffff)
#define AA_POL_BITS(p)		(((p) >> 16) & RDMAPLUS_AA_BITS)
#define AA_POL(d, b)		((u32)(d) | ((u32)(b) << 16))

struct rdmaplus_aa_ctx {
	struct list_head domains;	/* under aa_mutex */
	unsigned int ndomains;		/* under aa_mutex */
	struct rdmaplus_user *user;	/* charged for the logs' pages */
	struct list_head mrs;		/* under aa_lock */
	wait_queue_head_t wq;
};

/*
 * A log's memory: the domain holds one reference and every mapping of it
 * one more, so the pages, and their charge to the user's RLIMIT_MEMLOCK,
 * go only when the domain is gone and nothing maps them any more.
 */
struct aa_logmem {
	struct kref ref;
	void *mem;			/* vmalloc_user: ring page + area */
	struct rdmaplus_user *user;
	unsigned long charged;		/* pages in the user's locked_vm */
};

struct aa_domain {
	u32 id;
	struct rdmaplus_aa_ctx *ctx;
	struct list_head node;		/* ctx->domains, or a list to free */
	spinlock_t lock;		/* producers, notification state */
	struct aa_logmem *mem;
	struct rdmaplus_aa_ring *ring;	/* mem->mem: ring page + area */
	u8 *area;
	u64 size;
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

static DEFINE_MUTEX(aa_mutex);		/* configuration */
static DEFINE_SPINLOCK(aa_lock);	/* aa_mrs, ctx->mrs */
static DEFINE_HASHTABLE(aa_mrs, 8);
static struct aa_domain __rcu *aa_domains[RDMAPLUS_AA_MAX_DOMAINS + 1];
static DEFINE_IDA(aa_ida);
static unsigned long aa_nr_mrs;		/* under aa_lock */
static bool aa_hooked;			/* under aa_mutex: holds the hooks */
static struct work_struct aa_gc_work;

static struct {
	atomic64_t entries, bytes, data_bytes, writes, reads, atomics;
	atomic64_t hidden_writes, zeroed_reads, refused_writes;
	atomic64_t refused_atomics, lost_reads, pages;
} aa_st;

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
		rdmaplus_eventfd_signal(d->evt);
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
	rdmaplus_rxe_source(&src[0], &src[1]);
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
	rdmaplus_rxe_source(&src[0], &src[1]);
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
		if (rdmaplus_rxe_mr_copy((void *)regs->di, regs->si, payload,
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

/* Every incoming write packet and read response not RVMA's. */
static bool aa_copy(struct pt_regs *regs)
{
	int len = (int)regs->cx;
	struct aa_seg s[AA_MAX_SEGS];
	struct aa_mr *m;
	int n;

	m = aa_find((void *)regs->di);
	if (!m)
		return false;
	n = aa_segments(m, regs->si, len, s);
	if (n < 0) {
		pr_err_ratelimited("%d-byte packet spans more than %d pages\n",
				   len, AA_MAX_SEGS);
		if (!(regs->r8 & 1))
			regs->si = ~0ULL;
		return true;
	}
	if (!n)
		return false;
	if (regs->r8 & 1)
		aa_read(regs, m, s, n);
	else
		aa_write(regs, m, s, n);
	return true;
}

static bool aa_atomic(struct pt_regs *regs)
{
	u32 want = RDMAPLUS_AA_W | RDMAPLUS_AA_R;
	struct aa_seg s[AA_MAX_SEGS];
	unsigned long flags;
	struct aa_mr *m;
	u64 value = 0;
	int n, refuse = 0;

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
		if (data)
			value = rdmaplus_rxe_atomic_value(regs);
		aa_lock_domains(s, 1, &flags);
		if (!aa_room(s, 1)) {
			s[0].d->ring->refused++;
			aa_unlock_domains(s, 1, flags);
			refuse = 1;
			goto out;
		}
		u32 src[2] = { 0, 0 };

		rdmaplus_rxe_source(&src[0], &src[1]);
		aa_log(&s[0], m, RDMAPLUS_AA_OP_ATOMIC, 0,
		       data ? (u8 *)&value : NULL, value, src);
		aa_commit_segs(s, 1);
		aa_unlock_domains(s, 1, flags);
	}
out:
	if (!refuse)
		return m;
	/* the requester gets a NAK (remote invalid request); nothing is
	 * printed and memory is untouched
	 */
	atomic64_inc(&aa_st.refused_atomics);
	rdmaplus_rxe_refuse_atomic(regs);
	return true;
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
	list_del_rcu(&m->node);
	atomic64_sub(m->narmed, &aa_st.pages);
	aa_nr_mrs--;
}

/* A region being deregistered: forget it. */
static void aa_dereg(void *rxe_mr, struct ib_mr *ibmr)
{
	struct aa_mr *m, *found = NULL;
	unsigned long flags;

	spin_lock_irqsave(&aa_lock, flags);
	hash_for_each_possible(aa_mrs, m, hnode, (unsigned long)rxe_mr)
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

static const struct rdmaplus_rxe_consumer aa_consumer = {
	.copy = aa_copy,
	.atomic = aa_atomic,
	.dereg = aa_dereg,
};

/*
 * Drop the hooks when no page is armed; aa_mutex held. (Registering and
 * unregistering them wait for RCU grace periods, so they are held only
 * while needed.)
 */
static void aa_maybe_unhook(void)
{
	unsigned long flags, n;

	spin_lock_irqsave(&aa_lock, flags);
	n = aa_nr_mrs;
	spin_unlock_irqrestore(&aa_lock, flags);
	if (!aa_hooked || n)
		return;
	aa_hooked = false;
	rdmaplus_rxe_hook_put();
}

static void aa_gc(struct work_struct *w)
{
	mutex_lock(&aa_mutex);
	aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
}

/* ---- domains ---------------------------------------------------------- */

/*
 * A log's pages are kernel memory mapped into the process, like locked
 * memory: they count against the user's RLIMIT_MEMLOCK (rdmaplus_charge)
 * until the domain is destroyed and the last mapping is gone.
 */
static void aa_logmem_free(struct kref *ref)
{
	struct aa_logmem *lm = container_of(ref, struct aa_logmem, ref);

	vfree(lm->mem);
	rdmaplus_uncharge(lm->user, lm->charged);
	rdmaplus_user_put(lm->user);
	kfree(lm);
}

static void aa_logmem_vm_open(struct vm_area_struct *vma)
{
	struct aa_logmem *lm = vma->vm_private_data;

	kref_get(&lm->ref);
}

static void aa_logmem_vm_close(struct vm_area_struct *vma)
{
	struct aa_logmem *lm = vma->vm_private_data;

	kref_put(&lm->ref, aa_logmem_free);
}

static const struct vm_operations_struct aa_logmem_vm_ops = {
	.open = aa_logmem_vm_open,
	.close = aa_logmem_vm_close,
};

static struct aa_logmem *aa_logmem_alloc(struct rdmaplus_user *u,
					 unsigned long size)
{
	struct aa_logmem *lm;
	long charged;

	lm = kzalloc(sizeof(*lm), GFP_KERNEL_ACCOUNT);
	if (!lm)
		return ERR_PTR(-ENOMEM);
	charged = rdmaplus_charge(u, size >> PAGE_SHIFT);
	if (charged < 0) {
		kfree(lm);
		return ERR_PTR(charged);
	}
	lm->charged = charged;
	lm->mem = vmalloc_user(size);
	if (!lm->mem) {
		rdmaplus_uncharge(u, charged);
		kfree(lm);
		return ERR_PTR(-ENOMEM);
	}
	kref_init(&lm->ref);
	lm->user = u;
	rdmaplus_user_get_ref(u);
	return lm;
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
	struct aa_logmem *lm;
	struct aa_domain *d;
	int id, ret;

	ret = rdmaplus_copy_in(&c, sizeof(c), sizeof(c), arg);
	if (ret)
		return ret;
	if (c.flags || c.reserved || c.domain || c.mmap_offset || c.mmap_size)
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

	ret = rdmaplus_user_take(ctx->user, RDMAPLUS_RES_DOMAIN);
	if (ret)
		goto err_count;
	ret = -ENOMEM;
	d = kzalloc(sizeof(*d), GFP_KERNEL_ACCOUNT);
	if (!d)
		goto err_user;
	lm = aa_logmem_alloc(ctx->user, PAGE_SIZE + c.log_size);
	if (IS_ERR(lm)) {
		ret = PTR_ERR(lm);
		goto err_free;
	}
	d->mem = lm;
	d->ring = lm->mem;
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
	rdmaplus_hrtimer_setup(&d->timer, aa_timer_fn, CLOCK_MONOTONIC,
			       HRTIMER_MODE_ABS_SOFT);
	d->ring->size = c.log_size;
	d->ring->data_offset = PAGE_SIZE;
	d->ring->domain = id;
	d->ring->entry_align = RDMAPLUS_AA_ENTRY_ALIGN;
	d->threshold = 1;

	c.domain = id;
	c.mmap_offset = (u64)id << PAGE_SHIFT;
	c.mmap_size = PAGE_SIZE + c.log_size;
	ret = rdmaplus_copy_out(arg, &c, sizeof(c));
	if (ret)
		goto err_id;
	mutex_lock(&aa_mutex);
	list_add_tail(&d->node, &ctx->domains);
	rcu_assign_pointer(aa_domains[id], d);
	mutex_unlock(&aa_mutex);
	return 0;

err_id:
	ida_free(&aa_ida, id);
err_ring:
	kref_put(&lm->ref, aa_logmem_free);
err_free:
	kfree(d);
err_user:
	rdmaplus_user_give(ctx->user, RDMAPLUS_RES_DOMAIN);
err_count:
	mutex_lock(&aa_mutex);
	ctx->ndomains--;
	mutex_unlock(&aa_mutex);
	return ret;
}

/*
 * Disarm every page of domain id (0: all) in [first, last) of ctx's MRs
 * (only: of that one). aa_mutex held, so no arm changes the pages
 * meanwhile; the walk over them, as long as a region is large, runs with
 * interrupts on (the hooks read the policy words locklessly), and only the
 * counts and the unlinking of a region left without armed pages take
 * aa_lock. A region the dereg hook unlinks meanwhile stays readable until
 * the RCU read side ends.
 */
static void aa_disarm_pages(struct rdmaplus_aa_ctx *ctx, struct aa_mr *only,
			    u32 id, u64 first, u64 last)
{
	unsigned long flags;
	struct aa_mr *m;
	u64 i, from, to, n;

	lockdep_assert_held(&aa_mutex);
	rcu_read_lock();
	list_for_each_entry_rcu(m, &ctx->mrs, node) {
		if ((only && m != only) || READ_ONCE(m->dead))
			continue;
		from = max(first, m->first_page) - m->first_page;
		to = min(last, m->first_page + m->npages);
		to = to > m->first_page ? to - m->first_page : 0;
		for (i = from, n = 0; i < to; i++) {
			u32 pol = READ_ONCE(m->pages[i]);

			if (!pol || (id && AA_POL_DOMAIN(pol) != id))
				continue;
			WRITE_ONCE(m->pages[i], 0);
			n++;
		}
		spin_lock_irqsave(&aa_lock, flags);
		if (!m->dead) {
			m->narmed -= n;
			atomic64_sub(n, &aa_st.pages);
			if (!m->narmed) {
				aa_mr_unlink(m);
				call_rcu(&m->rcu, aa_mr_free_rcu);
			}
		}
		spin_unlock_irqrestore(&aa_lock, flags);
	}
	rcu_read_unlock();
}

/*
 * Take d out of use and onto gone, to be freed by aa_domains_free() after
 * an RCU grace period (hooks may still be using it until then; its id is
 * kept until then too, so that no new domain answers to a policy word a
 * hook read before the pages were disarmed). aa_mutex held.
 */
static void aa_domain_unlink(struct aa_domain *d, struct list_head *gone)
{
	unsigned long flags;

	aa_disarm_pages(d->ctx, NULL, d->id, 0, U64_MAX);
	list_move_tail(&d->node, gone);
	RCU_INIT_POINTER(aa_domains[d->id], NULL);
	spin_lock_irqsave(&d->lock, flags);
	d->timer_on = false;
	spin_unlock_irqrestore(&d->lock, flags);
	d->ctx->ndomains--;
}

/*
 * Free the unlinked domains on gone, after one grace period for them all.
 * The log's pages stay while a process still maps them (aa_logmem).
 */
static void aa_domains_free(struct list_head *gone)
{
	struct aa_domain *d, *tmp;

	if (list_empty(gone))
		return;
	synchronize_rcu();
	list_for_each_entry_safe(d, tmp, gone, node) {
		hrtimer_cancel(&d->timer);
		if (d->evt)
			eventfd_ctx_put(d->evt);
		ida_free(&aa_ida, d->id);
		rdmaplus_user_give(d->ctx->user, RDMAPLUS_RES_DOMAIN);
		kref_put(&d->mem->ref, aa_logmem_free);
		kfree(d);
	}
}

static long aa_domain_destroy_ioctl(struct rdmaplus_aa_ctx *ctx,
				    void __user *arg)
{
	struct rdmaplus_aa_domain a;
	struct aa_domain *d;
	LIST_HEAD(gone);
	int ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	mutex_lock(&aa_mutex);
	d = aa_domain_get(ctx, a.domain);
	if (d) {
		aa_domain_unlink(d, &gone);
		aa_maybe_unhook();
	}
	mutex_unlock(&aa_mutex);
	aa_domains_free(&gone);
	return d ? 0 : -ENOENT;
}

static long aa_notify(struct rdmaplus_aa_ctx *ctx, void __user *arg)
{
	struct eventfd_ctx *evt = NULL, *old;
	struct rdmaplus_aa_notify a;
	struct aa_domain *d;
	unsigned long flags;

	int ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (a.flags & ~RDMAPLUS_AA_NOTIFY_F_ADAPTIVE ||
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

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (a.bits & ~RDMAPLUS_AA_BITS || !a.length || !a.key ||
	    (a.iova | a.length) & (RDMAPLUS_AA_PAGE_SIZE - 1) ||
	    a.iova + a.length < a.iova)
		return -EINVAL;
	if (!rdmaplus_rxe_supported())
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
	ibmr = rdmaplus_rxe_lookup_mr(a.key);
	if (IS_ERR(ibmr)) {
		ret = PTR_ERR(ibmr);
		goto out;
	}
	ret = -EOPNOTSUPP;
	rmr = rdmaplus_rxe_mr_of(ibmr);
	if (!rmr)
		goto put;
	if (!aa_hooked) {	/* before the region is hashed: dereg sees it */
		ret = rdmaplus_rxe_hook_get(ibmr->device->ops.owner);
		if (ret)
			goto put;
		aa_hooked = true;
	}
	ret = -ERANGE;
	mfirst = ibmr->iova >> AA_PAGE_SHIFT;
	mlast = (ibmr->iova + ibmr->length + RDMAPLUS_AA_PAGE_SIZE - 1) >>
		AA_PAGE_SHIFT;
	if (first < mfirst || last > mlast)
		goto put;

	ret = -ENOMEM;
	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL_ACCOUNT);
	if (!fresh)
		goto put;
	fresh->npages = mlast - mfirst;
	fresh->pages = kvcalloc(fresh->npages, sizeof(u32), GFP_KERNEL_ACCOUNT);
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
		list_add_tail_rcu(&m->node, &ctx->mrs);
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
	rdmaplus_rxe_put_mr(ibmr);
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
	int ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (!a.length || (a.iova | a.length) & (RDMAPLUS_AA_PAGE_SIZE - 1) ||
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
	s->hooks_armed = rdmaplus_rxe_hooked();
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
	s->missed = rdmaplus_rxe_missed();
}

static long aa_stats(void __user *arg)
{
	struct rdmaplus_aa_stats s;
	u32 size;
	int ret;

	ret = rdmaplus_copy_in(&s, sizeof(s), sizeof(s), arg);
	if (ret)
		return ret;
	size = min_t(u32, s.size, sizeof(s));
	aa_stats_fill(&s);
	s.size = size;
	return rdmaplus_copy_out(arg, &s, sizeof(s));
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

/* ---- file ------------------------------------------------------------- */

struct rdmaplus_aa_ctx *rdmaplus_aa_open(struct rdmaplus_user *u)
{
	struct rdmaplus_aa_ctx *ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);

	if (!ctx)
		return ERR_PTR(-ENOMEM);
	INIT_LIST_HEAD(&ctx->domains);
	INIT_LIST_HEAD(&ctx->mrs);
	init_waitqueue_head(&ctx->wq);
	ctx->user = u;
	return ctx;
}

/* Everything of the file goes, after one RCU grace period for it all. */
void rdmaplus_aa_release(struct rdmaplus_aa_ctx *ctx)
{
	struct aa_domain *d, *tmp;
	LIST_HEAD(gone);

	mutex_lock(&aa_mutex);
	list_for_each_entry_safe(d, tmp, &ctx->domains, node)
		aa_domain_unlink(d, &gone);
	aa_disarm_pages(ctx, NULL, 0, 0, U64_MAX);	/* nothing left */
	aa_maybe_unhook();
	mutex_unlock(&aa_mutex);
	aa_domains_free(&gone);
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
		ret = remap_vmalloc_range(vma, d->mem->mem, 0);
	if (!ret) {	/* the pages and their charge stay while mapped */
		vma->vm_ops = &aa_logmem_vm_ops;
		vma->vm_private_data = d->mem;
		kref_get(&d->mem->ref);
	}
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

int rdmaplus_aa_init(void)
{
	int ret;

	INIT_WORK(&aa_gc_work, aa_gc);
	ret = sysfs_create_group(rdmaplus_kobj(), &aa_attr_group);
	if (ret) {
		pr_err("cannot create /sys/kernel/rdmaplus/aa: %d\n", ret);
		return ret;
	}
	rdmaplus_rxe_add_consumer(&aa_consumer);
	return 0;
}

void rdmaplus_aa_exit(void)
{
	/* Every file is closed: nothing is armed, the hooks are dropped. */
	flush_work(&aa_gc_work);
	sysfs_remove_group(rdmaplus_kobj(), &aa_attr_group);
	rcu_barrier();		/* aa_mr_free_rcu callbacks */
}
