// SPDX-License-Identifier: GPL-2.0
/*
 * lab_oops: a module for the lab's self-tests. Loading it starts a kernel
 * thread that fails the way a bug in a worker would, while insmod itself
 * returns and the guest keeps running:
 *   mode=divide  divides by zero: "divide error: 0000 [#1] ..."
 *   mode=ud2     executes an undefined instruction: "invalid opcode: 0000 [#1] ..."
 *   mode=irqoff  disables interrupts and spins for good: on a guest with one
 *                vCPU nothing reaches the kernel log (no CPU is left to
 *                report a lockup), the guest stops answering, and the lab
 *                must say that its vCPU is stuck with interrupts off.
 * The oops ends the thread. The module has no exit function, so it cannot be
 * unloaded while its thread may still run its code; it goes with the guest.
 */
#include <linux/err.h>
#include <linux/irqflags.h>
#include <linux/kthread.h>
#include <linux/module.h>
#include <linux/string.h>

static char *mode = "divide";
module_param(mode, charp, 0444);
MODULE_PARM_DESC(mode, "divide, ud2 or irqoff");

static int lab_oops_thread(void *arg)
{
	const char *m = arg;

	pr_info("lab_oops: %s in a kernel thread\n", m);
	if (!strcmp(m, "divide")) {
		unsigned int lo = 1, hi = 0, zero = 0;

		/* Through asm, so that the compiler can neither fold nor drop it. */
		asm volatile("divl %2" : "+a"(lo), "+d"(hi) : "r"(zero));
		pr_err("lab_oops: survived a division by zero (%u)\n", lo);
	} else if (!strcmp(m, "ud2")) {
		asm volatile("ud2");
		unreachable(); /* for objtool, as after BUG() */
	} else if (!strcmp(m, "irqoff")) {
		local_irq_disable();
		for (;;)
			cpu_relax();
	}
	return 0;
}

static int __init lab_oops_init(void)
{
	struct task_struct *t;

	if (strcmp(mode, "divide") && strcmp(mode, "ud2") && strcmp(mode, "irqoff"))
		return -EINVAL;
	t = kthread_run(lab_oops_thread, mode, "lab_oops");
	return PTR_ERR_OR_ZERO(t);
}
module_init(lab_oops_init);

MODULE_DESCRIPTION("SoftRoCE lab self-test: an oops or a hang in a kernel thread");
MODULE_LICENSE("GPL");
