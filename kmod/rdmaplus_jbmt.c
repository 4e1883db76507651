// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus JBMT: registration of memory that is never pinned for long
 * (docs/jbmt.md). A region is a range of a process's address space with
 * rights; registering it pins nothing and takes the same time at any
 * size. Its token {id, gen, key} names it to any host: the id finds it in
 * a host-wide table, the generation tells a reused id, and the key, a
 * keyed hash of both under a secret drawn at load, makes a token
 * impossible to guess from another and lets the host tell a token it
 * issued and revoked (stale) from one it never issued, remembering
 * nothing. The service needs no rxe hook and works the same on every RDMA
 * device.
 *
 * Regions are found by id under RCU; a file's regions are revoked when it
 * is closed. Each region holds its process's mm_struct (mmgrab: not the
 * address space, which may go with the process), where transfers find the
 * pages, and a reference per section on it: revoking waits for them.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kobject.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/random.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/siphash.h>
#include <linux/slab.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"
#include "rdmaplus_jbmt.h"

/* id -> region, host-wide; readers under RCU */
static DEFINE_XARRAY_ALLOC1(jbmt_regions);
static u32 jbmt_next_id;		/* xa_alloc_cyclic's cursor */
/* generations: a token carries the low 32 bits, its key hashes all 64 */
static atomic64_t jbmt_gen = ATOMIC64_INIT(0);
static siphash_key_t jbmt_token_secret;	/* drawn at load */

static struct {
	atomic64_t regions;		/* registered now */
	atomic64_t registered_bytes;	/* their bytes */
	atomic64_t registrations;	/* since load */
	atomic64_t deregistrations;	/* explicit, since load */
	atomic64_t revoked;		/* at a file's release, since load */
} jbmt_st;

/* ---- regions ------------------------------------------------------------ */

static void jbmt_region_free(struct jbmt_region *r)
{
	mmdrop(r->mm);
	kfree_rcu(r, rcu);
}

void jbmt_region_put(struct jbmt_region *r)
{
	if (refcount_dec_and_test(&r->ref))
		jbmt_region_free(r);
	else
		wake_up_var(&r->ref);	/* a revoker may wait */
}

struct jbmt_region *jbmt_region_get(u32 id, u32 gen, u64 key)
{
	struct jbmt_region *r;
	bool gone;

	rcu_read_lock();
	r = xa_load(&jbmt_regions, id);
	if (r && (r->gen != gen || r->key != key ||
		  !refcount_inc_not_zero(&r->ref)))
		r = NULL;
	/*
	 * Revoked between the load and the reference: its revoker may have
	 * seen no section on it, so none may start.
	 */
	gone = r && xa_load(&jbmt_regions, id) != r;
	rcu_read_unlock();
	if (gone) {
		jbmt_region_put(r);
		r = NULL;
	}
	return r;
}

/*
 * The key of the token of id and the 64-bit generation gen, which is never
 * reused: when the 32 bits a token carries wrap, a token of the last round
 * still does not match a region of this one.
 */
static u64 jbmt_token_key(u32 id, u64 gen)
{
	return siphash_3u32(id, lower_32_bits(gen), upper_32_bits(gen),
			    &jbmt_token_secret);
}

/*
 * Whether this host issued {id, gen, key} (since the module was loaded, in
 * this round of the generations or the one before): a token that names no
 * region and was issued has been revoked.
 */
bool jbmt_token_issued(u32 id, u32 gen, u64 key)
{
	u64 now = atomic64_read(&jbmt_gen);
	u64 full = (now & ~(u64)U32_MAX) | gen;

	if (full > now) {	/* not yet issued in this round: the last one's */
		if (!upper_32_bits(full))
			return false;
		full -= 1ULL << 32;
	}
	return key == jbmt_token_key(id, full);
}

/*
 * Take r out of the host's table, wait for the sections on it, and free it
 * after a grace period (a reader that found it under RCU may still look at
 * it); ctx->mutex held. Sections end within a lease, or when their
 * connection goes.
 */
static void jbmt_region_revoke(struct jbmt_region *r)
{
	xa_erase(&jbmt_regions, r->id);
	list_del(&r->node);
	atomic64_dec(&jbmt_st.regions);
	atomic64_sub(r->length, &jbmt_st.registered_bytes);
	rdmaplus_user_give(r->ctx->user, RDMAPLUS_RES_JBMT_REGION);
	wait_var_event(&r->ref, refcount_read(&r->ref) == 1);
	jbmt_pc_drop_owner(r);	/* no section on it is left to cache more */
	jbmt_region_put(r);
}

