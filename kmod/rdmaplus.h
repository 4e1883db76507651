/* SPDX-License-Identifier: GPL-2.0 */
/*
 * rdmaplus: internal interfaces between the module's files.
 *
 *   rdmaplus_main.c  the device, ioctl dispatch, sysfs root, feature flags
 *   rdmaplus_acct.c  memlock charges and per-user caps
 *   rdmaplus_btf.c   member offsets from a module's BTF
 *   rdmaplus_rxe.c   the rxe layer: symbols, hooks, layout, region lookup
 *   rdmaplus_rvma.c  counted mailboxes (RVMA), a consumer of the hooks
 *   rdmaplus_aa.c    Active Access, a consumer of the hooks
 *   rdmaplus_jbmt.c  JBMT: unpinned memory by token (no hooks)
 *   rdmaplus_jbmt_net.c  JBMT's connections between hosts (rdma_cm)
 *   rdmaplus_jbmt_xfer.c JBMT's transfers: sections pinned just in time
 *   rdmaplus_jbmt_ring.c JBMT's asynchronous operations: a completion ring
 *
 * Dependencies go down this list only: the services use the rxe layer
 * and accounting, never each other.
 */
#ifndef _RDMAPLUS_H
#define _RDMAPLUS_H

#include <linux/atomic.h>
#include <linux/fs.h>
#include <linux/kobject.h>
#include <linux/poll.h>
#include <linux/uaccess.h>

struct ib_mr;
struct kobject;
struct pt_regs;
struct sk_buff;

/* ---- rdmaplus_main.c ---- */

/* /sys/kernel/rdmaplus, the parent of the services' counter directories */
struct kobject *rdmaplus_kobj(void);

/*
 * Copy an ioctl structure that starts with __u32 size: a caller's smaller
 * structure than min (older than any the module knows) is -EINVAL, a
 * larger one than ksize must be zero beyond it (-E2BIG otherwise), and
 * the module's fields the caller does not know are zero.
 */
int rdmaplus_copy_in(void *dst, size_t ksize, size_t min,
		     const void __user *arg);
/* Copy out at most the size the caller gave. */
int rdmaplus_copy_out(void __user *arg, const void *src, size_t ksize);

/* A read-only sysfs file showing one atomic64_t counter. */
struct rdmaplus_counter {
	struct kobj_attribute kattr;
	atomic64_t *v;
};

ssize_t rdmaplus_counter_show(struct kobject *kobj, struct kobj_attribute *ka,
			      char *buf);

#define RDMAPLUS_COUNTER(var, name, counter) \
	static struct rdmaplus_counter var = { \
		.kattr = __ATTR(name, 0444, rdmaplus_counter_show, NULL), \
		.v = (counter), \
	}

/* ---- rdmaplus_acct.c ---- */

enum rdmaplus_res {
	RDMAPLUS_RES_DOMAIN,	/* Active Access domain ids */
	RDMAPLUS_RES_MBKEY,	/* RVMA mailbox keys */
	RDMAPLUS_RES_JBMT_REGION, /* JBMT regions */
	RDMAPLUS_NRES
};

struct rdmaplus_user;

struct rdmaplus_user *rdmaplus_user_get(void);
void rdmaplus_user_get_ref(struct rdmaplus_user *u);
void rdmaplus_user_put(struct rdmaplus_user *u);
int rdmaplus_user_take(struct rdmaplus_user *u, enum rdmaplus_res res);
void rdmaplus_user_give(struct rdmaplus_user *u, enum rdmaplus_res res);
long rdmaplus_charge(struct rdmaplus_user *u, unsigned long pages);
void rdmaplus_uncharge(struct rdmaplus_user *u, unsigned long pages);

/* ---- rdmaplus_btf.c ---- */

/* offsetof(struct sname, member) in module's BTF, or -ENOENT, -EINVAL */
long rdmaplus_btf_offset(const char *module, const char *sname,
			 const char *member);

/* ---- rdmaplus_rxe.c ---- */

int rdmaplus_rxe_init(void);
void rdmaplus_rxe_exit(void);
/* rxe's data path is one the module knows: the hooks can be registered */
bool rdmaplus_rxe_supported(void);

/*
 * A service that sees rxe's data path. Hooks run in softirq, in a work
 * item or inline in a poster's system call, with preemption disabled and
 * rcu_read_lock held: no sleeping, irqsave locks. Each returns whether it
 * took the packet (the consumers after it then do not see it).
 */
struct rdmaplus_rxe_consumer {
	/* rxe_mr_copy(mr, iova, addr, length, dir) of an incoming write
	 * packet (dir 0) or a read response (dir 1); length > 0, never a
	 * local transfer. regs are the hooked call's arguments.
	 */
	bool (*copy)(struct pt_regs *regs);
	/* iova_to_vaddr(mr, iova, length): an incoming atomic */
	bool (*atomic)(struct pt_regs *regs);
	/* every request packet, before the responder sees it */
	bool (*request)(void *rxe_qp, struct sk_buff *skb);
	/* the region is being deregistered (every consumer hears it) */
	void (*dereg)(void *rxe_mr, struct ib_mr *ibmr);
};

#define RDMAPLUS_RXE_CONSUMERS 4
void rdmaplus_rxe_add_consumer(const struct rdmaplus_rxe_consumer *c);

/* Hold the hooks registered (and owner, rdma_rxe, loaded). May sleep. */
int rdmaplus_rxe_hook_get(struct module *owner);
void rdmaplus_rxe_hook_put(void);
bool rdmaplus_rxe_hooked(void);
u64 rdmaplus_rxe_missed(void);

/* The calling process's rxe user region with this key (ERR_PTR(-ENOENT)
 * when none or not its own, -EOPNOTSUPP), with a reference. May sleep.
 */
