// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus rxe layer: everything the module assumes about the kernel's
 * SoftRoCE driver (rdma_rxe), in one place (docs/kmod.md, "Layers").
 *
 * It resolves rxe's functions, registers the data-path hooks (ftrace
 * callbacks at the entry of five rxe functions) while some consumer holds
 * a reference, pins rdma_rxe while they are registered, probes rxe's
 * private layout on a memory region of its own for every rxe device, looks
 * memory regions up by key, and tells which queue pair a responder context
 * is serving. Each hook hands the packet to the registered consumers in
 * order (RVMA, then Active Access); the first that takes it ends the walk.
 *
 * Every assumption about one kernel's rxe is in struct rxe_table below;
 * the table is chosen by the kernel the module is built for and checked
 * at run time (symbols, layout probes). An rxe the module does not
 * recognise leaves the module loaded with the hooked features refused
 * (rdmaplus_rxe_supported() false, EOPNOTSUPP).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fdtable.h>
#include <linux/file.h>
#include <linux/ftrace.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/skbuff.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/version.h>
#include <asm/ibt.h>
#include <asm/linkage.h>
#include <rdma/ib_verbs.h>
#include <rdma/restrack.h>

#include "rdmaplus.h"

/*
 * What the module assumes about one kernel's rxe. The hooked functions'
 * arguments are read from the x86-64 argument registers (rdi, rsi, rdx,
 * rcx, r8):
 *   rxe_mr_copy(mr, iova, addr, length, dir)   dir 0: into the region
 *   the atomic: 6.1 iova_to_vaddr(mr, iova, length) (NULL refuses it),
 *     6.12 and later rxe_mr_do_atomic_op(mr, iova, opcode, compare,
 *     swap_add, orig) (a resp_states value refuses it)
 *   the responder's run: rxe_responder(qp), 6.12 rxe_receiver(qp)
 *   rxe_resp_queue_pkt(qp, skb)                every request packet
 *   rxe_dereg_mr(ibmr, udata)                  deregistration
 * copy_data's extent tells local transfers from the responder's. The
 * responder runs in softirq (6.1: tasklets; received packets in NET_RX,
 * loopback inline in the poster's system call) or, from 6.12, in a work
 * item: hooks never sleep and take irqsave locks either way.
 * struct rxe_mr and struct rxe_qp start with their ib_ object or pool
 * element as described at rdmaplus_rxe_mr_of() and rxe_source(); those
 * offsets are probed, not assumed.
 */
enum rxe_fn {
	RXE_FN_MR_COPY, RXE_FN_ATOMIC, RXE_FN_COPY_DATA,
	RXE_FN_DEREG_MR, RXE_FN_RESPONDER, RXE_FN_RESP_QUEUE_PKT,
	RXE_FN_POOL_GET_INDEX, RXE_FN_ELEM_PUT, RXE_NFN
};

struct rxe_table {
	const char *kernel;		/* the rxe this entry describes */
	const char *fn[RXE_NFN];
	/* offsetof(struct rxe_pkt_info, hdr): rxe's packet info in skb->cb */
	unsigned int pkt_hdr;
	/* the atomic hook's function returns the target's address (6.1) or
	 * does the operation; refusing it makes it return atomic_refuse
	 */
	bool atomic_vaddr;
	unsigned long atomic_refuse;
	/* rxe registers on-demand-paging regions: they take other paths
	 * (rxe_odp_mr_copy, which sleeps; rxe_odp_atomic_op, not hooked)
	 */
	bool odp;
};

#define RXE_FNS(atomic, responder) { \
	[RXE_FN_MR_COPY] = "rxe_mr_copy", \
	[RXE_FN_ATOMIC] = atomic, \
	[RXE_FN_COPY_DATA] = "copy_data", \
	[RXE_FN_DEREG_MR] = "rxe_dereg_mr", \
	[RXE_FN_RESPONDER] = responder, \
	[RXE_FN_RESP_QUEUE_PKT] = "rxe_resp_queue_pkt", \
	[RXE_FN_POOL_GET_INDEX] = "rxe_pool_get_index", \
	[RXE_FN_ELEM_PUT] = "__rxe_put", \
}

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 1, 0) && \
	LINUX_VERSION_CODE < KERNEL_VERSION(6, 2, 0)	/* Debian 12 */
