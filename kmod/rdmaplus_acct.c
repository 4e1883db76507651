// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus accounting: what one user may hold of the module's memory and
 * host-wide ids (docs/kmod.md, "Resource model").
 *
 * /dev/rdmaplus is open to every user, so nothing a process makes is
 * free: memory the module keeps for it (mapped rings and areas, buffer
 * records) counts against the user's RLIMIT_MEMLOCK, as io_uring's rings
 * do, unless the process has CAP_IPC_LOCK; and ids that the whole host
 * shares (Active Access domains, mailbox keys) have a per-user cap, so
 * that one user cannot take them all (EDQUOT beyond it).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/cred.h>
#include <linux/hashtable.h>
#include <linux/moduleparam.h>
#include <linux/refcount.h>
#include <linux/sched/signal.h>
#include <linux/sched/user.h>
#include <linux/slab.h>
#include <linux/spinlock.h>

#include "rdmaplus.h"

static unsigned int max_domains_per_user = 256;
module_param(max_domains_per_user, uint, 0644);
MODULE_PARM_DESC(max_domains_per_user,
		 "Active Access domains one user may hold (EDQUOT beyond; the host has 1024)");

static unsigned int max_mbkeys_per_user = 4096;
module_param(max_mbkeys_per_user, uint, 0644);
MODULE_PARM_DESC(max_mbkeys_per_user,
		 "RVMA mailbox keys one user may hold (EDQUOT beyond; the host has 1048575)");

static unsigned int max_jbmt_regions_per_user = 65536;
module_param(max_jbmt_regions_per_user, uint, 0644);
MODULE_PARM_DESC(max_jbmt_regions_per_user,
		 "JBMT regions one user may hold (EDQUOT beyond; the host has 16777215)");

static unsigned int *const caps[RDMAPLUS_NRES] = {
	[RDMAPLUS_RES_DOMAIN] = &max_domains_per_user,
	[RDMAPLUS_RES_MBKEY] = &max_mbkeys_per_user,
	[RDMAPLUS_RES_JBMT_REGION] = &max_jbmt_regions_per_user,
};

struct rdmaplus_user {
	struct hlist_node node;		/* users, under users_lock */
	kuid_t uid;
	refcount_t ref;			/* open files, kept memory */
	struct user_struct *user;	/* its locked_vm is charged */
	atomic_t held[RDMAPLUS_NRES];
};

static DEFINE_SPINLOCK(users_lock);
static DEFINE_HASHTABLE(users, 6);

/* The calling process's user, with a reference. May sleep. */
struct rdmaplus_user *rdmaplus_user_get(void)
{
	kuid_t uid = current_uid();
	struct rdmaplus_user *u, *fresh;

	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL_ACCOUNT);
	if (!fresh)
		return ERR_PTR(-ENOMEM);
	spin_lock(&users_lock);
	hash_for_each_possible(users, u, node, __kuid_val(uid))
		if (uid_eq(u->uid, uid) && refcount_inc_not_zero(&u->ref))
			goto found;
	u = fresh;
	fresh = NULL;
	u->uid = uid;
	u->user = get_uid(current_user());
	refcount_set(&u->ref, 1);
	hash_add(users, &u->node, __kuid_val(uid));
found:
	spin_unlock(&users_lock);
	kfree(fresh);
	return u;
}

/* Another reference on u, which the caller holds. */
void rdmaplus_user_get_ref(struct rdmaplus_user *u)
{
	refcount_inc(&u->ref);
}

void rdmaplus_user_put(struct rdmaplus_user *u)
{
	if (!refcount_dec_and_lock(&u->ref, &users_lock))
		return;
	hash_del(&u->node);
	spin_unlock(&users_lock);
	WARN_ON(atomic_read(&u->held[RDMAPLUS_RES_DOMAIN]) ||
		atomic_read(&u->held[RDMAPLUS_RES_MBKEY]) ||
		atomic_read(&u->held[RDMAPLUS_RES_JBMT_REGION]));
	free_uid(u->user);
	kfree(u);
}

/* One more of res for u: 0, or -EDQUOT at the user's cap. */
int rdmaplus_user_take(struct rdmaplus_user *u, enum rdmaplus_res res)
{
	unsigned int cap = READ_ONCE(*caps[res]);

	if (!atomic_add_unless(&u->held[res], 1, cap))
		return -EDQUOT;
	/* a cap lowered below what is held: the add went through at once */
	if (atomic_read(&u->held[res]) > cap) {
		atomic_dec(&u->held[res]);
		return -EDQUOT;
	}
	return 0;
}

void rdmaplus_user_give(struct rdmaplus_user *u, enum rdmaplus_res res)
{
	WARN_ON_ONCE(atomic_dec_return(&u->held[res]) < 0);
}

/*
 * Charge pages of kernel memory kept for the calling process to u's
 * RLIMIT_MEMLOCK: returns the pages charged (0 with CAP_IPC_LOCK, which
 * pays nothing), or -ENOMEM beyond the limit. Give them back with
 * rdmaplus_uncharge() with the same count.
 */
long rdmaplus_charge(struct rdmaplus_user *u, unsigned long pages)
{
	unsigned long limit = rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
	unsigned long cur, new;

	if (capable(CAP_IPC_LOCK))
		return 0;
	cur = atomic_long_read(&u->user->locked_vm);
	do {
		new = cur + pages;
		if (new > limit || new < cur)
			return -ENOMEM;
	} while (!atomic_long_try_cmpxchg(&u->user->locked_vm, &cur, new));
	return pages;
}

/* Any context: uncharging takes no lock. */
void rdmaplus_uncharge(struct rdmaplus_user *u, unsigned long pages)
{
	if (pages)
		atomic_long_sub(pages, &u->user->locked_vm);
}
