// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus: kernel side of the rdmaplus RDMA stack.
 *
 * The misc character device /dev/rdmaplus answers the version ioctl and
 * carries the services: the counted mailboxes of RVMA (rdmaplus_rvma.c)
 * and Active Access (rdmaplus_aa.c), an emulated IOMMU for rxe, both on
 * the rxe layer's hooks (rdmaplus_rxe.c), and JBMT's registration of
 * unpinned memory (rdmaplus_jbmt.c). This file owns the device, the
 * sysfs root and the feature flags (rdmaplus.h lists the layers).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/kobject.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"

#define RDMAPLUS_RELEASE "0.3.0"

/* one open /dev/rdmaplus */
struct rdmaplus_file {
	struct rdmaplus_user *user;
	struct rdmaplus_aa_ctx *aa;
	struct rdmaplus_rvma_ctx *rvma;
	struct rdmaplus_jbmt_ctx *jbmt;
};

static struct kobject *rdmaplus_root;

struct kobject *rdmaplus_kobj(void)
{
	return rdmaplus_root;
}

ssize_t rdmaplus_counter_show(struct kobject *kobj, struct kobj_attribute *ka,
			      char *buf)
{
	struct rdmaplus_counter *c = container_of(ka, struct rdmaplus_counter,
						  kattr);

	return sysfs_emit(buf, "%lld\n", atomic64_read(c->v));
}

int rdmaplus_copy_in(void *dst, size_t ksize, size_t min,
		     const void __user *arg)
{
	u32 usize;

	if (get_user(usize, (const u32 __user *)arg))
		return -EFAULT;
	if (usize < min)
		return -EINVAL;
	if (usize > PAGE_SIZE)
		return -E2BIG;
	return copy_struct_from_user(dst, ksize, arg, usize);
}

int rdmaplus_copy_out(void __user *arg, const void *src, size_t ksize)
{
	size_t usize = *(const u32 *)src;

	if (copy_to_user(arg, src, min(usize, ksize)))
		return -EFAULT;
	return 0;
}

static long rdmaplus_ioctl_version(void __user *arg)
{
	struct rdmaplus_version v = {
		.abi = RDMAPLUS_ABI_VERSION,
		.flags = RDMAPLUS_VERSION_F_JBMT,
	};

	if (rdmaplus_rxe_supported())
		v.flags |= RDMAPLUS_VERSION_F_AA | RDMAPLUS_VERSION_F_RVMA;
	strscpy(v.release, RDMAPLUS_RELEASE, sizeof(v.release));
	if (copy_to_user(arg, &v, sizeof(v)))
		return -EFAULT;
	return 0;
}

/*
 * Requests are known by type, number and direction: their size bits follow
 * the caller's structure, which may be larger or smaller than the module's
 * (the size field inside says which; rdmaplus_copy_in).
 */
static const unsigned int rdmaplus_cmds[] = {
	RDMAPLUS_IOC_VERSION,
	RDMAPLUS_IOC_AA_DOMAIN_CREATE, RDMAPLUS_IOC_AA_DOMAIN_DESTROY,
	RDMAPLUS_IOC_AA_NOTIFY, RDMAPLUS_IOC_AA_ARM, RDMAPLUS_IOC_AA_DISARM,
	RDMAPLUS_IOC_AA_STATS,
	RDMAPLUS_IOC_RVMA_SETUP, RDMAPLUS_IOC_RVMA_WIN_CREATE,
	RDMAPLUS_IOC_RVMA_WIN_DESTROY, RDMAPLUS_IOC_RVMA_POST,
	RDMAPLUS_IOC_RVMA_END, RDMAPLUS_IOC_RVMA_ARM, RDMAPLUS_IOC_RVMA_POSTV,
	RDMAPLUS_IOC_RVMA_QP, RDMAPLUS_IOC_RVMA_GUARD,
	RDMAPLUS_IOC_JBMT_REG, RDMAPLUS_IOC_JBMT_DEREG, RDMAPLUS_IOC_JBMT_CONNECT,
	RDMAPLUS_IOC_JBMT_OP, RDMAPLUS_IOC_JBMT_SETUP, RDMAPLUS_IOC_JBMT_SUBMIT,
	RDMAPLUS_IOC_JBMT_ADVISE,
};

static unsigned int rdmaplus_canonical(unsigned int cmd)
{
	const unsigned int size = _IOC_SIZEMASK << _IOC_SIZESHIFT;
	int i;

	for (i = 0; i < ARRAY_SIZE(rdmaplus_cmds); i++)
		if (!((rdmaplus_cmds[i] ^ cmd) & ~size))
			return rdmaplus_cmds[i];
	return cmd;
}

