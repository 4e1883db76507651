// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus: kernel side of the rdmaplus RDMA stack.
 *
 * The misc character device /dev/rdmaplus answers the version ioctl and
 * carries Active Access (rdmaplus_aa.c): an emulated IOMMU for rxe.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/uaccess.h>

#include "uapi/rdmaplus.h"
#include "rdmaplus.h"

#define RDMAPLUS_RELEASE "0.2.1"

static long rdmaplus_ioctl_version(void __user *arg)
{
	struct rdmaplus_version v = {
		.abi = RDMAPLUS_ABI_VERSION,
	};

	if (rdmaplus_aa_supported())
		v.flags |= RDMAPLUS_VERSION_F_AA;
	strscpy(v.release, RDMAPLUS_RELEASE, sizeof(v.release));
	if (copy_to_user(arg, &v, sizeof(v)))
		return -EFAULT;
	return 0;
}

static int rdmaplus_open(struct inode *inode, struct file *file)
{
	struct rdmaplus_aa_ctx *ctx;

	ctx = rdmaplus_aa_open();
	if (IS_ERR(ctx))
		return PTR_ERR(ctx);
	file->private_data = ctx;
	return 0;
}

static int rdmaplus_release(struct inode *inode, struct file *file)
{
	rdmaplus_aa_release(file->private_data);
	return 0;
}

static long rdmaplus_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	switch (cmd) {
	case RDMAPLUS_IOC_VERSION:
		return rdmaplus_ioctl_version((void __user *)arg);
	default:
		return rdmaplus_aa_ioctl(file->private_data, cmd,
					 (void __user *)arg);
	}
}

static int rdmaplus_mmap(struct file *file, struct vm_area_struct *vma)
{
	return rdmaplus_aa_mmap(file->private_data, vma);
}

static __poll_t rdmaplus_poll(struct file *file, poll_table *wait)
{
	return rdmaplus_aa_poll(file->private_data, file, wait);
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
	ret = misc_register(&rdmaplus_misc);
	if (ret) {
		pr_err("cannot register /dev/%s: %d\n", RDMAPLUS_DEVICE_NAME, ret);
		goto err_aa;
	}
	pr_info("loaded, ABI %d\n", RDMAPLUS_ABI_VERSION);
	return 0;

err_aa:
	rdmaplus_aa_exit();
	return ret;
}

static void __exit rdmaplus_exit(void)
{
	misc_deregister(&rdmaplus_misc);
	rdmaplus_aa_exit();
	pr_info("unloaded\n");
}

module_init(rdmaplus_init);
module_exit(rdmaplus_exit);

MODULE_DESCRIPTION("rdmaplus: RVMA, Active Access and JBMT support for RDMA NICs");
MODULE_LICENSE("GPL");
MODULE_VERSION(RDMAPLUS_RELEASE);
