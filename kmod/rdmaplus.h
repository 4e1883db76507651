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

#endif /* _RDMAPLUS_H */