static int rdmaplus_open(struct inode *inode, struct file *file)
{
	struct rdmaplus_file *f;
	int ret;

	f = kzalloc(sizeof(*f), GFP_KERNEL_ACCOUNT);
	if (!f)
		return -ENOMEM;
	f->user = rdmaplus_user_get();
	if (IS_ERR(f->user)) {
		ret = PTR_ERR(f->user);
		goto err_free;
	}
	f->aa = rdmaplus_aa_open(f->user);
	if (IS_ERR(f->aa)) {
		ret = PTR_ERR(f->aa);
		goto err_user;
	}
	f->rvma = rdmaplus_rvma_open(f->user);
	if (IS_ERR(f->rvma)) {
		ret = PTR_ERR(f->rvma);
		goto err_aa;
	}
	f->jbmt = rdmaplus_jbmt_open(f->user);
	if (IS_ERR(f->jbmt)) {
		ret = PTR_ERR(f->jbmt);
		goto err_rvma;
	}
	file->private_data = f;
	return 0;

err_rvma:
	rdmaplus_rvma_release(f->rvma);
err_aa:
	rdmaplus_aa_release(f->aa);
err_user:
	rdmaplus_user_put(f->user);
err_free:
	kfree(f);
	return ret;
}

static int rdmaplus_release(struct inode *inode, struct file *file)
{
	struct rdmaplus_file *f = file->private_data;

	rdmaplus_jbmt_release(f->jbmt);
	rdmaplus_rvma_release(f->rvma);
	rdmaplus_aa_release(f->aa);
	rdmaplus_user_put(f->user);
	kfree(f);
	return 0;
}

static long rdmaplus_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	struct rdmaplus_file *f = file->private_data;
	long ret;

	cmd = rdmaplus_canonical(cmd);
	if (cmd == RDMAPLUS_IOC_VERSION)
		return rdmaplus_ioctl_version((void __user *)arg);
	ret = rdmaplus_rvma_ioctl(f->rvma, cmd, (void __user *)arg);
	if (ret != -ENOIOCTLCMD)
		return ret;
	ret = rdmaplus_jbmt_ioctl(f->jbmt, cmd, (void __user *)arg);
	if (ret != -ENOIOCTLCMD)
		return ret;
	return rdmaplus_aa_ioctl(f->aa, cmd, (void __user *)arg);
}

static int rdmaplus_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct rdmaplus_file *f = file->private_data;

	if (rdmaplus_rvma_owns_pgoff(vma->vm_pgoff))
		return rdmaplus_rvma_mmap(f->rvma, vma);
	if (rdmaplus_jbmt_owns_pgoff(vma->vm_pgoff))
		return rdmaplus_jbmt_mmap(f->jbmt, vma);
	return rdmaplus_aa_mmap(f->aa, vma);
}

static __poll_t rdmaplus_poll(struct file *file, poll_table *wait)
{
	struct rdmaplus_file *f = file->private_data;

	return rdmaplus_aa_poll(f->aa, file, wait);
}

static const struct file_operations rdmaplus_fops = {
	.owner = THIS_MODULE,
	.open = rdmaplus_open,
	.release = rdmaplus_release,
	.unlocked_ioctl = rdmaplus_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = rdmaplus_mmap,
	.poll = rdmaplus_poll,
	.llseek = noop_llseek,
};

static struct miscdevice rdmaplus_misc = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = RDMAPLUS_DEVICE_NAME,
	.fops = &rdmaplus_fops,
	.mode = 0666,
};

static int __init rdmaplus_init(void)
{
	int ret;

	rdmaplus_root = kobject_create_and_add("rdmaplus", kernel_kobj);
	if (!rdmaplus_root)
		return -ENOMEM;
	/* consumers of the hooks in the order they see packets */
	ret = rdmaplus_rvma_init();
	if (ret)
		goto err_kobj;
	ret = rdmaplus_aa_init();
	if (ret)
		goto err_rvma;
	ret = rdmaplus_jbmt_init();
	if (ret)
		goto err_aa;
	ret = rdmaplus_rxe_init();
	if (ret)
		goto err_jbmt;
	ret = misc_register(&rdmaplus_misc);
	if (ret) {
		pr_err("cannot register /dev/%s: %d\n", RDMAPLUS_DEVICE_NAME, ret);
		goto err_rxe;
	}
	pr_info("loaded, ABI %d; JBMT on; RVMA and Active Access %s\n",
		RDMAPLUS_ABI_VERSION,
		rdmaplus_rxe_supported() ? "on" : "off (rxe not recognised)");
	return 0;

err_rxe:
	rdmaplus_rxe_exit();
err_jbmt:
	rdmaplus_jbmt_exit();
err_aa:
	rdmaplus_aa_exit();
err_rvma:
	rdmaplus_rvma_exit();
err_kobj:
	kobject_put(rdmaplus_root);
	return ret;
}

static void __exit rdmaplus_exit(void)
{
	misc_deregister(&rdmaplus_misc);
	rdmaplus_rxe_exit();
	rdmaplus_jbmt_exit();
	rdmaplus_aa_exit();
	rdmaplus_rvma_exit();
	kobject_put(rdmaplus_root);
	pr_info("unloaded\n");
}

module_init(rdmaplus_init);
module_exit(rdmaplus_exit);

MODULE_DESCRIPTION("rdmaplus: RVMA, Active Access and JBMT support for RDMA NICs");
MODULE_LICENSE("GPL");
MODULE_SOFTDEP("pre: rdma_rxe");
MODULE_VERSION(RDMAPLUS_RELEASE);
