// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus JBMT pinning (docs/jbmt.md, "Pinning"): the pages JBMT holds
 * pinned, the budget that bounds them, and the pin cache.
 *
 * Pins are short-term (no FOLL_LONGTERM, no RLIMIT_MEMLOCK charge). Each
 * side of a host has its budget: the pages this host's operations hold
 * pinned (their local sections), and the pages it holds pinned to serve
 * peers; jbmt_pin_share_pages caps one file's operations.
 *
 * The pin cache keeps the pages of a section pinned after it ends, so
 * that the next section over the same pages (a buffer used again, a
 * region read again) skips the page walk. Each cached range has an
 * mmu_interval_notifier: the moment its process's mapping of the range
 * changes (munmap, mremap, mprotect, a fork's copy-on-write, exit), the
 * range is dropped, so no section is ever served from a stale
 * translation. A section already using it goes on with the pages it has,
 * as an uncached section would (the pins keep them). Cached pages count
 * against their side's budget: a section that finds the budget full
 * evicts idle cached ranges, oldest first, before it waits, and a
 * shrinker gives them back under memory pressure.
 *
 * Locks: jbmt_pc_lock (ranges, their state) and jbmt_budget_lock (the
 * budget) are never held together and never across anything that
 * sleeps; both are taken in process and work context only (the CQ is
 * polled from a workqueue), and in the notifier's callback.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/hash.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/sched/mm.h>
#include <linux/shrinker.h>
#include <linux/slab.h>
#include <linux/version.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"
#include "rdmaplus_jbmt.h"

static struct {
	atomic64_t pinned_pages;	/* now, both sides, cached or not */
	atomic64_t pin_cache_hits;	/* sections a cached range served */
	atomic64_t pin_cache_misses;	/* sections cached anew */
	atomic64_t pin_cache_stale;	/* cached ranges whose mapping changed */
	atomic64_t pin_cache_evicted;	/* given back for budget or memory */
	atomic64_t pin_cache_pages;	/* pinned by cached ranges now */
	atomic64_t pin_cache_idle_pages; /* of which no section uses */
} jbmt_pin_st;

/* ---- pins --------------------------------------------------------------- */

/* 6.5 dropped the vmas argument (the module builds for 6.1 and later) */
#if LINUX_VERSION_CODE < KERNEL_VERSION(6, 5, 0)
#define jbmt_pin_remote(mm, start, n, flags, pages) \
	pin_user_pages_remote(mm, start, n, flags, pages, NULL, NULL)
#else
#define jbmt_pin_remote(mm, start, n, flags, pages) \
	pin_user_pages_remote(mm, start, n, flags, pages, NULL)
#endif

int jbmt_pin(struct mm_struct *mm, u64 addr, unsigned int n, bool write,
	     bool nofault, struct page **pages)
{
	unsigned int flags = write ? FOLL_WRITE : 0;
	long got = 0, ret = 0;
	int fail = -EFAULT;

	if (!mm) {
		ret = pin_user_pages_fast(addr, n, flags, pages);
		got = max(ret, 0L);
	} else if (nofault) {
		if (!mmget_not_zero(mm))
			return -EFAULT;
		if (mmap_read_trylock(mm)) {
			ret = jbmt_pin_remote(mm, addr, n, flags | FOLL_NOFAULT,
					      pages);
			got = max(ret, 0L);
			mmap_read_unlock(mm);
		}
		mmput(mm);
		fail = -EAGAIN;		/* a fault or the lock to wait for */
	} else if (mmget_not_zero(mm)) {
		mmap_read_lock(mm);
		while (got < n) {
			ret = jbmt_pin_remote(mm, addr + got * PAGE_SIZE,
					      n - got, flags, pages + got);
			if (ret <= 0)
				break;
			got += ret;
		}
		mmap_read_unlock(mm);
		mmput(mm);
	}
	if (got == n) {
		atomic64_add(n, &jbmt_pin_st.pinned_pages);
		return 0;
	}
	if (got > 0)
		unpin_user_pages(pages, got);
	return fail;
}

void jbmt_unpin(struct page **pages, unsigned int n, bool dirty)
{
	unpin_user_pages_dirty_lock(pages, n, dirty);
	atomic64_sub(n, &jbmt_pin_st.pinned_pages);
}

/* ---- the pin budget ----------------------------------------------------- */

/*
 * An operation waits for budget (at least a page, its section shrinking
 * to what it got) and never fails for it; a request from a peer that
 * finds the serving budget full is answered NOPIN and asked again later.
 * Serving never waits on operations, so neither side can wait on the
 * other, on one host or across two: whatever is pinned is released when
 * its section ends (or, cached, when a section needs its budget), and
 * sections end by themselves.
 */
static unsigned int jbmt_pin_budget_pages = 32768;
static int jbmt_budget_set(const char *val, const struct kernel_param *kp);
static const struct kernel_param_ops jbmt_budget_ops = {
	.set = jbmt_budget_set,
	.get = param_get_uint,
};
module_param_cb(jbmt_pin_budget_pages, &jbmt_budget_ops,
		&jbmt_pin_budget_pages, 0644);
MODULE_PARM_DESC(jbmt_pin_budget_pages, "pages JBMT may hold pinned on each side: for this host's operations, and to serve peers (at least 1)");

static unsigned int jbmt_pin_share_pages;
module_param(jbmt_pin_share_pages, uint, 0644);
MODULE_PARM_DESC(jbmt_pin_share_pages, "pages one process's operations may hold pinned (0: the whole budget)");

static DEFINE_SPINLOCK(jbmt_budget_lock);
static long jbmt_op_pinned, jbmt_served_pinned;	/* under the lock */
static long jbmt_op_hwm, jbmt_served_hwm;
DECLARE_WAIT_QUEUE_HEAD(jbmt_budget_wq);

u32 jbmt_pin_budget(void)
{
	return max(READ_ONCE(jbmt_pin_budget_pages), 1U);
}

static unsigned int jbmt_pc_evict(enum jbmt_side side, const void *owner,
				  unsigned int pages);

/* own: what was missing is the file's share (only its ranges can help) */
static unsigned int jbmt_budget_try(struct rdmaplus_jbmt_ctx *ctx,
				    unsigned int want, bool *own)
{
	long budget = jbmt_pin_budget(), share, avail;
	unsigned int got = 0;

	share = READ_ONCE(jbmt_pin_share_pages) ?: budget;
	spin_lock(&jbmt_budget_lock);
	avail = min(budget - jbmt_op_pinned, share - ctx->pinned);
	*own = share - ctx->pinned < budget - jbmt_op_pinned;
	if (avail > 0) {
		got = min_t(long, want, avail);
		jbmt_op_pinned += got;
		ctx->pinned += got;
		jbmt_op_hwm = max(jbmt_op_hwm, jbmt_op_pinned);
	}
	spin_unlock(&jbmt_budget_lock);
	return got;
}

unsigned int jbmt_budget_take(struct rdmaplus_jbmt_ctx *ctx,
			      unsigned int want)
{
	unsigned int got;
	bool own;

	got = jbmt_budget_try(ctx, want, &own);
	if (got)
		return got;
	/* idle cached ranges give their pages back first */
	if (!jbmt_pc_evict(JBMT_SIDE_OP, own ? ctx : NULL, want))
		return 0;
	return jbmt_budget_try(ctx, want, &own);
}

void jbmt_budget_give(struct rdmaplus_jbmt_ctx *ctx, unsigned int n)
{
	if (!n)
		return;
	spin_lock(&jbmt_budget_lock);
	jbmt_op_pinned -= n;
	ctx->pinned -= n;
	spin_unlock(&jbmt_budget_lock);
	wake_up_all(&jbmt_budget_wq);
}

/*
 * A section larger than the whole budget (from a peer that has not yet
 * learned it: the NOPIN tells it) is served when nothing else is, so it
 * cannot wait forever.
 */
static bool jbmt_serve_try(unsigned int n)
{
	bool ok;

	spin_lock(&jbmt_budget_lock);
	ok = jbmt_served_pinned + n <= jbmt_pin_budget() || !jbmt_served_pinned;
	if (ok) {
		jbmt_served_pinned += n;
		jbmt_served_hwm = max(jbmt_served_hwm, jbmt_served_pinned);
	}
	spin_unlock(&jbmt_budget_lock);
	return ok;
}

bool jbmt_serve_take(unsigned int n)
{
	if (jbmt_serve_try(n))
		return true;
	if (!jbmt_pc_evict(JBMT_SIDE_SERVE, NULL, n))
		return false;
	return jbmt_serve_try(n);
}

void jbmt_serve_give(unsigned int n)
{
	if (!n)
		return;
	spin_lock(&jbmt_budget_lock);
	jbmt_served_pinned -= n;
	spin_unlock(&jbmt_budget_lock);
}

/* ---- the pin cache ------------------------------------------------------ */

static bool jbmt_pin_cache = true;

/*
 * A cached range: a section's pages, pinned, charged to its side's budget
 * (and an operation's to its file). Alive, it is in the hash (and, while
 * no section uses it, on its side's idle list); dead (its mapping changed,
 * evicted, or its owner gone), it is unhashed and released by the last
 * section that used it. A range is found again by any section whose pages
 * it covers: same address space, side, and at least the access.
 */
struct jbmt_pc_ent {
	struct mmu_interval_notifier sub;
	struct hlist_node hnode;	/* jbmt_pc_hash, while alive */
	struct list_head lru;		/* jbmt_pc_idle[side]; the reap list */
	struct mm_struct *mm;
	const void *owner;		/* its file (op) or region (serve) */
	struct rdmaplus_jbmt_ctx *ctx;	/* charged (op side) */
	u64 start;			/* page-aligned */
	unsigned int npages;
	enum jbmt_side side;
	bool write;
	bool dead;
	unsigned int users;		/* sections using it */
	unsigned long seq;		/* the notifier's, when pinned */
	struct page *pages[];
};

#define JBMT_PC_HASH_BITS	10
/* ranges are found by the chunk of JBMT_SECT_PAGES their first page is in */
#define JBMT_PC_CHUNK_SHIFT	(PAGE_SHIFT + ilog2(JBMT_SECT_PAGES))

static DEFINE_SPINLOCK(jbmt_pc_lock);
static struct hlist_head jbmt_pc_hash[1 << JBMT_PC_HASH_BITS];
static struct list_head jbmt_pc_idle[2] = {
	LIST_HEAD_INIT(jbmt_pc_idle[0]), LIST_HEAD_INIT(jbmt_pc_idle[1]),
};
static LIST_HEAD(jbmt_pc_reap_list);
static void jbmt_pc_reap(struct work_struct *w);
static DECLARE_WORK(jbmt_pc_reap_work, jbmt_pc_reap);

static_assert(JBMT_SECT_SPAN <= 2 * JBMT_SECT_PAGES);

static struct hlist_head *jbmt_pc_bucket(struct mm_struct *mm, u64 addr)
{
	return &jbmt_pc_hash[hash_64((u64)(unsigned long)mm ^
				     (addr >> JBMT_PC_CHUNK_SHIFT),
				     JBMT_PC_HASH_BITS)];
}

/*
 * Kill a live range (jbmt_pc_lock held): true when nobody uses it, the
 * caller then releasing it.
 */
static bool jbmt_pc_kill_locked(struct jbmt_pc_ent *e)
{
	if (e->dead)
		return false;
	e->dead = true;
	hlist_del_init(&e->hnode);
	if (e->users)
		return false;
	list_del_init(&e->lru);
	atomic64_sub(e->npages, &jbmt_pin_st.pin_cache_idle_pages);
	return true;
}

/*
 * A dead range nobody uses: unpin (its pages were dirtied as each section
 * that wrote them ended), give back its budget, and have the notifier
 * removed and the range freed in a work item (removing waits for a
 * running invalidation: not from the notifier's own callback).
 */
static void jbmt_pc_release(struct jbmt_pc_ent *e)
{
	unpin_user_pages(e->pages, e->npages);
	atomic64_sub(e->npages, &jbmt_pin_st.pinned_pages);
	atomic64_sub(e->npages, &jbmt_pin_st.pin_cache_pages);
	if (e->side == JBMT_SIDE_OP)
		jbmt_budget_give(e->ctx, e->npages);
	else
		jbmt_serve_give(e->npages);
	spin_lock(&jbmt_pc_lock);
	list_add_tail(&e->lru, &jbmt_pc_reap_list);
	spin_unlock(&jbmt_pc_lock);
	queue_work(system_unbound_wq, &jbmt_pc_reap_work);
}

static void jbmt_pc_reap(struct work_struct *w)
{
	struct jbmt_pc_ent *e;
	LIST_HEAD(list);

	spin_lock(&jbmt_pc_lock);
	list_splice_init(&jbmt_pc_reap_list, &list);
	spin_unlock(&jbmt_pc_lock);
	while ((e = list_first_entry_or_null(&list, struct jbmt_pc_ent, lru))) {
		list_del(&e->lru);
		mmu_interval_notifier_remove(&e->sub);
		kfree(e);
		cond_resched();
	}
}

/* the range's mapping is about to change: it is not used again */
static bool jbmt_pc_invalidate(struct mmu_interval_notifier *sub,
			       const struct mmu_notifier_range *range,
			       unsigned long cur_seq)
{
	struct jbmt_pc_ent *e = container_of(sub, struct jbmt_pc_ent, sub);
	bool was_alive, release;

	spin_lock(&jbmt_pc_lock);
	mmu_interval_set_seq(sub, cur_seq);
	was_alive = !e->dead;
	release = jbmt_pc_kill_locked(e);
	spin_unlock(&jbmt_pc_lock);
	if (was_alive)
		atomic64_inc(&jbmt_pin_st.pin_cache_stale);
	if (release)
		jbmt_pc_release(e);
	return true;
}

static const struct mmu_interval_notifier_ops jbmt_pc_ops = {
	.invalidate = jbmt_pc_invalidate,
};

static struct jbmt_pc_ent *jbmt_pc_find_locked(struct mm_struct *mm,
					       enum jbmt_side side,
					       const void *owner, u64 start,
					       unsigned int n, bool write)
{
	u64 end = start + ((u64)n << PAGE_SHIFT);
	struct jbmt_pc_ent *e;
	int i;

	/* a range covering start begins in start's chunk or the one before */
	for (i = 0; i < 2; i++) {
		u64 chunk = start - ((u64)i << JBMT_PC_CHUNK_SHIFT);

		if (i && start < (1ULL << JBMT_PC_CHUNK_SHIFT))
			break;
		hlist_for_each_entry(e, jbmt_pc_bucket(mm, chunk), hnode) {
			if (e->mm == mm && e->side == side &&
			    (!owner || e->owner == owner) &&
			    (e->write || !write) && e->start <= start &&
			    e->start + ((u64)e->npages << PAGE_SHIFT) >= end &&
			    !mmu_interval_check_retry(&e->sub, e->seq))
				return e;
		}
	}
	return NULL;
}

static struct jbmt_pc_ent *jbmt_pc_lookup(struct mm_struct *mm,
					  enum jbmt_side side,
					  const void *owner, u64 addr,
					  unsigned int n, bool write)
{
	struct jbmt_pc_ent *e;

	if (!READ_ONCE(jbmt_pin_cache))
		return NULL;
	spin_lock(&jbmt_pc_lock);
	e = jbmt_pc_find_locked(mm, side, owner, addr & PAGE_MASK, n, write);
	if (e && !e->users++) {
		list_del_init(&e->lru);
		atomic64_sub(e->npages, &jbmt_pin_st.pin_cache_idle_pages);
	}
	spin_unlock(&jbmt_pc_lock);
	return e;
}

struct jbmt_pc_ent *jbmt_pc_get(struct mm_struct *mm, enum jbmt_side side,
				const void *owner, u64 addr, unsigned int n,
				bool write)
{
	struct jbmt_pc_ent *e = jbmt_pc_lookup(mm, side, owner, addr, n, write);

	if (e)
		atomic64_inc(&jbmt_pin_st.pin_cache_hits);
	return e;
}

/*
 * Ranges served without the cache lately, by a hash of what names them:
 * a range is cached the second time it is served, so that a stream that
 * never comes back costs no cache fill (nor the work item that makes it),
 * and pins nothing once its sections end.
 */
#define JBMT_PC_SEEN_BITS	8
static u64 jbmt_pc_seen_keys[1 << JBMT_PC_SEEN_BITS];

static u64 *jbmt_pc_seen_slot(struct mm_struct *mm, u64 addr, unsigned int n,
			      bool write, u64 *key)
{
	*key = (u64)(unsigned long)mm ^ (addr & PAGE_MASK) ^ ((u64)n << 1) ^
	       write;
	return &jbmt_pc_seen_keys[hash_64(*key, JBMT_PC_SEEN_BITS)];
}

bool jbmt_pc_seen(struct mm_struct *mm, u64 addr, unsigned int n, bool write)
{
	u64 key, *slot = jbmt_pc_seen_slot(mm, addr, n, write, &key);

	return READ_ONCE(*slot) == key;
}

void jbmt_pc_note(struct mm_struct *mm, u64 addr, unsigned int n, bool write)
{
	u64 key, *slot = jbmt_pc_seen_slot(mm, addr, n, write, &key);

	WRITE_ONCE(*slot, key);
}

struct page **jbmt_pc_pages(struct jbmt_pc_ent *e, u64 addr)
{
	return &e->pages[((addr & PAGE_MASK) - e->start) >> PAGE_SHIFT];
}

bool jbmt_pc_enabled(void)
{
	return READ_ONCE(jbmt_pin_cache);
}

struct jbmt_pc_ent *jbmt_pc_fill(struct mm_struct *mm, enum jbmt_side side,
				 const void *owner,
				 struct rdmaplus_jbmt_ctx *ctx, u64 addr,
				 unsigned int n, bool write, int *err)
{
	u64 start = addr & PAGE_MASK;
	struct jbmt_pc_ent *e;
	unsigned long seq;
	int ret, tries;

	atomic64_inc(&jbmt_pin_st.pin_cache_misses);
	e = kzalloc(struct_size(e, pages, n), GFP_KERNEL_ACCOUNT);
	if (!e) {
		*err = -ENOMEM;
		return NULL;
	}
	INIT_HLIST_NODE(&e->hnode);
	INIT_LIST_HEAD(&e->lru);
	e->mm = mm;
	e->owner = owner;
	e->ctx = ctx;
	e->start = start;
	e->npages = n;
	e->side = side;
	e->write = write;
	e->users = 1;
	if (!mmget_not_zero(mm)) {
		kfree(e);
		*err = -EFAULT;
		return NULL;
	}
	ret = mmu_interval_notifier_insert(&e->sub, mm, start,
					   (u64)n << PAGE_SHIFT, &jbmt_pc_ops);
	mmput(mm);
	if (ret) {
		kfree(e);
		*err = ret;
		return NULL;
	}
	for (tries = 0; tries < 4; tries++) {
		seq = mmu_interval_read_begin(&e->sub);
		ret = jbmt_pin(mm, start, n, write, false, e->pages);
		if (ret)
			break;
		spin_lock(&jbmt_pc_lock);
		if (!mmu_interval_read_retry(&e->sub, seq)) {
			e->seq = seq;
			hlist_add_head(&e->hnode, jbmt_pc_bucket(mm, start));
			spin_unlock(&jbmt_pc_lock);
			atomic64_add(n, &jbmt_pin_st.pin_cache_pages);
			return e;
		}
		spin_unlock(&jbmt_pc_lock);
		jbmt_unpin(e->pages, n, false);	/* changed meanwhile */
		ret = -EAGAIN;
	}
	mmu_interval_notifier_remove(&e->sub);
	kfree(e);
	*err = ret;
	return NULL;
}

/* whether side holds more than its budget (a section served alone did) */
static bool jbmt_over_budget(enum jbmt_side side)
{
	long pinned = side == JBMT_SIDE_OP ? READ_ONCE(jbmt_op_pinned) :
		      READ_ONCE(jbmt_served_pinned);

	return pinned > (long)jbmt_pin_budget();
}

void jbmt_pc_put(struct jbmt_pc_ent *e)
{
	bool over = jbmt_over_budget(e->side), release = false;

	spin_lock(&jbmt_pc_lock);
	if (--e->users == 0) {
		if (e->dead || over) {
			/* a cached range never keeps its side over budget */
			e->dead = true;
			hlist_del_init(&e->hnode);
			release = true;
		} else {
			list_add_tail(&e->lru, &jbmt_pc_idle[e->side]);
			atomic64_add(e->npages,
				     &jbmt_pin_st.pin_cache_idle_pages);
		}
	}
	spin_unlock(&jbmt_pc_lock);
	if (release)
		jbmt_pc_release(e);
}

/*
 * Release idle ranges of side, the oldest first (owner's only, when not
 * NULL), until pages are given back: how many were.
 */
static unsigned int jbmt_pc_evict(enum jbmt_side side, const void *owner,
				  unsigned int pages)
{
	struct jbmt_pc_ent *e, *tmp;
	unsigned int freed = 0;
	LIST_HEAD(list);

	spin_lock(&jbmt_pc_lock);
	list_for_each_entry_safe(e, tmp, &jbmt_pc_idle[side], lru) {
		if (freed >= pages)
			break;
		if (owner && e->owner != owner)
			continue;
		jbmt_pc_kill_locked(e);
		list_add_tail(&e->lru, &list);
		freed += e->npages;
	}
	spin_unlock(&jbmt_pc_lock);
	while ((e = list_first_entry_or_null(&list, struct jbmt_pc_ent, lru))) {
		list_del_init(&e->lru);
		atomic64_inc(&jbmt_pin_st.pin_cache_evicted);
		jbmt_pc_release(e);
	}
	return freed;
}

void jbmt_pc_drop_owner(const void *owner)
{
	struct jbmt_pc_ent *e;
	struct hlist_node *tmp;
	unsigned int b;
	LIST_HEAD(list);

	for (b = 0; b < ARRAY_SIZE(jbmt_pc_hash); b++) {
		spin_lock(&jbmt_pc_lock);
		hlist_for_each_entry_safe(e, tmp, &jbmt_pc_hash[b], hnode) {
			if (e->owner == owner && jbmt_pc_kill_locked(e))
				list_add_tail(&e->lru, &list);
		}
		spin_unlock(&jbmt_pc_lock);
		while ((e = list_first_entry_or_null(&list, struct jbmt_pc_ent,
						     lru))) {
			list_del_init(&e->lru);
			jbmt_pc_release(e);
		}
		cond_resched();
	}
}

int jbmt_pc_advise(struct mm_struct *mm, enum jbmt_side side,
		   const void *owner, struct rdmaplus_jbmt_ctx *ctx, u64 addr,
		   u64 len, bool write, u64 *done)
{
	struct jbmt_pc_ent *e;
	unsigned int n, got;
	u64 a, bytes;
	bool own;
	int err;

	for (*done = 0; *done < len && jbmt_pc_enabled(); *done += bytes) {
		a = addr + *done;
		bytes = min_t(u64, len - *done,
			      JBMT_SECT_BYTES - offset_in_page(a));
		n = jbmt_span(a, bytes);
		if (n > jbmt_pin_budget())
			return 0;
		e = jbmt_pc_lookup(mm, side, side == JBMT_SIDE_OP ? owner :
				   NULL, a, n, write);
		if (!e) {
			/* free budget only: a hint takes nobody's pages */
			if (side == JBMT_SIDE_OP) {
				got = jbmt_budget_try(ctx, n, &own);
				if (got < n) {
					jbmt_budget_give(ctx, got);
					return 0;
				}
			} else if (!jbmt_serve_try(n)) {
				return 0;
			}
			e = jbmt_pc_fill(mm, side, owner, ctx, a, n, write,
					 &err);
			if (!e) {
				if (side == JBMT_SIDE_OP)
					jbmt_budget_give(ctx, n);
				else
					jbmt_serve_give(n);
				return err == -EAGAIN ? 0 : err;
			}
		}
		jbmt_pc_put(e);
		if (fatal_signal_pending(current)) {
			*done += bytes;
			return -EINTR;
		}
		cond_resched();
	}
	return 0;
}

static void jbmt_pc_drop_idle(void)
{
	jbmt_pc_evict(JBMT_SIDE_OP, NULL, UINT_MAX);
	jbmt_pc_evict(JBMT_SIDE_SERVE, NULL, UINT_MAX);
}

/* turning the cache off gives back what it holds */
static int jbmt_pin_cache_set(const char *val, const struct kernel_param *kp)
{
	int ret = param_set_bool(val, kp);

	if (!ret && !READ_ONCE(jbmt_pin_cache))
		jbmt_pc_drop_idle();
	return ret;
}

static const struct kernel_param_ops jbmt_pin_cache_ops = {
	.set = jbmt_pin_cache_set,
	.get = param_get_bool,
};
module_param_cb(jbmt_pin_cache, &jbmt_pin_cache_ops, &jbmt_pin_cache, 0644);
MODULE_PARM_DESC(jbmt_pin_cache, "keep sections pinned after they end, for reuse while their mapping is unchanged (default Y)");

/* a smaller budget gives back the idle cached ranges beyond it */
static int jbmt_budget_set(const char *val, const struct kernel_param *kp)
{
	long over_op, over_served;
	int ret = param_set_uint(val, kp);

	if (ret)
		return ret;
	spin_lock(&jbmt_budget_lock);
	over_op = jbmt_op_pinned - (long)jbmt_pin_budget();
	over_served = jbmt_served_pinned - (long)jbmt_pin_budget();
	spin_unlock(&jbmt_budget_lock);
	if (over_op > 0)
		jbmt_pc_evict(JBMT_SIDE_OP, NULL, over_op);
	if (over_served > 0)
		jbmt_pc_evict(JBMT_SIDE_SERVE, NULL, over_served);
	return 0;
}

/* ---- the shrinker ------------------------------------------------------- */

static unsigned long jbmt_pc_count(struct shrinker *s,
				   struct shrink_control *sc)
{
	return atomic64_read(&jbmt_pin_st.pin_cache_idle_pages) ?: SHRINK_EMPTY;
}

static unsigned long jbmt_pc_scan(struct shrinker *s, struct shrink_control *sc)
{
	unsigned long freed;

	freed = jbmt_pc_evict(JBMT_SIDE_OP, NULL, sc->nr_to_scan);
	if (freed < sc->nr_to_scan)
		freed += jbmt_pc_evict(JBMT_SIDE_SERVE, NULL,
				       sc->nr_to_scan - freed);
	return freed ?: SHRINK_STOP;
}

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 7, 0)
static struct shrinker *jbmt_pc_shrinker;