static const struct rxe_table rxe_table = {
	.kernel = "6.1",
	.fn = RXE_FNS("iova_to_vaddr", "rxe_responder"),
	.pkt_hdr = 24,
	.atomic_vaddr = true,
	.atomic_refuse = 0,		/* NULL: RESPST_ERR_MISALIGNED_ATOMIC */
};

#define RXE_TABLE (&rxe_table)
#elif LINUX_VERSION_CODE >= KERNEL_VERSION(6, 12, 0) && \
	LINUX_VERSION_CODE < KERNEL_VERSION(6, 13, 0)	/* Debian 13 */
static const struct rxe_table rxe_table = {
	.kernel = "6.12",
	.fn = RXE_FNS("rxe_mr_do_atomic_op", "rxe_receiver"),
	.pkt_hdr = 24,
	.atomic_refuse = 19,		/* RESPST_ERR_MISALIGNED_ATOMIC */
};

#define RXE_TABLE (&rxe_table)
#elif LINUX_VERSION_CODE >= KERNEL_VERSION(7, 2, 0) && \
	LINUX_VERSION_CODE < KERNEL_VERSION(7, 4, 0)	/* sid, backports */
static const struct rxe_table rxe_table = {
	.kernel = "7.2",
	.fn = RXE_FNS("rxe_mr_do_atomic_op", "rxe_receiver"),
	.pkt_hdr = 24,
	.atomic_refuse = 19,		/* RESPST_ERR_MISALIGNED_ATOMIC */
	.odp = true,
};

#define RXE_TABLE (&rxe_table)
#else
#define RXE_TABLE NULL		/* not a kernel whose rxe we know */
#endif

static const struct rxe_table *rxe_tab = RXE_TABLE;

/* rxe's functions, resolved while the hooks are registered */
static unsigned long rxe_fn[RXE_NFN];
static unsigned long rxe_copy_data_size;
int (*rdmaplus_rxe_mr_copy)(void *mr, u64 iova, void *addr, int length,
			    int dir);
static void *(*rxe_iova_to_vaddr)(void *mr, u64 iova, int length);

static long rxe_ibmr_off = -1;		/* offsetof(struct rxe_mr, ibmr) */
static unsigned int rxe_pkt_hdr;	/* offsetof(struct rxe_pkt_info, hdr) */
static long rxe_access_off = -1;	/* offsetof(struct rxe_mr, access) */
static bool rxe_layout_bad;		/* a probe failed on some device */
static bool rxe_symbols_ok;		/* found at load */

static const struct rdmaplus_rxe_consumer *rxe_consumers[RDMAPLUS_RXE_CONSUMERS];
static unsigned int rxe_nconsumers;

static DEFINE_MUTEX(rxe_mutex);		/* hook registration */
static unsigned int rxe_users;		/* under rxe_mutex */
static struct module *rxe_owner;	/* referenced while hooked */
static atomic64_t rxe_missed;		/* hook calls lost to recursion */

/*
 * rxe devices (from our ib_client), each with its region pool and the
 * functions that look into it. rxe_dev_lock is never taken by the data
 * path and is held only for a bounded number of O(1) lookups.
 */
#define RXE_MAX_DEVS 16
struct rxe_devslot {
	struct ib_device *dev;
	void *mr_pool;			/* &rxe->mr_pool, probed */
	void *(*get_index)(void *pool, u32 index);
	int (*elem_put)(void *elem);
};

static DEFINE_SPINLOCK(rxe_dev_lock);
static struct rxe_devslot rxe_devs[RXE_MAX_DEVS];

/*
 * A body that only returns: a hook that sets regs->ax and points regs->ip
 * here makes the hooked function return regs->ax at once.
 */
void rdmaplus_rxe_skip(void);
asm(".pushsection .text, \"ax\"\n"
	".type rdmaplus_rxe_skip, @function\n"
	"rdmaplus_rxe_skip:\n\t"
	ASM_ENDBR
	ASM_RET
	".size rdmaplus_rxe_skip, .-rdmaplus_rxe_skip\n"
	".popsection\n");

void rdmaplus_rxe_return(struct pt_regs *regs, unsigned long value)
{
	regs->ax = value;
	regs->ip = (unsigned long)rdmaplus_rxe_skip;
}

/* Refuse the atomic of the hooked call: the requester gets a NAK (remote
 * invalid request), memory is untouched.
 */
void rdmaplus_rxe_refuse_atomic(struct pt_regs *regs)
{
	rdmaplus_rxe_return(regs, rxe_tab->atomic_refuse);
}

