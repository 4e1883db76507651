/*
 * process.c: which process owns the table, fork, vfork and clone.
 *
 * fork: pthread_atfork handlers, registered at load (registering starts
 * no thread and installs no signal handler). The forking thread holds the
 * table's mutex across the fork; the child then records its new pid, marks
 * every connection it inherited as foreign (docs/sockets.md, "fork and
 * exec": the parent created it, and once attachments exist the child must
 * not touch the parent's QP) and starts its own statistics.
 *
 * vfork: a vfork child runs in its parent's memory until it execs or
 * exits. It must not change the parent's table, so every change checks
 * the pid first (shim_owner): a vfork child, whose pid differs, passes
 * every call through to libc and changes nothing. The same holds for any
 * clone() child sharing our memory without being a thread. No vfork
 * wrapper is needed (and none could return twice from a C function
 * safely).
 *
 * clone: a child that gets a copy of our memory (no CLONE_VM) is a fork
 * that runs no atfork handler; the wrapper starts it through a trampoline
 * that does what the fork child handler does, before the program's
 * function runs.
 *
 * prctl: a process that installs a seccomp filter is a sandbox whose
 * filter kills it for a system call it did not expect (sshd's
 * pre-authentication child, after fork, chroot and setuid): from then on
 * the shim probes, registers and attaches nothing, and passes everything
 * through.
 */
#include "rdma.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/prctl.h>

_Atomic pid_t shim_pid;
_Atomic int shim_sandboxed;

static void fork_prepare(void)
{
	shim_lock_fork_prepare();
}

static void fork_parent(void)
{
	conn_fork_parent();
	shim_lock_fork_parent();
	progress_fork_parent();
}

/* In the child, single-threaded, with the mutex still held by its copy. */
static void fork_child(void)
{
	atomic_store_explicit(&shim_pid, getpid(), memory_order_relaxed);
	conn_fork_child();
	shim_lock_fork_child();
}

void process_init(void)
{
	atomic_store_explicit(&shim_pid, getpid(), memory_order_relaxed);
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

struct clone_start {
	int (*fn)(void *);
	void *arg;
};

/* A clone child with its own copy of our memory: as after fork. */
static int clone_child(void *p)
{
	struct clone_start s = *(struct clone_start *)p;

	atomic_store_explicit(&shim_pid, getpid(), memory_order_relaxed);
	conn_fork_child();
	shim_lock_fork_child();
	return s.fn(s.arg);
}

/*
 * clone: pass-through. A child without CLONE_VM gets a copy of our memory
 * and starts through clone_child (the start record lives on this stack,
 * copied into the child with the rest). Threads (CLONE_VM with
 * CLONE_THREAD) share the table; a CLONE_VM child that is not a thread
 * (CLONE_VFORK, posix_spawn's way) has another pid and changes nothing.
 * Attached: the same; a CLONE_VM child that is not a thread passes every
 * call through, and connections it uses are demoted by exec_prepare()
 * when it execs.
 */
SHIM_EXPORT int clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
	struct clone_start s = { fn, arg };
	pid_t *ptid, *ctid;
	void *tls;
	va_list ap;

	va_start(ap, arg);
	ptid = va_arg(ap, pid_t *);
	tls = va_arg(ap, void *);
	ctid = va_arg(ap, pid_t *);
	va_end(ap);
	if (!(flags & CLONE_VM) && fn) {
		int r = REAL(clone)(clone_child, stack, flags, &s, ptid, tls, ctid);

		if (r > 0) {
			struct shim_held h;

			if (shim_lock(&h)) {
				conn_fork_parent();
				shim_unlock(&h);
			}
		}
		return r;
	}
	return REAL(clone)(fn, stack, flags, arg, ptid, tls, ctid);
}

/*
 * prctl: pass-through; PR_SET_SECCOMP marks the process a sandbox first
 * (a mark costs no system call, and the filter may forbid the next one).
 * prctl takes up to four more arguments, each an unsigned long.
 */
SHIM_EXPORT int prctl(int option, ...)
{
	unsigned long a[4];
	va_list ap;

	va_start(ap, option);
	for (int i = 0; i < 4; i++)
		a[i] = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_SET_SECCOMP)
		atomic_store_explicit(&shim_sandboxed, 1, memory_order_relaxed);
	return REAL(prctl)(option, a[0], a[1], a[2], a[3]);
}