static long jbmt_reg(struct rdmaplus_jbmt_ctx *ctx, void __user *arg)
{
	struct rdmaplus_jbmt_reg a;
	struct jbmt_region *r;
	u64 gen;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (!a.rights || a.rights & ~RDMAPLUS_JBMT_RIGHTS || !a.length ||
	    a.addr + a.length < a.addr ||
	    !access_ok(u64_to_user_ptr(a.addr), a.length) ||
	    a.token.id || a.token.gen || a.token.key)
		return -EINVAL;
	ret = rdmaplus_user_take(ctx->user, RDMAPLUS_RES_JBMT_REGION);
	if (ret)
		return ret;
	ret = -ENOMEM;
	r = kzalloc(sizeof(*r), GFP_KERNEL_ACCOUNT);
	if (!r)
		goto err_give;
	r->ctx = ctx;
	r->addr = a.addr;
	r->length = a.length;
	r->rights = a.rights;
	gen = atomic64_inc_return(&jbmt_gen);
	r->gen = lower_32_bits(gen);
	r->mm = current->mm;
	mmgrab(r->mm);
	refcount_set(&r->ref, 1);

	mutex_lock(&ctx->mutex);
	/* the id reserved (lookups find nothing), then r published whole */
	ret = xa_alloc_cyclic(&jbmt_regions, &r->id, NULL,
			      XA_LIMIT(1, RDMAPLUS_JBMT_MAX_ID), &jbmt_next_id,
			      GFP_KERNEL_ACCOUNT);
	if (ret < 0) {
		mutex_unlock(&ctx->mutex);
		ret = ret == -EBUSY ? -ENOSPC : ret;
		goto err_free;
	}
	r->key = jbmt_token_key(r->id, gen);
	ret = xa_err(xa_store(&jbmt_regions, r->id, r, GFP_KERNEL_ACCOUNT));
	if (ret) {
		xa_erase(&jbmt_regions, r->id);
		mutex_unlock(&ctx->mutex);
		goto err_free;
	}
	list_add_tail(&r->node, &ctx->regions);
	atomic64_inc(&jbmt_st.regions);
	atomic64_add(r->length, &jbmt_st.registered_bytes);
	a.token.id = r->id;
	a.token.gen = r->gen;
	a.token.key = r->key;
	ret = rdmaplus_copy_out(arg, &a, sizeof(a));
	if (ret)
		jbmt_region_revoke(r);	/* nobody was told its token */
	else
		atomic64_inc(&jbmt_st.registrations);
	mutex_unlock(&ctx->mutex);
	return ret;

err_free:
	jbmt_region_free(r);
err_give:
	rdmaplus_user_give(ctx->user, RDMAPLUS_RES_JBMT_REGION);
	return ret;
}

/*
 * The region of ctx a token names, or NULL (another file's answers as
 * none: tokens cannot be probed); ctx->mutex held, which keeps it.
 */
static struct jbmt_region *jbmt_region_own(struct rdmaplus_jbmt_ctx *ctx,
					   const struct rdmaplus_jbmt_token *t)
{
	struct jbmt_region *r;

	/* another file may free its region meanwhile: look under RCU */
	rcu_read_lock();
	r = xa_load(&jbmt_regions, t->id);
	if (r && (r->ctx != ctx || r->gen != t->gen || r->key != t->key))
		r = NULL;
	rcu_read_unlock();
	return r;
}

static long jbmt_dereg(struct rdmaplus_jbmt_ctx *ctx, void __user *arg)
{
	struct rdmaplus_jbmt_dereg a;
	struct jbmt_region *r;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (a.reserved)
		return -EINVAL;
	mutex_lock(&ctx->mutex);
	r = jbmt_region_own(ctx, &a.token);
	if (r) {
		jbmt_region_revoke(r);
		atomic64_inc(&jbmt_st.deregistrations);
	} else {
		ret = -ENOENT;
	}
	mutex_unlock(&ctx->mutex);
	return ret;
}

/* Pin a local buffer or one of the file's regions ahead of use. */
static long jbmt_advise(struct rdmaplus_jbmt_ctx *ctx, void __user *arg)
{
	struct rdmaplus_jbmt_advise a;
	struct jbmt_region *r;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if ((a.flags & ~RDMAPLUS_JBMT_ADVISE_REGION) || a.reserved ||
	    a.done || !a.length || a.addr + a.length < a.addr)
		return -EINVAL;
	if (!(a.flags & RDMAPLUS_JBMT_ADVISE_REGION)) {
		if (!a.rights || (a.rights & ~RDMAPLUS_JBMT_RIGHTS) ||
		    a.token.id || a.token.gen || a.token.key ||
		    !access_ok(u64_to_user_ptr(a.addr), a.length))
			return -EINVAL;
		ret = jbmt_pc_advise(current->mm, JBMT_SIDE_OP, ctx, ctx,
				     a.addr, a.length,
				     a.rights & RDMAPLUS_JBMT_WRITE, &a.done);
		goto out;
	}
	if (a.rights)
		return -EINVAL;
	mutex_lock(&ctx->mutex);	/* the region stays meanwhile */
	r = jbmt_region_own(ctx, &a.token);
	if (!r)
		ret = -ENOENT;
	else if (a.addr > r->length || a.length > r->length - a.addr)
		ret = -ERANGE;
	else
		ret = jbmt_pc_advise(r->mm, JBMT_SIDE_SERVE, r, NULL,
				     r->addr + a.addr, a.length,
				     r->rights & RDMAPLUS_JBMT_WRITE, &a.done);
	mutex_unlock(&ctx->mutex);
out:
	if (rdmaplus_copy_out(arg, &a, sizeof(a)) && !ret)
		ret = -EFAULT;
	return ret;
}