/* The 8 bytes the hooked atomic is about to operate on (0 if unknown). */
u64 rdmaplus_rxe_atomic_value(struct pt_regs *regs)
{
	u64 v = 0, *va;

	if (rxe_tab->atomic_vaddr) {
		va = rxe_iova_to_vaddr((void *)regs->di, regs->si, 8);
		return va ? READ_ONCE(*va) : 0;
	}
	if (rdmaplus_rxe_mr_copy((void *)regs->di, regs->si, &v, 8, 1))
		return 0;
	return v;
}

/* ---- symbols ---------------------------------------------------------- */

static unsigned long rxe_kallsyms(const char *name)
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

static unsigned long rxe_sym(enum rxe_fn fn)
{
	char name[64];

	snprintf(name, sizeof(name), "rdma_rxe:%s", rxe_tab->fn[fn]);
	return rxe_kallsyms(name);
}

/*
 * Resolve rxe's functions into fn[] and check they lie in owner (the rxe
 * module pinned by the caller), if given. rxe may be unloaded and loaded
 * again at another address, so this runs again each time.
 */
static int rxe_resolve(struct module *owner, unsigned long *fn,
		       unsigned long *data_size)
{
	int (*size_offset)(unsigned long addr, unsigned long *size,
			   unsigned long *off);
	unsigned long size = 0, off = 0;
	int i;

	if (!rxe_tab)
		return -EOPNOTSUPP;
	for (i = 0; i < RXE_NFN; i++) {
		fn[i] = rxe_sym(i);
		if (!fn[i]) {
			pr_warn("rdma_rxe not loaded or not recognised: %s missing (this module knows the rxe of Linux %s)\n",
				rxe_tab->fn[i], rxe_tab->kernel);
			return -ENOENT;
		}
		if (owner && !within_module(fn[i], owner)) {
			pr_err("%s is not in the device's driver %s\n",
			       rxe_tab->fn[i], module_name(owner));
			return -ENOENT;
		}
	}
	size_offset = (void *)rxe_kallsyms("kallsyms_lookup_size_offset");
	if (!size_offset || !size_offset(fn[RXE_FN_COPY_DATA], &size, &off) ||
	    off || !size || size > 65536) {
		pr_err("rdma_rxe not recognised: copy_data has no sane extent\n");
		return -ENOENT;
	}
	*data_size = size;
	return 0;
}

/* ---- layout ----------------------------------------------------------- */

/*
 * Is cand the start of the struct rxe_mr around ibmr? It starts with
 * struct rxe_pool_elem {pool; obj; ...; u32 index;} where obj points at
 * the rxe_mr itself and index is the key's upper 24 bits. (An empty
 * list_head inside the elem also points at itself: pool must not.)
 */
static bool rxe_is_mr(struct ib_mr *ibmr, u8 *cand)
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

void *rdmaplus_rxe_mr_of(struct ib_mr *ibmr)
{
	long off = READ_ONCE(rxe_ibmr_off);

	if (off < 0 || !rxe_is_mr(ibmr, (u8 *)ibmr - off)) {
		pr_err_ratelimited("rxe_mr layout check failed for key %#x\n",
				   ibmr->lkey);
		return NULL;
	}
	return (u8 *)ibmr - off;
}

/*
 * Whether region ibmr (of rxe) lets remote peers write. rxe 6.1 gives a
 * region without remote access rkey 0; 6.12 and later give it an rkey
 * all the same, and the access flags are read where rdma_rxe's BTF puts
 * them in struct rxe_mr (without BTF, rxe's own key check decides).
 */
bool rdmaplus_rxe_remote_write(struct ib_mr *ibmr)
{
	long off = READ_ONCE(rxe_access_off), ioff = READ_ONCE(rxe_ibmr_off);

	if (!ibmr->rkey)
		return false;
	if (off < 0 || ioff < 0)
		return true;	/* unknown: rxe's own check_rkey decides */
	return *(int *)((u8 *)ibmr - ioff + off) & IB_ACCESS_REMOTE_WRITE;
}

/*
 * Whether region ibmr pages on demand (IB_ACCESS_ON_DEMAND), or might: on
 * an rxe with ODP whose access flags cannot be read. The hooks cannot
 * serve such a region: rxe copies into it under a mutex, faulting pages
 * in (a hook cannot sleep), and does its atomics elsewhere.
 */
