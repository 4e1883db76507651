// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus JBMT's asynchronous operations (docs/jbmt.md): a process sets up
 * a completion ring once (RDMAPLUS_IOC_JBMT_SETUP) and maps it; it hands
 * operations over in batches (RDMAPLUS_IOC_JBMT_SUBMIT, the doorbell), and
 * learns of each end from an entry in the ring, with the eventfd it gave
 * signalled: no system call per completion. An operation of one section
 * (a get, or a small put) whose credit and budget are free starts in the
 * submitting call and ends in its answer's completion handler, which posts
 * its entry; any other runs in a work item with the engine of the blocking
 * call, pinning the process's pages through its mm. Operations in flight and completions not yet consumed
 * together never exceed the ring's entries, so the ring cannot overflow.
 * Closing the file cancels what is in flight (-ECANCELED) and waits for it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/eventfd.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"
#include "rdmaplus_jbmt.h"

#define JBMT_PGOFF		0x200000UL

struct jbmt_ring {
	struct rdmaplus_jbmt_ring *hdr;	/* vmalloc_user: header, then CQEs */
	struct rdmaplus_jbmt_cqe *cqes;
	size_t bytes;
	unsigned long charged;		/* pages in the user's locked_vm */
	u32 entries;
	u32 tail;			/* ours: the header's is the process's copy */
	u32 inflight;			/* under lock: completions to come */
	spinlock_t lock;
	/*
	 * Operations not yet done with the ring: its last access, so that a
	 * release waiting for 0 may free it at once (wake_up_var() only
	 * hashes the address).
	 */
	atomic_t pending;
	struct eventfd_ctx *evt;
};

struct jbmt_aop {
	struct work_struct work;
	struct rdmaplus_jbmt_ctx *ctx;
	struct mm_struct *mm;		/* mmgrab()bed */
	struct rdmaplus_jbmt_op op;
	u64 user_data;
	struct jbmt_op_times times;
};

static struct workqueue_struct *jbmt_op_wq;

static struct {
	atomic64_t submitted;		/* asynchronous operations, since load */
	atomic64_t completed;
	atomic64_t direct;		/* started in the submitting call */
} jbmt_ring_st;

#define JBMT_RING_ATTR(name) \
	RDMAPLUS_COUNTER(jbmt_ring_attr_##name, async_##name, \
			 &jbmt_ring_st.name)

JBMT_RING_ATTR(submitted);
JBMT_RING_ATTR(completed);
JBMT_RING_ATTR(direct);

static struct attribute *jbmt_ring_attrs[] = {
	&jbmt_ring_attr_submitted.kattr.attr,
	&jbmt_ring_attr_completed.kattr.attr,
	&jbmt_ring_attr_direct.kattr.attr,
	NULL,
};

/* merged into registration's /sys/kernel/rdmaplus/jbmt */
static const struct attribute_group jbmt_ring_group = {
	.name = "jbmt",
	.attrs = jbmt_ring_attrs,
};

/* Post op's completion and signal the process. */
static void jbmt_ring_post(struct jbmt_ring *r, struct jbmt_aop *aop, long ret)
{
	struct rdmaplus_jbmt_cqe *cqe;

	spin_lock(&r->lock);
	cqe = &r->cqes[r->tail & (r->entries - 1)];
	cqe->user_data = aop->user_data;
	cqe->status = ret;
	cqe->reserved = 0;
	cqe->done = aop->op.done;
	cqe->t_submit = aop->times.submit;
	cqe->t_start = aop->times.start;
	cqe->t_first = aop->times.first;
	cqe->t_end = aop->times.end;
	cqe->reserved2 = 0;
	r->tail++;
	/* the entry is whole before the process can see it */
	smp_store_release(&r->hdr->cq_tail, r->tail);
	r->inflight--;
	if (r->evt)
		rdmaplus_eventfd_signal(r->evt);
	spin_unlock(&r->lock);
	atomic64_inc(&jbmt_ring_st.completed);
	if (atomic_dec_and_test(&r->pending))
		wake_up_var(&r->pending);
}

