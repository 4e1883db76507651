// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus: kernel side of the rdmaplus RDMA stack.
 *
 * The misc character device /dev/rdmaplus answers the version ioctl and
 * carries Active Access (rdmaplus_aa.c): an emulated IOMMU for rxe, and
 * the counted mailboxes of RVMA (rdmaplus_rvma.c) on the same rxe hooks.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"

#define RDMAPLUS_RELEASE "0.3.0"

/* one open /dev/rdmaplus */
struct rdmaplus_file {
	struct rdmaplus_aa_ctx *aa;
	struct rdmaplus_rvma_ctx *rvma;
};

static long rdmaplus_ioctl_version(void __user *arg)
{
	struct rdmaplus_version v = {
		.abi = RDMAPLUS_ABI_VERSION,
	};

	if (rdmaplus_aa_supported())
		v.flags |= RDMAPLUS_VERSION_F_AA | RDMAPLUS_VERSION_F_RVMA;
	strscpy(v.release, RDMAPLUS_RELEASE, sizeof(v.release));
	if (copy_to_user(arg, &v, sizeof(v)))
		return -EFAULT;
	return 0;
}

static int rdmaplus_open(struct inode *inode, struct file *file)
{
	struct rdmaplus_file *f;
	int ret;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->aa = rdmaplus_aa_open();
	if (IS_ERR(f->aa)) {
		ret = PTR_ERR(f->aa);
		goto err_free;
	}
	f->rvma = rdmaplus_rvma_open();
	if (IS_ERR(f->rvma)) {
		ret = PTR_ERR(f->rvma);
		goto err_aa;
	}
	file->private_data = f;
	return 0;

err_aa:
	rdmaplus_aa_release(f->aa);
err_free:
	kfree(f);
	return ret;
}

static int rdmaplus_release(struct inode *inode, struct file *file)
{
	struct rdmaplus_file *f = file->private_data;

	rdmaplus_rvma_release(f->rvma);
	rdmaplus_aa_release(f->aa);
	kfree(f);
	return 0;
}

static long rdmaplus_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	struct rdmaplus_file *f = file->private_data;
	long ret;

	if (cmd == RDMAPLUS_IOC_VERSION)
		return rdmaplus_ioctl_version((void __user *)arg);
	ret = rdmaplus_rvma_ioctl(f->rvma, cmd, (void __user *)arg);
	if (ret != -ENOIOCTLCMD)
		return ret;
	return rdmaplus_aa_ioctl(f->aa, cmd, (void __user *)arg);
}

static int rdmaplus_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct rdmaplus_file *f = file->private_data;

	if (rdmaplus_rvma_owns_pgoff(vma->vm_pgoff))
		return rdmaplus_rvma_mmap(f->rvma, vma);
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

	ret = rdmaplus_aa_init();
	if (ret)
		return ret;
	ret = rdmaplus_rvma_init();
	if (ret)
		goto err_aa;
	ret = misc_register(&rdmaplus_misc);
	if (ret) {
		pr_err("cannot register /dev/%s: %d\n", RDMAPLUS_DEVICE_NAME, ret);
		goto err_rvma;
	}
	pr_info("loaded, ABI %d\n", RDMAPLUS_ABI_VERSION);
	return 0;

err_rvma:
	rdmaplus_rvma_exit();
err_aa:
	rdmaplus_aa_exit();
	return ret;
}

static void __exit rdmaplus_exit(void)
{
	misc_deregister(&rdmaplus_misc);
	rdmaplus_rvma_exit();
	rdmaplus_aa_exit();
	pr_info("unloaded\n");
}

module_init(rdmaplus_init);
module_exit(rdmaplus_exit);

MODULE_DESCRIPTION("rdmaplus: RVMA, Active Access and JBMT support for RDMA NICs");
MODULE_LICENSE("GPL");
MODULE_VERSION(RDMAPLUS_RELEASE);