static bool rxe_on_demand(struct ib_mr *ibmr)
{
	long off = READ_ONCE(rxe_access_off), ioff = READ_ONCE(rxe_ibmr_off);

	if (!rxe_tab->odp)
		return false;
	if (off < 0 || ioff < 0)
		return true;
	return *(int *)((u8 *)ibmr - ioff + off) & IB_ACCESS_ON_DEMAND;
}

struct ib_mr *rdmaplus_rxe_ibmr_of(void *rxe_mr)
{
	return (struct ib_mr *)((u8 *)rxe_mr + READ_ONCE(rxe_ibmr_off));
}

/*
 * Find where the ib_mr sits in struct rxe_mr, on a region of ours: where
 * rdma_rxe's BTF says, checked on the region, or else by a scan for the
 * pool element in front of it. Also take rxe_pkt_info's BTH pointer from
 * the BTF where it says (the table's value otherwise).
 */
static bool rxe_probe_ibmr(struct ib_mr *mr)
{
	long off, btf;

	if (rxe_ibmr_off >= 0)
		return rxe_is_mr(mr, (u8 *)mr - rxe_ibmr_off);
	off = rdmaplus_btf_offset("rdma_rxe", "rxe_pkt_info", "hdr");
	if (off >= 0 && off + sizeof(void *) <= sizeof_field(struct sk_buff, cb))
		rxe_pkt_hdr = off;
	off = rdmaplus_btf_offset("rdma_rxe", "rxe_mr", "access");
	if (off >= 0 && off < 4096)
		rxe_access_off = off;
	off = rdmaplus_btf_offset("rdma_rxe", "rxe_mr", "ibmr");
	if (off >= 0) {
		if (!rxe_is_mr(mr, (u8 *)mr - off)) {
			pr_err("rdma_rxe's BTF puts rxe_mr.ibmr at %ld, but no pool element is there\n",
			       off);
			return false;
		}
		WRITE_ONCE(rxe_ibmr_off, off);
		pr_info("rxe_mr.ibmr at offset %ld (BTF, checked)\n", off);
		return true;
	}
	btf = off;
	for (off = 24; off <= 512; off += 8) {
		if (rxe_is_mr(mr, (u8 *)mr - off)) {
			WRITE_ONCE(rxe_ibmr_off, off);
			pr_info("rxe_mr.ibmr at offset %ld (probed; rdma_rxe BTF not read: %ld)\n",
				off, btf);
			return true;
		}
	}
	return false;
}

/*
 * The region pool of mr's device: the pool element that starts struct
 * rxe_mr points at it, and struct rxe_pool starts {rxe; name; ...} with
 * rxe the device and name "mr". Checked by looking mr up through rxe's
 * own rxe_pool_get_index.
 */
static bool rxe_probe_pool(struct ib_device *dev, struct ib_mr *mr,
			   struct rxe_devslot *slot)
{
	void *rmr = (u8 *)mr - rxe_ibmr_off, *pool, *got;
	void *words[2];
	char name[3];

	pool = ((void **)rmr)[0];
	if (copy_from_kernel_nofault(words, pool, sizeof(words)) ||
	    words[0] != (void *)dev ||
	    copy_from_kernel_nofault(name, words[1], sizeof(name)) ||
	    memcmp(name, "mr", 3))
		return false;
	got = slot->get_index(pool, mr->lkey >> 8);
	if (got)
		slot->elem_put(got);	/* the element starts the rxe_mr */
	if (got != rmr)
		return false;
	slot->mr_pool = pool;
	return true;
}

/*
 * Probe rxe's layout on a memory region of our own, so that an rxe the
 * module does not know is refused when its device appears rather than
 * when a process first uses it.
 */
static bool rxe_probe_device(struct ib_device *dev, struct rxe_devslot *slot)
{
	unsigned long fn[RXE_NFN], size;
	struct ib_pd *pd;
	struct ib_mr *mr;
	bool ok = false;

	if (rxe_resolve(dev->ops.owner, fn, &size))
		return false;
	slot->get_index = (void *)fn[RXE_FN_POOL_GET_INDEX];
	slot->elem_put = (void *)fn[RXE_FN_ELEM_PUT];
	pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(pd)) {
		pr_warn("%s: cannot allocate a PD to check rxe's layout: %ld\n",
			dev_name(&dev->dev), PTR_ERR(pd));
		return false;
	}
	mr = ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, 1);
	if (IS_ERR(mr)) {
		pr_warn("%s: cannot allocate an MR to check rxe's layout: %ld\n",
			dev_name(&dev->dev), PTR_ERR(mr));
		goto out_pd;
	}
	ok = rxe_probe_ibmr(mr) && rxe_probe_pool(dev, mr, slot);
	ib_dereg_mr(mr);