static void jbmt_aop_work(struct work_struct *w)
{
	struct jbmt_aop *aop = container_of(w, struct jbmt_aop, work);
	struct rdmaplus_jbmt_ctx *ctx = aop->ctx;
	long ret;

	aop->times.start = ktime_get_ns();
	if (jbmt_op_aborted(ctx))
		ret = -ECANCELED;
	else
		ret = jbmt_op_exec(ctx, aop->mm, &aop->op, &aop->times);
	aop->times.end = ktime_get_ns();
	mmdrop(aop->mm);
	jbmt_ring_post(ctx->ring, aop, ret);
	kfree(aop);
}

/* a direct operation's end, in completion context */
static void jbmt_aop_direct_end(void *arg, long ret, bool again)
{
	struct jbmt_aop *aop = arg;

	if (again) {		/* NACKed: a worker runs it whole */
		queue_work(jbmt_op_wq, &aop->work);
		return;
	}
	aop->times.end = ktime_get_ns();
	mmdrop(aop->mm);
	jbmt_ring_post(aop->ctx->ring, aop, ret);
	kfree(aop);
}

long jbmt_ring_setup(struct rdmaplus_jbmt_ctx *ctx, void __user *arg)
{
	struct rdmaplus_jbmt_setup a;
	struct eventfd_ctx *evt = NULL;
	struct jbmt_ring *r;
	long charged, ret;
	size_t bytes;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (a.flags || a.mmap_offset || a.mmap_bytes || !a.cq_entries ||
	    a.cq_entries > RDMAPLUS_JBMT_MAX_CQ || !is_power_of_2(a.cq_entries))
		return -EINVAL;
	bytes = PAGE_ALIGN(sizeof(struct rdmaplus_jbmt_ring) +
			   (size_t)a.cq_entries * sizeof(struct rdmaplus_jbmt_cqe));
	if (a.eventfd >= 0) {
		evt = eventfd_ctx_fdget(a.eventfd);
		if (IS_ERR(evt))
			return PTR_ERR(evt);
	} else if (a.eventfd != -1) {
		return -EINVAL;
	}
	ret = -ENOMEM;
	r = kzalloc(sizeof(*r), GFP_KERNEL_ACCOUNT);
	if (!r)
		goto err_evt;
	charged = rdmaplus_charge(ctx->user, bytes >> PAGE_SHIFT);
	if (charged < 0) {
		ret = charged;
		goto err_r;
	}
	r->charged = charged;
	r->hdr = vmalloc_user(bytes);
	if (!r->hdr)
		goto err_charge;
	r->bytes = bytes;
	r->cqes = (void *)(r->hdr + 1);
	r->entries = a.cq_entries;
	r->hdr->cq_entries = a.cq_entries;
	r->evt = evt;
	spin_lock_init(&r->lock);

	mutex_lock(&ctx->mutex);
	if (ctx->ring) {
		mutex_unlock(&ctx->mutex);
		ret = -EBUSY;	/* one ring per file */
		goto err_mem;
	}
	/* whole before another thread's submit or mmap finds it */
	smp_store_release(&ctx->ring, r);
	mutex_unlock(&ctx->mutex);
	a.mmap_offset = JBMT_PGOFF << PAGE_SHIFT;
	a.mmap_bytes = bytes;
	return rdmaplus_copy_out(arg, &a, sizeof(a));

err_mem:
	vfree(r->hdr);
err_charge:
	rdmaplus_uncharge(ctx->user, r->charged);
err_r:
	kfree(r);
err_evt:
	if (evt)
		eventfd_ctx_put(evt);
	return ret;
}