long rdmaplus_jbmt_ioctl(struct rdmaplus_jbmt_ctx *ctx, unsigned int cmd,
			 void __user *arg)
{
	switch (cmd) {
	case RDMAPLUS_IOC_JBMT_REG:
		return jbmt_reg(ctx, arg);
	case RDMAPLUS_IOC_JBMT_DEREG:
		return jbmt_dereg(ctx, arg);
	case RDMAPLUS_IOC_JBMT_CONNECT:
		return rdmaplus_jbmt_connect(arg);
	case RDMAPLUS_IOC_JBMT_OP:
		return rdmaplus_jbmt_op(ctx, arg);
	case RDMAPLUS_IOC_JBMT_SETUP:
		return jbmt_ring_setup(ctx, arg);
	case RDMAPLUS_IOC_JBMT_SUBMIT:
		return jbmt_ring_submit(ctx, arg);
	case RDMAPLUS_IOC_JBMT_ADVISE:
		return jbmt_advise(ctx, arg);
	default:
		return -ENOIOCTLCMD;
	}
}

/* ---- file --------------------------------------------------------------- */

struct rdmaplus_jbmt_ctx *rdmaplus_jbmt_open(struct rdmaplus_user *u)
{
	struct rdmaplus_jbmt_ctx *ctx = kzalloc(sizeof(*ctx), GFP_KERNEL_ACCOUNT);

	if (!ctx)
		return ERR_PTR(-ENOMEM);
	ctx->user = u;
	mutex_init(&ctx->mutex);
	INIT_LIST_HEAD(&ctx->regions);
	return ctx;
}

/* End the file's operations, revoke every region of the file. */
void rdmaplus_jbmt_release(struct rdmaplus_jbmt_ctx *ctx)
{
	struct jbmt_region *r;

	jbmt_ring_release(ctx);
	jbmt_pc_drop_owner(ctx);	/* its operations have ended */
	mutex_lock(&ctx->mutex);
	while ((r = list_first_entry_or_null(&ctx->regions,
					     struct jbmt_region, node))) {
		jbmt_region_revoke(r);
		atomic64_inc(&jbmt_st.revoked);
		cond_resched();
	}
	mutex_unlock(&ctx->mutex);
	kfree(ctx);
}

/* ---- sysfs: /sys/kernel/rdmaplus/jbmt ----------------------------------- */

#define JBMT_ATTR(name) \
	RDMAPLUS_COUNTER(jbmt_attr_##name, name, &jbmt_st.name)

JBMT_ATTR(regions);
JBMT_ATTR(registered_bytes);
JBMT_ATTR(registrations);
JBMT_ATTR(deregistrations);
JBMT_ATTR(revoked);

static struct attribute *jbmt_attrs[] = {
	&jbmt_attr_regions.kattr.attr,
	&jbmt_attr_registered_bytes.kattr.attr,
	&jbmt_attr_registrations.kattr.attr,
	&jbmt_attr_deregistrations.kattr.attr,
	&jbmt_attr_revoked.kattr.attr,
	NULL,
};

static const struct attribute_group jbmt_attr_group = {
	.name = "jbmt",
	.attrs = jbmt_attrs,
};

int rdmaplus_jbmt_init(void)
{
	int ret;

	get_random_bytes(&jbmt_token_secret, sizeof(jbmt_token_secret));
	ret = sysfs_create_group(rdmaplus_kobj(), &jbmt_attr_group);
	if (ret)
		return ret;
	ret = jbmt_pin_init();
	if (ret)
		goto err_group;
	ret = jbmt_xfer_init();
	if (ret)
		goto err_pin;
	ret = jbmt_ring_init();
	if (ret)
		goto err_xfer;
	ret = rdmaplus_jbmt_net_init();
	if (ret)
		goto err_ring;
	return 0;

err_ring:
	jbmt_ring_exit();
err_xfer:
	jbmt_xfer_exit();
err_pin:
	jbmt_pin_exit();
err_group:
	sysfs_remove_group(rdmaplus_kobj(), &jbmt_attr_group);
	return ret;
}

void rdmaplus_jbmt_exit(void)
{
	rdmaplus_jbmt_net_exit();
	jbmt_ring_exit();
	jbmt_xfer_exit();
	jbmt_pin_exit();
	/* every file is closed: no region is left */
	WARN_ON(!xa_empty(&jbmt_regions));
	sysfs_remove_group(rdmaplus_kobj(), &jbmt_attr_group);
	rcu_barrier();		/* kfree_rcu()s of revoked regions */
}