out_pd:
	ib_dealloc_pd(pd);
	return ok;
}

static int rxe_client_add(struct ib_device *dev)
{
	struct rxe_devslot slot = { .dev = dev };
	int i;

	if (dev->ops.driver_id != RDMA_DRIVER_RXE)
		return -EOPNOTSUPP;
	if (!rxe_probe_device(dev, &slot)) {
		pr_err("%s: rxe layout not recognised: RVMA and Active Access disabled\n",
		       dev_name(&dev->dev));
		WRITE_ONCE(rxe_layout_bad, true);
		return 0;
	}
	spin_lock(&rxe_dev_lock);
	for (i = 0; i < RXE_MAX_DEVS; i++) {
		if (!rxe_devs[i].dev) {
			rxe_devs[i] = slot;
			break;
		}
	}
	spin_unlock(&rxe_dev_lock);
	WRITE_ONCE(rxe_symbols_ok, true);
	if (i == RXE_MAX_DEVS)
		pr_warn("more than %d rxe devices: %s not managed\n",
			RXE_MAX_DEVS, dev_name(&dev->dev));
	return 0;
}

static void rxe_client_remove(struct ib_device *dev, void *data)
{
	int i;

	spin_lock(&rxe_dev_lock);
	for (i = 0; i < RXE_MAX_DEVS; i++)
		if (rxe_devs[i].dev == dev)
			memset(&rxe_devs[i], 0, sizeof(rxe_devs[i]));
	spin_unlock(&rxe_dev_lock);
}

static struct ib_client rxe_client = {
	.name = "rdmaplus",
	.add = rxe_client_add,
	.remove = rxe_client_remove,
};

bool rdmaplus_rxe_supported(void)
{
	return READ_ONCE(rxe_symbols_ok) && !READ_ONCE(rxe_layout_bad);
}

/* ---- regions ---------------------------------------------------------- */

static int rxe_is_ufile(const void *ufile, struct file *f, unsigned int fd)
{
	return f->private_data == ufile && f->f_op && f->f_op->owner &&
	       !strcmp(module_name(f->f_op->owner), "ib_uverbs");
}

/*
 * Whether the calling process has the uverbs file ufile open. It walks the
 * descriptor table under its lock: call it with no spinlock held and
 * interrupts on (another thread may hold that lock while a packet
 * interrupts it).
 */
bool rdmaplus_rxe_holds_ufile(const void *ufile)
{
	might_sleep();
	return iterate_fd(current->files, 0, rxe_is_ufile, ufile) != 0;
}

/*
 * The rxe region whose index is key's upper 24 bits on some device, if it
 * has key as its lkey or rkey and is a user region, with a restrack
 * reference (which holds off its deregistration). One O(1) lookup per
 * device, in rxe's own pool.
 */
static struct ib_mr *rxe_find_key(u32 key)
{
	struct ib_mr *found = NULL;
	int i;

	spin_lock(&rxe_dev_lock);
	for (i = 0; i < RXE_MAX_DEVS && !found; i++) {
		struct rxe_devslot *s = &rxe_devs[i];
		struct ib_mr *mr;
		void *rmr;

		if (!s->mr_pool)
			continue;
		rmr = s->get_index(s->mr_pool, key >> 8);
		if (!rmr)
			continue;
		mr = rdmaplus_rxe_ibmr_of(rmr);
		if ((mr->lkey == key || (mr->rkey && mr->rkey == key)) &&
		    mr->type == IB_MR_TYPE_USER && mr->uobject &&
		    rdma_restrack_get(&mr->res))
			found = mr;
		s->elem_put(rmr);
	}
	spin_unlock(&rxe_dev_lock);
	return found;
}

/*
 * The calling process's rxe user region with this lkey or rkey (its
 * uverbs file is open here), with a restrack reference: release it with
 * rdmaplus_rxe_put_mr(). ERR_PTR(-ENOENT) alike when no region has the
 * key and when the region is another process's, so that keys cannot be
 * probed; ERR_PTR(-EOPNOTSUPP) on an rxe the module does not know;
 * ERR_PTR(-EINVAL) for an on-demand-paging region of the caller's, which
 * the hooks cannot serve. May sleep.
 */
