// SPDX-License-Identifier: GPL-2.0
/*
 * lab_warn: a module for the lab's self-test. Loading it prints a kernel
 * WARNING and fails, so nothing stays loaded; the lab must then fail the run
 * and name the guest.
 */
#include <linux/bug.h>
#include <linux/module.h>

static int __init lab_warn_init(void)
{
	WARN(1, "lab_warn: deliberate WARNING for the lab self-test\n");
	return -ECANCELED;
}
module_init(lab_warn_init);

MODULE_DESCRIPTION("SoftRoCE lab self-test: a deliberate kernel WARNING");
MODULE_LICENSE("GPL");
