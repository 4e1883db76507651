/* SPDX-License-Identifier: GPL-2.0 */
/* rdmaplus: internal interfaces between the module's files. */
#ifndef _RDMAPLUS_H
#define _RDMAPLUS_H

#include <linux/fs.h>
#include <linux/poll.h>

struct rdmaplus_aa_ctx;

int rdmaplus_aa_init(void);
void rdmaplus_aa_exit(void);
bool rdmaplus_aa_supported(void);

struct rdmaplus_aa_ctx *rdmaplus_aa_open(void);
void rdmaplus_aa_release(struct rdmaplus_aa_ctx *ctx);
long rdmaplus_aa_ioctl(struct rdmaplus_aa_ctx *ctx, unsigned int cmd,
		       void __user *arg);
int rdmaplus_aa_mmap(struct rdmaplus_aa_ctx *ctx, struct vm_area_struct *vma);
__poll_t rdmaplus_aa_poll(struct rdmaplus_aa_ctx *ctx, struct file *file,
			  poll_table *wait);

/* rdmaplus_aa.c, in assembly: returns at once (see the hooks) */
void rdmaplus_aa_skip(void);

/*
 * rdmaplus_aa.c, shared with rdmaplus_rvma.c: the rxe data-path hooks are
 * registered while AA arms a page or RVMA holds a reference (get/put may
 * sleep; get pins owner, the rxe driver, while hooked).
 */
struct ib_mr;
struct user_struct;
struct kobject;
int rdmaplus_hook_get(struct module *owner);
void rdmaplus_hook_put(void);
/* the calling process's rxe user MR with this lkey or rkey, with a
 * restrack reference (rdma_restrack_put), or ERR_PTR(-EPERM/-ENOENT)
 */
struct ib_mr *aa_lookup_mr(u32 key);
/* whether the calling process has the uverbs file ufile open */
bool aa_holds_ufile(const void *ufile);
/* the struct rxe_mr around ibmr, or NULL if rxe's layout is unknown */
void *aa_rxe_mr_of(struct ib_mr *ibmr);
/* rxe's rxe_mr_copy (dir 0: into the MR); valid while hooked. Calls from
 * the module are not hooked.
 */
extern int (*aa_rxe_mr_copy)(void *mr, u64 iova, void *addr, int length,
			     int dir);
int aa_charge(struct user_struct *user, unsigned long pages);
void aa_uncharge(struct user_struct *user, unsigned long pages);
struct kobject *rdmaplus_kobj(void);

/* rdmaplus_rvma.c: counted mailboxes */
struct rdmaplus_rvma_ctx;
struct pt_regs;

int rdmaplus_rvma_init(void);
void rdmaplus_rvma_exit(void);
struct rdmaplus_rvma_ctx *rdmaplus_rvma_open(void);
void rdmaplus_rvma_release(struct rdmaplus_rvma_ctx *ctx);
/* -ENOIOCTLCMD for a request that is not RVMA's */
long rdmaplus_rvma_ioctl(struct rdmaplus_rvma_ctx *ctx, unsigned int cmd,
			 void __user *arg);
/* does this mmap(2) offset belong to RVMA? */
bool rdmaplus_rvma_owns_pgoff(unsigned long pgoff);
int rdmaplus_rvma_mmap(struct rdmaplus_rvma_ctx *ctx,
		       struct vm_area_struct *vma);
/* hooks (rcu_read_lock held by the caller of write) */
bool rdmaplus_rvma_write(struct pt_regs *regs);
struct sk_buff;
void rdmaplus_rvma_request(struct sk_buff *skb);
void rdmaplus_rvma_dereg(void *rxe_mr);

#endif /* _RDMAPLUS_H */