struct ib_mr *rdmaplus_rxe_lookup_mr(u32 key)
{
	struct ib_mr *mr;

	if (!rdmaplus_rxe_supported())
		return ERR_PTR(-EOPNOTSUPP);
	mr = rxe_find_key(key);
	if (!mr)
		return ERR_PTR(-ENOENT);
	if (!rdmaplus_rxe_holds_ufile(mr->uobject->ufile)) {
		rdma_restrack_put(&mr->res);
		return ERR_PTR(-ENOENT);
	}
	if (rxe_on_demand(mr)) {
		rdma_restrack_put(&mr->res);
		return ERR_PTR(-EINVAL);
	}
	return mr;
}

void rdmaplus_rxe_put_mr(struct ib_mr *mr)
{
	rdma_restrack_put(&mr->res);
}

/* ---- source identity ---------------------------------------------------
 *
 * rxe_mr_copy and iova_to_vaddr do not see the QP. A hook on
 * rxe_responder(qp) records which QP this context is serving; within one
 * responder call nothing else runs a responder in the same context before
 * the packet's data is copied, so the copy hook can read the record back.
 * Softirq context has one record per CPU; process context (loopback runs
 * the responder inline from the poster's system call, preemptibly; newer
 * rxe runs it in a work item) keeps one per task in a small hash, so a
 * preempted or migrated task finds its own record or none. A record that
 * does not look like a live rxe_qp is ignored: the source is then 0.
 */
#define RXE_WAYS 4
struct rxe_cur {
	raw_spinlock_t lock;
	void *task[RXE_WAYS];
	void *qp[RXE_WAYS];
	unsigned int next;
};

static DEFINE_PER_CPU(struct rxe_cur, rxe_cur_soft);
#define RXE_TASK_BITS 8
static struct rxe_cur rxe_cur_task[1 << RXE_TASK_BITS];

static struct rxe_cur *rxe_cur_slot(void)
{
	if (in_serving_softirq())
		return this_cpu_ptr(&rxe_cur_soft);
	return &rxe_cur_task[hash_ptr(current, RXE_TASK_BITS)];
}

static void notrace rxe_resp_pre(struct pt_regs *regs)
{
	struct rxe_cur *c = rxe_cur_slot();
	unsigned long flags;
	int i;

	raw_spin_lock_irqsave(&c->lock, flags);
	for (i = 0; i < RXE_WAYS; i++)
		if (c->task[i] == current)
			break;
	if (i == RXE_WAYS) {
		i = c->next;
		c->next = (c->next + 1) % RXE_WAYS;
	}
	c->task[i] = current;
	c->qp[i] = (void *)regs->di;
	raw_spin_unlock_irqrestore(&c->lock, flags);
}

/* struct rxe_qp starts with struct ib_qp, then struct rxe_pool_elem
 * {pool; obj; ...} whose obj points at the rxe_qp, then struct ib_qp_attr
 * (at the same distance from the elem as the ib_mr in struct rxe_mr).
 */
#define RXE_QP_ELEM_OFF	ALIGN(sizeof(struct ib_qp), 8)

void rdmaplus_rxe_source(u32 *qpn, u32 *src_qpn)
{
	struct rxe_cur *c = rxe_cur_slot();
	long off = READ_ONCE(rxe_ibmr_off);
	struct ib_qp_attr *attr;
	unsigned long flags;
	void *qp = NULL;
	int i;

	raw_spin_lock_irqsave(&c->lock, flags);
	for (i = 0; i < RXE_WAYS; i++)
		if (c->task[i] == current)
			qp = c->qp[i];
	raw_spin_unlock_irqrestore(&c->lock, flags);
	if (!qp || off < 0 ||
	    ((void **)((u8 *)qp + RXE_QP_ELEM_OFF))[1] != qp)
		return;
	*qpn = ((struct ib_qp *)qp)->qp_num;
	attr = (struct ib_qp_attr *)((u8 *)qp + RXE_QP_ELEM_OFF + off);
	if (attr->qp_state <= IB_QPS_ERR && attr->dest_qp_num < (1U << 24))
		*src_qpn = attr->dest_qp_num;
}

/* ---- packets ---------------------------------------------------------- */