struct ib_mr *rdmaplus_rxe_lookup_mr(u32 key);
void rdmaplus_rxe_put_mr(struct ib_mr *mr);
/* whether the calling process has uverbs file ufile open; may sleep */
bool rdmaplus_rxe_holds_ufile(const void *ufile);
/* the struct rxe_mr around ibmr (NULL: layout check failed), and back */
void *rdmaplus_rxe_mr_of(struct ib_mr *ibmr);
struct ib_mr *rdmaplus_rxe_ibmr_of(void *rxe_mr);
/* whether the region lets remote peers write (its access flags) */
bool rdmaplus_rxe_remote_write(struct ib_mr *ibmr);
/* which QP the calling responder context serves (unchanged if unknown) */
void rdmaplus_rxe_source(u32 *qpn, u32 *src_qpn);
/* a request packet's first len bytes, writable in place (NULL: leave it) */
u8 *rdmaplus_rxe_pkt_writable(struct sk_buff *skb, unsigned int len);
/* make the hooked function return value at once */
void rdmaplus_rxe_return(struct pt_regs *regs, unsigned long value);

/* the atomic hook: refuse the operation; the value it would operate on */
void rdmaplus_rxe_refuse_atomic(struct pt_regs *regs);
u64 rdmaplus_rxe_atomic_value(struct pt_regs *regs);

/* rxe's rxe_mr_copy, valid while hooked; calls from the module are not
 * hooked
 */
extern int (*rdmaplus_rxe_mr_copy)(void *mr, u64 iova, void *addr,
				   int length, int dir);

/* ---- kernel interfaces that changed between the kernels we build for ---- */

#include <linux/eventfd.h>
#include <linux/hrtimer.h>
#include <linux/version.h>
#include <linux/workqueue.h>

static inline void rdmaplus_eventfd_signal(struct eventfd_ctx *ctx)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 8, 0)
	eventfd_signal(ctx);
#else
	eventfd_signal(ctx, 1);
#endif
}

/* the unbound system workqueue (system_wq is deprecated from 6.17) */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 17, 0)
#define rdmaplus_wq system_dfl_wq
#else
#define rdmaplus_wq system_wq
#endif

static inline void rdmaplus_hrtimer_setup(struct hrtimer *t,
					  enum hrtimer_restart (*fn)(struct hrtimer *),
					  clockid_t clock, enum hrtimer_mode mode)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
	hrtimer_setup(t, fn, clock, mode);
#else
	hrtimer_init(t, clock, mode);
	t->function = fn;
#endif
}

/* ---- rdmaplus_aa.c: Active Access ---- */

struct rdmaplus_aa_ctx;

int rdmaplus_aa_init(void);
void rdmaplus_aa_exit(void);
struct rdmaplus_aa_ctx *rdmaplus_aa_open(struct rdmaplus_user *u);
void rdmaplus_aa_release(struct rdmaplus_aa_ctx *ctx);
long rdmaplus_aa_ioctl(struct rdmaplus_aa_ctx *ctx, unsigned int cmd,
		       void __user *arg);
int rdmaplus_aa_mmap(struct rdmaplus_aa_ctx *ctx, struct vm_area_struct *vma);
__poll_t rdmaplus_aa_poll(struct rdmaplus_aa_ctx *ctx, struct file *file,
			  poll_table *wait);

/* ---- rdmaplus_rvma.c: counted mailboxes ---- */

struct rdmaplus_rvma_ctx;

int rdmaplus_rvma_init(void);
void rdmaplus_rvma_exit(void);
struct rdmaplus_rvma_ctx *rdmaplus_rvma_open(struct rdmaplus_user *u);
void rdmaplus_rvma_release(struct rdmaplus_rvma_ctx *ctx);
/* -ENOIOCTLCMD for a request that is not RVMA's */
long rdmaplus_rvma_ioctl(struct rdmaplus_rvma_ctx *ctx, unsigned int cmd,
			 void __user *arg);
/* does this mmap(2) offset belong to RVMA? */
bool rdmaplus_rvma_owns_pgoff(unsigned long pgoff);
int rdmaplus_rvma_mmap(struct rdmaplus_rvma_ctx *ctx,
		       struct vm_area_struct *vma);

/* ---- rdmaplus_jbmt.c: JBMT ---- */

struct rdmaplus_jbmt_ctx;

int rdmaplus_jbmt_init(void);
void rdmaplus_jbmt_exit(void);
struct rdmaplus_jbmt_ctx *rdmaplus_jbmt_open(struct rdmaplus_user *u);
void rdmaplus_jbmt_release(struct rdmaplus_jbmt_ctx *ctx);
/* -ENOIOCTLCMD for a request that is not JBMT's */
long rdmaplus_jbmt_ioctl(struct rdmaplus_jbmt_ctx *ctx, unsigned int cmd,
			 void __user *arg);

/* ---- rdmaplus_jbmt_net.c: JBMT's connections ---- */

int rdmaplus_jbmt_net_init(void);
void rdmaplus_jbmt_net_exit(void);
long rdmaplus_jbmt_connect(void __user *arg);

/* ---- rdmaplus_jbmt_xfer.c: JBMT's transfers ---- */

long rdmaplus_jbmt_op(struct rdmaplus_jbmt_ctx *ctx, void __user *arg);

/* ---- rdmaplus_jbmt_ring.c: JBMT's completion ring ---- */

bool rdmaplus_jbmt_owns_pgoff(unsigned long pgoff);
int rdmaplus_jbmt_mmap(struct rdmaplus_jbmt_ctx *ctx,
		       struct vm_area_struct *vma);

#endif /* _RDMAPLUS_H */
