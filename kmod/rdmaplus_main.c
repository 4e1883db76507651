// SPDX-License-Identifier: GPL-2.0
/*
 * rdmaplus: kernel side of the rdmaplus RDMA stack.
 *
 * For now it registers the misc character device /dev/rdmaplus and answers
 * the version ioctl; the emulated IOMMU for rxe grows here.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/uaccess.h>

#include "uapi/rdmaplus.h"

#define RDMAPLUS_RELEASE "0.1.0"

static long rdmaplus_ioctl_version(void __user *arg)
{
	struct rdmaplus_version v = {
		.abi = RDMAPLUS_ABI_VERSION,
	};

	strscpy(v.release, RDMAPLUS_RELEASE, sizeof(v.release));
	if (copy_to_user(arg, &v, sizeof(v)))
		return -EFAULT;
	return 0;
}

static long rdmaplus_ioctl(struct file *file, unsigned int cmd,
			   unsigned long arg)
{
	switch (cmd) {
	case RDMAPLUS_IOC_VERSION:
		return rdmaplus_ioctl_version((void __user *)arg);
	default:
		return -ENOTTY;
	}
}

static const struct file_operations rdmaplus_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = rdmaplus_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
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

	ret = misc_register(&rdmaplus_misc);
	if (ret) {
		pr_err("cannot register /dev/%s: %d\n", RDMAPLUS_DEVICE_NAME, ret);
		return ret;
	}
	pr_info("loaded, ABI %d\n", RDMAPLUS_ABI_VERSION);
	return 0;
}

static void __exit rdmaplus_exit(void)
{
	misc_deregister(&rdmaplus_misc);
	pr_info("unloaded\n");
}

module_init(rdmaplus_init);
module_exit(rdmaplus_exit);

MODULE_DESCRIPTION("rdmaplus: RVMA, Active Access and JBMT support for RDMA NICs");
MODULE_LICENSE("GPL");
MODULE_VERSION(RDMAPLUS_RELEASE);