/*
 * Make the first len bytes of a request packet (skb->data is its BTH, and
 * rxe's packet info points there) writable before a consumer changes them
 * in place: a cloned skb (a capture, say) shares its data and must not see
 * the change. The data may move; rxe's pointer to the BTH follows it.
 * Returns the BTH, or NULL (the packet must then be left alone).
 */
u8 *rdmaplus_rxe_pkt_writable(struct sk_buff *skb, unsigned int len)
{
	u8 **hdr = (u8 **)(skb->cb + rxe_pkt_hdr);

	if (*hdr != skb->data)
		return NULL;	/* not the layout we know */
	if (skb_ensure_writable(skb, len))
		return NULL;
	*hdr = skb->data;
	return skb->data;
}

/* ---- hooks ------------------------------------------------------------ */

static void notrace rxe_copy_pre(struct pt_regs *regs)
{
	unsigned long ret = *(unsigned long *)regs->sp;
	unsigned int i;

	if ((int)regs->cx <= 0 ||
	    ret - rxe_fn[RXE_FN_COPY_DATA] < rxe_copy_data_size)
		return;		/* nothing to copy, or a local transfer */
	rcu_read_lock();
	for (i = 0; i < rxe_nconsumers; i++)
		if (rxe_consumers[i]->copy && rxe_consumers[i]->copy(regs))
			break;
	rcu_read_unlock();
}

static void notrace rxe_atomic_pre(struct pt_regs *regs)
{
	unsigned int i;

	rcu_read_lock();
	for (i = 0; i < rxe_nconsumers; i++)
		if (rxe_consumers[i]->atomic && rxe_consumers[i]->atomic(regs))
			break;
	rcu_read_unlock();
}

static void notrace rxe_queue_pre(struct pt_regs *regs)
{
	unsigned int i;

	rcu_read_lock();
	for (i = 0; i < rxe_nconsumers; i++)
		if (rxe_consumers[i]->request &&
		    rxe_consumers[i]->request((void *)regs->di,
					      (struct sk_buff *)regs->si))
			break;
	rcu_read_unlock();
}

/*
 * rxe_dereg_mr runs after ib_core removed the region from its resource
 * table and waited for every reference taken there, so a configuration
 * call that found the region has finished (and is forgotten here) and no
 * later one finds it. Every consumer hears of it.
 */
static void notrace rxe_dereg_pre(struct pt_regs *regs)
{
	struct ib_mr *ibmr = (struct ib_mr *)regs->di;
	long off = READ_ONCE(rxe_ibmr_off);
	unsigned int i;

	if (off < 0)
		return;
	for (i = 0; i < rxe_nconsumers; i++)
		if (rxe_consumers[i]->dereg)
			rxe_consumers[i]->dereg((u8 *)ibmr - off, ibmr);
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
struct rxe_hook {
	void (*pre)(struct pt_regs *regs);
	enum rxe_fn fn;
	struct ftrace_ops ops;
};

static void notrace rxe_hook_cb(unsigned long ip, unsigned long parent_ip,
				struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	struct rxe_hook *h = container_of(op, struct rxe_hook, ops);
	struct pt_regs *regs = ftrace_get_regs(fregs);
	int bit;

	if (within_module(parent_ip, THIS_MODULE))
		return;		/* our own call into rxe */
	bit = ftrace_test_recursion_trylock(ip, parent_ip);
	if (bit < 0) {
		atomic64_inc(&rxe_missed);
		return;
	}
	h->pre(regs);
	ftrace_test_recursion_unlock(bit);
}

#define RXE_HOOK(f, p) { .pre = p, .fn = f, .ops = { .func = rxe_hook_cb, \
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY } }
static struct rxe_hook rxe_hooks[] = {
	RXE_HOOK(RXE_FN_DEREG_MR, rxe_dereg_pre),
	RXE_HOOK(RXE_FN_RESPONDER, rxe_resp_pre),
	RXE_HOOK(RXE_FN_MR_COPY, rxe_copy_pre),
	RXE_HOOK(RXE_FN_ATOMIC, rxe_atomic_pre),
	RXE_HOOK(RXE_FN_RESP_QUEUE_PKT, rxe_queue_pre),
};

static void rxe_unregister(int n)
{
	while (n-- > 0) {
		unregister_ftrace_function(&rxe_hooks[n].ops);
		ftrace_set_filter_ip(&rxe_hooks[n].ops,
				     rxe_fn[rxe_hooks[n].fn], 1, 0);
	}
}