static int jbmt_pc_shrinker_add(void)
{
	jbmt_pc_shrinker = shrinker_alloc(0, "rdmaplus-jbmt");
	if (!jbmt_pc_shrinker)
		return -ENOMEM;
	jbmt_pc_shrinker->count_objects = jbmt_pc_count;
	jbmt_pc_shrinker->scan_objects = jbmt_pc_scan;
	shrinker_register(jbmt_pc_shrinker);
	return 0;
}

static void jbmt_pc_shrinker_del(void)
{
	shrinker_free(jbmt_pc_shrinker);
}
#else
static struct shrinker jbmt_pc_shrinker_s = {
	.count_objects = jbmt_pc_count,
	.scan_objects = jbmt_pc_scan,
	.seeks = DEFAULT_SEEKS,
};

static int jbmt_pc_shrinker_add(void)
{
	return register_shrinker(&jbmt_pc_shrinker_s, "rdmaplus-jbmt");
}

static void jbmt_pc_shrinker_del(void)
{
	unregister_shrinker(&jbmt_pc_shrinker_s);
}
#endif

/* ---- sysfs and load ----------------------------------------------------- */

#define JBMT_PIN_ATTR(name) \
	RDMAPLUS_COUNTER(jbmt_pin_attr_##name, name, &jbmt_pin_st.name)

JBMT_PIN_ATTR(pinned_pages);
JBMT_PIN_ATTR(pin_cache_hits);
JBMT_PIN_ATTR(pin_cache_misses);
JBMT_PIN_ATTR(pin_cache_stale);
JBMT_PIN_ATTR(pin_cache_evicted);
JBMT_PIN_ATTR(pin_cache_pages);
JBMT_PIN_ATTR(pin_cache_idle_pages);

/* pages pinned now and their high-water marks, per side */
static long *jbmt_pin_gauge(const char *name)
{
	if (!strcmp(name, "op_pinned_pages"))
		return &jbmt_op_pinned;
	if (!strcmp(name, "served_pinned_pages"))
		return &jbmt_served_pinned;
	if (!strcmp(name, "op_pinned_hwm"))
		return &jbmt_op_hwm;
	return &jbmt_served_hwm;
}

static ssize_t jbmt_pin_show(struct kobject *kobj, struct kobj_attribute *attr,
			     char *buf)
{
	long v;

	spin_lock(&jbmt_budget_lock);
	v = *jbmt_pin_gauge(attr->attr.name);
	spin_unlock(&jbmt_budget_lock);
	return sysfs_emit(buf, "%ld\n", v);
}

/* writing 0 to a high-water mark sets it to what is pinned now */
static ssize_t jbmt_hwm_store(struct kobject *kobj,
			      struct kobj_attribute *attr, const char *buf,
			      size_t len)
{
	unsigned int v;
	int ret = kstrtouint(buf, 0, &v);

	if (ret)
		return ret;
	if (v)
		return -EINVAL;
	spin_lock(&jbmt_budget_lock);
	if (!strcmp(attr->attr.name, "op_pinned_hwm"))
		jbmt_op_hwm = jbmt_op_pinned;
	else
		jbmt_served_hwm = jbmt_served_pinned;
	spin_unlock(&jbmt_budget_lock);
	return len;
}

static ssize_t jbmt_budget_show(struct kobject *kobj,
				struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", jbmt_pin_budget());
}

/* the budget in force (the module parameter, at least 1) */
static struct kobj_attribute jbmt_attr_budget =
	__ATTR(pin_budget_pages, 0444, jbmt_budget_show, NULL);
static struct kobj_attribute jbmt_attr_op_pinned =
	__ATTR(op_pinned_pages, 0444, jbmt_pin_show, NULL);
static struct kobj_attribute jbmt_attr_served_pinned =
	__ATTR(served_pinned_pages, 0444, jbmt_pin_show, NULL);
static struct kobj_attribute jbmt_attr_op_hwm =
	__ATTR(op_pinned_hwm, 0644, jbmt_pin_show, jbmt_hwm_store);
static struct kobj_attribute jbmt_attr_served_hwm =
	__ATTR(served_pinned_hwm, 0644, jbmt_pin_show, jbmt_hwm_store);

static struct attribute *jbmt_pin_attrs[] = {
	&jbmt_pin_attr_pinned_pages.kattr.attr,
	&jbmt_pin_attr_pin_cache_hits.kattr.attr,
	&jbmt_pin_attr_pin_cache_misses.kattr.attr,
	&jbmt_pin_attr_pin_cache_stale.kattr.attr,
	&jbmt_pin_attr_pin_cache_evicted.kattr.attr,
	&jbmt_pin_attr_pin_cache_pages.kattr.attr,
	&jbmt_pin_attr_pin_cache_idle_pages.kattr.attr,
	&jbmt_attr_budget.attr,
	&jbmt_attr_op_pinned.attr,
	&jbmt_attr_served_pinned.attr,
	&jbmt_attr_op_hwm.attr,
	&jbmt_attr_served_hwm.attr,
	NULL,
};

/* merged into registration's /sys/kernel/rdmaplus/jbmt */
static const struct attribute_group jbmt_pin_group = {
	.name = "jbmt",
	.attrs = jbmt_pin_attrs,
};

int jbmt_pin_init(void)
{
	int ret = jbmt_pc_shrinker_add();

	if (ret)
		return ret;
	ret = sysfs_merge_group(rdmaplus_kobj(), &jbmt_pin_group);
	if (ret)
		jbmt_pc_shrinker_del();
	return ret;
}

/* Every connection and file is gone: no section uses a range. */
void jbmt_pin_exit(void)
{
	jbmt_pc_drop_idle();
	flush_work(&jbmt_pc_reap_work);
	jbmt_pc_shrinker_del();
	WARN_ON(atomic64_read(&jbmt_pin_st.pinned_pages));
	sysfs_unmerge_group(rdmaplus_kobj(), &jbmt_pin_group);
}