long jbmt_ring_submit(struct rdmaplus_jbmt_ctx *ctx, void __user *arg)
{
	struct rdmaplus_jbmt_submit a;
	struct rdmaplus_jbmt_sqe sqe;
	struct jbmt_ring *r;
	u32 taken = 0, unread;
	long ret;

	ret = rdmaplus_copy_in(&a, sizeof(a), sizeof(a), arg);
	if (ret)
		return ret;
	if (!a.count)
		return -EINVAL;
	r = smp_load_acquire(&ctx->ring);	/* set once, freed at release */
	if (!r)
		return -ENXIO;
	for (; taken < a.count; taken++) {
		struct jbmt_aop *aop;

		if (copy_from_user(&sqe, u64_to_user_ptr(a.sqes) +
				   (u64)taken * sizeof(sqe), sizeof(sqe))) {
			ret = -EFAULT;
			break;
		}
		aop = kzalloc(sizeof(*aop), GFP_KERNEL_ACCOUNT);
		if (!aop) {
			ret = -ENOMEM;
			break;
		}
		aop->op = (struct rdmaplus_jbmt_op) {
			.size = sizeof(aop->op),
			.op = sqe.op,
			.peer = sqe.peer,
			.timeout_ms = sqe.timeout_ms,
			.addr = sqe.addr,
			.length = sqe.length,
			.token = sqe.token,
			.offset = sqe.offset,
		};
		ret = sqe.flags || sqe.reserved ? -EINVAL :
		      jbmt_op_check(&aop->op);
		if (ret) {
			kfree(aop);
			break;
		}
		/* room for its completion: in flight and unread within the ring */
		spin_lock(&r->lock);
		unread = min(r->tail - READ_ONCE(r->hdr->cq_head), r->entries);
		if (r->inflight + unread >= r->entries) {
			spin_unlock(&r->lock);
			kfree(aop);
			ret = -EBUSY;
			break;
		}
		r->inflight++;
		atomic_inc(&r->pending);
		spin_unlock(&r->lock);
		INIT_WORK(&aop->work, jbmt_aop_work);
		aop->ctx = ctx;
		aop->mm = current->mm;
		mmgrab(aop->mm);
		aop->user_data = sqe.user_data;
		aop->times.submit = ktime_get_ns();
		atomic64_inc(&jbmt_ring_st.submitted);
		if (!jbmt_op_aborted(ctx) &&
		    !jbmt_op_start_direct(ctx, &aop->op, &aop->times,
					  jbmt_aop_direct_end, aop)) {
			atomic64_inc(&jbmt_ring_st.direct);
			continue;	/* aop may be gone already */
		}
		queue_work(jbmt_op_wq, &aop->work);
	}
	if (!taken)
		return ret;
	a.count = taken;
	return rdmaplus_copy_out(arg, &a, sizeof(a));
}

bool rdmaplus_jbmt_owns_pgoff(unsigned long pgoff)
{
	return pgoff == JBMT_PGOFF;
}

int rdmaplus_jbmt_mmap(struct rdmaplus_jbmt_ctx *ctx, struct vm_area_struct *vma)
{
	/* pairs with the setup's release: the ring is whole */
	struct jbmt_ring *r = smp_load_acquire(&ctx->ring);

	if (!r)
		return -ENXIO;
	if (vma->vm_end - vma->vm_start != r->bytes)
		return -EINVAL;
	/* the mapping holds the file, so the ring outlives it */
	return remap_vmalloc_range(vma, r->hdr, 0);
}

/*
 * The file is closing (no ioctl runs, no mapping is left): operations in
 * flight see ctx closing within a slice and end; wait for them, free.
 */
void jbmt_ring_release(struct rdmaplus_jbmt_ctx *ctx)
{
	struct jbmt_ring *r = ctx->ring;

	WRITE_ONCE(ctx->closing, true);
	if (!r)
		return;
	wait_var_event(&r->pending, !atomic_read(&r->pending));
	if (r->evt)
		eventfd_ctx_put(r->evt);
	vfree(r->hdr);
	rdmaplus_uncharge(ctx->user, r->charged);
	kfree(r);
	ctx->ring = NULL;
}

int jbmt_ring_init(void)
{
	int ret;

	jbmt_op_wq = alloc_workqueue("rdmaplus_jbmt_op", WQ_UNBOUND, 0);
	if (!jbmt_op_wq)
		return -ENOMEM;
	ret = sysfs_merge_group(rdmaplus_kobj(), &jbmt_ring_group);
	if (ret)
		destroy_workqueue(jbmt_op_wq);
	return ret;
}

/* No file is open: no operation is in flight. */
void jbmt_ring_exit(void)
{
	destroy_workqueue(jbmt_op_wq);
	sysfs_unmerge_group(rdmaplus_kobj(), &jbmt_ring_group);
}