/* Register the hooks and pin rdma_rxe (owner); rxe_mutex held. */
static int rxe_hook(struct module *owner)
{
	unsigned long fn[RXE_NFN], size;
	int ret, i;

	if (!rdmaplus_rxe_supported())
		return -EOPNOTSUPP;
	if (!try_module_get(owner))
		return -ENODEV;
	ret = rxe_resolve(owner, fn, &size);
	if (ret) {
		module_put(owner);
		return ret == -ENOENT ? -EOPNOTSUPP : ret;
	}
	/* no hook is registered: nothing reads these now */
	memcpy(rxe_fn, fn, sizeof(fn));
	rxe_copy_data_size = size;
	rdmaplus_rxe_mr_copy = (void *)fn[RXE_FN_MR_COPY];
	rxe_iova_to_vaddr = (void *)fn[RXE_FN_ATOMIC];
	for (i = 0; i < ARRAY_SIZE(rxe_hooks); i++) {
		struct rxe_hook *h = &rxe_hooks[i];

		ret = ftrace_set_filter_ip(&h->ops, rxe_fn[h->fn], 0, 0);
		if (ret)
			break;
		ret = register_ftrace_function(&h->ops);
		if (ret) {
			ftrace_set_filter_ip(&h->ops, rxe_fn[h->fn], 1, 0);
			break;
		}
	}
	if (ret) {
		pr_err("cannot hook %s: %d\n", rxe_tab->fn[rxe_hooks[i].fn], ret);
		rxe_unregister(i);
		module_put(owner);
		return ret;
	}
	rxe_owner = owner;
	return 0;
}

/*
 * A consumer's reference on the hooks, and on owner (rdma_rxe, the
 * region's device's driver) while they are registered. May sleep
 * (registering waits for RCU grace periods).
 */
int rdmaplus_rxe_hook_get(struct module *owner)
{
	int ret = 0;

	mutex_lock(&rxe_mutex);
	if (!rxe_users)
		ret = rxe_hook(owner);
	if (!ret)
		rxe_users++;
	mutex_unlock(&rxe_mutex);
	return ret;
}

void rdmaplus_rxe_hook_put(void)
{
	mutex_lock(&rxe_mutex);
	if (!WARN_ON_ONCE(!rxe_users) && !--rxe_users) {
		rxe_unregister(ARRAY_SIZE(rxe_hooks));
		module_put(rxe_owner);
		rxe_owner = NULL;
	}
	mutex_unlock(&rxe_mutex);
}

bool rdmaplus_rxe_hooked(void)
{
	return READ_ONCE(rxe_users) != 0;
}

u64 rdmaplus_rxe_missed(void)
{
	return atomic64_read(&rxe_missed);
}

/* Consumers register at load, before any hook, in the order they are
 * asked (RVMA before Active Access), and never leave before unload.
 */
void rdmaplus_rxe_add_consumer(const struct rdmaplus_rxe_consumer *c)
{
	if (!WARN_ON(rxe_nconsumers == RDMAPLUS_RXE_CONSUMERS))
		rxe_consumers[rxe_nconsumers++] = c;
}

/* ---- load ------------------------------------------------------------- */

int rdmaplus_rxe_init(void)
{
	unsigned long fn[RXE_NFN], size;
	int i, ret;

	for (i = 0; i < ARRAY_SIZE(rxe_cur_task); i++)
		raw_spin_lock_init(&rxe_cur_task[i].lock);
	for_each_possible_cpu(i)
		raw_spin_lock_init(&per_cpu_ptr(&rxe_cur_soft, i)->lock);
	if (!rxe_tab)
		pr_warn("no rxe description for Linux %u.%u: RVMA and Active Access disabled\n",
			LINUX_VERSION_CODE >> 16, (LINUX_VERSION_CODE >> 8) & 0xff);
	else
		rxe_symbols_ok = !rxe_resolve(NULL, fn, &size);
	if (rxe_tab)
		rxe_pkt_hdr = rxe_tab->pkt_hdr;
	ret = ib_register_client(&rxe_client);
	if (ret)
		pr_err("cannot register the ib client: %d\n", ret);
	return ret;
}

void rdmaplus_rxe_exit(void)
{
	/* every file is closed: no consumer holds the hooks */
	WARN_ON(rxe_users);
	ib_unregister_client(&rxe_client);
}
